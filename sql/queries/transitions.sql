-- Every statement that moves a todo, one per transition (DESIGN.md's table).
-- Each is one statement: the guard lives in the UPDATE's WHERE, and a CTE appends the
-- history row in the same statement. No row back means the guard failed; the store then
-- classifies the miss (classify_miss) as NotFound or Conflict.
-- Leases are written with clock_timestamp(): a statement may wait on a row lock first.
-- Parameters are named (:owner); dashboard/queries.py numbers them for asyncpg.
-- History rows record who moved the todo as a kind and a bare name (DESIGN.md, "Actors"):
-- a statement on a held todo writes ('agent', :owner), the reaper's ('system', 'reaper');
-- create, retry and force-release write the caller's (:actor_kind, :actor).

-- name: create_todos
-- Insert todos, or count the collapsed delivery on the live todo that holds the same
-- (queue, idempotency_key). Ids are made by the caller so it can tell which items were
-- created; payloads arrive as JSON text (the store encodes each once, when it checks it).
-- Items arrive sorted by (queue, idempotency_key), so concurrent batches lock live rows
-- in one order. :dedupe_hits counts each item's extra duplicates within the batch.
WITH upserted AS (
    INSERT INTO todos AS t (id, queue, source, kind, title, payload, idempotency_key,
                            assignee, max_attempts, event_id, dedupe_hits)
    SELECT id, queue, source, kind, title, payload::jsonb, idempotency_key, assignee,
           max_attempts, event_id, dedupe_hits
    FROM unnest(:ids::text[], :queues::text[], :sources::text[], :kinds::text[], :titles::text[],
                :payloads::text[], :idempotency_keys::text[], :assignees::text[],
                :max_attempts::int[], :event_ids::text[], :dedupe_hits::int[])
         AS i(id, queue, source, kind, title, payload, idempotency_key, assignee,
              max_attempts, event_id, dedupe_hits)
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND state NOT IN ('done', 'failed')
        DO UPDATE SET dedupe_hits = t.dedupe_hits + 1 + excluded.dedupe_hits,
                      updated_at = now()
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id,
           CASE WHEN id = ANY (:ids::text[]) THEN NULL ELSE state END,
           state, :actor_kind, :actor, attempt,
           CASE WHEN id = ANY (:ids::text[]) THEN 'created' ELSE 'duplicate delivery collapsed' END
    FROM upserted
)
SELECT * FROM upserted;

-- name: create_events
INSERT INTO events (id, source, kind, payload)
SELECT id, source, kind, payload::jsonb
FROM unnest(:ids::text[], :sources::text[], :kinds::text[], :payloads::text[]) AS e(id, source, kind, payload);

-- name: claim_batch
-- Claim up to :n of the longest-ready claimable todos in :queues for :owner, with a lease
-- of :ttl seconds (claim_next is a batch of one). Rows come back in claim order.
-- The scan starts at ready_at :after, where this claimer's last claim ended (the store's
-- ClaimCursors; null scans from the oldest), so it does not step over the entries
-- of everything claimed before it (migration 0007). A todo is claimable once its
-- ready_at has come; statement_timestamp(), not now(), so that a todo created earlier in
-- the caller's own transaction counts.
-- The `id = ANY (ARRAY (…))` form keeps the row lookups on the primary key in generic plans.
WITH picked AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND queue = ANY (:queues::text[])
      AND ready_at >= coalesce(:after::timestamptz, '-infinity') AND ready_at <= statement_timestamp()
      AND (assignee IS NULL OR assignee = :owner)
    ORDER BY ready_at
    LIMIT :n
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE todos t
    SET state = 'claimed', owner = :owner, attempt = t.attempt + 1,
        lease_token = t.lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM picked))
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed' FROM claimed
)
SELECT * FROM claimed ORDER BY ready_at;

-- name: complete
-- :owner completes todo :id (lease :lease) with :result (JSON text, or null).
-- :scope, when not null, is the API token's queues: a todo outside them is not touched
-- (as in every agent transition below).
WITH completed AS (
    UPDATE todos
    SET state = 'done', result = :result::text::jsonb, lease_expires_at = NULL, heartbeat_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', 'done', 'agent', :owner, attempt, 'completed' FROM completed
)
SELECT * FROM completed;

-- name: complete_many
-- complete for many todos in one statement: :ids with their :leases and :results
-- (JSON text or null), in the same order. With :all_or_none, nothing is completed unless
-- every item is held as it says (the batch worker's call); without it, each item that is
-- held is completed and the others are left for the store to classify (POST /acks).
WITH items AS (
    SELECT * FROM unnest(:ids::text[], :leases::bigint[], :results::text[]) AS i(id, lease, result)
), held AS (
    SELECT t.id FROM todos t JOIN items i ON t.id = i.id
    WHERE t.id = ANY (:ids::text[])
      AND t.state = 'claimed' AND t.owner = :owner AND t.lease_token = i.lease
      AND (:scope::text[] IS NULL OR t.queue = ANY (:scope::text[]))
    FOR UPDATE OF t
), completed AS (
    UPDATE todos t
    SET state = 'done', result = i.result::jsonb, lease_expires_at = NULL, heartbeat_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM items i
    WHERE t.id = ANY (ARRAY (SELECT id FROM held)) AND t.id = i.id
      AND (NOT :all_or_none OR (SELECT count(*) FROM held) = cardinality(:ids::text[]))
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', 'done', 'agent', :owner, attempt, 'completed' FROM completed
)
SELECT * FROM completed;

-- name: complete_and_claim_next
-- The busy worker's statement: complete todo :id as `complete` does, then — only if it
-- completed — claim the next claimable todo in :queues from :after as `claim_batch`
-- does, in one round trip and one commit. Rows come back tagged 'completed', then 'claimed'.
WITH completed AS (
    UPDATE todos
    SET state = 'done', result = :result::text::jsonb, lease_expires_at = NULL, heartbeat_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), picked AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND queue = ANY (:queues::text[])
      AND ready_at >= coalesce(:after::timestamptz, '-infinity') AND ready_at <= statement_timestamp()
      AND (assignee IS NULL OR assignee = :owner)
      AND EXISTS (SELECT FROM completed)
    ORDER BY ready_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE todos t
    SET state = 'claimed', owner = :owner, attempt = t.attempt + 1,
        lease_token = t.lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM picked))
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed'::todo_state, 'done'::todo_state, 'agent', :owner, attempt, 'completed'
    FROM completed
    UNION ALL
    SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed' FROM claimed
)
SELECT 'completed' AS part, * FROM completed
UNION ALL
SELECT 'claimed' AS part, * FROM claimed;

-- name: claim
-- Claim todo :id for :owner with a lease of :ttl seconds, if it is due and not assigned
-- to someone else. The guard compares state::text so that no plan can take the pending
-- indexes instead of the primary key: when few todos are pending, a generic plan found
-- them as cheap, and then walked every dead entry in them while vacuum was held back.
WITH claimed AS (
    UPDATE todos
    SET state = 'claimed', owner = :owner, attempt = attempt + 1,
        lease_token = lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE id = :id AND state::text = 'pending' AND ready_at <= statement_timestamp()
      AND (assignee IS NULL OR assignee = :owner)
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed by id' FROM claimed
)
SELECT * FROM claimed;

-- name: heartbeat
-- Extend the lease of todo :id (owner :owner, lease :lease) to :ttl seconds from now.
-- Succeeds on a lapsed lease the reaper has not yet taken, as SQS does.
WITH beat AS (
    UPDATE todos
    SET lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
        heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', 'claimed', 'agent', :owner, attempt, 'heartbeat' FROM beat
)
SELECT * FROM beat;

-- name: release
-- Give todo :id back (owner :owner, lease :lease). The attempt stays counted, as in SQS.
WITH released AS (
    UPDATE todos
    SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        ready_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', 'pending', 'agent', :owner, attempt, 'released' FROM released
)
SELECT * FROM released;

-- name: fail
-- Todo :id (owner :owner, lease :lease) failed with :error: back to pending with a retry
-- time below max_attempts, dead-lettered (failed) at the cap. The retry time (random:
-- todo_backoff) is drawn once, in `held`, for both next_retry_at and ready_at.
WITH held AS (
    SELECT id, CASE WHEN attempt < max_attempts THEN clock_timestamp() + todo_backoff(attempt) END
               AS retry_at
    FROM todos
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    FOR UPDATE
), failed AS (
    UPDATE todos t
    SET state = CASE WHEN h.retry_at IS NULL THEN 'failed' ELSE 'pending' END::todo_state,
        next_retry_at = h.retry_at, ready_at = coalesce(h.retry_at, t.ready_at),
        completed_at = CASE WHEN h.retry_at IS NULL THEN clock_timestamp() END,
        owner = CASE WHEN h.retry_at IS NULL THEN t.owner END,
        lease_expires_at = NULL, heartbeat_at = NULL, last_error = :error,
        updated_at = clock_timestamp()
    FROM held h
    WHERE t.id = h.id AND t.id = :id
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', state, 'agent', :owner, attempt, :error FROM failed
)
SELECT * FROM failed;

-- name: reap
-- Up to :limit claimed todos whose lease lapsed: treated as a failure of their owner.
-- Safe with many reapers at once: each locks different rows, and the guard is re-checked.
-- Each retry time is drawn once, in `expired`, for both next_retry_at and ready_at.
WITH expired AS (
    SELECT id, CASE WHEN attempt < max_attempts THEN clock_timestamp() + todo_backoff(attempt) END
               AS retry_at
    FROM todos
    WHERE state = 'claimed' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE todos t
    SET state = CASE WHEN e.retry_at IS NULL THEN 'failed' ELSE 'pending' END::todo_state,
        next_retry_at = e.retry_at, ready_at = coalesce(e.retry_at, t.ready_at),
        completed_at = CASE WHEN e.retry_at IS NULL THEN clock_timestamp() END,
        owner = CASE WHEN e.retry_at IS NULL THEN t.owner END,
        lease_expires_at = NULL, heartbeat_at = NULL,
        last_error = 'lease expired (owner ' || t.owner || ')',
        updated_at = clock_timestamp()
    FROM expired e
    WHERE t.id = ANY (ARRAY (SELECT id FROM expired)) AND t.id = e.id
      AND t.state = 'claimed' AND t.lease_expires_at < now()
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed', state, 'system', 'reaper', attempt, last_error FROM reaped
)
SELECT * FROM reaped;

-- name: promote_due_retries
-- Up to :limit retrying todos whose time has come: clearing next_retry_at tells pages
-- they are ready, and the queues come back so the store can hint waiting workers
-- (claims already accept a due retry without this). ready_at stays: it is the due time.
WITH due AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND next_retry_at <= now()
    ORDER BY next_retry_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE todos t SET next_retry_at = NULL, updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM due)) AND t.state = 'pending'
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'pending', 'pending', 'system', 'reaper', attempt, 'retry due' FROM promoted
)
SELECT count(*)::int AS promoted, coalesce(array_agg(DISTINCT queue), '{}') AS queues FROM promoted;

-- name: retry
-- Operator (:actor_kind, :actor) retries dead-lettered todo :id: a fresh budget (attempt 0) unless
-- :one_more (one more attempt: max_attempts raised by one). Raises unique_violation when
-- a live todo already holds the key; the store turns that into a Conflict naming it.
WITH retried AS (
    UPDATE todos
    SET state = 'pending', owner = NULL, completed_at = NULL, next_retry_at = NULL,
        ready_at = clock_timestamp(),
        attempt = CASE WHEN :one_more THEN attempt ELSE 0 END,
        max_attempts = CASE WHEN :one_more THEN attempt + 1 ELSE max_attempts END,
        updated_at = clock_timestamp()
    WHERE id = :id AND state = 'failed'
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'failed', 'pending', :actor_kind, :actor, attempt,
           CASE WHEN :one_more THEN 'retried by operator: one more attempt'
                ELSE 'retried by operator: fresh budget' END
    FROM retried
)
SELECT * FROM retried;

-- name: force_release
-- Operator (:actor_kind, :actor) takes back the lease on todo :id (a dead agent still holds it).
WITH released AS (
    SELECT id, owner FROM todos WHERE id = :id AND state = 'claimed' FOR UPDATE
), updated AS (
    UPDATE todos t
    SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        ready_at = clock_timestamp(), updated_at = clock_timestamp()
    FROM released WHERE t.id = released.id
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT u.id, 'claimed', 'pending', :actor_kind, :actor, u.attempt,
           'lease force-released (was held by ' || r.owner || ')'
    FROM updated u JOIN released r USING (id)
)
SELECT * FROM updated;

-- name: classify_miss
-- Why a guarded transition on todo :id matched nothing.
SELECT queue, state, owner, assignee, lease_token, next_retry_at, now() AS now
FROM todos WHERE id = :id;

-- name: live_todo_with_key
-- Why a retry of todo :id broke the dedupe index: the live todo that holds its key.
SELECT d.queue, d.idempotency_key, live.id AS live_id, live.state AS live_state
FROM todos d
LEFT JOIN todos live ON live.queue = d.queue AND live.idempotency_key = d.idempotency_key
                    AND live.state NOT IN ('done', 'failed')
WHERE d.id = :id;

-- name: prune_finished
-- Delete up to :batch finished todos (done or dead) that finished more than
-- :older_than seconds ago.
WITH old AS (
    SELECT id FROM todos
    WHERE state IN ('done', 'failed')
      AND completed_at < now() - make_interval(secs => :older_than)
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todos WHERE id = ANY (ARRAY (SELECT id FROM old));
