"""The MCP tools (dashboard/web/mcp.py) through the SDK's own client, over both
transports, against a real `switchboard serve` (the session's live server) on a real
database: streamable HTTP at /mcp, and stdio through `switchboard mcp` (a subprocess)
relaying to it. No language model: scripted agents call the tools as one would.

Every test uses queue and agent names of its own (the live server is shared). Time is
moved by SQL (a lease into the past), and the live server's reaper, or the test, reaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from dashboard.accounts import Accounts
from dashboard.mcp_proxy import connected
from tests.conftest import ROOT
from tests.factories import assert_new_token, enqueue, expire_lease, history, make_retry_due, todo_row, unique
from tests.processes import STOP_WITHIN, eventually, free_port, spawn, start_serving, stop

TOOLS = {
    "list_todos",
    "claim",
    "heartbeat",
    "release",
    "complete",
    "fail",
    "create_for",
    "get_todo",
    "wait_for",
}


# -- agents ----------------------------------------------------------------------------------


@pytest.fixture(params=["http", "stdio"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def agent(live_server, live_conn, transport):
    """`async with agent(name, queues) as client`: an MCP client session as a new token
    for agent `name` on `queues`, over the test's transport."""
    base, _ = live_server

    @contextlib.asynccontextmanager
    async def session(name: str, queues: list[str]):
        token = await make_token(live_conn, name, queues)
        async with open_client(transport, base, token) as client:
            yield client

    return session


async def make_token(db, name: str, queues: list[str]) -> str:
    _, secret = await Accounts(db).add_token(name, queues)
    return secret


@contextlib.asynccontextmanager
async def open_client(transport: str, base: str, token: str):
    if transport == "http":
        async with connected(base, token) as client:
            yield client
        return
    env = {**os.environ, "SWITCHBOARD_URL": base, "SWITCHBOARD_TOKEN": token}
    env.pop("DATABASE_URL", None)  # the agent's machine has a URL and a token, not the database
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "dashboard.cli", "mcp"], env=env, cwd=ROOT
    )
    async with Client(params) as client:
        yield client


async def call(client: Client, tool: str, **arguments) -> dict:
    """A tool call that must succeed; its structured result (which the SDK's client has
    checked against the tool's output schema)."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, status: int, **arguments) -> str:
    """A tool call that must be a tool error with this problem status; its text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    assert result.structured_content["status"] == status, result.structured_content
    text = result.content[0].text
    assert result.structured_content["detail"] in text
    return text


# -- the tools -----------------------------------------------------------------------------------


async def test_the_tools_are_listed_with_schemas_and_descriptions_for_a_model(agent):
    async with agent(unique("lister"), [unique("q")]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.input_schema["type"] == "object" and tool.output_schema["type"] == "object"
        assert "heartbeat" in tools["claim"].description and "at least once" in tools["claim"].description
        assert "call claim again later" in tools["claim"].description
        assert "superseded" in tools["complete"].description
        assert tools["heartbeat"].input_schema["required"] == ["id", "lease"]
        assert "lease" in client.instructions and "idempotent" in client.instructions


async def test_a_scripted_agent_drains_a_queue_through_claim_heartbeat_and_complete(
    agent, live_store, live_conn
):
    queue, name = unique("drain"), unique("drainer")
    ids = [(await enqueue(live_store, queue, f"job {i}", payload={"n": i})).id for i in range(4)]
    done = []
    async with agent(name, [queue]) as client:
        while True:
            claimed = (await call(client, "claim", queues=[queue], ttl=30))["todo"]
            if claimed is None:
                break
            assert claimed["owner"] == name and claimed["state"] == "claimed"
            beat = await call(client, "heartbeat", id=claimed["id"], lease=claimed["lease"], ttl=120)
            assert beat["lease_expires_at"] > claimed["lease_expires_at"]
            finished = await call(
                client,
                "complete",
                id=claimed["id"],
                lease=claimed["lease"],
                result={"doubled": claimed["payload"]["n"] * 2},
            )
            assert finished["state"] == "done" and finished["lease"] is None
            done.append(claimed["id"])
        empty = await client.call_tool("claim", {"queues": [queue], "wait": 0})
        assert "call claim again later" in empty.content[0].text.lower()
    assert done == ids  # oldest first, each once
    for i, todo_id in enumerate(ids):
        todo = await todo_row(live_conn, todo_id)
        assert (todo.state, todo.owner, todo.result) == ("done", name, {"doubled": 2 * i})
        steps = await history(live_conn, todo_id)
        assert [(s.to_state, s.actor_kind, s.actor) for s in steps[1:]] == [
            ("claimed", "agent", name),  # the heartbeat between writes no row
            ("done", "agent", name),
        ]


async def test_a_late_completion_after_the_lease_lapsed_is_a_fencing_conflict_that_says_what_to_do(
    agent, live_store, live_conn
):
    queue, slow, fast = unique("fence"), unique("slow"), unique("fast")
    todo = await enqueue(live_store, queue, "fenced")
    async with agent(slow, [queue]) as slow_client, agent(fast, [queue]) as fast_client:
        mine = (await call(slow_client, "claim", queues=[queue], ttl=30))["todo"]
        await expire_lease(live_conn, todo.id)
        await live_store.reap()  # or the live server's reaper, whichever comes first
        await eventually(lambda: todo_row(live_conn, todo.id), lambda t: t.state == "pending", 5)
        await make_retry_due(live_conn, todo.id)
        theirs = (await call(fast_client, "claim", id=todo.id, ttl=30))["todo"]
        assert_new_token(theirs["lease"], mine["lease"])

        text = await refused(
            slow_client, "complete", 409, id=todo.id, lease=mine["lease"], result={"late": 1}
        )
        assert f"claimed by {fast}" in text
        assert "superseded" in text and "do not retry" in text and "claim" in text
        await refused(slow_client, "heartbeat", 409, id=todo.id, lease=mine["lease"])

        stored = await todo_row(live_conn, todo.id)
        assert (stored.state, stored.owner, stored.result) == ("claimed", fast, None)
        await call(fast_client, "complete", id=todo.id, lease=theirs["lease"], result={"on": "time"})
    assert (await todo_row(live_conn, todo.id)).result == {"on": "time"}


async def test_a_token_for_another_queue_is_refused_and_changes_nothing(agent, live_store, live_conn):
    mine, other = unique("mine"), unique("other")
    elsewhere = await enqueue(live_store, other, "not yours")
    async with agent(unique("scoped"), [mine]) as client:
        assert "may not use queue" in await refused(client, "claim", 403, queues=[other])
        await refused(client, "create_for", 403, queue=other, title="sneak")
        await refused(client, "list_todos", 403, queue=other)
        await refused(client, "get_todo", 404, id=elsewhere.id)
        await refused(client, "claim", 404, id=elsewhere.id)
        assert (await call(client, "list_todos"))["items"] == []
    assert (await todo_row(live_conn, elsewhere.id)).state == "pending"
    assert await live_conn.fetchval("SELECT count(*) FROM todos WHERE queue = $1", other) == 1


async def test_create_for_with_a_held_key_returns_the_live_todo_and_says_so(agent, live_conn):
    queue, name = unique("create"), unique("creator")
    async with agent(name, [queue]) as client:
        first = await call(
            client,
            "create_for",
            queue=queue,
            title="approve refund #42",
            assignee="alice",
            payload={"order": 42, "amount": 19.5},
            idempotency_key="refund-42",
            priority=3,
        )
        assert first["created"] is True
        assert (first["todo"]["assignee"], first["todo"]["priority"]) == ("alice", 3)
        again = await client.call_tool(
            "create_for", {"queue": queue, "title": "again", "idempotency_key": "refund-42"}
        )
        assert not again.is_error
        assert again.structured_content["created"] is False
        assert again.structured_content["todo"]["id"] == first["todo"]["id"]
        assert "Nothing new was created" in again.content[0].text and "refund-42" in again.content[0].text
    todo = await todo_row(live_conn, first["todo"]["id"])
    assert (todo.title, todo.dedupe_hits, todo.payload) == (
        "approve refund #42",
        1,
        {"order": 42, "amount": 19.5},
    )
    assert (await history(live_conn, todo.id))[0][2:4] == ("agent", name)


async def test_get_todo_fail_release_and_wait_for(agent, live_store, live_conn):
    queue, name = unique("life"), unique("lifer")
    todo = await enqueue(live_store, queue, "flaky", max_attempts=2)
    async with agent(name, [queue]) as client:
        held = (await call(client, "claim", id=todo.id))["todo"]
        released = await call(client, "release", id=todo.id, lease=held["lease"])
        assert released["state"] == "pending" and released["owner"] is None
        held = (await call(client, "claim", id=todo.id))["todo"]
        failed = await client.call_tool("fail", {"id": todo.id, "lease": held["lease"], "error": "SMTP 451"})
        assert failed.structured_content["will_retry"] is False
        assert failed.structured_content["dead_lettered"] is True  # two attempts: release counted one
        assert "dead-lettered" in failed.content[0].text

        waited = await call(client, "wait_for", id=todo.id, wait=5)
        assert waited["finished"] is True and waited["todo"]["last_error"] == "SMTP 451"
        detail = await call(client, "get_todo", id=todo.id)
        steps = [(h["to_state"], h["actor"]) for h in detail["history"]]
        assert steps == [
            ("pending", "producer"),
            ("claimed", name),
            ("pending", name),
            ("claimed", name),
            ("failed", name),
        ]

        pending = await enqueue(live_store, queue, "nobody does it")
        waited = await client.call_tool("wait_for", {"id": pending.id, "wait": 0.3})
        assert waited.structured_content["finished"] is False
        assert "still pending" in waited.content[0].text

        asked = await enqueue(live_store, queue, "approve refund #7")
        waiting = asyncio.create_task(call(client, "wait_for", id=asked.id, wait=30))
        watched = "SELECT watched FROM todos WHERE id = $1"
        await eventually(lambda: live_conn.fetchval(watched, asked.id), bool, 10)  # it waits now
        held = await live_store.claim(asked.id, "alice", 60)
        await live_store.complete(asked.id, "alice", held.lease_token, {"approved": True})
        completed = time.monotonic()
        answer = await waiting
        assert (answer["finished"], answer["todo"]["result"]) == (True, {"approved": True})
        assert time.monotonic() - completed < 3  # woken by the completion, not the 30 s


async def test_bad_arguments_are_tool_errors_naming_the_argument(agent):
    queue = unique("bad")
    async with agent(unique("sloppy"), [queue]) as client:
        assert "lease" in await refused(client, "complete", 422, id="td_x", lease="one")
        assert "ttl" in await refused(client, "claim", 422, queues=[queue], ttl=0)
        assert "colour" in await refused(client, "list_todos", 422, colour="red")
        assert "asignee" in await refused(client, "create_for", 422, queue=queue, title="t", asignee="bob")
        await refused(client, "claim", 422)  # neither queues nor id
        await refused(client, "complete", 404, id="td_nothing", lease=1)


async def test_a_token_revoked_mid_session_is_refused_at_its_next_call(live_server, live_conn, transport):
    base, _ = live_server
    token_id, secret = await Accounts(live_conn).add_token(unique("revoked"), [unique("q")])
    async with open_client(transport, base, secret) as client:
        await call(client, "list_todos")
        await Accounts(live_conn).revoke_token(token_id, actor="test")
        if transport == "http":  # the SDK's client raises on the HTTP 401
            with pytest.raises(MCPError):
                await eventually(lambda: client.call_tool("list_todos", {}), lambda _: False, 5)
        else:  # the relay says why, as a tool error
            result = await eventually(lambda: client.call_tool("list_todos", {}), lambda r: r.is_error, 5)
            assert "the token is unknown or revoked" in result.content[0].text


# -- HTTP only ---------------------------------------------------------------------------------------


async def test_mcp_over_http_without_a_valid_token_is_401(live_server):
    base, _ = live_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    async with httpx.AsyncClient(base_url=base) as http:
        for headers in ({}, {"Authorization": "Bearer sbt_not-a-token"}, {"Authorization": "Basic eDp5"}):
            response = await http.post("/mcp", json=hello, headers={**accept, **headers})
            assert response.status_code == 401, response.text
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.json()["status"] == 401


async def test_switchboard_mcp_without_a_good_token_says_so_and_exits(live_server, tmp_path):
    base, _ = live_server
    env = {**os.environ, "SWITCHBOARD_URL": base, "SWITCHBOARD_TOKEN": "sbt_wrong"}
    log = tmp_path / "mcp.log"
    proc = spawn(["-m", "dashboard.cli", "mcp"], env, log)
    assert proc.wait(30) == 2
    assert (
        f"switchboard at {base}/mcp did not take the call: the token is unknown or revoked" in log.read_text()
    )


async def test_switchboard_mcp_outlives_a_server_restart(live_server, live_conn, live_store, tmp_path):
    """/mcp keeps no session: calls fail while the server is away, and work again once it is back."""
    _, dsn = live_server
    queue = unique("restart")
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn}
    server = start_serving(["serve", "--port", str(port)], env, tmp_path / "first.log")
    try:
        token = await make_token(live_conn, unique("patient"), [queue])
        async with open_client("stdio", f"http://127.0.0.1:{port}", token) as client:
            await call(client, "list_todos")
            stop(server)
            away = await client.call_tool("list_todos", {})
            assert away.is_error and "did not take the call" in away.content[0].text
            server = start_serving(["serve", "--port", str(port)], env, tmp_path / "second.log")
            todo = await enqueue(live_store, queue, "after the restart")
            assert (await call(client, "claim", queues=[queue]))["todo"]["id"] == todo.id
    finally:
        stop(server)


async def test_sigterm_ends_a_waiting_claim_with_no_todo_and_the_server_exits(
    live_server, live_conn, tmp_path
):
    _, dsn = live_server
    queue, port = unique("stopping"), free_port()
    server = start_serving(
        ["serve", "--port", str(port)], {**os.environ, "DATABASE_URL": dsn}, tmp_path / "s.log"
    )
    try:
        token = await make_token(live_conn, unique("waiter"), [queue])
        async with connected(f"http://127.0.0.1:{port}", token) as client:
            await client.list_tools()
            waiting = asyncio.create_task(call(client, "claim", queues=[queue], wait=60))
            await asyncio.sleep(0.5)  # for the claim to arrive: it shows nowhere while it waits
            server.send_signal(signal.SIGTERM)
            assert (await asyncio.wait_for(waiting, STOP_WITHIN)) == {"todo": None}
        assert await asyncio.to_thread(server.wait, STOP_WITHIN) == 0
    finally:
        stop(server)


# -- a crashed agent ---------------------------------------------------------------------------------

# An agent process driven through MCP: claims one todo with a short lease, says which, then
# hangs holding it, until it is killed.
HANGING_AGENT = """
import asyncio, json, sys
from dashboard.accounts import Accounts
from dashboard.mcp_proxy import connected

async def main(url, token, queue):
    async with connected(url, token) as client:
        result = await client.call_tool("claim", {"queues": [queue], "ttl": 2})
        print(json.dumps(result.structured_content["todo"]), flush=True)
        await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_a_sigkilled_agent_loses_its_todo_to_another_and_history_shows_both(
    live_server, live_store, live_conn, tmp_path, transport
):
    base, _ = live_server
    queue, doomed, survivor = unique("crash"), unique("doomed"), unique("survivor")
    todo = await enqueue(live_store, queue, "survive a crash")
    log = tmp_path / "agent.log"
    token = await make_token(live_conn, doomed, [queue])
    proc = spawn(["-c", HANGING_AGENT, base, token, queue], dict(os.environ), log)
    try:
        await eventually(lambda: _read(log), lambda text: text.endswith("\n") or proc.poll() is not None, 30)
        held = json.loads(log.read_text())
        assert (held["id"], held["owner"]) == (todo.id, doomed)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop(proc)

    reaped = await eventually(lambda: todo_row(live_conn, todo.id), lambda t: t.state == "pending", 15)
    assert reaped.last_error == f"lease expired (owner {doomed})"
    await make_retry_due(live_conn, todo.id)
    async with open_client(transport, base, await make_token(live_conn, survivor, [queue])) as client:
        again = (await call(client, "claim", queues=[queue], wait=10))["todo"]
        assert (again["id"], again["attempt"]) == (todo.id, 2)
        await call(client, "complete", id=todo.id, lease=again["lease"], result={"survived": True})

    # (the reaper may also have recorded the retry coming due: not a change of hands)
    steps = [s for s in await history(live_conn, todo.id) if s.note != "retry due"]
    assert [(s.to_state, s.actor, s.attempt, s.note) for s in steps[1:]] == [
        ("claimed", doomed, 1, "claimed"),
        ("pending", "reaper", 1, f"lease expired (owner {doomed})"),
        ("claimed", survivor, 2, "claimed"),
        ("done", survivor, 2, "completed"),
    ]


async def _read(path) -> str:
    return path.read_text() if path.exists() else ""
