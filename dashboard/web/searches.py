"""At most PER_CALLER searches at once per caller, per web process (issue 25, item 7).

A search (a list with search text or a payload object: the API's and MCP's list_todos, the
dashboard's queue page) may read far more rows than it shows; twelve at once from one viewer
held other agents' heartbeats up by seconds. One more than PER_CALLER is refused at once with
429, never queued: a queued search would hold its request all the same. The caller is the
agent (all its tokens) or the operator (all their sessions); the statement timeout
(Reads.READ_TIMEOUT) bounds how long a slot is held.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from litestar.exceptions import TooManyRequestsException

from dashboard.reads import TodoFilter

PER_CALLER = 2
RETRY_AFTER = 1  # seconds


class Searches:
    def __init__(self, per_caller: int = PER_CALLER):
        self.per_caller = per_caller
        self._running: dict[str, int] = {}

    @contextmanager
    def slot(self, caller: str, filters: TodoFilter) -> Iterator[None]:
        """Around a list read of `caller`'s ("agent:NAME", "operator:NAME"): a slot when the
        filter searches, else nothing."""
        if not filters.searches:
            yield
            return
        running = self._running.get(caller, 0)
        if running >= self.per_caller:
            raise TooManyRequestsException(
                detail=f"at most {self.per_caller} searches at once; wait for one to finish",
                headers={"Retry-After": str(RETRY_AFTER)},
            )
        self._running[caller] = running + 1
        try:
            yield
        finally:
            self._running[caller] -= 1
            if not self._running[caller]:
                del self._running[caller]


SEARCHES = Searches()  # one per web process, as the login limits
