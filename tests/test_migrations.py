"""Start-up migrations: concurrent start-ups, re-runs, and edited or new files.

Each test gets a fresh, empty database (not the migrated template). The concurrent tests
hold the migrator's advisory lock while both start-ups begin, wait until both are queued
on it, then let go: the two really do race for the same empty database.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time

import asyncpg
import pytest

from dashboard.errors import MigrationError
from dashboard.migrate import ADVISORY_LOCK_KEY, MIGRATIONS_DIR, apply_migrations, load_migrations
from tests.conftest import ROOT, connected, scratch_database

ALL = [m.name for m in load_migrations()]

MIGRATE_SCRIPT = """
import asyncio, json, sys
import asyncpg
from dashboard.migrate import apply_migrations

async def main():
    conn = await asyncpg.connect(sys.argv[1])
    try:
        print(json.dumps(await apply_migrations(conn)))
    finally:
        await conn.close()

asyncio.run(main())
"""


@pytest.fixture
def empty_dsn(server_dsn):
    """A new database with nothing in it; dropped afterwards."""
    with scratch_database(server_dsn) as url:
        yield url


@pytest.fixture
async def empty_conn(empty_dsn):
    """A plain asyncpg connection to it (the app's connection setup needs the schema)."""
    async with connected(empty_dsn, asyncpg.connect) as conn:
        yield conn


async def recorded(conn) -> list[tuple]:
    rows = await conn.fetch("SELECT version, name, checksum FROM schema_migrations ORDER BY 1")
    return [tuple(r) for r in rows]


async def wait_for_lock_waiters(conn, count: int, within: float = 30) -> None:
    """Until `count` sessions wait for the migrator's advisory lock in this database."""
    deadline = time.monotonic() + within
    while True:
        waiting = await conn.fetchval(
            """SELECT count(*) FROM pg_locks
               WHERE locktype = 'advisory' AND NOT granted AND objid = $1
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())""",
            ADVISORY_LOCK_KEY,
        )
        if waiting >= count:
            return
        assert time.monotonic() < deadline, f"only {waiting} of {count} start-ups reached the lock"
        await asyncio.sleep(0.02)


def expected_records() -> list[tuple]:
    return [(m.version, m.name, m.checksum) for m in load_migrations()]


async def test_two_concurrent_start_ups_on_connections_apply_each_migration_once(empty_dsn, empty_conn):
    first, second = await asyncpg.connect(empty_dsn), await asyncpg.connect(empty_dsn)
    try:
        await empty_conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
        both = asyncio.gather(apply_migrations(first), apply_migrations(second))
        await wait_for_lock_waiters(empty_conn, 2)
        await empty_conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
        results = await asyncio.wait_for(both, 30)
    finally:
        await first.close()
        await second.close()

    assert sorted(results) == [[], ALL]
    assert await recorded(empty_conn) == expected_records()
    assert await empty_conn.fetchval("SELECT to_regclass('todos') IS NOT NULL")


async def test_two_concurrent_start_up_processes_apply_each_migration_once(empty_dsn, empty_conn):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    await empty_conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    procs = []
    try:
        for _ in range(2):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    MIGRATE_SCRIPT,
                    empty_dsn,
                    cwd=ROOT,
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        await wait_for_lock_waiters(empty_conn, 2)
        await empty_conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
        outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 60)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    applied = sorted(json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outputs)
    assert applied == [[], ALL]
    assert await recorded(empty_conn) == expected_records()


async def test_a_second_start_up_applies_nothing(empty_conn):
    assert await apply_migrations(empty_conn) == ALL
    before = await empty_conn.fetch("SELECT * FROM schema_migrations ORDER BY version")
    assert await apply_migrations(empty_conn) == []
    assert await empty_conn.fetch("SELECT * FROM schema_migrations ORDER BY version") == before


async def test_an_edited_applied_migration_stops_start_up_naming_the_file(empty_conn, tmp_path):
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    assert await apply_migrations(empty_conn, directory) == ALL
    before = await recorded(empty_conn)

    edited = directory / ALL[0]
    edited.write_text(edited.read_text() + "\n-- an innocent-looking edit\n")
    with pytest.raises(MigrationError) as exc:
        await apply_migrations(empty_conn, directory)
    assert ALL[0] in str(exc.value)
    assert "changed after it was applied" in str(exc.value)
    assert await recorded(empty_conn) == before

    # The failed start-up let go of the lock: an untouched copy starts up fine.
    assert await apply_migrations(empty_conn) == []


async def test_a_new_migration_file_is_applied_on_the_next_start_up(empty_conn, tmp_path):
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    assert await apply_migrations(empty_conn, directory) == ALL

    (directory / "9001_extra.sql").write_text("CREATE TABLE extra_for_test (x int);")
    assert await apply_migrations(empty_conn, directory) == ["9001_extra.sql"]
    assert [r[1] for r in await recorded(empty_conn)] == [*ALL, "9001_extra.sql"]
    assert await empty_conn.fetchval("SELECT to_regclass('extra_for_test') IS NOT NULL")


async def test_a_failing_migration_is_rolled_back_and_not_recorded(empty_conn, tmp_path):
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, directory)
    (directory / "9001_broken.sql").write_text("CREATE TABLE half_done (x int);\nSELECT 1 / 0;\n")
    with pytest.raises(asyncpg.DivisionByZeroError):
        await apply_migrations(empty_conn, directory)
    assert [r[1] for r in await recorded(empty_conn)] == ALL
    assert await empty_conn.fetchval("SELECT to_regclass('half_done') IS NULL")

    (directory / "9001_broken.sql").write_text("CREATE TABLE half_done (x int);\n")
    assert await apply_migrations(empty_conn, directory) == ["9001_broken.sql"]
