"""Run the app under uvicorn in this process: `switchboard up` and `switchboard serve`.

SIGTERM (systemd, Docker, Procfile runners) and SIGINT stop it alike: uvicorn stops
accepting, the hub ends every open SSE stream and waiting long-poll (which answers 204),
the lifespan stops the reaper and closes the pool, and the embedded PostgreSQL stops when
this process was its last user. Each step is bounded, so the whole stop takes seconds.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn

from dashboard.accounts import Accounts
from dashboard.db import open_database
from dashboard.web.app import create_app, load_config

FIRST_OPERATOR = "admin"
GRACE = 2.0  # seconds uvicorn waits for open requests before cancelling them
log = logging.getLogger("switchboard.server")


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


async def _run(host: str, port: int, newcomer: bool) -> None:
    db = await open_database(max_size=2)  # migrations, the first operator, the secrets
    try:
        if newcomer:
            await _first_operator(db)
        app = create_app(db.dsn, await load_config(db))
        await db.pool.close()  # the app opens its own; the embedded server stays up until close()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            timeout_graceful_shutdown=GRACE,
            log_level="info",
            access_log=False,
            lifespan="on",
        )
        shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::") else host
        where = "embedded PostgreSQL in " + db.dsn.split("host=")[-1] if db.server else "DATABASE_URL"
        server = Server(config, f"switchboard is up on http://{shown}:{port}/ (database: {where})")
        # uvicorn re-raises the stop signal after its shutdown; these handlers turn it into
        # Stopped, so the `finally` below runs for SIGTERM as it does for SIGINT.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _stopped)
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


def serve(host: str, port: int, *, newcomer: bool) -> int:
    logging.getLogger("switchboard").setLevel(logging.INFO)
    asyncio.run(_run(host, port, newcomer))
    return 0
