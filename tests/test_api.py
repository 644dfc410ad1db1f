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

from dashboard.accounts import Accounts
from dashboard.models import MAX_JSON_BYTES
from tests.conftest import ONE_DATABASE_PER_MODULE, build_app, in_process
from tests.factories import (
    agent_token,
    assert_new_token,
    enqueue,
    expire_lease,
    history,
    last_step,
    make_retry_due,
    snapshot,
    todo_row,
)

API = "/api/v1"
PROBLEM = "application/problem+json"


# -- fixtures and helpers ----------------------------------------------------------------


# One database and one app (lifespan and LISTEN hub; no reaper, since a test here moves time
# by SQL) for the whole module, emptied before each test: far cheaper than a database and
# an app per test, and every test still starts from nothing.
pytestmark = ONE_DATABASE_PER_MODULE


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api_client(module_dsn, module_pool):
    """The real app in process, shared by the module's tests."""
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def bot(module_pool) -> dict:
    return await agent_token(module_pool, "bot", ["work", "other"])


@pytest_asyncio.fixture(loop_scope="module")
async def rival(module_pool) -> dict:
    return await agent_token(module_pool, "rival", ["work"])


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
    response = await client.post(
        f"{API}/todos", json={"queue": queue, "title": title, **body}, headers=headers
    )
    assert response.status_code == 201, response.text
    return response.json()["todo"]


async def claim(client, headers, queues=("work",), ttl: float = 30) -> dict:
    response = await client.post(f"{API}/claims", json={"queues": list(queues), "ttl": ttl}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def batch(client, headers, todos: list[dict]):
    """POST todos/batch with these items; the response."""
    return await client.post(f"{API}/todos/batch", headers=headers, json={"todos": todos})


async def act(client, headers, held: dict, action: str, **body):
    """POST todos/{id}/{action} (heartbeat, release, complete, fail) with the held lease."""
    return await client.post(
        f"{API}/todos/{held['id']}/{action}", headers=headers, json={"lease": held["lease"], **body}
    )


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


# -- create ------------------------------------------------------------------------------


async def test_create_answers_201_with_the_new_pending_todo(api_client, module_pool, bot):
    response = await api_client.post(
        f"{API}/todos",
        headers=bot,
        json={
            "queue": "work",
            "title": "send the mail",
            "kind": "email",
            "payload": {"to": "a@b"},
            "max_attempts": 3,
            "assignee": "bot",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["created"] is True
    todo = body["todo"]
    assert todo["id"].startswith("td_")
    assert (todo["queue"], todo["title"], todo["kind"]) == ("work", "send the mail", "email")
    assert todo["state"] == "pending"
    assert todo["payload"] == {"to": "a@b"} and todo["max_attempts"] == 3
    assert todo["lease"] is None and todo["owner"] is None
    stored = await todo_row(module_pool, todo["id"])
    assert stored.payload == {"to": "a@b"} and stored.state == "pending"
    assert await history(module_pool, todo["id"]) == [(None, "pending", "agent", "bot", 0, "created")]


async def test_a_duplicate_key_answers_200_with_the_live_todo_and_counts_the_delivery(
    api_client, module_pool, bot
):
    first = await create(api_client, bot, idempotency_key="hook-1", payload={"n": 1})
    response = await api_client.post(
        f"{API}/todos",
        headers=bot,
        json={"queue": "work", "title": "again", "idempotency_key": "hook-1", "payload": {"n": 2}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["created"] is False
    assert body["todo"]["id"] == first["id"]
    assert body["todo"]["payload"] == {"n": 1}  # the live todo, not the duplicate
    assert body["todo"]["dedupe_hits"] == 1
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 1
    assert (await todo_row(module_pool, first["id"])).dedupe_hits == 1
    assert (await last_step(module_pool, first["id"])).note == "duplicate delivery collapsed"


async def test_a_key_makes_a_new_todo_once_its_todo_is_done(api_client, module_pool, bot):
    first = await create(api_client, bot, idempotency_key="k")
    held = await claim(api_client, bot)
    done = await act(api_client, bot, held, "complete")
    assert done.status_code == 200, done.text
    second = await api_client.post(
        f"{API}/todos", headers=bot, json={"queue": "work", "title": "t", "idempotency_key": "k"}
    )
    assert second.status_code == 201 and second.json()["created"] is True
    assert second.json()["todo"]["id"] != first["id"]


async def test_create_with_an_inline_event_stores_the_event_and_links_it(api_client, module_pool, bot):
    todo = await create(
        api_client, bot, event={"source": "github", "kind": "push", "payload": {"ref": "main"}}
    )
    assert todo["event_id"].startswith("ev_")
    event = await module_pool.fetchrow("SELECT * FROM events WHERE id = $1", todo["event_id"])
    assert (event["source"], event["kind"], event["payload"]) == ("github", "push", {"ref": "main"})
    detail = (await api_client.get(f"{API}/todos/{todo['id']}", headers=bot)).json()
    assert detail["event"]["id"] == todo["event_id"]
    assert detail["event"]["payload"] == {"ref": "main"}


# -- batch -------------------------------------------------------------------------------


async def test_batch_answers_one_result_per_item_in_order_each_with_created(api_client, module_pool, bot):
    live = await create(api_client, bot, idempotency_key="old")
    items = [
        {"queue": "work", "title": "a"},
        {"queue": "other", "title": "b", "idempotency_key": "x"},
        {"queue": "work", "title": "c", "idempotency_key": "old"},
        {"queue": "other", "title": "d", "idempotency_key": "x"},
        {"queue": "work", "title": "e", "event": {"source": "s", "kind": "k"}},
    ]
    response = await batch(api_client, bot, items)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["created"] for r in results] == [True, True, False, False, True]
    assert [r["todo"]["title"] for r in results] == ["a", "b", live["title"], "b", "e"]
    assert [r["todo"]["queue"] for r in results] == ["work", "other", "work", "other", "work"]
    assert results[2]["todo"]["id"] == live["id"]
    assert results[3]["todo"]["id"] == results[1]["todo"]["id"]
    assert results[4]["todo"]["event_id"].startswith("ev_")
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 4
    assert (await todo_row(module_pool, live["id"])).dedupe_hits == 1
    assert (await todo_row(module_pool, results[1]["todo"]["id"])).dedupe_hits == 1


async def test_a_batch_with_one_invalid_item_creates_nothing_and_names_the_item(api_client, module_pool, bot):
    before = await snapshot(module_pool)
    fine = {"queue": "work", "title": "fine", "event": {"source": "s", "kind": "k"}}
    response = await batch(api_client, bot, [fine, {"queue": "work", "title": "bad", "max_attempts": 0}])
    problem(response, 422, field="todos[1].max_attempts")
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/todos", {"queue": "work", "title": "t", "idempotency_kye": "k"}, "idempotency_kye"),
        ("/todos", {"queue": "work", "title": "t", "event": {"source": "s", "kind": "k", "x": 1}}, "x"),
        (
            "/todos/batch",
            {"todos": [{"queue": "work", "title": "a"}, {"queue": "work", "title": "b", "asignee": "ann"}]},
            "asignee",
        ),
    ],
)
async def test_a_misspelt_field_on_create_is_422_naming_it_and_its_item(
    api_client, module_pool, bot, path, body, field
):
    """Sent twice with `idempotency_kye`, a create made two todos where one was meant."""
    before = await snapshot(module_pool)
    for _ in range(2):
        detail = problem(await api_client.post(API + path, json=body, headers=bot), 422)["detail"]
        assert f"unknown field `{field}`" in detail, detail
    if path.endswith("batch"):
        assert detail.startswith("todos[1]: "), detail
    assert await snapshot(module_pool) == before


# -- claims ------------------------------------------------------------------------------


async def test_claims_answers_200_with_the_oldest_todo_its_lease_and_expiry(api_client, module_pool, bot):
    older = await create(api_client, bot, queue="other", title="older")
    await create(api_client, bot, queue="work", title="newer")
    response = await api_client.post(
        f"{API}/claims", headers=bot, json={"queues": ["work", "other"], "ttl": 60}
    )
    assert response.status_code == 200, response.text
    todo = response.json()
    assert todo["id"] == older["id"]
    assert (todo["state"], todo["owner"], todo["attempt"]) == ("claimed", "bot", 1)
    stored = await todo_row(module_pool, todo["id"])
    assert isinstance(todo["lease"], int) and todo["lease"] == stored.lease_token
    assert parse(todo["lease_expires_at"]) == stored.lease_expires_at
    now = await module_pool.fetchval("SELECT now()")
    assert timedelta(seconds=55) < stored.lease_expires_at - now < timedelta(seconds=65)


async def test_claims_answers_204_at_once_when_nothing_is_ready_and_wait_is_zero(
    api_client, module_pool, bot
):
    await create(api_client, bot, assignee="someone-else")
    response = await api_client.post(f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30})
    assert response.status_code == 204
    assert response.content == b""
    assert await module_pool.fetchval("SELECT count(*) FROM todos WHERE state = 'claimed'") == 0


async def test_claims_answers_204_after_waiting_when_no_todo_comes(api_client, bot):
    start = time.monotonic()
    response = await api_client.post(
        f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30, "wait": 1}
    )
    elapsed = time.monotonic() - start
    assert response.status_code == 204
    assert 0.9 <= elapsed < 3, elapsed


# -- claim by id -------------------------------------------------------------------------


async def test_claim_by_id_answers_200_with_a_lease(api_client, module_pool, bot):
    todo = await create(api_client, bot)
    response = await api_client.post(f"{API}/todos/{todo['id']}/claim", headers=bot, json={"ttl": 20})
    assert response.status_code == 200, response.text
    body = response.json()
    stored = await todo_row(module_pool, todo["id"])
    assert (body["state"], body["owner"], body["lease"]) == ("claimed", "bot", stored.lease_token)
    assert parse(body["lease_expires_at"]) == stored.lease_expires_at
    assert await last_step(module_pool, todo["id"]) == (
        "pending",
        "claimed",
        "agent",
        "bot",
        1,
        "claimed by id",
    )


async def test_claim_by_id_answers_409_when_assigned_to_another_agent(api_client, module_pool, bot):
    todo = await create(api_client, bot, assignee="rival")
    before = await snapshot(module_pool)
    response = await api_client.post(f"{API}/todos/{todo['id']}/claim", headers=bot, json={"ttl": 20})
    body = problem(response, 409)
    assert "rival" in body["detail"] and body.get("assignee") == "rival"
    assert await snapshot(module_pool) == before


async def test_claim_by_id_answers_409_when_the_todo_is_not_pending(api_client, module_pool, bot, rival):
    held = await create(api_client, bot)
    await claim(api_client, rival)
    finished = await create(api_client, bot, title="finished")
    taken = await api_client.post(f"{API}/todos/{finished['id']}/claim", headers=bot, json={"ttl": 20})
    await api_client.post(
        f"{API}/todos/{finished['id']}/complete", headers=bot, json={"lease": taken.json()["lease"]}
    )
    before = await snapshot(module_pool)
    body = problem(
        await api_client.post(f"{API}/todos/{held['id']}/claim", headers=bot, json={"ttl": 20}), 409
    )
    assert body.get("state") == "claimed" and body.get("owner") == "rival"
    body = problem(
        await api_client.post(f"{API}/todos/{finished['id']}/claim", headers=bot, json={"ttl": 20}), 409
    )
    assert body.get("state") == "done"
    assert await snapshot(module_pool) == before


# -- heartbeat and release ---------------------------------------------------------------


async def test_heartbeat_answers_200_with_the_new_expiry(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot, ttl=5)
    response = await act(api_client, bot, held, "heartbeat", ttl=600)
    assert response.status_code == 200, response.text
    body = response.json()
    stored = await todo_row(module_pool, held["id"])
    assert parse(body["lease_expires_at"]) == stored.lease_expires_at
    assert stored.lease_expires_at > parse(held["lease_expires_at"]) + timedelta(seconds=500)
    assert body["lease"] == held["lease"] and body["state"] == "claimed"


async def test_heartbeat_with_a_stale_lease_answers_409_and_changes_nothing(api_client, module_pool, bot):
    await create(api_client, bot)
    first = await claim(api_client, bot)
    released = await act(api_client, bot, first, "release")
    assert released.status_code == 200
    second = await claim(api_client, bot)
    assert second["id"] == first["id"] and second["lease"] != first["lease"]
    before = await snapshot(module_pool)
    response = await act(api_client, bot, first, "heartbeat", ttl=600)
    body = problem(response, 409)
    assert "stale" in body["detail"]
    assert await snapshot(module_pool) == before


async def test_release_answers_200_and_puts_the_todo_back_with_the_attempt_counted(
    api_client, module_pool, bot
):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    response = await act(api_client, bot, held, "release")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["owner"], body["lease"], body["attempt"]) == ("pending", None, None, 1)
    stored = await todo_row(module_pool, held["id"])
    assert (stored.state, stored.owner, stored.lease_expires_at) == ("pending", None, None)
    assert await last_step(module_pool, held["id"]) == ("claimed", "pending", "agent", "bot", 1, "released")
    again = await claim(api_client, bot)
    assert again["id"] == held["id"] and again["attempt"] == 2


# -- complete and fail -------------------------------------------------------------------


async def test_complete_stores_the_result_and_marks_the_todo_done(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    response = await act(api_client, bot, held, "complete", result={"sent": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["state"] == "done" and body["todo"]["result"] == {"sent": True}
    assert body["next"] is None
    stored = await todo_row(module_pool, held["id"])
    assert (stored.state, stored.result) == ("done", {"sent": True})
    assert stored.completed_at is not None and stored.lease_expires_at is None


async def test_complete_with_next_answers_the_next_claimed_todo(api_client, module_pool, bot):
    await create(api_client, bot, title="first")
    following = await create(api_client, bot, queue="other", title="second")
    held = await claim(api_client, bot)
    response = await api_client.post(
        f"{API}/todos/{held['id']}/complete",
        headers=bot,
        json={"lease": held["lease"], "result": {"n": 1}, "next": {"queues": ["work", "other"], "ttl": 40}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["id"] == held["id"] and body["todo"]["state"] == "done"
    nxt = body["next"]
    assert nxt["id"] == following["id"]
    stored = await todo_row(module_pool, following["id"])
    assert (nxt["state"], nxt["owner"], nxt["lease"]) == ("claimed", "bot", stored.lease_token)
    assert stored.state == "claimed"
    assert parse(nxt["lease_expires_at"]) == stored.lease_expires_at


async def test_complete_with_next_answers_null_when_nothing_is_ready(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    response = await api_client.post(
        f"{API}/todos/{held['id']}/complete",
        headers=bot,
        json={"lease": held["lease"], "next": {"queues": ["work"], "ttl": 40}},
    )
    assert response.status_code == 200, response.text
    assert response.json()["next"] is None
    assert (await todo_row(module_pool, held["id"])).state == "done"


async def test_a_late_completion_from_a_lapsed_lease_answers_409_and_keeps_the_newer_attempt(
    api_client, module_pool, module_store, bot
):
    await create(api_client, bot)
    await create(api_client, bot, queue="other")
    old = await claim(api_client, bot)
    await expire_lease(module_pool, old["id"])
    await module_store.reap()
    await make_retry_due(module_pool, old["id"])
    new = await claim(api_client, bot)
    assert new["id"] == old["id"]
    assert_new_token(new["lease"], old["lease"])
    before = await snapshot(module_pool)
    response = await api_client.post(
        f"{API}/todos/{old['id']}/complete",
        headers=bot,
        json={"lease": old["lease"], "result": {"late": True}, "next": {"queues": ["other"], "ttl": 30}},
    )
    problem(response, 409)
    assert await snapshot(module_pool) == before  # neither completed nor the next one claimed


async def test_completing_a_todo_held_by_another_agent_answers_409_and_leaves_it_untouched(
    api_client, module_pool, bot, rival
):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    before = await snapshot(module_pool)
    response = await act(api_client, rival, held, "complete", result={"stolen": True})
    body = problem(response, 409)
    assert body.get("owner") == "bot"
    assert await snapshot(module_pool) == before
    for action, extra in (("fail", {"error": "x"}), ("release", {}), ("heartbeat", {"ttl": 60})):
        response = await api_client.post(
            f"{API}/todos/{held['id']}/{action}", headers=rival, json={"lease": held["lease"], **extra}
        )
        problem(response, 409)
    assert await snapshot(module_pool) == before


async def failed_once(client, headers, *, max_attempts: int, error: str) -> tuple[dict, dict]:
    """A new todo claimed and failed once through the API: (the claim, the fail's answer)."""
    await create(client, headers, max_attempts=max_attempts)
    held = await claim(client, headers)
    response = await act(client, headers, held, "fail", error=error)
    assert response.status_code == 200, response.text
    return held, response.json()


async def test_fail_below_the_cap_says_it_will_retry_and_when(api_client, module_pool, bot):
    held, body = await failed_once(api_client, bot, max_attempts=2, error="smtp timeout")
    assert (body["will_retry"], body["dead_lettered"]) == (True, False)
    stored = await todo_row(module_pool, held["id"])
    assert parse(body["retry_at"]) == stored.next_retry_at
    # full jitter after attempt 1: [0, 2] s from the failure
    assert timedelta(0) <= stored.next_retry_at - stored.updated_at <= timedelta(seconds=2)
    assert (stored.state, stored.last_error, stored.owner) == ("pending", "smtp timeout", None)
    assert body["todo"]["state"] == "pending"


async def test_fail_at_the_cap_says_dead_lettered(api_client, module_pool, bot):
    held, body = await failed_once(api_client, bot, max_attempts=1, error="bad address")
    assert (body["will_retry"], body["retry_at"], body["dead_lettered"]) == (False, None, True)
    stored = await todo_row(module_pool, held["id"])
    assert (stored.state, stored.last_error) == ("failed", "bad address")
    assert await last_step(module_pool, held["id"]) == ("claimed", "failed", "agent", "bot", 1, "bad address")


# -- reads -------------------------------------------------------------------------------


async def test_get_answers_the_todo_with_its_whole_history(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    await act(api_client, bot, held, "complete", result={"ok": 1})
    response = await api_client.get(f"{API}/todos/{held['id']}", headers=bot)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["todo"]["id"] == held["id"] and body["todo"]["result"] == {"ok": 1}
    assert body["event"] is None
    steps = [
        (h["from_state"], h["to_state"], h["actor_kind"], h["actor"], h["attempt"], h["note"])
        for h in body["history"]
    ]
    assert steps == [
        (None, "pending", "agent", "bot", 0, "created"),
        ("pending", "claimed", "agent", "bot", 1, "claimed"),
        ("claimed", "done", "agent", "bot", 1, "completed"),
    ]
    assert all(parse(h["at"]) for h in body["history"])


async def test_list_filters_by_queue_and_state(api_client, module_pool, bot):
    a = await create(api_client, bot, queue="work", title="a")
    b = await create(api_client, bot, queue="other", title="b")
    c = await create(api_client, bot, queue="work", title="c")
    await api_client.post(f"{API}/todos/{c['id']}/claim", headers=bot, json={"ttl": 30})

    async def ids(**params) -> list[str]:
        response = await api_client.get(f"{API}/todos", headers=bot, params=params)
        assert response.status_code == 200, response.text
        return [t["id"] for t in response.json()["items"]]

    assert await ids() == [c["id"], b["id"], a["id"]]  # newest first
    assert await ids(queue="work") == [c["id"], a["id"]]
    assert await ids(queue="work", state="pending") == [a["id"]]
    assert await ids(state="claimed") == [c["id"]]
    assert await ids(queue="other", state="done") == []


async def test_list_shows_only_the_queues_the_token_covers(api_client, module_pool, module_store, bot):
    mine = await create(api_client, bot)
    await enqueue(module_store, "secret", "not yours")
    response = await api_client.get(f"{API}/todos", headers=bot)
    assert [t["id"] for t in response.json()["items"]] == [mine["id"]]


async def test_list_paginates_by_keyset_with_next_and_after(api_client, module_pool, bot):
    response = await batch(api_client, bot, [{"queue": "work", "title": f"t{i}"} for i in range(7)])
    assert response.status_code == 200
    expected = [
        r["id"] for r in await module_pool.fetch("SELECT id FROM todos ORDER BY created_at DESC, id DESC")
    ]
    pages, after = [], None
    for _ in range(5):
        params = {"queue": "work", "limit": 3, **({"after": after} if after else {})}
        body = (await api_client.get(f"{API}/todos", headers=bot, params=params)).json()
        pages.append([t["id"] for t in body["items"]])
        after = body["next"]
        if after is None:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == expected
    # a todo created after the first page does not shift the later pages
    first = (await api_client.get(f"{API}/todos", headers=bot, params={"queue": "work", "limit": 3})).json()
    await create(api_client, bot, title="newest")
    second = (
        await api_client.get(
            f"{API}/todos", headers=bot, params={"queue": "work", "limit": 3, "after": first["next"]}
        )
    ).json()
    assert [t["id"] for t in second["items"]] == expected[3:6]


# -- errors: authentication and authorization --------------------------------------------


async def test_requests_without_a_token_are_401_problems_and_change_nothing(
    api_client, module_pool, module_store
):
    todo = await enqueue(module_store, "work", "t")
    before = await snapshot(module_pool)
    calls = [
        ("post", f"{API}/todos", {"queue": "work", "title": "t"}),
        ("post", f"{API}/claims", {"queues": ["work"], "ttl": 30}),
        ("post", f"{API}/todos/{todo.id}/claim", {"ttl": 30}),
        ("get", f"{API}/todos/{todo.id}", None),
        ("get", f"{API}/todos", None),
    ]
    for header in (
        None,
        {"Authorization": "Basic Ym90OnB3"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer sbt_not-a-real-token"},
    ):
        for method, url, body in calls:
            kwargs = {"headers": header} if header else {}
            if body is not None:
                kwargs["json"] = body
            response = await getattr(api_client, method)(url, **kwargs)
            problem(response, 401)
            assert response.headers["www-authenticate"].lower().startswith("bearer")
    assert await snapshot(module_pool) == before


async def test_a_revoked_token_is_401(api_client, module_pool):
    accounts = Accounts(module_pool)
    token_id, secret = await accounts.add_token("bot", ["work"])
    headers = {"Authorization": f"Bearer {secret}"}
    assert (await api_client.get(f"{API}/todos", headers=headers)).status_code == 200
    await accounts.revoke_token(token_id, actor="test")
    before = await snapshot(module_pool)
    problem(await api_client.get(f"{API}/todos", headers=headers), 401)
    problem(await api_client.post(f"{API}/todos", headers=headers, json={"queue": "work", "title": "t"}), 401)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize(
    "endpoint", ["create", "batch", "claims", "claim by id", "get", "list", "complete with next", "channels"]
)
async def test_a_token_used_for_another_queue_is_refused_and_changes_nothing(
    api_client, module_pool, module_store, bot, endpoint
):
    secret = await enqueue(module_store, "secret", "not yours")
    await enqueue(module_store, "work", "mine")
    held = None
    if endpoint == "complete with next":
        held = await claim(api_client, bot)
    before = await snapshot(module_pool)
    if endpoint == "create":
        response = await api_client.post(f"{API}/todos", headers=bot, json={"queue": "secret", "title": "t"})
    elif endpoint == "batch":
        response = await batch(
            api_client, bot, [{"queue": "work", "title": "ok"}, {"queue": "secret", "title": "no"}]
        )
    elif endpoint == "claims":
        response = await api_client.post(
            f"{API}/claims", headers=bot, json={"queues": ["work", "secret"], "ttl": 30}
        )
    elif endpoint == "claim by id":
        response = await api_client.post(f"{API}/todos/{secret.id}/claim", headers=bot, json={"ttl": 30})
    elif endpoint == "get":
        response = await api_client.get(f"{API}/todos/{secret.id}", headers=bot)
    elif endpoint == "list":
        response = await api_client.get(f"{API}/todos", headers=bot, params={"queue": "secret"})
    elif endpoint == "complete with next":
        response = await api_client.post(
            f"{API}/todos/{held['id']}/complete",
            headers=bot,
            json={"lease": held["lease"], "next": {"queues": ["secret"], "ttl": 30}},
        )
    else:
        response = await api_client.get(f"{API}/channels", headers=bot, params={"queues": "work,secret"})
    if endpoint in ("claim by id", "get"):  # a todo outside the token's queues does not exist for it
        body = problem(response, 404)
        assert body["detail"] == f"no todo {secret.id}"
    else:
        body = problem(response, 403)
        assert "secret" in body["detail"]
    assert "not yours" not in response.text
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize("action", ["heartbeat", "release", "complete", "fail"])
async def test_a_token_cannot_act_on_a_held_todo_in_a_queue_it_does_not_cover_even_under_the_same_name(
    api_client, module_pool, module_store, action
):
    work_token = await agent_token(module_pool, "bot", ["work"])
    other_token = await agent_token(module_pool, "bot", ["other"])
    await enqueue(module_store, "work", "t")
    held = await claim(api_client, work_token)
    body = {
        "lease": held["lease"],
        **{"heartbeat": {"ttl": 60}, "fail": {"error": "x"}, "complete": {"result": {}}}.get(action, {}),
    }
    before = await snapshot(module_pool)
    response = await api_client.post(f"{API}/todos/{held['id']}/{action}", headers=other_token, json=body)
    assert problem(response, 404)["detail"] == f"no todo {held['id']}"  # nor which queue it is in
    assert await snapshot(module_pool) == before


async def test_the_token_not_the_body_decides_the_owner(api_client, module_pool, bot):
    created = await api_client.post(
        f"{API}/todos",
        headers=bot,
        json={"queue": "work", "title": "t", "owner": "mallory", "state": "claimed"},
    )
    assert created.status_code in (201, 400, 422), created.text
    if created.status_code == 201:  # extra fields ignored, never used
        todo = created.json()["todo"]
        assert (todo["owner"], todo["state"]) == (None, "pending")
    else:
        await create(api_client, bot)
    before = await snapshot(module_pool)
    response = await api_client.post(
        f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30, "owner": "mallory"}
    )
    if response.status_code == 200:
        assert response.json()["owner"] == "bot"
    else:
        problem(response, 422)  # an unknown field: invalid input
        assert await snapshot(module_pool) == before
        response = await api_client.post(f"{API}/claims", headers=bot, json={"queues": ["work"], "ttl": 30})
    held = response.json()
    assert held["owner"] == "bot"
    before = await snapshot(module_pool)
    sneaky = await act(api_client, bot, held, "complete", owner="mallory")
    if sneaky.status_code != 200:
        problem(sneaky, 422)
        assert await snapshot(module_pool) == before
    assert await module_pool.fetchval("SELECT count(*) FROM todos WHERE owner = 'mallory'") == 0
    assert await module_pool.fetchval("SELECT count(*) FROM todo_history WHERE actor LIKE '%mallory%'") == 0


# -- errors: malformed requests ----------------------------------------------------------


async def _held(api_client, bot) -> dict:
    await create(api_client, bot)
    return await claim(api_client, bot)


@pytest.mark.parametrize(
    "path",
    [
        "/todos",
        "/todos/batch",
        "/claims",
        "/todos/{id}/claim",
        "/todos/{id}/heartbeat",
        "/todos/{id}/release",
        "/todos/{id}/complete",
        "/todos/{id}/fail",
    ],
)
async def test_malformed_json_is_a_400_problem_and_changes_nothing(api_client, module_pool, bot, path):
    held = await _held(api_client, bot)
    before = await snapshot(module_pool)
    response = await api_client.post(
        API + path.format(id=held["id"]),
        headers={**bot, "Content-Type": "application/json"},
        content=b'{"queue": "work", "title": ',
    )
    problem(response, 400)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
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
    ],
)
async def test_wrong_types_are_rejected_naming_the_field(api_client, module_pool, bot, path, body, field):
    held = await _held(api_client, bot)
    body = {k: held["lease"] if v == "{lease}" else v for k, v in body.items()}
    before = await snapshot(module_pool)
    response = await api_client.post(API + path.format(id=held["id"]), headers=bot, json=body)
    assert response.status_code in (400, 422), response.text
    problem(response, response.status_code, field=field)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
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
    ],
)
async def test_values_out_of_bounds_are_422_naming_the_field(api_client, module_pool, bot, path, body, field):
    held = await _held(api_client, bot)
    await create(api_client, bot, title="claimable by id")
    pending_id = await module_pool.fetchval("SELECT id FROM todos WHERE state = 'pending'")
    target = pending_id if path.endswith("/claim") else held["id"]
    body = {k: held["lease"] if v == "{lease}" else v for k, v in body.items()}
    before = await snapshot(module_pool)
    response = await api_client.post(API + path.format(id=target), headers=bot, json=body)
    problem(response, 422, field=field)
    assert await snapshot(module_pool) == before


async def test_list_parameters_out_of_bounds_are_refused_naming_the_parameter(api_client, bot):
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"state": "sleeping"}, "state"),
        ({"after": "garbage!"}, "after"),
    ):
        response = await api_client.get(f"{API}/todos", headers=bot, params=params)
        assert response.status_code in (400, 422), response.text
        problem(response, response.status_code, field=field)


def _big() -> dict:
    return {"blob": "x" * MAX_JSON_BYTES}  # over the limit once encoded


async def test_an_oversized_result_is_413_and_the_todo_stays_claimed(api_client, module_pool, bot):
    held = await _held(api_client, bot)
    before = await snapshot(module_pool)
    response = await act(api_client, bot, held, "complete", result=_big())
    problem(response, 413, field="result")
    assert await snapshot(module_pool) == before


async def test_a_request_body_over_the_server_limit_is_413(api_client, module_pool, bot):
    before = await snapshot(module_pool)
    items = [{"queue": "work", "title": f"t{i}", "payload": {"blob": "x" * 200_000}} for i in range(50)]
    response = await batch(api_client, bot, items)
    problem(response, 413)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize("path", ["/todos", "/todos/batch"])
async def test_an_oversized_payload_is_413_naming_the_field_and_creates_nothing(
    api_client, module_pool, bot, path
):
    item = {"queue": "work", "title": "big", "payload": _big()}
    body = item if path == "/todos" else {"todos": [{"queue": "work", "title": "small"}, item]}
    before = await snapshot(module_pool)
    response = await api_client.post(API + path, headers=bot, json=body)
    assert await snapshot(module_pool) == before
    problem(response, 413, field="payload")


async def test_a_payload_just_under_the_limit_is_accepted(api_client, module_pool, bot):
    payload = {"blob": "x" * (MAX_JSON_BYTES - len('{"blob":""}'))}
    todo = await create(api_client, bot, payload=payload)
    assert (await todo_row(module_pool, todo["id"])).payload == payload


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/todos/{id}", None),
        ("post", "/todos/{id}/claim", {"ttl": 30}),
        ("post", "/todos/{id}/heartbeat", {"lease": 1, "ttl": 30}),
        ("post", "/todos/{id}/release", {"lease": 1}),
        ("post", "/todos/{id}/complete", {"lease": 1, "result": {}}),
        ("post", "/todos/{id}/complete", {"lease": 1, "next": {"queues": ["work"], "ttl": 30}}),
        ("post", "/todos/{id}/fail", {"lease": 1, "error": "x"}),
    ],
)
async def test_unknown_ids_are_404_problems(api_client, module_pool, bot, method, path, body):
    await create(api_client, bot)
    before = await snapshot(module_pool)
    url = API + path.format(id="td_00000000-0000-0000-0000-000000000000")
    response = await (
        api_client.get(url, headers=bot) if body is None else api_client.post(url, headers=bot, json=body)
    )
    body = problem(response, 404)
    assert "td_00000000-0000-0000-0000-000000000000" in body["detail"]
    assert await snapshot(module_pool) == before


# -- inputs the database cannot module_store are refused, never a server error --------------------


@pytest.mark.parametrize("action", ["heartbeat", "release", "complete", "fail"])
async def test_a_lease_beyond_64_bits_is_refused_not_a_server_error(api_client, module_pool, bot, action):
    held = await _held(api_client, bot)
    before = await snapshot(module_pool)
    body = {"lease": 2**70, **{"heartbeat": {"ttl": 30}, "fail": {"error": "x"}}.get(action, {})}
    response = await api_client.post(f"{API}/todos/{held['id']}/{action}", headers=bot, json=body)
    assert response.status_code in (400, 409, 422), response.text
    problem(response, response.status_code, field="lease" if response.status_code != 409 else None)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize("where", ["title", "payload", "result", "todo id"])
async def test_a_nul_character_is_refused_not_a_server_error(api_client, module_pool, bot, where):
    held = await _held(api_client, bot)
    before = await snapshot(module_pool)
    if where == "title":
        response = await api_client.post(
            f"{API}/todos", headers=bot, json={"queue": "work", "title": "a\x00b"}
        )
    elif where == "payload":
        response = await api_client.post(
            f"{API}/todos", headers=bot, json={"queue": "work", "title": "t", "payload": {"k": "\x00"}}
        )
    elif where == "result":
        response = await act(api_client, bot, held, "complete", result={"k": "\x00"})
    else:
        response = await api_client.get(f"{API}/todos/td_%00", headers=bot)
    assert response.status_code in (400, 404, 422), response.text
    problem(response, response.status_code)
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize("where", ["payload", "result"])
async def test_a_deeply_nested_json_body_is_refused_not_a_server_error(api_client, module_pool, bot, where):
    held = await _held(api_client, bot)
    nested = b"[" * 1500 + b"]" * 1500
    if where == "payload":
        url, body = f"{API}/todos", b'{"queue": "work", "title": "t", "payload": {"x": %s}}' % nested
    else:
        url, body = (
            f"{API}/todos/{held['id']}/complete",
            b'{"lease": %d, "result": {"x": %s}}' % (held["lease"], nested),
        )
    before = await snapshot(module_pool)
    response = await api_client.post(url, headers={**bot, "Content-Type": "application/json"}, content=body)
    assert await snapshot(module_pool) == before
    assert response.status_code in (400, 413, 422), response.text
    problem(response, response.status_code)
