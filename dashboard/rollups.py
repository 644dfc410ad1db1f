"""The rollup job: per queue and minute, what happened (from todo_history), and the backlog.

Charts, the overview's "done in the last hour" and the agents page read these rows
instead of counting history or todos, so their cost follows the time range asked for,
not the traffic. The job runs in the reaper's loop of every process; an advisory lock
lets one of them at a time do it, and the others skip their turn. Nothing on the claim
or complete path writes here, and no index is added there: history rows carry their
step, queue and elapsed time (migration 0009), and the job reads them by id, adding
what was written since its last pass to the minute and hour rows.

Each history row must be counted once, yet ids are handed out when a row is written and
the row is seen only when its transaction commits, so an id can appear after greater
ones. Each pass therefore takes a mark — the newest id handed out, and the time just
after reading it — and rolls up to the newest mark taken no later than the start of the
oldest transaction still writing: every id up to that mark went to a transaction that has
ended (committed, or rolled back and never to be seen). A gap, when no process ran, is
rolled from history when one comes back, CHUNK ids per transaction.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

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
MAX_WAIT_SECONDS = 600.0  # a transaction writing longer than this does not hold rollups back
CHUNK = 500_000  # history ids per transaction (a gap is rolled in several)
SAMPLE_KEEP_SECONDS = 600.0  # queues sampled this recently get a zero when they empty
SAMPLE_SHARE = 0.02  # backlog samples take at most this share of the job's time


def next_sample_in(took: float, every: float) -> float:
    """Seconds to the next backlog sample: `every`, or longer when the last one took more
    than SAMPLE_SHARE of that (a million pending todos take a second to count)."""
    return max(every, took / SAMPLE_SHARE)


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
        """Take a mark, then roll the history up to the newest mark that is safe (see
        the module's docstring), CHUNK ids per transaction; the number of ids rolled (0
        when another process holds the lock)."""
        async with transaction(self.db) as conn:
            if not await SQL.lock.fetchval(conn):
                return 0
            last_id = await SQL.last_history_id.fetchval(conn)
            await SQL.add_mark.execute(conn, last_id=last_id)
        rolled = 0
        while True:
            async with transaction(self.db) as conn:
                if not await SQL.lock.fetchval(conn):
                    return rolled
                progress = await SQL.progress.fetchrow(conn, max_wait=MAX_WAIT_SECONDS)
                start, safe = progress["rolled_id"], progress["safe_id"]
                if safe is None:
                    return rolled
                upto = min(max(safe, start), start + CHUNK)
                if upto > start:
                    await self._roll(conn, start, upto)
                reached = upto >= safe
                await SQL.advance.execute(
                    conn, rolled_id=upto, rolled_until=progress["safe_at"] if reached else None
                )
                rolled += upto - start
                if reached:
                    return rolled

    async def sample(self) -> float:
        """Write the backlog now into this minute's and hour's rows (the backlog chart,
        and the counts shown as approximate above the exact-count limit); the seconds it
        took. It counts every live todo, so at a large backlog the caller samples less
        often (next_sample_in)."""
        started = time.monotonic()
        async with transaction(self.db) as conn:
            if await SQL.lock.fetchval(conn):
                await SQL.sample_backlog.execute(conn, keep_seconds=SAMPLE_KEEP_SECONDS)
        return time.monotonic() - started

    async def prune(self, minute_seconds: float, hour_seconds: float) -> None:
        """Delete minute rows older than `minute_seconds` (charts reach 24 h back) and hour
        rows older than `hour_seconds` (the 7-day chart): SWITCHBOARD_ROLLUP_MINUTE_HOURS
        and SWITCHBOARD_ROLLUP_HOUR_DAYS."""
        async with transaction(self.db) as conn:
            if await SQL.lock.fetchval(conn):
                await SQL.prune.execute(conn, minute_seconds=minute_seconds, hour_seconds=hour_seconds)

    @staticmethod
    async def _roll(conn: asyncpg.Connection, after_id: int, upto_id: int) -> None:
        """Add the history rows with ids in (after_id, upto_id] to the rollups."""
        steps = await SQL.steps.fetch(conn, bounds=list(BOUNDS), after_id=after_id, upto_id=upto_id)
        queues, agents = fold(steps)
        await SQL.add_steps.executemany(conn, [{"grain": "minute", **q} for q in queues])
        await SQL.add_steps.executemany(conn, [{"grain": "hour", **h} for h in by_hour(queues)])
        await SQL.add_agent_steps.executemany(conn, agents)
        log.debug("rolled up history ids %d to %d", after_id + 1, upto_id)


# How history's steps (todo_history.event, migration 0009) count in the rollups.
QUEUE_COUNTS = {
    "created": "created",
    "deduplicated": "deduplicated",
    "claimed": "claimed",
    "completed": "completed",
    "failed": "failed",  # by its agent, retried or dead-lettered
    "reaped": "reaped",
    "released": "released",
    "force_released": "released",  # an operator took the lease back
    "cancelled": "cancelled",  # dead-lettered, but counted here and not as dead
}
WAITED = ("claimed",)  # elapsed: time in queue
RAN = ("completed", "failed")  # elapsed: run time
AGENT_COUNTS = ("claimed", "completed", "failed", "released")
AGENT_LAST = {"claimed": "last_claim_at"} | dict.fromkeys(("completed", "failed", "released"), "last_ack_at")


def fold(rows) -> tuple[list[dict], list[dict]]:
    """The rows of the `steps` statement as queue-minute rows (with queue '*', all of
    them together) and agent-minute rows, ready for the upserts."""
    queues: dict[tuple[str, datetime], dict] = {}
    agents: dict[tuple[str, datetime], dict] = {}
    for r in rows:
        event, n = r["event"], r["n"]
        if r["actor_kind"] == "agent" and event in AGENT_LAST:  # not a person's, from the Inbox
            row = agents.setdefault((r["actor"], r["minute"]), _agent_row(r["actor"], r["minute"]))
            if event in AGENT_COUNTS:
                row[event] += n
            last = AGENT_LAST[event]
            row[last] = max(filter(None, (row[last], r["last_at"])))
        for queue in (r["queue"], "*"):
            row = queues.setdefault((queue, r["minute"]), _queue_row(queue, r["minute"]))
            if event in QUEUE_COUNTS:
                row[QUEUE_COUNTS[event]] += n
            if r["to_failed"] and event in ("failed", "reaped"):
                row["dead"] += n
            if r["bucket"] is not None:
                for kind, events in (("waited", WAITED), ("ran", RAN)):
                    if event in events:
                        row[kind][r["bucket"]] += n
                        row[f"{kind}_sum"] += r["elapsed_sum"]
    return list(queues.values()), list(agents.values())


def by_hour(minutes: list[dict]) -> list[dict]:
    """Queue-minute rows summed per queue and hour (added to the hour rows)."""
    hours: dict[tuple[str, datetime], dict] = {}
    for m in minutes:
        at = m["at"].replace(minute=0)
        row = hours.setdefault((m["queue"], at), _queue_row(m["queue"], at))
        for key, value in m.items():
            if key in ("waited", "ran"):
                row[key] = [a + b for a, b in zip(row[key], value, strict=True)]
            elif key not in ("queue", "at"):
                row[key] += value
    return list(hours.values())


def _queue_row(queue: str, at: datetime) -> dict:
    return {
        "queue": queue,
        "at": at,
        **dict.fromkeys(set(QUEUE_COUNTS.values()) | {"dead"}, 0),
        "waited": [0] * (len(BOUNDS) + 1),
        "ran": [0] * (len(BOUNDS) + 1),
        "waited_sum": 0.0,
        "ran_sum": 0.0,
    }


def _agent_row(agent: str, at: datetime) -> dict:
    return {"agent": agent, "at": at, **dict.fromkeys(AGENT_COUNTS, 0), **dict.fromkeys(AGENT_LAST.values())}
