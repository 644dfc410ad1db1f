"""A real PostgreSQL for every test: the embedded server by default, DATABASE_URL if set.

A template database is migrated once per session; each test gets its own clone
(CREATE DATABASE … TEMPLATE), dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import asyncio
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
    run(_drop(server_dsn, name))


async def _drop(server_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def make_database(server_dsn: str, template: str) -> tuple[str, str]:
    name = f"sb_test_{os.getpid()}_{next(_counter)}"

    async def clone():
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        finally:
            await conn.close()

    run(clone())
    return name, with_database(server_dsn, name)


@pytest.fixture
def dsn(server_dsn, template_db):
    """A fresh, migrated database for this test; its URL."""
    name, url = make_database(server_dsn, template_db)
    yield url
    run(_drop(server_dsn, name))


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
