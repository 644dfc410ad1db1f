-- 0006: hints leave the producer's transaction. A transaction that has queued a NOTIFY
-- takes a database-wide lock at commit and holds it through its WAL flush, so the
-- triggers that called pg_notify serialised every enqueue's (and every release's,
-- fail's, reap's) commit: at 4 producers, 60% of single-todo enqueues were lost to it.
-- Hints are now sent after the commit by the process that made the change, coalesced
-- per queue, on a connection of its own (dashboard/notify.py, DESIGN "Notifications").
-- A write made by plain SQL sends none: claims, workers and pages find it by polling.
DROP TRIGGER todos_notify_insert ON todos;
DROP TRIGGER todos_notify_update ON todos;
DROP FUNCTION todos_notify_inserted();
DROP FUNCTION todos_notify_changed();
