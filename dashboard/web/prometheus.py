"""GET /metrics, for Prometheus: not open by default.

SWITCHBOARD_METRICS_TOKEN=<secret> asks for `Authorization: Bearer <secret>`;
SWITCHBOARD_METRICS=open serves anyone (for a private network); with neither, /metrics
answers 404 saying how to turn it on. With both, the token is asked for. Both are read
when the app is made (dashboard/config.py).
"""

from __future__ import annotations

import hmac

from litestar import Request, Response, get
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

from dashboard import metrics
from dashboard.config import Settings
from dashboard.errors import DatabaseUnavailable
from dashboard.horizon import HorizonWatch
from dashboard.web.errors import problem
from dashboard.web.stats_cache import StatsCache

OFF = (
    "metrics are off: set SWITCHBOARD_METRICS_TOKEN=<secret> and scrape with "
    "Authorization: Bearer <secret>, or SWITCHBOARD_METRICS=open on a private network"
)


def metrics_route(settings: Settings) -> HTTPRouteHandler:
    token = (settings.metrics_token or "").encode()
    is_open = not token and settings.metrics == "open"

    @get("/metrics", include_in_schema=False, skip_session=True)
    async def scrape(
        request: Request, stats: NamedDependency[StatsCache], horizon: NamedDependency[HorizonWatch]
    ) -> Response:
        if not (is_open or token):
            return problem(404, OFF)
        if not is_open:
            scheme, _, secret = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(secret.strip().encode(), token):
                return problem(
                    401,
                    "send Authorization: Bearer <SWITCHBOARD_METRICS_TOKEN>",
                    {"WWW-Authenticate": 'Bearer realm="switchboard metrics"'},
                )
        try:
            # The overview's counts and horizon, shared, each read at most once a second.
            queues, held = await stats.get(), await horizon.get()
        except DatabaseUnavailable:
            queues = held = None  # the process's own counters still answer
        # The classic text format: what generate_latest writes and every Prometheus reads.
        return Response(metrics.exposition(queues, held), headers={"content-type": CONTENT_TYPE_PLAIN_0_0_4})

    return scrape
