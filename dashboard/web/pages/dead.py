"""The dead-letters page (/dead): the todos out of attempts or cancelled, by queue; and
an operator's retries and bulk changes of them."""

from __future__ import annotations

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from dashboard.control import Control
from dashboard.errors import InvalidInput
from dashboard.reads import Reads
from dashboard.web.pages.bulk import run_bulk, selected
from dashboard.web.pages.common import PAGE_SIZE, Fragment, takes, with_query
from dashboard.web.responses import page, render
from dashboard.web.templating import none_selected

DEAD_QUERY = ("queue", "cancelled", "after")
CANCELLED_CHOICES = {"": None, "only": True, "hide": False}  # the page's "cancelled"


def _shown(cancelled: bool | None) -> str:
    return next(k for k, v in CANCELLED_CHOICES.items() if v is cancelled)


def dead_filter(params) -> tuple[str | None, bool | None]:
    """The dead-letters page's (queue, cancelled) from its query string or a form."""
    choice = params.get("cancelled") or ""
    if choice not in CANCELLED_CHOICES:
        raise InvalidInput("cancelled", "must be only or hide (or empty: both)")
    return params.get("queue") or None, CANCELLED_CHOICES[choice]


def dead_query(queue: str | None, cancelled: bool | None) -> dict:
    """The filter as the page's query string names it (for links, forms, going back)."""
    return {k: v for k, v in (("queue", queue), ("cancelled", _shown(cancelled))) if v}


async def dead_context(
    reads: Reads, queue: str | None, cancelled: bool | None, after: str | None = None
) -> dict:
    result = await reads.dead_letters(queue, cancelled=cancelled, limit=PAGE_SIZE, after=after)
    return {
        "page": result,
        "queue": queue,
        "cancelled": cancelled,
        "queues": await reads.dead_letter_queues(),
        "query": dead_query(queue, cancelled),
    }


@get("/dead", opt=takes(*DEAD_QUERY))
async def dead_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    return page(request, "dead.html", **await dead_context(reads, *dead_filter(request.query_params), after))


@get("/partials/dead", opt=takes(*DEAD_QUERY))
async def dead_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    context = await dead_context(reads, *dead_filter(request.query_params), after)
    return render(request, "partials/dead.html", **context)


@post(["/dead/retry", "/dead/bulk"])
async def dead_bulk(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads]
) -> Template | Redirect:
    """Retry one, the selected, or all dead-letters that match (/dead/retry), or set their
    priority or assignee (/dead/bulk, the form's bulk_action and bulk_scope)."""
    form = await request.form()
    queue, cancelled = dead_filter(form)
    bulk = request.url.path.endswith("/bulk")
    action, scope = (
        (form.get("bulk_action", ""), form.get("bulk_scope")) if bulk else ("retry", form.get("scope"))
    )
    dead = Fragment(
        with_query("/dead", dead_query(queue, cancelled)),
        "partials/dead.html",
        lambda: dead_context(reads, queue, cancelled),
    )
    if form.get("one"):
        ids, refusal = [form["one"]], ""
    elif scope == "all":
        ids = await reads.dead_letter_ids(queue, cancelled=cancelled)
        refusal = "No dead-letter matches the filter any more."
    else:
        ids, refusal = selected(form), none_selected("dead-letter")
    if not ids:
        return await dead.answer(request, refusal, "error")
    report = await run_bulk(control, request, form, ids, action)
    return await dead.answer(request, report.summary(), "error" if report.skipped else "ok")


ROUTES = [dead_page, dead_partial, dead_bulk]
