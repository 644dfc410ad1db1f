"""Dashboard pages (GET) and their htmx partials. Each view has one context builder
shared by the page (`/x`) and its partial (`/partials/x`); actions.py re-renders the
same partials after a form post."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from litestar import Request, get
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.params import FromPath
from litestar.response import Template

from dashboard.accounts import Accounts
from dashboard.charts import RANGES, chart_set
from dashboard.errors import InvalidInput
from dashboard.horizon import HorizonWatch
from dashboard.inbox import waiting_count
from dashboard.models import DEFAULT_MAX_ATTEMPTS, Problems, check_queue, check_text
from dashboard.reads import LIST_STATES, Reads, TodoFilter
from dashboard.web.auth import current_operator
from dashboard.web.responses import page, render
from dashboard.web.searches import SEARCHES
from dashboard.web.stats_cache import StatsCache
from dashboard.web.templating import figure

PAGE_SIZE = 50
LEASES_SHOWN = 100  # soonest expiry first; the rest are counted
TOTALS = ("ready", "scheduled", "retrying", "claimed", "lapsed", "done_recent", "dead")


# -- query parameters -----------------------------------------------------------------


async def known_query(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Guard of every page: its query string names only the parameters it `takes`. A
    mistyped one (?cursor= for ?after=) is a 400 that lists them, not silently ignored."""
    if await current_operator(connection) is None:
        return  # guards run before require_login, which sends the browser to log in
    accepted = handler.opt["query"]
    unknown = sorted(set(connection.query_params) - accepted)
    if unknown:
        known = f"it takes {', '.join(sorted(accepted))}" if accepted else "it takes none"
        raise HTTPException(
            status_code=400,
            detail=f"This page does not know the parameter {', '.join(map(repr, unknown))} ({known}).",
        )


def takes(*names: str) -> dict:
    """A page's route options: the query parameters it accepts (checked by known_query)."""
    return {"guards": [known_query], "opt": {"query": frozenset(names)}}


# -- context builders -----------------------------------------------------------------


async def overview_context(request: Request, stats: StatsCache, horizon: HorizonWatch, reads: Reads) -> dict:
    queues = await stats.get()
    return {
        "stats": queues,
        "totals": {k: sum(getattr(s, k) for s in queues) for k in TOTALS},
        "approximate": {k for k in TOTALS if any(k in s.approximate for s in queues)},
        "horizon": await horizon.get(),
        "inbox_waiting": await waiting_count(reads.db, request.scope["operator"].name),
    }


FILTER_FIELDS = ("state", "assignee", "owner", "kind", "q")  # the queue page's, by query name
MATCHING_SHOWN = 1000  # "all N matching" counts up to this, then says "1,000+"
QUEUE_QUERY = (*FILTER_FIELDS, "after")  # what the queue page and its partial take
DEAD_QUERY = ("queue", "cancelled", "after")


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


def filter_query(params) -> dict:
    """The queue page's filter as its query string names it (for links and forms)."""
    return {k: v for k in FILTER_FIELDS if (v := params.get(k))}


# A TodoFilter field (or the cursor) as the queue page's query names it: a refused value
# is shown beside its input.
FILTER_INPUTS = {"state": "state", "assignee": "assignee", "owner": "owner", "kind": "kind"}
FILTER_INPUTS |= {"search": "q", "after": "after"}


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


async def leases_context(reads: Reads, owner: str | None = None) -> dict:
    """The leases page: every lease, or those `owner` holds (an agent's, from the agents page)."""
    leases = await reads.leases(limit=LEASES_SHOWN, owner=owner)
    total = await reads.lease_count(owner) if len(leases) == LEASES_SHOWN else len(leases)
    return {"leases": leases, "total": total, "owner": owner}


async def agents_context(reads: Reads) -> dict:
    return {"agents": await reads.agents()}


async def dead_context(
    reads: Reads, queue: str | None, cancelled: bool | None, after: str | None = None
) -> dict:
    result = await reads.dead_letters(queue, cancelled=cancelled, limit=PAGE_SIZE, after=after)
    return {
        "page": result,
        "queue": queue,
        "cancelled": cancelled,
        "queues": await reads.dead_letter_queues(),
        "query": {k: v for k, v in (("queue", queue), ("cancelled", _shown(cancelled))) if v},
    }


CANCELLED_CHOICES = {"": None, "only": True, "hide": False}  # the dead-letters page's "cancelled"


def _shown(cancelled: bool | None) -> str:
    return next(k for k, v in CANCELLED_CHOICES.items() if v is cancelled)


def dead_filter(params) -> tuple[str | None, bool | None]:
    """The dead-letters page's (queue, cancelled) from its query string or a form."""
    choice = params.get("cancelled") or ""
    if choice not in CANCELLED_CHOICES:
        raise InvalidInput("cancelled", "must be only or hide (or empty: both)")
    return params.get("queue") or None, CANCELLED_CHOICES[choice]


async def todo_context(reads: Reads, todo_id: str) -> dict:
    detail = await reads.todo_detail(todo_id)
    return {"detail": detail, "todo": detail.todo}


# -- pages and partials ------------------------------------------------------------------


async def charts_context(reads: Reads, queue: str | None, request: Request) -> dict:
    """The history charts (dashboard/charts.py) of one queue or all, in the range asked for."""
    return {"charts": await chart_set(reads.db, queue, request.query_params.get("range")), "ranges": RANGES}


@get("/", **takes("range"))
async def overview(
    request: Request,
    stats: NamedDependency[StatsCache],
    horizon: NamedDependency[HorizonWatch],
    reads: NamedDependency[Reads],
) -> Template:
    return page(
        request,
        "overview.html",
        **await overview_context(request, stats, horizon, reads),
        **await charts_context(reads, None, request),
    )


@get("/partials/charts", **takes("range"))
async def overview_charts(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/charts.html", **await charts_context(reads, None, request))


@get("/partials/queues/{queue:str}/charts", **takes("range"))
async def queue_charts(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return render(request, "partials/charts.html", **await charts_context(reads, check_queue(queue), request))


@get("/partials/overview", **takes())
async def overview_partial(
    request: Request,
    stats: NamedDependency[StatsCache],
    horizon: NamedDependency[HorizonWatch],
    reads: NamedDependency[Reads],
) -> Template:
    return render(request, "partials/overview.html", **await overview_context(request, stats, horizon, reads))


@get("/queues/{queue:str}", **takes(*QUEUE_QUERY, "range"))
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


@get("/partials/queues/{queue:str}", **takes(*QUEUE_QUERY))
async def queue_partial(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return render(request, "partials/todos.html", **await queue_context(request, reads, queue))


@get("/partials/queues/{queue:str}/control", **takes())
async def queue_control_partial(
    request: Request, reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template:
    return render(request, "partials/queue_control.html", **await queue_control_context(reads, queue))


@get("/leases", **takes("owner"))
async def leases_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    owner = request.query_params.get("owner") or None
    return page(request, "leases.html", **await leases_context(reads, owner))


@get("/partials/leases", **takes("owner"))
async def leases_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    owner = request.query_params.get("owner") or None
    return render(request, "partials/leases.html", **await leases_context(reads, owner))


@get("/agents", **takes())
async def agents_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    return page(request, "agents.html", **await agents_context(reads))


@get("/partials/agents", **takes())
async def agents_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/agents.html", **await agents_context(reads))


@get("/dead", **takes(*DEAD_QUERY))
async def dead_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    return page(request, "dead.html", **await dead_context(reads, *dead_filter(request.query_params), after))


@get("/partials/dead", **takes(*DEAD_QUERY))
async def dead_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    context = await dead_context(reads, *dead_filter(request.query_params), after)
    return render(request, "partials/dead.html", **context)


@get("/todos/{todo_id:str}", **takes())
async def todo_page(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return page(request, "todo.html", **await todo_context(reads, todo_id))


@get("/partials/todos/{todo_id:str}", **takes())
async def todo_partial(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return render(request, "partials/todo.html", **await todo_context(reads, todo_id))


@get("/create", **takes("queue"))
async def create_page(request: Request) -> Template:
    values = {
        "payload": "{}",
        "max_attempts": str(DEFAULT_MAX_ATTEMPTS),
        "priority": "0",
        "queue": request.query_params.get("queue", ""),
    }
    return page(request, "create.html", values=values, errors={})


async def tokens_view(
    request: Request,
    accounts: Accounts,
    *,
    new_secret: str | None = None,
    unknown: list[str] | None = None,
    values: dict | None = None,
    errors: dict | None = None,
    status: int = 200,
) -> Template:
    """The tokens page (operators only: it names every agent and its queues): right after
    `add` it shows the new secret (no cache keeps it: no dashboard page is kept, app.py),
    and the `unknown` queues it names (no todo there yet). A refused form comes back with
    its `values` and `errors`."""
    return page(
        request,
        "tokens.html",
        status=status,
        tokens=await accounts.list_tokens(),
        new_secret=new_secret,
        unknown=unknown or [],
        values=values or {},
        errors=errors or {},
    )


@get("/tokens", **takes())
async def tokens_page(request: Request, accounts: NamedDependency[Accounts]) -> Template:
    # Not a guard: guards run before require_login, which answers first when there is no
    # operator account at all.
    if not request.scope["operator"].can_change:
        raise PermissionDeniedException("the tokens page is for operators")
    return await tokens_view(request, accounts)


def sample_errors() -> dict[str, str]:
    """The patterns page's form errors, made by the real checks."""
    problems = Problems()
    problems.check(check_queue, "Bad Queue")
    problems.check(check_text, "", "title", required=True)
    return problems.fields


@get("/patterns", **takes())
async def patterns_page(request: Request) -> Template:
    """Every UI piece on one page, so styling stays consistent (linked from the README only)."""
    now = datetime.now(UTC)
    return page(
        request,
        "patterns.html",
        read_at=now,
        retry_at=now + timedelta(seconds=42),
        values={"queue": "Bad Queue", "title": ""},
        errors=sample_errors(),
    )


ROUTES = [
    overview,
    overview_partial,
    overview_charts,
    queue_charts,
    queue_page,
    queue_partial,
    queue_control_partial,
    leases_page,
    leases_partial,
    agents_page,
    agents_partial,
    dead_page,
    dead_partial,
    todo_page,
    todo_partial,
    create_page,
    tokens_page,
    patterns_page,
]
