"""Jinja filters: times as people read them (dashboard/durations.py), JSON pretty-printed
(autoescaped as text)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from litestar.plugins.jinja import JinjaTemplateEngine
from markupsafe import Markup

from dashboard.durations import ago, duration
from dashboard.models import SURROGATES


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def iso(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else ""


def utc(value: datetime | None) -> str:
    """The absolute time, with its zone, for a tooltip beside a relative one."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else ""


def field_error(message: str, field: str) -> str:
    """An input check's message as a sentence under its field: 'is required' under title
    reads 'Title is required.'; a message that names its own subject is only capitalised."""
    if message.startswith(("is ", "must ", "needs ", "may ")):
        message = f"{field.replace('_', ' ').capitalize()} {message}"
    return message[:1].upper() + message[1:].rstrip(".") + "."


def bdi(value, empty: str = "") -> Markup | str:
    """Text someone else wrote (an agent's title or kind, a name, a reason), isolated from
    the words around it: a right-to-left override inside it cannot reorder ours ("from
    agent …" read backwards). `empty` stands for none."""
    if value is None or value == "":
        return empty
    return Markup("<bdi>%s</bdi>") % value


def isolated(value) -> str:
    """The same isolation where no element can go (an attribute, the page's <title>): the
    text between FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE."""
    return f"\u2068{value}\u2069"


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


def shown(value):
    """Every value a page prints, as UTF-8 can send it: a lone surrogate, which only a form
    just sent can hold (and its check refuses), is shown as U+FFFD beside that refusal."""
    if isinstance(value, str) and not value.isascii() and SURROGATES.search(value):
        return type(value)(SURROGATES.sub("\ufffd", value))  # Markup stays Markup
    return value


def configure(engine: JinjaTemplateEngine) -> None:
    env = engine.engine
    env.finalize = shown  # before any template is compiled: the compiler emits the call
    env.filters.update(
        ago=ago, duration=duration, pretty_json=pretty_json, iso=iso, utc=utc, field_error=field_error
    )
    env.filters.update(figure=figure, bdi=bdi, isolated=isolated)
    env.globals["none_selected"] = none_selected
