"""The reaper's pruning job: done and dead todos older than SWITCHBOARD_RETENTION_DAYS go,
history goes a day at a time once its day is that old (dashboard/history_partitions.py,
which also makes the days ahead), and rollup rows past their own ages (dashboard/rollups.py).

Safe with any number of reapers at once: prune_finished deletes rows it locked with SKIP
LOCKED; the partitions and the rollups are kept under advisory locks, by one process at a
time.
"""

from __future__ import annotations

import logging

from dashboard import history_partitions
from dashboard.config import Settings
from dashboard.lapsed import BATCH
from dashboard.rollups import Rollups
from dashboard.store import Store

log = logging.getLogger("switchboard.reaper")


async def prune(store: Store, rollups: Rollups, settings: Settings) -> None:
    pruned = await store.prune(settings.retention_days * 86400, batch=BATCH)
    if pruned:
        log.info("pruned %d finished todos", pruned)
    await history_partitions.maintain(store.db, settings.retention_days * 86400)
    await rollups.prune(settings.rollup_minute_hours * 3600, settings.rollup_hour_days * 86400)
