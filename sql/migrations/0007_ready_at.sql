-- 0007: claims start where the claimer's last claim ended (issue 11, DESIGN "Claim order").
--
-- A claim used to walk the pending index from its oldest entry. Every todo claimed since
-- the last vacuum leaves a dead entry there, and while any transaction in the database
-- holds back the vacuum horizon those entries cannot even be marked dead, so each claim
-- visited the heap for all of them: throughput fell by a third within 80 s of draining,
-- and to a fifteenth under one 3-minute transaction elsewhere.
--
-- `ready_at` is the time a pending todo became (or, retrying, becomes) claimable: its
-- creation, release, reap, retry or the end of its backoff. The claim order is now by
-- ready_at, and since every transition back to pending sets it to that moment, a todo
-- that becomes claimable enters the index ahead of everything claimed before; the store
-- can therefore start each claim at the ready_at its previous claim ended on (and scan
-- from the oldest now and then for todos committed late or skipped while locked). A
-- retrying todo keeps ready_at = next_retry_at; claims read only ready_at.
--
-- The column has no NOT NULL and no rewrite: todos finished before this migration keep
-- NULL (ready_at means nothing for them); pending ones get their old claim position.
ALTER TABLE todos ADD COLUMN ready_at timestamptz;
UPDATE todos SET ready_at = coalesce(next_retry_at, created_at) WHERE state = 'pending';
ALTER TABLE todos ALTER COLUMN ready_at SET DEFAULT clock_timestamp();
ALTER TABLE todos ADD CONSTRAINT pending_has_ready_at CHECK (state <> 'pending' OR ready_at IS NOT NULL);
ALTER TABLE todos ADD CONSTRAINT retry_is_ready_at CHECK (next_retry_at IS NULL OR next_retry_at = ready_at);

-- The claim scan over any queues, in claim order (replaces todos_pending_by_age);
-- queue is in the index so other queues' entries are skipped without a heap visit.
CREATE INDEX todos_ready ON todos (ready_at, queue) WHERE state = 'pending';
-- The claim scan for one rare queue, and the overview's ready/retrying counts and
-- oldest ready age per queue, index-only (replaces todos_pending_by_queue).
CREATE INDEX todos_ready_by_queue ON todos (queue, ready_at) INCLUDE (next_retry_at, created_at)
    WHERE state = 'pending';
DROP INDEX todos_pending_by_age;
DROP INDEX todos_pending_by_queue;

-- The leases index holds the same rows as before (a lease exists exactly while claimed:
-- lease_only_when_claimed) but says so by lease_expires_at, so that the statements on one
-- held todo, whose guards say state = 'claimed', can only plan on the primary key. With
-- state = 'claimed' here, their generic plans took this index whenever few todos were
-- claimed (a tie in cost at planning time), and walked every dead entry in it while
-- vacuum was held back: complete_and_claim_next spent 1.8 ms of its 2 ms there.
DROP INDEX todos_leases;
CREATE INDEX todos_leases ON todos (lease_expires_at) INCLUDE (queue) WHERE lease_expires_at IS NOT NULL;
