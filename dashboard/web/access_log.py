"""One line per request on the `switchboard.access` logger: method, route template (so
`/api/v1/todos/{todo_id:str}/complete`, not every todo's id), status and duration.
SWITCHBOARD_LOG_FORMAT=json writes each as a JSON object instead, for log shippers.
The same four facts feed the request-latency histogram (dashboard/metrics.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from litestar.exceptions import HTTPException
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from dashboard import metrics

log = logging.getLogger("switchboard.access")


def access_log(as_json: bool) -> Callable[[ASGIApp], ASGIApp]:
    """The middleware, writing JSON lines when `as_json`."""
    return lambda app: _logged(app, as_json)


def _logged(app: ASGIApp, as_json: bool) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app fails before it answers

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, sending)
        except HTTPException as refused:  # from a middleware (CSRF, body size): answered below us
            status = refused.status_code
            raise
        finally:
            seconds = time.perf_counter() - started
            ms = seconds * 1000
            route = scope.get("path_template") or "(no route)"
            metrics.request(scope["method"], route, status, seconds)
            if as_json:
                log.info(
                    json.dumps(
                        {
                            "method": scope["method"],
                            "route": route,
                            "status": status,
                            "duration_ms": round(ms, 2),
                        }
                    )
                )
            else:
                log.info("%s %s %d %.1fms", scope["method"], route, status, ms)

    return middleware
