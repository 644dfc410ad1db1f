"""What the benchmarks that run the app share: the server and its scratch databases,
and the app as a subprocess stopped by its pid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psutil

from dashboard import db as dbmod
from dashboard.migrate import apply_migrations

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the server and its database ---------------------------------------------------------


def with_database(dsn: str, name: str) -> str:
    """The same server URL, pointing at database `name`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


class Server:
    """The server under test; creates the fresh database and drops it at exit."""

    def __init__(self, dsn: str, description: str) -> None:
        self.dsn = dsn
        self.description = description
        self.databases: list[str] = []

    async def new_database(self, family: str) -> str:
        name = f"sb_bench_{family}_{os.getpid()}"
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        self.databases.append(name)
        dsn = with_database(self.dsn, name)
        conn = await asyncpg.connect(dsn)
        try:
            await apply_migrations(conn)
            await check_durable(conn)
        finally:
            await conn.close()
        return dsn

    async def drop_all(self) -> None:
        if not self.databases:
            return
        conn = await asyncpg.connect(self.dsn)
        try:
            while self.databases:
                name = self.databases.pop()
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def server_settings(dsn: str, names: tuple[str, ...]) -> dict[str, str]:
    """The server's version and the settings `names`; refuses a non-durable server."""
    conn = await asyncpg.connect(dsn)
    try:
        found = {"version": await conn.fetchval("SHOW server_version")}
        for name in names:
            found[name] = await conn.fetchval(f"SHOW {name}")
        await check_durable(conn)
        return found
    finally:
        await conn.close()


async def check_durable(conn: asyncpg.Connection) -> None:
    """Refuse to measure with commits that are not flushed to disk."""
    fsync = await conn.fetchval("SHOW fsync")
    sync = await conn.fetchval("SHOW synchronous_commit")
    if fsync != "on" or sync not in ("on", "remote_apply", "remote_write"):
        raise SystemExit(
            f"refusing to benchmark a non-durable server: fsync={fsync}, "
            f"synchronous_commit={sync} (both must stay at their default, on)"
        )


# -- the app in a subprocess ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    """`python -m dashboard.cli serve` on a free port, stopped by its pid."""

    def __init__(self, dsn: str, log_path: Path) -> None:
        self.dsn = dsn
        self.log_path = log_path
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def spawn(self) -> None:
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "DATABASE_URL": self.dsn}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dashboard.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )

    async def start(self) -> None:
        self.spawn()
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the app exited at start-up:\n{self.tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.base + "/healthz")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the app did not answer /healthz:\n{self.tail()}")
                await asyncio.sleep(0.1)

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the app died (exit {self.proc.returncode}):\n{self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                log(f"the app (pid {self.proc.pid}) did not stop on SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def run_on_server(prefix: str, run: Callable[[Server, Path], Awaitable[int]]) -> int:
    """Run `run(server, tmp)` on DATABASE_URL, else on an embedded server in a temporary
    data dir that is stopped and removed afterwards."""
    url = os.environ.get("DATABASE_URL")
    embedded = None
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    if url:
        dbmod.check_url(url)
        parts = urlsplit(url)
        server = Server(url, f"DATABASE_URL {parts.hostname or 'socket'}:{parts.port or 5432}")
    else:
        log(f"starting the embedded server in {tmp}")
        embedded = dbmod.start_embedded(tmp / "pgdata")
        server = Server(embedded.get_uri(), "embedded, temporary data dir")
    try:
        return asyncio.run(run(server, tmp))
    finally:
        dbmod.release_embedded(embedded)
        if (tmp / "pgdata" / "postmaster.pid").exists():
            log(f"the embedded server in {tmp} did not stop; its data dir is left there")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
