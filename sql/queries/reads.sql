-- Read queries behind the dashboard and the API's GET routes. Each one touches only
-- the partial indexes of live states (pending, claimed, failed) or a bounded time range
-- of finished ones, so its cost follows live work, not the table's size.

-- name: queue_counts
-- One row per queue that has live work, dead-letters or recent completions.
WITH pending AS (
    SELECT queue,
           count(*) FILTER (WHERE next_retry_at IS NULL OR next_retry_at <= now()) AS ready,
           count(*) FILTER (WHERE next_retry_at > now()) AS retrying,
           min(created_at) FILTER (WHERE next_retry_at IS NULL OR next_retry_at <= now())
               AS oldest_ready_at
    FROM todos WHERE state = 'pending' GROUP BY queue
), claimed AS (
    SELECT queue, count(*) AS claimed,
           count(*) FILTER (WHERE lease_expires_at < now()) AS lapsed
    FROM todos WHERE state = 'claimed' GROUP BY queue
), dead AS (
    SELECT queue, count(*) AS dead FROM todos WHERE state = 'failed' GROUP BY queue
), done AS (
    SELECT queue, count(*) AS done_recent FROM todos
    WHERE state = 'done' AND completed_at > now() - make_interval(secs => $1)
    GROUP BY queue
)
SELECT queue,
       coalesce(ready, 0) AS ready, coalesce(retrying, 0) AS retrying,
       coalesce(claimed, 0) AS claimed, coalesce(lapsed, 0) AS lapsed,
       coalesce(done_recent, 0) AS done_recent, coalesce(dead, 0) AS dead,
       oldest_ready_at, extract(epoch FROM now() - oldest_ready_at) AS oldest_ready_age
FROM pending
FULL JOIN claimed USING (queue)
FULL JOIN dead USING (queue)
FULL JOIN done USING (queue)
ORDER BY queue;

-- name: throughput
-- Completions per queue and minute over the last $1 minutes (for the sparklines).
SELECT queue, date_trunc('minute', completed_at) AS minute, count(*) AS done
FROM todos
WHERE state = 'done' AND completed_at > date_trunc('minute', now()) - make_interval(mins => $1 - 1)
GROUP BY queue, minute;

-- name: leases
-- Every claimed todo, soonest expiry first.
SELECT id, queue, title, kind, owner, attempt, max_attempts, lease_token, claimed_at,
       heartbeat_at, lease_expires_at, lease_expires_at < now() AS lapsed,
       extract(epoch FROM lease_expires_at - now()) AS seconds_left,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age, now() AS server_now
FROM todos
WHERE state = 'claimed' AND ($1::text IS NULL OR queue = $1)
ORDER BY lease_expires_at, id
LIMIT $2;

-- name: lease_count
SELECT count(*) FROM todos WHERE state = 'claimed';

-- name: todo
SELECT * FROM todos WHERE id = $1;

-- name: history
SELECT id, at, from_state, to_state, actor, attempt, note
FROM todo_history WHERE todo_id = $1 ORDER BY id;

-- name: event
SELECT * FROM events WHERE id = $1;

-- name: dead_letter_ids
-- "Retry all that match": every dead-letter, in queue $1 when given.
SELECT id FROM todos WHERE state = 'failed' AND ($1::text IS NULL OR queue = $1)
ORDER BY completed_at;

-- name: dead_letter_queues
-- The dead-letters page's queue menu (an index-only scan of todos_dead).
SELECT DISTINCT queue FROM todos WHERE state = 'failed' ORDER BY queue;
