"""The Python Worker's batches (dashboard/worker.py): handlers that finish together are
acked in one statement and their slots claimed in it too, a result the store refuses
fails only its own attempt, and quick handlers have todos claimed ahead (slow ones none).

The Worker runs in this process on a database of the test's own; statements are told
apart by the transaction ids (xmin) of the rows they wrote. Handlers end together by
waiting on one event, set once all of them run.
"""

from __future__ import annotations

import asyncio

from dashboard import worker as worker_module
from dashboard.store import Store
from dashboard.worker import Worker
from tests.factories import enqueue, todo_row
from tests.test_workers import running_worker, until

TIMEOUT = 60.0


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
    async with running_worker(dsn, "q", handler.handle, owner="batcher", concurrency=5):
        await until(lambda: done(pool, 5), "five completions", within=TIMEOUT)
    assert await statements(pool, "SELECT xmin FROM todos WHERE state = 'done'") == 1


async def test_slots_freed_together_are_claimed_in_one_statement(dsn, pool):
    for n in range(10):
        await enqueue_to(pool, n)
    handler = Together(5)
    async with running_worker(dsn, "q", handler.handle, owner="batcher", concurrency=5):
        await until(lambda: done(pool, 10), "ten completions", within=TIMEOUT)
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

    async with running_worker(dsn, "q", Together(3, result).handle, owner="batcher", concurrency=3):
        await until(lambda: settled(pool, 3), "three acks", within=TIMEOUT)
    for todo in todos:
        row = await todo_row(pool, todo.id)
        if todo.id == bad:
            assert row.state == "failed"  # its one attempt failed
            assert row.last_error.startswith("the handler's result was refused:")
        else:
            assert row.state == "done" and row.result == {"ok": todo.id}


async def test_quick_handlers_get_todos_claimed_ahead_which_a_stop_releases_at_once(dsn, pool, monkeypatch):
    # However long a loaded machine makes the quick handlers take, their pace allows all 3.
    monkeypatch.setattr(worker_module, "AHEAD_WAIT", 60.0)
    gate = asyncio.Event()
    started: list[str] = []

    async def handle(todo):
        if todo.title.startswith("slow"):
            started.append(todo.id)
            await gate.wait()
        return {"ok": True}

    for n in range(3):  # quick ones first: the worker learns its handlers' pace
        await enqueue(Store(pool), title=f"quick{n}")
    worker = Worker(dsn, ["q"], handle, owner="ahead", concurrency=2, prefetch=3, poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: done(pool, 3), "the quick ones", within=TIMEOUT)
        for n in range(10):
            await enqueue(Store(pool), title=f"slow{n}")
        # Two run, three wait claimed ahead, and no more than that is claimed.
        await until(lambda: count(pool, "claimed", 5), "five claimed", within=TIMEOUT)
        await until(lambda: running(started, 2), "two handlers running", within=TIMEOUT)
        assert await count(pool, "pending", 5)
        worker.stop()
        # The three claimed ahead go back at once; the two running keep theirs until they end.
        await until(lambda: count(pool, "claimed", 2), "the ones ahead released", within=TIMEOUT)
        assert await count(pool, "pending", 8)
        gate.set()
    finally:
        worker.stop()
        gate.set()
        await asyncio.wait_for(task, 30)
    assert sorted(started) == sorted(await ids_in(pool, "done", "slow%"))
    released = await pool.fetchval(
        "SELECT count(*) FROM todo_history WHERE event = 'released' AND actor = 'ahead'"
    )
    assert released == 3


async def test_slow_handlers_get_nothing_claimed_ahead(dsn, pool):
    claimed_while_running: list[int] = []

    async def handle(todo):
        claimed_while_running.append(
            await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed'")
        )
        await asyncio.sleep(0.3)  # 0.3 s a todo: one ahead would wait longer than AHEAD_WAIT
        return {"ok": True}

    for n in range(4):
        await enqueue_to(pool, n)
    async with running_worker(dsn, "q", handle, concurrency=1, prefetch=5):
        await until(lambda: done(pool, 4), "four completions", within=TIMEOUT)
    assert claimed_while_running == [1, 1, 1, 1]


# -- helpers -----------------------------------------------------------------------------


async def enqueue_to(pool, n: int):
    return await enqueue(Store(pool), title=f"t{n}", max_attempts=1)


async def done(pool, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'done'") >= n


async def running(started: list, n: int) -> bool:
    return len(started) == n


async def count(pool, state: str, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM todos WHERE state = $1", state) == n


async def ids_in(pool, state: str, title: str) -> list[str]:
    rows = await pool.fetch("SELECT id FROM todos WHERE state = $1 AND title LIKE $2", state, title)
    return [r["id"] for r in rows]


async def settled(pool, n: int) -> bool:
    return await pool.fetchval("SELECT count(*) FROM todos WHERE state IN ('done', 'failed')") >= n
