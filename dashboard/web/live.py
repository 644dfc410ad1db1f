"""Hints, live: the one hint-to-SSE loop behind open pages (/events) and agents'
channels (/api/v1/channels), each with its own encoder.

Both streams come from a hub subscription (dashboard/notify.py): a hint says only "work
may have changed in queue q", and a resync that hints may have been lost meanwhile. Each
ends with its credential: a channel when its token is revoked, a page's stream when its
session ends (logout, a new password, a removed operator) or expires, in every process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import msgspec
from litestar.response import ServerSentEventMessage
from litestar.template import TemplateEngineProtocol

from dashboard.accounts import Accounts
from dashboard.agents import StillAllowed, token_check
from dashboard.models import Scope
from dashboard.notify import Hub, Subscription, session_key

KEEPALIVE = 15.0
PAGE_HINT_INTERVAL = 0.5  # a page gets at most two refresh hints a second

RESYNC = ServerSentEventMessage(event="resync", data="{}")
CONNECTED = ServerSentEventMessage(comment="connected")
Encoder = Callable[[set[str], bool], Iterable[ServerSentEventMessage]]


async def hint_stream(
    sub: Subscription,
    first: ServerSentEventMessage,
    encode: Encoder,
    *,
    min_interval: float = 0.0,
    still_allowed: StillAllowed,
) -> AsyncIterator[ServerSentEventMessage]:
    """`first`, then `encode(hinted queues, resync)` for each wake-up, a keepalive comment
    every KEEPALIVE seconds of quiet; a burst within `min_interval` becomes one wake-up.
    Ends when the process stops (the hub ends the subscription), or when `still_allowed`
    (asked at every resync and keepalive, and at once when the hub says the credential
    ended: a token revoked, a session ended or expired) says no."""
    with sub:
        yield first
        loop = asyncio.get_running_loop()
        last = 0.0
        while not sub.ended:
            if not await sub.wait(KEEPALIVE):
                if not await still_allowed(sub):
                    return
                yield ServerSentEventMessage(comment="keepalive")
                continue
            if (sub.revoked or sub.resync) and not await still_allowed(sub):
                return
            wait = last + min_interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            hinted, resync = sub.take()
            last = loop.time()
            if sub.ended:
                return
            for message in encode(hinted, resync):
                yield message


def page_encoder(templates: TemplateEngineProtocol) -> Encoder:
    """For open pages: 'refresh' (and 'queue-<name>') reload partials, 'notice' is a short
    "new work in <queue>" line, 'resync' follows a lost LISTEN connection."""
    notice = templates.get_template("partials/new_work.html")

    def encode(hinted: set[str], resync: bool) -> Iterable[ServerSentEventMessage]:
        if resync:
            yield ServerSentEventMessage(event="resync", data="*")
        if hinted:
            queues = sorted(hinted)
            yield ServerSentEventMessage(event="refresh", data=",".join(queues))
            for queue in queues:
                yield ServerSentEventMessage(event=f"queue-{queue}", data=queue)
            yield ServerSentEventMessage(event="notice", data=notice.render(queues=queues).strip())

    return encode


def channel_encoder(hinted: set[str], resync: bool) -> Iterable[ServerSentEventMessage]:
    """For agents: 'hint' ({"queue": …}) per queue, 'resync' when hints may be lost (claim!)."""
    if resync:
        yield RESYNC
    for queue in sorted(hinted):
        yield ServerSentEventMessage(event="hint", data=msgspec.json.encode({"queue": queue}))


def session_check(accounts: Accounts, sid: str) -> StillAllowed:
    """Whether a page's session is still live: the hub's hint that it ended, or its expiry,
    is taken at its word; otherwise (a resync, a keepalive) the database is asked."""

    async def still_allowed(sub: Subscription) -> bool:
        return not sub.revoked and await accounts.session_left(sid) is not None

    return still_allowed


def page_stream(
    hub: Hub, accounts: Accounts, templates: TemplateEngineProtocol, sid: str, seconds_left: float
) -> AsyncIterator[ServerSentEventMessage]:
    """For the open pages of session `sid`, which expires `seconds_left` from now."""
    sub = hub.subscribe(session=session_key(sid))
    sub.revoke_after(seconds_left)
    return hint_stream(
        sub,
        CONNECTED,
        page_encoder(templates),
        min_interval=PAGE_HINT_INTERVAL,
        still_allowed=session_check(accounts, sid),
    )


def channel_stream(
    hub: Hub, accounts: Accounts, queues: Sequence[str], scope: Scope
) -> AsyncIterator[ServerSentEventMessage]:
    sub = hub.subscribe(queues, token=scope.token_id)
    return hint_stream(sub, RESYNC, channel_encoder, still_allowed=token_check(accounts))  # start by claiming
