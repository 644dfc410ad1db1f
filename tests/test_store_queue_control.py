"""Queue control through the store (DESIGN.md "Queue control"): pause and resume, scheduled
todos and run now, priorities, cancellation that reaches the holder, edits, an assignee's
deadline, and bulk actions. Concurrency is real: each claimer has its own connection."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from dashboard import db as dbmod
from dashboard.errors import Cancelled, Conflict, InvalidInput
from dashboard.models import Actor, TodoEdit
from dashboard.store import Store
from tests.factories import (
    claimed,
    db_now,
    dead_letter,
    enqueue,
    history,
    last_step,
    new_todo,
    snapshot,
    todo_row,
)

OPERATOR = Actor("operator", "olga")


@pytest.fixture
def fresh(pool):
    """A new Store per call: no claimer positions remembered (a todo set behind a position
    would wait for the next full scan)."""
    return lambda: Store(pool)


# -- pause and resume ---------------------------------------------------------------------


async def test_claims_skip_a_paused_queue_and_take_from_the_others(control, store, pool):
    a = await enqueue(store, "a", "in a")
    b = await enqueue(store, "b", "in b")
    pause = await control.pause("a", OPERATOR, "deploy")
    assert (pause.queue, pause.actor_kind, pause.actor, pause.reason) == ("a", "operator", "olga", "deploy")
    assert (await store.claim_next(["a", "b"], "w1", 30)).id == b.id
    assert await store.claim_next(["a"], "w1", 30) is None
    with pytest.raises(Conflict, match="queue a is paused \\(deploy\\)"):
        await store.claim(a.id, "w1", 30)
    assert await control.resume("a", OPERATOR) is True
    assert (await store.claim_next(["a", "b"], "w1", 30)).id == a.id
    rows = await pool.fetch("SELECT action, actor_kind, actor, reason FROM queue_history ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("paused", "operator", "olga", "deploy"),
        ("resumed", "operator", "olga", None),
    ]


async def test_a_paused_queue_still_takes_work_and_its_held_leases_run_on(control, store):
    held = await claimed(store, "a", owner="w1")
    await control.pause("a", OPERATOR)
    created = await enqueue(store, "a", "while paused")
    assert created.state == "pending"
    await store.heartbeat(held.id, "w1", held.lease_token, 60)
    done = await store.complete(held.id, "w1", held.lease_token, {"ok": True})
    assert done.state == "done"


async def test_pausing_twice_keeps_the_first_pause_and_resuming_an_open_queue_says_so(control, store, pool):
    first = await control.pause("a", OPERATOR, "first")
    again = await control.pause("a", Actor("operator", "other"), "second")
    assert (again.actor, again.reason, again.paused_at) == ("olga", "first", first.paused_at)
    assert await control.resume("b", OPERATOR) is False
    assert await pool.fetchval("SELECT count(*) FROM queue_history") == 1


async def test_a_bad_queue_name_pauses_nothing(control, store, pool):
    with pytest.raises(InvalidInput, match="queue"):
        await control.pause("Not A Queue", OPERATOR)
    assert await pool.fetchval("SELECT count(*) FROM queue_pauses") == 0


async def test_sixteen_claimers_never_claim_from_the_paused_queue(control, dsn, store, pool):
    await store.create_many([new_todo("open", f"o{i}") for i in range(400)])
    await store.create_many([new_todo("held", f"h{i}") for i in range(400)])
    await control.pause("held", OPERATOR)
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(16)))

    async def claimer(conn, name):
        mine = Store(conn)
        while todo := await mine.claim_next(["held", "open"], name, 60):
            await mine.complete(todo.id, name, todo.lease_token)

    try:
        await asyncio.gather(*(claimer(c, f"w{i}") for i, c in enumerate(conns)))
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    counts = dict(await pool.fetch("SELECT queue, count(*) FROM todos WHERE state = 'done' GROUP BY queue"))
    assert counts == {"open": 400}
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE queue = 'held' AND state = 'pending'") == 400


# -- scheduled todos and run now ----------------------------------------------------------------


async def test_a_scheduled_todo_is_not_claimable_early_and_is_when_due_without_the_reaper(store, pool):
    run_at = await db_now(pool) + timedelta(seconds=2)
    todo = await enqueue(store, "s", run_at=run_at.isoformat())
    assert todo.ready_at == run_at
    assert todo.scheduled(await db_now(pool))
    assert (run_at - await db_now(pool)).total_seconds() > 1
    assert await store.claim_next(["s"], "w1", 30) is None  # a second or more early
    with pytest.raises(Conflict, match="scheduled for"):
        await store.claim(todo.id, "w1", 30)
    while await db_now(pool) < run_at:  # noqa: ASYNC110 (the database's clock decides; nothing to wake on)
        await asyncio.sleep(0.05)
    got = await store.claim_next(["s"], "w1", 30)
    assert got is not None and got.id == todo.id


async def test_delay_schedules_on_the_database_clock_and_run_now_makes_it_due(control, store, pool):
    before = await db_now(pool)
    todo = await enqueue(store, "s", delay=3600)
    assert timedelta(seconds=3599) < todo.ready_at - before < timedelta(seconds=3601)
    ready = await control.run_now(todo.id, OPERATOR)
    assert not ready.scheduled(await db_now(pool))
    assert (await store.claim_next(["s"], "w1", 30)).id == todo.id
    assert (await history(pool, todo.id))[1][:4] == ("pending", "pending", "operator", "olga")
    assert (await history(pool, todo.id))[1].note == "run now"


async def test_run_now_on_a_retrying_todo_clears_its_retry_and_on_a_ready_one_refuses(control, store, pool):
    todo = await claimed(store, "s", max_attempts=3)
    todo = await store.fail(todo.id, "w1", todo.lease_token, "later")
    await pool.execute(
        "UPDATE todos SET next_retry_at = now() + interval '1 hour', ready_at = now() + interval '1 hour'"
        " WHERE id = $1",
        todo.id,
    )
    ready = await control.run_now(todo.id, OPERATOR)
    assert ready.next_retry_at is None and ready.ready_at <= await db_now(pool)
    with pytest.raises(Conflict, match="is ready already: there is nothing to run now"):
        await control.run_now(todo.id, OPERATOR)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"delay": -1}, "delay"),
        ({"delay": 400 * 24 * 3600}, "delay"),
        ({"run_at": "tomorrow"}, "run_at"),
        ({"run_at": "2026-12-24T18:00:00"}, "run_at"),
        ({"run_at": "2099-01-01T00:00:00Z"}, "run_at"),
        ({"run_at": "2026-12-24T18:00:00Z", "delay": 5}, "run_at"),
        ({"priority": 11}, "priority"),
        ({"priority": True}, "priority"),
        ({"assignee_until": "2026-12-24T18:00:00Z"}, "assignee_until"),  # no assignee
    ],
)
async def test_bad_schedules_and_priorities_are_refused_and_create_nothing(store, pool, fields, field):
    before = await snapshot(pool)
    with pytest.raises(InvalidInput) as caught:
        await enqueue(store, "s", **fields)
    assert caught.value.field == field
    assert await snapshot(pool) == before


# -- priorities ---------------------------------------------------------------------------------


async def test_claims_take_the_highest_priority_first_and_the_oldest_within_it(store, fresh):
    made = [await enqueue(store, "p", f"{p}/{i}", priority=p) for i in range(3) for p in (0, 5, -3)]
    order = []
    mine = fresh()
    while todo := await mine.claim_next(["p"], "w1", 30):
        order.append(todo.title)
    assert len(made) == 9
    assert order == ["5/0", "5/1", "5/2", "0/0", "0/1", "0/2", "-3/0", "-3/1", "-3/2"]


async def test_a_higher_priority_todo_is_claimed_next_even_behind_the_claimers_position(store):
    """The claimer stands in priority 0's level; a todo enqueued later at priority 1 comes
    first on the very next claim, not at the next full scan."""
    for i in range(5):
        await enqueue(store, "p", f"low {i}")
    first = await store.claim_next(["p"], "w1", 30)
    assert first.title == "low 0"
    urgent = await enqueue(store, "p", "urgent", priority=1)
    assert (await store.claim_next(["p"], "w1", 30)).id == urgent.id
    assert (await store.claim_batch(["p"], "w1", 30, 10))[0].title == "low 1"


async def test_claimers_never_take_a_lower_priority_while_a_higher_one_is_claimable(dsn, store, pool):
    """Eight claimers on their own connections, 600 todos at three priorities. When a todo
    of priority p is claimed, the higher-priority todos claimed after it can only be ones
    that other claimers held locked at that moment: at most one each."""
    claimers = 8
    for p in (-1, 0, 1):
        await store.create_many([new_todo("p", f"{p}/{i}", priority=p) for i in range(200)])
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(claimers)))

    async def claimer(conn, name):
        mine = Store(conn)
        while todo := await mine.claim_next(["p"], name, 60):
            await mine.complete(todo.id, name, todo.lease_token)

    try:
        await asyncio.gather(*(claimer(c, f"w{i}") for i, c in enumerate(conns)))
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    rows = await pool.fetch("SELECT priority, claimed_at FROM todos WHERE queue = 'p' ORDER BY claimed_at")
    assert len(rows) == 600
    for row in rows:
        overtaken = sum(
            1 for r in rows if r["priority"] > row["priority"] and r["claimed_at"] > row["claimed_at"]
        )
        assert overtaken <= claimers - 1, (row, overtaken)


async def test_fifo_stays_exact_within_one_priority(store, fresh):
    for i in range(20):
        await enqueue(store, "f", f"{i:02d}", priority=2)
    mine = fresh()
    titles = [t.title for t in await mine.claim_batch(["f"], "w1", 30, 20)]
    assert titles == [f"{i:02d}" for i in range(20)]


# -- cancellation -------------------------------------------------------------------------------


async def test_a_pending_todo_is_cancelled_into_the_dead_letters_with_who_and_why(control, store, pool):
    todo = await enqueue(store, "c")
    cancelled = await control.cancel(todo.id, OPERATOR, "not needed")
    assert cancelled.state == "failed" and cancelled.cancelled
    assert (cancelled.cancelled_by_kind, cancelled.cancelled_by, cancelled.cancel_reason) == (
        "operator",
        "olga",
        "not needed",
    )
    assert await last_step(pool, todo.id) == (
        "pending",
        "failed",
        "operator",
        "olga",
        0,
        "cancelled: not needed",
    )


@pytest.mark.parametrize("call", ["heartbeat", "complete", "fail", "release"])
async def test_the_holder_of_a_cancelled_todo_learns_it_at_its_next_call(control, store, pool, call):
    todo = await claimed(store, "c", owner="w1")
    await control.cancel(todo.id, Actor("producer", "shop"), "order withdrawn")
    args = {
        "heartbeat": (todo.id, "w1", todo.lease_token, 30),
        "complete": (todo.id, "w1", todo.lease_token, {"sent": True}),
        "fail": (todo.id, "w1", todo.lease_token, "boom"),
        "release": (todo.id, "w1", todo.lease_token),
    }[call]
    with pytest.raises(
        Cancelled, match=r"cancelled by producer shop .*: order withdrawn; stop working on it"
    ):
        await getattr(store, call)(*args)
    row = await todo_row(pool, todo.id)
    assert (row.state, row.result, row.owner) == ("failed", None, "w1")


async def test_another_agent_of_a_cancelled_todo_gets_a_plain_conflict(control, store):
    todo = await claimed(store, "c", owner="w1")
    await control.cancel(todo.id, OPERATOR)
    with pytest.raises(Conflict) as caught:
        await store.complete(todo.id, "w2", todo.lease_token)
    assert not isinstance(caught.value, Cancelled)


async def test_a_cancelled_todo_is_retried_like_any_dead_letter(control, store, pool):
    todo = await enqueue(store, "c")
    await control.cancel(todo.id, OPERATOR, "oops")
    retried = await control.retry(todo.id, OPERATOR)
    assert retried.state == "pending" and not retried.cancelled and retried.cancel_reason is None
    assert (await store.claim_next(["c"], "w1", 30)).id == todo.id


async def test_a_finished_todo_cannot_be_cancelled(control, store):
    todo = await claimed(store, "c", owner="w1")
    await store.complete(todo.id, "w1", todo.lease_token)
    with pytest.raises(Conflict, match=r"cannot cancel .* it is done"):
        await control.cancel(todo.id, OPERATOR)


# -- edit ---------------------------------------------------------------------------------------


async def test_an_edit_records_what_changed_old_to_new_with_the_payload_as_a_diff(control, store, pool):
    todo = await enqueue(store, "e", "old title", payload={"a": 1, "b": 2})
    edited = await control.edit(
        todo.id, OPERATOR, TodoEdit(title="new title", priority=3, payload={"a": 1, "b": 5, "c": 6})
    )
    assert (edited.title, edited.priority, edited.payload) == ("new title", 3, {"a": 1, "b": 5, "c": 6})
    changes = await pool.fetchval(
        "SELECT changes FROM todo_history WHERE todo_id = $1 ORDER BY id DESC LIMIT 1", todo.id
    )
    assert changes == {
        "title": ["old title", "new title"],
        "priority": [0, 3],
        "payload": {"added": {"c": 6}, "removed": {}, "changed": {"b": [2, 5]}},
    }
    step = await last_step(pool, todo.id)
    assert step[:4] == ("pending", "pending", "operator", "olga")
    assert step.note == "edited: title old title → new title; payload +c ~b; priority 0 → 3"


async def test_a_claimed_todo_cannot_be_edited_and_nothing_changes(control, store, pool):
    todo = await claimed(store, "e", owner="w1")
    before = await snapshot(pool)
    with pytest.raises(Conflict, match="it is claimed by w1"):
        await control.edit(todo.id, OPERATOR, TodoEdit(title="x"))
    assert await snapshot(pool) == before


async def test_an_edit_that_changes_nothing_writes_nothing(control, store, pool):
    todo = await enqueue(store, "e", "same")
    await control.edit(todo.id, OPERATOR, TodoEdit(title="same"))
    assert len(await history(pool, todo.id)) == 1


async def test_edit_and_retry_corrects_a_dead_letter_in_one_step(control, store, pool):
    todo = await dead_letter(store, pool, "e", payload={"to": "bad@"})
    retried = await control.edit(todo.id, OPERATOR, TodoEdit(payload={"to": "good@example.com"}), retry=True)
    assert (retried.state, retried.attempt, retried.payload) == ("pending", 0, {"to": "good@example.com"})
    notes = [s.note for s in await history(pool, todo.id)][-2:]
    assert notes == ["retried by operator: fresh budget", "edited: payload ~to"]


async def test_edit_and_retry_is_both_or_neither(control, store, pool):
    """The retry is refused (a live todo holds the key): the edit is not kept either."""
    dead = await dead_letter(store, pool, "e", idempotency_key="k1")
    await enqueue(store, "e", "live", idempotency_key="k1")
    before = await snapshot(pool)
    with pytest.raises(Conflict, match="a live todo already holds key"):
        await control.edit(dead.id, OPERATOR, TodoEdit(title="fixed"), retry=True)
    assert await snapshot(pool) == before


async def test_rescheduling_a_pending_todo_and_bad_edits(control, store, pool):
    todo = await enqueue(store, "e")
    later = await db_now(pool) + timedelta(hours=2)
    edited = await control.edit(todo.id, OPERATOR, TodoEdit(run_at=later.isoformat()))
    assert edited.ready_at == later and edited.scheduled(await db_now(pool))
    before = await snapshot(pool)
    for edit, field in [
        (TodoEdit(priority=-11), "priority"),
        (TodoEdit(title=" "), "title"),
        (TodoEdit(max_attempts=0), "max_attempts"),
        (TodoEdit(payload=[1]), "payload"),
        (TodoEdit(run_at="soon"), "run_at"),
        (TodoEdit(), "edit"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            await control.edit(todo.id, OPERATOR, edit)
        assert caught.value.field == field
    assert await snapshot(pool) == before
    with pytest.raises(TypeError):
        TodoEdit(idempotency_key="k")  # not editable: not a field


# -- an assignee's deadline ---------------------------------------------------------------------


async def test_after_assignee_until_any_agent_of_the_queue_may_claim(store, pool, fresh):
    until = await db_now(pool) + timedelta(minutes=5)
    todo = await enqueue(store, "x", assignee="alice", assignee_until=until.isoformat())
    assert await store.claim_next(["x"], "bob", 30) is None
    with pytest.raises(Conflict, match="assigned to alice until"):
        await store.claim(todo.id, "bob", 30)
    await pool.execute("UPDATE todos SET assignee_until = now() - interval '1 second' WHERE id = $1", todo.id)
    assert (await fresh().claim_next(["x"], "bob", 30)).id == todo.id


# -- bulk ---------------------------------------------------------------------------------------


async def test_bulk_cancel_in_batches_says_what_changed_and_why_the_rest_did_not(control, store, pool):
    ids = [c.todo.id for c in await store.create_many([new_todo("b", f"t{i}") for i in range(1000)])]
    ids += [c.todo.id for c in await store.create_many([new_todo("b", f"u{i}") for i in range(1000)])]
    done = await claimed(store, "b", owner="w1")
    await store.complete(done.id, "w1", done.lease_token)
    report = await control.cancel_many([*ids, done.id, "td_nope"], OPERATOR, "cleanup")
    assert len(report.changed) == 2000
    assert report.skipped == {"done": 1, "gone": 1}
    assert report.summary() == "2000 cancelled; 2 skipped (1 already done, 1 no longer there)"
    cancelled = await pool.fetchval(
        "SELECT count(*) FROM todo_history WHERE to_state = 'failed' AND note = 'cancelled: cleanup'"
    )
    assert cancelled == 2000


async def test_a_bulk_action_while_claimers_run_skips_and_counts_what_they_took(control, dsn, store, pool):
    """Four claimers take todos while 2,000 get priority 5: each todo was either changed
    while still pending, or skipped because a claimer had it first."""
    ids = [c.todo.id for c in await store.create_many([new_todo("r", f"t{i}") for i in range(1000)])]
    ids += [c.todo.id for c in await store.create_many([new_todo("r", f"u{i}") for i in range(1000)])]
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(4)))
    stop = asyncio.Event()

    async def claimer(conn, name):
        mine = Store(conn)
        while not stop.is_set() and await mine.claim_next(["r"], name, 60):
            pass

    try:
        claiming = [asyncio.create_task(claimer(c, f"w{i}")) for i, c in enumerate(conns)]
        await asyncio.sleep(0)  # they start before it
        report = await control.set_many(ids, OPERATOR, priority=5)
        stop.set()
        await asyncio.gather(*claiming)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    assert report.skipped.get("claimed", 0) > 0, "the claimers took nothing first: no race was tested"
    assert len(report.changed) + report.skipped["claimed"] == 2000
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE priority = 5") == len(report.changed)
    taken_first = await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed' AND priority = 0")
    assert taken_first == report.skipped["claimed"]
    edits = await pool.fetchval("SELECT count(*) FROM todo_history WHERE note = 'edited'")
    assert edits == len(report.changed)


async def test_bulk_priority_and_reassign_skip_what_is_already_so(control, store, pool):
    a = await enqueue(store, "b", priority=2)
    b = await enqueue(store, "b")
    report = await control.set_many([a.id, b.id], OPERATOR, priority=2)
    assert [t.id for t in report.changed] == [b.id]
    assert report.skipped == {"pending": 1}
    report = await control.set_many([a.id, b.id], OPERATOR, assignee="alice")
    assert {t.assignee for t in report.changed} == {"alice"}
    assert (await last_step(pool, a.id)).note == "edited"
    with pytest.raises(InvalidInput, match="select at least one"):
        await control.set_many([], OPERATOR, priority=1)
    with pytest.raises(InvalidInput, match="priority"):
        await control.set_many([a.id], OPERATOR, priority=99)
