"""The rollup job: its rows agree with what happened, whole minutes only, gaps filled,
one process at a time; the backlog samples; refused acks recorded for the agents page."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from dashboard import rollups as rollups_module
from dashboard.config import Settings
from dashboard.control import Control
from dashboard.errors import Conflict
from dashboard.models import Actor
from dashboard.rollups import BOUNDS, SQL, Rollups, next_sample_in, percentile
from dashboard.store import Store
from tests.factories import enqueue, expire_lease, fenced_out, new_todo

STEPS = (
    "created",
    "deduplicated",
    "claimed",
    "completed",
    "failed",
    "dead",
    "reaped",
    "released",
    "cancelled",
)


async def age_history(db, minutes: float, spread: int = 1) -> None:
    """Every history row happened `minutes` earlier (and rows spread over `spread`
    consecutive minutes by id), and the job has rolled nothing since before the oldest:
    as when the app was down while the work happened."""
    await db.execute(
        "UPDATE todo_history SET at = at - make_interval(secs => $1 * 60 + (id % $2) * 60)",
        float(minutes),
        spread,
    )
    await db.execute("UPDATE rollup_progress SET rolled_id = (SELECT min(id) - 1 FROM todo_history)")


async def minute_totals(db) -> dict[str, Counter]:
    rows = await db.fetch("SELECT * FROM queue_rollups WHERE grain = 'minute' AND queue <> '*'")
    totals: dict[str, Counter] = {}
    for r in rows:
        c = totals.setdefault(r["queue"], Counter())
        for step in STEPS:
            c[step] += r[step]
        c["waited"] += sum(r["waited"])
        c["ran"] += sum(r["ran"])
    return totals


async def workload(store: Store, db, rng: random.Random) -> dict[str, Counter]:
    """A random mix of every step over three queues; what it did, per queue."""
    did: dict[str, Counter] = {}
    queues = ["alpha", "beta", "gamma"]
    held = []
    for _ in range(160):
        queue = rng.choice(queues)
        c = did.setdefault(queue, Counter())
        op = rng.random()
        if op < 0.35:
            key = rng.choice([None, "k1", "k2", "k3"])
            created = await store.create(new_todo(queue, "t", idempotency_key=key, max_attempts=2))
            c["created" if created.created else "deduplicated"] += 1
        elif op < 0.6:
            todo = await store.claim_next([queue], rng.choice(["ann", "bob"]), 300)
            if todo:
                c["claimed"] += 1
                c["waited"] += 1
                held.append(todo)
        elif held:
            todo = held.pop(rng.randrange(len(held)))
            c = did.setdefault(todo.queue, Counter())
            what = rng.choice(["complete", "fail", "release", "reap", "cancel"])
            if what == "complete":
                await store.complete(todo.id, todo.owner, todo.lease_token)
                c["completed"] += 1
                c["ran"] += 1
            elif what == "fail":
                after = await store.fail(todo.id, todo.owner, todo.lease_token, "boom")
                c["failed"] += 1
                c["ran"] += 1
                c["dead"] += after.state == "failed"
            elif what == "release":
                await store.release(todo.id, todo.owner, todo.lease_token)
                c["released"] += 1
            elif what == "reap":
                await expire_lease(db, todo.id)
                (after,) = await store.reap()
                c["reaped"] += 1
                c["dead"] += after.state == "failed"
            else:
                await Control(store.db, store.hints).cancel(todo.id, Actor("operator", "olga"), "not needed")
                c["cancelled"] += 1
    return did


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_rollups_match_what_happened(conn, seed):
    store = Store(conn)
    did = await workload(store, conn, random.Random(seed))
    await age_history(conn, 5, spread=4)

    rolled = await Rollups(conn).roll()

    assert rolled == await conn.fetchval("SELECT count(*) FROM todo_history")
    totals = await minute_totals(conn)
    for queue, expected in did.items():
        got = totals.get(queue, Counter())
        for step in (*STEPS, "waited", "ran"):
            assert got[step] == expected[step], (queue, step)
    # hour rows are the sum of their minutes
    hours = await conn.fetch(
        "SELECT queue, sum(created) AS created, sum(completed) AS completed, sum_elements(waited) AS waited"
        " FROM queue_rollups WHERE grain = 'hour' AND queue <> '*' GROUP BY queue"
    )
    for h in hours:
        assert h["created"] == did[h["queue"]]["created"]
        assert h["completed"] == did[h["queue"]]["completed"]
        assert sum(h["waited"]) == did[h["queue"]]["waited"]
    assert len(await conn.fetch("SELECT DISTINCT at FROM queue_rollups WHERE grain = 'minute'")) >= 2
    # queue '*' is every queue together
    everything = await conn.fetchrow(
        "SELECT sum(created) AS created, sum(completed) AS completed FROM queue_rollups"
        " WHERE grain = 'minute' AND queue = '*'"
    )
    assert everything["created"] == sum(c["created"] for c in did.values())
    assert everything["completed"] == sum(c["completed"] for c in did.values())


async def test_agents_minutes_count_their_steps(conn):
    store = Store(conn)
    for _ in range(3):
        await enqueue(store, "work")
    a = await store.claim_next(["work"], "ann", 300)
    b = await store.claim_next(["work"], "ann", 300)
    c = await store.claim_next(["work"], "bob", 300)
    await store.heartbeat(a.id, "ann", a.lease_token, 300)
    await store.complete(a.id, "ann", a.lease_token)
    await store.fail(b.id, "ann", b.lease_token, "nope")
    await store.release(c.id, "bob", c.lease_token)
    await age_history(conn, 3)

    await Rollups(conn).roll()

    rows = {
        r["agent"]: r
        for r in await conn.fetch(
            "SELECT agent, sum(claimed) AS claimed, sum(completed) AS completed, sum(failed) AS failed,"
            " sum(released) AS released, max(last_ack_at) AS ack"
            " FROM agent_rollups GROUP BY agent"
        )
    }
    assert (rows["ann"]["claimed"], rows["ann"]["completed"], rows["ann"]["failed"]) == (2, 1, 1)
    assert (rows["bob"]["claimed"], rows["bob"]["released"]) == (1, 1)
    assert rows["ann"]["ack"] is not None


async def test_new_history_is_rolled_at_the_next_pass_and_only_once(conn):
    store = Store(conn)
    await enqueue(store, "now")
    rollups = Rollups(conn)

    assert await rollups.roll() > 0
    assert (
        await conn.fetchval("SELECT created FROM queue_rollups WHERE queue = 'now' AND grain = 'minute'") == 1
    )
    assert (
        await conn.fetchval("SELECT created FROM queue_rollups WHERE queue = 'now' AND grain = 'hour'") == 1
    )

    assert await rollups.roll() == 0  # again: nothing is counted twice
    assert (
        await conn.fetchval("SELECT sum(created) FROM queue_rollups WHERE queue = 'now'") == 2
    )  # minute + hour
    assert await conn.fetchval("SELECT count(*) FROM rollup_marks") == 1  # the marks before are gone


async def test_a_gap_of_hours_is_filled_from_history(conn, monkeypatch):
    """The app was down for three hours: the next pass rolls everything since, in several
    transactions, and the hour rows too."""
    monkeypatch.setattr(rollups_module, "CHUNK", 7)
    store = Store(conn)
    for i in range(30):
        await enqueue(store, "gap", f"t{i}")
    await conn.execute("UPDATE todo_history SET at = now() - interval '3 hours' + id * interval '5 minutes'")
    await conn.execute("UPDATE rollup_progress SET rolled_id = 0")

    rolled = await Rollups(conn).roll()

    assert rolled == await conn.fetchval("SELECT max(id) FROM todo_history")
    assert (
        await conn.fetchval("SELECT sum(created) FROM queue_rollups WHERE grain = 'minute' AND queue = 'gap'")
        == 30
    )
    assert (
        await conn.fetchval("SELECT sum(created) FROM queue_rollups WHERE grain = 'hour' AND queue = '*'")
        == 30
    )
    assert await conn.fetchval("SELECT count(DISTINCT at) FROM queue_rollups WHERE grain = 'hour'") >= 3


async def test_a_writing_transaction_holds_the_rollups_back(dsn, conn):
    """History rows get their ids when written and are seen when committed: while a
    transaction that began before a todo was created is still writing, that todo's
    history is not rolled (an id below it may still appear); once it ends, it is."""
    import asyncpg

    store = Store(conn)
    rollups = Rollups(conn)
    writer = await asyncpg.connect(dsn)
    try:
        tx = writer.transaction()
        await tx.start()
        await writer.execute(
            "INSERT INTO queue_pauses (queue, actor_kind, actor) VALUES ('w', 'operator', 'x')"
        )
        await enqueue(store, "held")

        await rollups.roll()
        assert await conn.fetchval("SELECT count(*) FROM queue_rollups WHERE queue = 'held'") == 0

        await tx.rollback()
        await rollups.roll()  # a mark after the writer ended
        assert (
            await conn.fetchval("SELECT created FROM queue_rollups WHERE queue = 'held' AND grain = 'minute'")
            == 1
        )
    finally:
        await writer.close()


async def test_an_uncommitted_row_with_a_lower_id_is_counted_when_it_commits(dsn, conn):
    """A transaction takes a history id, then a later one commits a greater id: the pass
    between them rolls neither, and nothing is lost or counted twice."""
    import asyncpg

    store = Store(conn)
    rollups = Rollups(conn)
    slow = await asyncpg.connect(dsn)
    try:
        tx = slow.transaction()
        await tx.start()
        await Store(slow).create(new_todo("slow", "first id"))  # holds the lower id, uncommitted
        await enqueue(store, "fast")  # a greater id, committed
        await rollups.roll()
        assert await conn.fetchval("SELECT count(*) FROM queue_rollups WHERE queue IN ('slow', 'fast')") == 0
        await tx.commit()
        await rollups.roll()
        rows = await conn.fetch(
            "SELECT queue, created FROM queue_rollups"
            " WHERE grain = 'minute' AND queue IN ('slow', 'fast') ORDER BY 1"
        )
        assert [(r["queue"], r["created"]) for r in rows] == [("fast", 1), ("slow", 1)]
    finally:
        await slow.close()


async def test_one_job_at_a_time(dsn, conn):
    """While one process holds the job's lock, another's pass does nothing."""
    import asyncpg

    store = Store(conn)
    await enqueue(store, "locked")
    await age_history(conn, 3)
    other = await asyncpg.connect(dsn)
    try:
        async with other.transaction():
            assert await SQL.lock.fetchval(other)
            assert await Rollups(conn).roll() == 0
        assert await Rollups(conn).roll() > 0
    finally:
        await other.close()


async def test_backlog_samples_and_zero_when_emptied(conn):
    store = Store(conn)
    for i in range(3):
        await enqueue(store, "backlog", f"t{i}")
    await enqueue(store, "backlog", "later", delay=3600)
    rollups = Rollups(conn)

    await rollups.sample()
    row = await conn.fetchrow("SELECT ready, scheduled, retrying FROM queue_rollups WHERE queue = 'backlog'")
    assert (row["ready"], row["scheduled"], row["retrying"]) == (3, 1, 0)
    assert await conn.fetchval("SELECT ready FROM queue_rollups WHERE queue = '*'") == 3

    await conn.execute("DELETE FROM todos WHERE queue = 'backlog'")
    await rollups.sample()
    row = await conn.fetchrow("SELECT ready, scheduled FROM queue_rollups WHERE queue = 'backlog'")
    assert (row["ready"], row["scheduled"]) == (0, 0)


async def test_rows_past_retention_are_pruned(conn):
    await conn.execute(
        "INSERT INTO queue_rollups (grain, queue, at) VALUES"
        " ('minute', 'old', now() - interval '3 days'), ('minute', 'new', now() - interval '1 hour'),"
        " ('hour', 'old', now() - interval '100 days'), ('hour', 'new', now() - interval '10 days')"
    )
    kept = Settings()  # the defaults: minute rows 48 hours, hour rows 90 days
    await Rollups(conn).prune(kept.rollup_minute_hours * 3600, kept.rollup_hour_days * 86400)
    rows = await conn.fetch("SELECT grain, queue FROM queue_rollups ORDER BY 1, 2")
    assert [(r["grain"], r["queue"]) for r in rows] == [("hour", "new"), ("minute", "new")]
    await Rollups(conn).prune(0.5 * 3600, kept.rollup_hour_days * 86400)
    assert await conn.fetchval("SELECT count(*) FROM queue_rollups WHERE grain = 'minute'") == 0


async def test_an_ack_refused_by_fencing_is_recorded(conn):
    store = Store(conn)
    first = await fenced_out(store, conn, "fenced", "ann", "ann")

    with pytest.raises(Conflict):
        await store.complete(first.id, "ann", first.lease_token)

    row = await conn.fetchrow("SELECT agent, todo_id, action, lease FROM stale_acks")
    assert dict(row) == {
        "agent": "ann",
        "todo_id": first.id,
        "action": "complete",
        "lease": first.lease_token,
    }


def test_percentiles_from_a_histogram():
    hist = [0] * (len(BOUNDS) + 1)
    assert percentile(hist, 0.5) is None
    one_second = BOUNDS.index(1.0)
    hist[one_second] = 100  # everything between 0.5 s and 1 s
    assert BOUNDS[one_second - 1] <= percentile(hist, 0.5) <= 1.0
    hist[-1] = 100  # and as many above a day
    assert percentile(hist, 0.95) == BOUNDS[-1]


def test_a_slow_backlog_sample_is_taken_less_often():
    assert next_sample_in(0.05, 10.0) == 10.0
    assert next_sample_in(1.0, 10.0) == pytest.approx(50.0)  # 2% of the time at most
