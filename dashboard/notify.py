"""The hint hub: one LISTEN connection per process, fanned out to every subscriber.

Subscribers are browser pages (SSE), agents' notify channels (SSE), waiting long-poll
claims and the Python Worker (which runs a hub of its own). A hint only says "something
happened in queue q"; the queue stays the ledger. Each subscriber keeps the set of
queues hinted since it last looked, so a burst of hints costs it one wake-up, never an
unbounded backlog. When the LISTEN connection is
lost it is re-opened with backoff and every subscriber is told to resync, because hints
sent meanwhile are gone.

The same channel carries revocations ({"revoked": token id}, sql/queries/accounts.sql):
a subscription made for a token is woken and marked `revoked`, so the token's waiting
claims and open channels end within moments, in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable

from dashboard import db as dbmod

log = logging.getLogger("switchboard.notify")
CHANNEL = "switchboard"
HEALTH_CHECK_EVERY = 5.0
MAX_BACKOFF = 5.0


class Subscription:
    def __init__(self, hub: Hub, queues: Iterable[str] | None, token: str | None = None):
        self.hub = hub
        self.queues = frozenset(queues) if queues is not None else None
        self.token = token  # the API token it serves, if any
        self.revoked = False
        self.hinted: set[str] = set()
        self.resync = False
        self.ended = False  # the process is stopping: streams end, waiting claims give up
        self._event = asyncio.Event()

    def matches(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    def _hint(self, queue: str) -> None:
        self.hinted.add(queue)
        self._event.set()

    def _resync(self) -> None:
        self.resync = True
        self._event.set()

    def _revoke(self) -> None:
        self.revoked = True
        self._event.set()

    def _end(self) -> None:
        self.ended = True
        self._event.set()

    def wake(self) -> None:
        """End a `wait` without a hint (a worker that is stopping)."""
        self._event.set()

    async def wait(self, seconds: float | None = None) -> bool:
        """Wait for a hint (or resync); False when `seconds` pass first."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def take(self) -> tuple[set[str], bool]:
        """The queues hinted (and whether to resync) since the last take."""
        hinted, resync = self.hinted, self.resync
        self.hinted, self.resync = set(), False
        self._event.clear()
        return hinted, resync

    def close(self) -> None:
        self.hub._subscribers.discard(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Hub:
    def __init__(self, dsn: str):
        self.dsn = dsn
        self._subscribers: set[Subscription] = set()
        self._task: asyncio.Task | None = None
        self.connected = asyncio.Event()
        self._ending = False

    def subscribe(self, queues: Iterable[str] | None = None, token: str | None = None) -> Subscription:
        """Hints for `queues` (all queues when None), for API token `token` if one. Close it
        (or use `with`) when done."""
        sub = Subscription(self, queues, token)
        if self._ending:
            sub._end()
        self._subscribers.add(sub)
        return sub

    def end_all(self) -> None:
        """The process is stopping: every subscription, now and later, is ended."""
        self._ending = True
        for sub in self._subscribers:
            sub._end()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name="switchboard-listener")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 10)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _on_notify(self, _conn, _pid, _channel, payload: str) -> None:
        try:
            hint = json.loads(payload)
            if "revoked" in hint:
                for sub in self._subscribers:
                    if sub.token == hint["revoked"]:
                        sub._revoke()
                return
            queue = hint["queue"]
        except (ValueError, KeyError, TypeError):
            return
        for sub in self._subscribers:
            if sub.matches(queue):
                sub._hint(queue)

    async def _supervise(self) -> None:
        backoff = 0.1
        first = True
        while True:
            lost = asyncio.Event()
            conn = None
            try:
                conn = await dbmod.connect(self.dsn)
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self.connected.set()
                if not first:
                    log.warning("LISTEN connection re-opened; telling subscribers to resync")
                    for sub in self._subscribers:
                        sub._resync()
                first, backoff = False, 0.1
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), HEALTH_CHECK_EVERY)
                    if not lost.is_set():
                        await conn.execute("SELECT 1", timeout=HEALTH_CHECK_EVERY)
                log.warning("LISTEN connection lost")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection failed: %s; retrying in %.1fs", exc, backoff)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
