-- Every statement that moves a todo, one per transition (DESIGN.md's table).
-- Each is one statement: the guard lives in the UPDATE's WHERE, and a CTE appends the
-- history row in the same statement. No row back means the guard failed; the store then
-- classifies the miss (classify_miss) as NotFound or Conflict.
-- Leases are written with clock_timestamp(): a statement may wait on a row lock first.

-- name: create_todos
-- Insert todos, or count the collapsed delivery on the live todo that holds the same
-- (queue, idempotency_key). Ids are made by the caller so it can tell which items were
-- created; payloads arrive as JSON text (the store encodes each once, when it checks it). Items arrive sorted by (queue, idempotency_key), so concurrent batches lock
-- live rows in one order. $12: actor, $13: the items' extra in-batch duplicates.
WITH upserted AS (
    INSERT INTO todos AS t (id, queue, source, kind, title, payload, idempotency_key,
                            assignee, max_attempts, event_id, dedupe_hits)
    SELECT id, queue, source, kind, title, payload::jsonb, idempotency_key, assignee,
           max_attempts, event_id, dedupe_hits
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::int[], $10::text[], $11::int[])
         AS i(id, queue, source, kind, title, payload, idempotency_key, assignee,
              max_attempts, event_id, dedupe_hits)
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND state NOT IN ('done', 'failed')
        DO UPDATE SET dedupe_hits = t.dedupe_hits + 1 + excluded.dedupe_hits,
                      updated_at = now()
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id,
           CASE WHEN id = ANY ($1) THEN NULL ELSE state END,
           state, $12, attempt,
           CASE WHEN id = ANY ($1) THEN 'created' ELSE 'duplicate delivery collapsed' END
    FROM upserted
)
SELECT * FROM upserted;

-- name: create_events
INSERT INTO events (id, source, kind, payload)
SELECT id, source, kind, payload::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS e(id, source, kind, payload);

-- name: complete_and_claim
-- The busy worker's statement, in one round trip and one commit: complete the todos
-- $5 (lease tokens $6, results $7) held by owner $2, then — only if every one of them
-- completed — claim up to $4 of the oldest claimable todos in queues $1 with a lease of
-- $3 seconds. With no todos to complete it is claim_next / claim_batch; with $4 = 0 it
-- is complete / complete_many. $8, when not null, limits completions to those queues
-- (an API token's). Rows come back tagged 'completed', then 'claimed'.
-- The `id = ANY (…)` forms keep every row lookup on the primary key, in generic plans too.
WITH to_complete AS (
    SELECT * FROM unnest($5::text[], $6::bigint[], $7::text[]) AS i(id, lease, result)
), completed AS (
    UPDATE todos t
    SET state = 'done', result = c.result::jsonb, lease_expires_at = NULL, heartbeat_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM to_complete c
    WHERE t.id = ANY ($5::text[]) AND t.id = c.id
      AND t.state = 'claimed' AND t.owner = $2 AND t.lease_token = c.lease
      AND ($8::text[] IS NULL OR t.queue = ANY ($8::text[]))
    RETURNING t.*
), picked AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND queue = ANY ($1::text[])
      AND (next_retry_at IS NULL OR next_retry_at <= now())
      AND (assignee IS NULL OR assignee = $2)
      AND (SELECT count(*) FROM completed) = cardinality($5::text[])
    ORDER BY created_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE todos t
    SET state = 'claimed', owner = $2, attempt = t.attempt + 1,
        lease_token = t.lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => $3),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM picked))
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'claimed'::todo_state, 'done'::todo_state, $2, attempt, 'completed'
    FROM completed
    UNION ALL
    SELECT id, 'pending', 'claimed', $2, attempt, 'claimed' FROM claimed
)
SELECT 'completed' AS part, * FROM completed
UNION ALL
(SELECT 'claimed' AS part, * FROM claimed ORDER BY created_at);

-- name: claim
-- Claim todo $1 for owner $2 with a lease of $3 seconds, if it is due and not assigned
-- to someone else.
WITH claimed AS (
    UPDATE todos
    SET state = 'claimed', owner = $2, attempt = attempt + 1,
        lease_token = lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => $3),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'pending'
      AND (next_retry_at IS NULL OR next_retry_at <= now())
      AND (assignee IS NULL OR assignee = $2)
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'pending', 'claimed', $2, attempt, 'claimed by id' FROM claimed
)
SELECT * FROM claimed;

-- name: heartbeat
-- Extend the lease of todo $1 (owner $2, lease $3) to $4 seconds from now. Succeeds on a
-- lapsed lease the reaper has not yet taken, as SQS does. $5: allowed queues (or null),
-- as in every agent transition below.
WITH beat AS (
    UPDATE todos
    SET lease_expires_at = clock_timestamp() + make_interval(secs => $4),
        heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'claimed' AND owner = $2 AND lease_token = $3
      AND ($5::text[] IS NULL OR queue = ANY ($5::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'claimed', 'claimed', $2, attempt, 'heartbeat' FROM beat
)
SELECT * FROM beat;

-- name: release
-- Give todo $1 back (owner $2, lease $3; allowed queues $4). The attempt stays counted,
-- as in SQS.
WITH released AS (
    UPDATE todos
    SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'claimed' AND owner = $2 AND lease_token = $3
      AND ($4::text[] IS NULL OR queue = ANY ($4::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'claimed', 'pending', $2, attempt, 'released' FROM released
)
SELECT * FROM released;

-- name: fail
-- Todo $1 (owner $2, lease $3; allowed queues $5) failed with error $4: back to pending
-- with a retry time below max_attempts, dead-lettered (failed) at the cap.
WITH failed AS (
    UPDATE todos
    SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END::todo_state,
        next_retry_at = CASE WHEN attempt < max_attempts
                             THEN clock_timestamp() + todo_backoff(attempt) END,
        completed_at = CASE WHEN attempt >= max_attempts THEN clock_timestamp() END,
        owner = CASE WHEN attempt >= max_attempts THEN owner END,
        lease_expires_at = NULL, heartbeat_at = NULL, last_error = $4,
        updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'claimed' AND owner = $2 AND lease_token = $3
      AND ($5::text[] IS NULL OR queue = ANY ($5::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'claimed', state, $2, attempt, $4 FROM failed
)
SELECT * FROM failed;

-- name: reap
-- Up to $1 claimed todos whose lease lapsed: treated as a failure of their owner. Safe
-- with many reapers at once: each locks different rows, and the guard is re-checked.
WITH expired AS (
    SELECT id FROM todos
    WHERE state = 'claimed' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE todos t
    SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END::todo_state,
        next_retry_at = CASE WHEN attempt < max_attempts
                             THEN clock_timestamp() + todo_backoff(attempt) END,
        completed_at = CASE WHEN attempt >= max_attempts THEN clock_timestamp() END,
        owner = CASE WHEN attempt >= max_attempts THEN t.owner END,
        lease_expires_at = NULL, heartbeat_at = NULL,
        last_error = 'lease expired (owner ' || t.owner || ')',
        updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM expired))
      AND t.state = 'claimed' AND t.lease_expires_at < now()
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'claimed', state, 'reaper', attempt, last_error FROM reaped
)
SELECT * FROM reaped;

-- name: promote_due_retries
-- Up to $1 retrying todos whose time has come: clearing next_retry_at fires the NOTIFY
-- hint that wakes waiting workers (claims already accept a due retry without this).
WITH due AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND next_retry_at <= now()
    ORDER BY next_retry_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE todos t SET next_retry_at = NULL, updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM due)) AND t.state = 'pending'
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'pending', 'pending', 'reaper', attempt, 'retry due' FROM promoted
)
SELECT count(*) FROM promoted;

-- name: retry
-- Operator $2 retries dead-lettered todo $1: a fresh budget (attempt 0) unless $3
-- (one more attempt: max_attempts raised by one). Raises unique_violation when a live
-- todo already holds the key; the store turns that into a Conflict naming it.
WITH retried AS (
    UPDATE todos
    SET state = 'pending', owner = NULL, completed_at = NULL, next_retry_at = NULL,
        attempt = CASE WHEN $3 THEN attempt ELSE 0 END,
        max_attempts = CASE WHEN $3 THEN attempt + 1 ELSE max_attempts END,
        updated_at = clock_timestamp()
    WHERE id = $1 AND state = 'failed'
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT id, 'failed', 'pending', $2, attempt,
           CASE WHEN $3 THEN 'retried by operator: one more attempt'
                ELSE 'retried by operator: fresh budget' END
    FROM retried
)
SELECT * FROM retried;

-- name: force_release
-- Operator $2 takes back the lease on todo $1 (a dead agent still holds it).
WITH released AS (
    SELECT id, owner FROM todos WHERE id = $1 AND state = 'claimed' FOR UPDATE
), updated AS (
    UPDATE todos t
    SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        updated_at = clock_timestamp()
    FROM released WHERE t.id = released.id
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note)
    SELECT u.id, 'claimed', 'pending', $2, u.attempt,
           'lease force-released (was held by ' || r.owner || ')'
    FROM updated u JOIN released r USING (id)
)
SELECT * FROM updated;

-- name: classify_miss
-- Why a guarded transition on todo $1 matched nothing.
SELECT queue, state, owner, assignee, lease_token, next_retry_at, now() AS now
FROM todos WHERE id = $1;

-- name: live_todo_with_key
SELECT id, state, owner FROM todos
WHERE queue = $1 AND idempotency_key = $2 AND state NOT IN ('done', 'failed');

-- name: prune_finished
-- Delete up to $2 finished todos (done or dead) that finished more than $1 seconds ago.
WITH old AS (
    SELECT id FROM todos
    WHERE state IN ('done', 'failed')
      AND completed_at < now() - make_interval(secs => $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todos WHERE id = ANY (ARRAY (SELECT id FROM old));
