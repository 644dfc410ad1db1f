"""A database that goes away or turns read-only is a 503 with Retry-After on every
surface (API problem, page, htmx banner), never a 500, and nothing changes meanwhile;
service comes back by itself once the database does, without a restart."""

from __future__ import annotations

import asyncio

import pytest

from dashboard import db
from dashboard.errors import StatementCancelled
from dashboard.web.errors import status_of
from tests.factories import agent_token, login
from tests.web_helpers import post

API = "/api/v1"


async def set_read_only(conn, app, on: bool) -> None:
    """Switch the database as a failover would (for new sessions), and have the app's pool
    open new sessions (asyncpg's expire_connections: each is replaced on its next use)."""
    name = await conn.fetchval("SELECT current_database()")
    setting = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    await conn.execute(f'ALTER DATABASE "{name}" {setting}')
    await app.state.services.store.db.expire_connections()


async def until(request, accept, within: float = 15.0):
    """Repeat `request()` until `accept(response)`, for at most `within` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        response = await request()
        if accept(response):
            return response
        assert response.status_code != 500, response.text
        assert asyncio.get_running_loop().time() < deadline, f"still {response.status_code}: {response.text}"
        await asyncio.sleep(0.1)


def read_only_503(response) -> bool:
    return response.status_code == 503 and "read-only" in response.text


async def test_a_read_only_database_answers_503_with_retry_after_and_recovers_without_a_restart(
    app, client, pool, conn
):
    bot = await agent_token(pool, queues=("work",))
    csrf = await login(client, pool)
    ready = await until(lambda: client.get("/readyz"), lambda r: r.status_code == 200)
    assert ready.json() == {
        "ready": True,
        "checks": {"listening": True, "database": True, "migrations": True, "writable": True},
    }
    body = {"queue": "work", "title": "during the failover"}
    await set_read_only(conn, app, True)

    created = await until(lambda: client.post(f"{API}/todos", headers=bot, json=body), read_only_503)
    assert created.headers["retry-after"] == "2"
    assert created.headers["content-type"].startswith("application/problem+json")
    problem = created.json()
    assert problem["status"] == 503 and "read-only" in problem["detail"]

    claimed = await client.post(f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30})
    listed = await client.get(f"{API}/todos", headers=bot)
    assert read_only_503(claimed) and listed.status_code == 200  # reads still work
    page = await post(client, "/create", csrf, {"queue": "work", "title": "from the form"})
    assert page.status_code == 503 and page.headers["retry-after"] == "2"
    assert "read-only" in page.text and "<html" in page.text
    banner = await post(client, "/create", csrf, {"queue": "work", "title": "from htmx"}, htmx=True)
    assert banner.status_code == 503 and banner.headers["hx-retarget"] == "#flash"
    assert "read-only" in banner.text and "<html" not in banner.text
    assert await conn.fetchval("SELECT count(*) FROM todos") == 0  # nothing changed
    not_ready = await until(lambda: client.get("/readyz"), lambda r: r.status_code == 503)
    assert not_ready.json()["checks"]["writable"] is False and not_ready.headers["retry-after"] == "2"

    await set_read_only(conn, app, False)
    created = await until(
        lambda: client.post(f"{API}/todos", headers=bot, json=body), lambda r: r.status_code == 201
    )
    assert await conn.fetchval("SELECT count(*) FROM todos") == 1
    assert (await until(lambda: client.get("/readyz"), lambda r: r.status_code == 200)).json()["ready"]


async def test_a_statement_the_database_stops_is_a_503_and_keeps_its_connection(dsn):
    """statement_timeout (our reads' own, or one an administrator set) stops a statement
    with QueryCanceledError, an "operator intervention" like a shutdown: it is a 503 like
    one (StatementCancelled), but the connection is fine and goes back to the pool."""
    pool = await db.create_pool(dsn, min_size=1, max_size=1)
    try:
        before = await pool.fetchval("SELECT pg_backend_pid()")
        with pytest.raises(StatementCancelled) as stopped:
            async with db.transaction(pool) as conn:
                await conn.execute("SET LOCAL statement_timeout = 50")
                await conn.execute("SELECT pg_sleep(5)")
        assert status_of(stopped.value) == 503
        async with db.connection(pool) as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == before
    finally:
        await pool.close()
