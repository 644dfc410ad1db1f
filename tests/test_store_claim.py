"""Claiming through Store: claim_next and claim_batch (oldest first, assignees, due
retries) and claim by id with its conflicts.

Time moves by SQL (created_at, next_retry_at set into the past), never by sleeping.

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.store import MAX_BATCH
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    assert_new_token,
    claimed,
    db_now,
    enqueue,
    history,
    last_step,
    make_retry_due,
    new_todo,
    set_age,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- claim_next, claim_batch -----------------------------------------------------------


async def test_claim_next_takes_the_oldest_todo_across_the_allowed_queues(module_store, module_pool):
    ages = {"a": 10, "b": 30, "c": 20, "other": 99}
    ids = {}
    for queue, age in ages.items():
        ids[queue] = (await enqueue(module_store, queue=queue)).id
        await set_age(module_pool, ids[queue], age)

    order = [await module_store.claim_next(["a", "b", "c"], "w1", 30) for _ in range(4)]
    assert [t.id for t in order[:3]] == [ids["b"], ids["c"], ids["a"]]
    assert order[3] is None
    assert (await todo_row(module_pool, ids["other"])).state == "pending"


async def test_claim_next_only_looks_at_the_queues_it_is_given(module_store, module_pool):
    old = await enqueue(module_store, queue="a")
    await set_age(module_pool, old.id, 100)
    young = await enqueue(module_store, queue="b")
    assert (await module_store.claim_next(["b"], "w1", 30)).id == young.id
    assert await module_store.claim_next(["b", "c"], "w1", 30) is None


async def test_claim_next_hands_out_a_lease_and_records_the_claim(module_store, module_pool):
    created = await enqueue(module_store)
    before = await db_now(module_pool)
    todo = await module_store.claim_next(["q"], "w1", 90)
    after = await db_now(module_pool)

    assert todo.id == created.id
    assert (todo.state, todo.owner, todo.attempt) == ("claimed", "w1", 1)
    assert_new_token(todo.lease_token)
    assert before <= todo.claimed_at <= after
    assert before + timedelta(seconds=90) <= todo.lease_expires_at <= after + timedelta(seconds=90)
    assert await todo_row(module_pool, todo.id) == todo
    assert await history(module_pool, todo.id) == [
        (None, "pending", "producer", "producer", 0, "created"),
        ("pending", "claimed", "agent", "w1", 1, "claimed"),
    ]


async def test_claim_next_returns_none_when_nothing_is_pending(module_store):
    assert await module_store.claim_next(["q"], "w1", 30) is None


async def test_claim_next_skips_todos_assigned_to_someone_else(module_store, module_pool):
    for_bob = await enqueue(module_store, assignee="bob")
    await set_age(module_pool, for_bob.id, 60)
    anyone = await enqueue(module_store)
    await set_age(module_pool, anyone.id, 30)
    for_ann = await enqueue(module_store, assignee="ann")

    ann_first = await module_store.claim_next(["q"], "ann", 30)
    ann_second = await module_store.claim_next(["q"], "ann", 30)
    assert (ann_first.id, ann_second.id) == (anyone.id, for_ann.id)
    assert await module_store.claim_next(["q"], "ann", 30) is None
    assert (await module_store.claim_next(["q"], "bob", 30)).id == for_bob.id


async def test_claim_next_skips_a_retry_that_is_not_due_and_takes_it_once_due(module_store, module_pool):
    held = await claimed(module_store)
    retrying = await module_store.fail(held.id, "w1", held.lease_token, "flaky")
    assert retrying.state == "pending" and retrying.next_retry_at is not None

    assert await module_store.claim_next(["q"], "w1", 30) is None
    await make_retry_due(module_pool, held.id)
    again = await module_store.claim_next(["q"], "w2", 30)
    assert again.id == held.id
    assert (again.attempt, again.next_retry_at) == (2, None)
    assert_new_token(again.lease_token, held.lease_token)


async def test_claim_batch_claims_at_most_n_oldest_first(module_store, module_pool):
    ids = [(await enqueue(module_store, title=str(i))).id for i in range(10)]
    for age, todo_id in zip(range(100, 0, -10), ids, strict=True):
        await set_age(module_pool, todo_id, age)

    first = await module_store.claim_batch(["q"], "w1", 30, 3)
    assert [t.id for t in first] == ids[:3]
    rest = await module_store.claim_batch(["q"], "w1", 30, 100)
    assert [t.id for t in rest] == ids[3:]
    assert await module_store.claim_batch(["q"], "w1", 30, 5) == []
    assert await module_pool.fetchval("SELECT count(*) FROM todo_history WHERE to_state = 'claimed'") == 10


async def test_claim_batch_refuses_a_batch_size_out_of_range(module_store, module_pool):
    await module_store.create(new_todo())
    for n in (-1, MAX_BATCH + 1):
        with pytest.raises(InvalidInput) as exc:
            await module_store.claim_batch(["q"], "w1", 30, n)
        assert exc.value.field == "n"
    assert (await module_pool.fetchval("SELECT state FROM todos")) == "pending"


# -- claim by id -----------------------------------------------------------------------


async def test_claim_by_id_takes_that_todo_and_records_it(module_store, module_pool):
    await module_store.create(new_todo(title="older"))
    wanted = await enqueue(module_store, title="wanted")
    todo = await module_store.claim(wanted.id, "w1", 30)
    assert todo.id == wanted.id
    assert (todo.state, todo.owner, todo.attempt) == ("claimed", "w1", 1)
    assert_new_token(todo.lease_token)
    assert await last_step(module_pool, wanted.id) == (
        "pending",
        "claimed",
        "agent",
        "w1",
        1,
        "claimed by id",
    )


async def test_claim_by_id_of_a_todo_assigned_to_me_succeeds(module_store):
    mine = await enqueue(module_store, assignee="w1")
    assert (await module_store.claim(mine.id, "w1", 30)).owner == "w1"


async def test_claim_by_id_of_a_todo_assigned_to_someone_else_is_a_conflict(module_store, module_pool):
    todo = await enqueue(module_store, assignee="bob")
    with pytest.raises(Conflict) as exc:
        await module_store.claim(todo.id, "ann", 30)
    assert str(exc.value) == f"cannot claim todo {todo.id}: it is pending, assigned to bob"
    assert exc.value.current == {"state": "pending", "owner": None, "assignee": "bob"}
    assert (await todo_row(module_pool, todo.id)).state == "pending"


async def test_claim_by_id_of_a_todo_held_by_another_owner_is_a_conflict(module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    with pytest.raises(Conflict) as exc:
        await module_store.claim(held.id, "bob", 30)
    assert str(exc.value) == f"cannot claim todo {held.id}: it is claimed by ann"
    assert exc.value.current == {"state": "claimed", "owner": "ann", "assignee": None}
    assert await todo_row(module_pool, held.id) == held


async def test_claim_by_id_of_a_retry_that_is_not_due_is_a_conflict_saying_when(module_store, module_pool):
    held = await claimed(module_store)
    retrying = await module_store.fail(held.id, "w1", held.lease_token, "flaky")
    with pytest.raises(Conflict) as exc:
        await module_store.claim(held.id, "w1", 30)
    assert f"it is pending, retrying at {retrying.next_retry_at.isoformat()}" in str(exc.value)


async def test_claim_by_id_of_an_unknown_todo_is_not_found(module_store, module_pool):
    with pytest.raises(NotFound, match="no todo td_nope"):
        await module_store.claim("td_nope", "w1", 30)


# -- give_back: a claim whose client went before it reached it ------------------------------


async def test_give_back_makes_the_todos_pending_again_uncounted_in_their_place_in_line(
    module_store, module_pool
):
    first = await enqueue(module_store, "q", "first", max_attempts=1)
    second = await enqueue(module_store, "q", "second", max_attempts=1)
    held = await module_store.claim_batch(["q"], "w1", 300, 2)
    given = await module_store.give_back(held, "w1")
    assert {(t.id, t.state, t.owner, t.attempt) for t in given} == {
        (first.id, "pending", None, 0),
        (second.id, "pending", None, 0),
    }
    assert (await last_step(module_pool, first.id)) == (
        "claimed",
        "pending",
        "agent",
        "w1",
        0,
        "given back: the claimer disconnected before the claim reached it (attempt not counted)",
    )
    again = await module_store.claim_next(["q"], "w2", 300)  # the oldest is still first in line
    assert (again.id, again.attempt) == (first.id, 1)
    with pytest.raises(Conflict):
        await module_store.heartbeat(held[1].id, "w1", held[1].lease_token, 30)  # not held any more


async def test_give_back_leaves_alone_a_todo_no_longer_held_under_that_claim(module_store, module_pool):
    todo = await enqueue(module_store, "q")
    held = await module_store.claim_next(["q"], "w1", 300)
    await module_pool.execute(
        "UPDATE todos SET lease_expires_at = now() - interval '1 s' WHERE id = $1", todo.id
    )
    await module_store.reap()
    await make_retry_due(module_pool, todo.id)
    later = await module_store.claim(todo.id, "w1", 300)  # the same agent name, a later claim
    assert await module_store.give_back([held], "w1") == []
    row = await todo_row(module_pool, todo.id)
    assert (row.state, row.owner, row.attempt, row.lease_token) == ("claimed", "w1", 2, later.lease_token)
