"""History partitioned by UTC day (migration 0015, docs/concepts.md "History retention"):
days made ahead, whole days dropped past retention, rows of a day without its partition
kept in the default one and moved in later, a lock waited for briefly, and a populated
database upgraded in place (tests/test_migrations.py).

Each test has a database of its own (`dsn`), since they drop partitions.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, date, timedelta

import asyncpg

from dashboard import history_partitions
from dashboard.store import Store
from tests.conftest import connected
from tests.factories import enqueue

PARTITIONS = """
    SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'todo_history'::regclass ORDER BY c.relname
"""
ADD_STEP = """
    INSERT INTO todo_history (todo_id, at, to_state, actor_kind, actor, attempt, note)
    VALUES ($1, $2, 'pending', 'system', 'test', 0, $3)
"""


def day_name(day: date) -> str:
    return f"todo_history_p{day:%Y%m%d}"


async def utc_today(conn) -> date:
    return await conn.fetchval("SELECT (now() AT TIME ZONE 'UTC')::date")


async def partition_of(conn, note: str) -> str | None:
    return await conn.fetchval("SELECT tableoid::regclass::text FROM todo_history WHERE note = $1", note)


async def test_a_database_has_a_partition_per_day_ahead_and_one_for_everything_older(conn):
    today = await utc_today(conn)
    names = [r["relname"] for r in await conn.fetch(PARTITIONS)]
    ahead = [day_name(today + timedelta(days=n)) for n in range(history_partitions.AHEAD_DAYS + 1)]
    assert set(ahead) <= set(names)
    assert "todo_history_default" in names
    first = min(n for n in names if n != "todo_history_default")
    bounds = await conn.fetchval(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = $1", first
    )
    assert bounds.startswith("FOR VALUES FROM (MINVALUE)")
    # A transition's row lands in today's partition.
    todo = await enqueue(Store(conn))
    assert await conn.fetchval(
        "SELECT tableoid::regclass::text FROM todo_history WHERE todo_id = $1", todo.id
    ) == day_name(today)


async def test_retention_drops_whole_days_past_the_age_and_keeps_the_rest(conn):
    today = await utc_today(conn)
    now = await conn.fetchval("SELECT now()")
    await conn.execute(ADD_STEP, "td_x", now - timedelta(days=30), "a month ago")
    await conn.execute(ADD_STEP, "td_x", now, "now")
    first = await partition_of(conn, "a month ago")
    assert first < day_name(today)  # the first partition: everything before today

    # Kept one second: every day that ended before now - 1 s goes, today stays.
    done = await history_partitions.maintain(conn, keep_seconds=1)

    assert (first, "dropped") in done
    assert [r["note"] for r in await conn.fetch("SELECT note FROM todo_history")] == ["now"]
    names = {r["relname"] for r in await conn.fetch(PARTITIONS)}
    assert first not in names and day_name(today) in names
    # Nothing more to do on the next turn.
    assert await history_partitions.maintain(conn, keep_seconds=1) == []


async def test_a_day_without_its_partition_waits_in_the_default_and_moves_in_when_made(conn):
    now = await conn.fetchval("SELECT now()")
    far = now + timedelta(days=history_partitions.AHEAD_DAYS + 5)
    await conn.execute(ADD_STEP, "td_x", far, "written while every reaper was stopped")
    assert await partition_of(conn, "written while every reaper was stopped") == "todo_history_default"

    made = await conn.fetch(
        "SELECT * FROM todo_history_maintain($1, '-infinity')", history_partitions.AHEAD_DAYS + 6
    )

    target = day_name(far.astimezone(UTC).date())
    assert (target, "created") in [tuple(r) for r in made]
    assert await partition_of(conn, "written while every reaper was stopped") == target
    assert await conn.fetchval("SELECT count(*) FROM todo_history_default") == 0


async def test_a_long_transaction_on_history_costs_a_turn_not_a_queue_of_transitions(dsn, conn):
    now = await conn.fetchval("SELECT now()")
    await conn.execute(ADD_STEP, "td_x", now - timedelta(days=30), "old")
    async with connected(dsn, asyncpg.connect) as reader, reader.transaction():
        await reader.fetchval("SELECT count(*) FROM todo_history")  # holds its lock
        started = asyncio.get_running_loop().time()
        assert await history_partitions.maintain(conn, keep_seconds=1) == []
        assert asyncio.get_running_loop().time() - started < 10  # waited ~200 ms, not on the reader
        # Transitions go on meanwhile.
        await enqueue(Store(conn), title="while the reader reads")
    done = await history_partitions.maintain(conn, keep_seconds=1)
    assert [action for _, action in done] == ["dropped"]
    assert await partition_of(conn, "old") is None
