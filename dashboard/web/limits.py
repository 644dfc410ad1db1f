"""Limits on logins and unknown bearer tokens, per web process, in memory.

- From one address: 30 login attempts that failed or were refused (or 30 unknown tokens)
  in a minute, then 429 with Retry-After until the 30th latest of them is a minute old. A
  refused attempt counts too, so hammering while refused keeps the address refused.
  Counted per process: N processes behind a balancer allow N times as many.
- A login is counted as a failure before its password is hashed and un-counted when the
  password was right: concurrent guesses cannot slip past the limits while they wait.
- At most LOGINS_AT_ONCE logins in a process wait for (or hold) the one hashing slot
  (dashboard/accounts.py), and one address holds at most one of those places; one more is
  refused (429, Retry-After 1) at once, so a flood from one address hashes one guess at a
  time and a real login from elsewhere waits for at most LOGINS_AT_ONCE hashes.
- For one operator name from one address: after 5 failures in 15 minutes each further try
  must wait 2, 4, 8 … seconds (at most 60) after the last failure. Keyed by address, so
  an attacker's failures from elsewhere never delay the real operator at theirs (a
  distributed attacker meets the per-address limit and the hashing slot instead); keyed
  by the password's generation (its salt), so a new password starts afresh in every process.
A refused login costs no hash and no query. Memory is bounded: at most MAX_KEYS keys per
counter (names cut to NAME_KEY characters), the least recently counted forgotten first.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from typing import NoReturn

from litestar.exceptions import TooManyRequestsException

PER_ADDRESS = (30, 60.0)  # failed or refused attempts, window in seconds
NAME_FREE_FAILURES, NAME_WINDOW, NAME_MAX_DELAY = 5, 900.0, 60.0
NAME_KEEP = NAME_FREE_FAILURES + math.ceil(math.log2(NAME_MAX_DELAY))  # enough for the longest delay
LOGINS_AT_ONCE = 4  # one hashing, three waiting: a real login waits for four hashes at most
MAX_KEYS = 10_000
NAME_KEY = 64  # operator names are at most 63 characters


class TooMany(TooManyRequestsException):
    def __init__(self, detail: str, retry_after: float):
        seconds = max(1, math.ceil(retry_after))
        super().__init__(detail=f"{detail}; try again in {seconds} s", headers={"Retry-After": str(seconds)})


class Failures:
    """The latest `keep` failure times per key within `window`, oldest key evicted first
    beyond MAX_KEYS."""

    def __init__(self, window: float, keep: int):
        self.window, self.keep = window, keep
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
        times = self.recent(key, now) or deque(maxlen=self.keep)
        self._times[key] = times
        self._times.move_to_end(key)
        times.append(now)
        while len(self._times) > MAX_KEYS:
            self._times.popitem(last=False)

    def discard(self, key: str, when: float) -> None:
        """Un-count the failure counted at `when` (if still kept)."""
        times = self._times.get(key)
        if times is not None and when in times:
            times.remove(when)

    def forget(self, key: str) -> None:
        self._times.pop(key, None)


class Limits:
    def __init__(self, per_address: tuple[int, float] = PER_ADDRESS, clock=time.monotonic):
        self.clock = clock
        self.allowed, window = per_address
        self.logins = Failures(window, self.allowed)
        self.names = Failures(NAME_WINDOW, NAME_KEEP)
        self.tokens = Failures(window, self.allowed)
        self.hashing: set[str] = set()  # addresses with a login in flight

    def _address_wait(self, failures: Failures, address: str, now: float) -> float:
        times = failures.recent(address, now)
        return times[0] + failures.window - now if len(times) >= self.allowed else 0.0

    def login_attempt(self, address: str) -> LoginAttempt:
        """Before anything else: TooMany (counted) if this address is over its limit or the
        hashing queue has no place for it; else the attempt, counted as a failure."""
        now = self.clock()
        if self._address_wait(self.logins, address, now) > 0:
            self.refuse_login(address, "too many failed logins from your address")
        if address in self.hashing:
            self.refuse_login(address, "a login from your address is being checked")
        if len(self.hashing) >= LOGINS_AT_ONCE:
            self.refuse_login(address, "too many logins at once")
        return LoginAttempt(self, address, now)

    def refuse_login(self, address: str, why: str) -> NoReturn:
        """429, counted against the address: refused attempts are not free."""
        now = self.clock()
        self.logins.add(address, now)
        raise TooMany(why, self._address_wait(self.logins, address, now))

    def token_failed(self, address: str) -> None:
        """An unknown bearer token: TooMany (instead of 401) beyond the address's allowance.
        Valid tokens are never refused here, so one broken agent behind a NAT does not
        stop the others."""
        now = self.clock()
        over = self._address_wait(self.tokens, address, now) > 0
        self.tokens.add(address, now)
        if over:
            raise TooMany(
                "too many unknown tokens from your address", self._address_wait(self.tokens, address, now)
            )


class LoginAttempt:
    """One login from `address`, counted as failed until `succeeded()`, holding the
    address's place in the hashing queue until the end of its `with` block."""

    def __init__(self, limits: Limits, address: str, now: float):
        self.limits, self.address, self.at = limits, address, now
        self.name_key: str | None = None
        limits.logins.add(address, now)
        limits.hashing.add(address)

    def check_name(self, name: str, generation: str) -> None:
        """Before the password is hashed: TooMany if this name must wait at this address;
        else the failure counted for it too."""
        limits, now = self.limits, self.limits.clock()
        key = f"{self.address} {name[:NAME_KEY]} {generation}"
        times = limits.names.recent(key, now)
        if len(times) >= NAME_FREE_FAILURES:
            delay = min(2.0 ** (len(times) - NAME_FREE_FAILURES + 1), NAME_MAX_DELAY)
            wait = times[-1] + delay - now
            if wait > 0:
                raise TooMany(f"too many failed logins for {name}", wait)
        limits.names.add(key, now)
        self.name_key = key

    def succeeded(self) -> None:
        """The password was right: the address's failure is un-counted, the name's delay here ends."""
        self.limits.logins.discard(self.address, self.at)
        if self.name_key is not None:
            self.limits.names.forget(self.name_key)

    def __enter__(self) -> LoginAttempt:
        return self

    def __exit__(self, *exc) -> None:
        self.limits.hashing.discard(self.address)
