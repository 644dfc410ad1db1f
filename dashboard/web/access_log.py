"""One line per request on the `switchboard.access` logger: method, route template (so
`/api/v1/todos/{todo_id:str}/complete`, not every todo's id), status and duration.
SWITCHBOARD_LOG_FORMAT=json writes each as a JSON object instead, for log shippers.
The same four facts feed the request-latency histogram (dashboard/metrics.py).

Under `switchboard serve` the request only hands those facts to the log thread
(dashboard/logs.py), which makes the record, dated when the request ended, and writes it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from litestar.exceptions import HTTPException
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from dashboard import logs, metrics

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
            route = scope.get("path_template") or "(no route)"
            metrics.request(scope["method"], route, status, seconds)
            logs.defer(_log, as_json, scope["method"], route, status, seconds * 1000, time.time())

    return middleware


def _log(as_json: bool, method: str, route: str, status: int, ms: float, ended: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    if as_json:
        line = {"method": method, "route": route, "status": status, "duration_ms": round(ms, 2)}
        msg, args = json.dumps(line), ()
    else:
        msg, args = "%s %s %d %.1fms", (method, route, status, ms)
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, msg, args, None, "middleware")
    record.created, record.msecs = ended, (ended - int(ended)) * 1000  # not when the thread got to it
    record.relativeCreated = (ended - logging._startTime) * 1000  # type: ignore[attr-defined]
    log.handle(record)
