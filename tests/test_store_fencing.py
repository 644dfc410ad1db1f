"""Fencing: a lease that lapsed or was taken back can never act on the newer attempt, the
lease token is never reused, and a todo's whole life is in its history.

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

import pytest

from dashboard.errors import Conflict
from dashboard.models import Actor
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    MAX_LEASE_TOKEN,
    assert_new_token,
    claimed,
    enqueue,
    expire_lease,
    history,
    make_retry_due,
    new_todo,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- fencing ---------------------------------------------------------------------------


async def _lapse_and_reclaim(module_store, module_pool, first_owner: str, second_owner: str):
    old = await claimed(module_store, owner=first_owner)
    await expire_lease(module_pool, old.id)
    [reaped] = await module_store.reap()
    assert reaped.state == "pending"
    await make_retry_due(module_pool, old.id)
    new_claim = await module_store.claim(old.id, second_owner, 30)
    assert_new_token(new_claim.lease_token, old.lease_token)
    return old, new_claim


@pytest.mark.parametrize("second_owner", ["agent-b", "agent-a"], ids=["another", "same-name"])
async def test_a_lapsed_lease_cannot_act_after_the_todo_was_claimed_again(
    module_store, module_pool, second_owner
):
    old, current = await _lapse_and_reclaim(module_store, module_pool, "agent-a", second_owner)
    calls = {
        "heartbeat": lambda: module_store.heartbeat(old.id, "agent-a", old.lease_token, 600),
        "complete": lambda: module_store.complete(old.id, "agent-a", old.lease_token, {"by": "old"}),
        "fail": lambda: module_store.fail(old.id, "agent-a", old.lease_token, "old gave up"),
        "release": lambda: module_store.release(old.id, "agent-a", old.lease_token),
        "complete_and_claim_next": lambda: module_store.complete_and_claim_next(
            old.id, "agent-a", old.lease_token, {"by": "old"}, ["q"], 30
        ),
    }
    for action, call in calls.items():
        with pytest.raises(Conflict) as exc:
            await call()
        assert f"it is claimed by {second_owner}" in str(exc.value), action
        if second_owner == "agent-a":
            assert f"lease {old.lease_token} is stale (the current lease is {current.lease_token})" in str(
                exc.value
            ), action
        assert await todo_row(module_pool, old.id) == current, action

    done = await module_store.complete(old.id, second_owner, current.lease_token, {"by": "new"})
    assert done.result == {"by": "new"}
    with pytest.raises(Conflict, match="it is done"):
        await module_store.complete(old.id, "agent-a", old.lease_token, {"by": "old"})
    assert (await todo_row(module_pool, old.id)).result == {"by": "new"}


async def test_a_lease_taken_back_by_an_operator_and_claimed_again_is_fenced(
    module_control, module_store, module_pool
):
    old = await claimed(module_store, owner="agent-a")
    await module_control.force_release(old.id, Actor("operator", "op-ann"))
    current = await module_store.claim(old.id, "agent-a", 30)
    with pytest.raises(Conflict, match="is stale"):
        await module_store.complete(old.id, "agent-a", old.lease_token, {"by": "old"})
    assert (await module_store.complete(old.id, "agent-a", current.lease_token, {"by": "new"})).result == {
        "by": "new"
    }


async def test_the_lease_token_is_never_reused_even_after_an_operator_retry(
    module_control, module_store, module_pool
):
    first = await claimed(module_store, max_attempts=2)
    await module_store.fail(first.id, "w1", first.lease_token, "boom")
    await make_retry_due(module_pool, first.id)
    second = await module_store.claim(first.id, "w1", 30)
    assert (await module_store.fail(first.id, "w1", second.lease_token, "boom")).state == "failed"
    await module_control.retry(first.id, Actor("operator", "op-ann"))
    again = await module_store.claim(first.id, "w1", 30)
    assert again.attempt == 1
    assert_new_token(second.lease_token, first.lease_token)
    assert_new_token(again.lease_token, first.lease_token, second.lease_token)
    for stale in (first.lease_token, second.lease_token):
        with pytest.raises(Conflict, match="is stale"):
            await module_store.complete(first.id, "w1", stale)


async def test_tokens_are_drawn_at_random_from_1_to_2_to_the_53_never_the_current_one(
    module_store, module_pool
):
    """Random, not counted: no failover can make a promoted replica hand one out again
    (tests/test_failover.py). All 40 tokens below 2^40 would be a chance of 2^-520."""
    todo = await enqueue(module_store)
    tokens = []
    for _ in range(40):
        held = await module_store.claim(todo.id, "w1", 30)
        assert_new_token(held.lease_token, *tokens)
        tokens.append(held.lease_token)
        await module_store.release(todo.id, "w1", held.lease_token)
    assert max(tokens) >= 2**40
    # A draw is never the current token, at the ends of the range too.
    drawn = await module_pool.fetchrow(
        "SELECT bool_and(todo_lease_token(p) BETWEEN 1 AND $1 AND todo_lease_token(p) <> p) AS ok"
        " FROM unnest($2::bigint[]) AS p, generate_series(1, 20000)",
        MAX_LEASE_TOKEN,
        [0, 1, 2, MAX_LEASE_TOKEN - 1, MAX_LEASE_TOKEN],
    )
    assert drawn["ok"]


async def test_a_lease_handed_out_before_random_tokens_keeps_working_until_the_next_claim(
    module_store, module_pool
):
    """A todo claimed before migration 0013 keeps its small counted token: its holder's
    heartbeat, complete and fail still work; the next claim draws a random one."""
    done, failing = await claimed(module_store), await claimed(module_store, max_attempts=2)
    await module_pool.execute(
        "UPDATE todos SET lease_token = 3 WHERE id = ANY ($1::text[])", [done.id, failing.id]
    )  # as an older release's third claim left them
    assert (await module_store.heartbeat(done.id, "w1", 3, 60)).lease_token == 3
    assert (await module_store.complete(done.id, "w1", 3, {"ok": True})).result == {"ok": True}
    await module_store.heartbeat(failing.id, "w1", 3, 60)
    assert (await module_store.fail(failing.id, "w1", 3, "boom")).state == "pending"
    await make_retry_due(module_pool, failing.id)
    again = await module_store.claim(failing.id, "w2", 30)
    assert_new_token(again.lease_token, 3)
    with pytest.raises(Conflict, match="is stale"):
        await module_store.complete(failing.id, "w2", 3)


# -- history over a whole life -----------------------------------------------------------


async def test_a_todos_whole_life_is_in_its_history_one_row_per_transition_but_heartbeats(
    module_control, module_store, module_pool
):
    todo = await enqueue(module_store, max_attempts=3, idempotency_key="life")
    await module_store.create(new_todo(idempotency_key="life"))
    a = await module_store.claim_next(["q"], "w1", 30)
    await module_store.heartbeat(a.id, "w1", a.lease_token, 30)
    await module_store.release(a.id, "w1", a.lease_token)
    b = await module_store.claim(todo.id, "w2", 30)
    await expire_lease(module_pool, todo.id)
    await module_store.reap()
    await make_retry_due(module_pool, todo.id)
    await module_store.promote_due_retries()
    c = await module_store.claim(todo.id, "w3", 30)
    await module_store.fail(todo.id, "w3", c.lease_token, "gave up")
    await module_control.retry(todo.id, Actor("operator", "op-ann"))
    d = await module_store.claim(todo.id, "w4", 30)
    await module_control.force_release(todo.id, Actor("operator", "op-bob"))
    e = await module_store.claim(todo.id, "w5", 30)
    await module_store.complete(todo.id, "w5", e.lease_token, {"ok": True})

    tokens = [a.lease_token, b.lease_token, c.lease_token, d.lease_token, e.lease_token]
    for i, token in enumerate(tokens):
        assert_new_token(token, *tokens[:i])
    assert await history(module_pool, todo.id) == [
        (None, "pending", "producer", "producer", 0, "created"),
        ("pending", "pending", "producer", "producer", 0, "duplicate delivery collapsed"),
        ("pending", "claimed", "agent", "w1", 1, "claimed"),
        # the heartbeat: no row, the row holds it (DESIGN "History")
        ("claimed", "pending", "agent", "w1", 1, "released"),
        ("pending", "claimed", "agent", "w2", 2, "claimed by id"),
        ("claimed", "pending", "system", "reaper", 2, "lease expired (owner w2)"),
        ("pending", "pending", "system", "reaper", 2, "retry due"),
        ("pending", "claimed", "agent", "w3", 3, "claimed by id"),
        ("claimed", "failed", "agent", "w3", 3, "gave up"),
        ("failed", "pending", "operator", "op-ann", 0, "retried by operator: fresh budget"),
        ("pending", "claimed", "agent", "w4", 1, "claimed by id"),
        ("claimed", "pending", "operator", "op-bob", 1, "lease force-released (was held by w4)"),
        ("pending", "claimed", "agent", "w5", 2, "claimed by id"),
        ("claimed", "done", "agent", "w5", 2, "completed"),
    ]
