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
from dashboard.horizon import HorizonWatch
from dashboard.rollups import Rollups, next_sample_in
from dashboard.store import Store

log = logging.getLogger("switchboard.reaper")

BATCH = 500
DEFAULT_INTERVAL = 1.0
DEFAULT_RETENTION_DAYS = 7.0
PRUNE_EVERY = 60.0  # seconds between prune passes
HORIZON_EVERY = 10.0  # seconds between looks at what holds back vacuum
ROLLUP_EVERY = 5.0  # seconds between rollup passes (charts are this far behind)
SAMPLE_EVERY = 10.0  # seconds between samples of the backlog (longer when it is large)


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


class HorizonLog:
    """Logs when vacuum starts being held back past the threshold, again every
    REPEAT_EVERY while it lasts, and when it ends (README "When vacuum is held back")."""

    REPEAT_EVERY = 300.0

    def __init__(self, watch: HorizonWatch):
        self.watch = watch
        self._warned_at: float | None = None

    async def check(self, now: float) -> None:
        horizon = await self.watch.get()
        if horizon.held_back:
            if self._warned_at is None or now - self._warned_at >= self.REPEAT_EVERY:
                dead = ", ".join(f"{n:,} in {t}" for t, n in horizon.dead_tuples.items()) or "unknown"
                log.warning(
                    "vacuum is held back for %.0f s by %s; dead row versions: %s",
                    horizon.oldest.age,
                    horizon.oldest.describe(),
                    dead,
                )
                self._warned_at = now
        elif self._warned_at is not None:
            log.warning("vacuum is no longer held back")
            self._warned_at = None


async def run_reaper(
    store: Store,
    *,
    interval: float = DEFAULT_INTERVAL,
    stop: asyncio.Event | None = None,
    horizon: HorizonWatch | None = None,
) -> None:
    """Reap every `interval` seconds until `stop` is set; errors are logged, not fatal.
    Roll up history and sample the backlog (dashboard/rollups.py) every ROLLUP_EVERY and
    SAMPLE_EVERY. With `horizon`, also log what holds back vacuum (HorizonLog) every
    HORIZON_EVERY."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    next_prune = next_horizon = next_rollup = next_sample = loop.time()
    watch = HorizonLog(horizon) if horizon is not None else None
    rollups = Rollups(store.db)
    while not stop.is_set():
        try:
            await reap_once(store)
            if loop.time() >= next_rollup:
                await rollups.roll()
                next_rollup = loop.time() + ROLLUP_EVERY
            if loop.time() >= next_sample:
                next_sample = loop.time() + next_sample_in(await rollups.sample(), SAMPLE_EVERY)
            if loop.time() >= next_prune:
                pruned = await store.prune(retention_seconds(), batch=BATCH)
                if pruned:
                    log.info("pruned %d finished todos", pruned)
                await rollups.prune()
                next_prune = loop.time() + PRUNE_EVERY
            if watch is not None and loop.time() >= next_horizon:
                await watch.check(loop.time())
                next_horizon = loop.time() + HORIZON_EVERY
        except DatabaseUnavailable as exc:  # briefly gone, read-only: try again next tick
            log.warning("reaper pass skipped: %s", exc)
        except Exception:
            log.exception("reaper pass failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
