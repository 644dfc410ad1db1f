"""Long-poll claims and the notify channel, against a real `switchboard serve` subprocess.

The live server's one LISTEN connection wakes waiting claims and feeds the SSE channel.
Enqueues come from a separate database connection (as a producer's would). Waiting
claims re-check only every few seconds without a hint (POLL_FALLBACK), so "within a
second" below can only pass if the hint path works. Each test uses its own queues,
since the live server is shared by the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from dashboard.backoff import shorter_wait, spread_wait
from tests.factories import agent_token, enqueue, unique

API = "/api/v1"


@pytest.fixture
async def poller(live_conn) -> tuple[str, dict]:
    """A queue of the test's own on the live server, and a token of agent `poller` for it."""
    queue = unique("lp")
    return queue, await agent_token(live_conn, "poller", [queue])


def live_http(live_server, **kwargs) -> httpx.AsyncClient:
    """An HTTP client for the live server."""
    return httpx.AsyncClient(base_url=live_server[0], **{"timeout": 30, **kwargs})


def claims(http: httpx.AsyncClient, headers: dict, queue: str, *, wait: float, ttl: float = 60):
    """POST /claims on one queue, waiting up to `wait` seconds for work."""
    return http.post(f"{API}/claims", headers=headers, json={"queues": [queue], "ttl": ttl, "wait": wait})


@contextlib.asynccontextmanager
async def channel(live_server, headers: dict, queues: list[str]):
    """The open SSE response of GET /channels for `queues`."""
    async with (
        live_http(live_server, timeout=httpx.Timeout(10, read=30)) as http,
        http.stream(
            "GET", f"{API}/channels", headers=headers, params={"queues": ",".join(queues)}
        ) as response,
    ):
        yield response


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs from a text/event-stream body; comments are skipped."""
    event, data = None, []
    async for line in response.aiter_lines():
        if line == "":
            if event is not None or data:
                yield event or "message", "\n".join(data)
            event, data = None, []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


async def next_event(events: AsyncIterator[tuple[str, str]], within: float) -> tuple[str, str]:
    return await asyncio.wait_for(anext(events), within)


# -- long-poll claims --------------------------------------------------------------------


async def test_a_waiting_claim_returns_within_a_second_of_an_enqueue_from_another_connection(
    live_server, live_store, poller
):
    queue, headers = poller
    async with live_http(live_server) as http:
        started = time.monotonic()
        waiting = asyncio.create_task(claims(http, headers, queue, wait=10, ttl=30))
        await asyncio.sleep(0.5)  # let the claim find nothing and start waiting
        assert not waiting.done(), "the claim should still be waiting: nothing was enqueued yet"
        enqueued_at = time.monotonic()
        todo = await enqueue(live_store, queue, "wake up")
        response = await waiting
        latency = time.monotonic() - enqueued_at
    assert response.status_code == 200, response.text
    assert response.json()["id"] == todo.id and response.json()["owner"] == "poller"
    assert latency < 1.0, f"the claim came back {latency:.2f}s after the enqueue"
    assert enqueued_at - started >= 0.5


async def test_a_waiting_claim_answers_204_once_the_wait_is_over(live_server, poller):
    queue, headers = poller
    async with live_http(live_server) as http:
        started = time.monotonic()
        response = await claims(http, headers, queue, wait=2, ttl=30)
        elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert response.content == b""
    assert 1.9 <= elapsed < 4, elapsed


async def test_fifty_waiting_claims_share_fifty_enqueues_each_todo_claimed_exactly_once(
    live_server, live_conn, live_store
):
    queue = unique("herd")
    headers = await agent_token(live_conn, "herd", [queue])
    limits = httpx.Limits(max_connections=60, max_keepalive_connections=60)
    async with live_http(live_server, limits=limits) as http:
        waiting = [asyncio.create_task(claims(http, headers, queue, wait=15)) for _ in range(50)]
        await asyncio.sleep(1.0)  # let all fifty reach their wait
        assert not any(c.done() for c in waiting), "no claim should answer before work exists"
        created = [(await enqueue(live_store, queue, f"job {i}")).id for i in range(50)]
        responses = await asyncio.wait_for(asyncio.gather(*waiting), 14)
    refused = [r.text for r in responses if r.status_code != 200]
    assert not refused, refused
    claimed = [r.json()["id"] for r in responses]
    assert len(set(claimed)) == 50, "a todo went to more than one claimer"
    assert set(claimed) == set(created)
    rows = await live_conn.fetch("SELECT state::text, owner, attempt FROM todos WHERE queue = $1", queue)
    assert {tuple(r) for r in rows} == {("claimed", "herd", 1)} and len(rows) == 50
    claims_in_history = await live_conn.fetch(
        "SELECT todo_id, count(*) AS n FROM todo_history h JOIN todos t ON t.id = h.todo_id "
        "WHERE t.queue = $1 AND h.to_state = 'claimed' GROUP BY todo_id",
        queue,
    )
    assert len(claims_in_history) == 50 and all(r["n"] == 1 for r in claims_in_history)


# -- the notify channel ------------------------------------------------------------------


async def test_the_channel_hints_enqueues_in_its_queues_and_none_outside_them(
    live_server, live_conn, live_store
):
    a, b, outside = unique("cha"), unique("chb"), unique("chx")
    headers = await agent_token(live_conn, "listener", [a, b, outside])
    async with channel(live_server, headers, [a, b]) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
        assert (await next_event(events, 5))[0] == "resync"  # a fresh subscriber starts by claiming
        await enqueue(live_store, outside)
        await enqueue(live_store, a)
        kind, data = await next_event(events, 5)
        assert (kind, json.loads(data)) == ("hint", {"queue": a})
        await enqueue(live_store, outside)
        await enqueue(live_store, b)
        kind, data = await next_event(events, 5)
        assert (kind, json.loads(data)) == ("hint", {"queue": b}), "a hint for a queue outside the set"


async def test_the_channel_sends_resync_after_the_servers_listen_connection_is_killed(
    live_server, live_conn, live_store
):
    a = unique("rs")
    headers = await agent_token(live_conn, "listener", [a])
    async with channel(live_server, headers, [a]) as response:
        assert response.status_code == 200
        events = sse_events(response)
        assert (await next_event(events, 5))[0] == "resync"
        # The server's listener, by its application_name: only that backend goes; the
        # server's pool and our own connection stay.
        killed = await live_conn.fetch(
            "SELECT pid, pg_terminate_backend(pid) AS ok FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = 'switchboard listener'"
        )
        assert killed and all(r["ok"] for r in killed), "found no LISTEN connection to terminate"
        started = time.monotonic()
        kind, _ = await next_event(events, 15)
        assert kind == "resync", kind
        assert time.monotonic() - started < 10
        # the re-opened listener delivers hints again
        await enqueue(live_store, a)
        kind, data = await next_event(events, 5)
        assert (kind, json.loads(data)) == ("hint", {"queue": a})
    listeners = await live_conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> ALL($1::int[]) AND application_name = 'switchboard listener'",
        [r["pid"] for r in killed],
    )
    assert listeners >= 1, "the server did not re-open its LISTEN connection"


# -- the spread of waits' ends ---------------------------------------------------------------


def test_a_waits_end_is_spread_after_the_asked_wait_never_before_and_within_its_bound():
    """Long-polls that began together end at different moments (issue 24: 152 expiring in
    one second queued an ack 2.66 s), never earlier than asked and at most 10% (1 s) later."""
    for wait, bound in ((1.0, 0.1), (5.0, 0.5), (60.0, 1.0)):
        ends = [spread_wait(wait) for _ in range(2000)]
        assert all(wait <= end <= wait + bound for end in ends), wait
        assert max(ends) - min(ends) > 0.8 * bound, wait  # spread over the window, not a point
    asked = [shorter_wait(20.0) for _ in range(2000)]
    assert all(18.0 <= a <= 20.0 for a in asked) and max(asked) - min(asked) > 1.5


async def test_waiting_claims_that_began_together_end_apart_and_not_before_their_wait(live_server, poller):
    queue, headers = poller
    limits = httpx.Limits(max_connections=30, max_keepalive_connections=30)
    async with live_http(live_server, limits=limits) as http:

        async def timed() -> float:
            started = time.monotonic()
            response = await claims(http, headers, queue, wait=2)
            assert response.status_code == 204
            return time.monotonic() - started

        took = await asyncio.gather(*(timed() for _ in range(20)))
    assert min(took) >= 1.95, took
    assert max(took) - min(took) > 0.02, took  # a 0.2 s window: twenty ends are not one instant
