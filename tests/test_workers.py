"""Workers end to end, as real subprocesses: the reference HTTP worker (`switchboard worker
--exec CMD`) against the live server, and the Python DB worker (dashboard.worker.Worker).

Crashes are real SIGKILLs; leases lapse on the database clock; the reaper re-surfaces the
work. Every wait is a poll of the database (or of the process) with a deadline. Every
process started here is stopped by pid at the end of its test, including commands a
killed worker leaves behind (they run in their own session).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dashboard.accounts import Accounts
from dashboard.agent_worker import GRACE as COMMAND_GRACE
from dashboard.lapsed import reap_once
from dashboard.store import Store
from dashboard.worker import Worker
from tests.conftest import ROOT
from tests.factories import Step, enqueue, history, make_retry_due, todo_row, unique
from tests.processes import stop

pytestmark = pytest.mark.slow


# -- processes -----------------------------------------------------------------------------


class Spawner:
    """Starts subprocesses with their output in a log file; stops every one of them by pid."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.orphans: dict[int, float] = {}  # pid -> create time

    def start(self, args: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        log_path = self.tmp_path / f"{name}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
            )
        self.procs.append((proc, log_path))
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        for p, path in self.procs:
            if p is proc:
                return path.read_text()[-3000:]
        return ""

    def descendants(self, proc: subprocess.Popen) -> list[int]:
        """The process's children, recursively; every one ever seen is stopped at teardown
        (a command outlives a killed worker: it runs in its own session)."""
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for child in children:
            with contextlib.suppress(psutil.Error):
                self.orphans[child.pid] = child.create_time()
        return [c.pid for c in children]

    def kill9(self, proc: subprocess.Popen) -> None:
        """SIGKILL the worker alone, as a crash would; what it started lives on for now."""
        self.descendants(proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            self.descendants(proc)
            stop(proc)
        for pid, created in self.orphans.items():
            try:
                child = psutil.Process(pid)
                if child.create_time() != created:  # the pid was reused: not ours
                    continue
                child.terminate()
                child.wait(5)
            except psutil.TimeoutExpired:
                child.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def spawner(tmp_path):
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.stop_all()


@contextlib.asynccontextmanager
async def running_worker(dsn: str, queue: str, handler, *, owner: str = "py-worker", **options):
    """A Python Worker (dashboard.worker) on `queue` in this process, stopped and waited for
    on exit."""
    options.setdefault("poll_interval", 0.2)
    worker = Worker(dsn, [queue], handler, owner=owner, **options)
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def until(
    probe, what: str, within: float = 20, proc: subprocess.Popen | None = None, spawner: Spawner | None = None
):
    """Poll `probe()` (a coroutine function) until it returns something truthy."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            log = spawner.log(proc) if spawner and proc else ""
            raise AssertionError(f"timed out after {within}s waiting for {what}\n{log}")
        await asyncio.sleep(0.05)


async def wait_exit(proc: subprocess.Popen, within: float) -> int | None:
    """The exit code, or None if it is still running after `within` seconds."""

    async def exited():
        return proc.poll() is not None

    try:
        await until(exited, "the process to exit", within)
    except AssertionError:
        return None
    return proc.returncode


async def transitions(conn, todo_id: str) -> list[Step]:
    """History without heartbeats and retry promotions (whether the reaper promotes a due
    retry before a worker claims it is a race): (from, to, actor, attempt, note)."""
    return [step for step in await history(conn, todo_id) if step.note not in ("heartbeat", "retry due")]


# The commands the workers run, by file name: each reads the todo on stdin.
COMMANDS = {
    "echo.py": """
        import json, sys
        todo = json.load(sys.stdin)
        print(json.dumps({"seen": todo["id"], "doubled": todo["payload"]["n"] * 2,
                          "lease": todo["lease"]}))
    """,
    "fail.py": """
        import sys
        sys.stdin.read()
        sys.stderr.write("noise " * 1000 + "\\nboom: the disk is full\\n")
        sys.exit(3)
    """,
    "slow.py": """
        import sys, time
        sys.stdin.read()
        time.sleep(120)
    """,
    "stamp.py": """
        import json, sys, time
        sys.stdin.read()
        start = time.time()
        time.sleep(0.5)
        print(json.dumps({"start": start, "end": time.time()}))
    """,
    "ok.py": """
        import json, sys
        print(json.dumps({"finished_by_second_worker": json.load(sys.stdin)["attempt"]}))
    """,
}


def script(tmp_path: Path, name: str, body: str | None = None) -> str:
    """A command line running COMMANDS[name] (or `body`) as a Python script."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(COMMANDS[name] if body is None else body))
    return f"{sys.executable} {path}"


# -- the reference HTTP worker -------------------------------------------------------------


async def command_worker(spawner, live_server, conn, agent: str, queue: str, command: str, *extra: str):
    _, secret = await Accounts(conn).add_token(agent, [queue])
    args = ["--queue", queue, "--exec", command, "--url", live_server[0], "--token", secret, *extra]
    return spawner.start(
        [sys.executable, "-m", "dashboard.cli", "worker", *args, "--ttl", "3", "--wait", "1"], agent
    )


async def test_the_command_worker_completes_todos_with_the_commands_stdout_as_the_result(
    spawner, live_server, live_conn, tmp_path
):
    queue = unique("cmd")
    echo = script(tmp_path, "echo.py")
    store = Store(live_conn)
    ids = [(await enqueue(store, queue, f"n={n}", payload={"n": n})).id for n in (1, 2, 3)]
    worker = await command_worker(spawner, live_server, live_conn, "cmd-echo", queue, echo)

    async def all_done():
        return await live_conn.fetchval(
            "SELECT count(*) = 3 FROM todos WHERE queue = $1 AND state = 'done'", queue
        )

    await until(all_done, "three todos done", proc=worker, spawner=spawner)
    for n, todo_id in zip((1, 2, 3), ids, strict=True):
        row = await todo_row(live_conn, todo_id)
        assert row.result == {"seen": todo_id, "doubled": n * 2, "lease": row.lease_token}
        assert (row.owner, row.attempt) == ("cmd-echo", 1)
        assert (await transitions(live_conn, todo_id))[1:] == [
            ("pending", "claimed", "agent", "cmd-echo", 1, "claimed"),
            ("claimed", "done", "agent", "cmd-echo", 1, "completed"),
        ]
    assert stop(worker) == 0, spawner.log(worker)  # SIGTERM while waiting for work: a clean exit


async def test_with_batch_the_command_worker_runs_a_claimed_batch_side_by_side_and_acks_it_together(
    spawner, live_server, live_conn, tmp_path
):
    queue = unique("cmd")
    store = Store(live_conn)
    ids = [(await enqueue(store, queue, f"n={n}")).id for n in range(8)]
    worker = await command_worker(
        spawner, live_server, live_conn, "cmd-batch", queue, script(tmp_path, "stamp.py"), "--batch", "4"
    )

    async def all_done():
        return await live_conn.fetchval(
            "SELECT count(*) = 8 FROM todos WHERE queue = $1 AND state = 'done'", queue
        )

    await until(all_done, "eight todos done", proc=worker, spawner=spawner)
    rows = [await todo_row(live_conn, todo_id) for todo_id in ids]
    first, second = rows[:4], rows[4:]  # claimed oldest first, four at a time
    assert max(r.result["start"] for r in first) < min(r.result["end"] for r in first), "not side by side"
    assert max(r.result["end"] for r in first) <= min(r.result["start"] for r in second)
    # one acks request per batch: the four of a batch were completed in one transaction
    for batch in (ids[:4], ids[4:]):
        writers = "SELECT count(DISTINCT xmin::text) FROM todos WHERE id = ANY($1::text[])"
        assert await live_conn.fetchval(writers, batch) == 1
    assert stop(worker) == 0, spawner.log(worker)


async def test_a_failing_command_is_retried_then_dead_lettered_with_its_exit_status_and_stderr_tail(
    spawner, live_server, live_conn, tmp_path
):
    queue = unique("cmd")
    failing = script(tmp_path, "fail.py")
    todo_id = (await enqueue(Store(live_conn), queue, "doomed", max_attempts=2)).id
    worker = await command_worker(spawner, live_server, live_conn, "cmd-fail", queue, failing)

    async def retrying():
        row = await todo_row(live_conn, todo_id)
        return row if row.state == "pending" and row.next_retry_at else None

    first = await until(retrying, "the first failure", proc=worker, spawner=spawner)
    assert first.attempt == 1
    assert first.last_error.startswith("exit status 3: ")
    assert first.last_error.endswith("boom: the disk is full")
    assert len(first.last_error) <= len("exit status 3: ") + 2000  # the tail, not all of it
    await make_retry_due(live_conn, todo_id)

    async def dead():
        row = await todo_row(live_conn, todo_id)
        return row if row.state == "failed" else None

    final = await until(dead, "the dead-letter", proc=worker, spawner=spawner)
    assert final.attempt == 2 and final.completed_at is not None
    assert final.last_error.startswith("exit status 3: ")
    assert "boom: the disk is full" in final.last_error
    steps = [(f, t, k, a, n) for f, t, k, a, n, _ in await transitions(live_conn, todo_id)]
    assert steps[1:] == [
        ("pending", "claimed", "agent", "cmd-fail", 1),
        ("claimed", "pending", "agent", "cmd-fail", 1),
        ("pending", "claimed", "agent", "cmd-fail", 2),
        ("claimed", "failed", "agent", "cmd-fail", 2),
    ]
    assert worker.poll() is None, "the worker keeps going after a failed command"


async def test_a_killed_command_worker_lets_its_lease_lapse_and_a_second_worker_completes_the_todo(
    spawner, live_server, live_conn, tmp_path
):
    queue = unique("cmd")
    slow = script(tmp_path, "slow.py")
    echo = script(tmp_path, "ok.py")
    todo_id = (await enqueue(Store(live_conn), queue, "long job")).id
    first = await command_worker(spawner, live_server, live_conn, "cmd-first", queue, slow)

    async def running():
        row = await todo_row(live_conn, todo_id)
        return row.state == "claimed" and row.owner == "cmd-first" and spawner.descendants(first)

    await until(running, "the first worker to run the command", proc=first, spawner=spawner)
    spawner.kill9(first)

    async def resurfaced():  # the live server's reaper, once the 3 s lease lapses
        row = await todo_row(live_conn, todo_id)
        return row if row.state == "pending" else None

    row = await until(resurfaced, "the reaper to re-surface the todo", within=15)
    assert row.last_error == "lease expired (owner cmd-first)" and row.attempt == 1
    await make_retry_due(live_conn, todo_id)
    second = await command_worker(spawner, live_server, live_conn, "cmd-second", queue, echo)

    async def done():
        row = await todo_row(live_conn, todo_id)
        return row if row.state == "done" else None

    row = await until(done, "the second worker to complete it", proc=second, spawner=spawner)
    assert (row.owner, row.attempt, row.result) == (
        "cmd-second",
        2,
        {"finished_by_second_worker": 2},
    )
    assert (await transitions(live_conn, todo_id))[1:] == [
        ("pending", "claimed", "agent", "cmd-first", 1, "claimed"),
        ("claimed", "pending", "system", "reaper", 1, "lease expired (owner cmd-first)"),
        ("pending", "claimed", "agent", "cmd-second", 2, "claimed"),
        ("claimed", "done", "agent", "cmd-second", 2, "completed"),
    ]


async def _sigterm_command_worker_mid_run(spawner, live_server, conn, tmp_path, command_seconds: float):
    """A command worker running a command: SIGTERM. Returns (worker, todo id, the command's
    pids, seconds from SIGTERM to exit or None if it did not exit within grace + 3 s)."""
    queue = unique("cmd")
    body = f"""
        import json, sys, time
        sys.stdin.read()
        time.sleep({command_seconds})
        print(json.dumps({{"slept": {command_seconds}}}))
    """
    command = script(tmp_path, "work.py", body)
    command = f"cd {tmp_path} && {command}"  # a shell command, as `--exec` takes: sh forks it
    todo_id = (await enqueue(Store(conn), queue, "busy")).id
    await enqueue(Store(conn), queue, "never claimed")
    worker = await command_worker(spawner, live_server, conn, "cmd-term", queue, command)

    async def running():
        return (await todo_row(conn, todo_id)).state == "claimed" and spawner.descendants(worker)

    await until(running, "the worker to run the command", proc=worker, spawner=spawner)
    pids = spawner.descendants(worker)
    worker.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code = await wait_exit(worker, COMMAND_GRACE + 3)
    if code is None:
        spawner.kill9(worker)
        return worker, todo_id, pids, None
    assert code == 0, spawner.log(worker)
    return worker, todo_id, pids, time.monotonic() - sent


async def test_sigterm_lets_a_running_command_finish_completes_it_and_claims_nothing_more(
    spawner, live_server, live_conn, tmp_path
):
    worker, todo_id, _, took = await _sigterm_command_worker_mid_run(
        spawner, live_server, live_conn, tmp_path, command_seconds=1.5
    )
    assert took is not None, "the worker did not exit after SIGTERM\n" + spawner.log(worker)
    row = await todo_row(live_conn, todo_id)
    assert (row.state, row.result) == ("done", {"slept": 1.5})
    queue = row.queue
    assert (
        await live_conn.fetchval(
            "SELECT count(*) FROM todos WHERE queue = $1 AND state = 'pending' AND attempt = 0", queue
        )
        == 1
    )


async def test_sigterm_kills_a_command_that_outlives_the_grace_period_and_releases_its_todo(
    spawner, live_server, live_conn, tmp_path
):
    _, todo_id, pids, took = await _sigterm_command_worker_mid_run(
        spawner, live_server, live_conn, tmp_path, command_seconds=120
    )
    assert took is not None and took < COMMAND_GRACE + 3, "the worker did not stop after its grace"
    row = await todo_row(live_conn, todo_id)
    assert (row.state, row.owner, row.attempt) == ("pending", None, 1)
    assert (await transitions(live_conn, todo_id))[-1] == (
        "claimed",
        "pending",
        "agent",
        "cmd-term",
        1,
        "released",
    )
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


# -- the Python DB worker ------------------------------------------------------------------

PY_WORKER = """
    import asyncio, json, os, sys
    from dashboard.worker import Worker

    dsn, queue, owner = sys.argv[1:4]
    ttl, handler_seconds, grace = map(float, sys.argv[4:7])

    async def handle(todo):
        await asyncio.sleep(handler_seconds)
        return {"handled_by": owner}

    asyncio.run(Worker(dsn, [queue], handle, owner=owner, ttl=ttl, grace=grace,
                       poll_interval=0.5).run())
"""


def py_worker(
    spawner,
    tmp_path,
    dsn: str,
    queue: str,
    owner: str,
    *,
    ttl: float = 30,
    handler_seconds: float = 0,
    grace: float = 10,
) -> subprocess.Popen:
    path = tmp_path / "py_worker.py"
    path.write_text(textwrap.dedent(PY_WORKER))
    return spawner.start(
        [sys.executable, str(path), dsn, queue, owner, str(ttl), str(handler_seconds), str(grace)], owner
    )


async def test_a_killed_db_worker_leaves_its_todo_to_the_reaper_and_another_worker_completes_it(
    spawner, dsn, conn, tmp_path
):
    store = Store(conn)
    todo_id = (await enqueue(store, "py", "crash me")).id
    first = py_worker(spawner, tmp_path, dsn, "py", "py-first", ttl=2, handler_seconds=120)

    async def held():
        row = await todo_row(conn, todo_id)
        return row.state == "claimed" and row.owner == "py-first"

    await until(held, "the first worker to claim", proc=first, spawner=spawner)
    spawner.kill9(first)
    assert await reap_once(store) == (0, 0), "the lease has not lapsed yet"

    async def reaped():
        await reap_once(store)
        row = await todo_row(conn, todo_id)
        return row if row.state == "pending" else None

    row = await until(reaped, "the lease to lapse and the reaper to re-surface the todo", within=10)
    assert (row.attempt, row.owner) == (1, None)
    assert row.last_error == "lease expired (owner py-first)"
    await make_retry_due(conn, todo_id)
    second = py_worker(spawner, tmp_path, dsn, "py", "py-second")

    async def done():
        row = await todo_row(conn, todo_id)
        return row if row.state == "done" else None

    row = await until(done, "the second worker to complete it", proc=second, spawner=spawner)
    assert (row.owner, row.attempt, row.result) == ("py-second", 2, {"handled_by": "py-second"})
    assert (await transitions(conn, todo_id))[1:] == [
        ("pending", "claimed", "agent", "py-first", 1, "claimed"),
        ("claimed", "pending", "system", "reaper", 1, "lease expired (owner py-first)"),
        ("pending", "claimed", "agent", "py-second", 2, "claimed"),
        ("claimed", "done", "agent", "py-second", 2, "completed"),
    ]
    assert stop(second) == 0, spawner.log(second)


async def _sigterm_while_handling(spawner, tmp_path, dsn, conn, *, handler_seconds, grace):
    """Two todos, a one-slot worker holding the first one: SIGTERM. Returns
    (worker, first id, second id, seconds from SIGTERM to exit or None)."""
    store = Store(conn)
    first_id = (await enqueue(store, "py", "first")).id
    second_id = (await enqueue(store, "py", "second")).id
    worker = py_worker(spawner, tmp_path, dsn, "py", "py-term", handler_seconds=handler_seconds, grace=grace)

    async def holding():
        return (await todo_row(conn, first_id)).state == "claimed"

    await until(holding, "the worker to claim the first todo", proc=worker, spawner=spawner)
    worker.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    code = await wait_exit(worker, grace + 4)
    took = time.monotonic() - sent if code is not None else None
    if code is None:
        spawner.kill9(worker)  # stuck: no point in a second SIGTERM at teardown
    else:
        assert code == 0, spawner.log(worker)
    return worker, first_id, second_id, took


async def test_sigterm_lets_a_running_handler_finish_and_claims_nothing_more(spawner, dsn, conn, tmp_path):
    worker, first_id, second_id, took = await _sigterm_while_handling(
        spawner, tmp_path, dsn, conn, handler_seconds=1.5, grace=10
    )
    assert took is not None, "the worker did not exit after SIGTERM\n" + spawner.log(worker)
    first, second = await todo_row(conn, first_id), await todo_row(conn, second_id)
    assert (first.state, first.result) == ("done", {"handled_by": "py-term"})
    assert (second.state, second.attempt, second.owner) == ("pending", 0, None)
    assert await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed'") == 0


async def test_sigterm_releases_what_a_slow_handler_holds_once_the_grace_period_is_over(
    spawner, dsn, conn, tmp_path
):
    _, first_id, second_id, took = await _sigterm_while_handling(
        spawner, tmp_path, dsn, conn, handler_seconds=60, grace=1
    )
    assert took is not None and took < 5, "the worker did not stop within its grace period"
    first, second = await todo_row(conn, first_id), await todo_row(conn, second_id)
    assert (first.state, first.owner, first.attempt) == ("pending", None, 1)
    assert (await transitions(conn, first_id))[-1] == (
        "claimed",
        "pending",
        "agent",
        "py-term",
        1,
        "released",
    )
    assert (second.state, second.attempt) == ("pending", 0)
    assert await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed'") == 0
