"""The leases page (/leases): every lease held now, soonest expiry first, or one agent's.
A lease is released from here by the todo's own action (todos.release_todo)."""

from __future__ import annotations

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.response import Template

from dashboard.reads import Reads
from dashboard.web.pages.common import Fragment, takes, with_query
from dashboard.web.responses import page, render

LEASES_SHOWN = 100  # soonest expiry first; the rest are counted


async def leases_context(reads: Reads, owner: str | None = None) -> dict:
    """The leases page: every lease, or those `owner` holds (an agent's, from the agents page)."""
    leases = await reads.leases(limit=LEASES_SHOWN, owner=owner)
    total = await reads.lease_count(owner) if len(leases) == LEASES_SHOWN else len(leases)
    return {"leases": leases, "total": total, "owner": owner}


def leases_list(reads: Reads, owner: str | None) -> Fragment:
    """The list as filtered, which releasing a lease from it changes (todos.release_todo)."""
    url = with_query("/leases", {"owner": owner} if owner else {})
    return Fragment(url, "partials/leases.html", lambda: leases_context(reads, owner))


@get("/leases", opt=takes("owner"))
async def leases_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    owner = request.query_params.get("owner") or None
    return page(request, "leases.html", **await leases_context(reads, owner))


@get("/partials/leases", opt=takes("owner"))
async def leases_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    owner = request.query_params.get("owner") or None
    return render(request, "partials/leases.html", **await leases_context(reads, owner))


ROUTES = [leases_page, leases_partial]
