"""Numbered migrations from sql/migrations, applied in order under an advisory lock, and
`open_database`: the pool a process starts with, its database migrated.

Each file runs in its own transaction and is recorded with its checksum; a file whose
checksum no longer matches what was applied stops start-up, naming the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import asyncpg

from dashboard.config import Settings
from dashboard.db import Database, create_pool, release_embedded, resolve_dsn
from dashboard.errors import MigrationError
from dashboard.queries import MIGRATIONS as SQL

MIGRATIONS_DIR = Path(str(files("dashboard") / "sql" / "migrations"))
# Any constant works; it only has to be the same for every switchboard process.
ADVISORY_LOCK_KEY = 0x5B_0A_2D


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        number = path.name.split("_", 1)[0]
        if not number.isdigit():
            raise MigrationError(f"migration file {path.name} does not start with a number")
        found.append(Migration(int(number), path.name, path.read_text()))
    if not found:  # an install without its SQL must not pass for an up-to-date database
        raise MigrationError(f"no migration files in {directory}: the installation is incomplete")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number in {directory}")
    return found


async def apply_migrations(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply what is missing; returns the names applied by this call."""
    migrations = load_migrations(directory)
    applied_now = []
    await SQL.lock.execute(conn, key=ADVISORY_LOCK_KEY)
    try:
        await SQL.create_table.execute(conn)
        recorded = {r["version"]: r for r in await SQL.recorded.fetch(conn)}
        for migration in migrations:
            done = recorded.get(migration.version)
            if done is not None:
                if done["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.name} was changed after it was applied "
                        f"(recorded checksum {done['checksum'][:12]}, file has "
                        f"{migration.checksum[:12]}); add a new migration instead"
                    )
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await SQL.record.execute(
                    conn, version=migration.version, name=migration.name, checksum=migration.checksum
                )
            applied_now.append(migration.name)
    finally:
        await SQL.unlock.execute(conn, key=ADVISORY_LOCK_KEY)
    return applied_now


async def open_database(
    settings: Settings, *, migrate: bool = True, max_size: int = 10, create: bool = False
) -> Database:
    """Resolve the server from `settings` (`create`: see resolve_dsn), open the pool and
    (by default) apply migrations."""
    dsn, server = resolve_dsn(settings, create=create)
    try:
        pool = await create_pool(dsn, max_size=max_size)
    except BaseException:
        release_embedded(server)
        raise
    db = Database(dsn=dsn, pool=pool, server=server)
    if migrate:
        try:
            async with pool.acquire() as conn:
                db.migrated = await apply_migrations(conn)
        except BaseException:
            await db.close()
            raise
    return db
