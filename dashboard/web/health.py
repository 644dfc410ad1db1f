"""Probes for process managers and load balancers: /healthz (the process answers) and
/readyz (it can do its work: the database answers and takes writes, the migrations this
code needs are applied, and the LISTEN connection for hints is up)."""

from __future__ import annotations

import logging

from litestar import Response, get
from litestar.di import NamedDependency

from dashboard.errors import DatabaseUnavailable
from dashboard.migrate import load_migrations
from dashboard.notify import Hub
from dashboard.reads import Reads
from dashboard.web.errors import RETRY_AFTER

log = logging.getLogger("switchboard.web")
NEEDED_MIGRATION = max(m.version for m in load_migrations())
PROBE = {"exclude_from_csrf": True, "include_in_schema": False, "skip_session": True}


@get("/healthz", **PROBE)
async def healthz() -> dict:
    """Liveness (no database): the process answers. Also bench/dashboard_pages.py's baseline."""
    return {"ok": True}


@get("/readyz", **PROBE)
async def readyz(reads: NamedDependency[Reads], hub: NamedDependency[Hub]) -> Response[dict]:
    """200 with every check true, or 503 (with Retry-After) naming the ones that fail. It
    answers anyone: why the database is away (its host, the driver's text) goes to the log."""
    checks = {"listening": hub.connected.is_set()}
    try:
        migrated_to, read_only = await reads.readiness()
    except DatabaseUnavailable as exc:
        log.warning("/readyz: %s", exc)
        checks.update(database=False, migrations=False, writable=False)
    else:
        # A newer release may have migrated further (a rolling deploy): still ready.
        migrated = migrated_to is not None and migrated_to >= NEEDED_MIGRATION
        checks.update(database=True, migrations=migrated, writable=not read_only)
    ready = all(value is True for value in checks.values())
    headers = {} if ready else {"Retry-After": str(RETRY_AFTER)}
    return Response({"ready": ready, "checks": checks}, status_code=200 if ready else 503, headers=headers)


ROUTES = [healthz, readyz]
