"""Every transition and every guard of DESIGN.md's state machine, through Store.

Time moves by SQL (lease_expires_at, next_retry_at, created_at, completed_at set into the
past), never by sleeping. History is checked row by row: (from, to, actor, attempt, note).

The module clones one migrated database and empties its tables before each test (TRUNCATE
is far cheaper than CREATE DATABASE per test, and every test still starts from nothing).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest

from dashboard import db as dbmod
from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.models import MAX_JSON_BYTES, STATES, NewEvent, NewTodo, Todo
from dashboard.store import MAX_BATCH, Store
from tests.conftest import scratch_database

# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def module_db(server_dsn, template_db):
    with scratch_database(server_dsn, template_db) as url:
        yield url


@pytest.fixture
def dsn(module_db):
    """Overrides conftest's dsn: the module's database (emptied by empty_tables)."""
    return module_db


@pytest.fixture(autouse=True)
async def empty_tables(pool):
    await pool.execute("TRUNCATE todos, todo_history, events RESTART IDENTITY")


def new(queue: str = "q", title: str = "t", **kw) -> NewTodo:
    return NewTodo(queue=queue, title=title, **kw)


async def history(db, todo_id: str) -> list[tuple]:
    rows = await db.fetch(
        "SELECT from_state, to_state, actor, attempt, note FROM todo_history "
        "WHERE todo_id = $1 ORDER BY id",
        todo_id,
    )
    return [tuple(r) for r in rows]


async def fetch(db, todo_id: str) -> Todo:
    return Todo.from_record(await db.fetchrow("SELECT * FROM todos WHERE id = $1", todo_id))


async def claimed(store: Store, owner: str = "w1", ttl: float = 30, **kw) -> Todo:
    created = await store.create(new(**kw))
    return await store.claim(created.todo.id, owner, ttl)


async def expire_lease(db, todo_id: str) -> None:
    await db.execute(
        "UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id = $1", todo_id
    )


async def make_retry_due(db, todo_id: str) -> None:
    await db.execute(
        "UPDATE todos SET next_retry_at = now() - interval '1 second' WHERE id = $1", todo_id
    )


async def set_age(db, todo_id: str, seconds: float) -> None:
    await db.execute(
        "UPDATE todos SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
        todo_id, float(seconds),
    )


async def db_now(db) -> datetime:
    return await db.fetchval("SELECT clock_timestamp()")


async def fingerprint(db) -> tuple:
    """Everything a refused call must leave untouched."""
    return tuple(await db.fetchrow(
        """SELECT (SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY id), '')) FROM todos t),
                  (SELECT count(*) FROM todo_history),
                  (SELECT count(*) FROM events)"""
    ))


async def dead_letter(store: Store, db, owner: str = "w1", **kw) -> Todo:
    """A todo failed at its cap (max_attempts=1 unless given)."""
    kw.setdefault("max_attempts", 1)
    todo = await claimed(store, owner, **kw)
    for _ in range(todo.max_attempts - 1):
        todo = await store.fail(todo.id, owner, todo.lease_token, "boom")
        await make_retry_due(db, todo.id)
        todo = await store.claim(todo.id, owner, 30)
    todo = await store.fail(todo.id, owner, todo.lease_token, "boom")
    assert todo.state == "failed"
    return todo


# -- the schema and the model agree ------------------------------------------------------


async def test_python_states_equal_the_todo_state_enum_in_the_database(pool):
    labels = await pool.fetchval(
        "SELECT array_agg(enumlabel ORDER BY enumsortorder) FROM pg_enum "
        "WHERE enumtypid = 'todo_state'::regtype"
    )
    assert tuple(labels) == STATES


# -- create ----------------------------------------------------------------------------


async def test_create_inserts_a_pending_todo_and_records_its_creation(store, pool):
    result = await store.create(
        new(queue="mail", title="send it", kind="email", source="hook", payload={"to": "a@b"},
            idempotency_key="k1", assignee="ann", max_attempts=7),
        actor="ingest",
    )
    todo = result.todo
    assert result.created is True
    assert todo.id.startswith("td_")
    assert (todo.queue, todo.title, todo.kind, todo.source) == ("mail", "send it", "email", "hook")
    assert todo.payload == {"to": "a@b"}
    assert (todo.idempotency_key, todo.assignee, todo.max_attempts) == ("k1", "ann", 7)
    assert (todo.state, todo.owner, todo.attempt, todo.lease_token, todo.dedupe_hits) == (
        "pending", None, 0, 0, 0)
    assert todo.next_retry_at is None and todo.lease_expires_at is None
    assert await fetch(pool, todo.id) == todo
    assert await history(pool, todo.id) == [(None, "pending", "ingest", 0, "created")]


async def test_create_with_a_live_key_returns_the_live_todo_and_counts_the_duplicate(store, pool):
    first = await store.create(new(idempotency_key="k", title="first"))
    second = await store.create(new(idempotency_key="k", title="second"))
    third = await store.create(new(idempotency_key="k", title="third"))

    assert first.created is True
    assert (second.created, third.created) == (False, False)
    assert second.todo.id == third.todo.id == first.todo.id
    assert second.todo.title == "first"
    assert (second.todo.dedupe_hits, third.todo.dedupe_hits) == (1, 2)
    assert await pool.fetchval("SELECT count(*) FROM todos") == 1
    assert await history(pool, first.todo.id) == [
        (None, "pending", "producer", 0, "created"),
        ("pending", "pending", "producer", 0, "duplicate delivery collapsed"),
        ("pending", "pending", "producer", 0, "duplicate delivery collapsed"),
    ]


async def test_a_claimed_todo_still_holds_its_key_against_duplicates(store, pool):
    held = await claimed(store, idempotency_key="k")
    again = await store.create(new(idempotency_key="k"))
    assert again.created is False
    assert again.todo.id == held.id and again.todo.state == "claimed"
    assert again.todo.dedupe_hits == 1
    assert (await history(pool, held.id))[-1] == (
        "claimed", "claimed", "producer", 1, "duplicate delivery collapsed")


async def test_a_todo_retrying_after_a_failure_still_holds_its_key(store, pool):
    held = await claimed(store, idempotency_key="k")
    await store.fail(held.id, "w1", held.lease_token, "flaky")
    again = await store.create(new(idempotency_key="k"))
    assert again.created is False and again.todo.id == held.id
    assert await pool.fetchval("SELECT count(*) FROM todos") == 1


async def test_the_same_key_in_another_queue_makes_its_own_todo(store, pool):
    a = await store.create(new(queue="a", idempotency_key="k"))
    b = await store.create(new(queue="b", idempotency_key="k"))
    assert a.created and b.created and a.todo.id != b.todo.id


async def test_once_its_todo_is_done_the_same_key_makes_a_new_todo(store, pool):
    held = await claimed(store, idempotency_key="k")
    await store.complete(held.id, "w1", held.lease_token, {"ok": True})
    again = await store.create(new(idempotency_key="k"))
    assert again.created is True
    assert again.todo.id != held.id and again.todo.state == "pending"
    assert (await fetch(pool, held.id)).dedupe_hits == 0


async def test_once_its_todo_is_dead_lettered_the_same_key_makes_a_new_todo(store, pool):
    dead = await dead_letter(store, pool, idempotency_key="k")
    again = await store.create(new(idempotency_key="k"))
    assert again.created is True and again.todo.id != dead.id


async def test_create_with_an_event_stores_the_event_and_links_it(store, pool):
    result = await store.create(
        new(event=NewEvent(source="github", kind="push", payload={"ref": "main"}))
    )
    assert result.todo.event_id.startswith("ev_")
    event = await pool.fetchrow("SELECT * FROM events WHERE id = $1", result.todo.event_id)
    assert (event["source"], event["kind"], event["payload"]) == ("github", "push", {"ref": "main"})


# -- create_many -----------------------------------------------------------------------


async def test_create_many_collapses_in_batch_duplicates_and_answers_in_input_order(store, pool):
    items = [
        new(title="z1", idempotency_key="z"),
        new(title="plain"),
        new(title="a1", idempotency_key="a"),
        new(title="z2", idempotency_key="z"),
        new(title="m1", idempotency_key="m"),
        new(title="z3", idempotency_key="z"),
        new(title="a2", idempotency_key="a"),
    ]
    results = await store.create_many(items, actor="batcher")

    assert [r.created for r in results] == [True, True, True, False, True, False, False]
    assert [r.todo.title for r in results] == ["z1", "plain", "a1", "z1", "m1", "z1", "a1"]
    z, a = results[0].todo, results[2].todo
    assert results[3].todo.id == results[5].todo.id == z.id
    assert results[6].todo.id == a.id
    assert (z.dedupe_hits, a.dedupe_hits, results[4].todo.dedupe_hits) == (2, 1, 0)
    assert await pool.fetchval("SELECT count(*) FROM todos") == 4
    assert await history(pool, z.id) == [(None, "pending", "batcher", 0, "created")]


async def test_create_many_counts_duplicates_of_a_live_todo_from_earlier(store, pool):
    live = await store.create(new(idempotency_key="k"))
    results = await store.create_many([new(idempotency_key="k"), new(idempotency_key="k")])
    assert [r.created for r in results] == [False, False]
    assert {r.todo.id for r in results} == {live.todo.id}
    assert (await fetch(pool, live.todo.id)).dedupe_hits == 2


async def test_create_many_creates_each_items_event(store, pool):
    results = await store.create_many([
        new(title="one", event=NewEvent(source="s1", kind="k1", payload={"n": 1})),
        new(title="none"),
        new(title="two", event=NewEvent(source="s2", kind="k2", payload={"n": 2})),
    ])
    assert results[1].todo.event_id is None
    for result, (source, kind, n) in zip(
        (results[0], results[2]), (("s1", "k1", 1), ("s2", "k2", 2)), strict=True
    ):
        event = await pool.fetchrow("SELECT * FROM events WHERE id = $1", result.todo.event_id)
        assert (event["source"], event["kind"], event["payload"]) == (source, kind, {"n": n})
    assert await pool.fetchval("SELECT count(*) FROM events") == 2


async def test_create_many_refuses_the_whole_batch_naming_the_bad_item(store, pool):
    before = await fingerprint(pool)
    with pytest.raises(InvalidInput) as exc:
        await store.create_many([
            new(event=NewEvent(source="s", kind="k")), new(payload=["not", "an", "object"]),
        ])
    assert exc.value.field == "todos[1].payload"
    assert await fingerprint(pool) == before


async def test_create_many_refuses_more_than_the_batch_limit(store, pool):
    with pytest.raises(InvalidInput) as exc:
        await store.create_many([new() for _ in range(MAX_BATCH + 1)])
    assert exc.value.field == "todos"
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0


# -- claim_next, claim_batch -----------------------------------------------------------


async def test_claim_next_takes_the_oldest_todo_across_the_allowed_queues(store, pool):
    ages = {"a": 10, "b": 30, "c": 20, "other": 99}
    ids = {}
    for queue, age in ages.items():
        ids[queue] = (await store.create(new(queue=queue))).todo.id
        await set_age(pool, ids[queue], age)

    order = [await store.claim_next(["a", "b", "c"], "w1", 30) for _ in range(4)]
    assert [t.id for t in order[:3]] == [ids["b"], ids["c"], ids["a"]]
    assert order[3] is None
    assert (await fetch(pool, ids["other"])).state == "pending"


async def test_claim_next_only_looks_at_the_queues_it_is_given(store, pool):
    old = (await store.create(new(queue="a"))).todo
    await set_age(pool, old.id, 100)
    young = (await store.create(new(queue="b"))).todo
    assert (await store.claim_next(["b"], "w1", 30)).id == young.id
    assert await store.claim_next(["b", "c"], "w1", 30) is None


async def test_claim_next_hands_out_a_lease_and_records_the_claim(store, pool):
    created = (await store.create(new())).todo
    before = await db_now(pool)
    todo = await store.claim_next(["q"], "w1", 90)
    after = await db_now(pool)

    assert todo.id == created.id
    assert (todo.state, todo.owner, todo.attempt, todo.lease_token) == ("claimed", "w1", 1, 1)
    assert before <= todo.claimed_at <= after
    assert before + timedelta(seconds=90) <= todo.lease_expires_at <= after + timedelta(seconds=90)
    assert await fetch(pool, todo.id) == todo
    assert await history(pool, todo.id) == [
        (None, "pending", "producer", 0, "created"),
        ("pending", "claimed", "w1", 1, "claimed"),
    ]


async def test_claim_next_returns_none_when_nothing_is_pending(store):
    assert await store.claim_next(["q"], "w1", 30) is None


async def test_claim_next_skips_todos_assigned_to_someone_else(store, pool):
    for_bob = (await store.create(new(assignee="bob"))).todo
    await set_age(pool, for_bob.id, 60)
    anyone = (await store.create(new())).todo
    await set_age(pool, anyone.id, 30)
    for_ann = (await store.create(new(assignee="ann"))).todo

    ann_first = await store.claim_next(["q"], "ann", 30)
    ann_second = await store.claim_next(["q"], "ann", 30)
    assert (ann_first.id, ann_second.id) == (anyone.id, for_ann.id)
    assert await store.claim_next(["q"], "ann", 30) is None
    assert (await store.claim_next(["q"], "bob", 30)).id == for_bob.id


async def test_claim_next_skips_a_retry_that_is_not_due_and_takes_it_once_due(store, pool):
    held = await claimed(store)
    retrying = await store.fail(held.id, "w1", held.lease_token, "flaky")
    assert retrying.state == "pending" and retrying.next_retry_at is not None

    assert await store.claim_next(["q"], "w1", 30) is None
    await make_retry_due(pool, held.id)
    again = await store.claim_next(["q"], "w2", 30)
    assert again.id == held.id
    assert (again.attempt, again.lease_token, again.next_retry_at) == (2, 2, None)


async def test_claim_batch_claims_at_most_n_oldest_first(store, pool):
    ids = [(await store.create(new(title=str(i)))).todo.id for i in range(10)]
    for age, todo_id in zip(range(100, 0, -10), ids, strict=True):
        await set_age(pool, todo_id, age)

    first = await store.claim_batch(["q"], "w1", 30, 3)
    assert [t.id for t in first] == ids[:3]
    rest = await store.claim_batch(["q"], "w1", 30, 100)
    assert [t.id for t in rest] == ids[3:]
    assert await store.claim_batch(["q"], "w1", 30, 5) == []
    assert await pool.fetchval(
        "SELECT count(*) FROM todo_history WHERE to_state = 'claimed'") == 10


async def test_claim_batch_refuses_a_batch_size_out_of_range(store, pool):
    await store.create(new())
    for n in (-1, MAX_BATCH + 1):
        with pytest.raises(InvalidInput) as exc:
            await store.claim_batch(["q"], "w1", 30, n)
        assert exc.value.field == "n"
    assert (await pool.fetchval("SELECT state FROM todos")) == "pending"


# -- claim by id -----------------------------------------------------------------------


async def test_claim_by_id_takes_that_todo_and_records_it(store, pool):
    await store.create(new(title="older"))
    wanted = (await store.create(new(title="wanted"))).todo
    todo = await store.claim(wanted.id, "w1", 30)
    assert (todo.id, todo.state, todo.owner, todo.attempt, todo.lease_token) == (
        wanted.id, "claimed", "w1", 1, 1)
    assert (await history(pool, wanted.id))[-1] == ("pending", "claimed", "w1", 1, "claimed by id")


async def test_claim_by_id_of_a_todo_assigned_to_me_succeeds(store):
    mine = (await store.create(new(assignee="w1"))).todo
    assert (await store.claim(mine.id, "w1", 30)).owner == "w1"


async def test_claim_by_id_of_a_todo_assigned_to_someone_else_is_a_conflict(store, pool):
    todo = (await store.create(new(assignee="bob"))).todo
    with pytest.raises(Conflict) as exc:
        await store.claim(todo.id, "ann", 30)
    assert str(exc.value) == f"cannot claim todo {todo.id}: it is pending, assigned to bob"
    assert exc.value.current == {"state": "pending", "owner": None, "assignee": "bob"}
    assert (await fetch(pool, todo.id)).state == "pending"


async def test_claim_by_id_of_a_todo_held_by_another_owner_is_a_conflict(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict) as exc:
        await store.claim(held.id, "bob", 30)
    assert str(exc.value) == f"cannot claim todo {held.id}: it is claimed by ann"
    assert exc.value.current == {"state": "claimed", "owner": "ann", "assignee": None}
    assert await fetch(pool, held.id) == held


async def test_claim_by_id_of_a_retry_that_is_not_due_is_a_conflict_saying_when(store, pool):
    held = await claimed(store)
    retrying = await store.fail(held.id, "w1", held.lease_token, "flaky")
    with pytest.raises(Conflict) as exc:
        await store.claim(held.id, "w1", 30)
    assert f"it is pending, retrying at {retrying.next_retry_at.isoformat()}" in str(exc.value)


async def test_claim_by_id_of_an_unknown_todo_is_not_found(store, pool):
    with pytest.raises(NotFound, match="no todo td_nope"):
        await store.claim("td_nope", "w1", 30)


# -- heartbeat -------------------------------------------------------------------------


async def test_heartbeat_extends_the_lease_from_now(store, pool):
    held = await claimed(store, ttl=5)
    before = await db_now(pool)
    beat = await store.heartbeat(held.id, "w1", held.lease_token, 600)
    after = await db_now(pool)
    ten_minutes = timedelta(seconds=600)
    assert before + ten_minutes <= beat.lease_expires_at <= after + ten_minutes
    assert before <= beat.heartbeat_at <= after
    assert (beat.state, beat.owner, beat.attempt, beat.lease_token) == ("claimed", "w1", 1, 1)
    assert (await history(pool, held.id))[-1] == ("claimed", "claimed", "w1", 1, "heartbeat")


async def test_heartbeat_succeeds_on_a_lapsed_lease_the_reaper_has_not_taken(store, pool):
    held = await claimed(store)
    await expire_lease(pool, held.id)
    beat = await store.heartbeat(held.id, "w1", held.lease_token, 30)
    assert beat.lease_expires_at > await db_now(pool)
    assert await store.reap() == []


async def test_heartbeat_by_another_owner_is_a_conflict_and_changes_nothing(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict) as exc:
        await store.heartbeat(held.id, "bob", held.lease_token, 30)
    assert str(exc.value) == f"cannot heartbeat todo {held.id}: it is claimed by ann"
    assert await fetch(pool, held.id) == held


async def test_heartbeat_with_a_wrong_lease_is_a_conflict_naming_both_leases(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict) as exc:
        await store.heartbeat(held.id, "ann", held.lease_token + 5, 30)
    assert str(exc.value) == (
        f"cannot heartbeat todo {held.id}: it is claimed by ann; "
        f"lease {held.lease_token + 5} is stale (the current lease is {held.lease_token})"
    )
    assert await fetch(pool, held.id) == held


async def test_heartbeat_on_a_pending_todo_is_a_conflict(store, pool):
    todo = (await store.create(new())).todo
    with pytest.raises(Conflict, match="it is pending"):
        await store.heartbeat(todo.id, "w1", 0, 30)


async def test_heartbeat_on_an_unknown_todo_is_not_found(store):
    with pytest.raises(NotFound):
        await store.heartbeat("td_nope", "w1", 1, 30)


# -- release ---------------------------------------------------------------------------


async def test_release_gives_the_todo_back_and_keeps_the_attempt_counted(store, pool):
    held = await claimed(store)
    released = await store.release(held.id, "w1", held.lease_token)
    assert (released.state, released.owner, released.lease_expires_at) == ("pending", None, None)
    assert (released.attempt, released.lease_token, released.next_retry_at) == (1, 1, None)
    assert (await history(pool, held.id))[-1] == ("claimed", "pending", "w1", 1, "released")

    again = await store.claim_next(["q"], "w2", 30)
    assert (again.id, again.attempt, again.lease_token) == (held.id, 2, 2)


async def test_release_by_another_owner_or_with_a_wrong_lease_is_a_conflict(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict, match="it is claimed by ann"):
        await store.release(held.id, "bob", held.lease_token)
    with pytest.raises(Conflict, match="is stale"):
        await store.release(held.id, "ann", held.lease_token + 1)
    with pytest.raises(NotFound):
        await store.release("td_nope", "ann", 1)
    assert await fetch(pool, held.id) == held


# -- complete --------------------------------------------------------------------------


async def test_complete_marks_the_todo_done_with_its_result(store, pool):
    held = await claimed(store)
    before = await db_now(pool)
    done = await store.complete(held.id, "w1", held.lease_token, {"answer": 42})
    assert (done.state, done.result, done.owner, done.attempt) == ("done", {"answer": 42}, "w1", 1)
    assert done.lease_expires_at is None and done.completed_at >= before
    assert await fetch(pool, held.id) == done
    assert (await history(pool, held.id))[-1] == ("claimed", "done", "w1", 1, "completed")


async def test_complete_without_a_result_leaves_the_result_empty(store, pool):
    held = await claimed(store)
    done = await store.complete(held.id, "w1", held.lease_token)
    assert (done.state, done.result) == ("done", None)


async def test_complete_by_another_owner_is_a_conflict_and_changes_nothing(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict) as exc:
        await store.complete(held.id, "bob", held.lease_token, {"x": 1})
    assert str(exc.value) == f"cannot complete todo {held.id}: it is claimed by ann"
    assert await fetch(pool, held.id) == held
    assert len(await history(pool, held.id)) == 2


async def test_complete_twice_is_a_conflict_saying_it_is_done(store, pool):
    held = await claimed(store, assignee="w1")
    await store.complete(held.id, "w1", held.lease_token, {"n": 1})
    with pytest.raises(Conflict) as exc:
        await store.complete(held.id, "w1", held.lease_token, {"n": 2})
    assert str(exc.value).startswith(f"cannot complete todo {held.id}: it is done")
    assert "assigned to w1" in str(exc.value)
    assert exc.value.current == {"state": "done", "owner": "w1", "assignee": "w1"}
    assert (await fetch(pool, held.id)).result == {"n": 1}


async def test_complete_of_an_unknown_todo_is_not_found(store):
    with pytest.raises(NotFound, match="no todo td_nope"):
        await store.complete("td_nope", "w1", 1)


async def test_a_conflict_on_a_finished_todo_names_its_last_owner(store, pool):
    """A done or failed todo keeps its last owner; the miss says whose it was."""
    held = await claimed(store, "agent-zed")
    await store.complete(held.id, "agent-zed", held.lease_token)
    with pytest.raises(Conflict) as exc:
        await store.complete(held.id, "bob", 1)
    assert "agent-zed" in str(exc.value)


# -- complete_many, complete_and_claim_next --------------------------------------------


async def test_complete_many_completes_every_item_with_its_own_result(store, pool):
    await store.create_many([new(title=str(i)) for i in range(3)])
    held = await store.claim_batch(["q"], "w1", 30, 3)
    done = await store.complete_many(
        "w1", [(t.id, t.lease_token, {"title": t.title}) for t in held]
    )
    assert sorted(t.id for t in done) == sorted(t.id for t in held)
    for t in held:
        stored = await fetch(pool, t.id)
        assert (stored.state, stored.result) == ("done", {"title": t.title})
        assert (await history(pool, t.id))[-1] == ("claimed", "done", "w1", 1, "completed")


async def test_complete_many_with_a_stale_item_raises_a_conflict_naming_it(store, pool):
    await store.create_many([new(), new()])
    good, stale = await store.claim_batch(["q"], "w1", 30, 2)
    with pytest.raises(Conflict) as exc:
        await store.complete_many(
            "w1", [(good.id, good.lease_token, None), (stale.id, stale.lease_token + 1, None)]
        )
    assert stale.id in str(exc.value) and "is stale" in str(exc.value)
    assert (await fetch(pool, stale.id)).state == "claimed"


async def test_complete_many_completes_nothing_when_one_item_misses(store, pool):
    """All or nothing: the matched items are not left done when another one misses."""
    await store.create_many([new(), new()])
    good, stale = await store.claim_batch(["q"], "w1", 30, 2)
    with pytest.raises(Conflict):
        await store.complete_many(
            "w1", [(good.id, good.lease_token, None), (stale.id, stale.lease_token + 1, None)]
        )
    assert (await fetch(pool, good.id)).state == "claimed"


async def test_complete_many_with_a_repeated_item_completes_it_once_or_refuses_it(store, pool):
    """Once crashed with RuntimeError (StopIteration) after completing the todo."""
    held = await claimed(store)
    item = (held.id, held.lease_token, None)
    try:
        done = await store.complete_many("w1", [item, item])
    except (InvalidInput, Conflict):
        assert (await fetch(pool, held.id)).state == "claimed"
        return
    assert {t.id for t in done} == {held.id}
    assert (await fetch(pool, held.id)).state == "done"


async def test_complete_and_claim_next_completes_one_and_claims_the_oldest_next(store, pool):
    held = await claimed(store, title="first")
    second = (await store.create(new(title="second"))).todo
    third = (await store.create(new(title="third"))).todo
    await set_age(pool, third.id, 50)

    done, nxt = await store.complete_and_claim_next(
        held.id, "w1", held.lease_token, {"ok": 1}, ["q"], 30
    )
    assert (done.id, done.state, done.result) == (held.id, "done", {"ok": 1})
    assert (nxt.id, nxt.state, nxt.owner, nxt.attempt) == (third.id, "claimed", "w1", 1)
    assert (await history(pool, held.id))[-1] == ("claimed", "done", "w1", 1, "completed")
    assert (await history(pool, third.id))[-1] == ("pending", "claimed", "w1", 1, "claimed")
    assert (await fetch(pool, second.id)).state == "pending"


async def test_complete_and_claim_next_with_an_empty_queue_completes_and_claims_none(store, pool):
    held = await claimed(store)
    done, nxt = await store.complete_and_claim_next(held.id, "w1", held.lease_token, None,
                                                    ["q"], 30)
    assert done.state == "done" and nxt is None


async def test_complete_and_claim_next_claims_nothing_when_the_complete_misses(store, pool):
    held = await claimed(store, "ann")
    waiting = (await store.create(new())).todo
    with pytest.raises(Conflict, match="is stale"):
        await store.complete_and_claim_next(held.id, "ann", held.lease_token + 1, None, ["q"], 30)
    assert await fetch(pool, held.id) == held
    assert await fetch(pool, waiting.id) == waiting
    assert await history(pool, waiting.id) == [(None, "pending", "producer", 0, "created")]


# -- fail ------------------------------------------------------------------------------


async def test_fail_below_the_cap_backs_off_two_to_the_attempt_seconds(store, pool):
    held = await claimed(store, max_attempts=4)
    for attempt in (1, 2, 3):
        before = await db_now(pool)
        failed = await store.fail(held.id, "w1", held.lease_token, f"error {attempt}")
        after = await db_now(pool)
        delay = timedelta(seconds=2 ** attempt)
        assert (failed.state, failed.owner, failed.attempt) == ("pending", None, attempt)
        assert failed.last_error == f"error {attempt}" and failed.lease_expires_at is None
        assert before + delay <= failed.next_retry_at <= after + delay
        assert (await history(pool, held.id))[-1] == (
            "claimed", "pending", "w1", attempt, f"error {attempt}")
        await make_retry_due(pool, held.id)
        held = await store.claim(held.id, "w1", 30)


async def test_fail_at_the_cap_dead_letters_after_backing_off(store, pool):
    held = await claimed(store, max_attempts=2)
    first = await store.fail(held.id, "w1", held.lease_token, "first")
    assert first.state == "pending" and first.next_retry_at is not None
    await make_retry_due(pool, held.id)
    again = await store.claim(held.id, "w1", 30)

    dead = await store.fail(held.id, "w1", again.lease_token, "second")
    assert (dead.state, dead.attempt, dead.last_error, dead.owner) == ("failed", 2, "second", "w1")
    assert dead.next_retry_at is None and dead.completed_at is not None
    assert (await history(pool, held.id))[-1] == ("claimed", "failed", "w1", 2, "second")
    assert await store.claim_next(["q"], "w1", 30) is None


async def test_backoff_is_capped_at_one_hour(store, pool):
    todo = (await store.create(new(max_attempts=100))).todo
    await pool.execute("UPDATE todos SET attempt = 11 WHERE id = $1", todo.id)
    held = await store.claim(todo.id, "w1", 30)
    before = await db_now(pool)
    failed = await store.fail(held.id, "w1", held.lease_token, "slow")
    after = await db_now(pool)
    assert failed.attempt == 12
    assert before + timedelta(hours=1) <= failed.next_retry_at <= after + timedelta(hours=1)


async def test_fail_by_another_owner_or_with_a_stale_lease_is_a_conflict(store, pool):
    held = await claimed(store, "ann")
    with pytest.raises(Conflict, match="it is claimed by ann"):
        await store.fail(held.id, "bob", held.lease_token, "x")
    with pytest.raises(Conflict, match="is stale"):
        await store.fail(held.id, "ann", held.lease_token - 1, "x")
    with pytest.raises(NotFound):
        await store.fail("td_nope", "ann", 1, "x")
    assert await fetch(pool, held.id) == held


async def test_fail_without_an_error_text_is_invalid(store, pool):
    held = await claimed(store)
    for error in ("", "   ", None):
        with pytest.raises(InvalidInput) as exc:
            await store.fail(held.id, "w1", held.lease_token, error)
        assert exc.value.field == "error"
    assert await fetch(pool, held.id) == held


# -- the reaper ------------------------------------------------------------------------


async def test_reap_puts_an_expired_lease_back_with_a_backoff_and_says_whose_it_was(store, pool):
    held = await claimed(store, "ann")
    live = await claimed(store, "bob")
    await expire_lease(pool, held.id)
    before = await db_now(pool)
    reaped = await store.reap()
    after = await db_now(pool)

    assert [t.id for t in reaped] == [held.id]
    todo = reaped[0]
    assert (todo.state, todo.owner, todo.attempt) == ("pending", None, 1)
    assert todo.last_error == "lease expired (owner ann)"
    assert before + timedelta(seconds=2) <= todo.next_retry_at <= after + timedelta(seconds=2)
    assert (await history(pool, held.id))[-1] == (
        "claimed", "pending", "reaper", 1, "lease expired (owner ann)")
    assert await fetch(pool, live.id) == live


async def test_reap_at_the_cap_dead_letters(store, pool):
    held = await claimed(store, "ann", max_attempts=1)
    await expire_lease(pool, held.id)
    [todo] = await store.reap()
    assert (todo.state, todo.attempt, todo.next_retry_at) == ("failed", 1, None)
    assert todo.last_error == "lease expired (owner ann)" and todo.completed_at is not None
    assert (await history(pool, held.id))[-1] == (
        "claimed", "failed", "reaper", 1, "lease expired (owner ann)")


async def test_reap_takes_at_most_limit_todos_per_call(store, pool):
    await store.create_many([new() for _ in range(5)])
    held = await store.claim_batch(["q"], "w1", 30, 5)
    await pool.execute("UPDATE todos SET lease_expires_at = now() - interval '1 minute'")
    assert len(await store.reap(limit=2)) == 2
    assert len(await store.reap(limit=10)) == 3
    assert await store.reap() == []
    assert len(held) == 5


async def test_reap_never_reopens_a_todo_completed_while_it_ran(dsn, store, pool):
    held = await claimed(store, "ann")
    await expire_lease(pool, held.id)
    worker = await dbmod.connect(dsn)
    try:
        async with worker.transaction():
            # The late worker's complete holds the row while the reaper runs.
            await Store(worker).complete(held.id, "ann", held.lease_token, None)
            assert await store.reap() == []
        assert await store.reap() == []
    finally:
        await worker.close()
    assert (await fetch(pool, held.id)).state == "done"
    assert [h[3] for h in await history(pool, held.id) if h[2] == "reaper"] == []


async def test_reap_leaves_done_and_failed_todos_alone(store, pool):
    done = await claimed(store)
    await store.complete(done.id, "w1", done.lease_token)
    dead = await dead_letter(store, pool)
    await store.reap()
    assert (await fetch(pool, done.id)).state == "done"
    assert (await fetch(pool, dead.id)).state == "failed"


async def test_promote_due_retries_clears_only_due_retry_times(store, pool):
    due = await claimed(store)
    await store.fail(due.id, "w1", due.lease_token, "x")
    later = await claimed(store)
    await store.fail(later.id, "w1", later.lease_token, "x")

    assert await store.promote_due_retries() == 0
    await make_retry_due(pool, due.id)
    assert await store.promote_due_retries() == 1
    assert (await fetch(pool, due.id)).next_retry_at is None
    assert (await fetch(pool, later.id)).next_retry_at is not None
    assert (await history(pool, due.id))[-1] == ("pending", "pending", "reaper", 1, "retry due")
    assert await store.promote_due_retries() == 0


# -- operators: retry, retry_many, force_release -------------------------------------


async def test_retry_gives_a_dead_letter_a_fresh_budget_by_default(store, pool):
    dead = await dead_letter(store, pool, max_attempts=2)
    todo = await store.retry(dead.id, "op-ann")
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 0, 2)
    assert (todo.owner, todo.completed_at, todo.next_retry_at) == (None, None, None)
    assert (await history(pool, dead.id))[-1] == (
        "failed", "pending", "op-ann", 0, "retried by operator: fresh budget")
    again = await store.claim_next(["q"], "w1", 30)
    assert (again.id, again.attempt) == (dead.id, 1)
    assert again.lease_token == 3


async def test_retry_with_one_more_attempt_raises_the_cap_by_one(store, pool):
    dead = await dead_letter(store, pool, max_attempts=2)
    todo = await store.retry(dead.id, "op-ann", one_more=True)
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 2, 3)
    assert (await history(pool, dead.id))[-1] == (
        "failed", "pending", "op-ann", 2, "retried by operator: one more attempt")

    held = await store.claim(dead.id, "w1", 30)
    assert (await store.fail(held.id, "w1", held.lease_token, "again")).state == "failed"


async def test_retry_is_refused_naming_the_live_todo_that_holds_the_key(store, pool):
    dead = await dead_letter(store, pool, idempotency_key="k")
    live = (await store.create(new(idempotency_key="k"))).todo
    before = await fingerprint(pool)
    with pytest.raises(Conflict) as exc:
        await store.retry(dead.id, "op-ann")
    assert live.id in str(exc.value) and "'k'" in str(exc.value)
    assert exc.value.current == {"live_todo": live.id}
    assert await fingerprint(pool) == before


async def test_retry_of_a_todo_that_is_not_dead_is_a_conflict(store, pool):
    todo = (await store.create(new())).todo
    with pytest.raises(Conflict, match=r"cannot retry todo .*: it is pending"):
        await store.retry(todo.id, "op-ann")
    with pytest.raises(NotFound):
        await store.retry("td_nope", "op-ann")


async def test_retry_many_retries_what_it_can_and_reports_each_refusal(store, pool):
    dead = [await dead_letter(store, pool) for _ in range(3)]
    blocked = await dead_letter(store, pool, idempotency_key="k")
    live = (await store.create(new(idempotency_key="k"))).todo

    report = await store.retry_many([d.id for d in dead] + [blocked.id, "td_nope"], "op-ann")
    assert report.retried == [d.id for d in dead]
    assert [todo_id for todo_id, _ in report.refused] == [blocked.id, "td_nope"]
    assert live.id in report.refused[0][1]
    assert report.refused[1][1] == "no todo td_nope"
    assert report.summary().startswith("3 retried, 2 refused: ")
    for d in dead:
        assert (await fetch(pool, d.id)).state == "pending"
    assert (await fetch(pool, blocked.id)).state == "failed"


async def test_force_release_takes_a_lease_back_and_records_the_operator(store, pool):
    held = await claimed(store, "dead-agent")
    todo = await store.force_release(held.id, "op-ann")
    assert (todo.state, todo.owner, todo.lease_expires_at, todo.attempt) == (
        "pending", None, None, 1)
    assert (await history(pool, held.id))[-1] == (
        "claimed", "pending", "op-ann", 1, "lease force-released (was held by dead-agent)")
    with pytest.raises(Conflict, match="it is pending"):
        await store.complete(held.id, "dead-agent", held.lease_token)


async def test_force_release_of_a_todo_that_is_not_claimed_is_a_conflict(store, pool):
    todo = (await store.create(new())).todo
    with pytest.raises(Conflict, match=r"cannot force-release todo .*: it is pending"):
        await store.force_release(todo.id, "op-ann")
    with pytest.raises(NotFound):
        await store.force_release("td_nope", "op-ann")
    assert len(await history(pool, todo.id)) == 1


# -- prune -----------------------------------------------------------------------------


async def test_prune_deletes_only_finished_todos_older_than_the_age(store, pool):
    old_done = await claimed(store)
    await store.complete(old_done.id, "w1", old_done.lease_token)
    old_dead = await dead_letter(store, pool)
    young_done = await claimed(store)
    await store.complete(young_done.id, "w1", young_done.lease_token)
    old_pending = (await store.create(new())).todo
    old_claimed = await claimed(store)
    await pool.execute(
        "UPDATE todos SET completed_at = now() - interval '2 days' WHERE id = ANY($1)",
        [old_done.id, old_dead.id],
    )
    await pool.execute(
        "UPDATE todos SET created_at = now() - interval '3 days' WHERE id = ANY($1)",
        [old_pending.id, old_claimed.id],
    )
    await pool.execute(
        "UPDATE todos SET completed_at = now() - interval '1 hour' WHERE id = $1", young_done.id
    )

    assert await store.prune(86400, batch=1) == 2
    left = {r["id"] for r in await pool.fetch("SELECT id FROM todos")}
    assert left == {young_done.id, old_pending.id, old_claimed.id}
    assert await history(pool, old_done.id) == []
    assert await store.prune(86400) == 0


# -- fencing ---------------------------------------------------------------------------


async def _lapse_and_reclaim(store, pool, first_owner: str, second_owner: str):
    old = await claimed(store, first_owner)
    await expire_lease(pool, old.id)
    [reaped] = await store.reap()
    assert reaped.state == "pending"
    await make_retry_due(pool, old.id)
    new_claim = await store.claim(old.id, second_owner, 30)
    assert new_claim.lease_token == old.lease_token + 1
    return old, new_claim


@pytest.mark.parametrize("second_owner", ["agent-b", "agent-a"], ids=["another", "same-name"])
async def test_a_lapsed_lease_cannot_act_after_the_todo_was_claimed_again(
    store, pool, second_owner
):
    old, current = await _lapse_and_reclaim(store, pool, "agent-a", second_owner)
    calls = {
        "heartbeat": lambda: store.heartbeat(old.id, "agent-a", old.lease_token, 600),
        "complete": lambda: store.complete(old.id, "agent-a", old.lease_token, {"by": "old"}),
        "fail": lambda: store.fail(old.id, "agent-a", old.lease_token, "old gave up"),
        "release": lambda: store.release(old.id, "agent-a", old.lease_token),
        "complete_and_claim_next": lambda: store.complete_and_claim_next(
            old.id, "agent-a", old.lease_token, {"by": "old"}, ["q"], 30),
    }
    for action, call in calls.items():
        with pytest.raises(Conflict) as exc:
            await call()
        assert f"it is claimed by {second_owner}" in str(exc.value), action
        if second_owner == "agent-a":
            assert (
                f"lease {old.lease_token} is stale (the current lease is {current.lease_token})"
                in str(exc.value)
            ), action
        assert await fetch(pool, old.id) == current, action

    done = await store.complete(old.id, second_owner, current.lease_token, {"by": "new"})
    assert done.result == {"by": "new"}
    with pytest.raises(Conflict, match="it is done"):
        await store.complete(old.id, "agent-a", old.lease_token, {"by": "old"})
    assert (await fetch(pool, old.id)).result == {"by": "new"}


async def test_a_lease_taken_back_by_an_operator_and_claimed_again_is_fenced(store, pool):
    old = await claimed(store, "agent-a")
    await store.force_release(old.id, "op-ann")
    current = await store.claim(old.id, "agent-a", 30)
    with pytest.raises(Conflict, match="is stale"):
        await store.complete(old.id, "agent-a", old.lease_token, {"by": "old"})
    assert (await store.complete(old.id, "agent-a", current.lease_token, {"by": "new"})).result \
        == {"by": "new"}


async def test_the_lease_token_is_never_reused_even_after_an_operator_retry(store, pool):
    dead = await dead_letter(store, pool, max_attempts=2)
    await store.retry(dead.id, "op-ann")
    again = await store.claim(dead.id, "w1", 30)
    assert again.attempt == 1
    assert again.lease_token == 3
    with pytest.raises(Conflict, match="is stale"):
        await store.complete(dead.id, "w1", 1)


# -- input bounds ----------------------------------------------------------------------

BAD_TTLS = [0, 0.5, -1, 43200.5, 86400, True, "30", None, math.nan, math.inf]


async def test_a_ttl_outside_one_second_to_twelve_hours_is_refused_and_writes_nothing(
    store, pool
):
    pending = (await store.create(new())).todo
    held = await claimed(store)
    before = await fingerprint(pool)
    for ttl in BAD_TTLS:
        calls = {
            "claim_next": lambda ttl=ttl: store.claim_next(["q"], "w1", ttl),
            "claim_batch": lambda ttl=ttl: store.claim_batch(["q"], "w1", ttl, 5),
            "claim": lambda ttl=ttl: store.claim(pending.id, "w1", ttl),
            "heartbeat": lambda ttl=ttl: store.heartbeat(held.id, "w1", held.lease_token, ttl),
            "complete_and_claim_next": lambda ttl=ttl: store.complete_and_claim_next(
                held.id, "w1", held.lease_token, None, ["q"], ttl),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidInput) as exc:
                await call()
            assert exc.value.field == "ttl", (name, ttl)
    assert await fingerprint(pool) == before


async def test_a_ttl_at_either_bound_is_accepted(store, pool):
    await store.create_many([new(), new()])
    for ttl in (1, 43200):
        todo = await store.claim_next(["q"], "w1", ttl)
        lease = (todo.lease_expires_at - todo.claimed_at).total_seconds()
        assert abs(lease - ttl) < 1, ttl


async def test_max_attempts_outside_one_to_a_hundred_is_refused_and_writes_nothing(store, pool):
    for max_attempts in (0, -1, 101, True, 2.5, "3", None):
        with pytest.raises(InvalidInput) as exc:
            await store.create(new(max_attempts=max_attempts))
        assert exc.value.field == "max_attempts", max_attempts
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0
    assert await pool.fetchval("SELECT count(*) FROM todo_history") == 0


async def test_max_attempts_at_either_bound_is_accepted(store):
    for max_attempts in (1, 100):
        assert (await store.create(new(max_attempts=max_attempts))).todo.max_attempts \
            == max_attempts


BAD_QUEUES = ["", "A", "Mail", "-x", "_x", ".x", "has space", "x" * 64, "é", "a/b", None, 7]


async def test_a_bad_queue_name_is_refused_and_writes_nothing(store, pool):
    await store.create(new(queue="ok"))
    before = await fingerprint(pool)
    for queue in BAD_QUEUES:
        with pytest.raises(InvalidInput) as exc:
            await store.create(new(queue=queue))
        assert exc.value.field == "queue", queue
        with pytest.raises(InvalidInput) as exc:
            await store.claim_next(["ok", queue], "w1", 30)
        assert exc.value.field == "queues", queue
    assert await fingerprint(pool) == before


async def test_claim_next_needs_a_non_empty_list_of_queues(store, pool):
    await store.create(new())
    for queues in ([], "q", None):
        with pytest.raises(InvalidInput) as exc:
            await store.claim_next(queues, "w1", 30)
        assert exc.value.field == "queues", queues
    assert await pool.fetchval("SELECT state::text FROM todos") == "pending"


async def test_good_queue_names_are_accepted(store):
    for queue in ("a", "0", "a.b_c-d", "x" * 63):
        assert (await store.create(new(queue=queue))).todo.queue == queue


async def test_a_queue_name_with_a_trailing_newline_is_refused_as_invalid_input(store, pool):
    """re.match with `$` accepts "q\\n"; the database CHECK does not."""
    with pytest.raises(InvalidInput):
        await store.create(new(queue="q\n"))


def _payload_of_size(size: int) -> dict:
    """A payload whose JSON encoding (compact, as the store measures it) is `size` bytes."""
    return {"x": "a" * (size - len('{"x":""}'))}


async def test_a_payload_at_the_size_limit_is_accepted(store):
    assert (await store.create(new(payload=_payload_of_size(MAX_JSON_BYTES)))).created


async def test_a_payload_over_256_kib_is_refused_and_writes_nothing(store, pool):
    with pytest.raises(InvalidInput) as exc:
        await store.create(new(payload=_payload_of_size(MAX_JSON_BYTES + 1)))
    assert exc.value.field == "payload"
    assert "262144" in exc.value.message
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_a_payload_that_is_not_a_json_object_is_refused_and_writes_nothing(store, pool):
    for payload in ([], ["a"], "text", 3, None):
        with pytest.raises(InvalidInput) as exc:
            await store.create(new(payload=payload))
        assert exc.value.field == "payload", payload
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_a_result_that_is_not_a_json_object_within_the_limit_is_refused(store, pool):
    held = await claimed(store)
    waiting = (await store.create(new())).todo
    before = await fingerprint(pool)
    for result in (["a"], "done", 1, _payload_of_size(MAX_JSON_BYTES + 1)):
        for call in (
            lambda r=result: store.complete(held.id, "w1", held.lease_token, r),
            lambda r=result: store.complete_many("w1", [(held.id, held.lease_token, r)]),
            lambda r=result: store.complete_and_claim_next(
                held.id, "w1", held.lease_token, r, ["q"], 30),
        ):
            with pytest.raises(InvalidInput) as exc:
                await call()
            assert exc.value.field == "result", str(result)[:20]
    assert await fingerprint(pool) == before
    assert (await fetch(pool, waiting.id)).state == "pending"


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("payload", {"payload": {"x": math.nan}}),
        ("payload", {"payload": {"at": datetime(2026, 1, 1)}}),
        ("payload", {"payload": {"x": "nul\x00byte"}}),
        ("title", {"title": "nul\x00byte"}),
    ],
    ids=["nan", "datetime", "nul-in-payload", "nul-in-title"],
)
async def test_a_value_postgres_cannot_store_is_refused_as_invalid_input(
    store, pool, field, fields
):
    """NaN, non-JSON types and NUL characters once escaped as raw asyncpg errors."""
    with pytest.raises(InvalidInput) as exc:
        await store.create(new(**fields))
    assert exc.value.field == field
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_an_empty_idempotency_key_is_either_refused_or_treated_as_no_key(store, pool):
    """Once: KeyError after counting the hit, and CardinalityViolation in a batch."""
    try:
        first = await store.create(new(idempotency_key=""))
    except InvalidInput as exc:
        assert exc.field == "idempotency_key"
        return
    second = await store.create(new(idempotency_key=""))
    batch = await store.create_many([new(idempotency_key=""), new(idempotency_key="")])
    assert first.created
    assert len({first.todo.id, second.todo.id, *(r.todo.id for r in batch)}) in (1, 4)


async def test_an_empty_owner_is_refused(store, pool):
    todo = (await store.create(new())).todo
    for call in (lambda: store.claim_next(["q"], "", 30), lambda: store.claim(todo.id, " ", 30)):
        with pytest.raises(InvalidInput) as exc:
            await call()
        assert exc.value.field == "owner"
    assert (await fetch(pool, todo.id)).state == "pending"


# -- history over a whole life -----------------------------------------------------------


async def test_a_todos_whole_life_is_in_its_history_one_row_per_transition(store, pool):
    todo = (await store.create(new(max_attempts=3, idempotency_key="life"))).todo
    await store.create(new(idempotency_key="life"))
    a = await store.claim_next(["q"], "w1", 30)
    await store.heartbeat(a.id, "w1", a.lease_token, 30)
    await store.release(a.id, "w1", a.lease_token)
    b = await store.claim(todo.id, "w2", 30)
    await expire_lease(pool, todo.id)
    await store.reap()
    await make_retry_due(pool, todo.id)
    await store.promote_due_retries()
    c = await store.claim(todo.id, "w3", 30)
    await store.fail(todo.id, "w3", c.lease_token, "gave up")
    await store.retry(todo.id, "op-ann")
    d = await store.claim(todo.id, "w4", 30)
    await store.force_release(todo.id, "op-bob")
    e = await store.claim(todo.id, "w5", 30)
    await store.complete(todo.id, "w5", e.lease_token, {"ok": True})

    assert [b.lease_token, c.lease_token, d.lease_token, e.lease_token] == [2, 3, 4, 5]
    assert await history(pool, todo.id) == [
        (None, "pending", "producer", 0, "created"),
        ("pending", "pending", "producer", 0, "duplicate delivery collapsed"),
        ("pending", "claimed", "w1", 1, "claimed"),
        ("claimed", "claimed", "w1", 1, "heartbeat"),
        ("claimed", "pending", "w1", 1, "released"),
        ("pending", "claimed", "w2", 2, "claimed by id"),
        ("claimed", "pending", "reaper", 2, "lease expired (owner w2)"),
        ("pending", "pending", "reaper", 2, "retry due"),
        ("pending", "claimed", "w3", 3, "claimed by id"),
        ("claimed", "failed", "w3", 3, "gave up"),
        ("failed", "pending", "op-ann", 0, "retried by operator: fresh budget"),
        ("pending", "claimed", "w4", 1, "claimed by id"),
        ("claimed", "pending", "op-bob", 1, "lease force-released (was held by w4)"),
        ("pending", "claimed", "w5", 2, "claimed by id"),
        ("claimed", "done", "w5", 2, "completed"),
    ]
