"""Whether the client of a long API request is still there: a waiting claim or a wait for
a result ends when its client disconnects, instead of claiming for nobody.

uvicorn's ASGI `receive`, once the request body has been read, blocks until the client
disconnects and then answers `http.disconnect` (Litestar does not cancel the handler
then). `watching` reads it in a task for as long as the handler waits, and tells the
`Presence` (dashboard/agents.py) the waiting use-case was handed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from litestar.types import Receive

from dashboard.agents import Presence


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
