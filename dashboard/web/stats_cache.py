"""The overview's counts, shared by every open page of one process.

Each open overview polls every few seconds and refreshes on hints; without sharing, the
database would count live work once per page per refresh. The counts are recomputed at
most once per `max_age` seconds, or at once when a hint says work arrived or died (so a
new todo still shows up without waiting); concurrent requests share one query.
"""

from __future__ import annotations

import asyncio

from dashboard.notify import Hub
from dashboard.reads import QueueStats, Reads


class StatsCache:
    def __init__(self, reads: Reads, hub: Hub, max_age: float = 1.0):
        self.reads = reads
        self.max_age = max_age
        self._hints = hub.subscribe()
        self._lock = asyncio.Lock()
        self._stats: list[QueueStats] | None = None
        self._at = 0.0

    async def get(self) -> list[QueueStats]:
        async with self._lock:
            now = asyncio.get_running_loop().time()
            hinted, resync = self._hints.take()
            if self._stats is None or hinted or resync or now - self._at > self.max_age:
                self._stats = await self.reads.queue_stats()
                self._at = now
            return self._stats

    def close(self) -> None:
        self._hints.close()
