"""The app through PgBouncer in session pooling (README "PgBouncer"), with PgBouncer's
defaults: no `ignore_startup_parameters`, so the app must send no startup parameter that
PgBouncer refuses. `switchboard serve` runs with DATABASE_URL pointing at PgBouncer; the
API, the reference worker and a hint wake-up are checked through it.

PgBouncer is Debian's `pgbouncer` package; without it these tests are skipped, except in CI
(CI set), where they fail. Every process is stopped by pid.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.agents import POLL_FALLBACK, POLL_JITTER
from dashboard.notify import APPLICATION_NAME, listen_connection
from tests.conftest import connected
from tests.processes import eventually, free_port, spawn, start_serving, stop
from tests.test_hints import waiting_claim
from tests.test_session_settings import OURS, SET_BY_US, settings

pytestmark = pytest.mark.slow

API = "/api/v1"
# A waiting claim that a hint woke answers well before its first poll (POLL_FALLBACK less
# its jitter after it began waiting; waiting_claim waits 0.5 s of that before the create).
HINTED_WITHIN = 3.0
assert HINTED_WITHIN < POLL_FALLBACK * (1 - POLL_JITTER) - 0.5
DOUBLE = "import json, sys; print(json.dumps({'n': json.load(sys.stdin)['payload']['n'] * 2}))"


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("PgBouncer is missing: CI must test through it (Debian: apt-get install pgbouncer)")
    pytest.skip("PgBouncer is not installed (Debian: apt-get install pgbouncer)")


@pytest.fixture
def pgbouncer(dsn, tmp_path):
    """PgBouncer on a free port in front of the test's database, in session pooling; yields
    the URL through it."""
    binary = pgbouncer_binary()
    parts = urlsplit(dsn)
    host = parse_qs(parts.query).get("host", [parts.hostname or "localhost"])[0]
    name = parts.path.lstrip("/")
    server = f"host={host} port={parts.port or 5432} dbname={name} user={parts.username or 'postgres'}"
    if parts.password:
        server += f" password={parts.password}"
    port = free_port()
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        textwrap.dedent(f"""\
        [databases]
        {name} = {server}
        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = {port}
        unix_socket_dir =
        auth_type = any
        pool_mode = session
        """)
    )
    # PgBouncer will not run as root: then it runs as the owner of the server's socket
    # directory (the embedded server's own user), which may reach the socket.
    run_as = []
    if os.geteuid() == 0:
        owner = Path(host).stat().st_uid if host.startswith("/") else 0
        run_as = ["-u", pwd.getpwuid(owner).pw_name if owner else "nobody"]
    log = tmp_path / "pgbouncer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([binary, *run_as, str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "process up" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"PgBouncer did not start:\n{log.read_text()}"
            )
            time.sleep(0.05)
        yield f"postgresql://postgres@127.0.0.1:{port}/{name}"
    finally:
        stop(proc)


async def test_our_session_settings_and_application_name_reach_the_server_through_pgbouncer(pgbouncer):
    pool = await dbmod.create_pool(pgbouncer, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            assert await settings(conn, OURS) == SET_BY_US
    finally:
        await pool.close()
    conn = await listen_connection(pgbouncer)
    try:
        shown = await settings(conn, [*OURS, "synchronous_commit", "application_name"])
        assert shown.pop("application_name")[0] == APPLICATION_NAME  # PgBouncer SETs it on the server
        assert shown == {**SET_BY_US, "synchronous_commit": ("off", "session")}
    finally:
        await conn.close()


def create(http: httpx.AsyncClient, headers: dict, queue: str, title: str, **body):
    return http.post(f"{API}/todos", headers=headers, json={"queue": queue, "title": title, **body})


async def test_the_api_the_reference_worker_and_hints_work_through_pgbouncer_in_session_pooling(
    pgbouncer, tmp_path
):
    env = {**os.environ, "DATABASE_URL": pgbouncer, "PYTHONUNBUFFERED": "1"}
    async with connected(pgbouncer) as conn:
        _, secret = await Accounts(conn).add_token("bounced", ["hinted", "work"])
    headers = {"Authorization": f"Bearer {secret}"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    web = start_serving(["serve", "--port", str(port)], env, tmp_path / "serve.log")
    worker = None
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            ready = await eventually(lambda: http.get("/readyz"), lambda r: r.status_code == 200, within=30)
            assert ready.status_code == 200

            waiting = await waiting_claim(http, headers, "hinted", wait=15)
            created_at = time.monotonic()
            created = await create(http, headers, "hinted", "wake")
            claimed = await waiting
            latency = time.monotonic() - created_at
            assert created.status_code == 201, created.text
            assert claimed.status_code == 200, claimed.text
            assert claimed.json()["id"] == created.json()["todo"]["id"]
            assert latency < HINTED_WITHIN, f"the waiting claim answered {latency:.2f}s after the create"

            ids = []
            for n in range(5):
                response = await create(http, headers, "work", f"n={n}", payload={"n": n})
                assert response.status_code == 201, response.text
                ids.append(response.json()["todo"]["id"])
            script = tmp_path / "double.py"
            script.write_text(DOUBLE)
            command = ["--queue", "work", "--exec", f"{sys.executable} {script}", "--url", base]
            worker = spawn(
                ["-m", "dashboard.cli", "worker", *command, "--token", secret, "--ttl", "10", "--wait", "2"],
                env,
                tmp_path / "worker.log",
            )

            async def todos():
                return [(await http.get(f"{API}/todos/{i}", headers=headers)).json()["todo"] for i in ids]

            done = await eventually(todos, lambda ts: all(t["state"] == "done" for t in ts), within=60)
            assert [t["result"] for t in done] == [{"n": n * 2} for n in range(5)]
            assert {t["owner"] for t in done} == {"bounced"}
            assert stop(worker) == 0, (tmp_path / "worker.log").read_text()
    finally:
        if worker is not None:
            stop(worker)
        stop(web)
