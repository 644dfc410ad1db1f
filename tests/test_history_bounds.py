"""A todo's history costs a bounded read however its owner grew it (issue 25, item 1).

Every heartbeat is a step and every edit holds two payloads, so an agent can make its
todo's history long and heavy cheaply. A todo read (the API's GET, MCP get_todo, the todo
page) shows the newest HISTORY_SHOWN steps and leaves out changes over
CHANGES_BYTES_SHOWN; GET /api/v1/todos/{id}/history pages back through the rest; a wait
re-reads the todo alone and its history once, for the answer.
"""

from __future__ import annotations

import asyncio

import httpx

from dashboard.reads import CHANGES_BYTES_SHOWN, HISTORY_SHOWN
from tests.conftest import connected
from tests.factories import agent_token, login, unique
from tests.latency import assert_heartbeats_hold

API = "/api/v1"


async def grow_history(db, todo_id: str, steps: int) -> None:
    """`steps` heartbeat steps for a claimed todo, as its owner's heartbeats write them."""
    await db.execute(
        """INSERT INTO todo_history
               (todo_id, from_state, to_state, actor_kind, actor, attempt, note, event, queue)
           SELECT id, 'claimed', 'claimed', 'agent', owner, attempt, 'heartbeat', 'heartbeat', queue
           FROM todos, generate_series(1, $2) WHERE id = $1""",
        todo_id,
        steps,
    )


async def claimed_by_api(http: httpx.AsyncClient, queue: str, headers: dict | None = None) -> dict:
    created = await http.post(f"{API}/todos", json={"queue": queue, "title": "long history"}, headers=headers)
    assert created.status_code == 201, created.text
    claimed = await http.post(f"{API}/claims", json={"queues": [queue], "ttl": 600}, headers=headers)
    assert claimed.status_code == 200, claimed.text
    return claimed.json()


async def test_a_read_shows_the_newest_steps_and_the_history_pages_back_through_all(client, pool):
    queue = unique("hist")
    client.headers.update(await agent_token(pool, "historian", [queue]))
    todo = await claimed_by_api(client, queue)
    await grow_history(pool, todo["id"], 2 * HISTORY_SHOWN + 7)
    all_ids = [
        r["id"]
        for r in await pool.fetch("SELECT id FROM todo_history WHERE todo_id = $1 ORDER BY id", todo["id"])
    ]

    detail = (await client.get(f"{API}/todos/{todo['id']}")).json()
    assert [h["id"] for h in detail["history"]] == all_ids[-HISTORY_SHOWN:]
    assert detail["older_history"] is True

    seen, before = [], None
    while True:
        params = {"limit": 50} | ({"before": before} if before else {})
        page = (await client.get(f"{API}/todos/{todo['id']}/history", params=params)).json()
        seen = [h["id"] for h in page["items"]] + seen
        if not page["older"]:
            break
        before = page["items"][0]["id"]
    assert seen == all_ids


async def test_a_short_history_says_there_is_nothing_older(client, pool):
    queue = unique("hist")
    client.headers.update(await agent_token(pool, "historian", [queue]))
    todo = await claimed_by_api(client, queue)
    detail = (await client.get(f"{API}/todos/{todo['id']}")).json()
    assert [h["to_state"] for h in detail["history"]] == ["pending", "claimed"]
    assert detail["older_history"] is False


async def test_history_paging_is_checked_and_scoped(client, pool):
    queue = unique("hist")
    client.headers.update(await agent_token(pool, "historian", [queue]))
    todo = await claimed_by_api(client, queue)
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 100_000}, "limit"),
        ({"before": "x"}, "before"),
    ):
        answer = await client.get(f"{API}/todos/{todo['id']}/history", params=params)
        assert answer.status_code in (400, 422), answer.text
        assert field in answer.text
    client.headers.update(await agent_token(pool, "outsider", [unique("elsewhere")]))
    assert (await client.get(f"{API}/todos/{todo['id']}/history")).status_code == 404


async def test_an_edit_too_large_to_show_gives_its_size_instead(client, pool):
    queue = unique("hist")
    client.headers.update(await agent_token(pool, "historian", [queue]))
    created = await client.post(f"{API}/todos", json={"queue": queue, "title": "t", "payload": {"small": 1}})
    todo_id = created.json()["todo"]["id"]
    big = {"blob": "x" * (CHANGES_BYTES_SHOWN * 2)}
    edited = await client.patch(f"{API}/todos/{todo_id}", json={"payload": big})
    assert edited.status_code == 200, edited.text
    small = await client.patch(f"{API}/todos/{todo_id}", json={"title": "t2"})
    assert small.status_code == 200, small.text

    history = (await client.get(f"{API}/todos/{todo_id}")).json()["history"]
    big_edit, title_edit = history[-2], history[-1]
    assert big_edit["changes"] is None and big_edit["changes_bytes"] > CHANGES_BYTES_SHOWN * 2
    assert title_edit["changes"] == {"title": ["t", "t2"]} and title_edit["changes_bytes"] is None


async def test_the_todo_page_says_when_earlier_steps_are_left_out(client, pool):
    queue = unique("hist")
    headers = await agent_token(pool, "historian", [queue])
    todo = await claimed_by_api(client, queue, headers)
    await login(client, pool)
    page = await client.get(f"/todos/{todo['id']}")
    assert 'id="older-history"' not in page.text
    await grow_history(pool, todo["id"], HISTORY_SHOWN)
    page = await client.get(f"/todos/{todo['id']}")
    assert 'id="older-history"' in page.text
    assert page.text.count('class="to-claimed"') == HISTORY_SHOWN


async def test_fifty_waiters_on_a_long_history_do_not_stall_other_agents(live_server):
    """The issue's reproduction: 50 waiters on a todo with 20,000 heartbeats (another
    agent's heartbeat p50 was 3.2 s), scaled to stay quick: the waits re-read every 1.5 s."""
    base, dsn = live_server
    queue = unique("hist")
    async with connected(dsn) as db:
        headers = await agent_token(db, "historian", [queue])
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            todo = await claimed_by_api(http, queue)
        await grow_history(db, todo["id"], 20_000)

    async def waiters() -> None:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits) as http:
            while True:
                await asyncio.gather(
                    *(http.get(f"{API}/todos/{todo['id']}", params={"wait": 30}) for _ in range(50))
                )

    await assert_heartbeats_hold(base, dsn, waiters)
