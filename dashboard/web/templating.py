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


def configure(engine: JinjaTemplateEngine) -> None:
    env = engine.engine
    env.filters.update(ago=ago, duration=duration, pretty_json=pretty_json, iso=iso)
