"""The agent API's todos, in process on a real database: create (one, or a batch of them),
get with its history, and list (filtered, by the token's queues, a page at a time).

Tokens (conftest): `bot` covers queues work and other; a todo in queue `secret` is outside
its token.
"""

from __future__ import annotations

import pytest

from tests.agent_api import API, act, batch, claim, create, parse, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import enqueue, history, last_step, snapshot, todo_row

pytestmark = ONE_DATABASE_PER_MODULE


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
