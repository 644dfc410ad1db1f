-- 0012: a person's inbox (issue 14, DESIGN.md "Inbox"). Every dashboard page's menu counts
-- the todos waiting for the operator who is logged in (pending, assigned to them, ready),
-- and their Inbox page lists them by priority, then longest ready, as claims take them
-- (sql/queries/inbox.sql). Without this index both walk every pending todo (todos_ready)
-- and look each up in the table for its assignee.
--
-- Only assigned pending todos are in it, so the hot path does not pay for it: an
-- unassigned todo never has an entry, and a claim or completion writes no entry (the row
-- it writes is not pending). An assigned todo gets one when it is created, released,
-- retried or failed back to pending. Measured (2 shared cores, load 3.5-5.7): claim +
-- complete of unassigned todos (bench/history_cost.py --only todos_inbox) wrote the same
-- WAL per todo with and without it, throughput within the noise (without it 0.94x as
-- fast, runs 0.81-1.08x); an assigned todo's create + claim + complete wrote 2% more WAL,
-- its time within 1%.
--
-- A plain CREATE INDEX, since migrations run in a transaction: on a big table, build it
-- beforehand with CREATE INDEX CONCURRENTLY IF NOT EXISTS and this name and definition.
CREATE INDEX IF NOT EXISTS todos_inbox ON todos (assignee, (-priority), ready_at)
    WHERE state = 'pending' AND assignee IS NOT NULL;
