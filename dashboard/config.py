"""Every setting switchboard reads from the environment, declared once, read once.

Each field of Settings is one variable: its name, its default, how its text becomes a value
(and what values are allowed) and what it does. `Settings.from_environ()` reads them all
when a command starts; a value that cannot be used stops it there with a usage error that
names the variable, repeats the value and says what is allowed (`switchboard: NAME: …`,
exit status 2), before any database is opened or request served. The frozen result is
handed to whatever needs a setting; nothing else reads the environment for one.
docs/configuration.md lists the same variables (tests/test_config.py checks it).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from dashboard.errors import InvalidInput
from dashboard.models import TTL_MAX, TTL_MIN

Parse = Callable[[str], Any]  # the variable's text (stripped, never empty) → its value; ValueError: why not


class BadSetting(InvalidInput):
    """A variable in the environment whose value cannot be used: the command says so and stops."""


def number(kind: type[int] | type[float], what: str, low: float = 0, high: float = math.inf) -> Parse:
    """A `kind` above `low` (or from `low` to `high`, when there is a `high`)."""
    allowed = f"from {low:g} to {high:g}" if high < math.inf else f"above {low:g}"

    def parse(raw: str) -> Any:
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not {what}") from None
        inside = low <= value <= high if high < math.inf else value > low
        if not (math.isfinite(value) and inside):
            raise ValueError(f"{raw!r}: must be {allowed}")
        return value

    return parse


def one_of(*choices: str) -> Parse:
    """One of `choices`, in any case."""

    def parse(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(choices)}")
        return raw.lower()

    return parse


def web_address(raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise ValueError(f"{raw!r}: must start with https:// or http://")
    return raw


def secret_key(raw: str) -> str:
    if len(raw) < 32:
        example = "python -c 'import secrets; print(secrets.token_hex(32))'"
        raise ValueError(f"must be at least 32 characters, not {len(raw)} (make one: {example})")
    return raw


def trusted_proxies(raw: str) -> tuple[str, ...]:
    """Comma-separated addresses and networks (CIDR). uvicorn would take a mistyped entry for
    a literal that never matches, so it is refused here instead. So is trusting every
    address ("*", 0.0.0.0/0, ::/0, or networks that together cover one of those): any
    client could then name its own address in X-Forwarded-For and so escape the
    per-address limits (dashboard/web/limits.py)."""
    entries = tuple(entry.strip() for entry in raw.split(",") if entry.strip())
    if "*" in entries:
        raise ValueError("'*' would let any client choose its own address: name your proxies")
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry))
        except ValueError as exc:
            raise ValueError(f"{entry!r} is not an IP address or network ({exc})") from None
    for version in (4, 6):
        for covered in ipaddress.collapse_addresses(n for n in networks if n.version == version):
            if covered.prefixlen == 0:
                raise ValueError(
                    f"{raw!r} covers every IPv{version} address: any client could choose its own"
                )
    return entries


def text(raw: str) -> str:
    return raw


def setting(name: str, default: Any, parse: Parse, about: str, *, secret: bool = False) -> Any:
    """A field of Settings read from the variable `name`; `default` when it is unset or blank."""
    return field(default=default, repr=not secret, metadata={"name": name, "parse": parse, "about": about})


SECONDS = number(float, "a number of seconds")


@dataclass(frozen=True)
class Settings:
    """One field per variable: its name, how it is parsed and what it does in the field's
    metadata (`setting`). Made once, when a command starts."""

    database_url: str | None = setting(
        "DATABASE_URL", None, text, "the PostgreSQL server; unset: an embedded one", secret=True
    )
    data: str | None = setting(
        "SWITCHBOARD_DATA", None, text, "the embedded server's data folder (./.pgdata)"
    )
    retention_days: float = setting(
        "SWITCHBOARD_RETENTION_DAYS",
        7.0,
        number(float, "a number of days"),
        "done and dead todos are kept this long, and history from the day it was written",
    )
    rollup_minute_hours: float = setting(
        "SWITCHBOARD_ROLLUP_MINUTE_HOURS",
        48.0,
        number(float, "a number of hours"),
        "minute rollups are kept this long",
    )
    rollup_hour_days: float = setting(
        "SWITCHBOARD_ROLLUP_HOUR_DAYS",
        90.0,
        number(float, "a number of days"),
        "hour rollups are kept this long",
    )
    horizon_warn_seconds: float = setting(
        "SWITCHBOARD_HORIZON_WARN_SECONDS", 60.0, SECONDS, "warn once vacuum is held back this long"
    )
    inbox_lease: float = setting(
        "SWITCHBOARD_INBOX_LEASE",
        3600.0,
        number(float, "a number of seconds", TTL_MIN, TTL_MAX),
        "a claim from a person's inbox lasts this long",
    )
    log_format: str = setting(
        "SWITCHBOARD_LOG_FORMAT", "text", one_of("text", "json"), "the access log's format"
    )
    metrics_token: str | None = setting(
        "SWITCHBOARD_METRICS_TOKEN", None, text, "GET /metrics asks for this bearer token", secret=True
    )
    metrics: str | None = setting(
        "SWITCHBOARD_METRICS", None, one_of("open"), "open: GET /metrics for anyone"
    )
    max_connections: int = setting(
        "SWITCHBOARD_MAX_CONNECTIONS",
        1000,
        number(int, "a whole number of connections"),
        "open connections a web process serves at once",
    )
    max_waits_per_token: int = setting(
        "SWITCHBOARD_MAX_WAITS_PER_TOKEN",
        100,
        number(int, "a whole number"),
        "long requests a token or a session may have open at once in a web process",
    )
    header_timeout: float = setting(
        "SWITCHBOARD_HEADER_TIMEOUT", 10.0, SECONDS, "a request line and headers must arrive within this"
    )
    keepalive: float = setting(
        "SWITCHBOARD_KEEPALIVE", 5.0, SECONDS, "an idle keep-alive connection stays open this long"
    )
    trusted_proxies: tuple[str, ...] = setting(
        "SWITCHBOARD_TRUSTED_PROXIES",
        ("127.0.0.1", "::1"),  # uvicorn's own default
        trusted_proxies,
        "X-Forwarded-For and -Proto are believed from these addresses and networks",
    )
    public_url: str | None = setting("SWITCHBOARD_PUBLIC_URL", None, web_address, "the address people open")
    secret_key: str | None = setting(
        "SWITCHBOARD_SECRET_KEY", None, secret_key, "the key CSRF tokens are signed with", secret=True
    )
    secret_key_old: str | None = setting(
        "SWITCHBOARD_SECRET_KEY_OLD", None, secret_key, "the previous key, still accepted", secret=True
    )
    url: str = setting(
        "SWITCHBOARD_URL", "http://127.0.0.1:8000", web_address, "the server `worker` and `mcp` talk to"
    )
    token: str | None = setting(
        "SWITCHBOARD_TOKEN", None, text, "the API token of `worker` and `mcp`", secret=True
    )
    given: frozenset[str] = field(default=frozenset(), compare=False)  # the variables set, not defaulted

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Every setting from `environ`; BadSetting for the first that cannot be used."""
        values: dict[str, Any] = {}
        given = set()
        for f in _declared():
            name, raw = f.metadata["name"], environ.get(f.metadata["name"], "").strip()
            if raw:
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as exc:
                    raise BadSetting(name, str(exc)) from None
                given.add(name)
        return cls(**values, given=frozenset(given))


def _declared() -> list[Field]:
    return [f for f in fields(Settings) if "name" in f.metadata]


def declared() -> dict[str, Any]:
    """Each variable's name → its default (what docs/configuration.md must list)."""
    return {f.metadata["name"]: f.default for f in _declared()}
