"""The app factory. The lifespan owns the pool, the LISTEN hub and the reaper; the caller
(`switchboard up`/`serve`, or a test) says which database and has already migrated it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from litestar import Litestar, Request, Router, get
from litestar.datastructures import CacheControlHeader, State
from litestar.di import Provide
from litestar.file_system import BaseLocalFileSystem
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins.htmx import HTMXPlugin
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import ServerSentEvent
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig
from litestar.types import Message, PathType, Scope
from litestar.types.file_types import FileInfo
from prometheus_client import disable_created_metrics

from dashboard import logs
from dashboard.accounts import Accounts
from dashboard.config import Settings
from dashboard.control import Control
from dashboard.db import Database, create_pool
from dashboard.horizon import HorizonWatch
from dashboard.notify import Hub
from dashboard.reads import Reads
from dashboard.reaper import run_reaper
from dashboard.store import Store
from dashboard.web import api, health, login, pages, prometheus, templating
from dashboard.web.access_log import access_log
from dashboard.web.auth import require_login
from dashboard.web.csrf import CSRFMiddleware
from dashboard.web.docs import SwaggerUIPage
from dashboard.web.errors import EXCEPTION_HANDLERS
from dashboard.web.live import page_stream
from dashboard.web.long_requests import LongRequests, long_requests, of_session, release_held
from dashboard.web.mcp import McpEndpoint
from dashboard.web.services import Services, services
from dashboard.web.sessions import is_https, save_flash
from dashboard.web.stats_cache import StatsCache
from dashboard.web.token_cache import TokenCache

PACKAGE = Path(str(files("dashboard")))  # templates/ and static/ ship inside it (pyproject.toml)
MAX_BODY = 8 * 1024 * 1024  # a batch of todos; each payload is limited to 256 KiB on its own
FORM_BODY = login.FORM_LIMIT  # the dashboard's forms, but those with a payload (pages/common.py)
HSTS = "max-age=31536000"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)
DOCS_PATH = "/api/v1/docs"
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)
HSTS_HEADER = (b"strict-transport-security", HSTS.encode())


@dataclass
class WebConfig:
    """What every web process must agree on, the CSRF keys (current first), and the
    settings (dashboard/config.py; the defaults unless given)."""

    csrf_keys: tuple[bytes, ...]
    settings: Settings = field(default_factory=Settings)


def _key(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


async def load_config(db: Database, settings: Settings | None = None) -> WebConfig:
    """`settings`, read from the environment when not given; the CSRF key from
    SWITCHBOARD_SECRET_KEY, else one made once and kept in the database.
    SWITCHBOARD_SECRET_KEY_OLD is accepted too while forms made with it may still be open."""
    settings = settings or Settings.from_environ()
    keys = [_key(settings.secret_key) if settings.secret_key else await Accounts(db.pool).secret("csrf", 32)]
    if settings.secret_key_old:
        keys.append(_key(settings.secret_key_old))
    return WebConfig(csrf_keys=tuple(keys), settings=settings)


async def security_headers(message: Message, scope: Scope) -> None:
    """CSP (no inline script, ever) and friends on every response, the API docs page too.

    A before_send hook, so it also covers responses made by the app-level exception
    handler (a refused CSRF token, say), which middleware would not see."""
    if message["type"] == "http.response.start":
        # Appended as made once: no handler sets any of these itself.
        headers = message.setdefault("headers", [])
        headers.extend(SECURITY_HEADERS)
        if is_https(scope):
            headers.append(HSTS_HEADER)


class StaticFiles(BaseLocalFileSystem):
    """static/, where a path no file can have is not found (404), not a failure (500): a
    NUL, a name longer than the file system takes, a file used as a folder (app.js/x)."""

    async def info(self, path: PathType, **kwargs: Any) -> FileInfo:
        try:
            return await super().info(path, **kwargs)
        except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
            raise FileNotFoundError(path) from exc


@get("/events", middleware=[release_held])
async def events(request: Request) -> ServerSentEvent:
    """Hints for open pages (dashboard/web/live.py), for as long as their session lasts."""
    known, sid = services(request), request.scope["session_id"]
    long_requests(request.scope).hold(request.scope, of_session(sid))
    left = await known.accounts.session_left(sid) or 0  # 0: it ended just now
    return ServerSentEvent(page_stream(known.hub, known.accounts, request.app.template_engine, sid, left))


def _provide(name: str) -> Provide:
    def service(state: State) -> object:
        return getattr(state.services, name)

    return Provide(service, sync_to_thread=False)


# Each service the lifespan opened, injected by name (see services.py).
DEPENDENCIES = {
    name: _provide(name) for name in ("store", "control", "reads", "accounts", "hub", "stats", "horizon")
}


def create_app(dsn: str, config: WebConfig, *, reaper: bool = True, pool_size: int = 10) -> Litestar:
    disable_created_metrics()  # no `…_created` twin of every counter and histogram on /metrics
    settings = config.settings
    mcp = McpEndpoint()  # /mcp: the agents' tools over MCP, with the API's bearer tokens

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        pool = await create_pool(dsn, max_size=pool_size)
        hub = Hub(dsn)
        await hub.start()
        reads, accounts = Reads(pool), Accounts(pool)
        store = Store(pool, hints=hub)
        app.state.services = Services(
            store=store,
            control=Control(pool, hints=hub, cursors=store.cursors),
            reads=reads,
            accounts=accounts,
            hub=hub,
            stats=StatsCache(reads, hub),
            horizon=HorizonWatch(pool, warn=settings.horizon_warn_seconds),
            tokens=TokenCache(accounts, hub),
        )
        stop = asyncio.Event()
        services = app.state.services
        task = (
            asyncio.create_task(run_reaper(services.store, settings, horizon=services.horizon, stop=stop))
            if reaper
            else None
        )
        try:
            yield
        finally:
            stop.set()
            if task:
                await task
            app.state.services.stats.close()
            await hub.stop()
            await pool.close()
            logs.flush()  # the access log's last lines, before the process goes

    return Litestar(
        route_handlers=[
            *health.ROUTES,
            prometheus.metrics_route(settings),
            # The dashboard: the only routes with cookies, so the only ones CSRF checks (the
            # agent API, the probes, /metrics and /mcp take bearer tokens or nothing).
            Router(
                "/",
                route_handlers=[
                    *login.ROUTES,
                    Router(
                        "/",
                        route_handlers=[*pages.ROUTES, events],
                        before_request=require_login,
                        request_max_body_size=FORM_BODY,
                        cache_control=CacheControlHeader(no_store=True),  # payloads, names: never in a cache
                    ),
                ],
                middleware=[CSRFMiddleware()],
                include_in_schema=False,
            ),
            api.router,
            mcp.route,
            create_static_files_router(
                path="/static",
                directories=[PACKAGE / "static"],
                include_in_schema=False,
                file_system=StaticFiles(),
            ),
        ],
        state=State(
            {
                "csrf_keys": config.csrf_keys,
                "settings": settings,
                "public_https": (settings.public_url or "").startswith("https://"),
                "long_requests": LongRequests(settings.max_waits_per_token),
            }
        ),
        dependencies=DEPENDENCIES,
        template_config=TemplateConfig(
            directory=PACKAGE / "templates", engine=JinjaTemplateEngine, engine_callback=templating.configure
        ),
        plugins=[HTMXPlugin()],
        before_send=[security_headers, save_flash],
        middleware=[access_log(settings.log_format == "json")],
        openapi_config=OpenAPIConfig(
            title="switchboard agent API",
            version="1",
            path=DOCS_PATH,
            render_plugins=[SwaggerUIPage()],  # Swagger UI, served from /static/
            description="Claim, heartbeat, complete and fail todos. Errors are RFC 9457 problem details.",
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(
                        type="http", scheme="bearer", description="an agent token: switchboard token add"
                    )
                }
            ),
        ),
        exception_handlers=EXCEPTION_HANDLERS,  # they log what they handle (web/errors.py)
        logging_config=None,  # the process's own (dashboard/logs.py for `serve`), not Litestar's queue
        request_max_body_size=MAX_BODY,
        lifespan=[lifespan, mcp.lifespan],
    )
