-- SQL that several statements share, written once. Each fragment starts at a
-- `-- fragment: x` line; a statement takes it with a line `-- include: x`, which
-- dashboard/queries.py replaces by the fragment (indented as that line) when it loads the
-- files, before it numbers the parameters: a fragment's `:owner` is its statement's.
-- A fragment is a piece, never a statement of its own; its leading comment stays here.

-- fragment: claimable
-- Who may claim a pending todo, for every claim (by id, by scan): it is due — its
-- ready_at has come, by statement_timestamp(), not now(), so that a todo created earlier
-- in the caller's own transaction counts — and it is not assigned to someone else than
-- the claimer :owner, or its assignee's time (assignee_until) is up. Conditions joined
-- to a WHERE with AND. (A paused queue is left out before its todos are looked at:
-- claim_scan's `open`, claim's NOT EXISTS.)
AND ready_at <= statement_timestamp()
AND (assignee IS NULL OR assignee = :owner OR assignee_until <= statement_timestamp())

-- fragment: claim_lease
-- What a claim writes: the todo is :owner's for :ttl seconds, under a new lease token,
-- one attempt more.
SET state = 'claimed', owner = :owner, attempt = attempt + 1,
    lease_token = todo_lease_token(lease_token), next_retry_at = NULL,
    lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
    claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
    updated_at = clock_timestamp()

-- fragment: claim_scan
-- The CTEs of a claim by scan (claim_batch, complete_and_claim_next): claim up to
-- `wanted`.n claimable todos in :queues for :owner, with a lease of :ttl seconds, the
-- highest priority first, the longest ready first within it, into `claimed`. The
-- statement defines `wanted` (a row with n) before it.
-- Paused queues are left out (`open`).
-- The scan starts where this claimer's last claim ended (the store's ClaimCursors):
-- priority level :rank (-priority) at ready_at :after, so it does not step over the
-- entries of everything claimed before it (migrations 0007, 0008). `higher` takes a todo
-- of a higher priority that became ready since, from the oldest of those levels; `same`
-- goes on from the position; `lower` takes the levels below, each from its oldest. A scan
-- from the oldest is rank -10, after null: `lower` then covers every level from its top.
-- Each branch claims only what the ones before left of n, and is skipped at 0 (a LIMIT
-- of 0 reads nothing).
-- A claim pays only for what is in use (issue 27): each branch and the pause lookup has
-- a gate on the parameters (a one-time filter, checked before its scan starts):
-- - `higher` runs only below the top level (:rank > -10, the top priority: todo_row_consistent, 0017).
--   Below it, it is one descent to the index's first entry, which stops there without a
--   heap visit when no level above holds a pending todo; an EXISTS probe to decide
--   whether to run it would cost that same descent, so there is none.
-- - `same` runs only from a position (:after not null); from the oldest, `lower` starts
--   at :rank itself, so a full scan is one index scan.
-- - `open` looks at paused queues only when queue_pauses has a row (initplans are lazy:
--   the ELSE branch is not run).
-- `same` and `lower` stay two scans: a single one over (-priority, ready_at) >=
-- (:rank, :after) would, with nothing ready at :rank, walk every todo scheduled later at
-- that level before the next, where `same` stops at the first not yet ready.
-- At 50,000 pending, one priority, generic plan, the scan reads 6 buffers from a
-- position (the `higher` descent, then the claim's probe) and 4 from the oldest (8
-- before); tests/test_claim_cost.py holds it. What the claim costs beyond that is the
-- UPDATE (the row, every index it is in) and its history row.
-- The `id = ANY (ARRAY (…))` form keeps the row lookups on the primary key in generic plans.
open AS (
    SELECT CASE WHEN NOT EXISTS (SELECT FROM queue_pauses) THEN :queues::text[]
                ELSE array(SELECT q FROM unnest(:queues::text[]) AS q
                           WHERE NOT EXISTS (SELECT FROM queue_pauses p WHERE p.queue = q))
           END AS queues
), higher AS (
    SELECT id FROM todos
    WHERE :rank::int > -10
      AND state = 'pending' AND queue = ANY ((SELECT queues FROM open)::text[])
      AND -priority < :rank::int
      -- include: claimable
    ORDER BY -priority, ready_at
    LIMIT (SELECT n FROM wanted)
    FOR UPDATE SKIP LOCKED
), same AS (
    SELECT id FROM todos
    WHERE :after::timestamptz IS NOT NULL
      AND state = 'pending' AND queue = ANY ((SELECT queues FROM open)::text[])
      AND -priority = :rank::int AND ready_at >= :after::timestamptz
      -- include: claimable
    ORDER BY -priority, ready_at
    LIMIT (SELECT n FROM wanted) - (SELECT count(*) FROM higher)
    FOR UPDATE SKIP LOCKED
), lower AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND queue = ANY ((SELECT queues FROM open)::text[])
      AND -priority >= :rank::int + (:after::timestamptz IS NOT NULL)::int
      -- include: claimable
    ORDER BY -priority, ready_at
    LIMIT (SELECT n FROM wanted) - (SELECT count(*) FROM higher) - (SELECT count(*) FROM same)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE todos t
    -- include: claim_lease
    WHERE t.id = ANY (ARRAY (SELECT id FROM higher UNION ALL SELECT id FROM same
                             UNION ALL SELECT id FROM lower))
    RETURNING t.*
)

-- fragment: held_by_caller
-- The guard of an agent's transition on todo :id: claimed by :owner under lease :lease,
-- and, when :scope is not null (the API token's queues), in one of them.
WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
  AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))

-- fragment: complete_listed
-- The CTEs of completing a list (complete_many, complete_many_and_claim): :ids with their
-- :leases and :results (JSON text or null), each one :owner holds under that lease (and,
-- when :scope is not null, in one of its queues), into `completed`; with :all_or_none,
-- none unless every one is held.
items AS (
    SELECT * FROM unnest(:ids::text[], :leases::bigint[], :results::text[]) AS i(id, lease, result)
), held AS (
    SELECT t.id FROM todos t JOIN items i ON t.id = i.id
    WHERE t.id = ANY (:ids::text[])
      AND t.state = 'claimed' AND t.owner = :owner AND t.lease_token = i.lease
      AND (:scope::text[] IS NULL OR t.queue = ANY (:scope::text[]))
    FOR UPDATE OF t
), completed AS (
    UPDATE todos t
    SET result = i.result::jsonb,
        -- include: done
    FROM items i
    WHERE t.id = ANY (ARRAY (SELECT id FROM held)) AND t.id = i.id
      AND (NOT :all_or_none OR (SELECT count(*) FROM held) = cardinality(:ids::text[]))
    RETURNING t.*
)

-- fragment: completed_and_claimed_history
-- The history rows of a statement that completed (`completed`) and claimed (`claimed`)
-- for agent :owner (complete_and_claim_next, complete_many_and_claim).
-- include: history_insert
SELECT id, 'claimed'::todo_state, 'done'::todo_state, 'agent', :owner, attempt, 'completed',
       'completed', queue, extract(epoch FROM completed_at - claimed_at)::real, updated_at
FROM completed
UNION ALL
SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed',
       'claimed', queue, extract(epoch FROM claimed_at - ready_at)::real, updated_at FROM claimed

-- fragment: done
-- What completing writes besides the result (assignments, after the statement's `SET result = …,`).
state = 'done', lease_expires_at = NULL, heartbeat_at = NULL,
completed_at = clock_timestamp(), updated_at = clock_timestamp()

-- fragment: complete_held
-- :owner completes todo :id (lease :lease) with :result (JSON text, or null): the UPDATE
-- of complete and complete_and_claim_next.
UPDATE todos
SET result = :result::text::jsonb,
    -- include: done
-- include: held_by_caller
RETURNING *

-- fragment: lease_returned
-- What giving a lease back writes: pending again, at the back of its priority level.
SET state = 'pending', owner = NULL, lease_expires_at = NULL, heartbeat_at = NULL,
    ready_at = clock_timestamp(), updated_at = clock_timestamp()

-- fragment: retry_at
-- The todos a failure moves, each with its retry time (null at max_attempts: it is
-- dead-lettered), drawn once (todo_backoff is random) for both next_retry_at and
-- ready_at. The statement adds the WHERE.
SELECT id, CASE WHEN attempt < max_attempts THEN clock_timestamp() + todo_backoff(attempt) END
           AS retry_at
FROM todos

-- fragment: failure
-- What a failure writes besides last_error (assignments, after the statement's
-- `SET last_error = …,`), on todos t joined to its `retry_at` rows as `failing`: back to
-- pending at its retry time, or dead-lettered (failed) at the cap, where it keeps its owner.
state = CASE WHEN failing.retry_at IS NULL THEN 'failed' ELSE 'pending' END::todo_state,
next_retry_at = failing.retry_at, ready_at = coalesce(failing.retry_at, t.ready_at),
completed_at = CASE WHEN failing.retry_at IS NULL THEN clock_timestamp() END,
owner = CASE WHEN failing.retry_at IS NULL THEN t.owner END,
lease_expires_at = NULL, heartbeat_at = NULL, updated_at = clock_timestamp()

-- fragment: retry
-- What an operator's retry of a dead-letter writes: a fresh budget (attempt 0) unless
-- :one_more (one more attempt: max_attempts raised by one); a cancellation is cleared
-- (its history row stays).
SET state = 'pending', owner = NULL, completed_at = NULL, next_retry_at = NULL,
    ready_at = clock_timestamp(), cancelled_at = NULL, cancelled_by_kind = NULL,
    cancelled_by = NULL, cancel_reason = NULL,
    attempt = CASE WHEN :one_more THEN attempt ELSE 0 END,
    max_attempts = CASE WHEN :one_more THEN attempt + 1 ELSE max_attempts END,
    updated_at = clock_timestamp()

-- fragment: retried_history
-- The history rows of the todos a retry moved (`retried`), by (:actor_kind, :actor).
-- include: history_insert
SELECT id, 'failed', 'pending', :actor_kind, :actor, attempt,
       CASE WHEN :one_more THEN 'retried by operator: one more attempt'
            ELSE 'retried by operator: fresh budget' END,
       'retried', queue, NULL, updated_at
FROM retried

-- fragment: history_insert
-- The history row of a move (DESIGN.md, "Actors"); the statement adds its SELECT, whose
-- last column is `at`: the todo's updated_at as the move wrote it, the version it made,
-- so that what changed after a version is exactly the rows after it (history_since). An
-- edit's row also has `changes`, and names the columns itself.
INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note,
                          event, queue, elapsed, at)

-- fragment: todo_filter
-- The todo list's filter (list_todos, and matching_ids for "all matching"): every value
-- may be null, meaning any. :face picks one face of pending: ready, retrying or
-- scheduled. :payload_has: an object the payload contains (the API's); :payload_any:
-- objects the payload contains one of (the search's terms, dashboard/payload_search.py;
-- empty: none matches). :search_like: the title's pattern, which todos_text_search
-- (0014) answers.
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
  AND (:payload_has::jsonb IS NULL OR payload @> :payload_has)
  AND (:payload_any::jsonb[] IS NULL OR payload @> ANY (:payload_any))
