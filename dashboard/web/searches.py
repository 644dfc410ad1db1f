"""At most PER_CALLER searches at once per caller, per web process (issue 25, item 7).

A search (a list with search text or a payload object: the API's and MCP's list_todos, the
dashboard's queue page) may read far more rows than it shows; twelve at once from one viewer
held other agents' heartbeats up by seconds. One more than PER_CALLER is refused at once with
429 (dashboard/web/slots.py). The caller is the
agent (all its tokens) or the operator (all their sessions); the statement timeout
(Reads.READ_TIMEOUT) bounds how long a slot is held.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dashboard.reads import TodoFilter
from dashboard.web.slots import Slots

PER_CALLER = 2


class Searches:
    def __init__(self, per_caller: int = PER_CALLER):
        self.per_caller = per_caller
        self._slots = Slots(per_caller)

    @contextmanager
    def slot(self, caller: str, filters: TodoFilter) -> Iterator[None]:
        """Around a list read of `caller`'s ("agent:NAME", "operator:NAME"): a slot when the
        filter searches, else nothing."""
        if not filters.searches:
            yield
            return
        with self._slots.taken(caller, f"at most {self.per_caller} searches at once; wait for one to finish"):
            yield


SEARCHES = Searches()  # one per web process, as the login limits
