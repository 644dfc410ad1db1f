-- 0008: queue control (issue 12, DESIGN.md "Queue control"): priorities, paused queues,
-- cancellation, an assignee's deadline, and what an edit changed.
--
-- Scheduled todos need no column: a pending todo is claimable once its ready_at has come
-- (0007), so `run_at` on create (or an edit) is its ready_at. "Scheduled for T" is a
-- pending todo with no retry time whose ready_at is still ahead, derived like "retrying
-- at T". "Run now" sets ready_at to now (and clears a retry time).
--
-- Every column comes with a constant default or none, so adding it rewrites nothing.

-- Claims take the highest priority first, the longest ready first within it.
ALTER TABLE todos ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CONSTRAINT priority_range CHECK (priority BETWEEN -10 AND 10);
-- After this time an assigned todo may be claimed by any agent of its queue.
ALTER TABLE todos ADD COLUMN assignee_until timestamptz;
-- A cancelled todo is dead-lettered (failed) with who cancelled it, when and why; an
-- operator's retry clears these (the history keeps them).
ALTER TABLE todos ADD COLUMN cancelled_at timestamptz;
ALTER TABLE todos ADD COLUMN cancelled_by_kind text;
ALTER TABLE todos ADD COLUMN cancelled_by text;
ALTER TABLE todos ADD COLUMN cancel_reason text;
ALTER TABLE todos ADD CONSTRAINT cancelled_is_failed CHECK (
    cancelled_at IS NULL OR (state = 'failed' AND cancelled_by IS NOT NULL AND cancelled_by_kind IS NOT NULL));

-- What an edit changed, field by field ({"title": ["old", "new"], "payload": {…}}): the
-- note says it in words, this for the API.
ALTER TABLE todo_history ADD COLUMN changes jsonb;

-- The claim scan, in claim order: highest priority first (so the key is -priority,
-- ascending), then ready_at; queue is in the index so other queues' entries can be
-- skipped in the index. Replaces 0007's (ready_at, queue).
DROP INDEX todos_ready;
CREATE INDEX todos_ready ON todos ((-priority), ready_at, queue) WHERE state = 'pending';
-- todos_ready_by_queue (0007) stays as it is, on (queue, ready_at) without the priority:
-- the overview's ready / scheduled / retrying counts per queue read it index-only. With
-- -priority in it, claims' generic plans took it over todos_ready once priorities were
-- mixed (an equality on its second column looked selective): every claim read a whole
-- priority level of the claimed queues and sorted it (bench/queue_control.py: 24 todos/s).

-- A paused queue: claims skip it; enqueue, heartbeats and acks go on. Resuming deletes
-- the row. queue_history keeps every pause and resume.
CREATE TABLE queue_pauses (
    queue      text PRIMARY KEY CHECK (queue ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    paused_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor_kind text NOT NULL CHECK (actor_kind IN ('agent', 'operator', 'producer', 'system')),
    actor      text NOT NULL,
    reason     text
);
CREATE TABLE queue_history (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue      text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    action     text NOT NULL CHECK (action IN ('paused', 'resumed')),
    actor_kind text NOT NULL CHECK (actor_kind IN ('agent', 'operator', 'producer', 'system')),
    actor      text NOT NULL,
    reason     text
);
CREATE INDEX queue_history_queue ON queue_history (queue, id);
