"""The history's daily partitions (migration 0015): made a week ahead, and dropped a day at a
time once the day is older than SWITCHBOARD_RETENTION_DAYS — no row-by-row pruning of the
table that grows fastest. Run by the reaper's retention job (dashboard/retention.py).

Safe with any number of reapers at once: todo_history_maintain takes an advisory lock,
and the others skip their turn.
"""

from __future__ import annotations

import logging

import asyncpg

from dashboard.db import transaction
from dashboard.queries import Queries

SQL = Queries("history.sql")
log = logging.getLogger("switchboard.reaper")

AHEAD_DAYS = 7  # partitions made ahead: a reaper may stop this long before a row waits in the default
# Each DDL step's longest wait for its lock: creating or dropping a partition locks the
# whole history, and every transition would queue behind a step waiting on a long
# transaction. A turn lost to one is taken again at the next.
LOCK_WAIT = "200ms"


async def maintain(db: asyncpg.Pool | asyncpg.Connection, keep_seconds: float) -> list[tuple[str, str]]:
    """Make the partitions ahead and drop those past `keep_seconds`; returns (partition,
    'created' or 'dropped') for each, nothing when a lock could not be had in time."""
    try:
        async with transaction(db) as conn:
            await SQL.lock_timeout.fetch(conn, timeout=LOCK_WAIT)
            done = [
                (r["partition"], r["action"])
                for r in await SQL.maintain.fetch(conn, ahead=AHEAD_DAYS, keep=keep_seconds)
            ]
    except asyncpg.LockNotAvailableError:
        log.info("history partitions: a long transaction holds the history; trying again next turn")
        return []
    for partition, action in done:
        log.info("history partition %s %s", partition, action)
    return done
