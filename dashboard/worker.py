"""A worker for Python agents that have a database connection.

    async def handle(todo):            # may also be a plain function (run in a thread)
        return {"sent": True}          # the result; raise to fail the attempt

    await Worker(dsn, ["emails"], handle, owner="mailer-1").run()

It claims from its queues, waits on NOTIFY hints (polling every `poll_interval` seconds
in case a hint never comes), heartbeats while the handler runs, completes with the
handler's return value and fails with the exception text. A busy worker works in
batches: the slots of handlers that end together are claimed again in one statement, and
that statement also completes what they returned (Store.ack_and_claim: one round trip and
one commit for both); acks that come while the queues are empty go on their own, those
that come while one batch is on its way together in the next. So a worker fed faster than
it works spends a fraction of a statement per todo, not two. When handlers are quick, it
also claims ahead: up to `prefetch` todos (default: `concurrency`) wait, their leases
heartbeated, for a slot, so handlers do not idle while a statement is on its way. It holds
only as many ahead as its handlers finish in AHEAD_WAIT, so slow work is never held
waiting. On SIGTERM or SIGINT it stops claiming, releases the todos claimed ahead, gives
running handlers `grace` seconds to finish, then releases what they hold.

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
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from dashboard import db as dbmod
from dashboard.backoff import Backoff
from dashboard.errors import (
    Cancelled,
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    SwitchboardError,
)
from dashboard.models import Ack, Todo, check_queues, check_ttl
from dashboard.notify import Hub, Subscription
from dashboard.store import MAX_BATCH, Store

log = logging.getLogger("switchboard.worker")

AHEAD_WAIT = 0.05  # seconds a todo claimed ahead may wait for a slot, by the handlers' pace


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
        prefetch: int | None = None,
        poll_interval: float = 5.0,
        grace: float = 10.0,
    ):
        self.dsn = dsn
        self.queues = check_queues(list(queues))
        self.handler = handler
        self.owner = owner or default_owner()
        self.ttl = check_ttl(ttl)
        self.concurrency = concurrency
        self.prefetch = concurrency if prefetch is None else prefetch
        self.poll_interval = poll_interval
        self.grace = grace
        self._stopping = asyncio.Event()
        self._hints: Subscription | None = None
        self._running: dict[asyncio.Task, Todo] = {}  # each until its todo is acked
        self._held = 0  # todos claimed whose handler has not returned: running or waiting
        self._slots = asyncio.Semaphore(concurrency)  # a handler runs holding one
        self._handler_time: float | None = None  # seconds a handler takes, averaged
        self._wake = asyncio.Event()  # a handler ended, or an ack came
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
        self._acks = Acks(store, self.owner, self._wake)
        try:
            await self._claim_loop(store, self._hints)
            await self._drain()
        finally:
            self._hints.close()
            await hub.stop()
            await pool.close()

    async def _claim_loop(self, store: Store, hints: Subscription) -> None:
        """Claim for the free slots, taking the acks that wait along (one statement for
        both: Store.ack_and_claim); with every slot busy, wait for one to free or an ack
        to come. While the queues are empty it waits for a hint, and acks go on their own."""
        self._acks.held = True
        try:
            while not self._stopping.is_set():
                free = self.concurrency + self._ahead() - self._held
                if free <= 0 and not self._acks.waiting:
                    self._wake.clear()
                    waits = [
                        asyncio.create_task(self._wake.wait()),
                        asyncio.create_task(self._stopping.wait()),
                    ]
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    for wait in waits:
                        wait.cancel()
                    await self._finishing_together()
                    continue
                batch = self._acks.take()
                if free <= 0:  # an ack, and no slot to claim for
                    await self._acks.deliver(batch)
                    continue
                hints.take()
                try:
                    todos = await self._claim(store, batch, free)
                except DatabaseUnavailable as exc:
                    delay = self._backoff.next()
                    log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                    await hints.wait(delay)
                    continue
                self._backoff.reset()
                self._held += len(todos)
                for todo in todos:
                    task = asyncio.create_task(self._process(store, todo))
                    self._running[task] = todo
                    task.add_done_callback(self._running.pop)
                if not todos and not self._stopping.is_set():
                    self._acks.release()  # nothing to claim: acks go on their own meanwhile
                    await hints.wait(self.poll_interval)
                    self._acks.held = True
        finally:
            self._acks.release()

    async def _claim(self, store: Store, batch: list, free: int) -> list[Todo]:
        """Up to `free` todos, and the acks of `batch` answered, in one statement."""
        if not batch:
            return await store.claim_batch(self.queues, self.owner, self.ttl, free)
        try:
            outcomes, todos = await store.ack_and_claim(
                self.owner, [ack for ack, _ in batch], self.queues, self.ttl, free
            )
        except InvalidInput:  # one ack malformed (a result not JSON): those go one by one
            await self._acks.deliver(batch)
            return await store.claim_batch(self.queues, self.owner, self.ttl, free)
        except Exception as exc:
            self._acks.answer(batch, [exc] * len(batch))
            raise
        self._acks.answer(batch, outcomes)
        return todos

    async def _finishing_together(self) -> None:
        """Let the handlers that end in the same instant (a batch claimed together, of
        like work) all free their slots, so that they are claimed in one statement."""
        while True:
            held = self._held
            await asyncio.sleep(0)
            if self._held == held:
                return

    def _ahead(self) -> int:
        """How many todos to claim beyond the slots: as many as the handlers, at their
        pace, finish within AHEAD_WAIT (none before one has finished), at most `prefetch`."""
        if not self.prefetch or self._handler_time is None:
            return 0
        return min(self.prefetch, int(self.concurrency * AHEAD_WAIT / max(self._handler_time, 1e-6)))

    async def _drain(self) -> None:
        if not self._running:
            return
        _, pending = await asyncio.wait(list(self._running), timeout=self.grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _process(self, store: Store, todo: Todo) -> None:
        beat = asyncio.create_task(self._heartbeat(store, todo))
        try:
            if not await self._slot(store, todo, beat):
                return
            ack = await self._work(store, todo, beat)
            if ack is not None:
                await self._settle(todo, ack)
        finally:
            beat.cancel()

    async def _slot(self, store: Store, todo: Todo, beat: asyncio.Task) -> bool:
        """Take a handler slot for `todo`, waiting while it was claimed ahead. False when
        the todo is not to run: the worker is stopping (it is released) or it was
        cancelled meanwhile (nothing to do)."""
        if not self._slots.locked():
            await self._slots.acquire()
            return True
        acquire = asyncio.create_task(self._slots.acquire())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({acquire, stopping, beat}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            acquire.cancel()
        if acquire.done() and not acquire.cancelled():
            if not self._stopping.is_set() and not beat.done():
                return True
            self._slots.release()
        self._held -= 1
        self._wake.set()
        if (cancelled := _cancellation(beat)) is not None:
            log.warning("%s before its handler started", cancellation_note(todo.id, cancelled))
        elif self._stopping.is_set():
            with contextlib.suppress(SwitchboardError):
                await store.release(todo.id, self.owner, todo.lease_token)
        return False

    async def _work(self, store: Store, todo: Todo, beat: asyncio.Task) -> Ack | None:
        """Run the handler: the ack it earned, or None when the todo was cancelled under
        it. Its slot is free once it ends, while the ack may still be on its way."""
        started = time.perf_counter()
        work = asyncio.create_task(self._call(todo))
        try:
            await asyncio.wait({work, beat}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done() and (cancelled := _cancellation(beat)) is not None:
                await self._stop_handler(todo, work, cancelled)
                return None
            result = await work
        except asyncio.CancelledError:  # stopping, and the grace period is over
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            with contextlib.suppress(SwitchboardError):
                await asyncio.shield(store.release(todo.id, self.owner, todo.lease_token))
            raise
        except Exception as exc:
            text = "".join(traceback.format_exception_only(exc)).strip()[-8000:]
            return Ack(todo.id, todo.lease_token, error=text)
        finally:
            took = time.perf_counter() - started
            last = self._handler_time
            self._handler_time = took if last is None else 0.8 * last + 0.2 * took
            self._held -= 1
            self._slots.release()
            self._wake.set()
        if result is not None and not isinstance(result, dict):
            result = {"value": result}
        return Ack(todo.id, todo.lease_token, result=result)

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

    async def _settle(self, todo: Todo, ack: Ack) -> None:
        """Ack, retrying through a database outage with the same lease (fencing makes a
        repeat harmless); a todo gone or no longer ours (the lease lapsed and it was
        claimed again) is dropped, logged with the reason. A result the store refuses (not
        JSON, too large) fails the attempt, saying why, rather than leave it held."""
        backoff = Backoff()
        action = "complete" if ack.error is None else "fail"
        while True:
            try:
                await self._acks.send(ack)
                return
            except InvalidInput as exc:
                if ack.error is not None:
                    raise
                log.warning("the result of %s was refused (%s); failing the attempt", todo.id, exc)
                action, ack = "fail", Ack(ack.id, ack.lease, error=f"the handler's result was refused: {exc}")
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


class Acks:
    """The acks of finished handlers, sent in batches. While the claim loop is busy
    (`held`), they go with its next claim, in the same statement; otherwise a sender sends
    them, and those that come while one batch is on its way go together in the next (as a
    database groups commits)."""

    def __init__(self, store: Store, owner: str, wake: asyncio.Event):
        self.store = store
        self.owner = owner
        self.wake = wake  # the claim loop's
        self.held = False  # the claim loop takes the waiting acks with its next claim
        self.waiting: list[tuple[Ack, asyncio.Future]] = []
        self._sending: asyncio.Task | None = None

    async def send(self, ack: Ack) -> Todo:
        """The todo, acked; or what refused it (Conflict, NotFound, Cancelled), or the
        error that kept its batch from the database (DatabaseUnavailable), raised."""
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append((ack, answer))
        self.wake.set()
        if not self.held:
            self._send_soon()
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:  # the answer still comes; nobody is left to read it
            answer.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    def take(self) -> list[tuple[Ack, asyncio.Future]]:
        batch, self.waiting = self.waiting[:MAX_BATCH], self.waiting[MAX_BATCH:]
        return batch

    def release(self) -> None:
        """The claim loop waits or has stopped: the acks that wait go on their own."""
        self.held = False
        if self.waiting:
            self._send_soon()

    def answer(self, batch: list[tuple[Ack, asyncio.Future]], outcomes: list) -> None:
        for (_, answer), outcome in zip(batch, outcomes, strict=True):
            if answer.done():
                continue
            if isinstance(outcome, BaseException):
                answer.set_exception(outcome)
            else:
                answer.set_result(outcome)

    async def deliver(self, batch: list[tuple[Ack, asyncio.Future]]) -> None:
        """Send `batch` alone (Store.ack_many) and answer it."""
        self.answer(batch, await self._ack(batch))

    def _send_soon(self) -> None:
        if self._sending is None:  # a task of its own: a cancelled sender stops no batch
            self._sending = asyncio.create_task(self._send_all())

    async def _send_all(self) -> None:
        try:
            while self.waiting and not self.held:
                await self.deliver(self.take())
        finally:
            self._sending = None

    async def _ack(self, batch: list[tuple[Ack, asyncio.Future]]) -> list:
        """Each ack's outcome (a todo or an exception); a batch refused as malformed (one
        result not JSON, say) is sent again one by one, so only that ack is refused."""
        try:
            return await self.store.ack_many(self.owner, [ack for ack, _ in batch])
        except InvalidInput as exc:
            if len(batch) == 1:
                return [exc]
            return [outcome for item in batch for outcome in await self._ack([item])]
        except Exception as exc:
            return [exc] * len(batch)


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
