"""`switchboard mcp`: the MCP tools over stdio, for a local MCP client (an IDE, a desktop
assistant), relayed to a switchboard server's /mcp with the agent's token.

A relay rather than a second server: the tools, their schemas and their rules stay on the
server (dashboard/web/mcp.py), and the agent's machine holds a URL and a token, never
database credentials. Every tool list and call goes through the SDK's own client and comes
back as the server answered it.

Each call opens its own MCP client session, over one pool of HTTP connections: /mcp keeps
no session, and the SDK's client does not outlive a failed connection, so a call made
while the server is away is that call's tool error alone, and the next one, once the
server is back, goes through.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, CallToolRequestParams, CallToolResult, ListToolsResult, TextContent

from dashboard.errors import SwitchboardError
from dashboard.models import MAX_WAIT

log = logging.getLogger("switchboard.mcp")

PATH = "/mcp"  # where a web process serves the tools (dashboard/web/mcp.py), and the relay calls

# The longest call (a claim or wait_for that waits MAX_WAIT) answers within this, with room.
TIMEOUT = httpx2.Timeout(30.0, read=MAX_WAIT + 30.0)
T = TypeVar("T")


def endpoint(url: str) -> str:
    return url.rstrip("/") + PATH


def http_client(token: str, refusals: deque[str] | None = None) -> httpx2.AsyncClient:
    """HTTP connections as the token's agent. The SDK's client reports an HTTP refusal (a
    revoked token's 401) only as "Server returned an error response": the problem detail
    it came with goes to `refusals`."""

    async def remember(response: httpx2.Response) -> None:
        if refusals is not None and response.status_code >= 400:
            await response.aread()
            with contextlib.suppress(ValueError, KeyError, TypeError):
                refusals.append(response.json()["detail"])

    return httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT, event_hooks={"response": [remember]}
    )


@contextlib.asynccontextmanager
async def connected(url: str, token: str) -> AsyncIterator[Client]:
    """An MCP client session on the server's /mcp, as the token's agent (for scripts)."""
    async with http_client(token) as http, session(url, http) as client:
        yield client


def session(url: str, http: httpx2.AsyncClient) -> Client:
    return Client(streamable_http_client(endpoint(url), http_client=http))


class Relay:
    """The stdio side: a server whose tools are the remote's, one session per call."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.refusals: deque[str] = deque(maxlen=1)
        self.http = http_client(token, self.refusals)

    async def remote(self, action: Callable[[Client], Awaitable[T]]) -> T:
        """`action` on a new session; SwitchboardError saying why when it cannot be done."""
        self.refusals.clear()
        try:
            async with session(self.url, self.http) as client:
                return await action(client)
        except Exception as exc:  # refused over HTTP, or the server is away
            why = self.refusals[-1] if self.refusals else _reason(exc)
            raise SwitchboardError(
                f"switchboard at {endpoint(self.url)} did not take the call: {why}"
            ) from exc

    async def list_tools(self, ctx: ServerRequestContext, params: Any) -> ListToolsResult:
        try:
            return await self.remote(lambda client: client.list_tools())
        except SwitchboardError as exc:
            raise MCPError(INTERNAL_ERROR, str(exc)) from None

    async def call_tool(self, ctx: ServerRequestContext, params: CallToolRequestParams) -> CallToolResult:
        try:
            return await self.remote(lambda client: client.call_tool(params.name, params.arguments))
        except SwitchboardError as exc:
            log.warning("tool %s: %s", params.name, exc)
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)

    async def serve(self) -> None:
        """Until stdin closes. The server is asked first, so a wrong URL or token stops the
        command at once, saying so."""
        instructions = await self.remote(_instructions)
        server = Server(
            "switchboard",
            instructions=instructions,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def _reason(exc: BaseException) -> str:
    """The one error inside the task groups the SDK's client raises through."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


async def _instructions(client: Client) -> str | None:
    return client.instructions


async def serve_stdio(url: str, token: str | None) -> int:
    if not token:
        raise SwitchboardError("set SWITCHBOARD_TOKEN (or --token) to an agent token: switchboard token add")
    relay = Relay(url, token)
    async with relay.http:
        await relay.serve()
    return 0
