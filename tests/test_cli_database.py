"""Which database a command uses without DATABASE_URL (dashboard/instances.py), as real
processes in real folders: the data folder if it holds a database, else that of the
switchboard `up` running elsewhere (said on stderr), else a refusal that creates nothing.
Every process here records itself in, and looks in, a state folder of the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from dashboard.instances import state_dir
from tests.processes import free_port, start_serving, stop

pytestmark = pytest.mark.slow

REMEDIES = (
    "  start switchboard up (it creates ./.pgdata, or $SWITCHBOARD_DATA, and serves it);",
    "  run this in the folder where switchboard up runs;",
    "  name its data folder: SWITCHBOARD_DATA=/path/to/.pgdata;",
    "  name a server: DATABASE_URL=postgresql://…",
)


def newcomer_env(state: Path, **more: str) -> dict[str, str]:
    """The environment of someone with no DATABASE_URL, recording in `state`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SWITCHBOARD_DATA")}
    return {**env, "XDG_STATE_HOME": str(state), "PYTHONUNBUFFERED": "1", **more}


def switchboard(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dashboard.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def empty_folder(path: Path) -> Path:
    path.mkdir()
    return path


@dataclass
class Up:
    """A `switchboard up` running in its own folder."""

    proc: subprocess.Popen
    url: str  # as it records and shows itself
    base: str  # where a test reaches it
    data: Path
    state: Path

    def __str__(self) -> str:
        return f"the switchboard running at {self.url}, data in {self.data} (pid {self.proc.pid})"


def start_up(folder: Path, state: Path, command: str = "up") -> Up:
    """`switchboard up` (or `serve`) in `folder`, once it is up; its output in folder/up.log."""
    port = free_port()
    proc = start_serving([command, "--port", str(port)], newcomer_env(state), folder / "up.log", cwd=folder)
    data = folder.resolve() / ".pgdata"
    return Up(proc, f"http://localhost:{port}/", f"http://127.0.0.1:{port}", data, state)


def records(state: Path) -> set[int]:
    """The pids recorded as running."""
    return {int(path.stem) for path in (state / "switchboard" / "running").glob("*.json")}


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """`switchboard up` in folder A, stopped (SIGTERM, by pid) after the module."""
    base = tmp_path_factory.mktemp("running")
    up = start_up(empty_folder(base / "a"), base / "state")
    try:
        yield up
    finally:
        stop(up.proc)


@pytest.mark.parametrize(
    "command",
    [
        ["enqueue", "work", "a todo"],
        ["token", "add", "bot", "--queues", "work"],
        ["operator", "add", "alice"],
        ["migrate"],
        ["reap", "--once"],
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_with_no_database_and_none_running_a_command_refuses_and_creates_nothing(tmp_path, command):
    here = empty_folder(tmp_path.resolve() / "here")
    done = switchboard(here, newcomer_env(tmp_path / "state"), *command)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == (
        f"switchboard: no database here: DATABASE_URL is not set and {here}/.pgdata holds none "
        "(this command creates none; switchboard up does)."
    ), done.stderr
    assert all(remedy in lines for remedy in REMEDIES), done.stderr
    assert done.stdout == ""
    assert list(here.iterdir()) == []  # no .pgdata, nothing else


def test_commands_in_another_folder_use_the_database_of_the_running_switchboard(running, tmp_path):
    elsewhere = empty_folder(tmp_path / "b")
    env = newcomer_env(running.state)
    using = f"switchboard: using the database of {running}"

    enqueued = switchboard(elsewhere, env, "enqueue", "from-b", "made in another folder")
    assert enqueued.returncode == 0, enqueued.stderr
    assert using in enqueued.stderr.splitlines(), enqueued.stderr
    todo = json.loads(enqueued.stdout)["todo"]

    added = switchboard(elsewhere, env, "token", "add", "bot-b", "--queues", "from-b")
    assert added.returncode == 0, added.stderr
    assert using in added.stderr.splitlines(), added.stderr
    secret = added.stdout.split()[-1]

    # The running server shows the todo, to the token made in the other folder.
    seen = httpx.get(
        f"{running.base}/api/v1/todos/{todo['id']}", headers={"Authorization": f"Bearer {secret}"}
    )
    assert seen.status_code == 200, seen.text
    assert seen.json()["todo"]["title"] == "made in another folder"
    assert list(elsewhere.iterdir()) == []  # no second database


def test_a_named_data_folder_with_no_database_is_refused_even_while_one_runs(running, tmp_path):
    """SWITCHBOARD_DATA says which database is meant: another one is never used instead."""
    named = tmp_path.resolve() / "named"
    done = switchboard(
        empty_folder(tmp_path / "b"),
        newcomer_env(running.state, SWITCHBOARD_DATA=str(named)),
        "token",
        "list",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[:3] == [
        f"switchboard: no database here: SWITCHBOARD_DATA={named} holds none "
        "(this command creates none; switchboard up does).",
        "Running now (not used, as SWITCHBOARD_DATA is set):",
        f"  {running}",
    ], done.stderr
    assert not named.exists()


def test_records_of_dead_or_reused_pids_are_ignored_and_removed(running, tmp_path):
    """A record whose process died (SIGKILL leaves one), or whose pid now belongs to another
    process, names a database nothing serves: it is not used, and is removed."""
    state = tmp_path / "state"
    folder = state / "switchboard" / "running"
    folder.mkdir(parents=True)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(gone.stdout)
    reused_pid = os.getpid()  # alive, but started long after the record says
    for pid in (dead_pid, reused_pid):
        record = {"pid": pid, "url": running.url, "data": str(running.data), "started": 1.0}
        (folder / f"{pid}.json").write_text(json.dumps(record))

    here = empty_folder(tmp_path / "here")
    done = switchboard(here, newcomer_env(state), "enqueue", "work", "a todo")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("switchboard: no database here: "), done.stderr
    assert "Running now" not in done.stderr
    assert records(state) == set()
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("command", ["up", "serve"])
def test_a_server_in_a_new_folder_says_it_creates_a_database_and_its_record_goes_when_it_stops(
    running, tmp_path, command
):
    second = start_up(empty_folder(tmp_path / "c"), running.state, command)
    try:
        log = (tmp_path / "c" / "up.log").read_text()
        assert f"switchboard.database no database in {second.data} yet: creating one there" in log, log
        assert f"switchboard.database (another database is in use by {running})" in log, log
        assert (
            f"switchboard is up on {second.url} (database: embedded PostgreSQL, data in {second.data};" in log
        )
        assert records(running.state) == {running.proc.pid, second.proc.pid}

        # Two running on different databases: a command elsewhere does not guess.
        done = switchboard(empty_folder(tmp_path / "b"), newcomer_env(running.state), "token", "list")
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[1:4] == [
            "Running now (on different databases: name one):",
            f"  {running}",
            f"  {second}",
        ], done.stderr
    finally:
        stop(second.proc)
    assert second.proc.returncode == 0
    assert records(running.state) == {running.proc.pid}
    assert not (second.data / "postmaster.pid").exists()  # its PostgreSQL stopped with it


def test_a_server_whose_record_cannot_be_written_serves_all_the_same(tmp_path):
    """A read-only or broken state folder costs only being found by other commands."""
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("")
    up = start_up(empty_folder(tmp_path / "a"), not_a_folder)
    try:
        assert httpx.get(f"{up.base}/healthz").status_code == 200
        log = (tmp_path / "a" / "up.log").read_text()
        assert "switchboard.database could not record this switchboard for other commands to find: " in log
    finally:
        stop(up.proc)
    assert up.proc.returncode == 0


@pytest.mark.parametrize("xdg", [None, "relative/state"])
def test_without_an_absolute_xdg_state_home_records_go_under_the_home(monkeypatch, tmp_path, xdg):
    """The XDG default; a relative XDG_STATE_HOME is ignored, as the specification says."""
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    assert state_dir() == tmp_path / ".local" / "state" / "switchboard" / "running"
