"""Every stream ends with its credential, and with its client; long requests are bounded per
credential (issue 25, items 5, 6 and 10), against two real `switchboard serve` processes on
one database.

The streams: GET /mcp (the MCP SDK's standalone event stream), an agent's channel
(/api/v1/channels) and a page's /events. Each must close within a second of its token's
revocation, or of its session's end (logout, a new password, the operator's removal,
expiry), whichever process ended it. The long requests (waiting claims and waits, over HTTP
and as MCP tools, and the streams) must end when their client goes: seen from outside as
the per-token bound freeing up, since past SWITCHBOARD_MAX_WAITS_PER_TOKEN (here 3) a
token's next one is refused with 429, and a request still held would keep it refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple

import httpx
import pytest

from dashboard.accounts import Accounts
from dashboard.config import Settings
from dashboard.errors import InvalidInput
from dashboard.store import Store
from dashboard.web.long_requests import SETTING
from tests.conftest import ROOT, connected, scratch_database
from tests.factories import enqueue, new_todo, unique
from tests.processes import eventually
from tests.test_server_limits import Served, serving

PER_TOKEN = 3
WITHIN = 1.0  # seconds from the credential's end to the stream's
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-06-18",
}


class Servers(NamedTuple):
    a: Served
    b: Served  # a second process on the same database


@pytest.fixture(scope="module")
def module_db(server_dsn, template_db):
    with scratch_database(server_dsn, template_db) as url:
        yield url


@pytest.fixture(scope="module")
def servers(module_db, tmp_path_factory):
    logs = tmp_path_factory.mktemp("streams")
    bound = {SETTING: str(PER_TOKEN)}
    with serving(module_db, logs / "a.log", **bound) as a, serving(module_db, logs / "b.log", **bound) as b:
        yield Servers(a, b)


@pytest.fixture
async def db(servers):
    async with connected(servers.a.dsn) as conn:
        yield conn


@pytest.fixture
async def http():
    """A client for either server (full URLs), with a connection per request it has open."""
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(10, read=90), limits=httpx.Limits(max_connections=50)
    ) as c:
        yield c


class Agent(NamedTuple):
    token_id: str
    headers: dict
    queue: str


async def new_agent(db, prefix: str = "agent") -> Agent:
    queue = unique("q")
    token_id, secret = await Accounts(db).add_token(unique(prefix), [queue])
    return Agent(token_id, {"Authorization": f"Bearer {secret}"}, queue)


async def switchboard(dsn: str, *args: str) -> str:
    """`switchboard ARGS` on the database, to its end; its output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dashboard.cli",
        *args,
        env={**os.environ, "DATABASE_URL": dsn},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def logged_in(http: httpx.AsyncClient, base: str, db) -> tuple[str, str]:
    """A new operator logged in on `http` (its cookies serve every server on this host):
    their CSRF token and name."""
    name = unique("op")
    password = await Accounts(db).add_operator(name, "operator")
    http.cookies.clear()
    await http.get(f"{base}/login")
    response = await post_form(
        http, f"{base}/login", http.cookies["csrftoken"], name=name, password=password, follow=False
    )
    assert response.status_code == 303, response.text
    return http.cookies["csrftoken"], name


async def post_form(http: httpx.AsyncClient, url: str, csrf: str, follow: bool = False, **fields):
    return await http.post(url, data={**fields, "_csrf_token": csrf}, follow_redirects=follow)


# -- the streams --------------------------------------------------------------------------------


def mcp_stream(http: httpx.AsyncClient, base: str, agent: Agent):
    return http.stream("GET", f"{base}/mcp", headers={**agent.headers, "Accept": "text/event-stream"})


def channel(http: httpx.AsyncClient, base: str, agent: Agent):
    return http.stream(
        "GET", f"{base}/api/v1/channels", headers=agent.headers, params={"queues": agent.queue}
    )


def page_events(http: httpx.AsyncClient, base: str):
    return http.stream("GET", f"{base}/events")


@contextlib.asynccontextmanager
async def watched(stream) -> AsyncIterator[asyncio.Task]:
    """An open stream (200) and a task that ends with it, giving the moment it ended."""
    async with stream as response:
        assert response.status_code == 200, await response.aread()

        async def to_the_end() -> float:
            with contextlib.suppress(httpx.HTTPError):
                async for _ in response.aiter_raw():
                    pass
            return time.monotonic()

        end = asyncio.create_task(to_the_end())
        await asyncio.sleep(0.3)  # served, and waiting: nothing has happened yet
        assert not end.done(), "the stream ended before its credential did"
        try:
            yield end
        finally:
            end.cancel()


async def ends_within(end: asyncio.Task, since: float) -> float:
    """Seconds from `since` to the stream's end (which must come within a few seconds)."""
    try:
        ended = await asyncio.wait_for(end, 5 + WITHIN)
    except TimeoutError:
        raise AssertionError("the stream is still open seconds after its credential ended") from None
    return ended - since


# -- 5: a revoked token's streams end, in every process ------------------------------------------


async def test_a_get_mcp_stream_ends_within_a_second_of_switchboard_token_revoke(servers, db, http):
    agent = await new_agent(db)
    async with watched(mcp_stream(http, servers.a.base, agent)) as end:
        await switchboard(servers.a.dsn, "token", "revoke", agent.token_id)
        assert await ends_within(end, time.monotonic()) < WITHIN


@pytest.mark.parametrize("open_stream", [mcp_stream, channel], ids=["GET /mcp", "channel"])
async def test_a_token_revoked_on_one_server_ends_its_streams_on_the_other_within_a_second(
    servers, db, http, open_stream
):
    agent = await new_agent(db)
    web, _ = await logged_in(http, servers.a.base, db)
    async with watched(open_stream(http, servers.b.base, agent)) as end:
        revoked = await post_form(http, f"{servers.a.base}/tokens/{agent.token_id}/revoke", web)
        assert revoked.status_code == 303, revoked.text
        assert await ends_within(end, time.monotonic()) < WITHIN


# -- 5 and 10: a session's pages stop hearing of the queues when it ends ---------------------------


async def test_a_pages_events_hear_of_new_work_until_logout_on_another_server_ends_them(servers, db, http):
    csrf, _ = await logged_in(http, servers.a.base, db)
    async with page_events(http, servers.b.base) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        queue = unique("seen")
        await enqueue(Store(db), queue)
        assert await line_naming(lines, queue), "the page did not hear of the new work"
        await post_form(http, f"{servers.a.base}/logout", csrf)
        logged_out = time.monotonic()
        rest = asyncio.create_task(read_rest(lines))
        await enqueue(Store(db), unique("unseen"))
        heard, ended = await asyncio.wait_for(rest, 5)
    assert ended - logged_out < WITHIN
    assert "unseen" not in heard, "the stream went on delivering queue activity after logout"


async def line_naming(lines: AsyncIterator[str], queue: str) -> bool:
    async def find() -> bool:
        async for line in lines:
            if queue in line:
                return True
        return False

    return await asyncio.wait_for(find(), 5)


async def read_rest(lines: AsyncIterator[str]) -> tuple[str, float]:
    """What the stream still sends, and when it ends."""
    heard = []
    with contextlib.suppress(httpx.HTTPError):
        async for line in lines:
            heard.append(line)
    return "\n".join(heard), time.monotonic()


@pytest.mark.parametrize("how", ["switchboard operator passwd", "switchboard operator remove"])
async def test_a_pages_events_end_within_a_second_of_the_cli_ending_the_operators_sessions(
    servers, db, http, how
):
    _, name = await logged_in(http, servers.a.base, db)
    async with watched(page_events(http, servers.a.base)) as end:
        await switchboard(servers.a.dsn, *how.split()[1:], name)
        assert await ends_within(end, time.monotonic()) < WITHIN


async def test_a_pages_events_end_when_the_session_expires(servers, db, http):
    _, name = await logged_in(http, servers.a.base, db)
    expiry = 2.0
    await db.execute(
        "UPDATE operator_sessions SET expires_at = now() + make_interval(secs => $2) WHERE operator = $1",
        name,
        expiry,
    )
    began = time.monotonic()
    async with watched(page_events(http, servers.a.base)) as end:
        assert expiry - 0.5 <= await ends_within(end, began) < expiry + WITHIN


# -- 6: at most PER_TOKEN long requests per token (per session for /events), per process --------


def claim(http: httpx.AsyncClient, base: str, agent: Agent, wait: float = 30):
    body = {"queues": [agent.queue], "ttl": 30, "wait": wait}
    return http.post(f"{base}/api/v1/claims", headers=agent.headers, json=body)


def wait_for(http: httpx.AsyncClient, base: str, agent: Agent, todo_id: str, wait: float = 30):
    return http.get(f"{base}/api/v1/todos/{todo_id}", headers=agent.headers, params={"wait": wait})


def mcp_tool(http: httpx.AsyncClient, base: str, agent: Agent, name: str, **arguments):
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    return http.post(f"{base}/mcp", headers={**agent.headers, **MCP_HEADERS}, json=body)


def tool_status(response: httpx.Response) -> int:
    """A tool call's HTTP 200 carries its own status: the problem's when it was refused."""
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    return result["structuredContent"]["status"] if result.get("isError") else 200


async def status_of(request: Awaitable[httpx.Response]) -> int:
    return (await request).status_code


async def stream_status(stream) -> int:
    async with stream as response:
        return response.status_code


@contextlib.asynccontextmanager
async def held(requests: list[Callable[[], Awaitable[object]]]) -> AsyncIterator[list[asyncio.Task]]:
    """Each of `requests` under way (a stream open and read) until the block ends."""
    tasks = []
    for start in requests:
        tasks.append(asyncio.create_task(start()))
        await asyncio.sleep(0.2)  # admitted one at a time, in order
    assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_through(stream) -> None:
    async with stream as response:
        assert response.status_code == 200, await response.aread()
        async for _ in response.aiter_raw():
            pass


async def scheduled(db, queue: str) -> str:
    """A todo in `queue` that is not ready for an hour: a claim on the queue waits, and so
    does a wait for it."""
    return (await Store(db).create(new_todo(queue, "later", delay=3600))).todo.id


async def drop(requests: list[asyncio.Task]) -> float:
    """The clients of `requests` go (their connections closed mid-request): when."""
    for request in requests:
        request.cancel()
    await asyncio.gather(*requests, return_exceptions=True)
    return time.monotonic()


async def test_past_the_bound_each_kind_of_long_request_is_429_and_short_ones_and_other_tokens_are_not(
    servers, db, http
):
    a = servers.a.base
    agent, other = await new_agent(db), await new_agent(db)
    todo_id = await scheduled(db, agent.queue)
    async with held(
        [
            lambda: claim(http, a, agent),
            lambda: read_through(channel(http, a, agent)),
            lambda: read_through(mcp_stream(http, a, agent)),
        ]
    ):
        refused = await claim(http, a, agent)
        assert refused.status_code == 429, refused.text
        assert refused.headers["Retry-After"] == "1"
        assert f"this token already has {PER_TOKEN} long requests" in refused.json()["detail"]
        assert SETTING in refused.json()["detail"]
        assert await status_of(wait_for(http, a, agent, todo_id)) == 429
        assert await stream_status(channel(http, a, agent)) == 429
        assert await stream_status(mcp_stream(http, a, agent)) == 429
        assert tool_status(await mcp_tool(http, a, agent, "wait_for", id=todo_id, wait=30)) == 429
        assert tool_status(await mcp_tool(http, a, agent, "claim", queues=[agent.queue], wait=30)) == 429
        # what does not wait is not bounded
        assert await status_of(claim(http, a, agent, wait=0)) == 204
        assert await status_of(wait_for(http, a, agent, todo_id, wait=0)) == 200
        assert tool_status(await mcp_tool(http, a, agent, "wait_for", id=todo_id, wait=0)) == 200
        # another token, and the same token on another process (counted per process)
        assert await status_of(claim(http, a, other, wait=0.5)) == 204
        assert await status_of(claim(http, servers.b.base, agent, wait=0.5)) == 204


async def test_past_the_bound_a_sessions_next_page_stream_is_429_and_another_sessions_is_not(
    servers, db, http
):
    base = servers.a.base
    await logged_in(http, base, db)
    async with held([lambda: read_through(page_events(http, base)) for _ in range(PER_TOKEN)]):
        assert await stream_status(page_events(http, base)) == 429
        async with httpx.AsyncClient(timeout=10) as other:
            await logged_in(other, base, db)
            assert await stream_status(page_events(other, base)) == 200


# -- 6: waits and streams end when their client goes ---------------------------------------------

KINDS: dict[str, Callable[[httpx.AsyncClient, str, Agent, str], Awaitable[object]]] = {
    "claim wait": lambda http, base, agent, todo_id: claim(http, base, agent),
    "todo wait": lambda http, base, agent, todo_id: wait_for(http, base, agent, todo_id),
    "channel": lambda http, base, agent, todo_id: read_through(channel(http, base, agent)),
    "GET /mcp": lambda http, base, agent, todo_id: read_through(mcp_stream(http, base, agent)),
    "MCP wait_for": lambda http, base, agent, todo_id: mcp_tool(http, base, agent, "wait_for", id=todo_id),
    "MCP claim wait": lambda http, base, agent, todo_id: mcp_tool(
        http, base, agent, "claim", queues=[agent.queue], wait=30
    ),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_long_request_whose_client_went_frees_its_place_at_once(servers, db, http, kind):
    base, start = servers.a.base, KINDS[kind]
    agent = await new_agent(db)
    todo_id = await scheduled(db, agent.queue)
    async with held([lambda: start(http, base, agent, todo_id) for _ in range(PER_TOKEN)]) as requests:
        assert await status_of(claim(http, base, agent, wait=0.5)) == 429
        went = await drop(requests)
        await eventually(lambda: status_of(claim(http, base, agent, wait=0.1)), lambda s: s == 204, 5)
        freed = time.monotonic() - went
    print(f"{kind}: the bound freed up {freed:.2f} s after the clients went")
    assert freed < WITHIN


async def test_a_pages_events_whose_browser_went_free_the_sessions_place(servers, db, http):
    base = servers.a.base
    await logged_in(http, base, db)
    async with held([lambda: read_through(page_events(http, base)) for _ in range(PER_TOKEN)]) as requests:
        assert await stream_status(page_events(http, base)) == 429
        went = await drop(requests)
        await eventually(lambda: stream_status(page_events(http, base)), lambda s: s == 200, 5)
        freed = time.monotonic() - went
    assert freed < WITHIN


# -- the setting ----------------------------------------------------------------------------------


def test_the_bound_is_100_unless_set_and_a_bad_setting_is_refused_naming_it():
    assert Settings.from_environ({}).max_waits_per_token == 100
    assert Settings.from_environ({SETTING: "7"}).max_waits_per_token == 7
    for bad in ("0", "-1", "ten", "1.5"):
        with pytest.raises(InvalidInput, match=SETTING):
            Settings.from_environ({SETTING: bad})
