"""The agent API's bearer tokens: without one, or with a revoked one, a request is a 401;
a token reaches only its own queues, and the token, never the body, decides the owner.
Every refusal changes nothing.

Tokens (conftest): `bot` covers queues work and other; a todo in queue `secret` is outside
its token.
"""

from __future__ import annotations

import pytest

from dashboard.accounts import Accounts
from tests.agent_api import API, act, batch, claim, create, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import agent_token, enqueue, snapshot

pytestmark = ONE_DATABASE_PER_MODULE


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


async def test_the_token_is_checked_before_the_body_is_read(api_client, module_store):
    """Without a token, a body that is not JSON, or not a claim, is still a 401: an unknown
    caller learns nothing about what the API would take."""
    todo = await enqueue(module_store, "work", "t")
    json_type = {"content-type": "application/json"}
    for url in (f"{API}/claims", f"{API}/todos/{todo.id}/complete"):
        for content in (b"{not json", b'{"unknown": 1}'):
            response = await api_client.post(url, content=content, headers=json_type)
            problem(response, 401)
            assert response.headers["www-authenticate"].lower().startswith("bearer")


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
