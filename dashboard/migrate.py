"""Numbered migrations from sql/migrations, applied in order under an advisory lock.

Each file runs in its own transaction and is recorded with its checksum; a file whose
checksum no longer matches what was applied stops start-up, naming the file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dashboard.errors import MigrationError

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "sql" / "migrations"
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
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a number in {directory}")
    return found


async def apply_migrations(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply what is missing; returns the names applied by this call."""
    migrations = load_migrations(directory)
    applied_now = []
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        recorded = {
            r["version"]: r for r in await conn.fetch("SELECT * FROM schema_migrations")
        }
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
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version, migration.name, migration.checksum,
                )
            applied_now.append(migration.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)
    return applied_now
