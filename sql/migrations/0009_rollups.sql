-- 0009: what the charts, the overview's counts and the agents page read (issue 13).
--
-- History rows now say which step they record (`event`), in which queue, and how long the
-- step before took (`elapsed`), so that the rollup job can count a minute of them with
-- one range scan and no join. Rows written before this migration keep nulls there and
-- are never rolled up: rollups start when this migration ran.
--   event    created, deduplicated, claimed, heartbeat, completed, failed, released,
--            reaped, retry_due, retried, force_released, cancelled, run_now, edited
--   elapsed  claimed: seconds it had been ready (time in queue);
--            completed, failed, released, reaped, force_released, cancelled (when it
--            was claimed): seconds since it was claimed (run time)
ALTER TABLE todo_history ADD COLUMN event text;
ALTER TABLE todo_history ADD COLUMN queue text;
ALTER TABLE todo_history ADD COLUMN elapsed real;
-- The rollup job reads history by id ranges (the primary key): no index is added to the
-- claim and complete path.

-- Per queue and minute ('minute', kept SWITCHBOARD_ROLLUP_MINUTE_HOURS) or hour
-- ('hour', kept SWITCHBOARD_ROLLUP_HOUR_DAYS): how many todos took each step, and the
-- distributions of time in queue (waited) and run time (ran) as counts per bucket of
-- dashboard/rollups.py's BOUNDS. ready, retrying, scheduled, held (leases) and
-- dead_letters are the backlog as last sampled in that period (null: not sampled, e.g.
-- the app was down).
-- Queue '*' (not a queue name todos allow) holds the sums over all queues.
CREATE TABLE queue_rollups (
    grain        text NOT NULL CHECK (grain IN ('minute', 'hour')),
    queue        text NOT NULL,
    at           timestamptz NOT NULL,
    created      integer NOT NULL DEFAULT 0,
    deduplicated integer NOT NULL DEFAULT 0,
    claimed      integer NOT NULL DEFAULT 0,
    completed    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    dead         integer NOT NULL DEFAULT 0,
    reaped       integer NOT NULL DEFAULT 0,
    released     integer NOT NULL DEFAULT 0,
    cancelled    integer NOT NULL DEFAULT 0,
    waited       integer[] NOT NULL DEFAULT '{}',
    ran          integer[] NOT NULL DEFAULT '{}',
    waited_sum   float8 NOT NULL DEFAULT 0,
    ran_sum      float8 NOT NULL DEFAULT 0,
    ready        integer,
    retrying     integer,
    scheduled    integer,
    held         integer,
    dead_letters integer,
    PRIMARY KEY (grain, queue, at)
);
CREATE INDEX queue_rollups_at ON queue_rollups (grain, at);

-- Per agent and minute: its steps, and when it last claimed, beat and acked (completed,
-- failed or released) within that minute. stale_acks counts its acks refused by fencing.
CREATE TABLE agent_rollups (
    agent        text NOT NULL,
    at           timestamptz NOT NULL,
    claimed      integer NOT NULL DEFAULT 0,
    completed    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    released     integer NOT NULL DEFAULT 0,
    stale_acks   integer NOT NULL DEFAULT 0,
    last_claim_at     timestamptz,
    last_heartbeat_at timestamptz,
    last_ack_at       timestamptz,
    PRIMARY KEY (agent, at)
);
CREATE INDEX agent_rollups_at ON agent_rollups (at);

-- An agent's ack (complete, fail, release, heartbeat) refused because its lease was
-- superseded by a later claim: written on that (rare) refusal, not on the hot path.
CREATE TABLE stale_acks (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    agent   text NOT NULL,
    todo_id text NOT NULL,
    queue   text NOT NULL,
    action  text NOT NULL,
    lease   bigint NOT NULL
);
CREATE INDEX stale_acks_at ON stale_acks (at);

-- Where the rollup job has got to: every history row with an id up to rolled_id is
-- rolled up (or was never committed), and rolled_until is when the mark it reached was
-- taken (history written before it is rolled up). Rollups begin when this ran.
CREATE TABLE rollup_progress (
    only_row      boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    rolled_id     bigint NOT NULL,
    rolled_until  timestamptz NOT NULL
);
INSERT INTO rollup_progress (rolled_id, rolled_until)
SELECT coalesce(max(id), 0), now() FROM todo_history;
-- Marks: the newest history id handed out (the sequence's last value), and a time just
-- after it was read. Every id up to a mark belongs to a transaction that began before the
-- mark's time; once no transaction that began before it is still writing, they are all
-- committed or gone, and the job may roll up to that id (dashboard/rollups.py).
CREATE TABLE rollup_marks (
    at       timestamptz PRIMARY KEY,
    last_id  bigint NOT NULL
);

-- Dead-letters per queue, counted up to a bound without reading other queues' (the
-- overview's counts); todos_dead stays for the newest-first page across queues.
CREATE INDEX todos_dead_by_queue ON todos (queue, completed_at) WHERE state = 'failed';

-- The element-wise sum of histograms (integer arrays, shorter ones padded with zeros):
-- hour rows from minute rows, a chart's points from several rows.
CREATE FUNCTION array_add(a integer[], b integer[]) RETURNS integer[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ARRAY(SELECT coalesce(x, 0) + coalesce(y, 0)
                 FROM unnest(a, b) WITH ORDINALITY AS u(x, y, i) ORDER BY i);
CREATE AGGREGATE sum_elements(integer[]) (SFUNC = array_add, STYPE = integer[], INITCOND = '{}');
