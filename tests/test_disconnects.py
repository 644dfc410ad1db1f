"""Claims and waits end with their client (issue 24, "claims for nobody").

A long-poll claim whose client has gone must not claim the next todo that arrives: nobody
would hold it until its lease ran out, and an attempt would be spent (a todo with
max_attempts 1 dead-lettered without ever being worked). The wait ends when the client
disconnects, and a claim that raced the disconnect is given back: pending, the attempt
not counted, its history saying why. Against a real `switchboard serve` of this module's
own, whose access log says when each request's handler ended; clients are raw sockets
closed mid-wait and the reference worker stopped by SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from dashboard.accounts import Accounts
from dashboard.store import Store
from tests.conftest import ROOT, connected
from tests.factories import agent_token, enqueue, history, todo_row, unique
from tests.processes import stop
from tests.test_server_limits import module_db, serving  # noqa: F401 - module_db is a fixture

pytestmark = pytest.mark.slow
WAIT = 30  # seconds a ghost's long-poll asks for: far longer than any test waits for it
ENDED_WITHIN = 10.0  # seconds for the server to end a handler whose client has gone


@pytest.fixture(scope="module")
def served(module_db, tmp_path_factory):  # noqa: F811 - the fixture imported above
    log = tmp_path_factory.mktemp("disconnects") / "serve.log"
    with serving(module_db, log) as served:
        yield served


def ended(served, line: str) -> int:
    """How many requests the server's access log shows ended with `line` (method, route, status)."""
    return sum(1 for entry in served.log.read_text().splitlines() if f" {line} " in entry + " ")


async def until_ended(served, line: str, count: int) -> None:
    deadline = time.monotonic() + ENDED_WITHIN
    while ended(served, line) < count:
        assert time.monotonic() < deadline, f"no {count}th '{line}' in the log after {ENDED_WITHIN}s"
        await asyncio.sleep(0.05)


async def ghost_request(port: int, method: str, path: str, headers: dict, body: dict | None = None):
    """Send a request on a raw socket and return its writer: closing it is the client going."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    content = json.dumps(body).encode() if body is not None else b""
    head = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(content)}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        head.append("Content-Type: application/json")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + content)
    await writer.drain()
    return reader, writer


async def claimed_by(dsn: str, owner: str, queue: str) -> list:
    async with connected(dsn) as conn:
        return await conn.fetch(
            "SELECT h.todo_id, h.event FROM todo_history h JOIN todos t ON t.id = h.todo_id "
            "WHERE t.queue = $1 AND h.actor = $2 AND h.event IN ('claimed', 'given_back') ORDER BY h.id",
            queue,
            owner,
        )


async def test_a_long_poll_whose_client_went_ends_and_claims_nothing_that_arrives_after(served):
    queue = unique("gone")
    async with connected(served.dsn) as conn:
        headers = await agent_token(conn, "ghost", [queue])
        before = ended(served, "POST /api/v1/claims 204")
        body = {"queues": [queue], "ttl": 3600, "wait": WAIT}
        _, writer = await ghost_request(served.port, "POST", "/api/v1/claims", headers, body)
        await asyncio.sleep(0.5)  # let it reach its wait (closing earlier proves less)
        writer.close()
        await until_ended(served, "POST /api/v1/claims 204", before + 1)
        todo = await enqueue(Store(conn), queue, "arrives after the client went", max_attempts=1)
        row = await todo_row(conn, todo.id)
    assert (row.state, row.owner, row.attempt) == ("pending", None, 0)
    assert await claimed_by(served.dsn, "ghost", queue) == []


async def test_claims_that_race_their_clients_going_are_given_back_uncounted(served):
    """Twenty long-polls close and at once twenty todos arrive: whichever claims happen
    before the server sees a client go are given back, so every todo ends pending at
    attempt 0."""
    queue = unique("race")
    async with connected(served.dsn) as conn:
        headers = await agent_token(conn, "racer", [queue])
        before = ended(served, "POST /api/v1/claims 204")
        body = {"queues": [queue], "ttl": 3600, "wait": WAIT}
        ghosts = [
            await ghost_request(served.port, "POST", "/api/v1/claims", headers, body) for _ in range(20)
        ]
        await asyncio.sleep(0.5)  # let them reach their wait
        store = Store(conn)
        for _, writer in ghosts:
            writer.close()
        made = [(await enqueue(store, queue, f"n={i}", max_attempts=1)).id for i in range(20)]
        await until_ended(served, "POST /api/v1/claims 204", before + 20)
        rows = [await todo_row(conn, todo_id) for todo_id in made]
        steps = {todo_id: await history(conn, todo_id) for todo_id in made}
    assert [(r.state, r.owner, r.attempt) for r in rows] == [("pending", None, 0)] * 20
    for todo_id, todo_steps in steps.items():
        claims = [s for s in todo_steps if s.to_state == "claimed"]
        given = [s for s in todo_steps if (s.note or "").startswith("given back")]
        assert len(claims) == len(given), (todo_id, todo_steps)  # each claim given back
    events = await claimed_by(served.dsn, "racer", queue)
    assert [e["event"] for e in events].count("claimed") == [e["event"] for e in events].count("given_back")


async def test_a_wait_for_a_result_ends_when_its_client_goes(served):
    queue = unique("wt")
    async with connected(served.dsn) as conn:
        headers = await agent_token(conn, "waiter", [queue])
        todo = await enqueue(Store(conn), queue, "never finished")
    line = "GET /api/v1/todos/{todo_id} 200"
    before = ended(served, line)
    _, writer = await ghost_request(served.port, "GET", f"/api/v1/todos/{todo.id}?wait={WAIT}", headers)
    await asyncio.sleep(0.5)
    assert ended(served, line) == before, "the wait answered before anything happened"
    writer.close()
    await until_ended(served, line, before + 1)


async def test_a_live_long_poll_still_gets_its_todo(served):
    """Watching for the client's going does not end a wait whose client is still there."""
    queue = unique("live")
    async with connected(served.dsn) as conn:
        headers = await agent_token(conn, "alive", [queue])
        async with httpx.AsyncClient(base_url=served.base, timeout=WAIT + 5) as http:
            body = {"queues": [queue], "ttl": 60, "wait": WAIT}
            waiting = asyncio.create_task(http.post("/api/v1/claims", headers=headers, json=body))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            todo = await enqueue(Store(conn), queue, "for the live one")
            response = await asyncio.wait_for(waiting, 10)
    assert response.status_code == 200, response.text
    assert (response.json()["id"], response.json()["attempt"]) == (todo.id, 1)


async def test_the_reference_worker_stopped_while_waiting_leaves_nothing_claimed(served, tmp_path):
    """Twenty times: a worker waits for work (its long-poll in flight), is stopped with
    SIGTERM, and three todos arrive; another agent then claims all three, each at its
    first attempt: the stopped worker's claim took none for good."""
    queue = unique("stop")
    async with connected(served.dsn) as conn:
        _, secret = await Accounts(conn).add_token("stopped", [queue])
        live = await agent_token(conn, "taker", [queue])
        store = Store(conn)
        for round_ in range(20):
            log = tmp_path / f"worker-{round_}.log"
            worker = start_worker(served, queue, secret, log)
            try:
                await until_waiting(served, worker, log)
            finally:
                assert stop(worker) == 0, log.read_text()
            made = [(await enqueue(store, queue, f"r{round_}-{i}")).id for i in range(3)]
            taken = await take_all(served, live, queue, 3)
            assert sorted(t["id"] for t in taken) == sorted(made), round_
            assert all(t["attempt"] == 1 for t in taken), (round_, taken)
    events = [e["event"] for e in await claimed_by(served.dsn, "stopped", queue)]
    assert events.count("claimed") == events.count("given_back"), events


def start_worker(served, queue: str, secret: str, log: Path) -> subprocess.Popen:
    """`switchboard worker` on `queue`, waiting up to WAIT seconds for work, in batches of 5."""
    args = ["--queue", queue, "--url", served.base, "--token", secret, "--batch", "5", "--wait", str(WAIT)]
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dashboard.cli", "worker", *args, "--exec", "cat"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def until_waiting(served, worker: subprocess.Popen, log: Path) -> None:
    """Until the worker's long-poll is in flight: it holds a connection to the server."""
    text = log.read_text
    deadline = time.monotonic() + 30
    while not any(
        c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == served.port
        for c in psutil.Process(worker.pid).net_connections("tcp")
    ):
        assert worker.poll() is None, text()
        assert time.monotonic() < deadline, f"the worker never connected:\n{text()}"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # its claim goes out as soon as it is connected: let it reach its wait


async def take_all(served, headers: dict, queue: str, n: int) -> list[dict]:
    """Claim until `n` todos are held (a todo given back becomes claimable again)."""
    taken: list[dict] = []
    deadline = time.monotonic() + ENDED_WITHIN
    async with httpx.AsyncClient(base_url=served.base, timeout=30) as http:
        while len(taken) < n:
            assert time.monotonic() < deadline, f"only {len(taken)} of {n} claimable: {taken}"
            body = {"queues": [queue], "ttl": 60, "wait": 1, "max": n - len(taken)}
            response = await http.post("/api/v1/claims", headers=headers, json=body)
            assert response.status_code == 200, response.text
            taken += response.json()["todos"]
    return taken
