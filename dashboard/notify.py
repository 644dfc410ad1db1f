"""The hint hub: one LISTEN connection per process, fanned out to every subscriber.

Subscribers are browser pages (SSE), agents' notify channels (SSE), waiting long-poll
claims, waits for a todo's result (`watch`) and the Python Worker (which runs a hub of its
own). A hint only says "something happened in queue q", or to a watch "todo t finished";
the database stays the ledger. Each subscriber keeps the set of queues hinted since it
last looked, so a burst of hints costs it one wake-up, never an unbounded backlog. When
the LISTEN connection is lost it is re-opened with backoff and every subscriber is told
to resync, because hints sent meanwhile are gone.

The hub also sends this process's hints (`send`, called by the Store after a commit that
made work claimable or dead, or finished a watched todo): coalesced per queue and per
todo, on the same connection, one statement at a time and at most one per HINT_SPACING,
with synchronous_commit off. A transaction that NOTIFYs takes a database-wide lock at
commit until its WAL is flushed; sent from here, only the hub's own short commits take
it, never a producer's or an agent's (DESIGN.md, "Notifications").

The same channel carries revocations ({"revoked": token id}, sql/queries/accounts.sql):
a subscription made for a token is woken and marked `revoked`, so the token's waiting
claims, open channels and MCP streams end within moments, in every process; `on_tokens`
listeners (the token cache) hear of every revocation, and of every lost or re-opened
connection. Dashboard sessions that end (logout, a new password, a removed operator) are
hinted alike ({"session_ended": the hex of the session id's SHA-256}): a page's stream
made for that session is marked `revoked` too, as it is when the session expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable

from dashboard import db as dbmod
from dashboard.accounts import token_hash
from dashboard.queries import HINTS

log = logging.getLogger("switchboard.notify")
CHANNEL = "switchboard"
APPLICATION_NAME = "switchboard listener"  # how the LISTEN connection shows in pg_stat_activity
HEALTH_CHECK_EVERY = 5.0
# At most one hint statement per this many seconds: a hint waits at most this long, and
# under load the hints of many commits share one statement (one statement per commit cost
# 4 producers about a tenth of their enqueues: bench/queue_throughput.py's hints rows).
HINT_SPACING = 0.005
MAX_BACKOFF = 5.0


async def listen_connection(dsn: str):
    """The hub's connection. Only hints commit on it: their commit need not wait for a WAL
    flush (the changes they announce were flushed before), so the NOTIFY lock is brief."""
    return await dbmod.connect(dsn, application_name=APPLICATION_NAME, settings={"synchronous_commit": "off"})


def session_key(sid: str) -> str:
    """How a dashboard session is named in hints: the hex of its id's SHA-256, as stored."""
    return token_hash(sid).hex()


class Subscription:
    def __init__(
        self, hub: Hub, queues: Iterable[str] | None, token: str | None = None, session: str | None = None
    ):
        self.hub = hub
        self.queues = frozenset(queues) if queues is not None else None
        self.token = token  # the API token it serves, if any
        self.session = session  # or the dashboard session (session_key), if any
        self._expiry: asyncio.TimerHandle | None = None
        self.todo: str | None = None  # a watch's todo (Hub.watch)
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

    def revoke_after(self, seconds: float) -> None:
        """Revoked (and woken) `seconds` from now, unless closed first: a session's expiry."""
        self._expiry = asyncio.get_running_loop().call_later(seconds, self._revoke)

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
        if self._expiry is not None:
            self._expiry.cancel()
        if self.todo is not None:
            self.hub._unwatch(self)

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
        self._due: set[str] = set()  # queues to hint, sent by _serve
        self._due_todos: set[str] = set()  # finished watched todos to hint, likewise
        self._watches: dict[str, set[Subscription]] = {}  # todo id: its waiters' subscriptions
        self._work = asyncio.Event()  # something to send, or the connection was lost
        self._token_listeners: list[Callable[[str | None], None]] = []

    def send(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None:
        """Hint `queues`, and the finished watched `todos`, after the caller's commit. Never
        waits: hints given while one is being sent go out together in the next statement. A
        hint that cannot be sent (no connection) only delays work: every waiter also polls."""
        self._due.update(queues)
        self._due_todos.update(todos)
        if self._due or self._due_todos:
            self._work.set()

    def on_tokens(self, listener: Callable[[str | None], None]) -> None:
        """Call `listener(token id)` when a token is revoked, and `listener(None)` when
        revocations may have been missed (the LISTEN connection was lost or re-opened)."""
        self._token_listeners.append(listener)

    def _tokens_changed(self, token_id: str | None) -> None:
        for listener in self._token_listeners:
            listener(token_id)

    def subscribe(
        self, queues: Iterable[str] | None = None, token: str | None = None, session: str | None = None
    ) -> Subscription:
        """Hints for `queues` (all queues when None), for API token `token` or dashboard
        session `session` (its session_key) if one. Close it (or use `with`) when done."""
        sub = Subscription(self, queues, token, session)
        if self._ending:
            sub._end()
        self._subscribers.add(sub)
        return sub

    def watch(self, todo_id: str, token: str | None = None) -> Subscription:
        """Woken when todo `todo_id` finishes (hinted only while it is marked watched:
        Store.watch), and like any subscription on a resync, on the revocation of `token`
        and when the process stops; no queue's hints. Close it (or use `with`) when done."""
        sub = self.subscribe((), token)
        sub.todo = todo_id
        self._watches.setdefault(todo_id, set()).add(sub)
        return sub

    def _unwatch(self, sub: Subscription) -> None:
        waiters = self._watches.get(sub.todo, set())
        waiters.discard(sub)
        if not waiters:
            self._watches.pop(sub.todo, None)

    @property
    def stopping(self) -> bool:
        """The process is stopping (end_all was called)."""
        return self._ending

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
                self._tokens_changed(hint["revoked"])
                for sub in self._subscribers:
                    if sub.token == hint["revoked"]:
                        sub._revoke()
                return
            if "session_ended" in hint:
                for sub in self._subscribers:
                    if sub.session == hint["session_ended"]:
                        sub._revoke()
                return
            if "todo" in hint:
                for sub in self._watches.get(hint["todo"], ()):
                    sub._hint(hint["todo"])
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
                conn = await listen_connection(self.dsn)
                conn.add_termination_listener(lambda _c, lost=lost: (lost.set(), self._work.set()))
                await conn.add_listener(CHANNEL, self._on_notify)
                self.connected.set()
                if not first:
                    log.warning("LISTEN connection re-opened; telling subscribers to resync")
                    self._tokens_changed(None)
                    for sub in self._subscribers:
                        sub._resync()
                first, backoff = False, 0.1
                await self._serve(conn, lost)
                log.warning("LISTEN connection lost")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection failed: %s; retrying in %.1fs", exc, backoff)
            finally:
                if self.connected.is_set():
                    self.connected.clear()
                    self._tokens_changed(None)
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _serve(self, conn, lost: asyncio.Event) -> None:
        """Send due hints as they come, one statement at a time; when there are none for
        HEALTH_CHECK_EVERY seconds, check that the connection still answers."""
        while not lost.is_set():
            try:
                await asyncio.wait_for(self._work.wait(), HEALTH_CHECK_EVERY)
            except TimeoutError:
                await conn.execute("SELECT 1", timeout=HEALTH_CHECK_EVERY)
                continue
            self._work.clear()
            if lost.is_set() or not (self._due or self._due_todos):
                continue
            queues, self._due = sorted(self._due), set()
            todos, self._due_todos = sorted(self._due_todos), set()
            args = HINTS.send.args({"queues": queues, "todos": todos})
            try:
                await conn.execute(HINTS.send.sql, *args, timeout=HEALTH_CHECK_EVERY)
            except BaseException:
                self._due.update(queues)  # sent once the connection is back
                self._due_todos.update(todos)
                raise
            await asyncio.sleep(HINT_SPACING)
