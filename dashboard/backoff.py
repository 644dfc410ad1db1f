"""Jitter: client-side retry delays (full jitter on a doubling window, capped), and the
spread of long-poll waits' ends.

The workers use the delays to ride out a database or server that is briefly away, so that
many clients coming back at once spread out instead of returning as a burst (the server's
own retry of failed todos does the same in SQL: todo_backoff). Waits are spread for the
same reason: long-polls that began together (a fleet restarted at once) would otherwise
all end, and be sent again, in one instant, and an ack would queue behind them."""

from __future__ import annotations

import random

# A long-poll that gets nothing ends at a random moment up to this share of its wait (and
# at most WAIT_SPREAD_MAX seconds) after it: never before, since clients count on a wait
# lasting what they asked (a 204 after `wait` seconds means nothing came in that time).
WAIT_SPREAD = 0.1
WAIT_SPREAD_MAX = 1.0


def spread_wait(wait: float) -> float:
    """The server's end of a wait of `wait` seconds: lengthened at random, within bounds."""
    return wait + min(WAIT_SPREAD * wait, WAIT_SPREAD_MAX) * random.random()


def shorter_wait(wait: float) -> float:
    """A client's wait to ask for: shortened at random by up to WAIT_SPREAD of it, so that
    clients started together send their next long-poll at different moments."""
    return wait * (1 - WAIT_SPREAD * random.random())


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
