-- 0017: the row's invariants in one CHECK (issue 27). PostgreSQL reads every CHECK
-- constraint's expression tree from the catalog and plans it again for each statement that
-- writes the table (the executor keeps them for one statement only): with ten of them,
-- that was 12% of the server's CPU in a claim + complete (perf, PostgreSQL 15), more than
-- every index insert together. One constraint calling a plpgsql function is one small
-- expression to read; the function is compiled once per session. It holds exactly what the
-- ten constraints held (0001, 0007, 0008); a violation now names `todo_row_consistent`.
CREATE FUNCTION todo_row_consistent(
    queue text, state todo_state, attempt integer, max_attempts integer, priority smallint,
    owner text, lease_expires_at timestamptz, completed_at timestamptz,
    next_retry_at timestamptz, ready_at timestamptz,
    cancelled_at timestamptz, cancelled_by text, cancelled_by_kind text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN queue ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'
        AND attempt >= 0 AND max_attempts >= 1
        AND priority BETWEEN -10 AND 10
        -- a lease exists exactly while claimed; done and failed keep the last owner
        AND (state = 'claimed') = (lease_expires_at IS NOT NULL)
        AND (state <> 'claimed' OR owner IS NOT NULL)
        AND (state IN ('done', 'failed')) = (completed_at IS NOT NULL)
        AND (state <> 'pending' OR ready_at IS NOT NULL)
        -- a retry time is the todo's ready_at, and only while it waits
        AND (next_retry_at IS NULL OR (state = 'pending' AND next_retry_at = ready_at))
        AND (cancelled_at IS NULL
             OR (state = 'failed' AND cancelled_by IS NOT NULL AND cancelled_by_kind IS NOT NULL));
END
$$;

ALTER TABLE todos
    DROP CONSTRAINT todos_queue_check,
    DROP CONSTRAINT attempt_range,
    DROP CONSTRAINT priority_range,
    DROP CONSTRAINT lease_only_when_claimed,
    DROP CONSTRAINT claimed_has_owner,
    DROP CONSTRAINT finished_has_completed_at,
    DROP CONSTRAINT pending_has_ready_at,
    DROP CONSTRAINT retry_only_when_pending,
    DROP CONSTRAINT retry_is_ready_at,
    DROP CONSTRAINT cancelled_is_failed,
    ADD CONSTRAINT todo_row_consistent CHECK (todo_row_consistent(
        queue, state, attempt, max_attempts, priority, owner, lease_expires_at, completed_at,
        next_retry_at, ready_at, cancelled_at, cancelled_by, cancelled_by_kind));
