-- The rollup job (dashboard/rollups.py): per queue and minute (and hour), and per agent
-- and minute, counted from todo_history (migration 0009), and the backlog sampled from
-- todos. One process at a time runs these, under an advisory lock.

-- name: lock
-- One rollup job at a time across every process: the others skip their turn.
SELECT pg_try_advisory_xact_lock(8031972601);

-- name: last_history_id
-- The newest history id handed out so far (in flight or not).
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('todo_history', 'id')), 0);

-- name: add_mark
-- A mark: :last_id, read just before this statement's clock.
INSERT INTO rollup_marks (at, last_id) VALUES (clock_timestamp(), :last_id) ON CONFLICT DO NOTHING;

-- name: progress
-- Where the job has got to, and how far it may roll now: to the newest mark taken no
-- later than the start of the oldest transaction still writing (every id up to that
-- mark was handed out to a transaction that has ended since), ignoring a transaction
-- that has been writing for more than :max_wait seconds (its rows are then not counted).
SELECT p.rolled_id, p.rolled_until, m.last_id AS safe_id, m.at AS safe_at
FROM rollup_progress p
LEFT JOIN LATERAL (
    SELECT at, last_id FROM rollup_marks
    WHERE at <= coalesce((SELECT min(xact_start) FROM pg_stat_activity
                          WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
                            AND datname = current_database()
                            AND xact_start > now() - make_interval(secs => :max_wait)),
                         'infinity')
    ORDER BY at DESC LIMIT 1
) AS m ON true
FOR UPDATE OF p;

-- name: advance
-- Rolled up to :rolled_id; with :rolled_until (the mark's time) once the mark is reached,
-- when the marks before it are no longer needed.
WITH progress AS (
    UPDATE rollup_progress
    SET rolled_id = :rolled_id, rolled_until = coalesce(:rolled_until, rolled_until)
)
DELETE FROM rollup_marks WHERE at < :rolled_until;

-- name: steps
-- One pass over the history rows with ids in (:after_id, :upto_id]: how many per minute,
-- queue, actor (kind and name), step, whether it dead-lettered (to_failed) and the :bounds bucket of its
-- elapsed time, with their elapsed time summed and the latest. dashboard/rollups.py folds
-- these few hundred rows into queue and agent rows. Rows written before migration 0009
-- have no queue and are left out.
SELECT date_trunc('minute', at) AS minute, queue, actor_kind, actor, event, to_state = 'failed' AS to_failed,
       width_bucket(elapsed, :bounds::float8[]) AS bucket,
       count(*)::int AS n, coalesce(sum(elapsed), 0)::float8 AS elapsed_sum, max(at) AS last_at
FROM todo_history
WHERE id > :after_id AND id <= :upto_id AND queue IS NOT NULL
GROUP BY 1, 2, 3, 4, 5, 6, 7;

-- name: add_steps
-- A queue's steps in part of a minute (:grain 'minute') or an hour ('hour'), added to
-- that period's row: each history row is rolled once, in the transaction that moves
-- rolled_id past it.
INSERT INTO queue_rollups (grain, queue, at, created, deduplicated, claimed, completed, failed,
                           dead, reaped, released, cancelled, waited, ran, waited_sum, ran_sum)
VALUES (:grain, :queue, :at, :created, :deduplicated, :claimed, :completed, :failed, :dead,
        :reaped, :released, :cancelled, :waited, :ran, :waited_sum, :ran_sum)
ON CONFLICT (grain, queue, at) DO UPDATE SET
    created = queue_rollups.created + excluded.created,
    deduplicated = queue_rollups.deduplicated + excluded.deduplicated,
    claimed = queue_rollups.claimed + excluded.claimed,
    completed = queue_rollups.completed + excluded.completed,
    failed = queue_rollups.failed + excluded.failed, dead = queue_rollups.dead + excluded.dead,
    reaped = queue_rollups.reaped + excluded.reaped,
    released = queue_rollups.released + excluded.released,
    cancelled = queue_rollups.cancelled + excluded.cancelled,
    waited = array_add(queue_rollups.waited, excluded.waited),
    ran = array_add(queue_rollups.ran, excluded.ran),
    waited_sum = queue_rollups.waited_sum + excluded.waited_sum,
    ran_sum = queue_rollups.ran_sum + excluded.ran_sum;

-- name: add_agent_steps
INSERT INTO agent_rollups AS r (agent, at, claimed, completed, failed, released,
                                last_claim_at, last_ack_at)
VALUES (:agent, :at, :claimed, :completed, :failed, :released,
        :last_claim_at, :last_ack_at)
ON CONFLICT (agent, at) DO UPDATE SET
    claimed = r.claimed + excluded.claimed, completed = r.completed + excluded.completed,
    failed = r.failed + excluded.failed, released = r.released + excluded.released,
    last_claim_at = greatest(r.last_claim_at, excluded.last_claim_at),
    last_ack_at = greatest(r.last_ack_at, excluded.last_ack_at);

-- name: sample_backlog
-- The backlog now (and the leases held: `held`), into this minute's and this hour's
-- rows: every queue with pending work, leases or dead-letters, zeros for the queues
-- sampled in the last :keep_seconds that have none left, and their sum as queue '*'.
WITH counted AS (
    SELECT queue, coalesce(ready, 0) AS ready, coalesce(retrying, 0) AS retrying,
           coalesce(scheduled, 0) AS scheduled, coalesce(held, 0) AS held,
           coalesce(dead_letters, 0) AS dead_letters
    FROM (SELECT queue,
                 count(*) FILTER (WHERE ready_at <= now()) AS ready,
                 count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NOT NULL) AS retrying,
                 count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NULL) AS scheduled
          FROM todos WHERE state = 'pending' GROUP BY queue) AS pending
    FULL JOIN (SELECT queue, count(*) AS held FROM todos WHERE lease_expires_at IS NOT NULL GROUP BY queue)
        AS leases USING (queue)
    FULL JOIN (SELECT queue, count(*) AS dead_letters FROM todos WHERE state = 'failed' GROUP BY queue) AS dead
        USING (queue)
    FULL JOIN (SELECT DISTINCT queue FROM queue_rollups
               WHERE grain = 'minute' AND at >= now() - make_interval(secs => :keep_seconds) AND queue <> '*'
                 AND (ready > 0 OR retrying > 0 OR scheduled > 0 OR held > 0 OR dead_letters > 0))
        AS sampled USING (queue)
), totals AS (
    SELECT * FROM counted
    UNION ALL
    SELECT '*', coalesce(sum(ready), 0), coalesce(sum(retrying), 0), coalesce(sum(scheduled), 0),
           coalesce(sum(held), 0), coalesce(sum(dead_letters), 0)
    FROM counted
)
INSERT INTO queue_rollups AS r (grain, queue, at, ready, retrying, scheduled, held, dead_letters)
SELECT g.grain, t.queue, date_trunc(g.grain, now(), 'UTC'), t.ready, t.retrying, t.scheduled, t.held,
       t.dead_letters
FROM totals t CROSS JOIN (VALUES ('minute'), ('hour')) AS g (grain)
ON CONFLICT (grain, queue, at) DO UPDATE SET
    ready = excluded.ready, retrying = excluded.retrying, scheduled = excluded.scheduled,
    held = excluded.held, dead_letters = excluded.dead_letters;

-- name: prune
-- Rows past their retention: minute rows (and agents' minutes, and refused acks) after
-- :minute_seconds, hour rows after :hour_seconds.
WITH minutes AS (
    DELETE FROM queue_rollups WHERE grain = 'minute' AND at < now() - make_interval(secs => :minute_seconds)
), hours AS (
    DELETE FROM queue_rollups WHERE grain = 'hour' AND at < now() - make_interval(secs => :hour_seconds)
), agents AS (
    DELETE FROM agent_rollups WHERE at < now() - make_interval(secs => :minute_seconds)
)
DELETE FROM stale_acks WHERE at < now() - make_interval(secs => :minute_seconds);

-- name: series
-- A chart's points: :queue's rollup rows of :grain since :since ('*': all queues), in
-- buckets of :step seconds. Steps are summed; the backlog is the bucket's last sample;
-- the histograms are summed element-wise.
WITH picked AS (
    SELECT date_bin(make_interval(secs => :step), at, timestamptz '2000-01-01') AS bucket, *
    FROM queue_rollups
    WHERE grain = :grain AND queue = :queue AND at >= :since
), histograms AS (
    SELECT bucket, array_agg(waited ORDER BY i) AS waited, array_agg(ran ORDER BY i) AS ran
    FROM (SELECT bucket, i, sum(w)::int AS waited, sum(r)::int AS ran
          FROM picked, unnest(picked.waited, picked.ran) WITH ORDINALITY AS u(w, r, i)
          GROUP BY bucket, i) AS per_bucket
    GROUP BY bucket
)
SELECT p.bucket AS at, sum(completed)::int AS completed, sum(failed)::int AS failed,
       sum(dead)::int AS dead, sum(created)::int AS created,
       (array_agg(ready ORDER BY p.at DESC) FILTER (WHERE ready IS NOT NULL))[1] AS ready,
       (array_agg(retrying ORDER BY p.at DESC) FILTER (WHERE ready IS NOT NULL))[1] AS retrying,
       h.waited, h.ran
FROM picked p LEFT JOIN histograms h USING (bucket)
GROUP BY p.bucket, h.waited, h.ran
ORDER BY p.bucket;
