"""Our sessions' settings (dashboard/db.py SERVER_SETTINGS) are SET once a connection is
open, never sent as startup parameters, which poolers refuse (tests/test_pgbouncer.py runs
the app through PgBouncer). pg_settings.source tells the two apart: 'session' for a SET,
'client' for a startup parameter."""

from __future__ import annotations

from dashboard import db as dbmod
from dashboard.notify import APPLICATION_NAME, listen_connection

OURS = {"plan_cache_mode": "force_generic_plan", "idle_in_transaction_session_timeout": "1min", "jit": "off"}


async def settings(conn, names) -> dict[str, tuple[str, str]]:
    """name: (value, where it came from) for each of `names` in `conn`'s session."""
    rows = await conn.fetch(
        "SELECT name, current_setting(name) AS value, source FROM pg_settings WHERE name = ANY($1::text[])",
        list(names),
    )
    return {row["name"]: (row["value"], row["source"]) for row in rows}


SET_BY_US = {name: (value, "session") for name, value in OURS.items()}


async def test_a_pool_connection_runs_with_our_settings_and_a_rolled_back_release_keeps_them(dsn):
    pool = await dbmod.create_pool(dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            assert await settings(conn, OURS) == SET_BY_US
            pid = conn.get_server_pid()
            await conn.execute("BEGIN; SET plan_cache_mode = auto; SET LOCAL jit = on")  # left open
        async with pool.acquire() as conn:  # reset_connection rolled the transaction back
            assert conn.get_server_pid() == pid
            assert await settings(conn, OURS) == SET_BY_US
    finally:
        await pool.close()


async def test_one_connection_runs_with_our_settings_and_its_own(dsn):
    conn = await dbmod.connect(dsn, application_name="a test", settings={"lock_timeout": "2s"})
    try:
        assert await settings(conn, [*OURS, "lock_timeout", "application_name"]) == {
            **SET_BY_US,
            "lock_timeout": ("2s", "session"),
            "application_name": ("a test", "client"),  # a startup parameter poolers pass on
        }
    finally:
        await conn.close()


async def test_the_hubs_connection_commits_without_waiting_for_a_wal_flush(dsn):
    conn = await listen_connection(dsn)
    try:
        assert await settings(conn, [*OURS, "synchronous_commit", "application_name"]) == {
            **SET_BY_US,
            "synchronous_commit": ("off", "session"),
            "application_name": (APPLICATION_NAME, "client"),
        }
    finally:
        await conn.close()
