"""The rollup job: per queue and minute, what happened (from todo_history), and the backlog.

Charts, the overview's "done in the last hour" and the agents page read these rows
instead of counting history or todos, so their cost follows the time range asked for,
not the traffic. The job runs in the reaper's loop of every process; an advisory lock
lets one of them at a time do it, and the others skip their turn. Nothing on the claim
or complete path writes here: history rows carry their step, queue and elapsed time
(migration 0009), and the job counts whole minutes of them after the fact. A minute is
rolled once it has ended (and the transactions writing in it have committed); a gap,
when no process ran, is rolled from history when one comes back, an hour per statement.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

import asyncpg

from dashboard.db import transaction
from dashboard.queries import Queries

SQL = Queries("rollups.sql")
log = logging.getLogger("switchboard.rollups")

# Upper bounds (seconds) of the histogram buckets for time in queue and run time; a
# histogram has one count per bucket plus one for everything at or above the last bound.
BOUNDS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
)  # fmt: skip
GRACE_SECONDS = 5.0  # a minute is rolled this long after it ends, at the earliest
MAX_WAIT_SECONDS = 600.0  # a transaction writing longer than this does not hold rollups back
CHUNK = timedelta(hours=1)  # a gap is rolled an hour per transaction
SAMPLE_KEEP_SECONDS = 600.0  # queues sampled this recently get a zero when they empty
DEFAULT_MINUTE_HOURS = 48.0
DEFAULT_HOUR_DAYS = 90.0


def minute_retention_seconds() -> float:
    """SWITCHBOARD_ROLLUP_MINUTE_HOURS: minute rows are kept this long (charts up to 24 h)."""
    return float(os.environ.get("SWITCHBOARD_ROLLUP_MINUTE_HOURS", DEFAULT_MINUTE_HOURS)) * 3600


def hour_retention_seconds() -> float:
    """SWITCHBOARD_ROLLUP_HOUR_DAYS: hour rows are kept this long (the 7-day chart)."""
    return float(os.environ.get("SWITCHBOARD_ROLLUP_HOUR_DAYS", DEFAULT_HOUR_DAYS)) * 86400


def percentile(histogram: list[int], q: float) -> float | None:
    """The q-th quantile (0 < q < 1) of a histogram over BOUNDS, interpolated within its
    bucket (the last bucket, open above, reads as its lower bound); None when empty."""
    total = sum(histogram)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(histogram):
        if n and seen + n >= rank:
            low = BOUNDS[i - 1] if i > 0 else 0.0
            if i >= len(BOUNDS):
                return low
            return low + (BOUNDS[i] - low) * (rank - seen) / n
        seen += n
    return BOUNDS[-1]


class Rollups:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    async def roll(self) -> int:
        """Roll every whole minute that can be rolled now, an hour per transaction, then
        sample the backlog; the number of minutes rolled (0 when another process holds
        the lock or nothing has ended since)."""
        rolled = 0
        while True:
            async with transaction(self.db) as conn:
                if not await SQL.lock.fetchval(conn):
                    return rolled
                progress = await SQL.progress.fetchrow(conn, grace=GRACE_SECONDS, max_wait=MAX_WAIT_SECONDS)
                start, end = progress["rolled_until"], progress["rollable_until"]
                if end <= start:
                    return rolled
                until = min(end, start + CHUNK)
                await self._roll(conn, start, until)
                rolled += int((until - start) / timedelta(minutes=1))
                if until >= end:
                    return rolled

    async def sample(self) -> None:
        """Write the backlog now into this minute's rows (the backlog chart, and the
        counts shown as approximate above the exact-count limit)."""
        async with transaction(self.db) as conn:
            if await SQL.lock.fetchval(conn):
                await SQL.sample_backlog.execute(conn, keep_seconds=SAMPLE_KEEP_SECONDS)

    async def prune(self) -> None:
        async with transaction(self.db) as conn:
            if await SQL.lock.fetchval(conn):
                await SQL.prune.execute(
                    conn, minute_seconds=minute_retention_seconds(), hour_seconds=hour_retention_seconds()
                )

    @staticmethod
    async def _roll(conn: asyncpg.Connection, start: datetime, until: datetime) -> None:
        await SQL.roll_queue_minutes.execute(conn, bounds=list(BOUNDS), since=start, until=until)
        await SQL.roll_agent_minutes.execute(conn, since=start, until=until)
        await SQL.roll_hours.execute(conn, since=start, until=until)
        await SQL.advance.execute(conn, until=until)
        log.debug("rolled up %s to %s", start, until)
