-- 0003: retry delays with full jitter. A failed attempt below the cap retries after a
-- random delay in [0, min(2^attempt, 3600)] seconds instead of exactly 2^attempt, so a
-- burst of failures (a downstream outage) does not come back as a burst. VOLATILE now:
-- each call draws its own delay.
CREATE OR REPLACE FUNCTION todo_backoff(attempt integer) RETURNS interval
    LANGUAGE sql VOLATILE PARALLEL SAFE
    RETURN random() * least(power(2, attempt), 3600) * interval '1 second';
