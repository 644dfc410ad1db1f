"""Creating todos through Store: create, idempotency keys, create_many, inline events.

History is checked row by row: (from, to, actor kind, actor, attempt, note).

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

import re

import pytest

from dashboard.errors import InvalidInput
from dashboard.models import ACTOR_KINDS, STATES, Actor, NewEvent
from dashboard.store import MAX_BATCH
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    claimed,
    dead_letter,
    history,
    last_step,
    new_todo,
    snapshot,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- the schema and the model agree ------------------------------------------------------


async def test_python_states_equal_the_todo_state_enum_in_the_database(module_pool):
    labels = await module_pool.fetchval(
        "SELECT array_agg(enumlabel ORDER BY enumsortorder) FROM pg_enum "
        "WHERE enumtypid = 'todo_state'::regtype"
    )
    assert tuple(labels) == STATES


async def test_python_actor_kinds_equal_the_history_check_in_the_database(module_pool):
    check = await module_pool.fetchval(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'actor_kind_known'"
    )
    assert tuple(re.findall(r"'(\w+)'::text", check)) == ACTOR_KINDS


# -- create ----------------------------------------------------------------------------


async def test_create_inserts_a_pending_todo_and_records_its_creation(module_store, module_pool):
    result = await module_store.create(
        new_todo(
            queue="mail",
            title="send it",
            kind="email",
            source="hook",
            payload={"to": "a@b"},
            idempotency_key="k1",
            assignee="ann",
            max_attempts=7,
        ),
        actor=Actor("producer", "ingest"),
    )
    todo = result.todo
    assert result.created is True
    assert todo.id.startswith("td_")
    assert (todo.queue, todo.title, todo.kind, todo.source) == ("mail", "send it", "email", "hook")
    assert todo.payload == {"to": "a@b"}
    assert (todo.idempotency_key, todo.assignee, todo.max_attempts) == ("k1", "ann", 7)
    assert (todo.state, todo.owner) == ("pending", None)
    assert (todo.attempt, todo.lease_token, todo.dedupe_hits) == (0, 0, 0)
    assert todo.next_retry_at is None and todo.lease_expires_at is None
    assert await todo_row(module_pool, todo.id) == todo
    assert await history(module_pool, todo.id) == [(None, "pending", "producer", "ingest", 0, "created")]


async def test_create_with_a_live_key_returns_the_live_todo_and_counts_the_duplicate(
    module_store, module_pool
):
    first = await module_store.create(new_todo(idempotency_key="k", title="first"))
    second = await module_store.create(new_todo(idempotency_key="k", title="second"))
    third = await module_store.create(new_todo(idempotency_key="k", title="third"))

    assert first.created is True
    assert (second.created, third.created) == (False, False)
    assert second.todo.id == third.todo.id == first.todo.id
    assert second.todo.title == "first"
    assert (second.todo.dedupe_hits, third.todo.dedupe_hits) == (1, 2)
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 1
    assert await history(module_pool, first.todo.id) == [
        (None, "pending", "producer", "producer", 0, "created"),
        ("pending", "pending", "producer", "producer", 0, "duplicate delivery collapsed"),
        ("pending", "pending", "producer", "producer", 0, "duplicate delivery collapsed"),
    ]


async def test_a_claimed_todo_still_holds_its_key_against_duplicates(module_store, module_pool):
    held = await claimed(module_store, idempotency_key="k")
    again = await module_store.create(new_todo(idempotency_key="k"))
    assert again.created is False
    assert again.todo.id == held.id and again.todo.state == "claimed"
    assert again.todo.dedupe_hits == 1
    step = await last_step(module_pool, held.id)
    assert step == ("claimed", "claimed", "producer", "producer", 1, "duplicate delivery collapsed")


async def test_a_todo_retrying_after_a_failure_still_holds_its_key(module_store, module_pool):
    held = await claimed(module_store, idempotency_key="k")
    await module_store.fail(held.id, "w1", held.lease_token, "flaky")
    again = await module_store.create(new_todo(idempotency_key="k"))
    assert again.created is False and again.todo.id == held.id
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 1


async def test_the_same_key_in_another_queue_makes_its_own_todo(module_store, module_pool):
    a = await module_store.create(new_todo(queue="a", idempotency_key="k"))
    b = await module_store.create(new_todo(queue="b", idempotency_key="k"))
    assert a.created and b.created and a.todo.id != b.todo.id


async def test_once_its_todo_is_done_the_same_key_makes_a_new_todo(module_store, module_pool):
    held = await claimed(module_store, idempotency_key="k")
    await module_store.complete(held.id, "w1", held.lease_token, {"ok": True})
    again = await module_store.create(new_todo(idempotency_key="k"))
    assert again.created is True
    assert again.todo.id != held.id and again.todo.state == "pending"
    assert (await todo_row(module_pool, held.id)).dedupe_hits == 0


async def test_once_its_todo_is_dead_lettered_the_same_key_makes_a_new_todo(module_store, module_pool):
    dead = await dead_letter(module_store, module_pool, idempotency_key="k")
    again = await module_store.create(new_todo(idempotency_key="k"))
    assert again.created is True and again.todo.id != dead.id


async def test_create_with_an_event_stores_the_event_and_links_it(module_store, module_pool):
    result = await module_store.create(
        new_todo(event=NewEvent(source="github", kind="push", payload={"ref": "main"}))
    )
    assert result.todo.event_id.startswith("ev_")
    event = await module_pool.fetchrow("SELECT * FROM events WHERE id = $1", result.todo.event_id)
    assert (event["source"], event["kind"], event["payload"]) == ("github", "push", {"ref": "main"})


# -- create_many -----------------------------------------------------------------------


async def test_create_many_collapses_in_batch_duplicates_and_answers_in_input_order(
    module_store, module_pool
):
    items = [
        new_todo(title="z1", idempotency_key="z"),
        new_todo(title="plain"),
        new_todo(title="a1", idempotency_key="a"),
        new_todo(title="z2", idempotency_key="z"),
        new_todo(title="m1", idempotency_key="m"),
        new_todo(title="z3", idempotency_key="z"),
        new_todo(title="a2", idempotency_key="a"),
    ]
    results = await module_store.create_many(items, actor=Actor("producer", "batcher"))

    assert [r.created for r in results] == [True, True, True, False, True, False, False]
    assert [r.todo.title for r in results] == ["z1", "plain", "a1", "z1", "m1", "z1", "a1"]
    z, a = results[0].todo, results[2].todo
    assert results[3].todo.id == results[5].todo.id == z.id
    assert results[6].todo.id == a.id
    assert (z.dedupe_hits, a.dedupe_hits, results[4].todo.dedupe_hits) == (2, 1, 0)
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 4
    assert await history(module_pool, z.id) == [(None, "pending", "producer", "batcher", 0, "created")]


async def test_create_many_counts_duplicates_of_a_live_todo_from_earlier(module_store, module_pool):
    live = await module_store.create(new_todo(idempotency_key="k"))
    results = await module_store.create_many([new_todo(idempotency_key="k"), new_todo(idempotency_key="k")])
    assert [r.created for r in results] == [False, False]
    assert {r.todo.id for r in results} == {live.todo.id}
    assert (await todo_row(module_pool, live.todo.id)).dedupe_hits == 2


async def test_create_many_creates_each_items_event(module_store, module_pool):
    results = await module_store.create_many(
        [
            new_todo(title="one", event=NewEvent(source="s1", kind="k1", payload={"n": 1})),
            new_todo(title="none"),
            new_todo(title="two", event=NewEvent(source="s2", kind="k2", payload={"n": 2})),
        ]
    )
    assert results[1].todo.event_id is None
    for result, (source, kind, n) in zip(
        (results[0], results[2]), (("s1", "k1", 1), ("s2", "k2", 2)), strict=True
    ):
        event = await module_pool.fetchrow("SELECT * FROM events WHERE id = $1", result.todo.event_id)
        assert (event["source"], event["kind"], event["payload"]) == (source, kind, {"n": n})
    assert await module_pool.fetchval("SELECT count(*) FROM events") == 2


async def test_create_many_refuses_the_whole_batch_naming_the_bad_item(module_store, module_pool):
    before = await snapshot(module_pool)
    with pytest.raises(InvalidInput) as exc:
        await module_store.create_many(
            [
                new_todo(event=NewEvent(source="s", kind="k")),
                new_todo(payload=["not", "an", "object"]),
            ]
        )
    assert exc.value.field == "todos[1].payload"
    assert await snapshot(module_pool) == before


async def test_create_many_refuses_more_than_the_batch_limit(module_store, module_pool):
    with pytest.raises(InvalidInput) as exc:
        await module_store.create_many([new_todo() for _ in range(MAX_BATCH + 1)])
    assert exc.value.field == "todos"
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0
