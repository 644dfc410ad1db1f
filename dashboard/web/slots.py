"""At most so many at once per key, in this process: the one counter behind the bounds on
long requests per credential (long_requests.py) and searches per caller (searches.py).
One more than the bound is refused at once with 429, never queued: a queued request would
hold its connection all the same."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from litestar.exceptions import TooManyRequestsException

RETRY_AFTER = 1  # seconds


class Slots:
    def __init__(self, most: int):
        self.most = most
        self._taken: dict[Hashable, int] = {}

    @contextmanager
    def taken(self, key: Hashable, refusal: str) -> Iterator[None]:
        """A slot of `key`'s for the block; 429 saying `refusal` (formatted with `count`,
        how many `key` holds) when it holds the most already."""
        count = self._taken.get(key, 0)
        if count >= self.most:
            raise TooManyRequestsException(
                detail=refusal.format(count=count), headers={"Retry-After": str(RETRY_AFTER)}
            )
        self._taken[key] = count + 1
        try:
            yield
        finally:
            self._taken[key] -= 1
            if not self._taken[key]:
                del self._taken[key]
