"""Real races: many connections claiming, enqueueing and reaping at once, counted.

Every claimer, producer and reaper has its own connection (and so its own backend), and
the verdict comes from the database: todo_history must hold exactly one row per todo for
each transition that may happen once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import asynccontextmanager

import pytest

from dashboard import db as dbmod
from dashboard.errors import Conflict
from dashboard.store import MAX_BATCH, Store
from tests.factories import new_todo


@asynccontextmanager
async def stores(dsn: str, n: int):
    """n Stores, each on its own connection."""
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(n)))
    try:
        yield [Store(c) for c in conns]
    finally:
        await asyncio.gather(*(c.close() for c in conns))


async def enqueue_many(store: Store, count: int, queue: str = "q", **kw) -> list[str]:
    ids = []
    for start in range(0, count, MAX_BATCH):
        batch = [new_todo(queue, f"t{i}", **kw) for i in range(start, min(count, start + MAX_BATCH))]
        ids += [r.todo.id for r in await store.create_many(batch)]
    return ids


async def transition_counts(conn, from_state: str | None, to_state: str) -> Counter:
    """How many history rows each todo has for one transition."""
    rows = await conn.fetch(
        "SELECT todo_id, count(*) AS n FROM todo_history "
        "WHERE from_state IS NOT DISTINCT FROM $1::todo_state AND to_state = $2::todo_state "
        "GROUP BY todo_id",
        from_state,
        to_state,
    )
    return Counter({r["todo_id"]: r["n"] for r in rows})


async def test_sixteen_claimers_claim_each_of_five_thousand_todos_exactly_once(dsn, conn):
    ids = await enqueue_many(Store(conn), 5000)

    async def claimer(store: Store, name: str, batch: int) -> list[str]:
        got = []
        while True:
            if batch == 1:
                todo = await store.claim_next(["q"], name, 60)
                claimed = [todo] if todo else []
            else:
                claimed = await store.claim_batch(["q"], name, 60, batch)
            if not claimed:
                return got
            assert len(claimed) <= batch
            got += [t.id for t in claimed]

    async with stores(dsn, 16) as claimers:
        per_claimer = await asyncio.gather(
            *(claimer(s, f"w{i}", 1 if i % 2 else 7) for i, s in enumerate(claimers))
        )

    everything = [todo_id for got in per_claimer for todo_id in got]
    assert len(everything) == len(set(everything)) == 5000, "claimed twice or lost"
    assert set(everything) == set(ids)
    assert all(per_claimer), "every claimer should have taken part in the race"

    owners = {
        r["id"]: r["owner"]
        for r in await conn.fetch(
            "SELECT id, owner FROM todos WHERE state = 'claimed' AND attempt = 1"
            " AND lease_token BETWEEN 1 AND 9007199254740991"
        )
    }
    assert len(owners) == 5000
    for i, got in enumerate(per_claimer):
        assert {owners[todo_id] for todo_id in got} == {f"w{i}"}

    claims = await transition_counts(conn, "pending", "claimed")
    assert set(claims) == set(ids) and set(claims.values()) == {1}
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM todo_history h JOIN todos t ON t.id = h.todo_id "
            "WHERE h.to_state = 'claimed' AND h.actor IS DISTINCT FROM t.owner"
        )
        == 0
    )


async def test_busy_workers_completing_and_claiming_next_finish_each_todo_exactly_once(dsn, conn):
    ids = await enqueue_many(Store(conn), 1000)

    async def worker(store: Store, name: str) -> list[str]:
        finished = []
        todo = await store.claim_next(["q"], name, 60)
        while todo is not None:
            done, todo = await store.complete_and_claim_next(
                todo.id, name, todo.lease_token, {"by": name}, ["q"], 60
            )
            finished.append(done.id)
        return finished

    async with stores(dsn, 8) as workers:
        per_worker = await asyncio.gather(*(worker(s, f"w{i}") for i, s in enumerate(workers)))

    everything = [todo_id for got in per_worker for todo_id in got]
    assert len(everything) == len(set(everything)) == 1000
    assert (
        await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'done' AND result->>'by' = owner")
        == 1000
    )
    for from_state, to_state in (("pending", "claimed"), ("claimed", "done")):
        counts = await transition_counts(conn, from_state, to_state)
        assert set(counts) == set(ids) and set(counts.values()) == {1}, (from_state, to_state)


async def race_enqueue(producers: list[Store], key: str, each: int):
    """Every producer delivers `each` copies of one key, all producers at once."""

    async def producer(store: Store):
        return [await store.create(new_todo("hooks", "delivery", idempotency_key=key)) for _ in range(each)]

    per_producer = await asyncio.gather(*(producer(s) for s in producers))
    return [r for results in per_producer for r in results]


@pytest.fixture
async def producers(dsn):
    async with stores(dsn, 50) as opened:
        yield opened


async def test_five_hundred_concurrent_deliveries_of_one_key_make_one_todo(producers, conn):
    results = await race_enqueue(producers, "evt-1", 10)

    assert len(results) == 500
    assert sum(r.created for r in results) == 1
    [todo_id] = {r.todo.id for r in results}
    row = await conn.fetchrow(
        "SELECT count(*) AS n, max(dedupe_hits) AS hits FROM todos "
        "WHERE queue = 'hooks' AND idempotency_key = 'evt-1'"
    )
    assert (row["n"], row["hits"]) == (1, 499)
    assert (await transition_counts(conn, None, "pending"))[todo_id] == 1
    assert (await transition_counts(conn, "pending", "pending"))[todo_id] == 499

    # Once done, the same key starts a new todo: again exactly one, however many race.
    store = Store(conn)
    held = await store.claim(todo_id, "w1", 30)
    await store.complete(todo_id, "w1", held.lease_token)
    again = await race_enqueue(producers, "evt-1", 10)
    assert sum(r.created for r in again) == 1
    [second_id] = {r.todo.id for r in again}
    assert second_id != todo_id
    hits = dict(await conn.fetch("SELECT id, dedupe_hits FROM todos"))
    assert hits == {todo_id: 499, second_id: 499}


async def test_after_a_dead_letter_concurrent_deliveries_of_its_key_make_one_new_todo(producers, conn):
    store = Store(conn)
    first = await store.create(new_todo("hooks", "delivery", idempotency_key="evt-2", max_attempts=1))
    held = await store.claim(first.todo.id, "w1", 30)
    assert (await store.fail(held.id, "w1", held.lease_token, "boom")).state == "failed"

    results = await race_enqueue(producers, "evt-2", 10)
    assert sum(r.created for r in results) == 1
    [second_id] = {r.todo.id for r in results}
    assert second_id != first.todo.id
    states = dict(await conn.fetch("SELECT id, state::text FROM todos"))
    assert states == {first.todo.id: "failed", second_id: "pending"}
    assert await conn.fetchval("SELECT dedupe_hits FROM todos WHERE id = $1", second_id) == 499


async def test_eight_reapers_reap_each_of_a_thousand_expired_leases_exactly_once(dsn, conn):
    store = Store(conn)
    retried = await enqueue_many(store, 500)
    dead = await enqueue_many(store, 500, max_attempts=1)
    assert len(await store.claim_batch(["q"], "gone", 60, 1000)) == 1000
    await conn.execute("UPDATE todos SET lease_expires_at = now() - interval '1 second'")

    async def reaper(s: Store) -> list[str]:
        got = []
        while reaped := await s.reap(limit=25):
            got += [t.id for t in reaped]
        return got

    async with stores(dsn, 8) as reapers:
        per_reaper = await asyncio.gather(*(reaper(s) for s in reapers))

    everything = [todo_id for got in per_reaper for todo_id in got]
    assert len(everything) == len(set(everything)) == 1000
    by_reaper = await conn.fetch(
        "SELECT todo_id, count(*) AS n, min(note) AS note FROM todo_history "
        "WHERE (actor_kind, actor) = ('system', 'reaper') GROUP BY todo_id"
    )
    assert len(by_reaper) == 1000
    assert {(r["n"], r["note"]) for r in by_reaper} == {(1, "lease expired (owner gone)")}
    states = dict(await conn.fetch("SELECT state::text, count(*) FROM todos GROUP BY state"))
    assert states == {"pending": 500, "failed": 500}
    assert (
        await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'failed' AND id = ANY($1)", dead) == 500
    )
    assert (
        await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'pending' AND id = ANY($1)", retried)
        == 500
    )


async def test_reapers_racing_late_completions_never_reopen_a_done_todo(dsn, conn):
    store = Store(conn)
    await enqueue_many(store, 600)
    held = await store.claim_batch(["q"], "slow", 60, 600)
    # Reapers take the oldest expiries first; completers start from the other end, so the
    # two sides meet somewhere in the middle and fight over the same rows there.
    expiries = await conn.fetch(
        "WITH o AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM todos) "
        "UPDATE todos t SET lease_expires_at = now() - interval '1 hour' + o.n * interval '1 ms' "
        "FROM o WHERE t.id = o.id RETURNING t.id"
    )
    assert len(expiries) == 600
    held.sort(key=lambda t: t.id, reverse=True)

    async def completer(s: Store, mine) -> dict[str, bool]:
        outcome = {}
        for todo in mine:
            try:
                await s.complete(todo.id, "slow", todo.lease_token, {"late": True})
                outcome[todo.id] = True
            except Conflict:
                outcome[todo.id] = False
        return outcome

    async def reaper(s: Store) -> None:
        while await s.reap(limit=10):
            pass

    async with stores(dsn, 8) as racers:
        outcomes = await asyncio.gather(
            *(completer(s, held[i::4]) for i, s in enumerate(racers[:4])),
            *(reaper(s) for s in racers[4:]),
        )
    completed = {k: v for o in outcomes[:4] for k, v in o.items()}
    assert len(completed) == 600
    assert 0 < sum(completed.values()) < 600, "both sides should have won some todos"

    rows = {
        r["id"]: r
        for r in await conn.fetch(
            "SELECT t.id, t.state::text AS state, "
            "       (SELECT count(*) FROM todo_history h WHERE h.todo_id = t.id "
            "        AND (h.actor_kind, h.actor) = ('system', 'reaper')) AS reaped, "
            "       (SELECT count(*) FROM todo_history h WHERE h.todo_id = t.id "
            "        AND h.to_state = 'done') AS done "
            "FROM todos t"
        )
    }
    for todo_id, won in completed.items():
        row = rows[todo_id]
        if won:
            assert (row["state"], row["done"], row["reaped"]) == ("done", 1, 0), todo_id
        else:
            assert (row["state"], row["done"], row["reaped"]) == ("pending", 0, 1), todo_id
