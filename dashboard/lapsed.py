"""The reaper's first job: leases that lapsed go back to their queue (or to the dead
letters, out of attempts), and retries that came due are promoted so their queues are
hinted (claims would take them anyway).

Safe with any number of reapers at once (in every web process and in `switchboard reap`):
each statement locks its rows with SKIP LOCKED and re-checks its guard
(dashboard/sql/queries/transitions.sql, `reap` and `promote_due_retries`).
"""

from __future__ import annotations

import logging

from dashboard.store import Store

log = logging.getLogger("switchboard.reaper")

BATCH = 500  # rows a statement


async def reap_once(store: Store) -> tuple[int, int]:
    """One pass: (leases re-surfaced or dead-lettered, retries promoted)."""
    reaped = promoted = 0
    while True:
        batch = len(await store.reap(BATCH))
        reaped += batch
        if batch < BATCH:
            break
    while True:
        batch = await store.promote_due_retries(BATCH)
        promoted += batch
        if batch < BATCH:
            break
    if reaped or promoted:
        log.info("reaped %d lapsed leases, promoted %d due retries", reaped, promoted)
    return reaped, promoted
