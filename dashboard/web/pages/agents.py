"""The agents page (/agents): every agent with an active token, a lease now, or steps in
the last day."""

from __future__ import annotations

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.response import Template

from dashboard.reads import Reads
from dashboard.web.responses import page, render


async def agents_context(reads: Reads) -> dict:
    return {"agents": await reads.agents()}


@get("/agents")
async def agents_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    return page(request, "agents.html", **await agents_context(reads))


@get("/partials/agents")
async def agents_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/agents.html", **await agents_context(reads))


ROUTES = [agents_page, agents_partial]
