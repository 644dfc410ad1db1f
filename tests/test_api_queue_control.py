"""Queue control over the agent API (DESIGN.md "Queue control", "Agent API additions").

Pause and resume a queue, cancel a todo (its holder is told at its next heartbeat or
ack), run a scheduled or retrying todo now, edit a pending or dead todo (and retry a dead
one in the same step), and create with priority, run_at, delay and assignee_until. All
within the token's queues: a queue named in the path outside them is 403, a todo outside
them 404. After every refusal the database is compared with a snapshot taken before it.

Tokens (conftest's): `bot` covers queues work and other; `rival` covers work only.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest

from dashboard.models import MAX_DELAY
from tests.agent_api import API, act, claim, create, parse, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import agent_token, db_now, enqueue, history, last_step, snapshot, todo_row, unique

pytestmark = ONE_DATABASE_PER_MODULE


async def pause(client, headers, queue: str, **body):
    return await client.post(f"{API}/queues/{queue}/pause", headers=headers, json=body)


async def resume(client, headers, queue: str, **body):
    return await client.post(f"{API}/queues/{queue}/resume", headers=headers, json=body)


async def cancel(client, headers, todo_id: str, **body):
    return await client.post(f"{API}/todos/{todo_id}/cancel", headers=headers, json=body)


async def edit(client, headers, todo_id: str, body: dict, **params):
    return await client.patch(f"{API}/todos/{todo_id}", headers=headers, json=body, params=params)


async def claim_from(client, headers, queues, **body):
    """POST /claims; the response (200 with a todo, or 204)."""
    return await client.post(f"{API}/claims", headers=headers, json={"queues": list(queues), **body})


async def dead(client, headers, queue: str = "work", **fields) -> dict:
    """A todo failed at its cap through the API."""
    made = await create(client, headers, queue=queue, max_attempts=1, **fields)
    held = (await client.post(f"{API}/todos/{made['id']}/claim", headers=headers, json={})).json()
    response = await act(client, headers, held, "fail", error="boom")
    assert response.json()["todo"]["state"] == "failed", response.text
    return response.json()["todo"]


def iso(moment: datetime) -> str:
    return moment.isoformat()


# -- pause and resume --------------------------------------------------------------------


async def test_pause_and_resume_round_trip_and_claims_skip_the_paused_queue(api_client, module_pool, bot):
    in_work = await create(api_client, bot, queue="work", title="in work")  # the oldest
    in_other = await create(api_client, bot, queue="other", title="in other")

    response = await pause(api_client, bot, "work", reason="deploying")
    assert response.status_code == 200, response.text
    paused = response.json()
    assert (paused["queue"], paused["actor_kind"], paused["actor"], paused["reason"]) == (
        "work",
        "agent",
        "bot",
        "deploying",
    )
    assert parse(paused["paused_at"]) <= await db_now(module_pool)
    # pausing again keeps the first pause: who, when and why
    again = await pause(api_client, bot, "work", reason="again")
    assert again.status_code == 200 and again.json() == paused

    taken = await claim_from(api_client, bot, ["work", "other"])
    assert taken.status_code == 200, taken.text
    assert taken.json()["id"] == in_other["id"]  # the older todo in work is skipped
    assert (await claim_from(api_client, bot, ["work", "other"])).status_code == 204
    assert (await todo_row(module_pool, in_work["id"])).state == "pending"

    response = await resume(api_client, bot, "work", reason="deployed")
    assert response.status_code == 200, response.text
    assert response.json() == {"queue": "work", "resumed": True}
    assert (await resume(api_client, bot, "work")).json() == {"queue": "work", "resumed": False}
    taken = await claim_from(api_client, bot, ["work", "other"])
    assert taken.status_code == 200 and taken.json()["id"] == in_work["id"]

    rows = await module_pool.fetch("SELECT action, actor_kind, actor, reason FROM queue_history ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("paused", "agent", "bot", "deploying"),
        ("resumed", "agent", "bot", "deployed"),
    ]
    assert await module_pool.fetchval("SELECT count(*) FROM queue_pauses") == 0


async def test_pause_resume_cancel_and_run_now_take_no_body_or_an_empty_one(api_client, module_pool, bot):
    no_body = await api_client.post(f"{API}/queues/work/pause", headers=bot)
    assert no_body.status_code == 200, no_body.text
    assert no_body.json()["reason"] is None
    empty = await api_client.post(f"{API}/queues/work/resume", headers=bot, json={})
    assert empty.json() == {"queue": "work", "resumed": True}

    scheduled = await create(api_client, bot, delay=3600)
    response = await api_client.post(f"{API}/todos/{scheduled['id']}/run-now", headers=bot)
    assert response.status_code == 200, response.text
    response = await api_client.post(f"{API}/todos/{scheduled['id']}/cancel", headers=bot)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "failed" and response.json()["cancel_reason"] is None


async def test_pause_refuses_an_unknown_field_and_a_bad_queue_name(api_client, module_pool, bot):
    before = await snapshot(module_pool)
    response = await pause(api_client, bot, "work", why="typo")
    assert response.status_code in (400, 422), response.text
    problem(response, response.status_code)
    problem(await pause(api_client, bot, "Not A Queue"), 422, field="queue")
    problem(await pause(api_client, bot, "work", reason="x" * 1001), 422, field="reason")
    assert await snapshot(module_pool) == before


async def test_claim_by_id_in_a_paused_queue_is_409_saying_it_is_paused(api_client, module_pool, bot):
    todo = await create(api_client, bot)
    await pause(api_client, bot, "work", reason="maintenance window")
    before = await snapshot(module_pool)
    response = await api_client.post(f"{API}/todos/{todo['id']}/claim", headers=bot, json={"ttl": 30})
    body = problem(response, 409)
    assert "paused" in body["detail"] and "maintenance window" in body["detail"], body
    assert await snapshot(module_pool) == before


async def test_a_held_lease_goes_on_while_its_queue_is_paused(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    await pause(api_client, bot, "work")
    assert (await act(api_client, bot, held, "heartbeat", ttl=60)).status_code == 200
    done = await act(api_client, bot, held, "complete", result={"ok": True})
    assert done.status_code == 200, done.text
    assert (await todo_row(module_pool, held["id"])).state == "done"


@pytest.mark.asyncio(loop_scope="function")  # the live server's fixtures, not the module's app
async def test_a_waiting_claim_on_a_paused_queue_waits_and_resume_wakes_it_within_a_second(
    live_server, live_conn, live_store
):
    """Against a real `switchboard serve` (the in-process client runs one request at a time).
    A waiting claim re-checks only every few seconds without a hint, so "within a second"
    can only pass if the resume's hint wakes it."""
    queue = unique("pause")
    headers = await agent_token(live_conn, "pauser", [queue])
    todo = await enqueue(live_store, queue, "waits for the resume")
    async with httpx.AsyncClient(base_url=live_server[0], timeout=30) as http:
        assert (await pause(http, headers, queue)).status_code == 200
        waiting = asyncio.create_task(claim_from(http, headers, [queue], ttl=30, wait=20))
        # still waiting half a second on: the todo is ready, but its queue is paused
        done, _ = await asyncio.wait([waiting], timeout=0.5)
        assert not done, waiting.result()
        assert (await todo_row(live_conn, todo.id)).state == "pending"

        resumed_at = time.monotonic()
        assert (await resume(http, headers, queue)).json()["resumed"] is True
        response = await asyncio.wait_for(waiting, 10)
        woke_after = time.monotonic() - resumed_at
    assert response.status_code == 200, response.text
    assert response.json()["id"] == todo.id
    assert woke_after < 1.0, f"the resume's hint took {woke_after:.2f} s to wake the claim"


# -- cancel ------------------------------------------------------------------------------


async def test_cancel_a_claimed_todo_and_its_holder_is_told_at_heartbeat_and_complete(
    api_client, module_pool, bot, rival
):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    response = await cancel(api_client, rival, held["id"], reason="customer withdrew")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "failed" and body["lease"] is None
    assert (body["cancelled_by_kind"], body["cancelled_by"], body["cancel_reason"]) == (
        "agent",
        "rival",
        "customer withdrew",
    )
    assert parse(body["cancelled_at"]) <= await db_now(module_pool)
    assert await last_step(module_pool, held["id"]) == (
        "claimed",
        "failed",
        "agent",
        "rival",
        1,
        "cancelled: customer withdrew",
    )

    before = await snapshot(module_pool)
    for action, extra in (
        ("heartbeat", {"ttl": 60}),
        ("complete", {"result": {"sent": True}}),
        ("fail", {"error": "x"}),
        ("release", {}),
    ):
        refused = problem(await act(api_client, bot, held, action, **extra), 409)
        assert refused["type"].endswith("/cancelled"), (action, refused)
        assert "cancelled" in refused["detail"] and "customer withdrew" in refused["detail"]
    assert await snapshot(module_pool) == before
    stored = await todo_row(module_pool, held["id"])
    assert (stored.state, stored.result) == ("failed", None)  # the late result is not stored


async def test_a_stale_holder_of_a_cancelled_todo_gets_a_plain_conflict(api_client, module_pool, bot, rival):
    """Only the holder is told to stop: another agent's ack is refused as any other."""
    await create(api_client, bot)
    held = await claim(api_client, bot)
    await cancel(api_client, bot, held["id"])
    body = problem(await act(api_client, rival, held, "complete"), 409)
    assert not body["type"].endswith("/cancelled"), body


async def test_cancel_a_pending_todo_dead_letters_it_and_claims_skip_it(api_client, module_pool, bot):
    todo = await create(api_client, bot)
    response = await cancel(api_client, bot, todo["id"], reason="duplicate")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "failed" and response.json()["cancel_reason"] == "duplicate"
    assert (await claim_from(api_client, bot, ["work"])).status_code == 204
    assert await last_step(module_pool, todo["id"]) == (
        "pending",
        "failed",
        "agent",
        "bot",
        0,
        "cancelled: duplicate",
    )


async def test_cancel_a_finished_todo_is_409_and_changes_nothing(api_client, module_pool, bot):
    await create(api_client, bot)
    held = await claim(api_client, bot)
    await act(api_client, bot, held, "complete")
    before = await snapshot(module_pool)
    body = problem(await cancel(api_client, bot, held["id"]), 409)
    assert "done" in body["detail"]
    assert await snapshot(module_pool) == before


# -- run now -----------------------------------------------------------------------------


async def test_run_now_makes_a_scheduled_todo_claimable_at_once(api_client, module_pool, bot):
    todo = await create(api_client, bot, delay=3600)
    assert (await claim_from(api_client, bot, ["work"])).status_code == 204
    response = await api_client.post(f"{API}/todos/{todo['id']}/run-now", headers=bot, json={})
    assert response.status_code == 200, response.text
    assert parse(response.json()["ready_at"]) <= await db_now(module_pool)
    assert (await last_step(module_pool, todo["id"])).note == "run now"
    taken = await claim_from(api_client, bot, ["work"])
    assert taken.status_code == 200 and taken.json()["id"] == todo["id"]


async def test_run_now_makes_a_retrying_todo_claimable_at_once(api_client, module_pool, bot):
    await create(api_client, bot, max_attempts=3)
    held = await claim(api_client, bot)
    await act(api_client, bot, held, "fail", error="later")
    await module_pool.execute(
        "UPDATE todos SET next_retry_at = now() + interval '1 hour', ready_at = now() + interval '1 hour'"
        " WHERE id = $1",
        held["id"],
    )
    response = await api_client.post(f"{API}/todos/{held['id']}/run-now", headers=bot, json={})
    assert response.status_code == 200, response.text
    assert response.json()["next_retry_at"] is None
    taken = await claim_from(api_client, bot, ["work"])
    assert taken.status_code == 200 and taken.json()["id"] == held["id"] and taken.json()["attempt"] == 2


async def test_run_now_of_a_ready_todo_is_409_and_changes_nothing(api_client, module_pool, bot):
    todo = await create(api_client, bot)
    before = await snapshot(module_pool)
    problem(await api_client.post(f"{API}/todos/{todo['id']}/run-now", headers=bot, json={}), 409)
    assert await snapshot(module_pool) == before


# -- create with priority, run_at, delay, assignee_until ---------------------------------


async def test_the_todo_json_shows_the_queue_control_fields(api_client, bot):
    todo = await create(api_client, bot)
    for field, value in (
        ("priority", 0),
        ("assignee_until", None),
        ("cancelled_at", None),
        ("cancelled_by_kind", None),
        ("cancelled_by", None),
        ("cancel_reason", None),
    ):
        assert field in todo and todo[field] == value, (field, todo)


async def test_create_with_a_priority_and_claims_take_the_highest_first(api_client, module_pool, bot):
    low = await create(api_client, bot, title="low", priority=-3)
    normal = await create(api_client, bot, title="normal")
    high = await create(api_client, bot, title="high", priority=7)
    assert (low["priority"], normal["priority"], high["priority"]) == (-3, 0, 7)
    assert (await todo_row(module_pool, high["id"])).priority == 7
    order = [(await claim(api_client, bot))["id"] for _ in range(3)]
    assert order == [high["id"], normal["id"], low["id"]]


async def test_create_with_run_at_schedules_the_todo(api_client, module_pool, bot):
    when = (await db_now(module_pool) + timedelta(hours=2)).replace(microsecond=0)
    todo = await create(api_client, bot, run_at=iso(when))
    assert parse(todo["ready_at"]) == when
    assert (await todo_row(module_pool, todo["id"])).ready_at == when
    assert (await claim_from(api_client, bot, ["work"])).status_code == 204
    listed = (await api_client.get(f"{API}/todos", headers=bot, params={"state": "scheduled"})).json()
    assert [t["id"] for t in listed["items"]] == [todo["id"]]


async def test_create_with_run_at_in_another_zone_means_the_same_instant(api_client, module_pool, bot):
    when = (await db_now(module_pool) + timedelta(hours=2)).replace(microsecond=0)
    in_india = when.astimezone(timezone(timedelta(hours=5, minutes=30)))
    todo = await create(api_client, bot, run_at=in_india.isoformat())
    assert (await todo_row(module_pool, todo["id"])).ready_at == when


async def test_create_with_a_delay_schedules_the_todo_that_many_seconds_ahead(api_client, module_pool, bot):
    start = await db_now(module_pool)
    todo = await create(api_client, bot, delay=600)
    ready_at = (await todo_row(module_pool, todo["id"])).ready_at
    assert start + timedelta(seconds=600) <= ready_at <= await db_now(module_pool) + timedelta(seconds=600)
    assert (await claim_from(api_client, bot, ["work"])).status_code == 204


async def test_an_assignee_until_lets_any_agent_claim_once_it_has_passed(api_client, module_pool, bot):
    now = await db_now(module_pool)
    open_now = await create(
        api_client, bot, title="hers no more", assignee="olga", assignee_until=iso(now + timedelta(minutes=1))
    )
    # an agent cannot give a fallback already past: the minute passes on the database's clock
    await module_pool.execute(
        "UPDATE todos SET assignee_until = now() - interval '1 minute' WHERE id = $1", open_now["id"]
    )
    held_back = await create(
        api_client, bot, title="still hers", assignee="olga", assignee_until=iso(now + timedelta(hours=1))
    )
    assert parse(held_back["assignee_until"]) == now + timedelta(hours=1)
    taken = await claim_from(api_client, bot, ["work"])
    assert taken.status_code == 200 and taken.json()["id"] == open_now["id"]
    assert (await claim_from(api_client, bot, ["work"])).status_code == 204
    await module_pool.execute(
        "UPDATE todos SET assignee_until = now() - interval '1 second' WHERE id = $1", held_back["id"]
    )
    taken = await claim_from(api_client, bot, ["work"])
    assert taken.status_code == 200 and taken.json()["id"] == held_back["id"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"priority": 11}, "priority"),
        ({"priority": -11}, "priority"),
        ({"delay": -1}, "delay"),
        ({"delay": MAX_DELAY + 1}, "delay"),
        ({"run_at": "tomorrow"}, "run_at"),
        ({"run_at": "2026-12-24T18:00:00"}, "run_at"),  # no zone
        ({"run_at": "2099-01-01T00:00:00Z"}, "run_at"),  # beyond a year
        ({"run_at": "<soon>", "delay": 60}, "run_at"),  # both
        ({"assignee_until": "<soon>"}, "assignee_until"),  # without an assignee
        ({"assignee": "olga", "assignee_until": "next week"}, "assignee_until"),
    ],
)
async def test_bad_schedule_and_priority_values_are_422_naming_the_field(
    api_client, module_pool, bot, fields, field
):
    soon = iso(datetime.now(UTC) + timedelta(minutes=5))
    fields = {k: soon if v == "<soon>" else v for k, v in fields.items()}
    before = await snapshot(module_pool)
    response = await api_client.post(
        f"{API}/todos", headers=bot, json={"queue": "work", "title": "t", **fields}
    )
    body = problem(response, 422)
    assert body.get("field") == field, body
    items = [{"queue": "work", "title": "fine"}, {"queue": "work", "title": "t", **fields}]
    batch = await api_client.post(f"{API}/todos/batch", headers=bot, json={"todos": items})
    assert problem(batch, 422).get("field") == f"todos[1].{field}"
    assert await snapshot(module_pool) == before


# -- edit --------------------------------------------------------------------------------


async def test_edit_of_a_pending_todo_changes_it_and_history_shows_the_changes(api_client, module_pool, bot):
    todo = await create(api_client, bot, title="old title", payload={"keep": 1, "drop": 2, "change": "a"})
    response = await edit(
        api_client,
        bot,
        todo["id"],
        {"title": "new title", "priority": 4, "payload": {"keep": 1, "change": "b", "add": True}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["title"], body["priority"], body["state"]) == ("new title", 4, "pending")
    assert body["payload"] == {"keep": 1, "change": "b", "add": True}
    stored = await todo_row(module_pool, todo["id"])
    assert (stored.title, stored.priority, stored.payload) == ("new title", 4, body["payload"])

    detail = (await api_client.get(f"{API}/todos/{todo['id']}", headers=bot)).json()
    entry = detail["history"][-1]
    assert (entry["from_state"], entry["to_state"], entry["actor_kind"], entry["actor"]) == (
        "pending",
        "pending",
        "agent",
        "bot",
    )
    assert entry["changes"]["title"] == ["old title", "new title"]
    assert entry["changes"]["priority"] == [0, 4]
    assert entry["changes"]["payload"] == {
        "added": {"add": True},
        "removed": {"drop": 2},
        "changed": {"change": ["a", "b"]},
    }
    assert "max_attempts" not in entry["changes"]  # unchanged fields are not listed
    assert detail["history"][0]["changes"] is None  # the creation changed nothing


async def test_edit_can_clear_the_assignee_and_reschedule(api_client, module_pool, bot):
    todo = await create(api_client, bot, assignee="olga", kind="mail")
    when = (await db_now(module_pool) + timedelta(hours=3)).replace(microsecond=0)
    response = await edit(api_client, bot, todo["id"], {"assignee": None, "kind": None, "run_at": iso(when)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["assignee"], body["kind"], parse(body["ready_at"])) == (None, None, when)


async def test_edit_of_a_claimed_todo_is_409_and_changes_nothing(api_client, module_pool, bot, rival):
    await create(api_client, bot)
    held = await claim(api_client, rival)
    before = await snapshot(module_pool)
    body = problem(await edit(api_client, bot, held["id"], {"title": "too late"}), 409)
    assert "claimed by rival" in body["detail"], body
    assert await snapshot(module_pool) == before


async def test_edit_of_the_idempotency_key_is_refused_and_changes_nothing(api_client, module_pool, bot):
    todo = await create(api_client, bot, idempotency_key="k1")
    before = await snapshot(module_pool)
    for body in ({"idempotency_key": "k2"}, {"title": "also this", "idempotency_key": "k2"}):
        response = await edit(api_client, bot, todo["id"], body)
        assert 400 <= response.status_code < 500, response.text
        assert "idempotency_key" in problem(response, response.status_code)["detail"]
    assert await snapshot(module_pool) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "edit"),
        ({"priority": 11}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"title": " "}, "title"),
        ({"run_at": "tomorrow"}, "run_at"),
    ],
)
async def test_bad_edits_are_422_naming_the_field(api_client, module_pool, bot, body, field):
    todo = await create(api_client, bot)
    before = await snapshot(module_pool)
    problem(await edit(api_client, bot, todo["id"], body), 422, field=field)
    assert await snapshot(module_pool) == before


async def test_edit_of_a_dead_todo_keeps_it_dead_and_with_retry_revives_it(api_client, module_pool, bot):
    gone = await dead(api_client, bot, payload={"to": "wrong@example"})
    response = await edit(api_client, bot, gone["id"], {"title": "fixed"})
    assert response.status_code == 200, response.text
    assert (response.json()["state"], response.json()["title"]) == ("failed", "fixed")

    response = await edit(
        api_client, bot, gone["id"], {"payload": {"to": "right@example"}, "max_attempts": 3}, retry="true"
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["state"], body["payload"], body["max_attempts"]) == ("pending", {"to": "right@example"}, 3)
    steps = await history(module_pool, gone["id"])
    assert [(s.from_state, s.to_state) for s in steps[-2:]] == [("failed", "pending"), ("pending", "pending")]
    taken = await claim(api_client, bot)
    assert taken["id"] == gone["id"] and taken["payload"] == {"to": "right@example"}


async def test_edit_with_retry_of_a_todo_that_is_not_dead_is_409_and_changes_nothing(
    api_client, module_pool, bot
):
    todo = await create(api_client, bot)
    before = await snapshot(module_pool)
    problem(await edit(api_client, bot, todo["id"], {"title": "x"}, retry="true"), 409)
    assert await snapshot(module_pool) == before


async def test_an_invalid_edit_with_retry_does_not_retry_either(api_client, module_pool, bot):
    gone = await dead(api_client, bot)
    before = await snapshot(module_pool)
    problem(await edit(api_client, bot, gone["id"], {"priority": 99}, retry="true"), 422, field="priority")
    assert await snapshot(module_pool) == before


# -- scope -------------------------------------------------------------------------------


async def test_a_token_cannot_pause_or_resume_a_queue_it_does_not_cover(api_client, module_pool, bot, rival):
    await pause(api_client, bot, "other")
    before = await snapshot(module_pool)
    for response in (await pause(api_client, rival, "other"), await resume(api_client, rival, "other")):
        body = problem(response, 403)
        assert "other" in body["detail"]
    assert await snapshot(module_pool) == before


async def test_a_token_cannot_cancel_run_or_edit_a_todo_outside_its_queues(
    api_client, module_pool, bot, rival
):
    pending = await create(api_client, bot, queue="other", delay=60)
    gone = await dead(api_client, bot, queue="other")
    before = await snapshot(module_pool)
    for todo_id, method, path, body, params in (
        (pending["id"], "post", "/cancel", {}, {}),
        (pending["id"], "post", "/run-now", {}, {}),
        (pending["id"], "patch", "", {"title": "mine now"}, {}),
        (pending["id"], "patch", "", {"title": "mine now"}, {"retry": "true"}),
        (gone["id"], "patch", "", {"title": "mine now"}, {}),
        (gone["id"], "patch", "", {"title": "mine now"}, {"retry": "true"}),
    ):
        response = await api_client.request(
            method, f"{API}/todos/{todo_id}{path}", headers=rival, json=body, params=params
        )
        refused = problem(response, 404)
        assert refused["detail"] == f"no todo {todo_id}", (path, params, refused)
    assert await snapshot(module_pool) == before


# -- the schema --------------------------------------------------------------------------


async def test_the_queue_control_endpoints_are_described_in_the_openapi_schema(api_client):
    schema = (await api_client.get(f"{API}/docs/openapi.json")).json()
    paths = schema["paths"]
    for path, method, words in (
        ("/api/v1/queues/{queue}/pause", "post", "pause"),
        ("/api/v1/queues/{queue}/resume", "post", "resume"),
        ("/api/v1/todos/{todo_id}/cancel", "post", "cancel"),
        ("/api/v1/todos/{todo_id}/run-now", "post", "now"),
        ("/api/v1/todos/{todo_id}", "patch", "edit"),
    ):
        operation = paths[path][method]
        assert words in operation["summary"].lower(), operation["summary"]
        assert operation.get("description"), path
    assert any(p["name"] == "retry" for p in paths["/api/v1/todos/{todo_id}"]["patch"]["parameters"])
    todo_out = schema["components"]["schemas"]["TodoOut"]["properties"]
    assert {"priority", "assignee_until", "cancelled_at", "cancelled_by", "cancel_reason"} <= set(todo_out)
    new_todo = schema["components"]["schemas"]["NewTodo"]["properties"]
    assert {"priority", "run_at", "delay", "assignee_until"} <= set(new_todo)
