"""The reaper: re-surfaces lapsed leases, promotes due retries, prunes old finished todos.

Safe with any number of reapers at once (in every web process and in `switchboard
reap`): each statement locks its rows with SKIP LOCKED and re-checks its guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from dashboard.errors import DatabaseUnavailable
from dashboard.store import Store

log = logging.getLogger("switchboard.reaper")

BATCH = 500
DEFAULT_INTERVAL = 1.0
DEFAULT_RETENTION_DAYS = 7.0
PRUNE_EVERY = 60.0  # seconds between prune passes


def retention_seconds() -> float:
    """SWITCHBOARD_RETENTION_DAYS: finished todos older than this are pruned."""
    return float(os.environ.get("SWITCHBOARD_RETENTION_DAYS", DEFAULT_RETENTION_DAYS)) * 86400


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


async def run_reaper(
    store: Store, *, interval: float = DEFAULT_INTERVAL, stop: asyncio.Event | None = None
) -> None:
    """Reap every `interval` seconds until `stop` is set; errors are logged, not fatal."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    next_prune = loop.time()
    while not stop.is_set():
        try:
            await reap_once(store)
            if loop.time() >= next_prune:
                pruned = await store.prune(retention_seconds(), batch=BATCH)
                if pruned:
                    log.info("pruned %d finished todos", pruned)
                next_prune = loop.time() + PRUNE_EVERY
        except DatabaseUnavailable as exc:  # briefly gone, read-only: try again next tick
            log.warning("reaper pass skipped: %s", exc)
        except Exception:
            log.exception("reaper pass failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
