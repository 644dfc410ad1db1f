"""A real PostgreSQL for every test: the embedded server by default, DATABASE_URL if set.

A template database is migrated once per session; each test gets its own clone
(CREATE DATABASE … TEMPLATE), dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from dashboard import db as dbmod
from dashboard.migrate import apply_migrations
from dashboard.store import Store

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


def with_database(dsn: str, name: str) -> str:
    """The same server URL, pointing at database `name`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


def run(coro):
    """Run a coroutine from sync code (fixtures, Playwright tests) on a fresh loop."""
    return asyncio.run(coro)


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory):
    """The maintenance DSN of the server under test."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    base = Path(os.environ.get("SWITCHBOARD_TEST_DATA") or tempfile.mkdtemp(prefix="sb-test-"))
    server = dbmod.start_embedded(base / "pgdata")
    try:
        yield server.get_uri()
    finally:
        dbmod.release_embedded(server)


@pytest.fixture(scope="session")
def template_db(server_dsn):
    """A migrated template database; dropped at the end of the session."""
    name = f"sb_template_{os.getpid()}"

    async def make():
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        conn = await asyncpg.connect(with_database(server_dsn, name))
        try:
            await apply_migrations(conn)
        finally:
            await conn.close()

    run(make())
    yield name
    run(drop_database(server_dsn, name))


async def drop_database(server_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def make_database(server_dsn: str, template: str | None = None) -> tuple[str, str]:
    """A new database (a clone of `template`, or empty): its name and URL."""
    name = f"sb_test_{os.getpid()}_{next(_counter)}"
    sql = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")

    async def create():
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    run(create())
    return name, with_database(server_dsn, name)


@contextlib.contextmanager
def scratch_database(server_dsn: str, template: str | None = None):
    """`make_database`, dropped on exit; yields its URL."""
    name, url = make_database(server_dsn, template)
    try:
        yield url
    finally:
        run(drop_database(server_dsn, name))


@pytest.fixture
def dsn(server_dsn, template_db):
    """A fresh, migrated database for this test; its URL."""
    with scratch_database(server_dsn, template_db) as url:
        yield url


@pytest.fixture
async def pool(dsn):
    pool = await dbmod.create_pool(dsn, min_size=1, max_size=20)
    yield pool
    await pool.close()


@pytest.fixture
async def conn(dsn):
    conn = await dbmod.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
def store(pool) -> Store:
    return Store(pool)


# -- the web app ---------------------------------------------------------------------

@pytest.fixture
async def app(dsn, pool):
    from dashboard.web.app import create_app, load_secrets

    return create_app(dsn, await load_secrets(dbmod.Database(dsn=dsn, pool=pool)), pool_size=4)


@pytest.fixture
async def client(app):
    """An in-process HTTP client; the app's lifespan (hub, reaper) runs around it."""
    from litestar.testing import AsyncTestClient

    async with AsyncTestClient(app, base_url="http://testserver.local") as client:
        yield client


async def login(client, pool, name: str = "olga", role: str = "operator") -> str:
    """Create an operator and log the client in; returns the CSRF token for later posts."""
    from dashboard.accounts import Accounts

    password = await Accounts(pool).add_operator(name, role)
    await client.get("/login")
    token = client.cookies.get("csrftoken")
    response = await client.post(
        "/login", data={"name": name, "password": password, "_csrf_token": token},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    return token


async def agent_token(pool, agent: str = "bot", queues=("work",)) -> dict:
    """Authorization headers for a new API token."""
    from dashboard.accounts import Accounts

    _, secret = await Accounts(pool).add_token(agent, list(queues))
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="session")
def live_server(server_dsn, template_db, tmp_path_factory):
    """`switchboard serve` in a subprocess on a free port, on its own database.

    Yields (base_url, dsn). Tests share it, so each uses its own queue names.
    """
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    name, url = make_database(server_dsn, template_db)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("live") / "server.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "dashboard.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "DATABASE_URL": url}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{log_path.read_text()}")
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server did not answer:\n{log_path.read_text()}") from None
                time.sleep(0.1)
        yield base, url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        run(drop_database(server_dsn, name))
