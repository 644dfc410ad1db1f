"""Batches over HTTP: POST /api/v1/claims with `max`, and POST /api/v1/acks.

A claim with `max` answers {"todos": [...]}, never more than `max` of them, even with
sixteen claimers at once (against a real `switchboard serve`). An acks request answers one
result per item, in order: a stale lease or an unknown todo is that item's problem, and
only the good items change the database. Malformed input refuses the whole request and
changes nothing.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.agent_api import API, claim, create, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import agent_token, assert_new_token, enqueue, history, snapshot, todo_row, unique

pytestmark = ONE_DATABASE_PER_MODULE


async def claim_many(client, headers, n: int, queues=("work",), **body) -> httpx.Response:
    return await client.post(
        f"{API}/claims", headers=headers, json={"queues": list(queues), "ttl": 30, "max": n, **body}
    )


async def acks(client, headers, items: list[dict]) -> httpx.Response:
    return await client.post(f"{API}/acks", headers=headers, json={"acks": items})


# -- claims with max ---------------------------------------------------------------------


async def test_a_claim_with_max_answers_up_to_max_todos_oldest_first(api_client, bot):
    made = [await create(api_client, bot, title=f"t{i}") for i in range(5)]
    response = await claim_many(api_client, bot, 3)
    assert response.status_code == 200, response.text
    todos = response.json()["todos"]
    assert [t["id"] for t in todos] == [t["id"] for t in made[:3]]
    assert all(t["state"] == "claimed" and t["owner"] == "bot" for t in todos)
    for t in todos:
        assert_new_token(t["lease"])
    rest = (await claim_many(api_client, bot, 10)).json()["todos"]
    assert [t["id"] for t in rest] == [t["id"] for t in made[3:]]


async def test_a_claim_with_max_and_nothing_claimable_answers_an_empty_list(api_client, bot):
    response = await claim_many(api_client, bot, 10, wait=0.2)
    assert response.status_code == 200, response.text
    assert response.json() == {"todos": []}


async def test_a_claim_without_max_still_answers_one_todo_or_204(api_client, bot):
    assert (await api_client.post(f"{API}/claims", headers=bot, json={"queues": ["work"]})).status_code == 204
    made = await create(api_client, bot)
    assert (await claim(api_client, bot))["id"] == made["id"]


async def test_max_out_of_bounds_is_422_naming_max_and_claims_nothing(api_client, module_pool, bot):
    await create(api_client, bot)
    before = await snapshot(module_pool)
    for bad in (0, 101, -1, True, 2.5, "many"):
        response = await claim_many(api_client, bot, bad)
        assert response.status_code in (400, 422), (bad, response.text)
        body = problem(response, response.status_code)
        assert "max" in (body.get("field") or "") + body["detail"], body
    assert await snapshot(module_pool) == before


@pytest.mark.asyncio(loop_scope="function")  # the live server's fixtures, not the module's app
async def test_sixteen_concurrent_batch_claimers_never_get_more_than_max_nor_the_same_todo(
    live_server, live_conn, live_store
):
    queue = unique("bc")
    headers = await agent_token(live_conn, "batcher", [queue])
    made = {(await enqueue(live_store, queue, f"t{i}")).id for i in range(100)}
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=live_server[0], timeout=30, limits=limits) as http:

        async def claimer() -> list[list[str]]:
            got = []
            while True:
                response = await claim_many(http, headers, 7, queues=[queue])
                assert response.status_code == 200, response.text
                ids = [t["id"] for t in response.json()["todos"]]
                if not ids:
                    return got
                got.append(ids)

        answers = [batch for one in await asyncio.gather(*(claimer() for _ in range(16))) for batch in one]
    assert max(len(batch) for batch in answers) <= 7
    claimed = [todo_id for batch in answers for todo_id in batch]
    assert len(claimed) == len(set(claimed)) == 100, "a todo was claimed twice, or one was missed"
    assert set(claimed) == made


# -- acks --------------------------------------------------------------------------------


async def test_acks_answer_each_item_in_order_and_change_only_the_good_ones(
    api_client, module_pool, bot, rival
):
    for i in range(4):
        await create(api_client, bot, title=f"t{i}", max_attempts=3)
    done, failing, stale, _ = (await claim_many(api_client, bot, 4)).json()["todos"]
    # `stale` goes back to the queue (as if its lease had lapsed) and a rival claims it: bot's
    # lease is now stale
    await module_pool.execute(
        "UPDATE todos SET lease_expires_at = now() - interval '1 s' WHERE id = $1", stale["id"]
    )
    await module_pool.execute(
        "UPDATE todos SET state = 'pending', owner = NULL, lease_expires_at = NULL WHERE id = $1", stale["id"]
    )
    retaken = await claim(api_client, rival)
    assert retaken["id"] == stale["id"]
    assert_new_token(retaken["lease"], stale["lease"])
    secret = await create(api_client, await agent_token(module_pool, "keeper", ["secret"]), queue="secret")

    response = await acks(
        api_client,
        bot,
        [
            {"id": done["id"], "lease": done["lease"], "complete": {"result": {"ok": True}}},
            {"id": "td_nope", "lease": 1, "complete": {}},
            {"id": failing["id"], "lease": failing["lease"], "fail": {"error": "boom"}},
            {"id": stale["id"], "lease": stale["lease"], "complete": {"result": {"late": True}}},
            {"id": secret["id"], "lease": 1, "complete": {}},
        ],
    )
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["id"], r["status"]) for r in results] == [
        (done["id"], 200),
        ("td_nope", 404),
        (failing["id"], 200),
        (stale["id"], 409),
        (secret["id"], 404),  # outside the token's queues: to it, no such todo
    ]
    assert results[0]["todo"]["state"] == "done" and results[0]["todo"]["result"] == {"ok": True}
    assert results[2]["todo"]["state"] == "pending" and results[2]["todo"]["last_error"] == "boom"
    assert results[3]["problem"]["status"] == 409 and "claimed by rival" in results[3]["problem"]["detail"]
    assert results[1]["problem"]["detail"] == "no todo td_nope"
    assert "queue" not in results[4]["problem"]["detail"]

    assert (await todo_row(module_pool, done["id"])).state == "done"
    assert (await todo_row(module_pool, failing["id"])).next_retry_at is not None
    still = await todo_row(module_pool, stale["id"])
    assert (still.state, still.owner, still.result) == ("claimed", "rival", None)
    assert still.lease_token == retaken["lease"]
    assert (await todo_row(module_pool, secret["id"])).state == "pending"
    assert [s.to_state for s in await history(module_pool, done["id"])][-1] == "done"
    assert [s.to_state for s in await history(module_pool, failing["id"])][-1] == "pending"


async def test_the_last_failure_of_an_ack_dead_letters(api_client, module_pool, bot):
    await create(api_client, bot, max_attempts=1)
    held = await claim(api_client, bot)
    result = await acks(api_client, bot, [{"id": held["id"], "lease": held["lease"], "fail": {"error": "x"}}])
    assert result.json()["results"][0]["todo"]["state"] == "failed"


async def test_malformed_acks_refuse_the_whole_request_and_change_nothing(api_client, module_pool, bot):
    await create(api_client, bot)
    await create(api_client, bot)
    one, two = (await claim_many(api_client, bot, 2)).json()["todos"]
    good = {"id": one["id"], "lease": one["lease"], "complete": {}}
    before = await snapshot(module_pool)
    cases = {
        "both complete and fail": [
            good,
            {"id": two["id"], "lease": 1, "complete": {}, "fail": {"error": "x"}},
        ],
        "neither": [good, {"id": two["id"], "lease": 1}],
        "the same todo twice": [good, dict(good)],
        "an empty error": [good, {"id": two["id"], "lease": 1, "fail": {"error": ""}}],
        "a negative lease": [good, {"id": two["id"], "lease": -1, "complete": {}}],
        "an unknown field": [good, {"id": two["id"], "lease": 1, "complete": {}, "extra": 1}],
        "no acks": [],
        "too many": [dict(good, id=f"td_{i}") for i in range(101)],
    }
    for what, items in cases.items():
        response = await acks(api_client, bot, items)
        assert response.status_code in (400, 422), (what, response.text)
        problem(response, response.status_code)
    assert await snapshot(module_pool) == before, "a refused acks request changed something"
    ok = await acks(api_client, bot, [good])
    assert ok.json()["results"][0]["status"] == 200


async def test_acks_and_max_are_in_the_openapi_schema(api_client):
    schema = (await api_client.get(f"{API}/docs/openapi.json")).json()
    assert "post" in schema["paths"]["/api/v1/acks"]
    claim_in = schema["components"]["schemas"]["ClaimIn"]["properties"]
    assert "max" in claim_in
