"""Hints after the commit (DESIGN.md, "Notifications"), against a real `switchboard serve`.

No trigger calls pg_notify inside a producer's or an agent's transaction any more: the
process that committed sends the hint afterwards — through its Hub, coalesced, or by a
statement of its own without one. A waiting long-poll claim and the Python worker wake on
work enqueued by another process within a second, far sooner than they poll; work written
by plain SQL sends no hint and is found by the poll. (The open page's side is in
tests/browser/test_dashboard_browser.py.)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from dashboard import db as dbmod
from dashboard.agents import POLL_FALLBACK, POLL_JITTER
from dashboard.notify import Hub
from dashboard.store import Store
from dashboard.worker import Worker
from tests.conftest import ROOT
from tests.factories import agent_token, enqueue, new_todo, unique
from tests.test_longpoll import claims, live_http

WAKE_WITHIN = 1.0  # seconds; every waiter polls far less often than this


async def insert_by_plain_sql(conn, queue: str, title: str) -> str:
    """A todo written the way a script outside switchboard would: no store, so no hint."""
    return await conn.fetchval(
        "INSERT INTO todos (id, queue, title) VALUES ('td_' || gen_random_uuid(), $1, $2) RETURNING id",
        queue,
        title,
    )


async def waiting_claim(http, headers: dict, queue: str, wait: float) -> asyncio.Task:
    """A long-poll claim, started and given time to find nothing and wait."""
    task = asyncio.create_task(claims(http, headers, queue, wait=wait))
    await asyncio.sleep(0.5)
    assert not task.done(), "the claim should be waiting: the queue is empty"
    return task


async def test_no_trigger_sends_hints_from_inside_a_transaction(live_conn):
    triggers = await live_conn.fetch(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'todos'::regclass AND NOT tgisinternal"
    )
    assert triggers == []


async def test_a_waiting_claim_wakes_on_work_another_processs_hub_hinted(live_server, live_conn):
    queue = unique("hub")
    headers = await agent_token(live_conn, "hinted", [queue])
    hub = Hub(live_server[1])
    await hub.start()
    pool = await dbmod.create_pool(live_server[1], min_size=1, max_size=2)
    try:
        async with live_http(live_server) as http:
            waiting = await waiting_claim(http, headers, queue, wait=15)
            enqueued_at = time.monotonic()
            todo = (await Store(pool, hints=hub).create(new_todo(queue, "hinted by a hub"))).todo
            response = await waiting
            latency = time.monotonic() - enqueued_at
    finally:
        await pool.close()
        await hub.stop()
    assert response.status_code == 200, response.text
    assert response.json()["id"] == todo.id
    assert latency < WAKE_WITHIN, f"woke {latency:.2f}s after the commit"


async def test_a_waiting_claim_finds_work_written_by_plain_sql_within_the_poll_interval(
    live_server, live_conn
):
    queue = unique("sql")
    headers = await agent_token(live_conn, "poller", [queue])
    async with live_http(live_server) as http:
        waiting = await waiting_claim(http, headers, queue, wait=POLL_FALLBACK * 3)
        inserted_at = time.monotonic()
        todo_id = await insert_by_plain_sql(live_conn, queue, "no hint for me")
        response = await waiting
        latency = time.monotonic() - inserted_at
    assert response.status_code == 200, response.text
    assert response.json()["id"] == todo_id
    assert latency < POLL_FALLBACK * (1 + POLL_JITTER) + 1.5, f"found {latency:.2f}s after the insert"


@pytest.fixture
async def worker_run(live_server):
    """Start a Python Worker in this process on a queue; yields (start, handled) where
    `start(poll_interval)` starts it and `handled` gets (todo id, monotonic time) per todo."""
    handled: asyncio.Queue = asyncio.Queue()
    workers: list[tuple[Worker, asyncio.Task]] = []

    async def handler(todo):
        handled.put_nowait((todo.id, time.monotonic()))
        return {"ok": True}

    async def start(queue: str, poll_interval: float) -> None:
        worker = Worker(live_server[1], [queue], handler, owner="py-worker", poll_interval=poll_interval)
        task = asyncio.create_task(worker.run())
        workers.append((worker, task))
        await asyncio.sleep(0.5)  # subscribed and waiting, having found nothing

    yield start, handled
    for worker, task in workers:
        worker.stop()
        await asyncio.wait_for(task, 15)


async def test_the_python_worker_wakes_on_work_enqueued_by_another_process(worker_run, live_server):
    start, handled = worker_run
    queue = unique("pyw")
    await start(queue, poll_interval=60)  # only a hint can wake it in time
    command = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "dashboard.cli", "enqueue", queue, "from the command line"),
        env={**os.environ, "DATABASE_URL": live_server[1], "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(command.communicate(), 60)
    committed_at = time.monotonic()  # the command has exited: its todo and hint are sent
    assert command.returncode == 0, stderr.decode()
    todo_id, at = await asyncio.wait_for(handled.get(), 10)
    assert todo_id in stdout.decode()
    assert at - committed_at < WAKE_WITHIN, f"handled {at - committed_at:.2f}s after the enqueue"


async def test_the_python_worker_finds_work_written_by_plain_sql_at_its_next_poll(worker_run, live_conn):
    start, handled = worker_run
    queue = unique("pys")
    await start(queue, poll_interval=1.0)
    inserted_at = time.monotonic()
    todo_id = await insert_by_plain_sql(live_conn, queue, "no hint for me")
    got, at = await asyncio.wait_for(handled.get(), 10)
    assert got == todo_id
    assert at - inserted_at < 1.0 + 1.0


async def test_a_store_without_a_hub_still_hints_its_own_commits(live_server, live_conn):
    """The CLI's and tests' Store(connection): a statement of its own after the commit."""
    queue = unique("inline")
    headers = await agent_token(live_conn, "inline", [queue])
    async with live_http(live_server) as http:
        waiting = await waiting_claim(http, headers, queue, wait=15)
        enqueued_at = time.monotonic()
        await enqueue(Store(live_conn), queue, "hinted inline")
        response = await waiting
    assert response.status_code == 200
    assert time.monotonic() - enqueued_at < WAKE_WITHIN
