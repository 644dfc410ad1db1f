"""The Python Worker's batches (dashboard/worker.py): handlers that finish together are
acked in one statement and their slots claimed in it too, and a result the store refuses
fails only its own attempt.

The Worker runs in this process on a database of the test's own; statements are told
apart by the transaction ids (xmin) of the rows they wrote. Handlers end together by
waiting on one event, set once all of them run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from dashboard.store import Store
from dashboard.worker import Worker
from tests.factories import enqueue, todo_row

TIMEOUT = 60.0


@contextlib.asynccontextmanager
async def running_worker(dsn: str, handler, concurrency: int):
    worker = Worker(dsn, ["q"], handler, owner="batcher", concurrency=concurrency, poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def until(check, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Together:
    """A handler whose calls wait until `size` of them run, then all return at once."""

    def __init__(self, size: int, result=None):
        self.size = size
        self.result = result or (lambda todo: {"ok": True})
        self.running = 0
        self.go = asyncio.Event()

    async def handle(self, todo):
        self.running += 1
        if self.running % self.size == 0:
            self.go.set()
        await self.go.wait()
        if self.running % self.size == 0:  # the next group waits again
            self.go = asyncio.Event()
        return self.result(todo)


async def statements(pool, sql: str) -> int:
    """How many transactions wrote the rows `sql` selects (its xmin column)."""
    return await pool.fetchval(f"SELECT count(DISTINCT xmin::text) FROM ({sql}) rows")


async def test_handlers_that_finish_together_are_acked_in_one_statement(dsn, pool):
    for n in range(5):
        await enqueue_to(pool, n)
    handler = Together(5)
    async with running_worker(dsn, handler.handle, concurrency=5):
        await until(lambda: done(pool, 5), "five completions")
    assert await statements(pool, "SELECT xmin FROM todos WHERE state = 'done'") == 1


async def test_slots_freed_together_are_claimed_in_one_statement(dsn, pool):
    for n in range(10):
        await enqueue_to(pool, n)
    handler = Together(5)
    async with running_worker(dsn, handler.handle, concurrency=5):
        await until(lambda: done(pool, 10), "ten completions")
    # Two claims of five, not one of five and then five of one.
    claims = "SELECT xmin FROM todo_history WHERE event = 'claimed'"
    assert await statements(pool, claims) == 2
    # The second claim completed the first five in the same statement: three in all, the
    # first claim, the acks with the second, the last acks.
    moves = "SELECT xmin FROM todo_history WHERE event IN ('claimed', 'completed')"
    assert await statements(pool, moves) == 3


async def test_a_result_the_store_refuses_fails_its_own_attempt_and_the_others_complete(dsn, pool):
    todos = [await enqueue_to(pool, n) for n in range(3)]
    bad = todos[1].id

    def result(todo):
        return {"unencodable": object()} if todo.id == bad else {"ok": todo.id}

    async with running_worker(dsn, Together(3, result).handle, concurrency=3):
        await until(lambda: settled(pool, 3), "three acks")
    for todo in todos:
        row = await todo_row(pool, todo.id)
        if todo.id == bad:
            assert row.state == "failed"  # its one attempt failed
            assert row.last_error.startswith("the handler's result was refused:")
        else:
            assert row.state == "done" and row.result == {"ok": todo.id}


# -- helpers -----------------------------------------------------------------------------


async def enqueue_to(pool, n: int):
    return await enqueue(Store(pool), title=f"t{n}", max_attempts=1)


async def done(pool, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'done'") >= n


async def settled(pool, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM todos WHERE state IN ('done', 'failed')") >= n
