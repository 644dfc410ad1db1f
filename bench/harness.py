"""The one harness every benchmark runs in: the server under test and its scratch
databases (fresh ones, or copies of one), the durability check, what a report's header
says about the server and the machine (heading, load average, commit probe), the WAL the
server writes during a run (wal_position, wal_since), pgbench, the
app as a subprocess stopped by its pid and a database with an agent's token to drive it
with, and the main loop (run_on_server) that picks the server, runs the benchmark on
asyncio or uvloop, and cleans up after it, also on Ctrl-C or SIGTERM.

What the benchmarks compute and print (percentiles, series, tables, CPU use) is in
stats.py; this module is what they run on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psutil

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.migrate import apply_migrations
from dashboard.store import Store

ROOT = Path(__file__).resolve().parent.parent

# The settings the throughput benchmarks show in their headers, and those they read
# (server_settings' default; queue_throughput.py writes them all to its JSON);
# dashboard_pages.py asks for its own.
SHOWN_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers")
SETTINGS = (*SHOWN_SETTINGS, "max_connections")
# Every value of synchronous_commit but off waits for the commit record to be flushed to
# the local disk (remote_* wait for a synchronous standby as well, local does not; with no
# standby all four mean the same): those commits are durable, off ones are not.
DURABLE_COMMITS = ("on", "local", "remote_write", "remote_apply")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the server and its databases --------------------------------------------------------


def with_database(dsn: str, name: str) -> str:
    """The same server URL, pointing at database `name`."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + name))


class Server:
    """The server under test; creates fresh databases, `sb_bench_<family>_<pid>`, and
    drops them all in drop_all()."""

    def __init__(self, dsn: str, description: str) -> None:
        self.dsn = dsn
        self.description = description
        self.databases: list[str] = []

    async def new_empty_database(
        self, family: str, template: str | None = None, strategy: str | None = None
    ) -> str:
        """A fresh empty database (for a peer's own installer), or with `template` (a
        database URL, unused by anyone) a copy of that one (CREATE DATABASE … TEMPLATE,
        STRATEGY `strategy` when given); its URL."""
        name = f"sb_bench_{family}_{os.getpid()}"
        copy = f' TEMPLATE "{urlsplit(template).path[1:]}"' if template else ""
        copy += f" STRATEGY {strategy}" if strategy else ""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"{copy}')
        finally:
            await conn.close()
        self.databases.append(name)
        return with_database(self.dsn, name)

    async def new_database(
        self, family: str, check: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
    ) -> str:
        """A fresh database migrated to the app's schema on a durable server, then
        `check(conn)` when given; its URL."""
        dsn = await self.new_empty_database(family)
        conn = await asyncpg.connect(dsn)
        try:
            await apply_migrations(conn)
            await check_durable(conn)
            if check is not None:
                await check(conn)
        finally:
            await conn.close()
        return dsn

    async def drop(self, dsn: str) -> None:
        """Drop the database of `dsn` (one of ours) now rather than at the end."""
        name = urlsplit(dsn).path[1:]
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
        self.databases.remove(name)

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


async def server_settings(dsn: str, names: tuple[str, ...] = SETTINGS) -> dict[str, str]:
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


def heading(title: str, server: Server, settings: dict[str, str], names=SHOWN_SETTINGS) -> list[str]:
    """A report's first two lines: what it measured on which server, and its settings."""
    return [
        f"switchboard {title} — PostgreSQL {settings['version']} ({server.description})",
        settings_line(settings, names),
    ]


def server_line(server: Server, settings: dict[str, str]) -> str:
    """The server and its settings on one line, for a report printed as it goes."""
    return (
        f"server: {server.description}, PostgreSQL {settings['version']}; "
        f"{settings_line(settings, SHOWN_SETTINGS)}"
    )


def load() -> str:
    """The machine's load average, for a report's header and its progress lines."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min, {os.cpu_count()} cores)"


def settings_line(settings: dict[str, str], names: tuple[str, ...]) -> str:
    """`name=value  name=value ...` for a report's header."""
    return "  ".join(f"{name}={settings[name]}" for name in names)


async def check_durable(conn: asyncpg.Connection) -> None:
    """Refuse to measure with commits that are not flushed to disk: every figure is for
    durable commits."""
    fsync = await conn.fetchval("SHOW fsync")
    sync = await conn.fetchval("SHOW synchronous_commit")
    if fsync != "on" or sync not in DURABLE_COMMITS:
        raise SystemExit(
            f"refusing to benchmark a non-durable server: fsync={fsync}, "
            f"synchronous_commit={sync} (fsync must be on, and synchronous_commit anything but "
            f"off: {', '.join(DURABLE_COMMITS)}; both default to on)"
        )


# -- the tables between measurements -----------------------------------------------------


async def checkpoint(conn: asyncpg.Connection) -> None:
    """Start every measurement right after a checkpoint (same full-page-write state);
    skipped without the privilege (superuser or pg_checkpoint)."""
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT")


async def settle(conn: asyncpg.Connection) -> None:
    """VACUUM ANALYZE the app's tables, then checkpoint."""
    await conn.execute("VACUUM ANALYZE todos, todo_history, events")
    await checkpoint(conn)


async def commit_ms(conn: asyncpg.Connection, count: int = 50) -> float:
    """How long a one-row INSERT and its commit take right now, median of `count`, ms, in a
    table of its own (emptied after): on a shared machine a slow disk or a busy CPU shows
    up here first, and says how far to trust the run."""
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (at timestamptz)")
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await conn.execute("INSERT INTO public.bench_commit_probe VALUES (now())")
        times.append(time.perf_counter() - began)
    await conn.execute("TRUNCATE bench_commit_probe")
    return statistics.median(times) * 1000


async def wal_position(conn: asyncpg.Connection) -> int:
    """Where the server inserts WAL now (pg_current_wal_insert_lsn(), which asyncpg gives
    as the byte position), for wal_since."""
    return await conn.fetchval("SELECT pg_current_wal_insert_lsn()")


async def wal_since(conn: asyncpg.Connection, position: int) -> int:
    """Bytes of WAL the whole server has inserted since `position` (wal_position), as
    pg_wal_lsn_diff(now, position) counts them: what one workload wrote only on a server
    nobody else writes to meanwhile."""
    return int(await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", position))


async def count_states(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state::text, count(*) FROM todos GROUP BY state")
    return {r[0]: r[1] for r in rows}


async def expect_states(conn: asyncpg.Connection, expected: dict[str, int], what: str) -> None:
    """Stop the run when `todos` does not hold exactly `expected` todos per state."""
    found = await count_states(conn)
    if found != expected:
        raise RuntimeError(f"{what}: expected {expected}, the table holds {found}")


# -- pgbench -----------------------------------------------------------------------------

# PGBENCH overrides; any pgbench 10 or newer can drive a newer server (the embedded one).
PGBENCH = os.environ.get("PGBENCH") or shutil.which("pgbench") or "/usr/bin/pgbench"


@dataclass
class PgbenchRun:
    """One pgbench run: its transactions (script executions) and pgbench's own rate, which
    leaves out connecting."""

    transactions: int
    tps: float
    output: str

    @property
    def seconds(self) -> float:
        return self.transactions / self.tps


def pgbench_version() -> str:
    try:
        out = subprocess.run([PGBENCH, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"pgbench is needed ({PGBENCH}: {exc}); set PGBENCH to its path") from None
    return out.split(")", 1)[-1].strip() or out.strip()


async def pgbench(
    dsn: str,
    script: str,
    *,
    clients: int,
    transactions: int,
    tmp: Path,
    name: str,
    variables: dict[str, str] | None = None,
    server_settings: dict[str, str] | None = None,
    threads: int = 2,
) -> PgbenchRun:
    """`pgbench -n -M prepared` running `script` (written to tmp/name.sql) on `clients`
    connections, `transactions` script executions each (-t), with `-D` variables and the
    session settings `server_settings` (as PGOPTIONS). Raises unless every client ran
    every transaction without an error. Cancelled (Ctrl-C, SIGTERM), it stops pgbench by
    its pid first."""
    path = tmp / f"{name}.sql"
    path.write_text(script)
    argv = [PGBENCH, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(threads, clients))]
    argv += ["-t", str(transactions), "-f", str(path)]
    for key, value in (variables or {}).items():
        argv += ["-D", f"{key}={value}"]
    env = dict(os.environ)
    if server_settings:
        env["PGOPTIONS"] = " ".join(f"-c {k}={v}" for k, v in server_settings.items())
    proc = await asyncio.create_subprocess_exec(
        *argv, dsn, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        out, err = await proc.communicate()
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        raise
    text = out.decode() + err.decode()
    processed = re.search(r"number of transactions actually processed: (\d+)", text)
    tps = re.search(r"^tps = ([0-9.]+)", text, re.MULTILINE)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    expected = clients * transactions
    if (
        proc.returncode != 0
        or not processed
        or not tps
        or int(processed[1]) != expected
        or (failed and int(failed[1]))
    ):
        tail = "\n".join(text.strip().splitlines()[-12:])
        raise RuntimeError(
            f"pgbench {name} (exit {proc.returncode}) did not run {expected} transactions:\n{tail}"
        )
    return PgbenchRun(expected, float(tps[1]), text)


# -- the app in a subprocess ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    """`python -m dashboard.cli serve` on a free port, stopped by its pid; `env` is added
    to its environment. A subclass may run another server (command()) that answers
    GET /healthz the same way. `async with` starts it and stops it after."""

    name = "the app"

    def __init__(self, dsn: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.log_path = log_path
        self.env = env or {}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = None

    def command(self) -> list[str]:
        serve = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        return [sys.executable, "-m", "dashboard.cli", *serve]

    def spawn(self) -> None:
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **self.env, "DATABASE_URL": self.dsn}
        self.proc = subprocess.Popen(
            self.command(),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )

    async def __aenter__(self) -> AppProcess:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop()

    async def start(self) -> None:
        log(f"starting {self.name} on {self.base}")
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
                log(f"the app (pid {self.proc.pid}) did not stop on SIGTERM; killing it. Its log ends:")
                log(self.tail(15))
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class AgentDatabase:
    """A fresh migrated database with an agent's token, as the HTTP benchmarks use it."""

    dsn: str
    token: str  # of bench-agent, for the queues asked for
    admin: asyncpg.Connection  # for checks and TRUNCATE
    fill: Store  # on a connection of its own, for filling queues


@contextlib.asynccontextmanager
async def agent_database(server: Server, family: str, queues: list[str]) -> AsyncIterator[AgentDatabase]:
    """server.new_database(family) and a token for `queues`; its connections closed after."""
    dsn = await server.new_database(family)
    admin = await asyncpg.connect(dsn)
    fill_conn = await dbmod.connect(dsn)
    try:
        _, token = await Accounts(admin).add_token("bench-agent", queues)
        yield AgentDatabase(dsn, token, admin, Store(fill_conn))
    finally:
        await fill_conn.close()
        await admin.close()


def run_on_server(
    prefix: str,
    run: Callable[[Server, argparse.Namespace, Path], Awaitable[int]],
    args: argparse.Namespace,
    *,
    use_uvloop: bool = False,
) -> int:
    """Run `run(server, args, tmp)` on DATABASE_URL, else on an embedded server in a
    temporary data dir that is stopped and removed afterwards; its exit status.

    The event loop is asyncio's, or uvloop's with `use_uvloop`. SIGTERM cancels the run like
    Ctrl-C does; either way `run`'s own clean-up (dropping its databases, stopping the app)
    runs first, and the status is 143 or 130."""
    embedded = None
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        url = os.environ.get("DATABASE_URL")
        if url:
            dbmod.check_url(url)
            parts = urlsplit(url)
            server = Server(url, f"DATABASE_URL {parts.hostname or 'socket'}:{parts.port or 5432}")
        else:
            log(f"starting the embedded server in {tmp}")
            embedded = dbmod.start_embedded(tmp / "pgdata")
            server = Server(embedded.get_uri(), "embedded, temporary data dir")
        with asyncio.Runner(loop_factory=_loop_factory(use_uvloop)) as runner:
            try:
                return runner.run(_cancelled_by_sigterm(run(server, args, tmp)))
            except (KeyboardInterrupt, asyncio.CancelledError) as exc:
                log("interrupted: the benchmark databases were dropped")
                return 130 if isinstance(exc, KeyboardInterrupt) else 143
    finally:
        dbmod.release_embedded(embedded)
        if (tmp / "pgdata" / "postmaster.pid").exists():
            log(f"the embedded server in {tmp} did not stop; its data dir is left there")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


async def _cancelled_by_sigterm(run: Awaitable[int]) -> int:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    return await run


def _loop_factory(use_uvloop: bool):
    if not use_uvloop:
        return None
    import uvloop

    return uvloop.new_event_loop
