"""Client-side retry delays: full jitter on a doubling window, capped.

The workers use it to ride out a database or server that is briefly away, so that many
clients coming back at once spread out instead of returning as a burst (the server's
own retry of failed todos does the same in SQL: todo_backoff)."""

from __future__ import annotations

import random


class Backoff:
    """Delays for successive failures: uniform in [0, min(cap, base * 2^n)] for the n-th."""

    def __init__(self, base: float = 0.5, cap: float = 10.0):
        self.base, self.cap, self.failures = base, cap, 0

    def next(self) -> float:
        window = min(self.cap, self.base * 2**self.failures)
        self.failures += 1
        return random.uniform(0, window)

    def reset(self) -> None:
        self.failures = 0
