"""The housekeeping Store does on its own: reap lapsed leases, promote due retries, prune
finished todos.

Time moves by SQL (lease_expires_at, next_retry_at, completed_at set into the past).

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import timedelta

from dashboard import db as dbmod
from dashboard.config import Settings
from dashboard.lapsed import reap_once
from dashboard.reaper import run_reaper
from dashboard.rollups import Rollups
from dashboard.store import Store
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    claimed,
    db_now,
    dead_letter,
    enqueue,
    expire_lease,
    history,
    last_step,
    make_retry_due,
    new_todo,
    todo_row,
)
from tests.processes import eventually, spawn, stop

pytestmark = ONE_DATABASE_PER_MODULE


# -- the reaper ------------------------------------------------------------------------


async def test_reap_puts_an_expired_lease_back_with_a_backoff_and_says_whose_it_was(
    module_store, module_pool
):
    held = await claimed(module_store, owner="ann")
    live = await claimed(module_store, owner="bob")
    await expire_lease(module_pool, held.id)
    before = await db_now(module_pool)
    reaped = await module_store.reap()
    after = await db_now(module_pool)

    assert [t.id for t in reaped] == [held.id]
    todo = reaped[0]
    assert (todo.state, todo.owner, todo.attempt) == ("pending", None, 1)
    assert todo.last_error == "lease expired (owner ann)"
    assert before <= todo.next_retry_at <= after + timedelta(seconds=2)  # full jitter: [0, 2] s
    assert await last_step(module_pool, held.id) == (
        "claimed",
        "pending",
        "system",
        "reaper",
        1,
        "lease expired (owner ann)",
    )
    assert await todo_row(module_pool, live.id) == live


async def test_reap_at_the_cap_dead_letters(module_store, module_pool):
    held = await claimed(module_store, owner="ann", max_attempts=1)
    await expire_lease(module_pool, held.id)
    [todo] = await module_store.reap()
    assert (todo.state, todo.attempt, todo.next_retry_at) == ("failed", 1, None)
    assert todo.last_error == "lease expired (owner ann)" and todo.completed_at is not None
    assert await last_step(module_pool, held.id) == (
        "claimed",
        "failed",
        "system",
        "reaper",
        1,
        "lease expired (owner ann)",
    )


async def test_reap_takes_at_most_limit_todos_per_call(module_store, module_pool):
    await module_store.create_many([new_todo() for _ in range(5)])
    held = await module_store.claim_batch(["q"], "w1", 30, 5)
    await module_pool.execute("UPDATE todos SET lease_expires_at = now() - interval '1 minute'")
    assert len(await module_store.reap(limit=2)) == 2
    assert len(await module_store.reap(limit=10)) == 3
    assert await module_store.reap() == []
    assert len(held) == 5


async def test_reap_never_reopens_a_todo_completed_while_it_ran(module_dsn, module_store, module_pool):
    held = await claimed(module_store, owner="ann")
    await expire_lease(module_pool, held.id)
    worker = await dbmod.connect(module_dsn)
    try:
        async with worker.transaction():
            # The late worker's complete holds the row while the reaper runs.
            await Store(worker).complete(held.id, "ann", held.lease_token, None)
            assert await module_store.reap() == []
        assert await module_store.reap() == []
    finally:
        await worker.close()
    assert (await todo_row(module_pool, held.id)).state == "done"
    assert [h.attempt for h in await history(module_pool, held.id) if h.actor_kind == "system"] == []


async def test_reap_leaves_done_and_failed_todos_alone(module_store, module_pool):
    done = await claimed(module_store)
    await module_store.complete(done.id, "w1", done.lease_token)
    dead = await dead_letter(module_store, module_pool)
    await module_store.reap()
    assert (await todo_row(module_pool, done.id)).state == "done"
    assert (await todo_row(module_pool, dead.id)).state == "failed"


async def test_promote_due_retries_clears_only_due_retry_times(module_store, module_pool):
    due = await claimed(module_store)
    await module_store.fail(due.id, "w1", due.lease_token, "x")
    later = await claimed(module_store)
    await module_store.fail(later.id, "w1", later.lease_token, "x")
    # its backoff (2 s at attempt 1) must not come due on a slow machine before the end
    await module_pool.execute(
        "UPDATE todos SET next_retry_at = now() + interval '1 hour', ready_at = now() + interval '1 hour'"
        " WHERE id = $1",
        later.id,
    )

    assert await module_store.promote_due_retries() == 0
    await make_retry_due(module_pool, due.id)
    assert await module_store.promote_due_retries() == 1
    assert (await todo_row(module_pool, due.id)).next_retry_at is None
    assert (await todo_row(module_pool, later.id)).next_retry_at is not None
    assert await last_step(module_pool, due.id) == ("pending", "pending", "system", "reaper", 1, "retry due")
    assert await module_store.promote_due_retries() == 0


# -- prune -----------------------------------------------------------------------------


async def test_prune_deletes_only_finished_todos_older_than_the_age(module_store, module_pool):
    old_done = await claimed(module_store)
    await module_store.complete(old_done.id, "w1", old_done.lease_token)
    old_dead = await dead_letter(module_store, module_pool)
    young_done = await claimed(module_store)
    await module_store.complete(young_done.id, "w1", young_done.lease_token)
    old_pending = await enqueue(module_store)
    old_claimed = await claimed(module_store)
    await module_pool.execute(
        "UPDATE todos SET completed_at = now() - interval '2 days' WHERE id = ANY($1)",
        [old_done.id, old_dead.id],
    )
    await module_pool.execute(
        "UPDATE todos SET created_at = now() - interval '3 days' WHERE id = ANY($1)",
        [old_pending.id, old_claimed.id],
    )
    await module_pool.execute(
        "UPDATE todos SET completed_at = now() - interval '1 hour' WHERE id = $1", young_done.id
    )

    assert await module_store.prune(86400, batch=1) == 2
    left = {r["id"] for r in await module_pool.fetch("SELECT id FROM todos")}
    assert left == {young_done.id, old_pending.id, old_claimed.id}
    # History goes by its day, not with its todo (tests/test_history_partitions.py).
    notes = [step.note for step in await history(module_pool, old_done.id)]
    assert notes == ["created", "claimed by id", "completed"]
    assert await module_store.prune(86400) == 0


async def test_a_reaper_pass_that_moves_nothing_logs_nothing_and_one_that_does_says_so(
    module_store, module_pool, caplog
):
    with caplog.at_level(logging.INFO, logger="switchboard.reaper"):
        assert await reap_once(module_store) == (0, 0)
        assert [r for r in caplog.records if r.name == "switchboard.reaper"] == []
        held = await claimed(module_store)
        await expire_lease(module_pool, held.id)
        assert await reap_once(module_store) == (1, 0)
    said = [r.getMessage() for r in caplog.records if r.name == "switchboard.reaper"]
    assert said == ["reaped 1 lapsed leases, promoted 0 due retries"]


async def test_switchboard_reap_reaps_until_sigterm_then_exits_cleanly(
    module_dsn, module_store, module_pool, tmp_path
):
    """The standalone reaper under a process manager: it works, and SIGTERM (which PID 1 in
    a container does not act on by default) stops it with status 0 and a log line."""
    held = await claimed(module_store)
    await expire_lease(module_pool, held.id)
    log = tmp_path / "reap.log"
    reaper = spawn(
        ["-m", "dashboard.cli", "reap", "--interval", "0.2"], {**os.environ, "DATABASE_URL": module_dsn}, log
    )
    try:
        await eventually(lambda: todo_row(module_pool, held.id), lambda t: t.state == "pending", within=30)
    finally:
        status = stop(reaper)
    assert status == 0, log.read_text()
    assert "reaper stopped" in log.read_text()


async def test_a_job_that_fails_is_logged_and_the_other_jobs_go_on(
    module_store, module_pool, monkeypatch, caplog
):
    async def broken(self) -> int:
        raise RuntimeError("rollups are broken")

    monkeypatch.setattr(Rollups, "roll", broken)
    held = await claimed(module_store)
    await expire_lease(module_pool, held.id)
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="switchboard.reaper"):
        reaper = asyncio.create_task(run_reaper(module_store, Settings(), interval=0.05, stop=stop))
        try:
            await eventually(
                lambda: todo_row(module_pool, held.id), lambda t: t.state == "pending", within=10
            )
        finally:
            stop.set()
            await reaper
    failed = [r for r in caplog.records if r.getMessage() == "reaper job rollups failed"]
    assert failed and failed[0].exc_info[1].args == ("rollups are broken",)
