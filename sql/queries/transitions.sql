-- Every statement that moves a todo, one per transition (DESIGN.md's table).
-- Each is one statement: the guard lives in the UPDATE's WHERE, and a CTE appends the
-- history row in the same statement (but a heartbeat: the row holds it). No row back
-- means the guard failed; the store then classifies the miss (classify_miss) as NotFound
-- or Conflict.
-- Leases are written with clock_timestamp(): a statement may wait on a row lock first.
-- Parameters are named (:owner); dashboard/queries.py numbers them for asyncpg.
-- What several statements share is written once in fragments.sql and taken with an
-- `-- include: x` line: who may claim (claimable), the claim scan, the lease guard, the
-- history row's columns, what completing, failing and retrying write.
-- History rows record who moved the todo as a kind and a bare name (DESIGN.md, "Actors"):
-- claim by id, release, complete and fail write (:actor_kind, :owner): 'agent',
-- or 'operator' for a person working their inbox; the batch claims and completions are
-- agents' only and write ('agent', :owner); the reaper's ('system', 'reaper');
-- create, retry and force-release write the caller's (:actor_kind, :actor).

-- name: create_todos
-- Insert todos, or count the collapsed delivery on the live todo that holds the same
-- (queue, idempotency_key). Ids are made by the caller so it can tell which items were
-- created; payloads arrive as JSON text (the store encodes each once, when it checks it).
-- Items arrive sorted by (queue, idempotency_key), so concurrent batches lock live rows
-- in one order. :dedupe_hits counts each item's extra duplicates within the batch.
-- A todo is ready at once, or at its :run_ats (a past time: at once), or :delays seconds
-- from now, on the database's clock.
WITH upserted AS (
    INSERT INTO todos AS t (id, queue, source, kind, title, payload, idempotency_key,
                            assignee, max_attempts, event_id, dedupe_hits, priority,
                            ready_at, assignee_until)
    SELECT id, queue, source, kind, title, payload::jsonb, idempotency_key, assignee,
           max_attempts, event_id, dedupe_hits, priority,
           CASE WHEN run_at IS NOT NULL THEN greatest(run_at, clock_timestamp())
                ELSE clock_timestamp() + make_interval(secs => coalesce(delay, 0)) END,
           assignee_until
    FROM unnest(:ids::text[], :queues::text[], :sources::text[], :kinds::text[], :titles::text[],
                :payloads::text[], :idempotency_keys::text[], :assignees::text[],
                :max_attempts::int[], :event_ids::text[], :dedupe_hits::int[],
                :priorities::int[], :run_ats::timestamptz[], :delays::float8[],
                :assignee_untils::timestamptz[])
         AS i(id, queue, source, kind, title, payload, idempotency_key, assignee,
              max_attempts, event_id, dedupe_hits, priority, run_at, delay, assignee_until)
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND state NOT IN ('done', 'failed')
        DO UPDATE SET dedupe_hits = t.dedupe_hits + 1 + excluded.dedupe_hits,
                      updated_at = clock_timestamp()
    RETURNING t.*
), logged AS (
    -- include: history_insert
    SELECT id,
           CASE WHEN id = ANY (:ids::text[]) THEN NULL ELSE state END,
           state, :actor_kind, :actor, attempt,
           CASE WHEN id = ANY (:ids::text[]) THEN 'created' ELSE 'duplicate delivery collapsed' END,
           CASE WHEN id = ANY (:ids::text[]) THEN 'created' ELSE 'deduplicated' END, queue, NULL,
           updated_at
    FROM upserted
)
SELECT * FROM upserted;

-- name: create_events
INSERT INTO events (id, source, kind, payload)
SELECT id, source, kind, payload::jsonb
FROM unnest(:ids::text[], :sources::text[], :kinds::text[], :payloads::text[]) AS e(id, source, kind, payload);

-- name: claim_batch
-- Claim up to :n claimable todos in :queues for :owner, with a lease of :ttl seconds
-- (claim_next is a batch of one), from the position (:rank, :after): claim_scan in
-- fragments.sql. Rows come back in claim order.
WITH wanted AS (
    SELECT :n::bigint AS n
),
-- include: claim_scan
, logged AS (
    -- include: history_insert
    SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed',
           'claimed', queue, extract(epoch FROM claimed_at - ready_at), updated_at FROM claimed
)
SELECT * FROM claimed ORDER BY -priority, ready_at;

-- name: complete
-- :owner completes todo :id (lease :lease) with :result (JSON text, or null).
-- :scope, when not null, is the API token's queues: a todo outside them is not touched
-- (as in every agent transition below: held_by_caller).
WITH completed AS (
    -- include: complete_held
), logged AS (
    -- include: history_insert
    SELECT id, 'claimed', 'done', :actor_kind, :owner, attempt, 'completed',
           'completed', queue, extract(epoch FROM completed_at - claimed_at), updated_at FROM completed
)
SELECT * FROM completed;

-- name: complete_many
-- complete for many todos in one statement: :ids with their :leases and :results
-- (JSON text or null), in the same order (complete_listed). With :all_or_none, nothing is
-- completed unless every item is held as it says (the batch worker's call); without it,
-- each item that is held is completed and the others are left for the store to classify
-- (POST /acks).
WITH
-- include: complete_listed
, logged AS (
    -- include: history_insert
    SELECT id, 'claimed', 'done', 'agent', :owner, attempt, 'completed',
           'completed', queue, extract(epoch FROM completed_at - claimed_at), updated_at FROM completed
)
SELECT * FROM completed;

-- name: complete_many_and_claim
-- The Python Worker's round trip (dashboard/worker.py): complete the listed todos as
-- complete_many does without :all_or_none, and claim up to :n claimable todos in :queues
-- from (:rank, :after) as claim_batch does, in one statement and one commit. Rows come
-- back tagged 'completed', then 'claimed' in claim order.
WITH
-- include: complete_listed
, wanted AS (
    SELECT :n::bigint AS n
),
-- include: claim_scan
, logged AS (
    -- include: completed_and_claimed_history
)
SELECT 'completed' AS part, * FROM completed
UNION ALL
(SELECT 'claimed' AS part, * FROM claimed ORDER BY -priority, ready_at);

-- name: complete_and_claim_next
-- The busy worker's statement: complete todo :id as `complete` does, then — only if it
-- completed — claim the next claimable todo in :queues from (:rank, :after) as
-- `claim_batch` does, in one round trip and one commit. Rows come back tagged
-- 'completed', then 'claimed'.
WITH completed AS (
    -- include: complete_held
), wanted AS (  -- one todo, if this one completed
    SELECT count(*) AS n FROM completed
),
-- include: claim_scan
, logged AS (
    -- include: completed_and_claimed_history
)
SELECT 'completed' AS part, * FROM completed
UNION ALL
SELECT 'claimed' AS part, * FROM claimed;

-- name: claim
-- Claim todo :id for :owner with a lease of :ttl seconds, if it is claimable and its
-- queue is not paused. The guard compares state::text so that no plan can take the pending
-- indexes instead of the primary key: when few todos are pending, a generic plan found
-- them as cheap, and then walked every dead entry in them while vacuum was held back.
WITH claimed AS (
    UPDATE todos
    -- include: claim_lease
    WHERE id = :id AND state::text = 'pending'
      -- include: claimable
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
      AND NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = todos.queue)
    RETURNING *
), logged AS (
    -- include: history_insert
    SELECT id, 'pending', 'claimed', :actor_kind, :owner, attempt, 'claimed by id',
           'claimed', queue, extract(epoch FROM claimed_at - ready_at), updated_at FROM claimed
)
SELECT * FROM claimed;

-- name: heartbeat
-- Extend the lease of todo :id (owner :owner, lease :lease) to :ttl seconds from now.
-- Succeeds on a lapsed lease the reaper has not yet taken, as SQS does. No history row:
-- the row holds the last heartbeat (heartbeat_at), and a lease's run ends in a row that
-- says how long it ran (DESIGN.md, "History": no more history than the row cannot hold).
UPDATE todos
SET lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
    heartbeat_at = clock_timestamp(), updated_at = clock_timestamp()
-- include: held_by_caller
RETURNING *;

-- name: release
-- Give todo :id back (owner :owner, lease :lease). The attempt stays counted, as in SQS.
WITH released AS (
    UPDATE todos
    -- include: lease_returned
    -- include: held_by_caller
    RETURNING *
), logged AS (
    -- include: history_insert
    SELECT id, 'claimed', 'pending', :actor_kind, :owner, attempt, 'released',
           'released', queue, extract(epoch FROM updated_at - claimed_at), updated_at FROM released
)
SELECT * FROM released;

-- name: give_back
-- Todos :ids, just claimed by :owner under :leases for a client that went before the claim
-- reached it (a long-poll whose connection closed): pending again as if never claimed. The
-- attempt is not counted and the todo keeps its place in line (ready_at is untouched).
WITH given AS (
    UPDATE todos t
    SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
        attempt = t.attempt - 1, updated_at = clock_timestamp()
    FROM unnest(:ids::text[], :leases::bigint[]) AS i(id, lease)
    WHERE t.id = i.id AND t.state = 'claimed' AND t.owner = :owner AND t.lease_token = i.lease
    RETURNING t.*
), logged AS (
    -- include: history_insert
    SELECT id, 'claimed', 'pending', 'agent', :owner, attempt,
           'given back: the claimer disconnected before the claim reached it (attempt not counted)',
           'given_back', queue, NULL, updated_at FROM given
)
SELECT * FROM given;

-- name: fail
-- Todo :id (owner :owner, lease :lease) failed with :error: back to pending with a retry
-- time below max_attempts, dead-lettered (failed) at the cap (retry_at, failure).
WITH held AS (
    -- include: retry_at
    -- include: held_by_caller
    FOR UPDATE
), failed AS (
    UPDATE todos t
    SET last_error = :error,
        -- include: failure
    FROM held AS failing
    WHERE t.id = failing.id AND t.id = :id
    RETURNING t.*
), logged AS (
    -- include: history_insert
    SELECT id, 'claimed', state, :actor_kind, :owner, attempt, :error,
           'failed', queue, extract(epoch FROM updated_at - claimed_at), updated_at FROM failed
)
SELECT * FROM failed;

-- name: reap
-- Up to :limit claimed todos whose lease lapsed: treated as a failure of their owner.
-- Safe with many reapers at once: each locks different rows, and the guard is re-checked.
WITH expired AS (
    -- include: retry_at
    WHERE state = 'claimed' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE todos t
    SET last_error = 'lease expired (owner ' || t.owner || ')',
        -- include: failure
    FROM expired AS failing
    WHERE t.id = ANY (ARRAY (SELECT id FROM expired)) AND t.id = failing.id
      AND t.state = 'claimed' AND t.lease_expires_at < now()
    RETURNING t.*
), logged AS (
    -- include: history_insert
    SELECT id, 'claimed', state, 'system', 'reaper', attempt, last_error,
           'reaped', queue, extract(epoch FROM updated_at - claimed_at), updated_at FROM reaped
)
SELECT * FROM reaped;

-- name: watch
-- Someone waits for todo :id to finish (dashboard/agents.py): mark it watched while it
-- is pending or claimed, so that the store hints it by id when a transition finishes it
-- (0011_waits.sql). Not a move of the todo: no history row, updated_at unchanged. A todo
-- already watched is not written again (fifty waiters, one mark). :scope as above.
UPDATE todos SET watched = true
WHERE id = :id AND state::text IN ('pending', 'claimed') AND NOT watched
  AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]));

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
    -- include: history_insert
    SELECT id, 'pending', 'pending', 'system', 'reaper', attempt, 'retry due', 'retry_due', queue, NULL,
           updated_at
    FROM promoted
)
SELECT count(*)::int AS promoted, coalesce(array_agg(DISTINCT queue), '{}') AS queues FROM promoted;

-- name: retry
-- Operator (:actor_kind, :actor) retries dead-lettered todo :id (fragment `retry`: a
-- fresh budget unless :one_more). Raises unique_violation when a live todo already holds
-- the key; the store turns that into a Conflict naming it.
WITH retried AS (
    UPDATE todos
    -- include: retry
    WHERE id = :id AND state = 'failed'
    RETURNING *
), logged AS (
    -- include: retried_history
)
SELECT * FROM retried;

-- name: retry_many
-- retry for many dead-letters :ids in one statement. A dead todo whose idempotency key a
-- live todo holds is left dead, and of several with one key only the newest is retried
-- (the dedupe index allows one live todo per key). A concurrent create of the same key
-- can still raise unique_violation: the store then retries them one by one. (state::text:
-- see cancel_many.)
WITH candidates AS (
    SELECT DISTINCT ON (d.queue, coalesce(d.idempotency_key, d.id)) d.id
    FROM todos d
    WHERE d.id = ANY (:ids::text[]) AND d.state::text = 'failed'
      AND (d.idempotency_key IS NULL OR NOT EXISTS (
               SELECT FROM todos live
               WHERE live.queue = d.queue AND live.idempotency_key = d.idempotency_key
                 AND live.state NOT IN ('done', 'failed')))
    ORDER BY d.queue, coalesce(d.idempotency_key, d.id), d.completed_at DESC
), retried AS (
    UPDATE todos
    -- include: retry
    WHERE id = ANY (ARRAY (SELECT id FROM candidates)) AND state::text = 'failed'
    RETURNING *
), logged AS (
    -- include: retried_history
)
SELECT * FROM retried;

-- name: force_release
-- Operator (:actor_kind, :actor) takes back the lease on todo :id (a dead agent still holds it).
WITH released AS (
    SELECT id, owner FROM todos WHERE id = :id AND state = 'claimed' FOR UPDATE
), updated AS (
    UPDATE todos t
    -- include: lease_returned
    FROM released WHERE t.id = released.id
    RETURNING t.*
), logged AS (
    -- include: history_insert
    SELECT u.id, 'claimed', 'pending', :actor_kind, :actor, u.attempt,
           'lease force-released (was held by ' || r.owner || ')',
           'force_released', u.queue, extract(epoch FROM u.updated_at - u.claimed_at), u.updated_at
    FROM updated u JOIN released r USING (id)
)
SELECT * FROM updated;

-- name: classify_miss
-- Why a guarded transition on todo :id matched nothing.
SELECT t.queue, t.state, t.owner, t.assignee, t.assignee_until, t.lease_token, t.next_retry_at,
       t.ready_at, t.cancelled_at, t.cancelled_by_kind, t.cancelled_by, t.cancel_reason,
       p.paused_at, p.reason AS paused_reason, now() AS now
FROM todos t LEFT JOIN queue_pauses p ON p.queue = t.queue
WHERE t.id = :id;

-- name: record_stale_ack
-- An agent's ack on todo :id refused because a later claim superseded its :lease (the
-- agents page counts these). Written on the refusal only, never on the hot path.
INSERT INTO stale_acks (agent, todo_id, queue, action, lease)
VALUES (:agent, :id, :queue, :action, :lease);

-- name: live_todo_with_key
-- Why a retry of todo :id broke the dedupe index: the live todo that holds its key.
SELECT d.queue, d.idempotency_key, live.id AS live_id, live.state AS live_state
FROM todos d
LEFT JOIN todos live ON live.queue = d.queue AND live.idempotency_key = d.idempotency_key
                    AND live.state NOT IN ('done', 'failed')
WHERE d.id = :id;

-- name: cancel_many
-- (:actor_kind, :actor) cancels the todos :ids that are pending or claimed, for :reason:
-- each is dead-lettered (failed) with the cancellation recorded. A claimed todo keeps its
-- owner and lease token, so its holder's next heartbeat or ack is told it was cancelled.
-- :scope, when not null, is a producer's token's queues. Rows it does not change (gone,
-- finished meanwhile) are left alone and not locked.
-- The bulk statements compare state::text, so that only the primary key can find their
-- rows (a partial index of one state, walked whole and filtered by id, cost 4x), and join
-- `held` on id alone (with `id = ANY (ARRAY (…))` as well, a generic plan joined every
-- held row to every updated one).
WITH held AS (
    SELECT id, state FROM todos
    WHERE id = ANY (:ids::text[]) AND state::text IN ('pending', 'claimed')
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    FOR UPDATE
), cancelled AS (
    UPDATE todos t
    SET state = 'failed', lease_expires_at = NULL, heartbeat_at = NULL, next_retry_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp(),
        cancelled_at = clock_timestamp(), cancelled_by_kind = :actor_kind, cancelled_by = :actor,
        cancel_reason = :reason
    FROM held h
    WHERE t.id = h.id
    RETURNING t.*, h.state AS was
), logged AS (
    -- include: history_insert
    SELECT id, was, 'failed', :actor_kind, :actor, attempt,
           'cancelled' || coalesce(': ' || :reason, ''),
           'cancelled', queue, CASE WHEN was = 'claimed' THEN extract(epoch FROM completed_at - claimed_at) END,
           updated_at
    FROM cancelled
)
SELECT * FROM cancelled;

-- name: run_now_many
-- (:actor_kind, :actor) makes the scheduled or retrying todos among :ids claimable now.
-- ready_at becomes now, so the todo takes its place at the back of its priority level.
WITH due AS (
    UPDATE todos
    SET ready_at = clock_timestamp(), next_retry_at = NULL, updated_at = clock_timestamp()
    WHERE id = ANY (:ids::text[]) AND state::text = 'pending' AND ready_at > clock_timestamp()
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    -- include: history_insert
    SELECT id, 'pending', 'pending', :actor_kind, :actor, attempt, 'run now', 'run_now', queue, NULL, updated_at
    FROM due
)
SELECT * FROM due;

-- name: set_many
-- (:actor_kind, :actor) sets the priority (:priority, when not null) and/or the assignee
-- (:set_assignee: to :assignee, null for none; assignee_until is cleared) of those of
-- :ids that are pending or dead-lettered, and differ. The history row says what changed.
WITH held AS (
    SELECT id, priority, assignee FROM todos
    WHERE id = ANY (:ids::text[]) AND state::text IN ('pending', 'failed')
      AND (:priority::int IS NULL OR priority <> :priority::int
           OR (:set_assignee AND assignee IS DISTINCT FROM :assignee::text))
      AND (:priority::int IS NOT NULL OR (:set_assignee AND assignee IS DISTINCT FROM :assignee::text))
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    FOR UPDATE
), changed AS (
    UPDATE todos t
    SET priority = coalesce(:priority::int, t.priority),
        assignee = CASE WHEN :set_assignee THEN :assignee::text ELSE t.assignee END,
        assignee_until = CASE WHEN :set_assignee THEN NULL ELSE t.assignee_until END,
        updated_at = clock_timestamp()
    FROM held h
    WHERE t.id = h.id
    RETURNING t.*, jsonb_strip_nulls(jsonb_build_object(
        'priority', CASE WHEN t.priority <> h.priority THEN jsonb_build_array(h.priority, t.priority) END,
        'assignee', CASE WHEN t.assignee IS DISTINCT FROM h.assignee
                         THEN jsonb_build_array(h.assignee, t.assignee) END)) AS changes
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note, changes,
                              event, queue, elapsed, at)
    SELECT id, state, state, :actor_kind, :actor, attempt, 'edited', changes, 'edited', queue, NULL, updated_at
    FROM changed
)
SELECT * FROM changed;

-- name: edit
-- (:actor_kind, :actor) edits pending or dead-lettered todo :id, as last read at
-- :updated_at (a todo changed meanwhile is refused: the caller read it to say what
-- changed). Each value is the todo's new one (the store passes the unchanged ones as
-- they were); :run_at (pending only) makes ready_at that time, or now if it has passed.
-- :changes and :note say what changed, for the history row.
WITH edited AS (
    UPDATE todos
    SET title = :title, kind = :kind, payload = :payload::text::jsonb, assignee = :assignee,
        assignee_until = :assignee_until, max_attempts = :max_attempts, priority = :priority,
        ready_at = CASE WHEN state = 'pending' AND :run_at::timestamptz IS NOT NULL
                        THEN greatest(:run_at::timestamptz, clock_timestamp()) ELSE ready_at END,
        next_retry_at = CASE WHEN state = 'pending' AND :run_at::timestamptz IS NOT NULL
                             THEN NULL ELSE next_retry_at END,
        updated_at = clock_timestamp()
    WHERE id = :id AND state::text IN ('pending', 'failed') AND updated_at = :updated_at
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note, changes,
                              event, queue, elapsed, at)
    SELECT id, state, state, :actor_kind, :actor, attempt, :note, :changes::text::jsonb, 'edited', queue, NULL,
           updated_at
    FROM edited
)
SELECT * FROM edited;

-- name: assignment_facts
-- Whether :assignee names an operator (a person), and the database's clock: an agent may
-- not reassign a person's todo before its fallback, nor give a fallback already past.
SELECT EXISTS (SELECT 1 FROM operators WHERE name = :assignee) AS person, statement_timestamp() AS now;

-- name: lock_todo
-- Todo :id, its row locked until the transaction ends: edit and retry compares the
-- version its caller read before the retry changes it.
SELECT * FROM todos WHERE id = :id FOR UPDATE;

-- name: pause_queue
-- (:actor_kind, :actor) pauses :queue for :reason. Pausing a paused queue changes nothing
-- (and comes back empty).
WITH paused AS (
    INSERT INTO queue_pauses (queue, actor_kind, actor, reason)
    VALUES (:queue, :actor_kind, :actor, :reason)
    ON CONFLICT (queue) DO NOTHING
    RETURNING *
), logged AS (
    INSERT INTO queue_history (queue, action, actor_kind, actor, reason)
    SELECT queue, 'paused', actor_kind, actor, reason FROM paused
)
SELECT * FROM paused;

-- name: resume_queue
-- (:actor_kind, :actor) resumes :queue. Resuming a queue that is not paused changes
-- nothing (and comes back empty).
WITH resumed AS (
    DELETE FROM queue_pauses WHERE queue = :queue RETURNING queue
), logged AS (
    INSERT INTO queue_history (queue, action, actor_kind, actor, reason)
    SELECT queue, 'resumed', :actor_kind, :actor, :reason FROM resumed
)
SELECT * FROM resumed;

-- name: queue_pause
SELECT * FROM queue_pauses WHERE queue = :queue;

-- name: states_of
-- What became of the todos a bulk action skipped: how many are in each state.
SELECT state::text, count(*)::int AS n FROM todos WHERE id = ANY (:ids::text[]) GROUP BY state;

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
