-- 0016: a heartbeat writes no history row (issue 27; DESIGN.md "History": a transition writes
-- no more history than the row cannot hold). The row holds the last heartbeat (heartbeat_at),
-- and the lease's run ends in a row of its own (completed, failed, released, reaped) that
-- says how long it ran; a heartbeat's row was, for a long task, most of its history.
--
-- The agents page's "last heartbeat" is now that of the leases an agent holds (todos), so
-- the rollups no longer keep one per agent and minute. History rows are now written at the
-- version their move made (the todo's updated_at: sql/queries/fragments.sql,
-- history_insert); rows written before keep the time they were inserted, a moment later.
ALTER TABLE agent_rollups DROP COLUMN last_heartbeat_at;
