"""Hints, live: the one hint-to-SSE loop behind open pages (/events) and agents'
channels (/api/v1/channels), each with its own encoder, and the long-poll claim.

Both streams come from a hub subscription (dashboard/notify.py): a hint says only "work
may have changed in queue q", and a resync that hints may have been lost meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import msgspec
from litestar.response import ServerSentEventMessage
from litestar.template import TemplateEngineProtocol

from dashboard.models import Scope, Todo, check_wait
from dashboard.notify import Hub, Subscription
from dashboard.store import Store

KEEPALIVE = 15.0
PAGE_HINT_INTERVAL = 0.5  # a page gets at most two refresh hints a second
POLL_FALLBACK = 5.0  # a waiting claim re-checks this often even when no hint arrives

RESYNC = ServerSentEventMessage(event="resync", data="{}")
CONNECTED = ServerSentEventMessage(comment="connected")
Encoder = Callable[[set[str], bool], Iterable[ServerSentEventMessage]]


async def hint_stream(
    sub: Subscription, first: ServerSentEventMessage, encode: Encoder, *, min_interval: float = 0.0
) -> AsyncIterator[ServerSentEventMessage]:
    """`first`, then `encode(hinted queues, resync)` for each wake-up, a keepalive comment
    every KEEPALIVE seconds of quiet; a burst within `min_interval` becomes one wake-up.
    Ends when the process stops (the hub ends the subscription)."""
    with sub:
        yield first
        loop = asyncio.get_running_loop()
        last = 0.0
        while not sub.ended:
            if not await sub.wait(KEEPALIVE):
                yield ServerSentEventMessage(comment="keepalive")
                continue
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


def page_stream(hub: Hub, templates: TemplateEngineProtocol) -> AsyncIterator[ServerSentEventMessage]:
    return hint_stream(hub.subscribe(), CONNECTED, page_encoder(templates), min_interval=PAGE_HINT_INTERVAL)


def channel_stream(hub: Hub, queues: Sequence[str]) -> AsyncIterator[ServerSentEventMessage]:
    return hint_stream(hub.subscribe(queues), RESYNC, channel_encoder)  # start by claiming


async def claim_waiting(
    store: Store, hub: Hub, queues: Sequence[str], owner: str, ttl: float, wait: float, scope: Scope
) -> Todo | None:
    """Claim now, or wait up to `wait` seconds for a hint (re-checking every few seconds).
    A process that is stopping claims nothing more: the wait ends with None (204)."""
    wait = check_wait(wait)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    with hub.subscribe(queues) as sub:  # subscribed before the first try: no lost wake-up
        while True:
            if sub.ended:
                return None
            todo = await store.claim_next(queues, owner, ttl, scope=scope)
            remaining = deadline - loop.time()
            if todo is not None or remaining <= 0:
                return todo
            await sub.wait(min(remaining, POLL_FALLBACK))
            sub.take()
