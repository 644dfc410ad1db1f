-- 0001: the queue itself — events, todos, their history, and the NOTIFY hint.
--
-- States (who moves a todo in and out of each):
--   pending  in: create, release, fail below the cap, reap below the cap, operator retry,
--                operator force-release.            out: claim.
--            A pending todo with a future next_retry_at is "retrying at T": it is not
--            claimable until then (derived, not a state of its own).
--   claimed  in: claim.   out: complete, fail, release, reap, force-release.
--   done     in: complete. terminal (pruned after the retention age).
--   failed   in: fail or reap at max_attempts (the dead-letter). out: operator retry.

CREATE TYPE todo_state AS ENUM ('pending', 'claimed', 'done', 'failed');

CREATE TABLE events (
    id          text PRIMARY KEY DEFAULT 'ev_' || gen_random_uuid(),
    source      text NOT NULL,
    kind        text NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}',
    received_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE todos (
    id               text PRIMARY KEY DEFAULT 'td_' || gen_random_uuid(),
    queue            text NOT NULL CHECK (queue ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    source           text,
    kind             text,
    title            text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}',
    event_id         text REFERENCES events (id) ON DELETE SET NULL,
    idempotency_key  text,
    assignee         text,
    state            todo_state NOT NULL DEFAULT 'pending',
    owner            text,
    lease_expires_at timestamptz,
    -- The fencing token: bumped by every claim and never reset (unlike attempt), so a
    -- lease that lapsed and was claimed again can never act on the newer attempt.
    lease_token      bigint NOT NULL DEFAULT 0,
    heartbeat_at     timestamptz,
    attempt          integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 5,
    result           jsonb,
    next_retry_at    timestamptz,
    last_error       text,
    dedupe_hits      integer NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    claimed_at       timestamptz,
    -- When the todo finished: completed (done) or dead-lettered (failed).
    completed_at     timestamptz,

    CONSTRAINT attempt_range CHECK (attempt >= 0 AND max_attempts >= 1),
    -- A lease exists exactly while claimed; done and failed keep the last owner.
    CONSTRAINT lease_only_when_claimed CHECK ((state = 'claimed') = (lease_expires_at IS NOT NULL)),
    CONSTRAINT claimed_has_owner CHECK (state <> 'claimed' OR owner IS NOT NULL),
    CONSTRAINT finished_has_completed_at CHECK (
        (state IN ('done', 'failed')) = (completed_at IS NOT NULL)),
    CONSTRAINT retry_only_when_pending CHECK (next_retry_at IS NULL OR state = 'pending')
);

-- The claim scan for a rare queue, and the overview's ready/retrying counts and oldest
-- ready age per queue (next_retry_at included so the counts can be index-only).
CREATE INDEX todos_pending_by_queue ON todos (queue, created_at) INCLUDE (next_retry_at)
    WHERE state = 'pending';
-- The claim scan over several queues walks pending work in created_at order across all
-- queues; queue is in the index so other queues' rows are skipped without a heap visit.
CREATE INDEX todos_pending_by_age ON todos (created_at, queue) WHERE state = 'pending';
-- Enqueue dedupe: one live todo per (queue, idempotency_key).
CREATE UNIQUE INDEX todos_dedupe ON todos (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND state NOT IN ('done', 'failed');
-- Leases: the reaper, the leases page and the claimed/lapsed counts per queue.
CREATE INDEX todos_leases ON todos (lease_expires_at) INCLUDE (queue) WHERE state = 'claimed';
-- Retry promotion and the "retrying" counts.
CREATE INDEX todos_retrying ON todos (next_retry_at) WHERE state = 'pending' AND next_retry_at IS NOT NULL;
-- Dead-letters page (newest death first, keyset) and the dead counts per queue.
CREATE INDEX todos_dead ON todos (completed_at, id) INCLUDE (queue) WHERE state = 'failed';
-- Throughput, "done (recent)" and pruning of finished todos.
CREATE INDEX todos_finished ON todos (completed_at) INCLUDE (queue, state)
    WHERE state IN ('done', 'failed');
-- The queue page and the API list: newest first, keyset-paginated, any state.
CREATE INDEX todos_by_queue ON todos (queue, created_at, id);
CREATE INDEX todos_event ON todos (event_id) WHERE event_id IS NOT NULL;

CREATE TABLE todo_history (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    todo_id    text NOT NULL REFERENCES todos (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state todo_state,
    to_state   todo_state NOT NULL,
    actor      text NOT NULL,
    attempt    integer NOT NULL,
    note       text
);
CREATE INDEX todo_history_todo ON todo_history (todo_id, id);

-- Retry delay after the n-th failed attempt: 2^n seconds, at most an hour.
CREATE FUNCTION todo_backoff(attempt integer) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN least(power(2, attempt), 3600) * interval '1 second';

-- Hints on channel 'switchboard': '{"queue": …, "state": …}'. Identical hints within
-- one transaction are coalesced by PostgreSQL. Only changes that make work claimable
-- or dead are hinted; claims and completions (the hot path) are not, the dashboard
-- polls for those.
CREATE FUNCTION todos_notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('switchboard', json_build_object('queue', q, 'state', 'pending')::text)
    FROM (SELECT DISTINCT queue AS q FROM inserted) AS queues;
    RETURN NULL;
END $$;

CREATE FUNCTION todos_notify_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('switchboard',
                      json_build_object('queue', NEW.queue, 'state', NEW.state)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER todos_notify_insert AFTER INSERT ON todos
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION todos_notify_inserted();

CREATE TRIGGER todos_notify_update AFTER UPDATE ON todos
    FOR EACH ROW
    WHEN ((OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN ('pending', 'failed'))
          OR (NEW.state = 'pending' AND OLD.next_retry_at IS NOT NULL AND NEW.next_retry_at IS NULL))
    EXECUTE FUNCTION todos_notify_changed();
