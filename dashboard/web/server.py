"""Run the app under uvicorn in this process: `switchboard up` and `switchboard serve`.

SIGTERM (systemd, Docker, Procfile runners) and SIGINT stop it alike: uvicorn stops
accepting, the hub ends every open SSE stream and waiting long-poll (which answers 204),
the lifespan stops the reaper and closes the pool, and the embedded PostgreSQL stops when
this process was its last user. Each step is bounded, so the whole stop takes seconds.

Limits, from the settings read before anything else starts (dashboard/config.py):
SWITCHBOARD_MAX_CONNECTIONS open connections at most (one more is answered 503;
every SSE stream and waiting long-poll claim holds one), SWITCHBOARD_HEADER_TIMEOUT
seconds for a request head to arrive (dashboard/web/slow_clients.py), SWITCHBOARD_KEEPALIVE
seconds of quiet on a keep-alive connection. X-Forwarded-For and -Proto are believed only
from the addresses in SWITCHBOARD_TRUSTED_PROXIES.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from dataclasses import replace

import uvicorn
import uvloop

from dashboard import logs
from dashboard.accounts import Accounts
from dashboard.config import BadSetting, Settings
from dashboard.instances import recorded
from dashboard.migrate import open_database
from dashboard.web.app import create_app, load_config
from dashboard.web.slow_clients import header_timeout_protocol

FIRST_OPERATOR = "admin"
GRACE = 2.0  # seconds uvicorn waits for open requests before cancelling them
# File descriptors besides the connections: the listening socket, the pool and the LISTEN
# connection (11), log files, the event loop's own, templates being read.
SPARE_FILES = 64
log = logging.getLogger("switchboard.server")


def fit_file_limit(settings: Settings) -> Settings:
    """Raise this process's soft limit on open files (RLIMIT_NOFILE) toward its hard limit so
    that `max_connections` fit. If they cannot: a usage error when the number was asked for,
    else the most that fit, with a warning."""
    needed = settings.max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        else:
            log.info("raised the open-file limit (ulimit -n) from %d to %d", soft, target)
            soft = target
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return settings
    fits = soft - SPARE_FILES
    if "SWITCHBOARD_MAX_CONNECTIONS" in settings.given or fits < 1:
        raise BadSetting(
            "SWITCHBOARD_MAX_CONNECTIONS",
            f"{settings.max_connections} connections need about {needed} open files, and this process "
            f"may open {soft} (ulimit -Hn is {hard}): ask for at most {max(fits, 0)}, or raise the limit",
        )
    log.warning("open files are limited to %d (ulimit -Hn): serving at most %d connections", soft, fits)
    return replace(settings, max_connections=fits)


def uvicorn_config(app, host: str, port: int, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=header_timeout_protocol(settings.header_timeout),
        # uvicorn answers 503 once its open connections, this one included, reach the
        # limit: one more than max_connections lets exactly that many be served.
        limit_concurrency=settings.max_connections + 1,
        timeout_keep_alive=settings.keepalive,  # type: ignore[arg-type]  # call_later takes a float
        proxy_headers=True,
        forwarded_allow_ips=list(settings.trusted_proxies),
        timeout_graceful_shutdown=GRACE,
        log_level="info",
        access_log=False,
        lifespan="on",
    )


class Stopped(Exception):
    """A stop signal arrived; raised once uvicorn has shut down, so cleanup runs for SIGTERM too."""


def _stopped(signum: int, _frame) -> None:
    raise Stopped(signal.Signals(signum).name)


class Server(uvicorn.Server):
    """uvicorn, telling the app's hub to end its streams as soon as a stop signal arrives,
    and saying the server is up only once its socket listens."""

    def __init__(self, config: uvicorn.Config, ready_message: str):
        super().__init__(config)
        self.ready_message = ready_message

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            logs.flush()  # what start-up logged comes before the line that says it is up
            print(self.ready_message, flush=True)

    def handle_exit(self, sig: int, frame) -> None:
        if not self.should_exit:
            log.info(
                "stopping (%s): no new connections; ending streams and waiting claims",
                signal.Signals(sig).name,
            )
            services = getattr(self.config.app.state, "services", None)
            if services is not None:
                asyncio.get_event_loop().call_soon_threadsafe(services.hub.end_all)
        super().handle_exit(sig, frame)


async def _run(host: str, port: int, newcomer: bool, settings: Settings) -> None:
    # migrations, the first operator, the secrets; without DATABASE_URL the embedded database,
    # created if there is none (dashboard/instances.py)
    db = await open_database(settings, max_size=2, create=True)
    try:
        if newcomer:
            await _first_operator(db)
        app = create_app(db.dsn, await load_config(db, settings))
        await db.pool.close()  # the app opens its own; the embedded server stays up until close()
        config = uvicorn_config(app, host, port, settings)
        # After uvicorn's logging set-up, which closes every handler there was.
        logs.write_in_background()  # a line per request, written off the event loop
        log.info(
            "at most %d connections; a request head must arrive within %gs; keep-alive %gs",
            settings.max_connections,
            settings.header_timeout,
            settings.keepalive,
        )
        log.info(
            "X-Forwarded-For and X-Forwarded-Proto trusted from: %s", ", ".join(settings.trusted_proxies)
        )
        shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::") else host
        url = f"http://{shown}:{port}/"
        where = f"embedded PostgreSQL, data in {db.server.pgdata}" if db.server else "DATABASE_URL"
        loop = type(asyncio.get_running_loop())
        up = f"switchboard is up on {url} (database: {where}; event loop: {loop.__module__})"
        server = Server(config, up)
        # uvicorn re-raises the stop signal after its shutdown; these handlers turn it into
        # Stopped, so the `finally` below runs for SIGTERM as it does for SIGINT.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stopped)
        # Commands run elsewhere without DATABASE_URL find the embedded database through this.
        with recorded(url, db.server.pgdata) if db.server else contextlib.nullcontext():
            await server.serve()
    except Stopped as stop:
        log.info("stopped (%s)", stop)
    finally:
        await db.close()
        if db.server is not None:
            log.info("embedded PostgreSQL released")


async def _first_operator(db) -> None:
    accounts = Accounts(db.pool)
    if await accounts.has_operators():
        print("log in with your operator account (add one: switchboard operator add NAME)")
        return
    password = await accounts.add_operator(FIRST_OPERATOR, "operator")
    print(f"created the first operator: name {FIRST_OPERATOR}, password {password}")
    print("(shown once; add more with: switchboard operator add NAME --role viewer|operator)")


def serve(host: str, port: int, settings: Settings, *, newcomer: bool) -> int:
    logging.getLogger("switchboard").setLevel(logging.INFO)
    # Too many connections for the open files to hold stops here, before the database.
    settings = fit_file_limit(settings)
    # uvloop: a third less event-loop time per API request than asyncio's own loop. uvicorn
    # would pick it itself, but only when it makes the loop; here serve() runs inside ours.
    uvloop.run(_run(host, port, newcomer, settings))
    return 0
