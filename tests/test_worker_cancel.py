"""Cancelling a todo while a worker helper runs it: the helper stops the work.

The Python DB worker (dashboard.worker.Worker) runs in this process, so the test can see
its handler being cancelled; the reference HTTP worker (`switchboard worker --exec CMD`)
runs as a real process against the live server, its command a real process group. Each
cancellation goes through the store, as an operator's would. Every wait is a poll with a
deadline; every process started here is stopped by pid.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import psutil
import pytest

from dashboard.agent_worker import CANCEL_GRACE
from dashboard.control import Control
from dashboard.models import Actor
from dashboard.store import Store
from tests.factories import enqueue, todo_row, unique
from tests.processes import stop
from tests.test_workers import Spawner, command_worker, running_worker, transitions, until

pytestmark = pytest.mark.slow

OPERATOR = Actor("operator", "op")
SEEN_WITHIN = 5.0  # seconds from the cancel to the work stopped: heartbeats come every ttl/3 = 1 s


@pytest.fixture
def spawner(tmp_path):
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.stop_all()


# -- the Python DB worker ------------------------------------------------------------------


async def test_a_cancelled_todo_cancels_the_python_handler_and_the_worker_goes_on_to_the_next(
    dsn, pool, conn, caplog
):
    caplog.set_level(logging.INFO, logger="switchboard.worker")
    store = Store(pool)
    queue = unique("pyc")
    long_id = (await enqueue(store, queue, "long job")).id
    next_id = (await enqueue(store, queue, "next job")).id  # claimable only once a slot is free
    started, saw_cancel = asyncio.Event(), asyncio.Event()

    async def handle(todo):
        if todo.id != long_id:
            return {"handled": todo.title}
        started.set()
        try:
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        except asyncio.CancelledError:
            saw_cancel.set()
            raise
        return {"finished": "the work nobody wants"}

    async with running_worker(dsn, queue, handle, owner="py-cancel", ttl=1, poll_interval=0.5) as task:
        await asyncio.wait_for(started.wait(), 20)
        await Control(store.db).cancel(long_id, OPERATOR, "no longer needed")
        cancelled_at = time.monotonic()
        await asyncio.wait_for(saw_cancel.wait(), SEEN_WITHIN)
        assert time.monotonic() - cancelled_at < SEEN_WITHIN

        async def next_done():
            row = await todo_row(conn, next_id)
            return row if row.state == "done" else None

        row = await until(next_done, "the worker to complete the next todo", within=20)
        assert (row.owner, row.result) == ("py-cancel", {"handled": "next job"})
        assert not task.done(), "the worker keeps running"

    row = await todo_row(conn, long_id)
    assert (row.state, row.result, row.cancelled_by, row.cancel_reason) == (
        "failed",
        None,
        "op",
        "no longer needed",
    )
    assert row.cancelled_at is not None
    steps = [step[:5] for step in await transitions(conn, long_id)]
    assert steps[1:] == [
        ("pending", "claimed", "agent", "py-cancel", 1),
        ("claimed", "failed", "operator", "op", 1),
    ], "nothing acked after the cancellation"
    notes = [r.getMessage() for r in caplog.records if "was cancelled" in r.getMessage()]
    assert notes == [f"todo {long_id} was cancelled by op: no longer needed; stopping its handler"]


@pytest.mark.parametrize("outcome", ["complete", "fail"])
async def test_an_ack_refused_as_cancelled_is_logged_and_the_python_worker_goes_on(
    dsn, pool, conn, caplog, outcome
):
    """Cancelled after the handler's last heartbeat: the ack is what learns it."""
    caplog.set_level(logging.INFO, logger="switchboard.worker")
    store = Store(pool)
    queue = unique("pya")
    first_id = (await enqueue(store, queue, "cancelled under me")).id
    next_id = (await enqueue(store, queue, "next job")).id

    async def handle(todo):
        if todo.id != first_id:
            return {"handled": todo.title}
        await Control(store.db).cancel(first_id, OPERATOR)  # no heartbeat before the ack (ttl 30: every 10 s)
        if outcome == "fail":
            raise RuntimeError("gave up")
        return {"finished": True}

    async with running_worker(dsn, queue, handle, owner="py-cancel", ttl=30, poll_interval=0.5) as task:

        async def next_done():
            return (await todo_row(conn, next_id)).state == "done"

        await until(next_done, "the worker to complete the next todo", within=20)
        assert not task.done(), "the worker keeps running"

    row = await todo_row(conn, first_id)
    assert (row.state, row.result, row.cancelled_by) == ("failed", None, "op")
    assert row.last_error is None or "gave up" not in row.last_error
    steps = [step[:5] for step in await transitions(conn, first_id)]
    assert steps[1:] == [
        ("pending", "claimed", "agent", "py-cancel", 1),
        ("claimed", "failed", "operator", "op", 1),
    ]
    notes = [r.getMessage() for r in caplog.records if "was cancelled" in r.getMessage()]
    assert notes == [f"todo {first_id} was cancelled by op (no reason given); its {outcome} is dropped"]


# -- the reference HTTP worker -------------------------------------------------------------

# The command: a shell that, for the long job, writes its pid, starts a child (another
# member of its process group) and waits for it; for any other todo, answers at once.
# {trap} may make the shell and its child ignore SIGTERM (children inherit that).
COMMAND = """\
{trap}
todo=$(cat)
case "$todo" in
  *sleep-600*)
    echo $$ > "{dir}/command.tmp" && mv "{dir}/command.tmp" "{dir}/command.pid"
    sleep 600 &
    echo $! > "{dir}/child.tmp" && mv "{dir}/child.tmp" "{dir}/child.pid"
    wait
    echo '{{"finished": "the work nobody wants"}}'
    ;;
  *) echo '{{"finished": true}}' ;;
esac
"""


def gone(proc: psutil.Process) -> bool:
    """Exited (a zombie waiting for its parent to reap it counts: it runs no more; a
    reused pid is another process: is_running() compares the start time)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["obeys-sigterm", "ignores-sigterm"])
async def test_a_cancelled_todo_ends_the_commands_process_group_and_the_command_worker_goes_on(
    spawner, live_server, live_conn, tmp_path: Path, ignores_sigterm
):
    queue = unique("cmdc")
    store = Store(live_conn)
    long_id = (await enqueue(store, queue, "long job", payload={"mode": "sleep-600"})).id
    next_id = (await enqueue(store, queue, "next job")).id
    script = tmp_path / "command.sh"
    script.write_text(COMMAND.format(dir=tmp_path, trap="trap '' TERM" if ignores_sigterm else ""))
    worker = await command_worker(spawner, live_server, live_conn, "cmd-cancel", queue, f"sh {script}")

    async def pids_written():
        files = [tmp_path / "command.pid", tmp_path / "child.pid"]
        return all(f.exists() for f in files) and [int(f.read_text()) for f in files]

    pids = await until(pids_written, "the command and its child to start", proc=worker, spawner=spawner)
    spawner.descendants(worker)  # noted, so teardown stops them should this test fail
    # Taken while the worker's todo is claimed, so these are the processes the pids name.
    assert (await todo_row(live_conn, long_id)).state == "claimed"
    command, child = (psutil.Process(pid) for pid in pids)
    assert not gone(command) and not gone(child)
    assert command.pid in [p.pid for p in psutil.Process(worker.pid).children(recursive=True)]

    await Control(store.db).cancel(long_id, OPERATOR, "no longer needed")
    cancelled_at = time.monotonic()
    said = f"todo {long_id} was cancelled by op: no longer needed; ending its command"

    async def seen():
        return said in spawner.log(worker)

    await until(seen, "the worker to see the cancellation", within=SEEN_WITHIN, proc=worker, spawner=spawner)
    seen_at = time.monotonic()

    async def both_gone():
        return gone(command) and gone(child)

    if ignores_sigterm:  # SIGTERM is sent; SIGKILL follows CANCEL_GRACE seconds later
        assert not gone(command) and not gone(child)
        await until(both_gone, "SIGKILL to end them", within=CANCEL_GRACE + 3, proc=worker, spawner=spawner)
        assert time.monotonic() - seen_at > CANCEL_GRACE - 1
    else:
        await until(both_gone, "SIGTERM to end them", within=SEEN_WITHIN, proc=worker, spawner=spawner)
        assert time.monotonic() - cancelled_at < SEEN_WITHIN

    async def next_done():
        row = await todo_row(live_conn, next_id)
        return row if row.state == "done" else None

    row = await until(next_done, "the worker to complete the next todo", proc=worker, spawner=spawner)
    assert (row.owner, row.result) == ("cmd-cancel", {"finished": True})
    assert worker.poll() is None, "the worker keeps running\n" + spawner.log(worker)

    row = await todo_row(live_conn, long_id)
    assert (row.state, row.result, row.cancelled_by, row.cancel_reason) == (
        "failed",
        None,
        "op",
        "no longer needed",
    )
    steps = [step[:5] for step in await transitions(live_conn, long_id)]
    assert steps[1:] == [
        ("pending", "claimed", "agent", "cmd-cancel", 1),
        ("claimed", "failed", "operator", "op", 1),
    ], "nothing acked after the cancellation"
    assert stop(worker) == 0, spawner.log(worker)
    log = spawner.log(worker)
    assert log.count(said) == 1, log
    assert "dropped" not in log and "refused" not in log, log
