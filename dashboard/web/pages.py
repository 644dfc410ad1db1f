"""Dashboard pages (GET) and their htmx partials. Each view has one context builder
shared by the page (`/x`) and its partial (`/partials/x`); actions.py re-renders the
same partials after a form post."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.exceptions import PermissionDeniedException
from litestar.params import FromPath
from litestar.response import Template

from dashboard.accounts import Accounts
from dashboard.errors import InvalidInput
from dashboard.horizon import HorizonWatch
from dashboard.models import DEFAULT_MAX_ATTEMPTS
from dashboard.reads import LIST_STATES, Reads, TodoFilter
from dashboard.web.responses import page, render
from dashboard.web.stats_cache import StatsCache

PAGE_SIZE = 50
LEASES_SHOWN = 100  # soonest expiry first; the rest are counted
TOTALS = ("ready", "scheduled", "retrying", "claimed", "lapsed", "done_recent", "dead")


# -- context builders -----------------------------------------------------------------


async def overview_context(stats: StatsCache, horizon: HorizonWatch) -> dict:
    queues = await stats.get()
    return {
        "stats": queues,
        "totals": {k: sum(getattr(s, k) for s in queues) for k in TOTALS},
        "approximate": {k for k in TOTALS if any(k in s.approximate for s in queues)},
        "horizon": await horizon.get(),
    }


FILTER_FIELDS = ("state", "assignee", "owner", "kind", "q")  # the queue page's, by query name
MATCHING_SHOWN = 1000  # "all N matching" counts up to this, then says "1,000+"


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
    matching this filter"). `params`: the filter, when not the request's query string."""
    q = request.query_params if params is None else params
    filters = queue_filter(queue, q)
    after = request.query_params.get("after") if params is None else None
    result = await reads.list_todos(filters, limit=PAGE_SIZE, after=after)
    matching = len(result.items)
    if result.next_cursor or after:
        matching = len(await reads.matching_ids(filters, limit=MATCHING_SHOWN + 1))
    return {
        **await queue_control_context(reads, queue),
        "filters": filters,
        "page": result,
        "matching": matching,
        "matching_more": matching > MATCHING_SHOWN,
        "states": LIST_STATES,
        "query": {k: v for k in FILTER_FIELDS if (v := q.get(k))},
    }


async def queue_control_context(reads: Reads, queue: str) -> dict:
    """The queue's pause, if any, and its last pauses and resumes."""
    pauses = [p for p in await reads.paused_queues() if p.queue == queue]
    return {
        "queue": queue,
        "pause": pauses[0] if pauses else None,
        "queue_history": await reads.queue_history(queue, limit=5),
    }


async def leases_context(reads: Reads) -> dict:
    leases = await reads.leases(limit=LEASES_SHOWN)
    total = await reads.lease_count() if len(leases) == LEASES_SHOWN else len(leases)
    return {"leases": leases, "total": total}


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


@get("/")
async def overview(
    request: Request, stats: NamedDependency[StatsCache], horizon: NamedDependency[HorizonWatch]
) -> Template:
    return page(request, "overview.html", **await overview_context(stats, horizon))


@get("/partials/overview")
async def overview_partial(
    request: Request, stats: NamedDependency[StatsCache], horizon: NamedDependency[HorizonWatch]
) -> Template:
    return render(request, "partials/overview.html", **await overview_context(stats, horizon))


@get("/queues/{queue:str}")
async def queue_page(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return page(request, "queue.html", **await queue_context(request, reads, queue))


@get("/partials/queues/{queue:str}")
async def queue_partial(request: Request, reads: NamedDependency[Reads], queue: FromPath[str]) -> Template:
    return render(request, "partials/todos.html", **await queue_context(request, reads, queue))


@get("/partials/queues/{queue:str}/control")
async def queue_control_partial(
    request: Request, reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template:
    return render(request, "partials/queue_control.html", **await queue_control_context(reads, queue))


@get("/leases")
async def leases_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    return page(request, "leases.html", **await leases_context(reads))


@get("/partials/leases")
async def leases_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/leases.html", **await leases_context(reads))


@get("/dead")
async def dead_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    return page(request, "dead.html", **await dead_context(reads, *dead_filter(request.query_params), after))


@get("/partials/dead")
async def dead_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    after = request.query_params.get("after")
    context = await dead_context(reads, *dead_filter(request.query_params), after)
    return render(request, "partials/dead.html", **context)


@get("/todos/{todo_id:str}")
async def todo_page(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return page(request, "todo.html", **await todo_context(reads, todo_id))


@get("/partials/todos/{todo_id:str}")
async def todo_partial(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return render(request, "partials/todo.html", **await todo_context(reads, todo_id))


@get("/create")
async def create_page(request: Request) -> Template:
    values = {
        "payload": "{}",
        "max_attempts": str(DEFAULT_MAX_ATTEMPTS),
        "priority": "0",
        "queue": request.query_params.get("queue", ""),
    }
    return page(request, "create.html", values=values, errors={})


async def tokens_view(
    request: Request, accounts: Accounts, new_secret: str | None = None, error: str | None = None
) -> Template:
    """The tokens page (operators only: it names every agent and its queues), never kept
    by a cache: right after `add` it shows the new secret."""
    tokens = await accounts.list_tokens()
    response = page(request, "tokens.html", tokens=tokens, new_secret=new_secret, error=error)
    response.headers["Cache-Control"] = "no-store"
    return response


@get("/tokens")
async def tokens_page(request: Request, accounts: NamedDependency[Accounts]) -> Template:
    # Not a guard: guards run before require_login, which answers first when there is no
    # operator account at all.
    if not request.scope["operator"].can_change:
        raise PermissionDeniedException("the tokens page is for operators")
    return await tokens_view(request, accounts)


@get("/patterns")
async def patterns_page(request: Request) -> Template:
    """Every UI piece on one page, so styling stays consistent (linked from the README only)."""
    now = datetime.now(UTC)
    return page(
        request,
        "patterns.html",
        read_at=now,
        retry_at=now + timedelta(seconds=42),
        values={"queue": "Bad Queue", "title": ""},
        errors={"queue": "'Bad Queue' is not a queue name", "title": "is required"},
    )


ROUTES = [
    overview,
    overview_partial,
    queue_page,
    queue_partial,
    queue_control_partial,
    leases_page,
    leases_partial,
    dead_page,
    dead_partial,
    todo_page,
    todo_partial,
    create_page,
    tokens_page,
    patterns_page,
]
