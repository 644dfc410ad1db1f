"""Not a benchmark: the bare Litestar + asyncpg app api_throughput.py compares ours with.

    DATABASE_URL=... python bench/bare_app.py --port 8123

Two routes and a probe, no auth, no middleware, no models: POST /claims runs
`dashboard.queries.TRANSITIONS.claim_batch` with n=1 ({"queues": [...], "ttl": s} → 200 with
the row as JSON plus "lease", or 204), POST /complete runs `.complete` with result and scope
NULL ({"id": ..., "lease": n} → 200 {"todo": row}, or 409), GET /healthz answers {"ok": true}.
The owner is always "bench-agent" (the agent name api_throughput.py's token carries).

It runs as ours does: uvicorn, one worker, uvloop and httptools, access log off, and an
asyncpg pool of the same size (2 to 10) with the same two pool settings as
dashboard/db.py's (generic plans, no reset query on release), but no jsonb codec: payloads
come back as JSON text, as in queue_throughput.py's baseline loop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import uvicorn
from litestar import Litestar, Response, get, post

from dashboard.queries import TRANSITIONS

OWNER = "bench-agent"
POOL_MIN, POOL_MAX = 2, 10  # dashboard.db.create_pool's defaults; the app's pool_size is 10
CLAIM = TRANSITIONS.claim_batch
COMPLETE = TRANSITIONS.complete
POOL: asyncpg.Pool | None = None


async def no_reset(conn: asyncpg.Connection) -> None:
    """dashboard.db.reset_connection: only an abandoned transaction is ended on release."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


@contextlib.asynccontextmanager
async def lifespan(_app: Litestar) -> AsyncIterator[None]:
    global POOL
    POOL = await asyncpg.create_pool(
        os.environ["DATABASE_URL"],
        min_size=POOL_MIN,
        max_size=POOL_MAX,
        reset=no_reset,
        server_settings={"plan_cache_mode": "force_generic_plan"},
    )
    try:
        yield
    finally:
        await POOL.close()


@post("/claims", status_code=200)
async def claims(data: dict[str, Any]) -> Response[dict[str, Any] | None]:
    rows = await POOL.fetch(
        CLAIM.sql,
        *CLAIM.args(
            # rank -10, after null: each claim scans from the oldest (the app keeps a position)
            {
                "queues": data["queues"],
                "owner": OWNER,
                "ttl": float(data["ttl"]),
                "n": 1,
                "rank": -10,
                "after": None,
            }
        ),
    )
    if not rows:
        return Response(None, status_code=204)
    todo = dict(rows[0])
    todo["lease"] = todo["lease_token"]
    return Response(todo)


@post("/complete", status_code=200)
async def complete(data: dict[str, Any]) -> Response[dict[str, Any]]:
    rows = await POOL.fetch(
        COMPLETE.sql,
        *COMPLETE.args(
            {
                "id": data["id"],
                "owner": OWNER,
                "lease": data["lease"],
                "result": None,
                "scope": None,
                "actor_kind": "agent",
            }
        ),
    )
    if not rows:
        return Response({"detail": "not completed"}, status_code=409)
    return Response({"todo": dict(rows[0])})


@get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


app = Litestar(route_handlers=[claims, complete, healthz], lifespan=[lifespan], openapi_config=None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        access_log=False,
        log_level="warning",
        lifespan="on",
    )
