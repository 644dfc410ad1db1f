"""Times as people read them ('3s ago', '2m 5s'): on the dashboard's pages (Jinja filters,
dashboard/web/templating.py) and in the history charts' labels (dashboard/charts.py)."""

from __future__ import annotations

from datetime import UTC, datetime

EMPTY = "—"  # the one mark for "nothing here", on every page


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """'3s ago', 'in 2m' — relative to now; under a second, 'just now' or 'in under a second'."""
    if value is None:
        return EMPTY
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if abs(seconds) < 1:
        return "just now" if seconds >= 0 else "in under a second"
    text = duration(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def duration(seconds: float | None) -> str:
    """Whole seconds and up ('3s', '2m 5s', '4h'): an operator reads no milliseconds."""
    if seconds is None:
        return EMPTY
    s = abs(seconds)
    if s < 1:
        return "<1s"
    s = round(s)  # whole seconds first: 599.97 s is "10m 0s", not "9m 60s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m {s % 60:.0f}s" if s < 600 else f"{s // 60:.0f}m"
    if s < 86400:
        return f"{s // 3600:.0f}h {s % 3600 // 60:.0f}m" if s < 36000 else f"{s // 3600:.0f}h"
    return f"{s // 86400:.0f}d"
