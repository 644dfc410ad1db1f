"""Run the app under uvicorn in this process: `switchboard up` and `switchboard serve`."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from dashboard.accounts import Accounts
from dashboard.db import open_database
from dashboard.web.app import create_app, load_secrets

FIRST_OPERATOR = "admin"


async def _run(host: str, port: int, newcomer: bool) -> None:
    db = await open_database(max_size=2)  # migrations, the first operator, the secrets
    try:
        if newcomer:
            await _first_operator(db)
        app = create_app(db.dsn, await load_secrets(db))
        await db.pool.close()  # the app opens its own; the embedded server stays up until close()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            timeout_graceful_shutdown=2,
            log_level="info",
            access_log=False,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        shown = "localhost" if host in ("127.0.0.1", "0.0.0.0", "::") else host
        where = "embedded PostgreSQL in " + db.dsn.split("host=")[-1] if db.server else "DATABASE_URL"
        print(f"switchboard is up on http://{shown}:{port}/ (database: {where})", flush=True)
        await server.serve()
    finally:
        await db.close()


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
