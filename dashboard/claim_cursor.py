"""Where each claimer's next claim starts (DESIGN.md "Claim order", migration 0007).

A claim takes the pending todos of its queues in ready_at order. Scanning from the oldest
entry of the index means stepping over the entry of every todo claimed since the last
vacuum, and while any transaction in the database holds the vacuum horizon back, visiting
the heap for each one: the claim slows down with every todo claimed before it. So each
claimer — one owner claiming from one set of queues, in this process — remembers the
ready_at its last claim ended on, and its next claim starts there.

A todo can be behind that position without having been claimed: committed after claims
had passed its ready_at (a producer's long or concurrent transaction), skipped while
another transaction held its row lock, or assigned to this owner by an edit. So a claimer
scans from the oldest again once FULL_SCAN_EVERY has passed since its last such scan; when
those scans are expensive (vacuum held back) it waits longer, so that they take at most
FULL_SCAN_SHARE of its time, but never longer than MAX_FULL_SCAN_EVERY, the claims' poll
interval: a todo that becomes claimable is claimed within it at worst.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

FULL_SCAN_EVERY = 1.0  # seconds
MAX_FULL_SCAN_EVERY = 5.0  # seconds: the long-poll's and the worker's poll interval
FULL_SCAN_SHARE = 0.02  # of a claimer's time, at most, while full scans are slow
CAPACITY = 4096  # claimers remembered; the least recently used is forgotten first

Key = tuple[str, tuple[str, ...]]


@dataclass
class _Position:
    ready_at: datetime | None = None  # where the last claim ended; None: nothing yet
    next_full_scan: float = 0.0  # monotonic time


class ClaimCursors:
    """The positions of this process's claimers. `start` says where a claim begins
    (None: from the oldest), `ended` records what it claimed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._positions: OrderedDict[Key, _Position] = OrderedDict()

    @staticmethod
    def key(owner: str, queues: Sequence[str]) -> Key:
        return owner, tuple(sorted(set(queues)))

    def start(self, key: Key) -> datetime | None:
        position = self._positions.get(key)
        if position is None:
            position = self._positions[key] = _Position()
            if len(self._positions) > CAPACITY:
                self._positions.popitem(last=False)
        else:
            self._positions.move_to_end(key)
        now = self._clock()
        if position.ready_at is None or now >= position.next_full_scan:
            # Claims that start meanwhile use the position; `ended` sets the real time.
            position.next_full_scan = now + MAX_FULL_SCAN_EVERY
            return None
        return position.ready_at

    def ended(self, key: Key, after: datetime | None, claimed: Sequence[datetime], took: float) -> None:
        """A claim that started at `after` took `took` seconds and claimed todos whose
        ready_at were `claimed`, in claim order."""
        position = self._positions.get(key)
        if position is None:
            return
        if after is None:
            wait = min(max(FULL_SCAN_EVERY, took / FULL_SCAN_SHARE), MAX_FULL_SCAN_EVERY)
            position.next_full_scan = self._clock() + wait
        if claimed:
            # Also backwards, after a full scan found a todo behind: the claims that follow
            # walk forward from it, taking whatever else was left there.
            position.ready_at = claimed[-1]
