"""/readyz and the migrations check during a rolling deploy: a process stays ready after
a newer release has migrated the database, and is not ready while one it needs is missing."""

from __future__ import annotations

from dashboard.web.health import NEEDED_MIGRATION
from tests.test_outages import until


async def test_readyz_stays_ready_after_a_newer_release_migrated_the_database(client, conn):
    assert (await until(lambda: client.get("/readyz"), lambda r: r.status_code == 200)).json()["ready"]
    await conn.execute(
        "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'next_release.sql', 'x')",
        NEEDED_MIGRATION + 1,
    )
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["migrations"] is True


async def test_readyz_is_not_ready_while_a_needed_migration_is_missing(client, conn):
    await conn.execute("DELETE FROM schema_migrations WHERE version = $1", NEEDED_MIGRATION)
    not_ready = await until(lambda: client.get("/readyz"), lambda r: r.status_code == 503)
    assert not_ready.json()["checks"]["migrations"] is False
