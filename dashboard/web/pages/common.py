"""What several dashboard pages share: the query-string check of every page, the operator
an action is recorded as and how it answers (Fragment), the form fields more than one form
has, and the history charts of the overview and the queue pages."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler
from litestar.response import Redirect, Template

from dashboard.charts import RANGES, chart_set
from dashboard.errors import InvalidInput
from dashboard.models import MAX_JSON_BYTES, Actor
from dashboard.reads import Reads
from dashboard.web.auth import current_operator
from dashboard.web.responses import after_action

PAGE_SIZE = 50  # rows of a list page (a queue's todos, the dead-letters)

# A payload (or a result) may be MAX_JSON_BYTES of JSON, and URL-encoding can triple it;
# other forms keep the dashboard's 64 KiB (app.py).
PAYLOAD_FORM_LIMIT = 3 * MAX_JSON_BYTES + 64 * 1024


async def known_query(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Guard of every page: its query string names only the parameters it `takes`. A
    mistyped one (?cursor= for ?after=) is a 400 that lists them, not silently ignored."""
    if await current_operator(connection) is None:
        return  # guards run before require_login, which sends the browser to log in
    accepted = handler.opt.get("query", frozenset())
    unknown = sorted(set(connection.query_params) - accepted)
    if unknown:
        known = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"
        raise HTTPException(
            status_code=400,
            detail=f"This page does not know the parameter {', '.join(map(repr, unknown))} ({known}).",
        )


def takes(*names: str) -> dict:
    """A page's route options: the query parameters it accepts (none when not given)."""
    return {"query": frozenset(names)}


def actor(request: Request) -> Actor:
    return Actor("operator", request.scope["operator"].name)


@dataclass(frozen=True, slots=True)
class Fragment:
    """The part of a page an action changes: htmx swaps in `partial` with its `context()`
    built afresh, a plain form goes back to the page at `url` (responses.after_action)."""

    url: str
    partial: str
    context: Callable[[], Awaitable[dict]]

    async def answer(self, request: Request, message: str, kind: str = "ok") -> Template | Redirect:
        return await after_action(
            request, message, url=self.url, partial=self.partial, context=self.context, kind=kind
        )


def with_query(path: str, query: dict) -> str:
    """`path` with the page's filter (the page an action goes back to)."""
    return path + (f"?{urlencode(query)}" if query else "")


def reason(form) -> str | None:
    return (form.get("reason") or "").strip() or None


def budget(form) -> bool:
    """The retry budget choice: True for one more attempt, False for a fresh budget."""
    choice = form.get("budget", "fresh")
    if choice not in ("fresh", "one_more"):
        raise InvalidInput("budget", "must be fresh or one_more")
    return choice == "one_more"


def utc(text: str) -> str:
    """A time from a form: the browser's datetime-local has no zone, and the forms say UTC."""
    if text and len(text) <= 19 and "+" not in text and not text.endswith("Z"):
        return text + "+00:00"
    return text


def parse_payload(text: str) -> tuple[dict | None, str | None]:
    """A form's payload text: (the JSON value, None), or (None, what is wrong with it)."""
    try:
        return json.loads(text or "{}"), None
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "is nested too deeply (JSON arrays and objects inside each other)"


async def charts_context(reads: Reads, queue: str | None, request: Request) -> dict:
    """The history charts (dashboard/charts.py) of one queue or all, in the range asked for."""
    return {"charts": await chart_set(reads.db, queue, request.query_params.get("range")), "ranges": RANGES}
