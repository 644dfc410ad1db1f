-- The rollup job (dashboard/rollups.py): per queue and minute, and per agent and minute,
-- counted from todo_history (migration 0009), hour rows summed from minute rows, and the
-- backlog sampled from todos. One process at a time runs these, under an advisory lock.

-- name: lock
-- One rollup job at a time across every process: the others skip their turn.
SELECT pg_try_advisory_xact_lock(8031972601);

-- name: progress
-- Where the job has got to, and up to where it may roll now: whole minutes that ended
-- :grace seconds ago, and not past the start of the oldest transaction still writing
-- (its history rows, stamped when written, show up when it commits), unless that one
-- is older than :max_wait seconds (it is then left out of the rollups).
SELECT rolled_until,
       date_trunc('minute', greatest(
           least(now() - make_interval(secs => :grace),
                 (SELECT min(xact_start) FROM pg_stat_activity
                  WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
                    AND datname = current_database())),
           now() - make_interval(secs => :max_wait))) AS rollable_until
FROM rollup_progress
FOR UPDATE;

-- name: advance
UPDATE rollup_progress SET rolled_until = :until;

-- name: roll_queue_minutes
-- Every queue's steps in the minutes [:since, :until), with the histograms of time in
-- queue (claims) and run time (completions and failures) over :bounds; and the same for
-- all queues together, as queue '*' (no queue has that name), which the overview's
-- charts read.
WITH steps AS (
    SELECT queue, date_trunc('minute', at) AS at, event, to_state, elapsed,
           width_bucket(elapsed, :bounds::float8[]) AS bucket
    FROM todo_history
    WHERE at >= :since AND at < :until AND queue IS NOT NULL
), counts AS (
    SELECT coalesce(queue, '*') AS queue, at,
           count(*) FILTER (WHERE event = 'created') AS created,
           count(*) FILTER (WHERE event = 'deduplicated') AS deduplicated,
           count(*) FILTER (WHERE event = 'claimed') AS claimed,
           count(*) FILTER (WHERE event = 'completed') AS completed,
           count(*) FILTER (WHERE event = 'failed') AS failed,
           count(*) FILTER (WHERE to_state = 'failed' AND event IN ('failed', 'reaped')) AS dead,
           count(*) FILTER (WHERE event = 'reaped') AS reaped,
           count(*) FILTER (WHERE event IN ('released', 'force_released')) AS released,
           count(*) FILTER (WHERE event = 'cancelled') AS cancelled,
           coalesce(sum(elapsed) FILTER (WHERE event = 'claimed'), 0) AS waited_sum,
           coalesce(sum(elapsed) FILTER (WHERE event IN ('completed', 'failed')), 0) AS ran_sum
    FROM steps GROUP BY GROUPING SETS ((queue, at), (at))
), buckets AS (
    SELECT coalesce(queue, '*') AS queue, at, bucket,
           count(*) FILTER (WHERE event = 'claimed') AS waited,
           count(*) FILTER (WHERE event IN ('completed', 'failed')) AS ran
    FROM steps WHERE event IN ('claimed', 'completed', 'failed') AND elapsed IS NOT NULL
    GROUP BY GROUPING SETS ((queue, at, bucket), (at, bucket))
)
INSERT INTO queue_rollups AS r (grain, queue, at, created, deduplicated, claimed, completed, failed,
                                dead, reaped, released, cancelled, waited, ran, waited_sum, ran_sum)
SELECT 'minute', c.queue, c.at, created, deduplicated, claimed, completed, failed, dead, reaped,
       released, cancelled,
       ARRAY(SELECT coalesce(b.waited, 0) FROM generate_series(0, cardinality(:bounds::float8[])) AS i
             LEFT JOIN buckets b ON (b.queue, b.at, b.bucket) = (c.queue, c.at, i) ORDER BY i),
       ARRAY(SELECT coalesce(b.ran, 0) FROM generate_series(0, cardinality(:bounds::float8[])) AS i
             LEFT JOIN buckets b ON (b.queue, b.at, b.bucket) = (c.queue, c.at, i) ORDER BY i),
       waited_sum, ran_sum
FROM counts c
ON CONFLICT (grain, queue, at) DO UPDATE SET
    created = excluded.created, deduplicated = excluded.deduplicated, claimed = excluded.claimed,
    completed = excluded.completed, failed = excluded.failed, dead = excluded.dead,
    reaped = excluded.reaped, released = excluded.released, cancelled = excluded.cancelled,
    waited = excluded.waited, ran = excluded.ran, waited_sum = excluded.waited_sum,
    ran_sum = excluded.ran_sum;

-- name: roll_agent_minutes
-- Every agent's claims, acks and heartbeats in the minutes [:since, :until).
INSERT INTO agent_rollups AS r (agent, at, claimed, completed, failed, released,
                                last_claim_at, last_heartbeat_at, last_ack_at)
SELECT actor, date_trunc('minute', at),
       count(*) FILTER (WHERE event = 'claimed'),
       count(*) FILTER (WHERE event = 'completed'),
       count(*) FILTER (WHERE event = 'failed'),
       count(*) FILTER (WHERE event = 'released'),
       max(at) FILTER (WHERE event = 'claimed'),
       max(at) FILTER (WHERE event = 'heartbeat'),
       max(at) FILTER (WHERE event IN ('completed', 'failed', 'released'))
FROM todo_history
WHERE at >= :since AND at < :until AND actor_kind = 'agent'
  AND event IN ('claimed', 'heartbeat', 'completed', 'failed', 'released')
GROUP BY 1, 2
ON CONFLICT (agent, at) DO UPDATE SET
    claimed = excluded.claimed, completed = excluded.completed, failed = excluded.failed,
    released = excluded.released, last_claim_at = excluded.last_claim_at,
    last_heartbeat_at = excluded.last_heartbeat_at, last_ack_at = excluded.last_ack_at;

-- name: roll_hours
-- The hour rows of the hours that [:since, :until) touches, summed from their minute
-- rows; the backlog is the hour's last sample.
INSERT INTO queue_rollups AS r (grain, queue, at, created, deduplicated, claimed, completed, failed,
                                dead, reaped, released, cancelled, waited, ran, waited_sum, ran_sum,
                                ready, retrying, scheduled, dead_letters)
SELECT 'hour', queue, date_trunc('hour', at),
       sum(created), sum(deduplicated), sum(claimed), sum(completed), sum(failed), sum(dead),
       sum(reaped), sum(released), sum(cancelled), sum_elements(waited), sum_elements(ran),
       sum(waited_sum), sum(ran_sum),
       (array_agg(ready ORDER BY at DESC) FILTER (WHERE ready IS NOT NULL))[1],
       (array_agg(retrying ORDER BY at DESC) FILTER (WHERE ready IS NOT NULL))[1],
       (array_agg(scheduled ORDER BY at DESC) FILTER (WHERE ready IS NOT NULL))[1],
       (array_agg(dead_letters ORDER BY at DESC) FILTER (WHERE ready IS NOT NULL))[1]
FROM queue_rollups
WHERE grain = 'minute' AND at >= date_trunc('hour', :since::timestamptz) AND at < :until
GROUP BY queue, date_trunc('hour', at)
ON CONFLICT (grain, queue, at) DO UPDATE SET
    created = excluded.created, deduplicated = excluded.deduplicated, claimed = excluded.claimed,
    completed = excluded.completed, failed = excluded.failed, dead = excluded.dead,
    reaped = excluded.reaped, released = excluded.released, cancelled = excluded.cancelled,
    waited = excluded.waited, ran = excluded.ran, waited_sum = excluded.waited_sum,
    ran_sum = excluded.ran_sum, ready = excluded.ready, retrying = excluded.retrying,
    scheduled = excluded.scheduled, dead_letters = excluded.dead_letters;

-- name: sample_backlog
-- The backlog now, into this minute's rows: every queue with pending work or
-- dead-letters, zeros for the queues sampled in the last :keep_seconds that have none
-- left, and their sum as queue '*'.
WITH counted AS (
    SELECT queue, coalesce(ready, 0) AS ready, coalesce(retrying, 0) AS retrying,
           coalesce(scheduled, 0) AS scheduled, coalesce(dead_letters, 0) AS dead_letters
    FROM (SELECT queue,
                 count(*) FILTER (WHERE ready_at <= now()) AS ready,
                 count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NOT NULL) AS retrying,
                 count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NULL) AS scheduled
          FROM todos WHERE state = 'pending' GROUP BY queue) AS pending
    FULL JOIN (SELECT queue, count(*) AS dead_letters FROM todos WHERE state = 'failed' GROUP BY queue) AS dead
        USING (queue)
    FULL JOIN (SELECT DISTINCT queue FROM queue_rollups
               WHERE grain = 'minute' AND at >= now() - make_interval(secs => :keep_seconds)
                 AND queue <> '*' AND (ready > 0 OR retrying > 0 OR scheduled > 0 OR dead_letters > 0))
        AS sampled USING (queue)
)
INSERT INTO queue_rollups AS r (grain, queue, at, ready, retrying, scheduled, dead_letters)
SELECT 'minute', queue, date_trunc('minute', now()), ready, retrying, scheduled, dead_letters FROM counted
UNION ALL
SELECT 'minute', '*', date_trunc('minute', now()),
       coalesce(sum(ready), 0), coalesce(sum(retrying), 0), coalesce(sum(scheduled), 0),
       coalesce(sum(dead_letters), 0)
FROM counted
ON CONFLICT (grain, queue, at) DO UPDATE SET
    ready = excluded.ready, retrying = excluded.retrying, scheduled = excluded.scheduled,
    dead_letters = excluded.dead_letters;

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
