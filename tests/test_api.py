"""The agent HTTP API under /api/v1 (DESIGN.md, "Agent API"), in process, on a real database.

Every endpoint's success answers, and every error status as an RFC 9457 problem detail.
After each refused request the database is compared with a snapshot taken before it:
a refusal never half-applies anything. The bearer token, never the body, decides the
owner and the queues a request may touch.

Tokens: `bot` covers queues work and other; `rival` covers work; a todo in queue
`secret` is outside the bot's token.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
import pytest_asyncio

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.models import MAX_JSON_BYTES, NewTodo
from dashboard.store import Store
from tests.conftest import scratch_database
from tests.factories import agent_token

API = "/api/v1"
PROBLEM = "application/problem+json"


# -- fixtures and helpers ----------------------------------------------------------------


# One database and one app (lifespan, LISTEN hub, reaper) for the whole module, emptied
# before each test: far cheaper than a database and an app per test, and every test
# still starts from nothing.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def module_db(server_dsn, template_db):
    with scratch_database(server_dsn, template_db) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(module_db):
    pool = await dbmod.create_pool(module_db, min_size=1, max_size=10)
    yield pool
    await pool.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(module_db, pool):
    """The real app in process (overrides conftest's per-test client)."""
    from litestar.testing import AsyncTestClient

    from dashboard.web.app import create_app, load_secrets

    app = create_app(module_db, await load_secrets(dbmod.Database(dsn=module_db, pool=pool)),
                     pool_size=4)
    async with AsyncTestClient(app, base_url="http://testserver.local") as client:
        yield client


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def empty_tables(pool):
    await pool.execute("DELETE FROM todo_history; DELETE FROM todos; DELETE FROM events; "
                       "DELETE FROM api_tokens")


@pytest_asyncio.fixture(loop_scope="module")
async def bot(pool) -> dict:
    return await agent_token(pool, "bot", ["work", "other"])


@pytest_asyncio.fixture(loop_scope="module")
async def rival(pool) -> dict:
    return await agent_token(pool, "rival", ["work"])


async def snapshot(pool) -> tuple:
    """Everything a request could change: todos, history, events."""
    todos = [dict(r) for r in await pool.fetch("SELECT * FROM todos ORDER BY id")]
    history = [dict(r) for r in await pool.fetch("SELECT * FROM todo_history ORDER BY id")]
    events = [dict(r) for r in await pool.fetch("SELECT * FROM events ORDER BY id")]
    return todos, history, events


def problem(response, status: int, *, field: str | None = None) -> dict:
    """Assert an RFC 9457 problem detail with this status (naming `field` if given)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        assert body.get("field") == field or field in body["detail"], body
    return body


async def create(client, headers, queue: str = "work", title: str = "t", **body) -> dict:
    response = await client.post(f"{API}/todos", json={"queue": queue, "title": title, **body},
                                 headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["todo"]


async def claim(client, headers, queues=("work",), ttl: float = 30) -> dict:
    response = await client.post(f"{API}/claims", json={"queues": list(queues), "ttl": ttl},
                                 headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def row(pool, todo_id: str) -> dict:
    return dict(await pool.fetchrow("SELECT * FROM todos WHERE id = $1", todo_id))


async def history(pool, todo_id: str) -> list[tuple]:
    rows = await pool.fetch(
        "SELECT from_state::text, to_state::text, actor, attempt, note FROM todo_history "
        "WHERE todo_id = $1 ORDER BY id", todo_id)
    return [tuple(r) for r in rows]


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


# -- create ------------------------------------------------------------------------------


async def test_create_answers_201_with_the_new_pending_todo(client, pool, bot):
    response = await client.post(f"{API}/todos", headers=bot, json={
        "queue": "work", "title": "send the mail", "kind": "email", "payload": {"to": "a@b"},
        "max_attempts": 3, "assignee": "bot"})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["created"] is True
    todo = body["todo"]
    assert todo["id"].startswith("td_")
    assert (todo["queue"], todo["title"], todo["kind"], todo["state"]) == (
        "work", "send the mail", "email", "pending")
    assert todo["payload"] == {"to": "a@b"} and todo["max_attempts"] == 3
    assert todo["lease"] is None and todo["owner"] is None
    stored = await row(pool, todo["id"])
    assert stored["payload"] == {"to": "a@b"} and stored["state"] == "pending"
    assert await history(pool, todo["id"]) == [(None, "pending", "agent:bot", 0, "created")]


async def test_a_duplicate_key_answers_200_with_the_live_todo_and_counts_the_delivery(client, pool, bot):
    first = await create(client, bot, idempotency_key="hook-1", payload={"n": 1})
    response = await client.post(f"{API}/todos", headers=bot, json={
        "queue": "work", "title": "again", "idempotency_key": "hook-1", "payload": {"n": 2}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["created"] is False
    assert body["todo"]["id"] == first["id"]
    assert body["todo"]["payload"] == {"n": 1}  # the live todo, not the duplicate
    assert body["todo"]["dedupe_hits"] == 1
    assert await pool.fetchval("SELECT count(*) FROM todos") == 1
    assert (await row(pool, first["id"]))["dedupe_hits"] == 1
    assert (await history(pool, first["id"]))[-1][-1] == "duplicate delivery collapsed"


async def test_a_key_makes_a_new_todo_once_its_todo_is_done(client, pool, bot):
    first = await create(client, bot, idempotency_key="k")
    held = await claim(client, bot)
    done = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                             json={"lease": held["lease"]})
    assert done.status_code == 200, done.text
    second = await client.post(f"{API}/todos", headers=bot,
                               json={"queue": "work", "title": "t", "idempotency_key": "k"})
    assert second.status_code == 201 and second.json()["created"] is True
    assert second.json()["todo"]["id"] != first["id"]


async def test_create_with_an_inline_event_stores_the_event_and_links_it(client, pool, bot):
    todo = await create(client, bot, event={"source": "github", "kind": "push",
                                            "payload": {"ref": "main"}})
    assert todo["event_id"].startswith("ev_")
    event = await pool.fetchrow("SELECT * FROM events WHERE id = $1", todo["event_id"])
    assert (event["source"], event["kind"], event["payload"]) == ("github", "push", {"ref": "main"})
    detail = (await client.get(f"{API}/todos/{todo['id']}", headers=bot)).json()
    assert detail["event"]["id"] == todo["event_id"]
    assert detail["event"]["payload"] == {"ref": "main"}


# -- batch -------------------------------------------------------------------------------


async def test_batch_answers_one_result_per_item_in_order_each_with_created(client, pool, bot):
    live = await create(client, bot, idempotency_key="old")
    items = [
        {"queue": "work", "title": "a"},
        {"queue": "other", "title": "b", "idempotency_key": "x"},
        {"queue": "work", "title": "c", "idempotency_key": "old"},
        {"queue": "other", "title": "d", "idempotency_key": "x"},
        {"queue": "work", "title": "e", "event": {"source": "s", "kind": "k"}},
    ]
    response = await client.post(f"{API}/todos/batch", headers=bot, json={"todos": items})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["created"] for r in results] == [True, True, False, False, True]
    assert [r["todo"]["title"] for r in results] == ["a", "b", live["title"], "b", "e"]
    assert [r["todo"]["queue"] for r in results] == ["work", "other", "work", "other", "work"]
    assert results[2]["todo"]["id"] == live["id"]
    assert results[3]["todo"]["id"] == results[1]["todo"]["id"]
    assert results[4]["todo"]["event_id"].startswith("ev_")
    assert await pool.fetchval("SELECT count(*) FROM todos") == 4
    assert (await row(pool, live["id"]))["dedupe_hits"] == 1
    assert (await row(pool, results[1]["todo"]["id"]))["dedupe_hits"] == 1


async def test_a_batch_with_one_invalid_item_creates_nothing_and_names_the_item(client, pool, bot):
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/batch", headers=bot, json={"todos": [
        {"queue": "work", "title": "fine", "event": {"source": "s", "kind": "k"}},
        {"queue": "work", "title": "bad", "max_attempts": 0},
    ]})
    problem(response, 422, field="todos[1].max_attempts")
    assert await snapshot(pool) == before


# -- claims ------------------------------------------------------------------------------


async def test_claims_answers_200_with_the_oldest_todo_its_lease_and_expiry(client, pool, bot):
    older = await create(client, bot, queue="other", title="older")
    await create(client, bot, queue="work", title="newer")
    response = await client.post(f"{API}/claims", headers=bot,
                                 json={"queues": ["work", "other"], "ttl": 60})
    assert response.status_code == 200, response.text
    todo = response.json()
    assert todo["id"] == older["id"]
    assert (todo["state"], todo["owner"], todo["attempt"]) == ("claimed", "bot", 1)
    stored = await row(pool, todo["id"])
    assert isinstance(todo["lease"], int) and todo["lease"] == stored["lease_token"]
    assert parse(todo["lease_expires_at"]) == stored["lease_expires_at"]
    now = await pool.fetchval("SELECT now()")
    assert timedelta(seconds=55) < stored["lease_expires_at"] - now < timedelta(seconds=65)


async def test_claims_answers_204_at_once_when_nothing_is_ready_and_wait_is_zero(client, pool, bot):
    await create(client, bot, assignee="someone-else")
    response = await client.post(f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30})
    assert response.status_code == 204
    assert response.content == b""
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed'") == 0


async def test_claims_answers_204_after_waiting_when_no_todo_comes(client, bot):
    start = time.monotonic()
    response = await client.post(f"{API}/claims", headers=bot,
                                 json={"queues": ["work"], "ttl": 30, "wait": 1})
    elapsed = time.monotonic() - start
    assert response.status_code == 204
    assert 0.9 <= elapsed < 3, elapsed


# -- claim by id -------------------------------------------------------------------------


async def test_claim_by_id_answers_200_with_a_lease(client, pool, bot):
    todo = await create(client, bot)
    response = await client.post(f"{API}/todos/{todo['id']}/claim", headers=bot, json={"ttl": 20})
    assert response.status_code == 200, response.text
    body = response.json()
    stored = await row(pool, todo["id"])
    assert (body["state"], body["owner"], body["lease"]) == ("claimed", "bot", stored["lease_token"])
    assert parse(body["lease_expires_at"]) == stored["lease_expires_at"]
    assert (await history(pool, todo["id"]))[-1] == ("pending", "claimed", "bot", 1, "claimed by id")


async def test_claim_by_id_answers_409_when_assigned_to_another_agent(client, pool, bot):
    todo = await create(client, bot, assignee="rival")
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{todo['id']}/claim", headers=bot, json={"ttl": 20})
    body = problem(response, 409)
    assert "rival" in body["detail"] and body.get("assignee") == "rival"
    assert await snapshot(pool) == before


async def test_claim_by_id_answers_409_when_the_todo_is_not_pending(client, pool, bot, rival):
    held = await create(client, bot)
    await claim(client, rival)
    finished = await create(client, bot, title="finished")
    taken = await client.post(f"{API}/todos/{finished['id']}/claim", headers=bot, json={"ttl": 20})
    await client.post(f"{API}/todos/{finished['id']}/complete", headers=bot,
                      json={"lease": taken.json()["lease"]})
    before = await snapshot(pool)
    body = problem(await client.post(f"{API}/todos/{held['id']}/claim", headers=bot, json={"ttl": 20}),
                   409)
    assert body.get("state") == "claimed" and body.get("owner") == "rival"
    body = problem(await client.post(f"{API}/todos/{finished['id']}/claim", headers=bot,
                                     json={"ttl": 20}), 409)
    assert body.get("state") == "done"
    assert await snapshot(pool) == before


# -- heartbeat and release ---------------------------------------------------------------


async def test_heartbeat_answers_200_with_the_new_expiry(client, pool, bot):
    await create(client, bot)
    held = await claim(client, bot, ttl=5)
    response = await client.post(f"{API}/todos/{held['id']}/heartbeat", headers=bot,
                                 json={"lease": held["lease"], "ttl": 600})
    assert response.status_code == 200, response.text
    body = response.json()
    stored = await row(pool, held["id"])
    assert parse(body["lease_expires_at"]) == stored["lease_expires_at"]
    assert stored["lease_expires_at"] > parse(held["lease_expires_at"]) + timedelta(seconds=500)
    assert body["lease"] == held["lease"] and body["state"] == "claimed"


async def test_heartbeat_with_a_stale_lease_answers_409_and_changes_nothing(client, pool, bot):
    await create(client, bot)
    first = await claim(client, bot)
    released = await client.post(f"{API}/todos/{first['id']}/release", headers=bot,
                                 json={"lease": first["lease"]})
    assert released.status_code == 200
    second = await claim(client, bot)
    assert second["id"] == first["id"] and second["lease"] != first["lease"]
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{first['id']}/heartbeat", headers=bot,
                                 json={"lease": first["lease"], "ttl": 600})
    body = problem(response, 409)
    assert "stale" in body["detail"]
    assert await snapshot(pool) == before


async def test_release_answers_200_and_puts_the_todo_back_with_the_attempt_counted(client, pool, bot):
    await create(client, bot)
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/release", headers=bot,
                                 json={"lease": held["lease"]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["owner"], body["lease"], body["attempt"]) == ("pending", None, None, 1)
    stored = await row(pool, held["id"])
    assert (stored["state"], stored["owner"], stored["lease_expires_at"]) == ("pending", None, None)
    assert (await history(pool, held["id"]))[-1] == ("claimed", "pending", "bot", 1, "released")
    again = await claim(client, bot)
    assert again["id"] == held["id"] and again["attempt"] == 2


# -- complete and fail -------------------------------------------------------------------


async def test_complete_stores_the_result_and_marks_the_todo_done(client, pool, bot):
    await create(client, bot)
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                                 json={"lease": held["lease"], "result": {"sent": True}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["state"] == "done" and body["todo"]["result"] == {"sent": True}
    assert body["next"] is None
    stored = await row(pool, held["id"])
    assert (stored["state"], stored["result"]) == ("done", {"sent": True})
    assert stored["completed_at"] is not None and stored["lease_expires_at"] is None


async def test_complete_with_next_answers_the_next_claimed_todo(client, pool, bot):
    await create(client, bot, title="first")
    following = await create(client, bot, queue="other", title="second")
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot, json={
        "lease": held["lease"], "result": {"n": 1}, "next": {"queues": ["work", "other"], "ttl": 40}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["id"] == held["id"] and body["todo"]["state"] == "done"
    nxt = body["next"]
    assert nxt["id"] == following["id"]
    stored = await row(pool, following["id"])
    assert (nxt["state"], nxt["owner"], nxt["lease"]) == ("claimed", "bot", stored["lease_token"])
    assert stored["state"] == "claimed"
    assert parse(nxt["lease_expires_at"]) == stored["lease_expires_at"]


async def test_complete_with_next_answers_null_when_nothing_is_ready(client, pool, bot):
    await create(client, bot)
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot, json={
        "lease": held["lease"], "next": {"queues": ["work"], "ttl": 40}})
    assert response.status_code == 200, response.text
    assert response.json()["next"] is None
    assert (await row(pool, held["id"]))["state"] == "done"


async def test_a_late_completion_from_a_lapsed_lease_answers_409_and_keeps_the_newer_attempt(
        client, pool, bot):
    await create(client, bot)
    await create(client, bot, queue="other")
    old = await claim(client, bot)
    await pool.execute("UPDATE todos SET lease_expires_at = now() - interval '1 minute' "
                       "WHERE id = $1", old["id"])
    await Store(pool).reap()
    await pool.execute("UPDATE todos SET next_retry_at = now() WHERE id = $1", old["id"])
    new = await claim(client, bot)
    assert new["id"] == old["id"] and new["lease"] > old["lease"]
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{old['id']}/complete", headers=bot, json={
        "lease": old["lease"], "result": {"late": True}, "next": {"queues": ["other"], "ttl": 30}})
    problem(response, 409)
    assert await snapshot(pool) == before  # neither completed nor the next one claimed


async def test_completing_a_todo_held_by_another_agent_answers_409_and_leaves_it_untouched(
        client, pool, bot, rival):
    await create(client, bot)
    held = await claim(client, bot)
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{held['id']}/complete", headers=rival,
                                 json={"lease": held["lease"], "result": {"stolen": True}})
    body = problem(response, 409)
    assert body.get("owner") == "bot"
    assert await snapshot(pool) == before
    for action, extra in (("fail", {"error": "x"}), ("release", {}), ("heartbeat", {"ttl": 60})):
        response = await client.post(f"{API}/todos/{held['id']}/{action}", headers=rival,
                                     json={"lease": held["lease"], **extra})
        problem(response, 409)
    assert await snapshot(pool) == before


async def test_fail_below_the_cap_says_it_will_retry_and_when(client, pool, bot):
    await create(client, bot, max_attempts=2)
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/fail", headers=bot,
                                 json={"lease": held["lease"], "error": "smtp timeout"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["will_retry"], body["dead_lettered"]) == (True, False)
    stored = await row(pool, held["id"])
    assert parse(body["retry_at"]) == stored["next_retry_at"]
    now = await pool.fetchval("SELECT now()")
    assert timedelta(0) < stored["next_retry_at"] - now <= timedelta(seconds=3)  # backoff(1) = 2 s
    assert (stored["state"], stored["last_error"], stored["owner"]) == ("pending", "smtp timeout", None)
    assert body["todo"]["state"] == "pending"


async def test_fail_at_the_cap_says_dead_lettered(client, pool, bot):
    await create(client, bot, max_attempts=1)
    held = await claim(client, bot)
    response = await client.post(f"{API}/todos/{held['id']}/fail", headers=bot,
                                 json={"lease": held["lease"], "error": "bad address"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["will_retry"], body["retry_at"], body["dead_lettered"]) == (False, None, True)
    stored = await row(pool, held["id"])
    assert (stored["state"], stored["last_error"]) == ("failed", "bad address")
    assert (await history(pool, held["id"]))[-1] == ("claimed", "failed", "bot", 1, "bad address")


# -- reads -------------------------------------------------------------------------------


async def test_get_answers_the_todo_with_its_whole_history(client, pool, bot):
    await create(client, bot)
    held = await claim(client, bot)
    await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                      json={"lease": held["lease"], "result": {"ok": 1}})
    response = await client.get(f"{API}/todos/{held['id']}", headers=bot)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["id"] == held["id"] and body["todo"]["result"] == {"ok": 1}
    assert body["event"] is None
    steps = [(h["from_state"], h["to_state"], h["actor"], h["attempt"], h["note"])
             for h in body["history"]]
    assert steps == [(None, "pending", "agent:bot", 0, "created"),
                     ("pending", "claimed", "bot", 1, "claimed"),
                     ("claimed", "done", "bot", 1, "completed")]
    assert all(parse(h["at"]) for h in body["history"])


async def test_list_filters_by_queue_and_state(client, pool, bot):
    a = await create(client, bot, queue="work", title="a")
    b = await create(client, bot, queue="other", title="b")
    c = await create(client, bot, queue="work", title="c")
    await client.post(f"{API}/todos/{c['id']}/claim", headers=bot, json={"ttl": 30})

    async def ids(**params) -> list[str]:
        response = await client.get(f"{API}/todos", headers=bot, params=params)
        assert response.status_code == 200, response.text
        return [t["id"] for t in response.json()["items"]]

    assert await ids() == [c["id"], b["id"], a["id"]]  # newest first
    assert await ids(queue="work") == [c["id"], a["id"]]
    assert await ids(queue="work", state="pending") == [a["id"]]
    assert await ids(state="claimed") == [c["id"]]
    assert await ids(queue="other", state="done") == []


async def test_list_shows_only_the_queues_the_token_covers(client, pool, store, bot):
    mine = await create(client, bot)
    await store.create(NewTodo(queue="secret", title="not yours"))
    response = await client.get(f"{API}/todos", headers=bot)
    assert [t["id"] for t in response.json()["items"]] == [mine["id"]]


async def test_list_paginates_by_keyset_with_next_and_after(client, pool, bot):
    response = await client.post(f"{API}/todos/batch", headers=bot, json={
        "todos": [{"queue": "work", "title": f"t{i}"} for i in range(7)]})
    assert response.status_code == 200
    expected = [r["id"] for r in await pool.fetch(
        "SELECT id FROM todos ORDER BY created_at DESC, id DESC")]
    pages, after = [], None
    for _ in range(5):
        params = {"queue": "work", "limit": 3, **({"after": after} if after else {})}
        body = (await client.get(f"{API}/todos", headers=bot, params=params)).json()
        pages.append([t["id"] for t in body["items"]])
        after = body["next"]
        if after is None:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == expected
    # a todo created after the first page does not shift the later pages
    first = (await client.get(f"{API}/todos", headers=bot, params={"queue": "work", "limit": 3})).json()
    await create(client, bot, title="newest")
    second = (await client.get(f"{API}/todos", headers=bot,
                               params={"queue": "work", "limit": 3, "after": first["next"]})).json()
    assert [t["id"] for t in second["items"]] == expected[3:6]


# -- errors: authentication and authorization --------------------------------------------


async def test_requests_without_a_token_are_401_problems_and_change_nothing(client, pool, store):
    todo = (await store.create(NewTodo(queue="work", title="t"))).todo
    before = await snapshot(pool)
    calls = [
        ("post", f"{API}/todos", {"queue": "work", "title": "t"}),
        ("post", f"{API}/claims", {"queues": ["work"], "ttl": 30}),
        ("post", f"{API}/todos/{todo.id}/claim", {"ttl": 30}),
        ("get", f"{API}/todos/{todo.id}", None),
        ("get", f"{API}/todos", None),
    ]
    for header in (None, {"Authorization": "Basic Ym90OnB3"}, {"Authorization": "Bearer "},
                   {"Authorization": "Bearer sbt_not-a-real-token"}):
        for method, url, body in calls:
            kwargs = {"headers": header} if header else {}
            if body is not None:
                kwargs["json"] = body
            response = await getattr(client, method)(url, **kwargs)
            problem(response, 401)
            assert response.headers["www-authenticate"].lower().startswith("bearer")
    assert await snapshot(pool) == before


async def test_a_revoked_token_is_401(client, pool):
    accounts = Accounts(pool)
    token_id, secret = await accounts.add_token("bot", ["work"])
    headers = {"Authorization": f"Bearer {secret}"}
    assert (await client.get(f"{API}/todos", headers=headers)).status_code == 200
    await accounts.revoke_token(token_id, actor="test")
    before = await snapshot(pool)
    problem(await client.get(f"{API}/todos", headers=headers), 401)
    problem(await client.post(f"{API}/todos", headers=headers, json={"queue": "work", "title": "t"}), 401)
    assert await snapshot(pool) == before


@pytest.mark.parametrize("endpoint", [
    "create", "batch", "claims", "claim by id", "get", "list", "complete with next", "channels"])
async def test_a_token_used_for_another_queue_is_403_and_changes_nothing(client, pool, store, bot, endpoint):
    secret = (await store.create(NewTodo(queue="secret", title="not yours"))).todo
    await store.create(NewTodo(queue="work", title="mine"))
    held = None
    if endpoint == "complete with next":
        held = await claim(client, bot)
    before = await snapshot(pool)
    if endpoint == "create":
        response = await client.post(f"{API}/todos", headers=bot, json={"queue": "secret", "title": "t"})
    elif endpoint == "batch":
        response = await client.post(f"{API}/todos/batch", headers=bot, json={"todos": [
            {"queue": "work", "title": "ok"}, {"queue": "secret", "title": "no"}]})
    elif endpoint == "claims":
        response = await client.post(f"{API}/claims", headers=bot,
                                     json={"queues": ["work", "secret"], "ttl": 30})
    elif endpoint == "claim by id":
        response = await client.post(f"{API}/todos/{secret.id}/claim", headers=bot, json={"ttl": 30})
    elif endpoint == "get":
        response = await client.get(f"{API}/todos/{secret.id}", headers=bot)
    elif endpoint == "list":
        response = await client.get(f"{API}/todos", headers=bot, params={"queue": "secret"})
    elif endpoint == "complete with next":
        response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot, json={
            "lease": held["lease"], "next": {"queues": ["secret"], "ttl": 30}})
    else:
        response = await client.get(f"{API}/channels", headers=bot, params={"queues": "work,secret"})
    body = problem(response, 403)
    assert "secret" in body["detail"]
    assert "not yours" not in response.text
    assert await snapshot(pool) == before


@pytest.mark.parametrize("action", ["heartbeat", "release", "complete", "fail"])
async def test_a_token_cannot_act_on_a_held_todo_in_a_queue_it_does_not_cover_even_under_the_same_name(
        client, pool, store, action):
    work_token = await agent_token(pool, "bot", ["work"])
    other_token = await agent_token(pool, "bot", ["other"])
    await store.create(NewTodo(queue="work", title="t"))
    held = await claim(client, work_token)
    body = {"lease": held["lease"], **{"heartbeat": {"ttl": 60}, "fail": {"error": "x"},
                                       "complete": {"result": {}}}.get(action, {})}
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{held['id']}/{action}", headers=other_token, json=body)
    problem(response, 403)
    assert await snapshot(pool) == before


async def test_the_token_not_the_body_decides_the_owner(client, pool, bot):
    created = await client.post(f"{API}/todos", headers=bot, json={
        "queue": "work", "title": "t", "owner": "mallory", "state": "claimed"})
    assert created.status_code in (201, 400, 422), created.text
    if created.status_code == 201:  # extra fields ignored, never used
        todo = created.json()["todo"]
        assert (todo["owner"], todo["state"]) == (None, "pending")
    else:
        await create(client, bot)
    before = await snapshot(pool)
    response = await client.post(f"{API}/claims", headers=bot,
                                 json={"queues": ["work"], "ttl": 30, "owner": "mallory"})
    if response.status_code == 200:
        assert response.json()["owner"] == "bot"
    else:
        problem(response, 400)
        assert await snapshot(pool) == before
        response = await client.post(f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30})
    held = response.json()
    assert held["owner"] == "bot"
    before = await snapshot(pool)
    sneaky = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                               json={"lease": held["lease"], "owner": "mallory"})
    if sneaky.status_code != 200:
        problem(sneaky, 400)
        assert await snapshot(pool) == before
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE owner = 'mallory'") == 0
    assert await pool.fetchval("SELECT count(*) FROM todo_history WHERE actor LIKE '%mallory%'") == 0


# -- errors: malformed requests ----------------------------------------------------------


async def _held(client, bot) -> dict:
    await create(client, bot)
    return await claim(client, bot)


@pytest.mark.parametrize("path", ["/todos", "/todos/batch", "/claims", "/todos/{id}/claim",
                                  "/todos/{id}/heartbeat", "/todos/{id}/release",
                                  "/todos/{id}/complete", "/todos/{id}/fail"])
async def test_malformed_json_is_a_400_problem_and_changes_nothing(client, pool, bot, path):
    held = await _held(client, bot)
    before = await snapshot(pool)
    response = await client.post(API + path.format(id=held["id"]), headers={
        **bot, "Content-Type": "application/json"}, content=b'{"queue": "work", "title": ')
    problem(response, 400)
    assert await snapshot(pool) == before


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/todos", {"queue": "work", "title": 7}, "title"),
    ("/todos", {"queue": "work", "title": "t", "payload": [1, 2]}, "payload"),
    ("/todos", {"queue": "work", "title": "t", "max_attempts": "many"}, "max_attempts"),
    ("/todos", {"queue": ["work"], "title": "t"}, "queue"),
    ("/todos/batch", {"todos": {"queue": "work"}}, "todos"),
    ("/claims", {"queues": "work", "ttl": 30}, "queues"),
    ("/claims", {"queues": ["work"], "ttl": "soon"}, "ttl"),
    ("/todos/{id}/heartbeat", {"lease": "abc", "ttl": 30}, "lease"),
    ("/todos/{id}/release", {"lease": 1.5}, "lease"),
    ("/todos/{id}/complete", {"lease": "{lease}", "result": [1]}, "result"),
    ("/todos/{id}/complete", {"lease": "{lease}", "next": {"queues": "work"}}, "queues"),
    ("/todos/{id}/fail", {"lease": "{lease}", "error": 42}, "error"),
    ("/todos/{id}/fail", {"lease": "{lease}", "error": " "}, "error"),
])
async def test_wrong_types_are_rejected_naming_the_field(client, pool, bot, path, body, field):
    held = await _held(client, bot)
    body = {k: held["lease"] if v == "{lease}" else v for k, v in body.items()}
    before = await snapshot(pool)
    response = await client.post(API + path.format(id=held["id"]), headers=bot, json=body)
    assert response.status_code in (400, 422), response.text
    problem(response, response.status_code, field=field)
    assert await snapshot(pool) == before


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/claims", {"queues": ["work"], "ttl": 0.5}, "ttl"),
    ("/claims", {"queues": ["work"], "ttl": 12 * 3600 + 1}, "ttl"),
    ("/claims", {"queues": ["work"], "ttl": 30, "wait": -1}, "wait"),
    ("/claims", {"queues": ["work"], "ttl": 30, "wait": 61}, "wait"),
    ("/todos/{id}/claim", {"ttl": 0}, "ttl"),
    ("/todos/{id}/heartbeat", {"lease": "{lease}", "ttl": 50000}, "ttl"),
    ("/todos/{id}/complete", {"lease": "{lease}", "next": {"queues": ["work"], "ttl": 0}}, "ttl"),
    ("/todos", {"queue": "work", "title": "t", "max_attempts": 0}, "max_attempts"),
    ("/todos", {"queue": "work", "title": "t", "max_attempts": 101}, "max_attempts"),
    ("/todos/batch", {"todos": [{"queue": "work", "title": "t", "max_attempts": 101}]}, "max_attempts"),
])
async def test_values_out_of_bounds_are_422_naming_the_field(client, pool, bot, path, body, field):
    held = await _held(client, bot)
    await create(client, bot, title="claimable by id")
    pending_id = (await pool.fetchval("SELECT id FROM todos WHERE state = 'pending'"))
    target = pending_id if path.endswith("/claim") else held["id"]
    body = {k: held["lease"] if v == "{lease}" else v for k, v in body.items()}
    before = await snapshot(pool)
    response = await client.post(API + path.format(id=target), headers=bot, json=body)
    problem(response, 422, field=field)
    assert await snapshot(pool) == before


async def test_list_parameters_out_of_bounds_are_refused_naming_the_parameter(client, bot):
    for params, field in (({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
                          ({"state": "sleeping"}, "state"), ({"after": "garbage!"}, "after")):
        response = await client.get(f"{API}/todos", headers=bot, params=params)
        assert response.status_code in (400, 422), response.text
        problem(response, response.status_code, field=field)


def _big() -> dict:
    return {"blob": "x" * MAX_JSON_BYTES}  # over the limit once encoded


async def test_an_oversized_result_is_413_and_the_todo_stays_claimed(client, pool, bot):
    held = await _held(client, bot)
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                                 json={"lease": held["lease"], "result": _big()})
    problem(response, 413, field="result")
    assert await snapshot(pool) == before


async def test_a_request_body_over_the_server_limit_is_413(client, pool, bot):
    before = await snapshot(pool)
    response = await client.post(f"{API}/todos/batch", headers=bot, json={"todos": [
        {"queue": "work", "title": f"t{i}", "payload": {"blob": "x" * 200_000}} for i in range(50)]})
    problem(response, 413)
    assert await snapshot(pool) == before


@pytest.mark.parametrize("path", ["/todos", "/todos/batch"])
async def test_an_oversized_payload_is_413_naming_the_field_and_creates_nothing(client, pool, bot, path):
    item = {"queue": "work", "title": "big", "payload": _big()}
    body = item if path == "/todos" else {"todos": [{"queue": "work", "title": "small"}, item]}
    before = await snapshot(pool)
    response = await client.post(API + path, headers=bot, json=body)
    assert await snapshot(pool) == before
    problem(response, 413, field="payload")


async def test_a_payload_just_under_the_limit_is_accepted(client, pool, bot):
    payload = {"blob": "x" * (MAX_JSON_BYTES - len('{"blob":""}'))}
    todo = await create(client, bot, payload=payload)
    assert (await row(pool, todo["id"]))["payload"] == payload


@pytest.mark.parametrize(("method", "path", "body"), [
    ("get", "/todos/{id}", None),
    ("post", "/todos/{id}/claim", {"ttl": 30}),
    ("post", "/todos/{id}/heartbeat", {"lease": 1, "ttl": 30}),
    ("post", "/todos/{id}/release", {"lease": 1}),
    ("post", "/todos/{id}/complete", {"lease": 1, "result": {}}),
    ("post", "/todos/{id}/complete", {"lease": 1, "next": {"queues": ["work"], "ttl": 30}}),
    ("post", "/todos/{id}/fail", {"lease": 1, "error": "x"}),
])
async def test_unknown_ids_are_404_problems(client, pool, bot, method, path, body):
    await create(client, bot)
    before = await snapshot(pool)
    url = API + path.format(id="td_00000000-0000-0000-0000-000000000000")
    response = await (client.get(url, headers=bot) if body is None
                      else client.post(url, headers=bot, json=body))
    body = problem(response, 404)
    assert "td_00000000-0000-0000-0000-000000000000" in body["detail"]
    assert await snapshot(pool) == before


# -- inputs the database cannot store are refused, never a server error --------------------


@pytest.mark.parametrize("action", ["heartbeat", "release", "complete", "fail"])
async def test_a_lease_beyond_64_bits_is_refused_not_a_server_error(client, pool, bot, action):
    held = await _held(client, bot)
    before = await snapshot(pool)
    body = {"lease": 2**70, **{"heartbeat": {"ttl": 30}, "fail": {"error": "x"}}.get(action, {})}
    response = await client.post(f"{API}/todos/{held['id']}/{action}", headers=bot, json=body)
    assert response.status_code in (400, 409, 422), response.text
    problem(response, response.status_code, field="lease" if response.status_code != 409 else None)
    assert await snapshot(pool) == before


@pytest.mark.parametrize("where", ["title", "payload", "result", "todo id"])
async def test_a_nul_character_is_refused_not_a_server_error(client, pool, bot, where):
    held = await _held(client, bot)
    before = await snapshot(pool)
    if where == "title":
        response = await client.post(f"{API}/todos", headers=bot, json={"queue": "work", "title": "a\x00b"})
    elif where == "payload":
        response = await client.post(f"{API}/todos", headers=bot,
                                     json={"queue": "work", "title": "t", "payload": {"k": "\x00"}})
    elif where == "result":
        response = await client.post(f"{API}/todos/{held['id']}/complete", headers=bot,
                                     json={"lease": held["lease"], "result": {"k": "\x00"}})
    else:
        response = await client.get(f"{API}/todos/td_%00", headers=bot)
    assert response.status_code in (400, 404, 422), response.text
    problem(response, response.status_code)
    assert await snapshot(pool) == before


@pytest.mark.parametrize("where", ["payload", "result"])
async def test_a_deeply_nested_json_body_is_refused_not_a_server_error(client, pool, bot, where):
    held = await _held(client, bot)
    nested = b"[" * 1500 + b"]" * 1500
    if where == "payload":
        url, body = f"{API}/todos", b'{"queue": "work", "title": "t", "payload": {"x": %s}}' % nested
    else:
        url, body = (f"{API}/todos/{held['id']}/complete",
                     b'{"lease": %d, "result": {"x": %s}}' % (held["lease"], nested))
    before = await snapshot(pool)
    response = await client.post(url, headers={**bot, "Content-Type": "application/json"}, content=body)
    assert await snapshot(pool) == before
    assert response.status_code in (400, 413, 422), response.text
    problem(response, response.status_code)
