"""What holds back vacuum: the overview's warning, /metrics and the reaper's log line
(README "When vacuum is held back").

While a transaction is open anywhere in the database (a report, a forgotten psql, a stuck
migration), or a replication slot or prepared transaction keeps an old xmin, vacuum may
not remove the row versions it could still see. Every claim and completion leaves such
versions in todos and its indexes, and todo_history keeps growing: claims do not slow
down for it (dashboard/claim_cursor.py), but the tables bloat and every other read of
them slows, until the holder ends. The operator must be told which one it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg
import msgspec

from dashboard.queries import READS as SQL

log = logging.getLogger("switchboard.reaper")


class Holder(msgspec.Struct, kw_only=True):
    """One thing holding the horizon: a session's transaction, a prepared transaction or
    a replication slot."""

    kind: str  # "transaction", "prepared transaction", "replication slot"
    age: float  # seconds: since its transaction began; a slot's since first seen holding its xmin
    application: str | None = None  # application_name, the prepared transaction's gid, the slot's name
    state: str | None = None  # "idle in transaction", "active", …; "prepared"; "active"/"inactive"
    pid: int | None = None
    user: str | None = None

    def describe(self) -> str:
        """In words, for the overview and the log."""
        who = {
            "transaction": f"a transaction in session {self.pid}",
            "prepared transaction": f"prepared transaction {self.application!r}",
            "replication slot": f"replication slot {self.application!r}",
        }[self.kind]
        facts = []
        if self.kind == "transaction":
            facts.append(f"application {self.application!r}" if self.application else "no application name")
            if self.user:
                facts.append(f"user {self.user}")
        if self.state:
            facts.append(self.state)
        return f"{who} ({', '.join(facts)})"


class Horizon(msgspec.Struct, kw_only=True):
    oldest: Holder | None
    dead_tuples: dict[str, int]  # table name → dead row versions
    warn_after: float

    @property
    def held_back(self) -> bool:
        return self.oldest is not None and self.oldest.age >= self.warn_after


class HorizonWatch:
    """Reads what holds the horizon, at most once per `max_age` seconds, shared by every
    caller of one process (the overview refreshes every few seconds per open page). A slot
    has no clock of its own: its age counts from when this watch first saw its xmin. The
    horizon is held back once the oldest holder is `warn` seconds old
    (SWITCHBOARD_HORIZON_WARN_SECONDS)."""

    def __init__(
        self,
        db: asyncpg.Pool | asyncpg.Connection,
        *,
        warn: float,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.db = db
        self.max_age = max_age
        self.warn_after = warn
        self._clock = clock
        self._lock = asyncio.Lock()
        self._slots_seen: dict[tuple[str, str], float] = {}  # (slot, xmin) → first seen
        self._last: Horizon | None = None
        self._at = 0.0

    async def get(self) -> Horizon:
        async with self._lock:
            now = self._clock()
            if self._last is None or now - self._at > self.max_age:
                self._last = await self._read(now)
                self._at = now
            return self._last

    async def _read(self, now: float) -> Horizon:
        rows = await SQL.horizon_holders.fetch(self.db)
        dead = {r["table"]: r["dead"] for r in await SQL.dead_tuples.fetch(self.db)}
        seen = {}
        holders = []
        for r in rows:
            age = r["age"]
            if r["kind"] == "replication slot":
                key = (r["application"], r["slot_xmin"])
                seen[key] = self._slots_seen.get(key, now)
                age = now - seen[key]
            holders.append(
                Holder(
                    kind=r["kind"],
                    age=age,
                    application=r["application"] or None,
                    state=r["state"],
                    pid=r["pid"],
                    user=r["user"],
                )
            )
        self._slots_seen = seen
        oldest = max(holders, key=lambda h: h.age, default=None)
        return Horizon(oldest=oldest, dead_tuples=dead, warn_after=self.warn_after)


class HorizonLog:
    """The reaper's job that logs when vacuum starts being held back past the threshold,
    again every REPEAT_EVERY while it lasts, and when it ends. Each process logs its own:
    it only reads."""

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
