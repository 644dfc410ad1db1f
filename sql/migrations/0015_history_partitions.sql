-- 0015: history partitioned by day, dropped a day at a time (issue 27; docs/concepts.md "History
-- retention").
--
-- todo_history grows by two rows or more per todo, and it was pruned row by row, with its
-- todo (ON DELETE CASCADE): at 1,000 todos/s that is 170 million deletes a day, each
-- leaving dead rows and index entries for vacuum. Now the table is range-partitioned on
-- `at`, one partition per UTC day, and retention drops the partitions whose day ended
-- more than SWITCHBOARD_RETENTION_DAYS ago: a history row lives as long as a finished
-- todo does, counted from when it was written. (A todo that stays live longer than that
-- keeps its steps of the retention period only.)
--
-- Partitions are named todo_history_pYYYYMMDD for the last UTC day they hold: each holds
-- [that day, the next), except the first, which also holds everything older (MINVALUE).
-- todo_history_maintain (below) creates them ahead; the reaper calls it every minute
-- (dashboard/history_partitions.py). A row for a day without its partition — the
-- reaper stopped for longer than the days made ahead — goes to todo_history_default
-- and is moved into its day's partition when that partition is made: no write fails.
--
-- The foreign key to todos goes: it cost every transition a lookup of the todo it had
-- just written, and it would tie dropping a day to deleting todos. History outlives its
-- pruned todo by at most a day; nothing reads history without its todo.
-- The primary key is (id, at), since a partitioned table's unique keys must hold the
-- partition key; ids stay unique, drawn from the same sequence (rollups read by id).
--
-- The rows move once, in this migration's transaction: a copy into the new table, whose
-- first partition holds all of them written before today. (On a large history, prune it
-- first: the copy takes about as long as writing it did.)

ALTER TABLE todo_history RENAME TO todo_history_0014;
ALTER INDEX todo_history_pkey RENAME TO todo_history_0014_pkey;
ALTER INDEX todo_history_todo RENAME TO todo_history_0014_todo;
ALTER SEQUENCE todo_history_id_seq RENAME TO todo_history_0014_id_seq;

CREATE TABLE todo_history (
    id         bigint GENERATED ALWAYS AS IDENTITY,
    todo_id    text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state todo_state,
    to_state   todo_state NOT NULL,
    actor      text NOT NULL,
    attempt    integer NOT NULL,
    note       text,
    actor_kind text NOT NULL
        CONSTRAINT actor_kind_known CHECK (actor_kind IN ('agent', 'operator', 'producer', 'system')),
    changes    jsonb,
    event      text,
    queue      text,
    elapsed    real,
    CONSTRAINT todo_history_pkey PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
CREATE INDEX todo_history_todo ON todo_history (todo_id, id);
CREATE TABLE todo_history_default PARTITION OF todo_history DEFAULT;

-- The days from the last partition's through :ahead days after today (UTC) get their
-- partitions (rows waiting for them in the default partition move in); partitions whose
-- day ended before :keep_after are dropped. Returns the partitions made and dropped.
-- Every DDL step waits at most lock_timeout for its lock (the caller sets it): a
-- partition is made days before it is needed, so a turn lost to a long transaction on
-- history costs nothing, where waiting would queue every transition behind that
-- transaction. One caller at a time (an advisory lock; the others return nothing).
CREATE FUNCTION todo_history_maintain(ahead integer, keep_after timestamptz)
    RETURNS TABLE (partition text, action text)
    LANGUAGE plpgsql AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    last_day date;
    day date;
    from_bound text;
    name text;
BEGIN
    IF NOT pg_try_advisory_xact_lock(8031972602) THEN
        RETURN;
    END IF;
    SELECT max(to_date(substr(c.relname, 15), 'YYYYMMDD')) INTO last_day
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'todo_history'::regclass AND c.relname ~ '^todo_history_p[0-9]{8}$';
    day := coalesce(last_day + 1, today - 1);
    WHILE day <= today + ahead LOOP
        name := 'todo_history_p' || to_char(day, 'YYYYMMDD');
        -- The first partition takes everything older.
        from_bound := CASE WHEN last_day IS NULL THEN 'MINVALUE'
                           ELSE quote_literal(day::text || ' 00:00:00+00') END;
        EXECUTE format('CREATE TABLE %I (LIKE todo_history INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format(
            'WITH moved AS (DELETE FROM todo_history_default WHERE at < %L RETURNING *) '
            'INSERT INTO %I SELECT * FROM moved', (day + 1)::text || ' 00:00:00+00', name);
        EXECUTE format('ALTER TABLE todo_history ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%L)',
                       name, from_bound, (day + 1)::text || ' 00:00:00+00');
        partition := name;
        action := 'created';
        RETURN NEXT;
        last_day := day;
        day := day + 1;
    END LOOP;
    FOR name IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'todo_history'::regclass AND c.relname ~ '^todo_history_p[0-9]{8}$'
          AND (to_date(substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= keep_after
        ORDER BY c.relname
    LOOP
        EXECUTE format('DROP TABLE %I', name);
        partition := name;
        action := 'dropped';
        RETURN NEXT;
    END LOOP;
END
$$;

-- Yesterday's partition (holding everything before today), today's and a week ahead.
SELECT count(*) FROM todo_history_maintain(7, '-infinity');

INSERT INTO todo_history OVERRIDING SYSTEM VALUE SELECT * FROM todo_history_0014;
SELECT setval(pg_get_serial_sequence('todo_history', 'id'),
              coalesce(pg_sequence_last_value('todo_history_0014_id_seq'), 1),
              pg_sequence_last_value('todo_history_0014_id_seq') IS NOT NULL);
DROP TABLE todo_history_0014;
