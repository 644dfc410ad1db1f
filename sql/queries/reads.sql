-- Read queries behind the dashboard and the API's GET routes. Each one touches only
-- the partial indexes of live states (pending, claimed, failed) or a bounded time range
-- of finished ones, so its cost follows live work, not the table's size.

-- name: queue_counts
-- One row per queue that has live work, dead-letters, recent completions or a pause.
-- Pending todos are ready (ready_at has come), retrying (a retry time ahead) or
-- scheduled (a run_at ahead, no retry time).
WITH pending AS (
    SELECT queue,
           count(*) FILTER (WHERE ready_at <= now()) AS ready,
           count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NOT NULL) AS retrying,
           count(*) FILTER (WHERE ready_at > now() AND next_retry_at IS NULL) AS scheduled,
           min(created_at) FILTER (WHERE ready_at <= now()) AS oldest_ready_at
    FROM todos WHERE state = 'pending' GROUP BY queue
), claimed AS (
    SELECT queue, count(*) AS claimed,
           count(*) FILTER (WHERE lease_expires_at < now()) AS lapsed
    FROM todos WHERE lease_expires_at IS NOT NULL GROUP BY queue  -- claimed: todos_leases
), dead AS (
    SELECT queue, count(*) AS dead FROM todos WHERE state = 'failed' GROUP BY queue
), done AS (
    SELECT queue, count(*) AS done_recent FROM todos
    WHERE state = 'done' AND completed_at > now() - make_interval(secs => :recent_seconds)
    GROUP BY queue
)
SELECT queue,
       coalesce(ready, 0) AS ready, coalesce(scheduled, 0) AS scheduled,
       coalesce(retrying, 0) AS retrying,
       coalesce(claimed, 0) AS claimed, coalesce(lapsed, 0) AS lapsed,
       coalesce(done_recent, 0) AS done_recent, coalesce(dead, 0) AS dead,
       oldest_ready_at, extract(epoch FROM now() - oldest_ready_at) AS oldest_ready_age,
       p.paused_at, p.actor AS paused_by, p.reason AS paused_reason
FROM pending
FULL JOIN claimed USING (queue)
FULL JOIN dead USING (queue)
FULL JOIN done USING (queue)
FULL JOIN queue_pauses p USING (queue)
ORDER BY queue;

-- name: throughput
-- Completions per queue and minute over the last :minutes minutes (for the sparklines),
-- by how many whole minutes ago (0: this minute) on the database's clock.
SELECT queue,
       (extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', completed_at)) / 60)::int
           AS minutes_ago,
       count(*) AS done
FROM todos
WHERE state = 'done' AND completed_at > date_trunc('minute', now()) - make_interval(mins => :minutes - 1)
GROUP BY 1, 2;

-- name: leases
-- Every claimed todo, soonest expiry first.
SELECT id, queue, title, kind, owner, attempt, max_attempts, lease_token, claimed_at,
       heartbeat_at, lease_expires_at, lease_expires_at < now() AS lapsed,
       extract(epoch FROM lease_expires_at - now()) AS seconds_left,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, now() AS server_now
FROM todos
WHERE lease_expires_at IS NOT NULL AND (:queue::text IS NULL OR queue = :queue)  -- claimed
ORDER BY lease_expires_at, id
LIMIT :limit;

-- name: lease_count
SELECT count(*) FROM todos WHERE lease_expires_at IS NOT NULL;  -- claimed: todos_leases

-- name: todo
-- read_at: the database's clock, which decides whether a pending todo is retrying.
SELECT *, now() AS read_at FROM todos WHERE id = :id;

-- name: history
SELECT at, from_state, to_state, actor_kind, actor, attempt, note, changes
FROM todo_history WHERE todo_id = :id ORDER BY id;

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
-- (:before_at, :before_id). Every filter may be null, meaning any. :face picks one face
-- of pending: ready, retrying or scheduled. Reads plans this statement for each
-- call's values (a custom plan), so the null filters fold away and the planner picks
-- the index that fits the rest; a generic plan could not know which one that is.
SELECT *, now() AS read_at FROM todos
WHERE (:queue::text IS NULL OR queue = :queue)
  AND (:queues::text[] IS NULL OR queue = ANY (:queues))
  AND (:state::todo_state IS NULL OR state = :state)
  AND (:face::text IS NULL
       OR (:face = 'ready' AND ready_at <= now())
       OR (:face = 'retrying' AND ready_at > now() AND next_retry_at IS NOT NULL)
       OR (:face = 'scheduled' AND ready_at > now() AND next_retry_at IS NULL))
  AND (:assignee::text IS NULL OR assignee = :assignee)
  AND (:owner::text IS NULL OR owner = :owner)
  AND (:kind::text IS NULL OR kind = :kind)
  AND (:search::text IS NULL OR id = :search OR idempotency_key = :search OR title ILIKE :search_like)
  AND (:before_at::timestamptz IS NULL OR (created_at, id) < (:before_at, :before_id::text))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: matching_ids
-- A bulk action's "all matching this filter": the ids list_todos would page through, with
-- the same filter (kept identical to it; tests/test_web_control.py compares them), up
-- to :limit, oldest first. Planned for the call's values, as list_todos is.
SELECT id FROM todos
WHERE (:queue::text IS NULL OR queue = :queue)
  AND (:queues::text[] IS NULL OR queue = ANY (:queues))
  AND (:state::todo_state IS NULL OR state = :state)
  AND (:face::text IS NULL
       OR (:face = 'ready' AND ready_at <= now())
       OR (:face = 'retrying' AND ready_at > now() AND next_retry_at IS NOT NULL)
       OR (:face = 'scheduled' AND ready_at > now() AND next_retry_at IS NULL))
  AND (:assignee::text IS NULL OR assignee = :assignee)
  AND (:owner::text IS NULL OR owner = :owner)
  AND (:kind::text IS NULL OR kind = :kind)
  AND (:search::text IS NULL OR id = :search OR idempotency_key = :search OR title ILIKE :search_like)
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
-- In a transaction, before a list statement: plan it for this call's values.
SET LOCAL plan_cache_mode = force_custom_plan;

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
-- Dead row versions in the hot tables, as the statistics collector last counted them.
SELECT relname AS "table", n_dead_tup AS dead
FROM pg_stat_user_tables
WHERE relname IN ('todos', 'todo_history') AND schemaname = current_schema()
ORDER BY relname DESC;  -- todos first
