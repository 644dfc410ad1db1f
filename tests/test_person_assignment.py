"""A todo assigned to a person is theirs until its fallback (issue 25, item 12).

Before its `assignee_until`, a todo assigned to an operator can be claimed only by that
operator (the Inbox), and only an operator can reassign it or move its fallback: an agent
token on the same queue gets 403. An agent's fallback must lie ahead: one already past
would hand the todo to any agent at once. After the fallback any agent of the queue may
claim it, as before; todos assigned to agents are not held this way.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dashboard.accounts import Accounts
from dashboard.models import Actor, TodoEdit
from tests.factories import agent_token, unique

API = "/api/v1"


def iso(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


async def created(client, headers: dict, **fields) -> dict:
    answer = await client.post(
        f"{API}/todos", json={"title": "approve the refund", **fields}, headers=headers
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["todo"]


async def test_an_agent_cannot_give_a_person_s_todo_a_fallback_already_past(client, pool):
    queue = unique("ask")
    await Accounts(pool).add_operator("alice", "operator")
    asker = await agent_token(pool, "asker", [queue])
    past = {"queue": queue, "title": "t", "assignee": "alice", "assignee_until": iso(-timedelta(minutes=1))}

    one = await client.post(f"{API}/todos", json=past, headers=asker)
    assert one.status_code == 422, one.text
    assert one.json()["field"] == "assignee_until"
    batch = await client.post(
        f"{API}/todos/batch", json={"todos": [{"queue": queue, "title": "fine"}, past]}, headers=asker
    )
    assert batch.status_code == 422, batch.text
    assert batch.json()["field"] == "todos[1].assignee_until"
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE queue = $1", queue) == 0


async def test_another_agent_on_the_queue_can_neither_reassign_nor_claim_a_person_s_todo(client, pool):
    queue = unique("ask")
    await Accounts(pool).add_operator("alice", "operator")
    asker, other = await agent_token(pool, "asker", [queue]), await agent_token(pool, "grabber", [queue])
    todo = await created(client, asker, queue=queue, assignee="alice", assignee_until=iso(timedelta(hours=1)))

    for edit in ({"assignee": "grabber"}, {"assignee": None}, {"assignee_until": iso(timedelta(seconds=-5))}):
        answer = await client.patch(f"{API}/todos/{todo['id']}", json=edit, headers=other)
        assert answer.status_code == 403, (edit, answer.text)
        assert "alice" in answer.json()["detail"]
    claimed = await client.post(f"{API}/claims", json={"queues": [queue]}, headers=other)
    assert claimed.status_code == 204, claimed.text
    row = await pool.fetchrow("SELECT state, assignee FROM todos WHERE id = $1", todo["id"])
    assert (row["state"], row["assignee"]) == ("pending", "alice")


async def test_a_person_s_todo_without_a_fallback_is_held_for_good(client, pool):
    queue = unique("ask")
    await Accounts(pool).add_operator("alice", "operator")
    asker = await agent_token(pool, "asker", [queue])
    todo = await created(client, asker, queue=queue, assignee="alice")
    answer = await client.patch(
        f"{API}/todos/{todo['id']}", json={"assignee_until": iso(timedelta(seconds=1))}, headers=asker
    )
    assert answer.status_code == 403, answer.text


async def test_after_the_fallback_any_agent_of_the_queue_may_take_it(client, pool):
    queue = unique("ask")
    await Accounts(pool).add_operator("alice", "operator")
    asker, other = await agent_token(pool, "asker", [queue]), await agent_token(pool, "grabber", [queue])
    todo = await created(client, asker, queue=queue, assignee="alice", assignee_until=iso(timedelta(hours=1)))
    # the hour passes: the database's clock decides, so the fallback moves back an hour
    await pool.execute(
        "UPDATE todos SET assignee_until = now() - interval '1 second' WHERE id = $1", todo["id"]
    )
    claimed = await client.post(f"{API}/claims", json={"queues": [queue]}, headers=other)
    assert claimed.status_code == 200 and claimed.json()["id"] == todo["id"], claimed.text
    done = await client.post(
        f"{API}/todos/{todo['id']}/complete", json={"lease": claimed.json()["lease_token"]}, headers=other
    )
    assert done.status_code == 200, done.text


async def test_an_operator_may_reassign_a_person_s_todo(control, client, pool, store):
    queue = unique("ask")
    await Accounts(pool).add_operator("alice", "operator")
    asker, other = await agent_token(pool, "asker", [queue]), await agent_token(pool, "grabber", [queue])
    todo = await created(client, asker, queue=queue, assignee="alice", assignee_until=iso(timedelta(hours=1)))
    await control.edit(todo["id"], Actor("operator", "olga"), TodoEdit(assignee="grabber"))
    claimed = await client.post(f"{API}/claims", json={"queues": [queue]}, headers=other)
    assert claimed.status_code == 200 and claimed.json()["id"] == todo["id"], claimed.text


async def test_todos_assigned_to_agents_stay_theirs_to_hand_on(client, pool):
    queue = unique("ask")
    asker, other = await agent_token(pool, "asker", [queue]), await agent_token(pool, "grabber", [queue])
    todo = await created(client, asker, queue=queue, assignee="asker")
    answer = await client.patch(f"{API}/todos/{todo['id']}", json={"assignee": "grabber"}, headers=other)
    assert answer.status_code == 200, answer.text
