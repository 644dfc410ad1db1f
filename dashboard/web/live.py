"""Hints, live: the one hint-to-SSE loop behind open pages (/events) and agents'
channels (/api/v1/channels), each with its own encoder, and the long-poll claim.

Both streams come from a hub subscription (dashboard/notify.py): a hint says only "work
may have changed in queue q", and a resync that hints may have been lost meanwhile. Each
ends with its credential: a channel when its token is revoked, a page's stream when its
session ends (logout, a new password, a removed operator) or expires, in every process.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

import msgspec
from litestar.exceptions import NotAuthorizedException
from litestar.response import ServerSentEventMessage
from litestar.template import TemplateEngineProtocol

from dashboard.accounts import Accounts
from dashboard.backoff import spread_wait
from dashboard.models import Scope, Todo, check_wait
from dashboard.notify import Hub, Subscription, session_key
from dashboard.store import Store
from dashboard.web.presence import Presence

KEEPALIVE = 15.0
PAGE_HINT_INTERVAL = 0.5  # a page gets at most two refresh hints a second
POLL_FALLBACK = 5.0  # a waiting claim re-checks this often even when no hint arrives
# ± this share of POLL_FALLBACK at random: claims that began waiting together (a fleet of
# agents started at once) do not all re-check in the same instant.
POLL_JITTER = 0.2

RESYNC = ServerSentEventMessage(event="resync", data="{}")
CONNECTED = ServerSentEventMessage(comment="connected")
Encoder = Callable[[set[str], bool], Iterable[ServerSentEventMessage]]


async def hint_stream(
    sub: Subscription,
    first: ServerSentEventMessage,
    encode: Encoder,
    *,
    min_interval: float = 0.0,
    still_allowed: Callable[[Subscription], Awaitable[bool]],
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


def session_check(accounts: Accounts, sid: str) -> Callable[[Subscription], Awaitable[bool]]:
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


def token_check(accounts: Accounts) -> Callable[[Subscription], Awaitable[bool]]:
    """Whether a subscription's token is still good: the hub's revocation hint is taken at
    its word; otherwise (a resync, when hints may have been lost) the database is asked."""

    async def still_allowed(sub: Subscription) -> bool:
        return not sub.revoked and await accounts.token_active(sub.token)

    return still_allowed


def channel_stream(
    hub: Hub, accounts: Accounts, queues: Sequence[str], scope: Scope
) -> AsyncIterator[ServerSentEventMessage]:
    sub = hub.subscribe(queues, token=scope.token_id)
    return hint_stream(sub, RESYNC, channel_encoder, still_allowed=token_check(accounts))  # start by claiming


async def claim_waiting(
    store: Store,
    hub: Hub,
    accounts: Accounts,
    queues: Sequence[str],
    owner: str,
    ttl: float,
    wait: float,
    scope: Scope,
    n: int = 1,
    *,
    presence: Presence,
) -> list[Todo]:
    """Claim up to n todos now, or wait up to `wait` seconds for a hint (re-checking every
    few seconds) and claim then. A process that is stopping claims nothing more: the wait
    ends with none (204). A token revoked meanwhile claims nothing either: 401, checked
    before every try after the first (the request itself was authorised just before it).
    A client that went (`presence`) ends the wait, and a claim that raced its going is
    given back: nobody would hold it until its lease ran out, spending an attempt."""
    wait = check_wait(wait)
    if wait == 0:  # the busy agent's claim: no subscription to make and drop
        return [] if hub.stopping else await store.claim_batch(queues, owner, ttl, n, scope=scope)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spread_wait(wait)  # a fleet that began together does not end together
    still_allowed = token_check(accounts)
    first = True
    with hub.subscribe(
        queues, token=scope.token_id
    ) as sub:  # subscribed before the first try: no lost wake-up
        presence.wakes(sub)
        while True:
            if sub.ended or presence.gone:
                return []
            if not first and not await still_allowed(sub):
                raise NotAuthorizedException("the token was revoked")
            first = False
            todos = await store.claim_batch(queues, owner, ttl, n, scope=scope)
            if todos and presence.gone:
                await store.give_back(todos, owner)
                return []
            remaining = deadline - loop.time()
            if todos or remaining <= 0:
                return todos
            await sub.wait(min(remaining, POLL_FALLBACK * random.uniform(1 - POLL_JITTER, 1 + POLL_JITTER)))
            sub.take()
