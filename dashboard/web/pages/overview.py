"""The overview (/): every queue's counts, the vacuum horizon, the operator's inbox count
and the history charts of all queues."""

from __future__ import annotations

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.response import Template

from dashboard.horizon import HorizonWatch
from dashboard.inbox import waiting_count
from dashboard.reads import Reads
from dashboard.web.pages.common import charts_context, takes
from dashboard.web.responses import page, render
from dashboard.web.stats_cache import StatsCache

TOTALS = ("ready", "scheduled", "retrying", "claimed", "lapsed", "done_recent", "dead")


async def overview_context(request: Request, stats: StatsCache, horizon: HorizonWatch, reads: Reads) -> dict:
    queues = await stats.get()
    return {
        "stats": queues,
        "totals": {k: sum(getattr(s, k) for s in queues) for k in TOTALS},
        "approximate": {k for k in TOTALS if any(k in s.approximate for s in queues)},
        "horizon": await horizon.get(),
        "inbox_waiting": await waiting_count(reads.db, request.scope["operator"].name),
    }


@get("/", opt=takes("range"))
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


@get("/partials/overview")
async def overview_partial(
    request: Request,
    stats: NamedDependency[StatsCache],
    horizon: NamedDependency[HorizonWatch],
    reads: NamedDependency[Reads],
) -> Template:
    return render(request, "partials/overview.html", **await overview_context(request, stats, horizon, reads))


@get("/partials/charts", opt=takes("range"))
async def overview_charts(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/charts.html", **await charts_context(reads, None, request))


ROUTES = [overview, overview_partial, overview_charts]
