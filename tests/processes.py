"""Processes a test starts, waits for and stops (by pid, never by name)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

STOP_WITHIN = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """`python ARGS` (in `cwd`), its output (both streams) in `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, *args], env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )


def start_serving(
    args: list[str], env: dict[str, str], log: Path, within: float = 60, cwd: Path | None = None
) -> subprocess.Popen:
    """`switchboard ARGS` (in `cwd`) with its output in `log`, once it says it is up (after it listens)."""
    proc = spawn(["-m", "dashboard.cli", *args], env, log, cwd)
    deadline = time.monotonic() + within
    while "switchboard is up on" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise AssertionError(f"switchboard {' '.join(args)} did not come up:\n{log.read_text()}")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL if it has not exited within STOP_WITHIN; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


async def eventually(
    fetch: Callable[[], Awaitable[Any]], accept: Callable[[Any], bool], within: float
) -> Any:
    """Ask `fetch()` until `accept` takes its answer; fail after `within` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await fetch()
        if accept(value):
            return value
        assert asyncio.get_running_loop().time() < deadline, f"still {value!r} after {within}s"
        await asyncio.sleep(0.1)
