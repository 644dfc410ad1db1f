"""The agent API's leases, in process on a real database: claim the next todo (or wait for
one), claim by id, heartbeat, release, complete (and claim the next), and fail. A stale or
another agent's lease is a 409 that changes nothing.

Tokens (conftest): `bot` covers queues work and other; `rival` covers work.
"""

from __future__ import annotations

import time
from datetime import timedelta

from tests.agent_api import API, act, claim, create, parse, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import assert_new_token, expire_lease, last_step, make_retry_due, snapshot, todo_row

pytestmark = ONE_DATABASE_PER_MODULE


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
