"""Whether the client of a long request is still there: a waiting claim or a wait for a
result ends when its client disconnects, instead of claiming for nobody.

uvicorn's ASGI `receive`, once the request body has been read, blocks until the client
disconnects and then answers `http.disconnect` (Litestar does not cancel the handler
then). `watching` reads it in a task for as long as the handler waits; `Presence.gone`
says what it found, and a subscription handed to `wakes` ends its wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from litestar.types import Receive

from dashboard.notify import Subscription


class Presence:
    def __init__(self) -> None:
        self.gone = False
        self._waits: list[Subscription] = []

    def wakes(self, sub: Subscription) -> None:
        """End `sub`'s waits when the client goes."""
        self._waits.append(sub)

    def left(self) -> None:
        self.gone = True
        for sub in self._waits:
            sub.wake()


@contextlib.asynccontextmanager
async def watching(receive: Receive, *, waits: bool) -> AsyncIterator[Presence]:
    """A Presence kept up to date from `receive` until the block ends; a request that
    `waits` for nothing (wait=0, the busy agent's hot path) is answered before anyone could
    go, and is not watched."""
    presence = Presence()
    if not waits:
        yield presence
        return

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            continue  # the rest of a body nobody reads (a GET's empty one)
        presence.left()

    task = asyncio.create_task(watch())
    try:
        yield presence
    finally:
        task.cancel()
        await asyncio.wait([task])
