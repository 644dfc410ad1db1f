"""Jinja filters: times as people read them, JSON pretty-printed (autoescaped as text)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from litestar.plugins.jinja import JinjaTemplateEngine


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """'3s ago', 'in 2m' — relative to now."""
    if value is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    text = duration(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = abs(seconds)
    if s < 1:
        return f"{s * 1000:.0f}ms"
    s = round(s)  # whole seconds first: 599.97 s is "10m 0s", not "9m 60s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m {s % 60:.0f}s" if s < 600 else f"{s // 60:.0f}m"
    if s < 86400:
        return f"{s // 3600:.0f}h {s % 3600 // 60:.0f}m" if s < 36000 else f"{s // 3600:.0f}h"
    return f"{s // 86400:.0f}d"


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else ""


def figure(value: int, approximate: bool = False) -> str:
    """A count as pages show it: exact with thousands separators, or, when it is an
    approximation (README "Counts at scale"), two significant digits: 'about 1.2M'."""
    if not approximate:
        return f"{value:,}"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            scaled = value / size
            return f"about {scaled:.0f}{unit}" if scaled >= 10 else f"about {scaled:.1f}{unit}"
    return f"about {value:,}"


def none_selected(noun: str) -> str:
    """What a bulk action with no box ticked is told: by the page's script, before it is
    sent, or by the server when it is sent anyway."""
    return f"Select at least one {noun} (tick its box), or choose all that match the filter."


def configure(engine: JinjaTemplateEngine) -> None:
    env = engine.engine
    env.filters.update(ago=ago, duration=duration, pretty_json=pretty_json, iso=iso)
    env.filters["figure"] = figure
