"""The agent API's refusals of bad input, each an RFC 9457 problem that changes nothing:
malformed JSON, wrong types, values out of bounds, oversized bodies, unknown ids, and
values the database could not store (a lease past 64 bits, a NUL, deep nesting).
"""

from __future__ import annotations

import pytest

from dashboard.models import MAX_JSON_BYTES
from tests.agent_api import API, act, batch, claim, create, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import snapshot, todo_row

pytestmark = ONE_DATABASE_PER_MODULE


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
