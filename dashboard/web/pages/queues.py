"""A queue's page (/queues/x): its todos, filtered and paged, its pause and its charts;
and what an operator does to the queue there: pause, resume and bulk actions."""

from __future__ import annotations

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.control import Control
from dashboard.errors import InvalidInput
from dashboard.models import check_queue
from dashboard.reads import LIST_STATES, Reads, TodoFilter
from dashboard.web.pages.bulk import BULK_MAX, run_bulk, selected
from dashboard.web.pages.common import PAGE_SIZE, Fragment, actor, charts_context, reason, takes, with_query
from dashboard.web.responses import page, render
from dashboard.web.searches import SEARCHES
from dashboard.web.templating import figure, none_selected

FILTER_FIELDS = ("state", "assignee", "owner", "kind", "q")  # the queue page's, by query name
MATCHING_SHOWN = 1000  # "all N matching" counts up to this, then says "1,000+"
QUEUE_QUERY = (*FILTER_FIELDS, "after")  # what the queue page and its partial take

# A TodoFilter field (or the cursor) as the queue page's query names it: a refused value
# is shown beside its input.
FILTER_INPUTS = {"state": "state", "assignee": "assignee", "owner": "owner", "kind": "kind"}
FILTER_INPUTS |= {"search": "q", "after": "after"}


def queue_filter(queue: str, params) -> TodoFilter:
    """The queue page's filter from its query string (or a bulk action's form)."""
    return TodoFilter(
        queue=queue,
        state=params.get("state") or None,
        assignee=params.get("assignee") or None,
        owner=params.get("owner") or None,
        kind=params.get("kind") or None,
        search=params.get("q") or None,
    )


def filter_query(params) -> dict:
    """The queue page's filter as its query string names it (for links and forms)."""
    return {k: v for k in FILTER_FIELDS if (v := params.get(k))}


async def queue_context(request: Request, reads: Reads, queue: str, params=None) -> dict:
    """The queue page: its pause, the filtered todos, and how many match (for "all N
    matching this filter"). `params`: the filter, when not the request's query string.
    An empty list says whether the queue has no todo at all (`unknown_queue`)."""
    q = request.query_params if params is None else params
    filters = queue_filter(queue, q)
    after = request.query_params.get("after") if params is None else None
    with SEARCHES.slot(f"operator:{request.scope['operator'].name}", filters):
        result = await reads.list_todos(filters, limit=PAGE_SIZE, after=after)
        matching = len(result.items)
        if result.next_cursor or after:
            matching = len(await reads.matching_ids(filters, limit=MATCHING_SHOWN + 1))
    estimate = await reads.estimate_matching(filters) if matching > MATCHING_SHOWN else None
    return {
        **await queue_control_context(reads, queue),
        "filters": filters,
        "page": result,
        "matching": matching,
        "matching_more": matching > MATCHING_SHOWN,
        "total": matching_text(matching, estimate),
        "states": LIST_STATES,
        "query": filter_query(q),
        "unknown_queue": not result.items and await reads.unknown_queues([queue]) == [queue],
    }


def matching_text(matching: int, estimate: int | None) -> str:
    """The list's total: '1,234 matching'; past MATCHING_SHOWN, the queue's count when
    it has one for this filter ('about 1.2M matching'), else '1,000+ matching'."""
    if matching <= MATCHING_SHOWN:
        return f"{matching:,} matching"
    if estimate is not None and estimate > MATCHING_SHOWN:
        return f"{figure(estimate, True)} matching"
    return f"{MATCHING_SHOWN:,}+ matching"


async def filter_error_context(request: Request, reads: Reads, queue: str, error: InvalidInput) -> dict:
    """The queue page for a filter it cannot apply (a malformed payload search, a NUL in
    a filter, a cursor this server did not give out): the form as it was sent, the error
    beside its input (`filter_error`: query name, message), and no list."""
    q = request.query_params
    return {
        **await queue_control_context(reads, queue),
        "filters": queue_filter(queue, q),
        "filter_error": (FILTER_INPUTS[error.field], error.message),
        "states": LIST_STATES,
        "query": filter_query(q),
    }


async def queue_control_context(reads: Reads, queue: str) -> dict:
    """The queue's pause, if any, and its last pauses and resumes."""
    pauses = [p for p in await reads.paused_queues() if p.queue == queue]
    return {
        "queue": queue,
        "pause": pauses[0] if pauses else None,
        "queue_history": await reads.queue_history(queue, limit=5),
    }


@get("/queues/{queue:str}", opt=takes(*QUEUE_QUERY, "range"))
async def queue_page(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    try:
        return page(
            request,
            "queue.html",
            **await queue_context(request, reads, queue),
            **await charts_context(reads, queue, request),
        )
    except InvalidInput as exc:
        if exc.field not in FILTER_INPUTS:
            raise
        return page(
            request, "queue.html", status=422, **await filter_error_context(request, reads, queue, exc)
        )


@get("/partials/queues/{queue:str}", opt=takes(*QUEUE_QUERY))
async def queue_partial(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return render(request, "partials/todos.html", **await queue_context(request, reads, queue))


@get("/partials/queues/{queue:str}/control")
async def queue_control_partial(
    request: Request, reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template:
    return render(request, "partials/queue_control.html", **await queue_control_context(reads, queue))


@get("/partials/queues/{queue:str}/charts", opt=takes("range"))
async def queue_charts(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return render(request, "partials/charts.html", **await charts_context(reads, check_queue(queue), request))


# -- actions --------------------------------------------------------------------------------


@post("/queues/{queue:str}/pause")
async def pause_queue(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    await control.pause(queue, actor(request), reason(await request.form()))
    return await _control(reads, queue).answer(request, f"queue {queue} paused: claims skip it until resumed")


@post("/queues/{queue:str}/resume")
async def resume_queue(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    resumed = await control.resume(queue, actor(request), reason(await request.form()))
    message = f"queue {queue} resumed" if resumed else f"queue {queue} was not paused"
    return await _control(reads, queue).answer(request, message)


def _control(reads: Reads, queue: str) -> Fragment:
    """The queue's pause, which pausing and resuming change."""
    return Fragment(
        f"/queues/{queue}", "partials/queue_control.html", lambda: queue_control_context(reads, queue)
    )


@post("/queues/{queue:str}/bulk")
async def queue_bulk(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    """The filter comes with the form and is applied again now, in the database: todos that
    changed since the page was drawn are skipped and counted."""
    form = await request.form()
    todos = Fragment(
        with_query(f"/queues/{queue}", filter_query(form)),
        "partials/todos.html",
        lambda: queue_context(request, reads, queue, form),
    )
    if form.get("scope") == "all":
        ids = await reads.matching_ids(queue_filter(queue, form), limit=BULK_MAX)
        refusal = "No todo matches the filter any more."
    else:
        ids, refusal = selected(form), none_selected("todo")
    if not ids:
        return await todos.answer(request, refusal, "error")
    report = await run_bulk(control, request, form, ids, form.get("action", ""))
    return await todos.answer(
        request, report.summary(), "error" if report.skipped and not report.changed else "ok"
    )


ROUTES = [
    queue_page,
    queue_partial,
    queue_control_partial,
    queue_charts,
    pause_queue,
    resume_queue,
    queue_bulk,
]
