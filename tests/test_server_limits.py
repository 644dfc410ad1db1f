"""Server limits, against a real `switchboard serve` on a database of this module's own.

A client that never completes its request head (idle, or half a header, on a fresh or a
keep-alive connection) is closed at SWITCHBOARD_HEADER_TIMEOUT; a response that runs long
(a long-poll claim, an SSE stream) is not. Beyond SWITCHBOARD_MAX_CONNECTIONS a request is
answered 503, and service comes back when connections close. X-Forwarded-For counts only
from SWITCHBOARD_TRUSTED_PROXIES, which may not trust every address. Bad settings are usage
errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
import uvicorn

from dashboard.config import Settings
from dashboard.store import Store
from dashboard.web.server import uvicorn_config
from tests.conftest import ROOT, connected, scratch_database
from tests.factories import agent_token, enqueue, unique
from tests.processes import eventually, free_port, start_serving, stop
from tests.test_longpoll import next_event, sse_events

HEADER_TIMEOUT = 1.0  # seconds: short, so that waiting it out is cheap
CUT_WITHIN = HEADER_TIMEOUT + 2.0
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: "
FULL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"


class Served(NamedTuple):
    base: str
    port: int
    dsn: str
    log: Path


@pytest.fixture(scope="module")
def module_db(server_dsn, template_db):
    with scratch_database(server_dsn, template_db) as url:
        yield url


@contextlib.contextmanager
def serving(module_db: str, log: Path, **settings: str):
    """`switchboard serve` on a free port with `settings` in its environment; stopped by pid."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": module_db, "PYTHONUNBUFFERED": "1", **settings}
    proc = start_serving(["serve", "--port", str(port)], env, log)
    try:
        yield Served(f"http://127.0.0.1:{port}", port, module_db, log)
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def impatient(module_db, tmp_path_factory):
    """A server that waits HEADER_TIMEOUT seconds for a request head."""
    log = tmp_path_factory.mktemp("impatient") / "serve.log"
    with serving(module_db, log, SWITCHBOARD_HEADER_TIMEOUT=str(HEADER_TIMEOUT)) as served:
        yield served


async def closed_after(reader: asyncio.StreamReader, since: float) -> float:
    """Seconds from `since` until the server closes the connection; it must send nothing."""
    loop = asyncio.get_running_loop()
    try:
        data = await asyncio.wait_for(reader.read(1024), since + CUT_WITHIN - loop.time())
    except TimeoutError:
        raise AssertionError(f"still open {CUT_WITHIN}s later") from None
    except ConnectionResetError:
        data = b""
    assert data == b"", f"the server answered {data!r}"
    return loop.time() - since


async def read_response(reader: asyncio.StreamReader) -> int:
    """The status of one response with a Content-Length, read to its end."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")
    length = next(int(line.split(":")[1]) for line in head if line.lower().startswith("content-length:"))
    await reader.readexactly(length)
    return int(head[0].split()[1])


@contextlib.asynccontextmanager
async def raw_connections(port: int, n: int):
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    try:
        yield opened
    finally:
        for _, writer in opened:
            writer.close()


async def agent(dsn: str, queue: str) -> dict:
    async with connected(dsn) as conn:
        return await agent_token(conn, "slowpoke", [queue])


def claim(http: httpx.AsyncClient, headers: dict, queue: str, wait: float):
    return http.post("/api/v1/claims", headers=headers, json={"queues": [queue], "ttl": 30, "wait": wait})


# -- the header timeout ------------------------------------------------------------------


async def test_a_hundred_clients_sending_half_a_header_are_all_closed_at_the_header_timeout(impatient):
    async with raw_connections(impatient.port, 100) as opened:
        started = asyncio.get_running_loop().time()
        for _, writer in opened:
            writer.write(HALF_HEAD)
        await asyncio.gather(*(writer.drain() for _, writer in opened))
        waited = await asyncio.gather(*(closed_after(reader, started) for reader, _ in opened))
    # not before the timeout: it is the header timer that closes them, not a parse error
    assert min(waited) >= HEADER_TIMEOUT - 0.5, sorted(waited)[:5]


async def test_a_client_that_connects_and_sends_nothing_is_closed_at_the_header_timeout(impatient):
    async with raw_connections(impatient.port, 1) as [(reader, _)]:
        waited = await closed_after(reader, asyncio.get_running_loop().time())
    assert waited >= HEADER_TIMEOUT - 0.5


async def test_a_keep_alive_connection_is_closed_when_its_next_request_head_stops_halfway(impatient):
    async with raw_connections(impatient.port, 1) as [(reader, writer)]:
        writer.write(FULL_HEAD)  # keep-alive works: whole requests, one after another
        assert await read_response(reader) == 200
        writer.write(FULL_HEAD * 2)  # and pipelined
        assert [await read_response(reader), await read_response(reader)] == [200, 200]
        writer.write(HALF_HEAD)
        waited = await closed_after(reader, asyncio.get_running_loop().time())
    assert waited >= HEADER_TIMEOUT - 0.5


async def test_a_long_poll_claim_waiting_past_the_header_timeout_gets_its_answer(impatient):
    queue = unique("slow")
    headers = await agent(impatient.dsn, queue)
    async with httpx.AsyncClient(base_url=impatient.base, timeout=10) as http:
        started = time.monotonic()
        response = await claim(http, headers, queue, wait=3)
    assert response.status_code == 204, response.text
    assert time.monotonic() - started >= 2.9 > 2 * HEADER_TIMEOUT


async def test_an_sse_channel_stays_open_past_the_header_timeout_and_still_hints(impatient):
    queue = unique("sse")
    headers = await agent(impatient.dsn, queue)
    async with (
        httpx.AsyncClient(base_url=impatient.base, timeout=httpx.Timeout(5, read=10)) as http,
        http.stream("GET", "/api/v1/channels", headers=headers, params={"queues": queue}) as response,
    ):
        assert response.status_code == 200
        events = sse_events(response)
        assert (await next_event(events, 5))[0] == "resync"
        await asyncio.sleep(HEADER_TIMEOUT + 1.0)  # the point of the test: outlive the timeout
        async with connected(impatient.dsn) as conn:
            await enqueue(Store(conn), queue)
        assert (await next_event(events, 5))[0] == "hint"


# -- the connection limit ------------------------------------------------------------------


async def healthz_status(base: str) -> int:
    """GET /healthz on a connection of its own."""
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        return (await http.get("/healthz")).status_code


async def test_beyond_max_connections_a_request_gets_503_and_service_returns_when_they_close(
    module_db, tmp_path
):
    queue = unique("full")
    with serving(module_db, tmp_path / "serve.log", SWITCHBOARD_MAX_CONNECTIONS="5") as served:
        headers = await agent(served.dsn, queue)
        async with contextlib.AsyncExitStack() as streams:
            http = await streams.enter_async_context(httpx.AsyncClient(base_url=served.base, timeout=15))
            # Four SSE channels, one after the other: each is being served once its first
            # event arrives, so none races another for a slot.
            channels = []  # their readers: one dropped would close its stream
            for _ in range(4):
                stream = http.stream("GET", "/api/v1/channels", headers=headers, params={"queues": queue})
                response = await streams.enter_async_context(stream)
                assert response.status_code == 200
                channels.append(sse_events(response))
                assert (await next_event(channels[-1], 5))[0] == "resync"
            poll = asyncio.create_task(claim(http, headers, queue, wait=6))
            await asyncio.sleep(0.5)  # let the claim reach its wait: a waiting claim says nothing
            assert await healthz_status(served.base) == 503  # a sixth connection
            assert not poll.done(), "the long-poll should still be waiting"
            assert (await poll).status_code == 204, "the fifth connection was served, not refused"
        # the client is closed, and its five connections with it
        await eventually(lambda: healthz_status(served.base), lambda status: status == 200, within=5)
        assert "Exceeded concurrency limit" in served.log.read_text()


# -- proxy headers ---------------------------------------------------------------------------


async def client_address(scope, receive, send) -> None:
    """An app that answers with the client address it was given."""
    if scope["type"] == "lifespan":  # uvicorn_config asks for one
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = scope["client"][0].encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def uvicorn_as_configured(limits: Settings):
    """`client_address` under uvicorn as `switchboard serve` configures it; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn_config(client_address, "127.0.0.1", port, limits))
    running = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not running.done(), "uvicorn did not start"
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await running


@pytest.mark.parametrize(
    ("trusted", "seen"),
    [("127.0.0.1", "203.0.113.9"), ("10.0.0.1", "127.0.0.1"), ("127.0.0.0/8", "203.0.113.9")],
)
async def test_x_forwarded_for_counts_only_from_a_trusted_proxy(monkeypatch, trusted, seen):
    monkeypatch.setenv("SWITCHBOARD_TRUSTED_PROXIES", trusted)
    async with (
        uvicorn_as_configured(Settings.from_environ()) as base,
        httpx.AsyncClient(base_url=base, timeout=5) as http,
    ):
        response = await http.get("/", headers={"X-Forwarded-For": "203.0.113.9"})
    assert response.text == seen


def test_the_server_logs_the_proxies_it_trusts(module_db, tmp_path):
    trusted = "SWITCHBOARD_TRUSTED_PROXIES"
    with serving(module_db, tmp_path / "serve.log", **{trusted: "10.0.0.1, 192.168.0.0/16"}) as served:
        assert "X-Forwarded-Proto trusted from: 10.0.0.1, 192.168.0.0/16" in served.log.read_text()


def test_the_server_runs_on_uvloop(impatient):
    """`serve` makes its own event loop (uvicorn would pick uvloop only if it made it); the
    line that says the server is up names the loop it found running."""
    assert "event loop: uvloop)" in impatient.log.read_text()


# -- settings ----------------------------------------------------------------------------------


def switchboard_serve(env: dict[str, str], **popen) -> subprocess.CompletedProcess:
    """`switchboard serve` that is expected to refuse to start: its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "dashboard.cli", "serve"],
        env={**os.environ, "PORT": str(free_port()), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        **popen,
    )


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SWITCHBOARD_HEADER_TIMEOUT", "soon", "'soon' is not a number of seconds"),
        ("SWITCHBOARD_HEADER_TIMEOUT", "0", "must be above 0"),
        ("SWITCHBOARD_KEEPALIVE", "nan", "must be above 0"),
        ("SWITCHBOARD_MAX_CONNECTIONS", "2.5", "'2.5' is not a whole number of connections"),
        ("SWITCHBOARD_TRUSTED_PROXIES", "10.0.0.1,10.0.0.l", "'10.0.0.l' is not an IP address or network"),
        ("SWITCHBOARD_TRUSTED_PROXIES", "10.0.0.1/8", "has host bits set"),
        # every address trusted: any client could name its own and escape the per-address limits
        ("SWITCHBOARD_TRUSTED_PROXIES", "*", "'*' would let any client choose its own address"),
        ("SWITCHBOARD_TRUSTED_PROXIES", "10.0.0.1, 0.0.0.0/0", "covers every IPv4 address"),
        ("SWITCHBOARD_TRUSTED_PROXIES", "::/0", "covers every IPv6 address"),
        ("SWITCHBOARD_TRUSTED_PROXIES", "0.0.0.0/1,128.0.0.0/1", "covers every IPv4 address"),
    ],
)
def test_a_bad_setting_is_a_usage_error_that_names_it(module_db, name, value, says):
    done = switchboard_serve({"DATABASE_URL": module_db, name: value})
    assert done.returncode == 2, done.stderr  # as for a bad PORT
    assert f"switchboard: {name}: " in done.stderr and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_same_exit_status_as_a_bad_port(module_db):
    done = switchboard_serve({"DATABASE_URL": module_db, "PORT": "eighty"})
    assert done.returncode == 2


def limit_files(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_more_connections_than_the_hard_open_file_limit_allows_is_a_usage_error(module_db):
    done = switchboard_serve(
        {"DATABASE_URL": module_db, "SWITCHBOARD_MAX_CONNECTIONS": "1000"}, preexec_fn=limit_files(256, 256)
    )
    assert done.returncode == 2, done.stderr
    assert "1000 connections need about 1064 open files" in done.stderr
    assert "ask for at most 192" in done.stderr


FITTED = (
    "import resource; from dashboard.config import Settings; from dashboard.web.server import fit_file_limit;"
    "print(fit_file_limit(Settings()).max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
)


def test_the_soft_open_file_limit_is_raised_for_the_default_connections_or_they_are_fewer():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1064:
        pytest.skip(f"the hard open-file limit here is {hard}")

    def fitted(soft: int, hard: int) -> str:
        python = [sys.executable, "-c", FITTED]
        run = subprocess.run(
            python, cwd=ROOT, capture_output=True, text=True, preexec_fn=limit_files(soft, hard)
        )
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert fitted(256, hard) == "1000 1064"  # raised toward the hard limit
    assert fitted(256, 256) == "192 256"  # the hard limit holds: fewer connections
