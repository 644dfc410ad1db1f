"""What holds back vacuum, as the overview, /metrics and the reaper's log report it
(dashboard/horizon.py), and our own sessions' idle_in_transaction_session_timeout."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

import asyncpg

from dashboard import db as dbmod
from dashboard.horizon import HorizonLog, HorizonWatch
from tests.factories import enqueue

THRESHOLD = 0.5  # seconds


@asynccontextmanager
async def report(dsn: str, application: str = "nightly report"):
    """A REPEATABLE READ transaction with its snapshot taken, idle, as a report leaves it."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": application})
    try:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.fetchval("SELECT count(*) FROM todos")
        yield conn
    finally:
        await conn.close()


async def held_back(watch: HorizonWatch, want: bool, within: float = 10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (horizon := await watch.get()).held_back != want:
        assert loop.time() < deadline, f"held_back stayed {not want}: {horizon}"
        await asyncio.sleep(0.05)
    return horizon


async def test_an_open_transaction_past_the_threshold_is_named_until_it_ends(dsn, pool):
    watch = HorizonWatch(pool, max_age=0, warn=THRESHOLD)
    assert not (await watch.get()).held_back
    async with report(dsn) as conn:
        horizon = await held_back(watch, True)
        holder = horizon.oldest
        assert (holder.kind, holder.application, holder.state) == (
            "transaction",
            "nightly report",
            "idle in transaction",
        )
        assert holder.pid == conn.get_server_pid() and holder.age >= THRESHOLD
        assert set(horizon.dead_tuples) == {"todos", "todo_history"}
        assert "nightly report" in holder.describe() and "idle in transaction" in holder.describe()
    await held_back(watch, False)


async def test_a_short_transaction_and_an_idle_session_are_not_reported(dsn, pool):
    watch = HorizonWatch(pool, max_age=0, warn=60)
    async with report(dsn):
        horizon = await watch.get()
        assert horizon.oldest is not None and horizon.oldest.age < 60
        assert not horizon.held_back
    idle = await asyncpg.connect(dsn)  # connected, no transaction: holds nothing
    try:
        assert (await watch.get()).oldest is None
    finally:
        await idle.close()


async def test_dead_tuples_are_counted_for_the_hot_tables(pool, store):
    for _ in range(20):
        todo = await enqueue(store)
        claimed = await store.claim(todo.id, "w", 30)
        await store.complete(claimed.id, "w", claimed.lease_token, None)
    watch = HorizonWatch(pool, max_age=0, warn=60)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15  # sessions report their statistics when idle, within 10 s
    while (await watch.get()).dead_tuples.get("todos", 0) == 0:
        assert loop.time() < deadline, "no dead tuples counted in todos"
        await asyncio.sleep(0.2)


async def test_the_reaper_logs_when_vacuum_is_held_back_and_when_it_is_not(dsn, pool, caplog):
    log = HorizonLog(HorizonWatch(pool, max_age=0, warn=THRESHOLD))
    caplog.set_level(logging.WARNING, logger="switchboard.reaper")
    async with report(dsn, "stuck psql"):
        await held_back(log.watch, True)
        await log.check(0.0)
        await log.check(1.0)  # still held: said once until REPEAT_EVERY
    await held_back(log.watch, False)
    await log.check(2.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "switchboard.reaper"]
    assert len(lines) == 2, lines
    assert "vacuum is held back" in lines[0] and "stuck psql" in lines[0] and "dead row versions" in lines[0]
    assert lines[1] == "vacuum is no longer held back"


async def test_our_sessions_end_a_transaction_left_idle(dsn):
    conn = await dbmod.connect(dsn)
    try:
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
    finally:
        await conn.close()
    pool = await dbmod.create_pool(dsn, min_size=1, max_size=1)
    try:
        assert await pool.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
    finally:
        await pool.close()
