"""The bearer-token cache (dashboard/web/token_cache.py): no database round trip for a
known token, and still no way for a revoked token to keep working.

Against a real `switchboard serve`: a token revoked from another process fails there
within a second; with the server's LISTEN connection killed (so the revocation's NOTIFY
cannot arrive), it fails on its very next request. In process, with a real Accounts and a
real Hub: a known token is looked up once, not per request; while the hub is down every
lookup asks the database.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from dashboard.accounts import Accounts
from dashboard.notify import APPLICATION_NAME, Hub
from dashboard.web.token_cache import MAX_AGE, TokenCache
from tests.factories import unique
from tests.processes import eventually
from tests.test_longpoll import live_http

API = "/api/v1"


async def listed(http: httpx.AsyncClient, headers: dict, queue: str) -> int:
    return (await http.get(f"{API}/todos", headers=headers, params={"queue": queue})).status_code


async def new_token(conn, agent: str, queue: str) -> tuple[str, dict]:
    token_id, secret = await Accounts(conn).add_token(agent, [queue])
    return token_id, {"Authorization": f"Bearer {secret}"}


async def test_a_token_revoked_in_another_process_fails_within_a_second(live_server, live_conn):
    queue = unique("rv")
    token_id, headers = await new_token(live_conn, "revokee", queue)
    async with live_http(live_server) as http:
        for _ in range(3):  # known, and so cached, by the server
            assert await listed(http, headers, queue) == 200
        await Accounts(live_conn).revoke_token(token_id, actor="operator:test")
        revoked_at = time.monotonic()
        await eventually(lambda: listed(http, headers, queue), lambda status: status == 401, within=5)
        assert time.monotonic() - revoked_at < 1.0


async def test_with_the_listen_connection_killed_a_revoked_token_fails_on_its_next_request(
    live_server, live_conn
):
    queue = unique("rvl")
    token_id, headers = await new_token(live_conn, "revokee2", queue)
    async with live_http(live_server) as http:
        assert await listed(http, headers, queue) == 200
        killed = await live_conn.fetch(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = $1 AND datname = current_database()",
            APPLICATION_NAME,
        )
        assert killed, "found no LISTEN connection to terminate"
        pids = [r["pid"] for r in killed]
        gone = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = ANY($1::int[]))"
        await eventually(lambda: live_conn.fetchval(gone, pids), bool, within=5)
        await Accounts(live_conn).revoke_token(token_id, actor="operator:test")  # its NOTIFY may be lost
        assert await listed(http, headers, queue) == 401


class CountingAccounts(Accounts):
    """Accounts that counts its token lookups (each one a real query)."""

    lookups = 0

    async def agent_for_hash(self, key: bytes):
        self.lookups += 1
        return await super().agent_for_hash(key)


@pytest.fixture
async def hub(dsn):
    """A started hub (its LISTEN connection up), stopped after the test."""
    hub = Hub(dsn)
    await hub.start()
    yield hub
    await hub.stop()


async def test_a_known_token_is_looked_up_once_and_a_revocation_drops_it(hub, pool):
    accounts = CountingAccounts(pool)
    token_id, secret = await accounts.add_token("cached", ["work"])
    cache = TokenCache(accounts, hub)
    for _ in range(20):
        agent = await cache.agent_for(secret)
        assert agent.name == "cached" and agent.scope.queues == ("work",)
    assert accounts.lookups == 1
    assert await cache.agent_for("sb_not-a-token") is None
    assert await cache.agent_for("sb_not-a-token") is None
    assert accounts.lookups == 3, "an unknown token is never remembered"

    await accounts.revoke_token(token_id, actor="operator:test")
    # well within MAX_AGE: only the revocation's NOTIFY can have dropped it
    await eventually(lambda: cache.agent_for(secret), lambda agent: agent is None, within=MAX_AGE / 2)


async def test_while_the_hub_is_down_every_lookup_asks_the_database(dsn, pool):
    accounts = CountingAccounts(pool)
    _, secret = await accounts.add_token("uncached", ["work"])
    hub = Hub(dsn)  # never started: no LISTEN connection, so no revocation would reach us
    cache = TokenCache(accounts, hub)
    for _ in range(5):
        assert (await cache.agent_for(secret)).name == "uncached"
    assert accounts.lookups == 5


async def test_an_entry_is_never_trusted_past_max_age(hub, pool):
    accounts = CountingAccounts(pool)
    _, secret = await accounts.add_token("aging", ["work"])
    cache = TokenCache(accounts, hub)
    await cache.agent_for(secret)
    await asyncio.sleep(MAX_AGE * 1.2)  # the age itself is what is under test
    await cache.agent_for(secret)
    assert accounts.lookups == 2
