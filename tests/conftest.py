"""A real PostgreSQL for every test: the embedded server by default, DATABASE_URL if set.

A template database is migrated once per session; each test gets its own clone
(CREATE DATABASE … TEMPLATE), dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from dashboard import db as dbmod
from dashboard.control import Control
from dashboard.migrate import apply_migrations
from dashboard.store import Store
from tests.factories import agent_token, empty_tables

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


def with_database(dsn: str, name: str) -> str:
    """The same server URL, pointing at database `name`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


def run(coro):
    """Run a coroutine from sync code (fixtures, Playwright tests) on a fresh loop."""
    return asyncio.run(coro)


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory):
    """A switchboard serving an embedded database records itself under XDG_STATE_HOME
    (dashboard/instances.py): the servers tests start record in a folder of the session's,
    never in the real home, and no real one is found by the commands tests run."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory):
    """The maintenance DSN of the server under test."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    given = os.environ.get("SWITCHBOARD_TEST_DATA")
    base = Path(given or tempfile.mkdtemp(prefix="sb-test-"))
    server = dbmod.start_embedded(base / "pgdata")
    try:
        run(_no_fsync(server.get_uri()))
        yield server.get_uri()
    finally:
        dbmod.release_embedded(server)
        if not given and not (base / "pgdata" / "postmaster.pid").exists():
            shutil.rmtree(base, ignore_errors=True)  # its own temporary data dir (about 0.5 GB)


async def _no_fsync(server_dsn: str) -> None:
    """The embedded test server skips fsync: cloning the template (CREATE DATABASE writes
    all of it) takes a third of the time, and commits are cheaper too. A server a test
    kills loses nothing by it, only a machine that goes down would. Never done to a
    DATABASE_URL server."""
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute("ALTER SYSTEM SET fsync = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


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


@contextlib.contextmanager
def analyzed_database(server_dsn: str, template: str, fill: Callable[[asyncpg.Connection], Awaitable]):
    """A scratch database filled by `fill(conn)`, then analyzed: a module's plan tests share
    one, since filling it takes seconds."""

    async def filled(url: str) -> None:
        async with connected(url, asyncpg.connect) as conn:
            await fill(conn)
            await conn.execute("ANALYZE todos")

    with scratch_database(server_dsn, template) as url:
        run(filled(url))
        yield url


@pytest.fixture
def dsn(server_dsn, template_db):
    """A fresh, migrated database for this test; its URL."""
    with scratch_database(server_dsn, template_db) as url:
        yield url


@contextlib.asynccontextmanager
async def connected(dsn: str, connect=dbmod.connect):
    """A connection to `dsn` (the app's settings unless `connect` says otherwise), closed on exit."""
    conn = await connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def pool(dsn):
    pool = await dbmod.create_pool(dsn, min_size=1, max_size=20)
    yield pool
    await pool.close()


@pytest.fixture
async def conn(dsn):
    async with connected(dsn) as conn:
        yield conn


@pytest.fixture
def store(pool) -> Store:
    return Store(pool)


@pytest.fixture
def control(store) -> Control:
    """The operators' writer beside `store`, sharing its claim positions as in the app."""
    return Control(store.db, cursors=store.cursors)


# -- one database for a whole module -------------------------------------------------
# For modules of many small tests: one clone, emptied before each test (far cheaper than
# CREATE DATABASE per test, and every test still starts from nothing). Such a module says
# `pytestmark = ONE_DATABASE_PER_MODULE` and runs on one event loop.

ONE_DATABASE_PER_MODULE = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.usefixtures("fresh_module_db"),
]


@pytest.fixture(scope="module")
def module_dsn(server_dsn, template_db):
    """A migrated database shared by the module's tests; its URL."""
    with scratch_database(server_dsn, template_db) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def module_pool(module_dsn):
    pool = await dbmod.create_pool(module_dsn, min_size=1, max_size=20)
    yield pool
    await pool.close()


@pytest.fixture
def module_store(module_pool) -> Store:
    """A Store per test on the module's pool: its claim positions start afresh."""
    return Store(module_pool)


@pytest.fixture
def module_control(module_store) -> Control:
    return Control(module_store.db, cursors=module_store.cursors)


@pytest_asyncio.fixture(loop_scope="module")
async def fresh_module_db(module_pool):
    """The module's database with its tables emptied, before the test."""
    await empty_tables(module_pool)


# The agent API in process for such a module (helpers: tests/agent_api.py): one app
# (lifespan and LISTEN hub; no reaper, since these tests move time by SQL) and its tokens.


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api_client(module_dsn, module_pool):
    """The real app in process, shared by the module's tests."""
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def bot(module_pool) -> dict:
    """An agent token for queues work and other (not secret)."""
    return await agent_token(module_pool, "bot", ["work", "other"])


@pytest_asyncio.fixture(loop_scope="module")
async def rival(module_pool) -> dict:
    """Another agent's token, for queue work."""
    return await agent_token(module_pool, "rival", ["work"])


# -- the web app ---------------------------------------------------------------------


async def build_app(dsn: str, pool, *, reaper: bool = True):
    """The real app on `dsn`, with the secrets stored there."""
    from dashboard.web.app import create_app, load_config

    config = await load_config(dbmod.Database(dsn=dsn, pool=pool))
    return create_app(dsn, config, reaper=reaper, pool_size=4)


@contextlib.asynccontextmanager
async def in_process(app):
    """An in-process HTTP client; the app's lifespan (hub, and the reaper if it has one) runs
    around it."""
    from litestar.testing import AsyncTestClient

    async with AsyncTestClient(app, base_url="http://testserver.local") as client:
        yield client


@pytest.fixture
async def app(dsn, pool):
    """The app as `switchboard serve` runs it, reaper included."""
    return await build_app(dsn, pool)


@pytest.fixture
async def client(app):
    async with in_process(app) as client:
        yield client


@pytest.fixture
async def app_without_reaper(dsn, pool):
    """The app with no reaper: for tests that move time by SQL (a lease or a retry into the
    past) and then look, before anything but the test itself could act on it."""
    return await build_app(dsn, pool, reaper=False)


@pytest.fixture
async def client_without_reaper(app_without_reaper):
    async with in_process(app_without_reaper) as client:
        yield client


LIVE_HORIZON_WARN_SECONDS = 3


@pytest.fixture(scope="session")
def live_server(server_dsn, template_db, tmp_path_factory):
    """`switchboard serve` in a subprocess on a free port, on its own database.

    Yields (base_url, dsn). Tests share it, so each uses its own queue names. It warns of
    a held-back vacuum horizon after LIVE_HORIZON_WARN_SECONDS, not a minute.
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
        env={
            **os.environ,
            "DATABASE_URL": url,
            "SWITCHBOARD_HORIZON_WARN_SECONDS": str(LIVE_HORIZON_WARN_SECONDS),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
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


@pytest.fixture
async def live_conn(live_server):
    """A connection of the test's own to the live server's database (a producer's, say)."""
    async with connected(live_server[1]) as conn:
        yield conn


@pytest.fixture
def live_store(live_conn) -> Store:
    """A Store on live_conn: a producer or an agent beside the live server."""
    return Store(live_conn)


@pytest.fixture
def live_control(live_store) -> Control:
    """An operator beside the live server."""
    return Control(live_store.db)


# -- the suite's wall time -------------------------------------------------------------
# `python3 dev.py test` is a newcomer's second command: the whole suite stays within
# SUITE_BUDGET_SECONDS on a quiet two-core machine. The load average says whether a slow
# run was the suite or the machine.

SUITE_BUDGET_SECONDS = 600
_started = pytest.StashKey[float]()


def pytest_sessionstart(session):
    session.config.stash[_started] = time.monotonic()


def pytest_terminal_summary(terminalreporter, config):
    took = time.monotonic() - config.stash[_started]
    whole = config.args_source is pytest.Config.ArgsSource.TESTPATHS and not (
        config.option.markexpr or config.option.keyword
    )
    what = "whole suite" if whole else "this run"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    terminalreporter.write_line(
        f"{what}: {took:.0f} s, load average {load} on {os.cpu_count()} cores"
        f" (the whole suite's budget: {SUITE_BUDGET_SECONDS} s on a quiet two-core machine)"
    )
