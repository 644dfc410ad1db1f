"""Where each claimer's next claim starts (DESIGN.md "Claim order", migration 0007).

A claim takes the pending todos of its queues in claim order: highest priority first,
then by ready_at. Scanning from the oldest entry of the index means stepping over the
entry of every todo claimed since the last vacuum, and while any transaction in the
database holds the vacuum horizon back, visiting the heap for each one: the claim slows
down with every todo claimed before it. So each claimer — one owner claiming from one
set of queues, in this process — remembers where its last claim ended (the priority
level, as the rank -priority, and the ready_at), and its next claim starts there. A todo
of a higher priority is always looked for from the oldest of its level (the claim
statements' `higher`), so it never waits behind the position.

A todo can be behind that position in its own level without having been claimed:
committed after claims had passed its ready_at (a producer's long or concurrent
transaction), skipped while another transaction held its row lock, in a queue that was
paused, assigned to someone else until a time that has now passed (assignee_until), or
moved to this level or this owner by an edit. So a claimer
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
TOP_RANK = -10  # -priority of the highest priority (models.PRIORITY_MAX)

Key = tuple[str, tuple[str, ...]]
Place = tuple[int, datetime]  # (rank, ready_at) of a todo: its place in claim order
FROM_THE_OLDEST: tuple[int, None] = (TOP_RANK, None)


@dataclass
class _Position:
    place: Place | None = None  # where the last claim ended; None: nothing yet
    next_full_scan: float = 0.0  # monotonic time


class ClaimCursors:
    """The positions of this process's claimers. `start` says where a claim begins
    (FROM_THE_OLDEST, or a Place), `ended` records what it claimed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._positions: OrderedDict[Key, _Position] = OrderedDict()

    @staticmethod
    def key(owner: str, queues: Sequence[str]) -> Key:
        if len(queues) == 1:  # the usual claimer, without sorting
            return owner, (queues[0],)
        return owner, tuple(sorted(set(queues)))

    def start(self, key: Key) -> tuple[int, datetime | None]:
        position = self._positions.get(key)
        if position is None:
            position = self._positions[key] = _Position()
            if len(self._positions) > CAPACITY:
                self._positions.popitem(last=False)
        else:
            self._positions.move_to_end(key)
        now = self._clock()
        if position.place is None or now >= position.next_full_scan:
            # Claims that start meanwhile use the position; `ended` sets the real time.
            position.next_full_scan = now + MAX_FULL_SCAN_EVERY
            return FROM_THE_OLDEST
        return position.place

    def forget(self, queue: str | None = None) -> None:
        """Claimers of `queue` (None: every claimer) scan from the oldest next time: a
        resumed queue's todos, or todos an edit moved, may lie behind their positions.
        Claimers in other processes find them at their next full scan."""
        for key in list(self._positions):
            if queue is None or queue in key[1]:
                del self._positions[key]

    def ended(
        self, key: Key, start: tuple[int, datetime | None], claimed: Sequence[Place], took: float
    ) -> None:
        """A claim that started at `start` took `took` seconds and claimed todos at
        `claimed`, in claim order."""
        position = self._positions.get(key)
        if position is None:
            return
        if start == FROM_THE_OLDEST:
            wait = min(max(FULL_SCAN_EVERY, took / FULL_SCAN_SHARE), MAX_FULL_SCAN_EVERY)
            position.next_full_scan = self._clock() + wait
        if claimed:
            # Also backwards, after a full scan found a todo behind: the claims that follow
            # walk forward from it, taking whatever else was left there.
            position.place = claimed[-1]
