"""A worker for Python agents that have a database connection.

    async def handle(todo):            # may also be a plain function (run in a thread)
        return {"sent": True}          # the result; raise to fail the attempt

    await Worker(dsn, ["emails"], handle, owner="mailer-1").run()

It claims from its queues, waits on NOTIFY hints (polling every `poll_interval` seconds
in case a hint never comes), heartbeats while the handler runs, completes with the
handler's return value and fails with the exception text. On SIGTERM or SIGINT it stops
claiming, gives running handlers `grace` seconds to finish, then releases what it holds.

A todo cancelled while it runs (an operator's cancel: it is already failed, as cancelled)
is learnt at the next heartbeat, within ttl/3: the handler's task is cancelled (a coroutine
handler gets CancelledError at its next await; a plain function cannot be interrupted, it
runs on in its thread and its return value is dropped), nothing is acked, and the worker
goes on to its next todo.

Handlers must be idempotent: delivery is at-least-once (a lease that lapses mid-work
makes the todo claimable again).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import socket
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dashboard import db as dbmod
from dashboard.backoff import Backoff
from dashboard.errors import Cancelled, Conflict, DatabaseUnavailable, NotFound, SwitchboardError
from dashboard.models import Todo, check_queues, check_ttl
from dashboard.notify import Hub, Subscription
from dashboard.store import Store

log = logging.getLogger("switchboard.worker")


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        dsn: str,
        queues: Sequence[str],
        handler: Callable[[Todo], Any],
        *,
        owner: str | None = None,
        ttl: float = 30,
        concurrency: int = 1,
        poll_interval: float = 5.0,
        grace: float = 10.0,
    ):
        self.dsn = dsn
        self.queues = check_queues(list(queues))
        self.handler = handler
        self.owner = owner or default_owner()
        self.ttl = check_ttl(ttl)
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.grace = grace
        self._stopping = asyncio.Event()
        self._hints: Subscription | None = None
        self._running: dict[asyncio.Task, Todo] = {}
        self._backoff = Backoff()  # between failed claims while the database is away

    def stop(self) -> None:
        """Stop claiming; running handlers get `grace` seconds before their todos are released."""
        self._stopping.set()
        if self._hints is not None:
            self._hints.wake()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        pool = await dbmod.create_pool(self.dsn, min_size=1, max_size=self.concurrency + 1)
        hub = Hub(self.dsn)
        await hub.start()
        self._hints = hub.subscribe(self.queues)
        store = Store(pool, hints=hub)  # its releases and fails hint other processes
        try:
            await self._claim_loop(store, self._hints)
            await self._drain()
        finally:
            self._hints.close()
            await hub.stop()
            await pool.close()

    async def _claim_loop(self, store: Store, hints: Subscription) -> None:
        while not self._stopping.is_set():
            free = self.concurrency - len(self._running)
            if free <= 0:  # every slot busy: wait for one to free up, or for stop()
                stopping = asyncio.create_task(self._stopping.wait())
                await asyncio.wait([*self._running, stopping], return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                continue
            hints.take()
            try:
                todos = await store.claim_batch(self.queues, self.owner, self.ttl, free)
            except DatabaseUnavailable as exc:
                delay = self._backoff.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                await hints.wait(delay)
                continue
            self._backoff.reset()
            for todo in todos:
                task = asyncio.create_task(self._process(store, todo))
                self._running[task] = todo
                task.add_done_callback(self._running.pop)
            if not todos and not self._stopping.is_set():
                await hints.wait(self.poll_interval)

    async def _drain(self) -> None:
        if not self._running:
            return
        _, pending = await asyncio.wait(list(self._running), timeout=self.grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _process(self, store: Store, todo: Todo) -> None:
        work = asyncio.create_task(self._call(todo))
        beat = asyncio.create_task(self._heartbeat(store, todo))
        try:
            await asyncio.wait({work, beat}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done() and (cancelled := _cancellation(beat)) is not None:
                await self._stop_handler(todo, work, cancelled)
                return
            result = await work
        except asyncio.CancelledError:  # stopping, and the grace period is over
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            with contextlib.suppress(SwitchboardError):
                await asyncio.shield(store.release(todo.id, self.owner, todo.lease_token))
            raise
        except Exception as exc:
            text = "".join(traceback.format_exception_only(exc)).strip()[-8000:]
            await self._settle(todo, "fail", lambda: store.fail(todo.id, self.owner, todo.lease_token, text))
        else:
            if result is not None and not isinstance(result, dict):
                result = {"value": result}
            await self._settle(
                todo, "complete", lambda: store.complete(todo.id, self.owner, todo.lease_token, result)
            )
        finally:
            beat.cancel()

    async def _stop_handler(self, todo: Todo, work: asyncio.Task, cancelled: Cancelled) -> None:
        """The todo was cancelled under the handler: cancel its task and wait for it (up to
        `grace` seconds: a handler may swallow the cancellation); the todo is not acked."""
        log.warning("%s; stopping its handler", cancellation_note(todo.id, cancelled))
        work.cancel()
        done, _ = await asyncio.wait({work}, timeout=self.grace)
        if not done:
            log.warning("the handler of %s ignores its cancellation; leaving it behind", todo.id)
            return
        if not work.cancelled() and work.exception() is not None:  # retrieved: not logged as lost
            log.info("the handler of %s raised once cancelled: %r", todo.id, work.exception())

    async def _call(self, todo: Todo) -> Any:
        if inspect.iscoroutinefunction(self.handler):
            return await self.handler(todo)
        return await asyncio.to_thread(self.handler, todo)

    async def _settle(self, todo: Todo, action: str, transition: Callable[[], Awaitable]) -> None:
        """Ack, retrying through a database outage with the same lease (fencing makes a
        repeat harmless); a todo gone or no longer ours (the lease lapsed and it was
        claimed again) is dropped, logged with the reason."""
        backoff = Backoff()
        while True:
            try:
                await transition()
                return
            except DatabaseUnavailable as exc:
                delay = backoff.next()
                log.warning("%s of %s failed (%s); retrying in %.1fs", action, todo.id, exc, delay)
                await asyncio.sleep(delay)
            except Cancelled as exc:
                log.warning("%s; its %s is dropped", cancellation_note(todo.id, exc), action)
                return
            except (Conflict, NotFound) as exc:
                log.warning("dropping %s, the %s was refused: %s", todo.id, action, exc)
                return

    async def _heartbeat(self, store: Store, todo: Todo) -> Cancelled | None:
        """Every ttl/3, through outages; stops once the lease is not ours. Returns the
        Cancelled refusal when the todo was cancelled (its handler should stop)."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await store.heartbeat(todo.id, self.owner, todo.lease_token, self.ttl)
            except DatabaseUnavailable as exc:
                log.warning("heartbeat of %s failed (%s); trying again in %.0fs", todo.id, exc, self.ttl / 3)
            except Cancelled as exc:
                return exc
            except (Conflict, NotFound) as exc:
                log.warning("lost the lease on %s: %s", todo.id, exc)
                return None


def _cancellation(beat: asyncio.Task) -> Cancelled | None:
    """What a finished heartbeat task found: the todo's cancellation, or None."""
    if not beat.done() or beat.cancelled() or beat.exception() is not None:
        return None
    return beat.result()


def cancellation_note(todo_id: str, exc: Cancelled) -> str:
    """A log line's start, from a Cancelled refusal's facts: todo X was cancelled by NAME: REASON."""
    by = exc.current.get("cancelled_by") or "someone"
    reason = exc.current.get("reason")
    return f"todo {todo_id} was cancelled by {by}" + (f": {reason}" if reason else " (no reason given)")
