"""No todo is stranded behind the claimers' positions (DESIGN "Claim order", issue 11).

Claims start where the claimer's last one ended (dashboard/claim_cursor.py), so a todo
that becomes claimable behind that position — committed late by a concurrent producer,
skipped while locked, released, reaped, its retry come due, scheduled — is found only by
a scan from the oldest. Here 16 claimers, each a Store on its own connection, drain a
queue while producers add to it in concurrent batches (some scheduled a second ahead by
SQL), and the claimers release, fail, complete and abandon what they take while a reaper
re-surfaces the abandoned. Every todo must end done, and the history must show each time
it became claimable followed by a claim within the bound: its backoff or schedule, plus
the poll interval (MAX_FULL_SCAN_EVERY), plus slack for a loaded machine. Once as is, once
with a REPEATABLE READ transaction held open for the whole run.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import asynccontextmanager

import asyncpg
import pytest

from dashboard import db as dbmod
from dashboard.claim_cursor import MAX_FULL_SCAN_EVERY
from dashboard.errors import Conflict
from dashboard.lapsed import reap_once
from dashboard.store import Store
from tests.factories import new_todo

CLAIMERS = 16
PRODUCERS = 3
BATCHES = 12  # per producer
BATCH = 25
SCHEDULED = 40  # inserted by SQL, claimable one second later
LEASE = 1.0  # seconds: an abandoned todo is reaped soon after
MAX_ATTEMPTS = 3  # backoff after attempt 1 and 2: at most 2 s and 4 s
SLACK = 5.0  # seconds, for a loaded 2-core machine
DEADLINE = 90.0


@asynccontextmanager
async def held_transaction(dsn: str, hold: bool):
    """With `hold`, a REPEATABLE READ transaction with its snapshot taken, open throughout."""
    if not hold:
        yield
        return
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await conn.fetchval("SELECT count(*) FROM todos")
        yield
    finally:
        await conn.close()


async def produce(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    for b in range(BATCHES):
        batch = [new_todo("live", f"p{seed}-{b}-{i}", max_attempts=MAX_ATTEMPTS) for i in range(BATCH)]
        await store.create_many(batch)
        await asyncio.sleep(rng.uniform(0, 0.2))


async def schedule(conn) -> None:
    """Todos that become claimable a second after they are written (as `run_at` will)."""
    await conn.execute(
        """WITH scheduled AS (
               INSERT INTO todos (id, queue, title, max_attempts, ready_at)
               SELECT 'td_sched' || g, 'live', 'scheduled ' || g, $1, now() + interval '1 second'
               FROM generate_series(1, $2) AS g
               RETURNING id
           )
           INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
           SELECT id, NULL, 'pending', 'producer', 'test', 0, 'created' FROM scheduled""",
        MAX_ATTEMPTS,
        SCHEDULED,
    )


async def claim_forever(store: Store, owner: str, seed: int, stop: asyncio.Event) -> None:
    """Take todos one by one: mostly complete, sometimes release, fail or abandon them
    (an abandoned lease lapses and the reaper takes it back)."""
    rng = random.Random(seed)
    while not stop.is_set():
        todo = await store.claim_next(["live"], owner, LEASE)
        if todo is None:
            await asyncio.sleep(0.02)  # an idle worker's poll
            continue
        roll = rng.random()
        try:
            if todo.attempt >= MAX_ATTEMPTS or roll < 0.7:
                await store.complete(todo.id, owner, todo.lease_token, None)
            elif roll < 0.8:
                await store.release(todo.id, owner, todo.lease_token)
            elif roll < 0.9:
                await store.fail(todo.id, owner, todo.lease_token, "flaky")
            # else: abandoned
        except Conflict:
            pass  # reaped while we held it: the lease lapsed


async def reap_until(store: Store, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await reap_once(store)
        await asyncio.sleep(0.2)


async def wait_all_done(conn, total: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while (done := await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'done'")) < total:
        if loop.time() > deadline:
            states = await conn.fetch("SELECT state::text, count(*) FROM todos GROUP BY 1")
            raise AssertionError(f"only {done} of {total} done after {DEADLINE} s: {dict(states)}")
        await asyncio.sleep(0.2)


async def claim_delays(conn) -> list[tuple[str, float, float]]:
    """For every time a todo became claimable — created, released, failed or reaped with a
    retry — how long until it was next claimed, and the longest that may be allowed: the
    attempt's backoff (or the schedule's second), plus the poll interval and slack."""
    rows = await conn.fetch(
        "SELECT todo_id, at, to_state::text, attempt, note FROM todo_history"
        " WHERE note <> 'retry due' ORDER BY todo_id, id"  # promote_due_retries' rows
    )
    delays = []
    for r, after in zip(rows, [*rows[1:], None], strict=True):
        if r["to_state"] != "pending":
            continue
        if after is None or after["todo_id"] != r["todo_id"] or after["to_state"] != "claimed":
            raise AssertionError(f"{r['todo_id']} was not claimed after {r['note']!r}: next {after}")
        if r["note"] == "created":
            wait = 1.0 if r["todo_id"].startswith("td_sched") else 0.0
        elif r["note"] == "released":
            wait = 0.0
        else:  # failed or reaped below the cap: its retry time
            wait = float(min(2 ** r["attempt"], 3600))
        waited = (after["at"] - r["at"]).total_seconds()
        delays.append((r["todo_id"], waited, wait + MAX_FULL_SCAN_EVERY + SLACK))
    return delays


@pytest.mark.parametrize("hold", [False, True], ids=["alone", "held-transaction"])
async def test_every_todo_that_becomes_claimable_is_claimed(dsn, hold):
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(CLAIMERS + PRODUCERS + 2)))
    claimers, producers = conns[:CLAIMERS], conns[CLAIMERS : CLAIMERS + PRODUCERS]
    reaper, watcher = conns[-2], conns[-1]
    stop = asyncio.Event()
    try:
        async with held_transaction(dsn, hold), asyncio.TaskGroup() as group:
            workers = [
                group.create_task(claim_forever(Store(c), f"agent-{i}", i, stop))
                for i, c in enumerate(claimers)
            ]
            group.create_task(reap_until(Store(reaper), stop))
            await asyncio.gather(*(produce(Store(c), i) for i, c in enumerate(producers)), schedule(watcher))
            try:
                await wait_all_done(watcher, PRODUCERS * BATCHES * BATCH + SCHEDULED)
            finally:
                stop.set()
            await asyncio.gather(*workers)
        late = [(t, round(w, 2), bound) for t, w, bound in await claim_delays(watcher) if w > bound]
        assert late == [], f"claimable todos waited past their bound: {late[:5]}"
        # One owner at a time: no todo was claimed twice without leaving `claimed` between.
        doubled = await watcher.fetchval(
            """SELECT count(*) FROM (
                   SELECT to_state, lag(to_state) OVER (PARTITION BY todo_id ORDER BY id) AS before
                   FROM todo_history) h
               WHERE to_state = 'claimed' AND before = 'claimed'"""
        )
        assert doubled == 0
    finally:
        await asyncio.gather(*(c.close() for c in conns))
