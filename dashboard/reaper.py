"""The reaper: the maintenance jobs, each run on its own timer in one loop, in every web
process and in `switchboard reap`.

A job is safe with any number of reapers at once, for the reason its `lock` gives. A job
that fails is logged and runs again at its next turn; the others go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dashboard import retention
from dashboard.config import Settings
from dashboard.errors import DatabaseUnavailable
from dashboard.horizon import HorizonLog, HorizonWatch
from dashboard.lapsed import reap_once
from dashboard.rollups import Rollups, next_sample_in
from dashboard.store import Store

log = logging.getLogger("switchboard.reaper")

DEFAULT_INTERVAL = 1.0  # seconds between passes over lapsed leases and due retries
PRUNE_EVERY = 60.0  # seconds between prune passes
HORIZON_EVERY = 10.0  # seconds between looks at what holds back vacuum
ROLLUP_EVERY = 5.0  # seconds between rollup passes (charts are this far behind)
SAMPLE_EVERY = 10.0  # seconds between samples of the backlog (longer when it is large)


@dataclass(frozen=True)
class Job:
    name: str
    every: float  # seconds from one run's end to the next one's start
    run: Callable[[], Awaitable[object]]
    lock: str  # why many reapers may run it at once
    spacing: Callable[[float], float] | None = None  # seconds it took → to the next run, if not `every`


def jobs(store: Store, settings: Settings, interval: float, horizon: HorizonWatch | None) -> list[Job]:
    """The table of jobs (horizon: log what holds back vacuum, dashboard/horizon.py)."""
    rollups = Rollups(store.db)
    table = [
        Job(
            "lapsed",
            interval,
            lambda: reap_once(store),
            "SKIP LOCKED, guards re-checked (dashboard/lapsed.py)",
        ),
        Job("rollups", ROLLUP_EVERY, rollups.roll, "the rollups' advisory lock: one process at a time"),
        Job(
            "samples",
            SAMPLE_EVERY,
            rollups.sample,
            "the rollups' advisory lock: one process at a time",
            spacing=lambda took: next_sample_in(took, SAMPLE_EVERY),
        ),
        Job(
            "retention",
            PRUNE_EVERY,
            lambda: retention.prune(store, rollups, settings),
            "SKIP LOCKED; the rollups' advisory lock (dashboard/retention.py)",
        ),
    ]
    if horizon is not None:
        watch = HorizonLog(horizon)
        loop = asyncio.get_running_loop()
        table.append(
            Job("horizon", HORIZON_EVERY, lambda: watch.check(loop.time()), "none needed: it only reads")
        )
    return table


async def run_reaper(
    store: Store,
    settings: Settings,
    *,
    interval: float = DEFAULT_INTERVAL,
    stop: asyncio.Event | None = None,
    horizon: HorizonWatch | None = None,
) -> None:
    """Run each job when its turn comes until `stop` is set; waking every `interval`
    seconds (the lapsed job's) to see whose turn it is."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    table = jobs(store, settings, interval, horizon)
    due = dict.fromkeys((job.name for job in table), loop.time())
    while not stop.is_set():
        for job in table:
            if loop.time() < due[job.name]:
                continue
            started = loop.time()
            try:
                await job.run()
            except DatabaseUnavailable as exc:  # briefly gone, read-only: try again next turn
                log.warning("reaper job %s skipped: %s", job.name, exc)
            except Exception:
                log.exception("reaper job %s failed", job.name)
            took = loop.time() - started
            due[job.name] = loop.time() + (job.spacing(took) if job.spacing else job.every)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
