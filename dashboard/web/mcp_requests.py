"""One /mcp request, for as long as its token and its client last (issue 25, items 5 and 6).

The MCP SDK serves GET /mcp as an endless Server-Sent Events stream (a ping every 15 s)
and, once it is open, never asks whether the token is still good. And answering in JSON,
it reads nothing more of a POST once it has its body, so it never learns that the client
went: a tool call that waits (claim, wait_for) ran to its end for nobody, holding a
connection slot of the server's the while.

So every authenticated request runs beside a hub subscription for its token. When the
token is revoked (in any process: the hub's revocation hint) or the process stops, an
event stream under way is ended: the SDK's handling of it is cancelled and the response's
body finished. A call being answered is not cut (it may have changed something): the
waiting tools end themselves at a revocation (dashboard/agents.py). And
`receive` is watched once the SDK has read the body, as the API's long requests are
(dashboard/web/presence.py): the client's going reaches a waiting tool through its
`Presence`, and the SDK's stream through the `http.disconnect` it listens for.
"""

from __future__ import annotations

import asyncio

from litestar.types import ASGIApp, Message, Receive, Scope, Send

from dashboard.agents import Presence, StillAllowed
from dashboard.notify import Subscription
from dashboard.web.live import KEEPALIVE

EVENT_STREAM = b"text/event-stream"
DISCONNECT: Message = {"type": "http.disconnect"}


class McpRequest:
    """One request to /mcp, run by `run`. Both watches start only when needed, so that a
    short call (most are) costs no task of its own: the token's once an event stream
    begins, the client's once something waits for it (`watch_client`)."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        sub: Subscription,
        still_allowed: StillAllowed,
    ):
        self._receive, self._send = receive, send
        self._sub, self._still_allowed = sub, still_allowed
        self._presence = Presence()
        self._gone = asyncio.Event()
        self._body_read = False
        self._cut: asyncio.Timeout | None = None
        self._tasks: list[asyncio.Task] = []  # the watches started
        self._watching_client = False
        self._started = self._finished = False

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        """`app` on this request; its event stream, if it makes one, ended with the token."""
        try:
            async with asyncio.timeout(None) as self._cut:
                await app(scope, self.receive, self.send)
        except TimeoutError:
            if not self._cut.expired():
                raise
        finally:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
        if self._started and not self._finished:  # the stream that was cut
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _end_stream(self) -> None:
        """Cut the request's event stream once the token is revoked or the process stops; at
        a resync and every KEEPALIVE seconds the database is asked."""
        sub = self._sub
        while not sub.ended:
            woke = await sub.wait(KEEPALIVE)
            if (not woke or sub.revoked or sub.resync) and not await self._still_allowed(sub):
                break
            sub.take()
        self._cut.reschedule(asyncio.get_running_loop().time())

    def watch_client(self) -> Presence:
        """Whether the client is still there, found out from `receive` (once the SDK has read
        the body) from now until the request ends."""
        if not self._watching_client and self._body_read:
            self._watching_client = True
            self._tasks.append(asyncio.create_task(self._watch_client()))
        return self._presence

    async def _watch_client(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            continue
        self._left()

    def _left(self) -> None:
        self._gone.set()
        self._presence.left()

    async def receive(self) -> Message:
        """The request's messages while the SDK reads its body; then, for as long as the
        request lasts, `http.disconnect` once the client has gone."""
        if not self._body_read:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._left()
            elif not message.get("more_body"):
                self._body_read = True
            return message
        self.watch_client()
        await self._gone.wait()
        return DISCONNECT

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._started = True
            if any(
                k.lower() == b"content-type" and v.startswith(EVENT_STREAM) for k, v in message["headers"]
            ):
                self._tasks.append(asyncio.create_task(self._end_stream()))
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self._finished = True
        await self._send(message)
