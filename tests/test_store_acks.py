"""What the holder of a lease does through Store: heartbeat, release, complete (one,
many, and complete-and-claim-next) and fail with its backoff and dead-letter at the cap.

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.models import Ack, Actor
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    assert_new_token,
    claimed,
    db_now,
    enqueue,
    expire_lease,
    history,
    last_step,
    make_retry_due,
    new_todo,
    set_age,
    snapshot,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- heartbeat -------------------------------------------------------------------------


async def test_heartbeat_extends_the_lease_from_now(module_store, module_pool):
    held = await claimed(module_store, ttl=5)
    before = await db_now(module_pool)
    beat = await module_store.heartbeat(held.id, "w1", held.lease_token, 600)
    after = await db_now(module_pool)
    ten_minutes = timedelta(seconds=600)
    assert before + ten_minutes <= beat.lease_expires_at <= after + ten_minutes
    assert before <= beat.heartbeat_at <= after
    assert (beat.state, beat.owner, beat.attempt, beat.lease_token) == ("claimed", "w1", 1, held.lease_token)
    assert_new_token(held.lease_token)
    # No history row: the row holds the heartbeat (DESIGN "History").
    assert await last_step(module_pool, held.id) == ("pending", "claimed", "agent", "w1", 1, "claimed by id")


async def test_heartbeat_succeeds_on_a_lapsed_lease_the_reaper_has_not_taken(module_store, module_pool):
    held = await claimed(module_store)
    await expire_lease(module_pool, held.id)
    beat = await module_store.heartbeat(held.id, "w1", held.lease_token, 30)
    assert beat.lease_expires_at > await db_now(module_pool)
    assert await module_store.reap() == []


async def test_heartbeat_by_another_owner_is_a_conflict_and_changes_nothing(module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    with pytest.raises(Conflict) as exc:
        await module_store.heartbeat(held.id, "bob", held.lease_token, 30)
    assert str(exc.value) == f"cannot heartbeat todo {held.id}: it is claimed by ann"
    assert await todo_row(module_pool, held.id) == held


async def test_heartbeat_with_a_wrong_lease_is_a_conflict_naming_both_leases(module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    with pytest.raises(Conflict) as exc:
        await module_store.heartbeat(held.id, "ann", held.lease_token + 5, 30)
    assert str(exc.value) == (
        f"cannot heartbeat todo {held.id}: it is claimed by ann; "
        f"lease {held.lease_token + 5} is stale (the current lease is {held.lease_token})"
    )
    assert await todo_row(module_pool, held.id) == held


async def test_heartbeat_on_a_pending_todo_is_a_conflict(module_store, module_pool):
    todo = await enqueue(module_store)
    with pytest.raises(Conflict, match="it is pending"):
        await module_store.heartbeat(todo.id, "w1", 0, 30)


# -- release ---------------------------------------------------------------------------


async def test_release_gives_the_todo_back_and_keeps_the_attempt_counted(module_store, module_pool):
    held = await claimed(module_store)
    released = await module_store.release(held.id, "w1", held.lease_token)
    assert (released.state, released.owner, released.lease_expires_at) == ("pending", None, None)
    assert (released.attempt, released.lease_token, released.next_retry_at) == (1, held.lease_token, None)
    assert await last_step(module_pool, held.id) == ("claimed", "pending", "agent", "w1", 1, "released")

    again = await module_store.claim_next(["q"], "w2", 30)
    assert (again.id, again.attempt) == (held.id, 2)
    assert_new_token(again.lease_token, held.lease_token)


def holder_call(store, action: str, todo_id: str, owner: str, lease: int):
    """One of the calls only the lease holder may make, with harmless arguments."""
    return {
        "heartbeat": lambda: store.heartbeat(todo_id, owner, lease, 30),
        "release": lambda: store.release(todo_id, owner, lease),
        "complete": lambda: store.complete(todo_id, owner, lease),
        "fail": lambda: store.fail(todo_id, owner, lease, "x"),
    }[action]()


@pytest.mark.parametrize("action", ["release", "fail"])
@pytest.mark.parametrize(
    ("owner", "lease_offset", "words"),
    [("bob", 0, "it is claimed by ann"), ("ann", 1, "is stale"), ("ann", -1, "is stale")],
    ids=["another-owner", "a-newer-lease", "an-older-lease"],
)
async def test_a_release_or_fail_without_the_holders_lease_is_a_conflict_and_changes_nothing(
    module_store, module_pool, action, owner, lease_offset, words
):
    held = await claimed(module_store, owner="ann")
    with pytest.raises(Conflict, match=words):
        await holder_call(module_store, action, held.id, owner, held.lease_token + lease_offset)
    assert await todo_row(module_pool, held.id) == held


@pytest.mark.parametrize("action", ["heartbeat", "release", "complete", "fail"])
async def test_a_holder_action_on_an_unknown_todo_is_not_found(module_store, action):
    with pytest.raises(NotFound, match="no todo td_nope"):
        await holder_call(module_store, action, "td_nope", "w1", 1)


# -- complete --------------------------------------------------------------------------


async def test_complete_marks_the_todo_done_with_its_result(module_store, module_pool):
    held = await claimed(module_store)
    before = await db_now(module_pool)
    done = await module_store.complete(held.id, "w1", held.lease_token, {"answer": 42})
    assert (done.state, done.result, done.owner, done.attempt) == ("done", {"answer": 42}, "w1", 1)
    assert done.lease_expires_at is None and done.completed_at >= before
    assert await todo_row(module_pool, held.id) == done
    assert await last_step(module_pool, held.id) == ("claimed", "done", "agent", "w1", 1, "completed")


async def test_complete_without_a_result_leaves_the_result_empty(module_store, module_pool):
    held = await claimed(module_store)
    done = await module_store.complete(held.id, "w1", held.lease_token)
    assert (done.state, done.result) == ("done", None)


async def test_complete_by_another_owner_is_a_conflict_and_changes_nothing(module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    with pytest.raises(Conflict) as exc:
        await module_store.complete(held.id, "bob", held.lease_token, {"x": 1})
    assert str(exc.value) == f"cannot complete todo {held.id}: it is claimed by ann"
    assert await todo_row(module_pool, held.id) == held
    assert len(await history(module_pool, held.id)) == 2


async def test_complete_twice_is_a_conflict_saying_it_is_done(module_store, module_pool):
    held = await claimed(module_store, assignee="w1")
    await module_store.complete(held.id, "w1", held.lease_token, {"n": 1})
    with pytest.raises(Conflict) as exc:
        await module_store.complete(held.id, "w1", held.lease_token, {"n": 2})
    assert str(exc.value).startswith(f"cannot complete todo {held.id}: it is done")
    assert "assigned to w1" in str(exc.value)
    assert exc.value.current == {"state": "done", "owner": "w1", "assignee": "w1"}
    assert (await todo_row(module_pool, held.id)).result == {"n": 1}


async def test_a_conflict_on_a_finished_todo_names_its_last_owner(module_store, module_pool):
    """A done or failed todo keeps its last owner; the miss says whose it was."""
    held = await claimed(module_store, owner="agent-zed")
    await module_store.complete(held.id, "agent-zed", held.lease_token)
    with pytest.raises(Conflict) as exc:
        await module_store.complete(held.id, "bob", 1)
    assert "agent-zed" in str(exc.value)


# -- complete_many, complete_and_claim_next --------------------------------------------


async def test_complete_many_completes_every_item_with_its_own_result(module_store, module_pool):
    await module_store.create_many([new_todo(title=str(i)) for i in range(3)])
    held = await module_store.claim_batch(["q"], "w1", 30, 3)
    done = await module_store.complete_many("w1", [(t.id, t.lease_token, {"title": t.title}) for t in held])
    assert sorted(t.id for t in done) == sorted(t.id for t in held)
    for t in held:
        stored = await todo_row(module_pool, t.id)
        assert (stored.state, stored.result) == ("done", {"title": t.title})
        assert await last_step(module_pool, t.id) == ("claimed", "done", "agent", "w1", 1, "completed")


async def test_complete_many_with_a_stale_item_raises_a_conflict_naming_it(module_store, module_pool):
    await module_store.create_many([new_todo(), new_todo()])
    good, stale = await module_store.claim_batch(["q"], "w1", 30, 2)
    with pytest.raises(Conflict) as exc:
        await module_store.complete_many(
            "w1", [(good.id, good.lease_token, None), (stale.id, stale.lease_token + 1, None)]
        )
    assert stale.id in str(exc.value) and "is stale" in str(exc.value)
    assert (await todo_row(module_pool, stale.id)).state == "claimed"


async def test_complete_many_completes_nothing_when_one_item_misses(module_store, module_pool):
    """All or nothing: the matched items are not left done when another one misses."""
    await module_store.create_many([new_todo(), new_todo()])
    good, stale = await module_store.claim_batch(["q"], "w1", 30, 2)
    with pytest.raises(Conflict):
        await module_store.complete_many(
            "w1", [(good.id, good.lease_token, None), (stale.id, stale.lease_token + 1, None)]
        )
    assert (await todo_row(module_pool, good.id)).state == "claimed"


async def test_complete_many_refuses_a_batch_naming_one_todo_twice_and_changes_nothing(
    module_store, module_pool
):
    """Once crashed with RuntimeError (StopIteration) after completing the todo."""
    held = await claimed(module_store)
    item = (held.id, held.lease_token, None)
    before = await snapshot(module_pool)
    with pytest.raises(InvalidInput) as exc:
        await module_store.complete_many("w1", [item, item])
    assert exc.value.field == "todos"
    assert (await todo_row(module_pool, held.id)).state == "claimed"
    assert await snapshot(module_pool) == before


async def test_complete_and_claim_next_completes_one_and_claims_the_oldest_next(module_store, module_pool):
    held = await claimed(module_store, title="first")
    second = await enqueue(module_store, title="second")
    third = await enqueue(module_store, title="third")
    await set_age(module_pool, third.id, 50)

    done, nxt = await module_store.complete_and_claim_next(
        held.id, "w1", held.lease_token, {"ok": 1}, ["q"], 30
    )
    assert (done.id, done.state, done.result) == (held.id, "done", {"ok": 1})
    assert (nxt.id, nxt.state, nxt.owner, nxt.attempt) == (third.id, "claimed", "w1", 1)
    assert await last_step(module_pool, held.id) == ("claimed", "done", "agent", "w1", 1, "completed")
    assert await last_step(module_pool, third.id) == ("pending", "claimed", "agent", "w1", 1, "claimed")
    assert (await todo_row(module_pool, second.id)).state == "pending"


async def test_complete_and_claim_next_with_an_empty_queue_completes_and_claims_none(
    module_store, module_pool
):
    held = await claimed(module_store)
    done, nxt = await module_store.complete_and_claim_next(held.id, "w1", held.lease_token, None, ["q"], 30)
    assert done.state == "done" and nxt is None


async def test_complete_and_claim_next_claims_nothing_when_the_complete_misses(module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    waiting = await enqueue(module_store)
    with pytest.raises(Conflict, match="is stale"):
        await module_store.complete_and_claim_next(held.id, "ann", held.lease_token + 1, None, ["q"], 30)
    assert await todo_row(module_pool, held.id) == held
    assert await todo_row(module_pool, waiting.id) == waiting
    assert await history(module_pool, waiting.id) == [(None, "pending", "producer", "producer", 0, "created")]


# -- fail ------------------------------------------------------------------------------


async def test_fail_below_the_cap_backs_off_at_most_two_to_the_attempt_seconds(module_store, module_pool):
    held = await claimed(module_store, max_attempts=4)
    for attempt in (1, 2, 3):
        before = await db_now(module_pool)
        failed = await module_store.fail(held.id, "w1", held.lease_token, f"error {attempt}")
        after = await db_now(module_pool)
        delay = timedelta(seconds=2**attempt)
        assert (failed.state, failed.owner, failed.attempt) == ("pending", None, attempt)
        assert failed.last_error == f"error {attempt}" and failed.lease_expires_at is None
        assert before <= failed.next_retry_at <= after + delay  # full jitter: [0, 2^attempt] s
        step = await last_step(module_pool, held.id)
        assert step == ("claimed", "pending", "agent", "w1", attempt, f"error {attempt}")
        await make_retry_due(module_pool, held.id)
        held = await module_store.claim(held.id, "w1", 30)


async def test_fail_at_the_cap_dead_letters_after_backing_off(module_store, module_pool):
    held = await claimed(module_store, max_attempts=2)
    first = await module_store.fail(held.id, "w1", held.lease_token, "first")
    assert first.state == "pending" and first.next_retry_at is not None
    await make_retry_due(module_pool, held.id)
    again = await module_store.claim(held.id, "w1", 30)

    dead = await module_store.fail(held.id, "w1", again.lease_token, "second")
    assert (dead.state, dead.attempt, dead.last_error, dead.owner) == ("failed", 2, "second", "w1")
    assert dead.next_retry_at is None and dead.completed_at is not None
    assert await last_step(module_pool, held.id) == ("claimed", "failed", "agent", "w1", 2, "second")
    assert await module_store.claim_next(["q"], "w1", 30) is None


async def test_backoff_is_capped_at_one_hour(module_store, module_pool):
    todo = await enqueue(module_store, max_attempts=100)
    await module_pool.execute("UPDATE todos SET attempt = 11 WHERE id = $1", todo.id)
    held = await module_store.claim(todo.id, "w1", 30)
    before = await db_now(module_pool)
    failed = await module_store.fail(held.id, "w1", held.lease_token, "slow")
    after = await db_now(module_pool)
    assert failed.attempt == 12
    assert before <= failed.next_retry_at <= after + timedelta(hours=1)


async def test_fail_without_an_error_text_is_invalid(module_store, module_pool):
    held = await claimed(module_store)
    for error in ("", "   ", None):
        with pytest.raises(InvalidInput) as exc:
            await module_store.fail(held.id, "w1", held.lease_token, error)
        assert exc.value.field == "error"
    assert await todo_row(module_pool, held.id) == held


# -- who the history says moved it ------------------------------------------------------


async def test_every_row_a_lease_holder_writes_is_kind_agent_whatever_its_name_looks_like(
    module_store, module_pool
):
    owner = "operator:admin"  # an owner is any text; only its kind column says who it is
    first = await enqueue(module_store, max_attempts=1)
    second = await enqueue(module_store)
    third = await enqueue(module_store)
    [held] = await module_store.claim_batch(["q"], owner, 30, 1)
    held = await module_store.heartbeat(held.id, owner, held.lease_token, 30)
    await module_store.fail(held.id, owner, held.lease_token, "lease force-released (was held by x)")
    held = await module_store.claim(second.id, owner, 30)
    held = await module_store.release(held.id, owner, held.lease_token)
    held = await module_store.claim_next(["q"], owner, 30)
    _, nxt = await module_store.complete_and_claim_next(held.id, owner, held.lease_token, None, ["q"], 30)
    await module_store.complete_many(owner, [(nxt.id, nxt.lease_token, None)])

    written = [step for todo in (first, second, third) for step in await history(module_pool, todo.id)]
    assert {(s.actor_kind, s.actor) for s in written if s.note != "created"} == {("agent", owner)}
    assert len(written) == 3 + 8  # the heartbeat writes none: the row holds it


async def test_a_plain_string_is_not_an_actor(module_control, module_store, module_pool):
    dead = await claimed(module_store)
    for call in (
        lambda: module_store.create(new_todo(), actor="operator:admin"),
        lambda: module_control.force_release(dead.id, "operator:admin"),
        lambda: module_control.retry(dead.id, Actor("admin", "x")),
        lambda: module_control.force_release(dead.id, Actor("operator", "")),
    ):
        with pytest.raises(InvalidInput) as exc:
            await call()
        assert exc.value.field == "actor"
    assert await todo_row(module_pool, dead.id) == dead
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 1


async def test_ack_and_claim_acks_each_on_its_own_and_claims_in_the_same_statement(module_store, module_pool):
    queue = "ack-and-claim"
    done, failing, stale = [await claimed(module_store, queue) for _ in range(3)]
    waiting = [await enqueue(module_store, queue) for _ in range(2)]

    answers, got = await module_store.ack_and_claim(
        "w1",
        [
            Ack(done.id, done.lease_token, result={"n": 1}),
            Ack(failing.id, failing.lease_token, error="boom"),
            Ack(stale.id, stale.lease_token + 1),
        ],
        [queue],
        30,
        5,
    )

    assert (answers[0].state, answers[0].result) == ("done", {"n": 1})
    assert (answers[1].state, answers[1].last_error) == ("pending", "boom")  # retried later
    assert isinstance(answers[2], Conflict)
    assert [t.id for t in got] == [t.id for t in waiting] and {t.owner for t in got} == {"w1"}
    together = await module_pool.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM todo_history"
        " WHERE (todo_id = $1 AND event = 'completed') OR (todo_id = ANY ($2) AND event = 'claimed')",
        done.id,
        [t.id for t in waiting],
    )
    assert together == 1  # the completion and the claims: one statement, one commit
