"""What an operator does through Store: retry a dead-letter (fresh budget or one more
attempt), retry many, force-release a lease.

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

import pytest

from dashboard.errors import Conflict, NotFound
from dashboard.models import Actor
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    assert_new_token,
    claimed,
    dead_letter,
    enqueue,
    history,
    last_step,
    snapshot,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- operators: retry, retry_many, force_release -------------------------------------


async def test_retry_gives_a_dead_letter_a_fresh_budget_by_default(module_control, module_store, module_pool):
    dead = await dead_letter(module_store, module_pool, max_attempts=2)
    todo = await module_control.retry(dead.id, Actor("operator", "op-ann"))
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 0, 2)
    assert (todo.owner, todo.completed_at, todo.next_retry_at) == (None, None, None)
    step = await last_step(module_pool, dead.id)
    assert step == ("failed", "pending", "operator", "op-ann", 0, "retried by operator: fresh budget")
    again = await module_store.claim_next(["q"], "w1", 30)
    assert (again.id, again.attempt) == (dead.id, 1)
    assert_new_token(again.lease_token, dead.lease_token)


async def test_retry_with_one_more_attempt_raises_the_cap_by_one(module_control, module_store, module_pool):
    dead = await dead_letter(module_store, module_pool, max_attempts=2)
    todo = await module_control.retry(dead.id, Actor("operator", "op-ann"), one_more=True)
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 2, 3)
    step = await last_step(module_pool, dead.id)
    assert step == ("failed", "pending", "operator", "op-ann", 2, "retried by operator: one more attempt")

    held = await module_store.claim(dead.id, "w1", 30)
    assert (await module_store.fail(held.id, "w1", held.lease_token, "again")).state == "failed"


async def test_retry_is_refused_naming_the_live_todo_that_holds_the_key(
    module_control, module_store, module_pool
):
    dead = await dead_letter(module_store, module_pool, idempotency_key="k")
    live = await enqueue(module_store, idempotency_key="k")
    before = await snapshot(module_pool)
    with pytest.raises(Conflict) as exc:
        await module_control.retry(dead.id, Actor("operator", "op-ann"))
    assert live.id in str(exc.value) and "'k'" in str(exc.value)
    assert exc.value.current == {"live_todo": live.id}
    assert await snapshot(module_pool) == before


async def test_retry_many_retries_what_it_can_and_counts_what_it_could_not(
    module_control, module_store, module_pool
):
    dead = [await dead_letter(module_store, module_pool) for _ in range(3)]
    blocked = await dead_letter(module_store, module_pool, idempotency_key="k")
    live = await enqueue(module_store, idempotency_key="k")

    report = await module_control.retry_many(
        [d.id for d in dead] + [blocked.id, "td_nope"], Actor("operator", "op-ann")
    )
    assert sorted(t.id for t in report.changed) == sorted(d.id for d in dead)
    assert report.skipped == {"key held by a live todo": 1, "gone": 1}
    summary = report.summary()
    assert summary.startswith("3 retried; 2 skipped (1 no longer there, 1 key held by a live todo): ")
    assert f"cannot retry todo {blocked.id}: a live todo already holds key 'k'" in summary
    assert live.id in summary
    assert (await todo_row(module_pool, live.id)).state == "pending"
    for d in dead:
        assert (await todo_row(module_pool, d.id)).state == "pending"
    assert (await todo_row(module_pool, blocked.id)).state == "failed"


async def test_force_release_takes_a_lease_back_and_records_the_operator(
    module_control, module_store, module_pool
):
    held = await claimed(module_store, owner="dead-agent")
    todo = await module_control.force_release(held.id, Actor("operator", "op-ann"))
    assert (todo.state, todo.owner, todo.lease_expires_at, todo.attempt) == ("pending", None, None, 1)
    assert await last_step(module_pool, held.id) == (
        "claimed",
        "pending",
        "operator",
        "op-ann",
        1,
        "lease force-released (was held by dead-agent)",
    )
    with pytest.raises(Conflict, match="it is pending"):
        await module_store.complete(held.id, "dead-agent", held.lease_token)


def operator_call(control, action: str, todo_id: str):
    """retry or force-release by an operator."""
    if action == "retry":
        return control.retry(todo_id, Actor("operator", "op-ann"))
    return control.force_release(todo_id, Actor("operator", "op-ann"))


@pytest.mark.parametrize("action", ["retry", "force-release"])
async def test_an_operator_action_on_a_todo_in_the_wrong_state_is_a_conflict_and_records_nothing(
    module_control, module_store, module_pool, action
):
    """retry takes only a dead-letter, force-release only a claimed todo: a pending one is neither."""
    todo = await enqueue(module_store)
    with pytest.raises(Conflict, match=rf"cannot {action} todo .*: it is pending"):
        await operator_call(module_control, action, todo.id)
    assert len(await history(module_pool, todo.id)) == 1


@pytest.mark.parametrize("action", ["retry", "force-release"])
async def test_an_operator_action_on_an_unknown_todo_is_not_found(module_control, action):
    with pytest.raises(NotFound, match="no todo td_nope"):
        await operator_call(module_control, action, "td_nope")
