"""At most so many long requests at once per token, and per dashboard session, in each web
process (issue 25, item 6).

A long request holds a connection for up to a minute (a long-poll claim or a wait with
`wait` above 0, over HTTP or as an MCP tool call) or for as long as it stays open (an
agent's channel, GET /mcp, a page's /events). Unbounded, one token — leaked, or a fleet's
runaway loop — could take every connection the process serves (SWITCHBOARD_MAX_CONNECTIONS,
1,000), and everyone else would get 503. One more than the bound is refused at once with
429, never queued: a queued request would hold its connection all the same.

The default, 100, is a tenth of the default connection cap: a fleet of 100 agents sharing
one token can each keep a long-poll claim (or a channel) open, and one token still leaves
nine connections in ten to everyone else. A bigger fleet on one token raises
SWITCHBOARD_MAX_WAITS_PER_TOKEN (or, better, gets tokens of its own). Counted per process:
N web processes admit N times as many.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from litestar.types import ASGIApp, Receive, Scope, Send

from dashboard.notify import session_key
from dashboard.web.slots import Slots

SETTING = "SWITCHBOARD_MAX_WAITS_PER_TOKEN"  # Settings.max_waits_per_token (dashboard/config.py)
HELD = "switchboard.long_requests"  # the ASGI scope key of the slots held until the response ends

Credential = tuple[str, str]  # ("token", its id) or ("session", its session_key)


class LongRequests:
    def __init__(self, per_credential: int):
        self.per_credential = per_credential
        self._slots = Slots(per_credential)

    @contextmanager
    def slot(self, credential: Credential, *, waits: bool = True) -> Iterator[None]:
        """Around a long request of `credential`'s: 429 when it has the most open already. A
        request that `waits` for nothing (wait=0) is short, and takes no slot."""
        if not waits:
            yield
            return
        refusal = (
            f"this {credential[0]} already has {{count}} long requests (waits and streams) open on this "
            f"server process, the most allowed ({SETTING}): end one first, or ask without waiting"
        )
        with self._slots.taken(credential, refusal):
            yield

    def hold(self, scope: Scope, credential: Credential) -> None:
        """A slot for the rest of the request: for a stream, which its handler returns before
        it runs. The route's `release_held` middleware gives it back once the response is over,
        however it ends."""
        held: ExitStack = scope.setdefault(HELD, ExitStack())
        held.enter_context(self.slot(credential))


def of_token(token_id: str) -> Credential:
    return ("token", token_id)


def of_session(sid: str) -> Credential:
    return ("session", session_key(sid))


def long_requests(scope: Scope) -> LongRequests:
    """The app's (create_app puts one in its state)."""
    return scope["app"].state.long_requests


def release_held(app: ASGIApp) -> ASGIApp:
    """Middleware for a route whose handler may `hold` a slot."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        finally:
            held = scope.pop(HELD, None)
            if held is not None:
                held.close()

    return middleware
