"""Limits on failed logins and failed bearer tokens, per web process, in memory.

- From one address: 30 failed logins (or 30 unknown tokens) in a minute, then 429 with
  Retry-After until the oldest of them is a minute old. Counted per process: N processes
  behind a balancer allow N times as many, which still keeps guessing far too slow.
- For one operator name, from anywhere: after 5 failures in 15 minutes each further try
  must wait 2, 4, 8 … seconds (at most 60) after the last failure. A delay, never a
  lockout: an attacker hammering the admin's name cannot keep the admin out for longer
  than that.
A login refused here costs no password hash. Memory is bounded: at most MAX_KEYS keys
(names cut to NAME_KEY characters), the least recently failed forgotten first.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque

from litestar.exceptions import TooManyRequestsException

PER_ADDRESS = (30, 60.0)  # failures, window in seconds
NAME_FREE_FAILURES, NAME_WINDOW, NAME_MAX_DELAY = 5, 900.0, 60.0
MAX_KEYS = 10_000
NAME_KEY = 64  # operator names are at most 63 characters


class TooMany(TooManyRequestsException):
    def __init__(self, detail: str, retry_after: float):
        seconds = max(1, math.ceil(retry_after))
        super().__init__(detail=f"{detail}; try again in {seconds} s", headers={"Retry-After": str(seconds)})


class Failures:
    """Recent failure times per key, oldest key evicted first beyond MAX_KEYS."""

    def __init__(self, window: float):
        self.window = window
        self._times: OrderedDict[str, deque[float]] = OrderedDict()

    def recent(self, key: str, now: float) -> deque[float]:
        times = self._times.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._times[key]
        return times

    def add(self, key: str, now: float) -> None:
        times = self.recent(key, now)
        self._times[key] = times
        self._times.move_to_end(key)
        times.append(now)
        while len(self._times) > MAX_KEYS:
            self._times.popitem(last=False)


class Limits:
    def __init__(self, per_address: tuple[int, float] = PER_ADDRESS, clock=time.monotonic):
        self.clock = clock
        self.allowed, window = per_address
        self.logins = Failures(window)
        self.names = Failures(NAME_WINDOW)
        self.tokens = Failures(window)

    def _address_wait(self, failures: Failures, address: str, now: float) -> float:
        times = failures.recent(address, now)
        return times[0] + failures.window - now if len(times) >= self.allowed else 0.0

    def check_login(self, address: str, name: str) -> None:
        """Before a password is checked: TooMany if this address or name must wait."""
        now = self.clock()
        wait = self._address_wait(self.logins, address, now)
        if wait > 0:
            raise TooMany("too many failed logins from your address", wait)
        times = self.names.recent(name[:NAME_KEY], now)
        if len(times) >= NAME_FREE_FAILURES:
            delay = min(2.0 ** (len(times) - NAME_FREE_FAILURES + 1), NAME_MAX_DELAY)
            wait = times[-1] + delay - now
            if wait > 0:
                raise TooMany(f"too many failed logins for {name}", wait)

    def login_failed(self, address: str, name: str) -> None:
        now = self.clock()
        self.logins.add(address, now)
        self.names.add(name[:NAME_KEY], now)

    def token_failed(self, address: str) -> None:
        """An unknown bearer token: TooMany (instead of 401) beyond the address's allowance.
        Valid tokens are never refused here, so one broken agent behind a NAT does not
        stop the others."""
        now = self.clock()
        self.tokens.add(address, now)
        wait = self._address_wait(self.tokens, address, now)
        if len(self.tokens.recent(address, now)) > self.allowed:
            raise TooMany("too many unknown tokens from your address", wait)
