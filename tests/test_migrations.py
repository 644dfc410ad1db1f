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
from dashboard.store import Store
from tests.conftest import ROOT, connected, scratch_database
from tests.factories import enqueue

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


def migrations_before(tmp_path, number: int):
    """A directory of the migrations numbered below `number`: the schema as it was then."""
    directory = tmp_path / "migrations"
    directory.mkdir()
    for name in ALL:
        if int(name.split("_", 1)[0]) < number:
            shutil.copy(MIGRATIONS_DIR / name, directory / name)
    return directory


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


# -- 0004: the actor kind, backfilled from what old rows recorded --------------------------

# (from, to, actor, note) as rows were written before 0004 → (actor_kind, actor) after.
OLD_HISTORY = [
    ((None, "pending", "operator:olga", "created"), ("operator", "olga")),
    (("pending", "pending", "operator:olga", "duplicate delivery collapsed"), ("operator", "olga")),
    ((None, "pending", "agent:mailer-1", "created"), ("agent", "mailer-1")),
    (("claimed", "claimed", "agent:mailer-1", "duplicate delivery collapsed"), ("agent", "mailer-1")),
    ((None, "pending", "producer", "created"), ("producer", "producer")),
    ((None, "pending", "cli", "created"), ("producer", "cli")),
    (("pending", "claimed", "mailer-1", "claimed"), ("agent", "mailer-1")),
    (("claimed", "claimed", "mailer-1", "heartbeat"), ("agent", "mailer-1")),
    (("claimed", "pending", "reaper", "lease expired (owner mailer-1)"), ("system", "reaper")),
    (("claimed", "failed", "reaper", "lease expired (owner mailer-1)"), ("system", "reaper")),
    (("pending", "pending", "reaper", "retry due"), ("system", "reaper")),
    (("failed", "pending", "operator:olga", "retried by operator: fresh budget"), ("operator", "olga")),
    (("failed", "pending", "op-ann", "retried by operator: one more attempt"), ("operator", "op-ann")),
    ((None, "pending", "ingest", "created"), ("producer", "ingest")),
    (("claimed", "pending", "operator:olga", "lease force-released (was held by w1)"), ("operator", "olga")),
    # Agents whose owner names look like another kind's stay agents, names untouched.
    (("pending", "claimed", "operator:admin", "claimed by id"), ("agent", "operator:admin")),
    (("claimed", "pending", "operator:admin", "released"), ("agent", "operator:admin")),
    (("claimed", "done", "operator:admin", "completed"), ("agent", "operator:admin")),
    (
        ("claimed", "pending", "operator:admin", "retried by operator: fresh budget"),
        ("agent", "operator:admin"),
    ),
    (("pending", "claimed", "agent:mailer-1", "claimed"), ("agent", "agent:mailer-1")),
    (("pending", "claimed", "reaper", "claimed"), ("agent", "reaper")),
    (("claimed", "done", "producer", "completed"), ("agent", "producer")),
]


async def test_0004_backfills_each_old_actor_form_into_its_kind_and_bare_name(empty_conn, tmp_path):
    before_0004 = migrations_before(tmp_path, 4)
    assert await apply_migrations(empty_conn, before_0004) == [n for n in ALL if n < "0004"]
    await empty_conn.execute("INSERT INTO todos (id, queue, title) VALUES ('td_old', 'q', 'old')")
    await empty_conn.executemany(
        "INSERT INTO todo_history (todo_id, from_state, to_state, actor, attempt, note) "
        "VALUES ('td_old', $1, $2, $3, 0, $4)",
        [old for old, _ in OLD_HISTORY],
    )

    assert "0004_actor_kind.sql" in await apply_migrations(empty_conn)

    rows = await empty_conn.fetch("SELECT actor_kind, actor FROM todo_history ORDER BY id")
    got = [(old, tuple(r)) for (old, _), r in zip(OLD_HISTORY, rows, strict=True)]
    assert got == OLD_HISTORY
    # From here on every insert names its kind, and only the four kinds exist.
    with pytest.raises(asyncpg.NotNullViolationError):
        await empty_conn.execute(
            "INSERT INTO todo_history (todo_id, to_state, actor, attempt) "
            "VALUES ('td_old', 'pending', 'x', 0)"
        )
    with pytest.raises(asyncpg.CheckViolationError):
        await empty_conn.execute(
            "INSERT INTO todo_history (todo_id, to_state, actor_kind, actor, attempt) "
            "VALUES ('td_old', 'pending', 'admin', 'x', 0)"
        )


# -- 0007: ready_at, backfilled for the todos pending at the upgrade -----------------------


async def test_0007_gives_pending_todos_their_old_claim_position_and_keeps_them_in_order(
    empty_conn, tmp_path
):
    before_0007 = migrations_before(tmp_path, 7)
    await apply_migrations(empty_conn, before_0007)
    await empty_conn.execute(
        """INSERT INTO todos (id, queue, title, created_at, next_retry_at, attempt) VALUES
               ('td_old', 'q', 'old', now() - interval '2 hours', NULL, 0),
               ('td_new', 'q', 'new', now() - interval '1 hour', NULL, 0),
               ('td_retrying', 'q', 'retrying', now() - interval '3 hours', now() + interval '1 hour', 1);
           INSERT INTO todos (id, queue, title, state, owner, attempt, completed_at)
           VALUES ('td_done', 'q', 'done', 'done', 'w', 1, now())"""
    )

    assert await apply_migrations(empty_conn) == [n for n in ALL if n >= "0007"]

    rows = {
        r["id"]: r
        for r in await empty_conn.fetch("SELECT id, ready_at, created_at, next_retry_at FROM todos")
    }
    assert rows["td_old"]["ready_at"] == rows["td_old"]["created_at"]
    assert rows["td_new"]["ready_at"] == rows["td_new"]["created_at"]
    assert rows["td_retrying"]["ready_at"] == rows["td_retrying"]["next_retry_at"]
    assert rows["td_done"]["ready_at"] is None  # finished before: ready_at means nothing
    claimed = await Store(empty_conn).claim_batch(["q"], "w", 30, 10)
    assert [t.id for t in claimed] == ["td_old", "td_new"]  # the retry is not due
    # A retry time written by plain SQL must move ready_at with it.
    with pytest.raises(asyncpg.CheckViolationError):
        await empty_conn.execute("UPDATE todos SET next_retry_at = now() WHERE id = 'td_retrying'")


# -- 0015: history partitioned by day, moved in place --------------------------------------


async def test_0015_moves_a_populated_history_into_daily_partitions_in_place(empty_conn, tmp_path):
    before_0015 = migrations_before(tmp_path, 15)
    await apply_migrations(empty_conn, before_0015)
    store = Store(empty_conn)
    todos = [await enqueue(store, title=f"t{n}") for n in range(20)]
    for _ in range(10):
        [held] = await store.claim_batch(["q"], "w1", 30, 1)
        await store.complete(held.id, "w1", held.lease_token)
    await empty_conn.execute("UPDATE todo_history SET at = at - interval '40 days' WHERE id % 3 = 0")
    old_rows = [tuple(r) for r in await empty_conn.fetch("SELECT * FROM todo_history ORDER BY id")]
    last_id = await empty_conn.fetchval("SELECT max(id) FROM todo_history")

    assert await apply_migrations(empty_conn) == [n for n in ALL if n >= "0015"]

    assert [tuple(r) for r in await empty_conn.fetch("SELECT * FROM todo_history ORDER BY id")] == old_rows
    assert await empty_conn.fetchval("SELECT relkind FROM pg_class WHERE relname = 'todo_history'") == b"p"
    assert await empty_conn.fetchval("SELECT count(*) FROM todo_history_default") == 0
    old = await empty_conn.fetchval("SELECT count(*) FROM todo_history WHERE at < now() - interval '30 days'")
    assert old == sum(1 for row in old_rows if row[0] % 3 == 0) > 0  # in the first partition
    new = await enqueue(store, title="after")
    new_ids = [
        r["id"] for r in await empty_conn.fetch("SELECT id FROM todo_history WHERE todo_id = $1", new.id)
    ]
    assert min(new_ids) > last_id  # the sequence goes on: rollups read by id
    # No foreign key: deleting a todo leaves its history to its day.
    await empty_conn.execute("DELETE FROM todos WHERE id = $1", todos[0].id)
    assert await empty_conn.fetchval("SELECT count(*) FROM todo_history WHERE todo_id = $1", todos[0].id) == 3


# -- 0017: the row's invariants in one CHECK ------------------------------------------------

# Each breaks one invariant the ten constraints before 0017 held, from a pending todo.
BROKEN_ROWS = {
    "queue name": "queue = 'Not A Queue'",
    "attempt below 0": "attempt = -1",
    "no attempts allowed": "max_attempts = 0",
    "priority above 10": "priority = 11",
    "claimed without a lease": "state = 'claimed', owner = 'w'",
    "a lease while pending": "lease_expires_at = now()",
    "claimed without an owner": "state = 'claimed', lease_expires_at = now()",
    "done without completed_at": "state = 'done'",
    "completed_at while pending": "completed_at = now()",
    "pending without ready_at": "ready_at = NULL",
    "a retry time that is not ready_at": "next_retry_at = now() + interval '1 hour'",
    "a retry time while failed": "state = 'failed', completed_at = now(), next_retry_at = ready_at",
    "cancelled while pending": "cancelled_at = now(), cancelled_by = 'op', cancelled_by_kind = 'operator'",
    "cancelled by nobody": "state = 'failed', completed_at = now(), cancelled_at = now()",
}


@pytest.mark.parametrize("change", BROKEN_ROWS.values(), ids=BROKEN_ROWS.keys())
async def test_0017_one_check_refuses_what_each_of_the_ten_refused(empty_conn, change):
    await apply_migrations(empty_conn)
    checks = await empty_conn.fetch(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'todos'::regclass AND contype = 'c'"
    )
    assert [r["conname"] for r in checks] == ["todo_row_consistent"]
    await empty_conn.execute("INSERT INTO todos (id, queue, title) VALUES ('td_x', 'q', 'x')")
    with pytest.raises(asyncpg.CheckViolationError) as refused:
        await empty_conn.execute(f"UPDATE todos SET {change} WHERE id = 'td_x'")
    assert refused.value.constraint_name == "todo_row_consistent"
    # and the row's legal moves still pass it
    await empty_conn.execute(
        "UPDATE todos SET state = 'failed', completed_at = now(), cancelled_at = now(), "
        "cancelled_by = 'op', cancelled_by_kind = 'operator' WHERE id = 'td_x'"
    )
