-- Read queries behind the dashboard and the API's GET routes. Each one touches only
-- the partial indexes of live states (pending, claimed, failed) or a bounded time range
-- of finished ones, so its cost follows live work, not the table's size.

-- name: queue_counts
-- One row per queue that has pending work, leases, dead-letters, a pause, or completions
-- in the last :recent_seconds. The queues are found by skipping through the indexes
-- (one probe per queue), and each count stops at :limit rows of its queue: a count of
-- :limit means "at least that many" (Reads then shows the last sample, as approximate).
-- So the cost follows queues × :limit, never the backlog. Completions come from the
-- rollups, plus those since the last rolled minute (the tail, up to :limit in all).
WITH RECURSIVE pending_queues AS (
    (SELECT queue FROM todos WHERE state = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM todos t WHERE t.state = 'pending' AND t.queue > p.queue
            ORDER BY t.queue LIMIT 1)
    FROM pending_queues p WHERE p.queue IS NOT NULL
), dead_queues AS (
    (SELECT queue FROM todos WHERE state = 'failed' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM todos t WHERE t.state = 'failed' AND t.queue > d.queue
            ORDER BY t.queue LIMIT 1)
    FROM dead_queues d WHERE d.queue IS NOT NULL
), leases AS (
    -- the first :lease_limit leases by expiry (lapsed ones first): with more, Reads shows
    -- the sampled figure (held), and the queues sampled with leases are listed below
    SELECT queue, count(*) AS claimed, count(*) FILTER (WHERE lease_expires_at < now()) AS lapsed
    FROM (SELECT queue, lease_expires_at FROM todos WHERE lease_expires_at IS NOT NULL  -- todos_leases
          ORDER BY lease_expires_at LIMIT :lease_limit) AS l
    GROUP BY queue
), rolled AS (
    SELECT queue, sum(completed) AS done FROM queue_rollups
    WHERE grain = 'minute' AND at >= now() - make_interval(secs => :recent_seconds) AND queue <> '*'
    GROUP BY queue
), tail AS (
    SELECT queue, count(*) AS done
    FROM (SELECT queue FROM todos
          WHERE state = 'done'  -- todos_finished
            AND completed_at >= (SELECT rolled_until FROM rollup_progress)
          LIMIT :limit) AS t
    GROUP BY queue
), queues AS (
    SELECT queue FROM pending_queues WHERE queue IS NOT NULL
    UNION SELECT queue FROM dead_queues WHERE queue IS NOT NULL
    UNION SELECT queue FROM leases
    UNION SELECT queue FROM rolled WHERE done > 0
    UNION SELECT queue FROM tail
    UNION SELECT queue FROM queue_pauses
    UNION SELECT queue FROM queue_rollups
          WHERE grain = 'minute' AND at >= date_trunc('minute', now()) - interval '2 minutes'
            AND queue <> '*' AND held > 0
)
SELECT q.queue,
       (SELECT count(*) FROM (SELECT FROM todos t WHERE t.state = 'pending' AND t.queue = q.queue
                              AND t.ready_at <= now() LIMIT :limit) AS r)::int AS ready,
       w.scheduled, w.retrying, w.waiting,
       coalesce(l.claimed, 0)::int AS claimed, coalesce(l.lapsed, 0)::int AS lapsed,
       (coalesce(rolled.done, 0) + coalesce(tail.done, 0))::int AS done_recent,
       (SELECT sum(done) FROM tail)::int AS tail_done,
       (SELECT count(*) FROM (SELECT FROM todos t WHERE t.state = 'failed' AND t.queue = q.queue
                              LIMIT :limit) AS d)::int AS dead,
       o.ready_at AS oldest_ready_at, extract(epoch FROM now() - o.ready_at) AS oldest_ready_age,
       p.paused_at, p.actor AS paused_by, p.reason AS paused_reason
FROM queues q
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE next_retry_at IS NULL)::int AS scheduled,
           count(*) FILTER (WHERE next_retry_at IS NOT NULL)::int AS retrying, count(*)::int AS waiting
    FROM (SELECT next_retry_at FROM todos t WHERE t.state = 'pending' AND t.queue = q.queue
            AND t.ready_at > now() LIMIT :limit) AS w
) AS w
LEFT JOIN LATERAL (
    SELECT ready_at FROM todos t WHERE t.state = 'pending' AND t.queue = q.queue
    ORDER BY t.ready_at LIMIT 1
) AS o ON o.ready_at <= now()
LEFT JOIN leases l USING (queue)
LEFT JOIN rolled USING (queue)
LEFT JOIN tail USING (queue)
LEFT JOIN queue_pauses p USING (queue)
ORDER BY q.queue;

-- name: last_samples
-- Each queue's latest backlog sample of the last :seconds (the rollup job's), for the
-- counts that reached the exact-count limit.
SELECT DISTINCT ON (queue) queue, at, ready, retrying, scheduled, held, dead_letters
FROM queue_rollups
WHERE grain = 'minute' AND at >= date_trunc('minute', now() - make_interval(secs => :seconds))
  AND ready IS NOT NULL AND queue <> '*'
ORDER BY queue, at DESC;

-- name: throughput
-- Completions per queue in each of the last :minutes minutes rolled up (the sparklines;
-- the last one still filling), by how many minutes before that last one (0: that one).
SELECT queue,
       (extract(epoch FROM date_trunc('minute', (SELECT rolled_until FROM rollup_progress)) - at) / 60)::int
           AS minutes_ago,
       completed AS done
FROM queue_rollups
WHERE grain = 'minute' AND completed > 0 AND queue <> '*'
  AND at > date_trunc('minute', (SELECT rolled_until FROM rollup_progress)) - make_interval(mins => :minutes);

-- name: leases
-- Every claimed todo (in :queue, held by :owner, when given), soonest expiry first. ttl:
-- the lease's length, from its last claim or heartbeat to its expiry.
SELECT id, queue, title, kind, owner, attempt, max_attempts, lease_token, claimed_at,
       heartbeat_at, lease_expires_at, lease_expires_at < now() AS lapsed,
       extract(epoch FROM lease_expires_at - now()) AS seconds_left,
       extract(epoch FROM lease_expires_at - coalesce(heartbeat_at, claimed_at))::float8 AS ttl,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, now() AS server_now
FROM todos
WHERE lease_expires_at IS NOT NULL AND (:queue::text IS NULL OR queue = :queue)  -- claimed
  AND (:owner::text IS NULL OR owner = :owner)
ORDER BY lease_expires_at, id
LIMIT :limit;

-- name: lease_count
SELECT count(*) FROM todos  -- claimed: todos_leases
WHERE lease_expires_at IS NOT NULL AND (:owner::text IS NULL OR owner = :owner);

-- name: agents
-- The agents page: one row per agent that has an active token, holds a lease now, or
-- shows in the rollups or the refused acks of the last :recent_seconds. Nothing here
-- reads history: leases come from the live todos (todos_leases); done, failed and the
-- last claim, heartbeat and ack from agent_rollups, each agent's rows read backwards
-- along its primary key (so they reach the last rolled minute, not now); refused acks
-- from stale_acks, written as they happen, and rare. A lease is short when its time
-- left is under :short_seconds or under :short_share of its ttl (short_lease in
-- dashboard/reads.py); a lapsed one is counted apart. A claim sets its lease's
-- heartbeat_at, so it counts as a heartbeat here, as on the leases page.
WITH RECURSIVE rolled_agents AS (  -- each agent with rollups, one probe of the key each
    (SELECT agent FROM agent_rollups ORDER BY agent LIMIT 1)
    UNION ALL
    SELECT (SELECT r.agent FROM agent_rollups r WHERE r.agent > a.agent ORDER BY r.agent LIMIT 1)
    FROM rolled_agents a WHERE a.agent IS NOT NULL
), leases AS (
    SELECT owner AS agent, count(*) AS leases, count(*) FILTER (WHERE time_left < '0') AS lapsed,
           count(*) FILTER (WHERE time_left >= '0' AND (time_left < make_interval(secs => :short_seconds)
                                                        OR time_left < ttl * :short_share::float8)) AS short,
           min(lease_expires_at) AS soonest, max(claimed_at) AS claimed_at, max(heartbeat_at) AS heartbeat_at
    FROM (SELECT owner, claimed_at, heartbeat_at, lease_expires_at, lease_expires_at - now() AS time_left,
                 lease_expires_at - coalesce(heartbeat_at, claimed_at) AS ttl
          FROM todos WHERE lease_expires_at IS NOT NULL) AS l  -- claimed: todos_leases
    WHERE NOT EXISTS (SELECT FROM operators o WHERE o.name = l.owner)  -- a person's, from the Inbox
    GROUP BY owner
), stale AS (
    SELECT agent, count(*) FILTER (WHERE at >= now() - make_interval(secs => :hour_seconds)) AS stale_acks
    FROM stale_acks s WHERE at >= now() - make_interval(secs => :recent_seconds)
      AND NOT EXISTS (SELECT FROM operators o WHERE o.name = s.agent)
    GROUP BY agent
), tokens AS (  -- each agent's newest active token, else its newest revoked one
    SELECT DISTINCT ON (agent) agent, id AS token_id, queues AS token_queues,
           created_at AS token_created_at, revoked_at AS token_revoked_at,
           count(*) FILTER (WHERE revoked_at IS NULL) OVER (PARTITION BY agent) AS active_tokens
    FROM api_tokens
    ORDER BY agent, revoked_at IS NOT NULL, created_at DESC
), agents AS (
    SELECT agent FROM tokens WHERE token_revoked_at IS NULL
    UNION SELECT agent FROM leases
    UNION SELECT agent FROM stale
    UNION SELECT agent FROM rolled_agents a
          WHERE EXISTS (SELECT FROM agent_rollups r WHERE r.agent = a.agent
                          AND r.at >= now() - make_interval(secs => :recent_seconds))
)
SELECT a.agent,
       coalesce(l.leases, 0)::int AS leases, coalesce(l.short, 0)::int AS short,
       coalesce(l.lapsed, 0)::int AS lapsed, extract(epoch FROM l.soonest - now())::float8 AS soonest_left,
       greatest(l.claimed_at, (SELECT r.last_claim_at FROM agent_rollups r
                               WHERE r.agent = a.agent AND r.at >= now() - make_interval(secs => :recent_seconds)
                                 AND r.last_claim_at IS NOT NULL
                               ORDER BY r.at DESC LIMIT 1)) AS last_claim_at,
       l.heartbeat_at AS last_heartbeat_at,
       (SELECT r.last_ack_at FROM agent_rollups r
        WHERE r.agent = a.agent AND r.at >= now() - make_interval(secs => :recent_seconds)
          AND r.last_ack_at IS NOT NULL
        ORDER BY r.at DESC LIMIT 1) AS last_ack_at,
       coalesce(h.done, 0)::int AS done, coalesce(h.failed, 0)::int AS failed,
       coalesce(s.stale_acks, 0)::int AS stale_acks,
       t.token_id, t.token_queues, t.token_created_at, t.token_revoked_at,
       coalesce(t.active_tokens, 0)::int AS active_tokens
FROM agents a
LEFT JOIN leases l USING (agent)
LEFT JOIN stale s USING (agent)
LEFT JOIN tokens t USING (agent)
CROSS JOIN LATERAL (
    SELECT sum(r.completed) AS done, sum(r.failed) AS failed FROM agent_rollups r
    WHERE r.agent = a.agent AND r.at >= now() - make_interval(secs => :hour_seconds)
) AS h
ORDER BY a.agent;

-- name: todo
-- read_at: the database's clock, which decides whether a pending todo is retrying.
SELECT *, now() AS read_at FROM todos WHERE id = :id;

-- name: history
-- Todo :id's newest :limit steps older than step :before (all when null), oldest first.
-- An edit's changes larger than :changes_max bytes of JSON are left out and only their
-- size given: a page of history costs a bounded read, however its owner grew it.
SELECT id, at, from_state, to_state, actor_kind, actor, attempt, note,
       CASE WHEN size <= :changes_max THEN changes END AS changes,
       CASE WHEN size > :changes_max THEN size END AS changes_bytes
FROM (
    SELECT *, octet_length(changes::text) AS size FROM todo_history
    WHERE todo_id = :id AND (CAST(:before AS bigint) IS NULL OR id < :before)
    ORDER BY id DESC LIMIT :limit
) newest
ORDER BY id;

-- name: history_since
-- What changed todo :id after the version :since (its updated_at then), newest first, at
-- most :limit rows, each with how many there are in all; large changes left out as in
-- `history`. A move's row is at the version it made (fragments.sql, history_insert), so
-- the rows after :since are exactly the later moves. (A heartbeat makes a version but no
-- row: the lease it extended ends in one.)
SELECT id, at, from_state, to_state, actor_kind, actor, attempt, note,
       CASE WHEN octet_length(changes::text) <= :changes_max THEN changes END AS changes,
       CASE WHEN octet_length(changes::text) > :changes_max THEN octet_length(changes::text) END AS changes_bytes,
       count(*) OVER () AS total
FROM todo_history WHERE todo_id = :id AND at > :since
ORDER BY id DESC LIMIT :limit;

-- name: queue_pauses
SELECT * FROM queue_pauses ORDER BY queue;

-- name: queue_history
-- A queue's pauses and resumes, newest first.
SELECT at, action, actor_kind, actor, reason FROM queue_history
WHERE queue = :queue ORDER BY id DESC LIMIT :limit;

-- name: event
SELECT * FROM events WHERE id = :id;

-- name: dead_letter_ids
-- "All that match": every dead-letter, in :queue when given, cancelled or not as
-- :cancelled says (null: both).
SELECT id FROM todos WHERE state = 'failed' AND (:queue::text IS NULL OR queue = :queue)
  AND (:cancelled::bool IS NULL OR (cancelled_at IS NOT NULL) = :cancelled)
ORDER BY completed_at;

-- name: dead_letter_queues
-- The dead-letters page's queue menu (an index-only scan of todos_dead).
SELECT DISTINCT queue FROM todos WHERE state = 'failed' ORDER BY queue;

-- name: list_todos
-- The queue page and the API list: newest first, keyset-paginated after the todo
-- (:before_at, :before_id), filtered by todo_filter (fragments.sql). Reads plans this
-- statement for each call's values (a custom plan), so the null filters fold away and
-- the planner picks the index that fits the rest; a generic plan could not know which
-- one that is.
SELECT *, now() AS read_at FROM todos
-- include: todo_filter
  AND (:before_at::timestamptz IS NULL OR (created_at, id) < (:before_at, :before_id::text))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: matching_ids
-- A bulk action's "all matching this filter": the ids list_todos would page through, with
-- the same filter (todo_filter; tests/test_web_control.py compares them), up to :limit,
-- oldest first. Planned for the call's values, as list_todos is.
SELECT id FROM todos
-- include: todo_filter
ORDER BY created_at, id
LIMIT :limit;

-- name: list_dead_letters
-- The dead-letters page: newest death first, keyset-paginated after (:before_at,
-- :before_id), in :queue when given (todos_dead holds queue, so it filters in the index);
-- :cancelled true: only cancelled ones, false: only those that died, null: both.
SELECT *, now() AS read_at FROM todos
WHERE state = 'failed'
  AND (:queue::text IS NULL OR queue = :queue)
  AND (:cancelled::bool IS NULL OR (cancelled_at IS NOT NULL) = :cancelled)
  AND (:before_at::timestamptz IS NULL OR (completed_at, id) < (:before_at, :before_id::text))
ORDER BY completed_at DESC, id DESC
LIMIT :limit;

-- name: plan_for_values
-- In a transaction, before a list statement: plan it for this call's values, and stop it
-- after :timeout milliseconds. Both are the transaction's own (SET LOCAL), so they hold
-- through a pooler in transaction mode and end with the transaction.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('statement_timeout', :timeout::text, true);

-- name: readiness
-- For /readyz: the newest migration applied, and whether this server refuses writes.
SELECT (SELECT max(version) FROM schema_migrations) AS migrated_to,
       current_setting('transaction_read_only') = 'on' AS read_only;

-- name: horizon_holders
-- What holds back vacuum of this database's tables (README "When vacuum is held back"),
-- oldest first: sessions whose transaction has a snapshot or an xid (walsenders too: a
-- replica's hot_standby_feedback; autovacuum's own are ignored by vacuum), prepared
-- transactions, and replication slots that hold an xmin. A slot has no start time, so
-- its age is null here and counted by the caller from when it first saw that xmin.
-- Other roles' sessions show only to a superuser or a member of pg_read_all_stats.
SELECT 'transaction' AS kind, pid, usename AS "user", application_name AS application,
       coalesce(state, backend_type) AS state,
       extract(epoch FROM now() - coalesce(xact_start, query_start, backend_start))::float8 AS age,
       NULL::text AS slot_xmin
FROM pg_stat_activity
WHERE (datname = current_database() OR backend_type = 'walsender')
  AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
UNION ALL
SELECT 'prepared transaction', NULL, owner, gid, 'prepared',
       extract(epoch FROM now() - prepared)::float8, NULL
FROM pg_prepared_xacts WHERE database = current_database()
UNION ALL
SELECT 'replication slot', active_pid, NULL, slot_name, CASE WHEN active THEN 'active' ELSE 'inactive' END,
       NULL, xmin::text
FROM pg_replication_slots WHERE xmin IS NOT NULL
ORDER BY age DESC NULLS FIRST
LIMIT 20;

-- name: dead_tuples
-- Dead row versions in the hot tables, as the statistics collector last counted them
-- (todo_history's summed over its partitions, migration 0015).
SELECT CASE WHEN relid = 'todos'::regclass THEN 'todos' ELSE 'todo_history' END AS "table",
       sum(n_dead_tup)::bigint AS dead
FROM pg_stat_user_tables
WHERE relid = 'todos'::regclass OR relid IN (SELECT relid FROM pg_partition_tree('todo_history'))
GROUP BY 1
ORDER BY 1 DESC;  -- todos first

-- name: unknown_queues
-- Which of :queues no todo is in (none was ever created there, or all were pruned): one
-- probe of todos_by_queue each, for the queue page's and the tokens form's hints.
SELECT q AS queue FROM unnest(:queues::text[]) AS q
WHERE NOT EXISTS (SELECT 1 FROM todos WHERE queue = q)
ORDER BY q;
