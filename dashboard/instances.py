"""Which embedded database a command uses when DATABASE_URL is not set, and the record of
the switchboards running on one that lets other commands find them.

A server command (`up`, `serve`) uses the data folder ($SWITCHBOARD_DATA, else ./.pgdata),
creating the database there if there is none, and says so. While it runs it keeps a record
(its pid, the URL it serves on and its data folder) in $XDG_STATE_HOME/switchboard/running
(default ~/.local/state), removed when it stops. Every other command uses the data folder
only if it already holds a database; otherwise the database of the one switchboard running,
saying so on stderr; otherwise it refuses and creates nothing: a database that no server
shows is where todos and tokens get lost.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from dashboard.errors import SwitchboardError

log = logging.getLogger("switchboard.database")


class NoDatabase(SwitchboardError):
    """No database to use here, and this command creates none."""


@dataclass(frozen=True)
class Running:
    """A switchboard serving an embedded database: what its record holds."""

    pid: int
    url: str
    data: str
    started: float  # the process's start time: a record whose pid was reused is not its own

    def __str__(self) -> str:
        return f"the switchboard running at {self.url}, data in {self.data} (pid {self.pid})"


def state_dir() -> Path:
    """Where running switchboards are recorded (XDG: a relative XDG_STATE_HOME is ignored)."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "switchboard" / "running"


@contextmanager
def recorded(url: str, data: Path) -> Iterator[Running]:
    """Record this process as serving `data` at `url` while the block runs. A record that
    cannot be written (a read-only home) stops nothing: other commands just do not find it."""
    me = Running(os.getpid(), url, str(data), psutil.Process().create_time())
    path = state_dir() / f"{me.pid}.json"
    written = _write(path, me)
    try:
        yield me
    finally:
        if written:
            path.unlink(missing_ok=True)


def _write(path: Path, record: Running) -> bool:
    partial = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(asdict(record)))
        partial.replace(path)  # readers never see half a record
    except OSError as exc:
        log.warning("could not record this switchboard for other commands to find: %s", exc)
        return False
    return True


def running() -> list[Running]:
    """The recorded switchboards still running, the longest-running first; records of dead
    processes are removed."""
    found = []
    for path in state_dir().glob("*.json"):
        try:
            record = Running(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # not a record of ours (or just removed)
        if _alive(record):
            found.append(record)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda record: record.started)


def _alive(record: Running) -> bool:
    try:
        process = psutil.Process(record.pid)
        return abs(process.create_time() - record.started) < 1 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def holds_database(path: Path) -> bool:
    return (path / "PG_VERSION").exists()


def choose_data_dir(path: Path, *, given: bool, create: bool) -> Path:
    """The data folder to start the embedded server in. `path` is $SWITCHBOARD_DATA (`given`)
    or ./.pgdata, resolved; `create`: this command serves, and may create the database."""
    if holds_database(path):
        return path
    others = running()
    if create:
        log.info("no database in %s yet: creating one there", path)
        for other in others:
            log.info("(another database is in use by %s)", other)
        return path
    folders = {other.data for other in others}
    if len(folders) == 1 and not given:
        print(f"switchboard: using the database of {others[0]}", file=sys.stderr, flush=True)
        return Path(others[0].data)
    raise NoDatabase(_why_none(path, given, others))


def _why_none(path: Path, given: bool, others: list[Running]) -> str:
    where = f"SWITCHBOARD_DATA={path}" if given else f"DATABASE_URL is not set and {path}"
    lines = [f"no database here: {where} holds none (this command creates none; switchboard up does)."]
    if others:
        why = "not used, as SWITCHBOARD_DATA is set" if given else "on different databases: name one"
        lines.append(f"Running now ({why}):")
        lines += [f"  {other}" for other in others]
    lines += [
        "To proceed, one of:",
        "  start switchboard up (it creates ./.pgdata, or $SWITCHBOARD_DATA, and serves it);",
        "    while it runs, this command uses its database from any folder;",
        "  run this in the folder where switchboard up runs;",
        "  name its data folder: SWITCHBOARD_DATA=/path/to/.pgdata;",
        "  name a server: DATABASE_URL=postgresql://…",
    ]
    return "\n".join(lines)
