"""Dashboard pages at a million todos: page and partial latency, charts, the overview's
SQL, the rollup job, live hints (issue 13's "Speed").

    .venv/bin/python bench/dashboard_pages.py                   # both datasets of 1,000,000 todos, 5-7 min
    .venv/bin/python bench/dashboard_pages.py --quick           # 20,000 todos each, 8 requests a URL, ~1 min
    .venv/bin/python bench/dashboard_pages.py --dataset pending # one of the two
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

One run against one server: DATABASE_URL if set, else an embedded PostgreSQL started on a
temporary data dir and stopped at exit. Each dataset in turn (--dataset mixed|pending|both,
default both) gets a fresh database, dropped before the next, filled with plain
INSERT … SELECT generate_series statements, --todos todos over 20 queues q0…q19:

- mixed: 93% done (completed over the last two days, a few per mille in the last hour and
  the last 15 minutes), 5% live (ready; scheduled; retrying with a future next_retry_at;
  claimed with leases; lapsed leases) and 2% dead-lettered;
- pending: a backlog, all pending (created over the last six hours; 96% ready, 2%
  scheduled, 2% retrying).

Both have payloads with a customer (ids of 50,021: about 20 todos each per million) and an
order status, for the payload search; history rows as the store writes them (step, queue
and elapsed time set) for about 1 todo in 256; one todo with a whole story and an event;
and the rollup job's rows as two days of traffic leave them: minute rows for the last 48 h
and hour rows for 90 days, per queue and for all queues ('*'), minute rows for the 20
agents over 48 h, and 200 acks refused by fencing. Live todos are held by those agents.

Then it starts the real app in a subprocess (`python -m dashboard.cli serve`, with
DATABASE_URL pointing at that database; the app runs its reaper and rollup job as in
production, so the lapsed leases are re-surfaced within a second of start-up and the
backlog is sampled every 10 s), logs in as an operator and measures, in this order:

1. every page and partial, one request at a time, interleaved (one round over all pages,
   then the next), after a warm-up; /healthz of the same app is the floor. The agents
   page, the charts (all queues and q7, each range) and a payload search on the queue
   page are measured when they answer 200, and otherwise left out with a note. The "SQL"
   column is the page's main reads run directly on a pool (Reads, the charts' query and
   the operator lookup every dashboard route does), so page minus SQL is about the app's
   own time (routing, session, Jinja, HTTP);
2. Reads.queue_stats() directly (the overview's SQL);
3. mixed dataset only: the hint latency, from the commit of an enqueue (returned to the
   producer) to the matching event line on an open SSE stream: the agents' notify channel
   (/api/v1/channels) with enqueues 100 ms apart, and the dashboard's /events stream with
   enqueues 600 ms apart (it sends at most two refreshes a second by design, so closer
   enqueues would measure the coalescing delay, not the latency);
4. mixed dataset only: a burst, a producer enqueuing ~1,000 todos/s for 5 s
   (Store.create_many on its own pool) while a dashboard /events stream counts `refresh`
   events and GET /partials/overview is timed every 100 ms;
5. with the app stopped (no rollup job of its own running): the rollup job at 1,000
   todos/s. --roll-minutes minutes (the last ones of the previous hour, so each roll
   re-sums a nearly whole hour) get 60,000 todos each, created, claimed and completed
   within the minute over the 20 queues and agents: 180,000 history rows a minute, written
   in time order and not vacuumed, as the job finds them. Then each minute is rolled once,
   oldest first, as the job does: Rollups._roll (queue minutes, agent minutes, the hour
   rows) in a transaction of its own, committed; the commit is not in the time. Also the
   backlog sample the app takes every 10 s (Rollups.sample), for information.

The bench (load generator), the app process and PostgreSQL share the machine's cores. One
table per dataset, printed as soon as that dataset is done, with the load average at its
start and end. Missed targets get EXPLAIN (ANALYZE, BUFFERS) of the SQL behind them after
the table (--explain: of every page's), planned as the app plans it: a prepared statement
on a connection with the app's settings (generic plans, except where Reads asks for a
custom one), rolled back. Progress goes to stderr; the tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import astuple, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import asyncpg
import harness
import httpx
import options
from harness import AppProcess, Server, log
from stats import CPUMeter, pct, table

from dashboard import db as dbmod
from dashboard import reaper
from dashboard.accounts import Accounts
from dashboard.charts import RANGES, chart_set
from dashboard.models import NewTodo
from dashboard.queries import READS
from dashboard.reads import Reads, TodoFilter
from dashboard.rollups import BOUNDS, Rollups
from dashboard.rollups import SQL as ROLLUPS
from dashboard.store import Store

DATASETS = ("mixed", "pending")
QUEUES = 20
QUEUE = "q7"  # the queue whose pages are measured
AGENTS = 20  # agent-0 … agent-19 hold the leases, did the work, and have rollup rows
HINT_QUEUE = "hints"  # an empty queue of its own for the hint-latency enqueues
COMMON_WORD = "invoice"  # in 1 title in 20
CUSTOMERS = 50_021  # payloads' customer ids (a prime, so each customer's todos spread over all queues)
PAYLOAD_SEARCH = "customer.id=42"  # about 20 todos per million, one of them in q7
PAGE_TARGET_MS = 50.0  # every page and partial, the 7-day charts too
STATS_TARGET_MS = 10.0
ROLL_TARGET_MS = 100.0  # the rollup job for one minute at ROLL_RATE
ROLL_RATE = 1000  # todos/s created, claimed and completed in each rolled minute
ROLL_SLICE = int(reaper.ROLLUP_EVERY)  # seconds of history per pass of the app's job
HINT_TARGET_MS = 25.0
REFRESH_TARGET = 3.0  # refresh events per second, at most
BURST_RATE = 1000  # todos/s
BURST_SECONDS = 5.0
BURST_BATCH = 50
OPERATOR_SQL = "SELECT name, role FROM operators WHERE name = $1"

VERBS = ("sync", "send", "refund", "reindex", "resize", "notify", "import", "export", "archive", "verify")
NOUNS = (
    "invoice",
    "order",
    "email",
    "report",
    "image",
    "account",
    "payment",
    "shipment",
    "ticket",
    "profile",
    "refund",
    "contract",
    "receipt",
    "message",
    "upload",
    "webhook",
    "customer",
    "subscription",
    "coupon",
    "review",
)


SHOWN_SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "work_mem", "jit")
SETTINGS = (*SHOWN_SETTINGS, "max_connections")


# -- filling the database ------------------------------------------------------------------


def _array(words: tuple[str, ...]) -> str:
    return "ARRAY[" + ", ".join(f"'{w}'" for w in words) + "]"


COLUMNS = (
    "queue",
    "source",
    "kind",
    "title",
    "payload",
    "idempotency_key",
    "state",
    "owner",
    "lease_expires_at",
    "lease_token",
    "heartbeat_at",
    "attempt",
    "max_attempts",
    "result",
    "next_retry_at",
    "last_error",
    "created_at",
    "updated_at",
    "claimed_at",
    "completed_at",
    "ready_at",
)

# Column expressions over i (a unique number) and t (the category's anchor time). A
# column that must equal another (ready_at and created_at, next_retry_at and ready_at) is
# written as the same expression of i and t, without random().
OWNER = f"'agent-' || (i % {AGENTS})"
DEFAULTS = {
    "queue": f"'q' || (i % {QUEUES})",
    "source": "'bench'",
    "kind": "(ARRAY['webhook', 'email', 'sync', 'report', 'image'])[1 + i % 5]",
    "title": (
        f"({_array(VERBS)})[1 + (i / 400) % {len(VERBS)}] || ' ' || "
        f"({_array(NOUNS)})[1 + (i / {QUEUES}) % {len(NOUNS)}] || ' for cust' || "
        "lpad(floor(random() * 500)::int::text, 3, '0') || ' #' || i"
    ),
    "payload": (
        "jsonb_build_object('n', i, "
        f"'customer', jsonb_build_object('id', 1 + i::bigint * 7919 % {CUSTOMERS}), "
        "'order', jsonb_build_object("
        f"'status', (ARRAY['paid', 'pending', 'shipped', 'refunded'])[1 + (i / {QUEUES}) % 4], "
        "'amount', floor(random() * 100000)::int, 'currency', 'EUR'), "
        "'note', 'delivered by the bench fill')"
    ),
    "idempotency_key": "CASE WHEN i % 3 = 0 THEN 'key-' || i END",
    "state": "'pending'",
    "owner": "NULL",
    "lease_expires_at": "NULL",
    "lease_token": "0",
    "heartbeat_at": "NULL",
    "attempt": "0",
    "max_attempts": "5",
    "result": "NULL",
    "next_retry_at": "NULL",
    "last_error": "NULL",
    "created_at": "t",
    "updated_at": "t",
    "claimed_at": "NULL",
    "completed_at": "NULL",
    "ready_at": "t",
}

QUEUED_FOR = "t - interval '1 minute' - (i % 600) * interval '1 second'"  # ready 1-11 min before its claim
DONE = {
    "state": "'done'",
    "owner": OWNER,
    "lease_token": "1",
    "attempt": "1",
    "result": "'{\"ok\": true}'::jsonb",
    "created_at": QUEUED_FOR,
    "ready_at": QUEUED_FOR,
    "claimed_at": "t - random() * interval '1 minute'",
    "completed_at": "t",
}
DEAD = {
    "state": "'failed'",
    "owner": OWNER,
    "lease_token": "5",
    "attempt": "5",
    "last_error": "'HTTP 502 from upstream (attempt 5 of 5): connection reset by peer'",
    "created_at": "t - interval '1 minute' - (i % 1800) * interval '1 second'",
    "ready_at": "t - interval '1 minute' - (i % 1800) * interval '1 second'",
    "claimed_at": "t - random() * interval '1 minute'",
    "completed_at": "t",
}
CLAIMED = {
    "state": "'claimed'",
    "owner": OWNER,
    "lease_token": "1",
    "attempt": "1",
    "created_at": "t - interval '5 minutes'",
    "ready_at": "t - interval '5 minutes'",
    "claimed_at": "now() - random() * interval '5 minutes'",
    "heartbeat_at": "now() - random() * interval '30 seconds'",
    "lease_expires_at": "now() + interval '20 minutes' + random() * interval '40 minutes'",
}
RETRY_AT = "now() + interval '1 hour' + (i % 18000) * interval '1 second'"
RETRYING = {
    "attempt": "1 + i % 3",
    "lease_token": "1 + i % 3",
    "next_retry_at": RETRY_AT,
    "ready_at": RETRY_AT,
    "last_error": "'timeout after 30s'",
}
SCHEDULED = {"ready_at": "now() + interval '10 minutes' + (i % 21600) * interval '1 second'"}


@dataclass
class Category:
    name: str
    count: int
    anchor: str  # t: completed_at for finished todos, created_at for live ones
    columns: dict[str, str]


def categories(n: int, dataset: str) -> list[Category]:
    if dataset == "pending":
        scheduled = retrying = n * 2 // 100
        created = "now() - random() * interval '6 hours'"
        return [
            Category("ready", n - scheduled - retrying, created, {}),
            Category("scheduled (run_at ahead)", scheduled, created, SCHEDULED),
            Category("retrying (future next_retry_at)", retrying, created, RETRYING),
        ]
    live = n * 5 // 100
    ready, scheduled, retrying = live * 50 // 100, live * 10 // 100, live * 10 // 100
    claimed = live * 24 // 100
    lapsed = live - ready - scheduled - retrying - claimed
    dead = n * 2 // 100
    recent15 = n // 1000
    recent_hour = n * 2 // 1000
    done = n - live - dead - recent15 - recent_hour
    return [
        Category(
            "done, last 2 days", done, "now() - interval '1 hour' - random() * interval '47 hours'", DONE
        ),
        Category("done, last hour", recent_hour, "now() - random() * interval '1 hour'", DONE),
        Category("done, last 15 minutes", recent15, "now() - random() * interval '15 minutes'", DONE),
        Category(
            "dead (failed)", dead, "now() - interval '10 minutes' - random() * interval '47 hours'", DEAD
        ),
        Category("ready", ready, "now() - random() * interval '1 hour'", {}),
        Category("scheduled (run_at ahead)", scheduled, "now() - random() * interval '1 hour'", SCHEDULED),
        Category(
            "retrying (future next_retry_at)", retrying, "now() - random() * interval '2 hours'", RETRYING
        ),
        Category("claimed (lease held)", claimed, "now() - random() * interval '1 hour'", CLAIMED),
        Category(
            "claimed (lease lapsed)",
            lapsed,
            "now() - random() * interval '1 hour'",
            {
                **CLAIMED,
                "heartbeat_at": "now() - interval '10 minutes' - random() * interval '5 minutes'",
                "lease_expires_at": "now() - random() * interval '10 minutes'",
            },
        ),
    ]


def insert_sql(cat: Category, first: int) -> str:
    cols = {**DEFAULTS, **cat.columns}
    exprs = ",\n       ".join(cols[c] for c in COLUMNS)
    return (
        f"INSERT INTO todos ({', '.join(COLUMNS)})\n"
        f"SELECT {exprs}\n"
        f"FROM (SELECT i, {cat.anchor} AS t FROM generate_series({first}, {first + cat.count - 1}) AS i) s\n"
        f"ORDER BY {COLUMNS.index('created_at') + 1}"  # rows land in the heap roughly in arrival order
    )


# What the store writes for a create, a claim and a completion or failure (their step,
# queue, and elapsed time: in the queue for a claim, running for an ack), for 1 todo in 256.
HISTORY_SQL = """
INSERT INTO todo_history (todo_id, at, from_state, to_state, actor_kind, actor, attempt, note,
                          event, queue, elapsed)
SELECT * FROM (
    SELECT id, created_at, NULL::todo_state, 'pending'::todo_state, 'producer', 'bench', 0, 'created',
           'created', queue, NULL::real
    FROM todos WHERE left(id, 5) = 'td_00'
    UNION ALL
    SELECT id, claimed_at, 'pending'::todo_state, 'claimed'::todo_state, 'agent', owner, 1, 'claimed',
           'claimed', queue, extract(epoch FROM claimed_at - ready_at)::real
    FROM todos WHERE left(id, 5) = 'td_00' AND claimed_at IS NOT NULL
    UNION ALL
    SELECT id, completed_at, 'claimed'::todo_state, state, 'agent', owner, attempt,
           CASE WHEN state = 'done' THEN 'completed' ELSE last_error END,
           CASE WHEN state = 'done' THEN 'completed' ELSE 'failed' END, queue,
           extract(epoch FROM completed_at - claimed_at)::real
    FROM todos WHERE left(id, 5) = 'td_00' AND state IN ('done', 'failed')
) AS steps
ORDER BY 2
"""

# The todo whose page is measured: the newest dead one of QUEUE (mixed), a retrying one
# on its third attempt (pending).
DETAIL_STATE = {"mixed": "dead", "pending": "retrying"}
DETAIL_SQL = {
    "mixed": "SELECT id FROM todos WHERE state = 'failed' AND queue = $1 ORDER BY completed_at DESC LIMIT 1",
    "pending": "SELECT id FROM todos WHERE next_retry_at IS NOT NULL AND attempt = 3 AND queue = $1 LIMIT 1",
}


async def fill(dsn: str, n: int, dataset: str) -> dict:
    """Fill the database; returns facts for the header (and the ids to look at)."""
    conn = await asyncpg.connect(dsn)
    try:
        # No foreign-key checks for the fill (superuser only; otherwise they just run).
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SET session_replication_role = replica")
        first = 1
        for cat in categories(n, dataset):
            if cat.count <= 0:
                continue
            started = time.perf_counter()
            await conn.execute(insert_sql(cat, first))
            log(f"  {cat.count:>9,} {cat.name} in {time.perf_counter() - started:.1f} s")
            first += cat.count
        started = time.perf_counter()
        await conn.execute(HISTORY_SQL)
        detail_id = await conn.fetchval(DETAIL_SQL[dataset], QUEUE)
        story_rows = await story(conn, detail_id, dead=dataset == "mixed")
        await conn.execute("RESET session_replication_role")
        log(f"  history rows in {time.perf_counter() - started:.1f} s")
        states = {
            r[0]: r[1]
            for r in await conn.fetch(
                "SELECT CASE WHEN state = 'pending' AND next_retry_at > now() THEN 'retrying' "
                "WHEN state = 'pending' AND ready_at > now() THEN 'scheduled' "
                "WHEN state = 'pending' THEN 'ready' "
                "WHEN state = 'claimed' AND lease_expires_at < now() THEN 'lapsed' "
                "ELSE state::text END, count(*) FROM todos GROUP BY 1"
            )
        }
        started = time.perf_counter()
        rollup_rows = await seed_rollups(conn, states)
        log(f"  {rollup_rows:,} rollup rows in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        await conn.execute("VACUUM ANALYZE queue_rollups, agent_rollups, stale_acks")
        await harness.settle(conn)
        log(f"  VACUUM ANALYZE, CHECKPOINT in {time.perf_counter() - started:.1f} s")
        rare = await conn.fetchval(
            "SELECT substring(title FROM 'cust[0-9]{3}') FROM todos WHERE queue = $1 LIMIT 1", QUEUE
        )
        facts = {
            "states": states,
            "history": await conn.fetchval("SELECT count(*) FROM todo_history"),
            "rollups": rollup_rows,
            "size": await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('todos'))"),
            "detail_id": detail_id,
            "detail_label": f"{DETAIL_STATE[dataset]}, {story_rows} history rows, event",
            "rare_word": rare or "cust123",
            "done_hour": await conn.fetchval(
                "SELECT count(*) FROM todos WHERE state = 'done' AND completed_at > now() - interval '1 hour'"
            ),
        }
        return facts
    finally:
        await conn.close()


async def story(conn: asyncpg.Connection, todo_id: str, *, dead: bool) -> int:
    """One todo with a linked event, a bigger payload and its whole history: five failed
    attempts (dead), or two and a third one failed and waiting for its retry; its rows."""
    await conn.execute(
        "INSERT INTO events (id, source, kind, payload) VALUES ('ev_bench', 'stripe', "
        "'invoice.payment_failed', $1::jsonb)",
        '{"id": "evt_1", "data": {"object": {"amount_due": 4200, "customer": "cus_42", '
        '"lines": [{"amount": 4200, "description": "Pro plan"}]}}}',
    )
    await conn.execute(
        "UPDATE todos SET event_id = 'ev_bench', payload = payload || $2::jsonb WHERE id = $1",
        todo_id,
        '{"invoice": {"id": "in_42", "lines": [1, 2, 3], "meta": {"tries": 5}}}',
    )
    queue = await conn.fetchval("SELECT queue FROM todos WHERE id = $1", todo_id)
    rows = [(todo_id, None, "pending", "producer", "bench", 0, "created", "created", queue, None)]
    attempts = 5 if dead else 3
    for attempt in range(1, attempts + 1):
        agent = f"agent-{attempt}"
        rows.append(
            (todo_id, "pending", "claimed", "agent", agent, attempt, "claimed", "claimed", queue, 2.0)
        )
        end = "failed" if dead and attempt == attempts else "pending"
        error = "HTTP 502 from upstream: connection reset by peer"
        rows.append((todo_id, "claimed", end, "agent", agent, attempt, error, "failed", queue, 30.0))
    await conn.executemany(
        "INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note, "
        "event, queue, elapsed) VALUES ($1, $2::todo_state, $3::todo_state, $4, $5, $6, $7, $8, $9, $10)",
        rows,
    )
    return len(rows)


# -- the rollup job's rows ---------------------------------------------------------------------

PER_MINUTE = 16  # completions per queue (and per agent) a minute: the mixed set's 930,000 over 48 h
WAITED = (1.0, 1.5)  # time in queue: log-normal, median seconds and spread (in e-folds)
RAN = (1.5, 1.0)  # run time


def histogram(median: float, spread: float) -> tuple[list[float], float]:
    """A log-normal time's share in each bucket of BOUNDS (the last one open above), and its mean."""
    dist = statistics.NormalDist(math.log(median), spread)
    cdf = [0.0, *(dist.cdf(math.log(bound)) for bound in BOUNDS), 1.0]
    return [high - low for low, high in itertools.pairwise(cdf)], math.exp(dist.mean + spread**2 / 2)


# A daily cycle between 0.2 and 1 of the peak, for the charts to show something.
LOAD = "(0.6 + 0.4 * sin(2 * pi() * extract(epoch FROM at) / 86400))"

SEED_QUEUE_ROLLUPS = f"""
INSERT INTO queue_rollups (grain, queue, at, created, claimed, completed, failed, dead, waited, ran,
                           waited_sum, ran_sum, ready, retrying, scheduled, dead_letters)
SELECT $1, 'q' || q, at, n + f, n + f, n, f, f / 5,
       ARRAY(SELECT round((n + f) * w)::int FROM unnest($5::float8[]) WITH ORDINALITY AS u(w, k) ORDER BY k),
       ARRAY(SELECT round((n + f) * w)::int FROM unnest($7::float8[]) WITH ORDINALITY AS u(w, k) ORDER BY k),
       (n + f) * $6, (n + f) * $8,
       round($9 * load)::int, round($10 * load)::int, $11, $12
FROM generate_series(0, {QUEUES - 1}) AS q,
     generate_series($2::timestamptz, $3::timestamptz, $4::interval) AS at,
     LATERAL (SELECT {LOAD} AS load) AS l,
     LATERAL (SELECT round($13 * load * (0.8 + 0.4 * random()))::int AS n) AS c,
     LATERAL (SELECT round(n * 0.02)::int AS f) AS d
"""
# All queues together, as queue '*' (what the rollup job writes for the overview's charts).
SEED_ALL_QUEUES = """
INSERT INTO queue_rollups (grain, queue, at, created, claimed, completed, failed, dead, waited, ran,
                           waited_sum, ran_sum, ready, retrying, scheduled, dead_letters)
SELECT grain, '*', at, sum(created), sum(claimed), sum(completed), sum(failed), sum(dead),
       sum_elements(waited), sum_elements(ran), sum(waited_sum), sum(ran_sum),
       sum(ready), sum(retrying), sum(scheduled), sum(dead_letters)
FROM queue_rollups GROUP BY grain, at
"""
SEED_AGENT_ROLLUPS = f"""
INSERT INTO agent_rollups (agent, at, claimed, completed, failed,
                           last_claim_at, last_ack_at)
SELECT 'agent-' || a, at, n, n - n / 50, n / 50,
       at + interval '58 seconds', at + interval '59 seconds'
FROM generate_series(0, {AGENTS - 1}) AS a,
     generate_series($1::timestamptz, $2::timestamptz, interval '1 minute') AS at,
     LATERAL (SELECT round($3 * {LOAD} * (0.8 + 0.4 * random()))::int AS n) AS c
"""
SEED_STALE_ACKS = f"""
INSERT INTO stale_acks (at, agent, todo_id, queue, action, lease)
SELECT now() - random() * interval '48 hours', 'agent-' || k % {AGENTS}, 'td_stale-' || k,
       'q' || k % {QUEUES}, 'complete', 1
FROM generate_series(1, 200) AS k
"""


async def seed_rollups(conn: asyncpg.Connection, states: dict[str, int]) -> int:
    """The rollup job's rows for the last 48 h (minutes) and 90 days (hours), with the
    backlog as sampled around the dataset's own; the job is left caught up to now."""
    minute = await conn.fetchval("SELECT date_trunc('minute', now())")
    hour = minute.replace(minute=0)
    per_queue = {k: states.get(k, 0) // QUEUES for k in ("ready", "retrying", "scheduled", "failed")}
    backlog = (per_queue["ready"], per_queue["retrying"], per_queue["scheduled"], per_queue["failed"])
    shapes = (*histogram(*WAITED), *histogram(*RAN))
    for grain, since, until, step in (
        ("minute", minute - timedelta(hours=48), minute - timedelta(minutes=1), timedelta(minutes=1)),
        ("hour", hour - timedelta(days=90), hour - timedelta(hours=1), timedelta(hours=1)),
    ):
        per_step = PER_MINUTE * step / timedelta(minutes=1)
        await conn.execute(SEED_QUEUE_ROLLUPS, grain, since, until, step, *shapes, *backlog, per_step)
    await conn.execute(SEED_ALL_QUEUES)
    await conn.execute(
        SEED_AGENT_ROLLUPS, minute - timedelta(hours=48), minute - timedelta(minutes=1), float(PER_MINUTE)
    )
    await conn.execute(SEED_STALE_ACKS)
    await conn.execute(
        "UPDATE rollup_progress"
        " SET rolled_until = $1, rolled_id = (SELECT coalesce(max(id), 0) FROM todo_history)",
        minute,
    )
    return await conn.fetchval(
        "SELECT (SELECT count(*) FROM queue_rollups) + (SELECT count(*) FROM agent_rollups)"
    )


# -- pages ---------------------------------------------------------------------------------


@dataclass
class PageSpec:
    label: str
    path: str
    reads: Callable[[Reads], Awaitable] | None  # the page's main reads (None: no SQL)
    partial: bool = False
    login: bool = True  # dashboard routes look the operator up
    optional: bool = False  # being built (issue 13): measured when it answers 200
    samples: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)


def page_specs(detail_id: str, detail_label: str, rare: str) -> list[PageSpec]:
    def listing(charts: bool = False, **kw) -> Callable[[Reads], Awaitable]:
        """The queue page's list, its "all N matching" when there is a next page, and (the
        full page) its charts of the last hour."""

        async def reads(r: Reads) -> None:
            filters = TodoFilter(queue=QUEUE, **kw)
            if (await r.list_todos(filters, limit=50)).next_cursor:
                await r.matching_ids(filters, limit=1001)
            if charts:
                await chart_set(r.db, QUEUE, None)

        return reads

    def charts(queue: str | None, rng: str | None) -> Callable[[Reads], Awaitable]:
        return lambda r: chart_set(r.db, queue, rng)

    async def overview(r: Reads) -> None:
        await r.queue_stats()
        await chart_set(r.db, None, None)

    def dead(queue: str | None) -> Callable[[Reads], Awaitable]:
        async def reads(r: Reads) -> None:
            await r.dead_letters(queue, limit=50)
            await r.dead_letter_queues()

        return reads

    def chart_pages(path: str, queue: str | None, note: str = "") -> list[PageSpec]:
        """The charts partial at `path`, one page per range."""
        return [
            PageSpec(
                f"GET {path}?range={rng}{note}",
                f"{path}?range={rng}",
                charts(queue, rng),
                partial=True,
                optional=True,
            )
            for rng in RANGES
        ]

    q = QUEUE
    return [
        PageSpec("GET /healthz (baseline)", "/healthz", None, login=False),
        PageSpec("GET /", "/", overview),
        PageSpec("GET /partials/overview", "/partials/overview", Reads.queue_stats, partial=True),
        *chart_pages("/partials/charts", None, " (all queues)"),
        PageSpec(f"GET /queues/{q}", f"/queues/{q}", listing(charts=True)),
        PageSpec(f"GET /partials/queues/{q}", f"/partials/queues/{q}", listing(), partial=True),
        *chart_pages(f"/partials/queues/{q}/charts", q),
        PageSpec(f"GET /queues/{q}?state=done", f"/queues/{q}?state=done", listing(True, state="done")),
        PageSpec(f"GET /queues/{q}?state=ready", f"/queues/{q}?state=ready", listing(True, state="ready")),
        PageSpec(
            f"GET /queues/{q}?state=retrying", f"/queues/{q}?state=retrying", listing(True, state="retrying")
        ),
        PageSpec(
            f"GET /queues/{q}?q={COMMON_WORD} (1 title in 20)",
            f"/queues/{q}?q={COMMON_WORD}",
            listing(True, search=COMMON_WORD),
        ),
        PageSpec(
            f"GET /queues/{q}?q={rare} (1 title in 500)", f"/queues/{q}?q={rare}", listing(True, search=rare)
        ),
        PageSpec(
            f"GET /queues/{q}?q={PAYLOAD_SEARCH} (payload search)",
            f"/queues/{q}?q={quote(PAYLOAD_SEARCH)}",
            listing(True, search=PAYLOAD_SEARCH),
            optional=True,
        ),
        PageSpec("GET /leases", "/leases", lambda r: r.leases()),
        PageSpec("GET /partials/leases", "/partials/leases", lambda r: r.leases(), partial=True),
        PageSpec("GET /agents", "/agents", lambda r: r.agents(), optional=True),
        PageSpec(
            "GET /partials/agents", "/partials/agents", lambda r: r.agents(), partial=True, optional=True
        ),
        PageSpec("GET /dead", "/dead", dead(None)),
        PageSpec("GET /partials/dead", "/partials/dead", dead(None), partial=True),
        PageSpec(f"GET /dead?queue={q}", f"/dead?queue={q}", dead(q)),
        PageSpec(
            f"GET /todos/<id> ({detail_label})", f"/todos/{detail_id}", lambda r: r.todo_detail(detail_id)
        ),
        PageSpec("GET /create", "/create", None),
    ]


async def answering(client: httpx.AsyncClient, specs: list[PageSpec]) -> tuple[list[PageSpec], list[str]]:
    """The specs to measure: every page, and the optional ones that answer 200 now (the
    others are named in a note)."""
    kept, notes = [], []
    for spec in specs:
        if spec.optional:
            headers = {"HX-Request": "true"} if spec.partial else None
            r = await client.get(spec.path, headers=headers, follow_redirects=False)
            if r.status_code != 200:
                notes.append(f"{spec.label}: not measured, HTTP {r.status_code} (not built yet?)")
                continue
        kept.append(spec)
    return kept, notes


async def login(client: httpx.AsyncClient, name: str, password: str) -> None:
    r = await client.get("/login")
    r.raise_for_status()
    token = client.cookies.get("csrftoken")
    if not token:
        raise RuntimeError("GET /login set no csrftoken cookie")
    r = await client.post(
        "/login", data={"name": name, "password": password, "_csrf_token": token}, follow_redirects=False
    )
    if r.status_code != 303:
        raise RuntimeError(f"login failed: {r.status_code} {r.text[:300]}")


async def get_page(client: httpx.AsyncClient, spec: PageSpec) -> float:
    """ms for one GET (the whole body read); the body size is kept on the spec."""
    headers = {"HX-Request": "true"} if spec.partial else None
    started = time.perf_counter()
    r = await client.get(spec.path, headers=headers, follow_redirects=False)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise RuntimeError(f"{spec.path}: HTTP {r.status_code} {r.text[:300]}")
    spec.sizes.append(len(r.content))
    return elapsed * 1000


# Statement names, for the calls a Recorder saw.
NAMES = {st.sql: f"{family}.{st.name}" for family, q in (("reads", READS), ("rollups", ROLLUPS)) for st in q}


@dataclass
class Call:
    sql: str
    args: tuple
    settings: tuple[str, ...]  # the SET LOCALs it ran under (Reads' custom plans)
    ms: float

    @property
    def name(self) -> str:
        shown = " ".join(self.sql.split())
        return NAMES.get(self.sql) or (shown[:100] + (" …" if len(shown) > 100 else ""))


class Recorder:
    """Stands in for a connection under Reads, chart_set or Rollups: runs every statement
    on `conn` and records it, with its time and the SET LOCALs in force (for EXPLAIN)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.calls: list[Call] = []
        self.settings: list[str] = []

    @contextlib.asynccontextmanager
    async def transaction(self):
        try:
            async with self.conn.transaction():
                yield
        finally:
            self.settings.clear()

    async def _run(self, method: str, sql: str, *args):
        if method == "execute" and re.match(r"(\s*--[^\n]*\n)*\s*SET\s", sql, re.IGNORECASE):
            self.settings.append(sql)
            return await self.conn.execute(sql)
        started = time.perf_counter()
        result = await getattr(self.conn, method)(sql, *args)
        self.calls.append(Call(sql, args, tuple(self.settings), (time.perf_counter() - started) * 1000))
        return result

    async def fetch(self, sql: str, *args):
        return await self._run("fetch", sql, *args)

    async def executemany(self, sql: str, rows: list):
        started = time.perf_counter()
        await self.conn.executemany(sql, rows)
        self.calls.append(
            Call(
                sql,
                tuple(rows[0]) if rows else (),
                tuple(self.settings),
                (time.perf_counter() - started) * 1000,
            )
        )

    async def fetchrow(self, sql: str, *args):
        return await self._run("fetchrow", sql, *args)

    async def fetchval(self, sql: str, *args):
        return await self._run("fetchval", sql, *args)

    async def execute(self, sql: str, *args):
        return await self._run("execute", sql, *args)


async def page_sql(pool: asyncpg.Pool, spec: PageSpec, operator: str) -> None:
    """The statements a page runs, directly on the pool, timed together."""
    started = time.perf_counter()
    if spec.login:
        await pool.fetchrow(OPERATOR_SQL, operator)
    if spec.reads is not None:
        await spec.reads(Reads(pool))
    spec.sql.append((time.perf_counter() - started) * 1000)


async def measure_pages(
    client: httpx.AsyncClient, pool: asyncpg.Pool, specs: list[PageSpec], args, operator: str
) -> None:
    for _ in range(args.warmup):
        for spec in specs:
            await get_page(client, spec)
    for rnd in range(args.requests):
        for spec in specs:
            spec.samples.append(await get_page(client, spec))
        if (rnd + 1) % 10 == 0:
            log(f"  round {rnd + 1}/{args.requests}")
    for _ in range(args.sql_runs):
        for spec in specs:
            await page_sql(pool, spec, operator)


async def measure_stats(pool: asyncpg.Pool, n: int) -> list[float]:
    reads = Reads(pool)
    for _ in range(3):
        await reads.queue_stats()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await reads.queue_stats()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


# -- server-sent events ----------------------------------------------------------------------


@dataclass
class SSELine:
    at: float
    event: str
    data: str


class SSEStream:
    """A GET on an SSE endpoint read by a background task into a queue of events."""

    def __init__(self, client: httpx.AsyncClient, path: str, headers: dict | None = None) -> None:
        self.client = client
        self.path = path
        self.headers = {"Accept": "text/event-stream", **(headers or {})}
        self.lines: asyncio.Queue[SSELine] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self._opened = asyncio.Event()
        self.error: BaseException | None = None

    async def __aenter__(self) -> SSEStream:
        self.task = asyncio.create_task(self._read())
        opened = asyncio.create_task(self._opened.wait())
        await asyncio.wait({self.task, opened}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        opened.cancel()
        if self.task.done():
            self.task.result()  # raises what went wrong
        if not self._opened.is_set():
            raise RuntimeError(f"{self.path}: no first event within 10 s")
        return self

    async def __aexit__(self, *exc) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await self.task

    async def _read(self) -> None:
        async with self.client.stream("GET", self.path, headers=self.headers) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"{self.path}: HTTP {response.status_code} {response.text[:300]}")
            event = "message"
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if line.startswith(":"):
                    self._opened.set()
                    self.lines.put_nowait(SSELine(now, "comment", line[1:].strip()))
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    self._opened.set()
                    self.lines.put_nowait(SSELine(now, event, line[5:].strip()))
                elif not line:
                    event = "message"

    def drain(self) -> list[SSELine]:
        out = []
        while not self.lines.empty():
            out.append(self.lines.get_nowait())
        return out

    async def expect(self, match: Callable[[SSELine], bool], within: float) -> SSELine | None:
        deadline = time.perf_counter() + within
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            try:
                line = await asyncio.wait_for(self.lines.get(), left)
            except TimeoutError:
                return None
            if match(line):
                return line


async def hint_latency(
    stream: SSEStream, store: Store, count: int, spacing: float, match: Callable[[SSELine], bool]
) -> tuple[list[float], int]:
    """Enqueue `count` todos `spacing` s apart; ms from commit to the matching event line."""
    samples, lost = [], 0
    for k in range(count):
        await asyncio.sleep(spacing)
        stream.drain()
        await store.create(NewTodo(queue=HINT_QUEUE, title=f"hint {k}", kind="bench"))
        committed = time.perf_counter()
        line = await stream.expect(match, within=2.0)
        if line is None:
            lost += 1
            continue
        samples.append((line.at - committed) * 1000)
    return samples, lost


@dataclass
class Burst:
    enqueued: int
    seconds: float
    refresh_per_s: float
    refresh_max_1s: int
    refresh_total: int
    overview: list[float]


async def burst(client: httpx.AsyncClient, stream: SSEStream, dsn: str) -> Burst:
    """~BURST_RATE todos/s for BURST_SECONDS while counting refreshes and timing the overview."""
    pool = await dbmod.create_pool(dsn, min_size=2, max_size=2)
    store = Store(pool)
    stop = asyncio.Event()
    overview: list[float] = []
    spec = PageSpec("overview", "/partials/overview", None, partial=True)

    async def produce() -> int:
        made, k = 0, 0
        interval = BURST_BATCH / BURST_RATE
        start = time.perf_counter()
        while time.perf_counter() - start < BURST_SECONDS:
            batch = [
                NewTodo(
                    queue=f"q{(k * BURST_BATCH + j) % QUEUES}",
                    title=f"burst {k}.{j}",
                    kind="burst",
                    payload={"k": k, "j": j},
                )
                for j in range(BURST_BATCH)
            ]
            made += len(await store.create_many(batch))
            k += 1
            wait = start + k * interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        return made

    async def poll() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            overview.append(await get_page(client, spec))
            await asyncio.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))

    try:
        await asyncio.sleep(1.0)
        stream.drain()
        poller = asyncio.create_task(poll())
        start = time.perf_counter()
        enqueued = await produce()
        seconds = time.perf_counter() - start
        await asyncio.sleep(0.7)  # the last coalesced refresh
        stop.set()
        await poller
    finally:
        await pool.close()
    refreshes = [line.at - start for line in stream.drain() if line.event == "refresh"]
    window = seconds + 0.7
    per_second = [0] * (int(window) + 1)
    for at in refreshes:
        if 0 <= at < window:
            per_second[int(at)] += 1
    inside = [at for at in refreshes if 0 <= at < window]
    return Burst(enqueued, seconds, len(inside) / window, max(per_second), len(inside), overview)


# -- the rollup job ---------------------------------------------------------------------------

# One minute of traffic, [$1, $2) at $3 todos a minute: each todo created, claimed and
# completed within it by one of the agents, with the three history rows the store writes
# (step, queue, elapsed), in time order.
ROLL_MINUTE_SQL = f"""
WITH made AS (
    INSERT INTO todos (queue, source, kind, title, payload, state, owner, lease_token, attempt, result,
                       created_at, updated_at, ready_at, claimed_at, completed_at)
    SELECT 'q' || (i % {QUEUES}), 'bench', 'webhook', 'rolled minute #' || i, jsonb_build_object('n', i),
           'done', 'agent-' || (i % {AGENTS}), 1, 1, '{{"ok": true}}', created, completed, created, claimed,
           completed
    FROM (SELECT $1::timestamptz AS since, $2::timestamptz AS until, $3::int AS n) AS p,
         generate_series(0, p.n - 1) AS i,
         LATERAL (SELECT p.since + i * (p.until - p.since) / p.n AS created) AS a,
         LATERAL (SELECT least(created + random() * interval '1 second',
                               p.until - interval '2 milliseconds') AS claimed) AS b,
         LATERAL (SELECT least(claimed + random() * interval '2 seconds',
                               p.until - interval '1 millisecond') AS completed) AS c
    ORDER BY i
    RETURNING id, queue, owner, created_at, claimed_at, completed_at
)
INSERT INTO todo_history (todo_id, at, from_state, to_state, actor_kind, actor, attempt, note,
                          event, queue, elapsed)
SELECT id, step.at, step.from_state, step.to_state, step.kind, step.actor, step.attempt, step.event,
       step.event, queue, step.elapsed
FROM made, LATERAL (VALUES
    (created_at, NULL::todo_state, 'pending'::todo_state, 'producer', 'bench', 0, 'created', NULL::real),
    (claimed_at, 'pending', 'claimed', 'agent', owner, 1, 'claimed',
     extract(epoch FROM claimed_at - created_at)::real),
    (completed_at, 'claimed', 'done', 'agent', owner, 1, 'completed',
     extract(epoch FROM completed_at - claimed_at)::real)
) AS step(at, from_state, to_state, kind, actor, attempt, event, elapsed)
ORDER BY step.at
"""


@dataclass
class RollRun:
    minute: datetime
    ms: float
    calls: list[Call]


@dataclass
class RollJob:
    history_rows: int  # per minute
    write_seconds: float  # per minute
    runs: list[RollRun]
    sliced_ms: list[float]  # per minute, rolled in ROLL_SLICE passes as the app does
    sample_ms: list[float]
    explained: list[str]


async def measure_roll(dsn: str, args) -> RollJob:
    """Write --roll-minutes minutes of history at ROLL_RATE (the last minutes of the
    previous hour), then roll each once, oldest first, in a committed transaction of its
    own as Rollups.roll does; then time the backlog sample. EXPLAIN of the last minute's
    statements (run again, rolled back) when the median misses."""
    conn = await dbmod.connect(dsn)  # the app's session settings: generic plans
    try:
        hour = await conn.fetchval("SELECT date_trunc('hour', now())")
        minutes = [hour - timedelta(minutes=k) for k in range(args.roll_minutes, 0, -1)]
        started = time.perf_counter()
        rows = 0
        ids = {}  # each minute's history ids, (after, upto]: as written, in time order
        for minute in minutes:
            after = await conn.fetchval("SELECT coalesce(max(id), 0) FROM todo_history")
            status = await conn.execute(
                ROLL_MINUTE_SQL, minute, minute + timedelta(minutes=1), ROLL_RATE * 60
            )
            rows += int(status.split()[-1])
            ids[minute] = (after, await conn.fetchval("SELECT max(id) FROM todo_history"))
        write_seconds = time.perf_counter() - started
        runs, sliced_ms = [], []
        for minute in minutes:
            first, last = ids[minute][0] + 1, ids[minute][1]
            recorder = Recorder(conn)
            rolled_back = conn.transaction()  # the whole minute at once (a catch-up), undone ...
            await rolled_back.start()
            started = time.perf_counter()
            await Rollups._roll(recorder, first - 1, last)
            runs.append(RollRun(minute, (time.perf_counter() - started) * 1000, recorder.calls))
            await rolled_back.rollback()
            started = time.perf_counter()  # ... then as the app rolls it: a pass every ROLL_SLICE
            slices = 60 // ROLL_SLICE
            bounds = [first - 1 + (last - first + 1) * k // slices for k in range(slices + 1)]
            for after, upto in itertools.pairwise(bounds):
                async with conn.transaction():
                    await Rollups._roll(conn, after, upto)
            sliced_ms.append((time.perf_counter() - started) * 1000)
        sample_ms = []
        for _ in range(3):
            started = time.perf_counter()
            await Rollups(conn).sample()
            sample_ms.append((time.perf_counter() - started) * 1000)
        explained = []
        if args.explain or statistics.median(r.ms for r in runs) > ROLL_TARGET_MS:
            explained = await explain(conn, runs[-1].calls, set())
        return RollJob(
            rows // len(minutes), write_seconds / len(minutes), runs, sliced_ms, sample_ms, explained
        )
    finally:
        await conn.close()


# -- EXPLAIN ------------------------------------------------------------------------------------


async def explain(conn: asyncpg.Connection, calls: list[Call], seen: set) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of each call not already in `seen`."""
    out = []
    for call in calls:
        key = (call.sql, repr(call.args))
        if key in seen or call.sql == OPERATOR_SQL:
            continue
        seen.add(key)
        sets = [
            line for setting in call.settings for line in setting.splitlines() if not line.startswith("--")
        ]
        plan = f"planned under {' '.join(sets)}" if sets else "planned as the app's pool plans it"
        args = repr(call.args)
        out.append(f"-- {call.name}: {call.ms:.1f} ms when recorded; {plan}")
        out.append(f"-- args: {args[:300]}{' …' if len(args) > 300 else ''}")
        out.extend(await explain_call(conn, call))
        out.append("")
    return out


async def explain_call(conn: asyncpg.Connection, call: Call) -> list[str]:
    """The call PREPAREd and EXECUTEd with its arguments as literals, so that the
    connection's plan_cache_mode picks a generic or a custom plan as it does for the app (a
    plain EXPLAIN with parameters always plans for their values); rolled back."""
    await conn.execute(f"PREPARE bench_explain AS {call.sql}")
    tr = conn.transaction()
    await tr.start()
    try:
        types = await conn.fetchval(
            "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'bench_explain'"
        )
        literals = [
            await conn.fetchval(f"SELECT quote_nullable(CAST($1 AS {t})::text) || '::{t}'", arg)
            for t, arg in zip(types, call.args, strict=True)
        ]
        for setting in call.settings:
            await conn.execute(setting)
        values = f"({', '.join(literals)})" if literals else ""
        return [r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_explain{values}")]
    finally:
        await tr.rollback()
        await conn.execute("DEALLOCATE bench_explain")


async def explain_reads(pool: asyncpg.Pool, reads: Callable[[Reads], Awaitable], seen: set) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of each statement `reads` runs (none already in `seen`)."""
    async with pool.acquire() as conn:
        recorder = Recorder(conn)
        await reads(Reads(recorder))
        return await explain(conn, recorder.calls, seen)


# -- the report --------------------------------------------------------------------------------


@dataclass
class Line:
    label: str
    p50: str = ""
    p95: str = ""
    n: str = ""
    size: str = ""
    sql: str = ""
    target: str = ""
    verdict: str = ""

    @classmethod
    def timed(cls, label: str, samples: list[float], target_ms: float | None = None) -> Line:
        """The median, p95 and count of `samples` (ms), and against `target_ms` (on the median)."""
        median = statistics.median(samples)
        line = cls(label, ms(median), ms(pct(samples, 95)), str(len(samples)))
        if target_ms is not None:
            line.target, line.verdict = f"median ≤ {target_ms:.0f} ms", verdict(median <= target_ms)
        return line


def ms(v: float) -> str:
    return f"{v:.1f} ms"


def render(sections: list[tuple[str, list[Line]]], header: list[str]) -> str:
    rows = [astuple(Line("measurement", "median", "p95", "n", "body", "SQL median", "target", "result"))]
    for title, section in sections:
        rows.append((title,))
        rows.extend(astuple(line) for line in section)
    return "\n".join([*header, "", *table(rows, right={1, 2, 3, 4, 5})])


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# -- main ------------------------------------------------------------------------------------


async def run_all(server: Server, args, tmp: Path) -> int:
    settings = await harness.server_settings(server.dsn, SETTINGS)
    for dataset in args.datasets:
        await run_dataset(server, dataset, args, tmp, settings)
    return 0


async def run_dataset(server: Server, dataset: str, args, tmp: Path, settings: dict[str, str]) -> None:
    """Fill one dataset, measure it, drop it, and print its table."""
    started = time.perf_counter()
    load_before = os.getloadavg()
    app: AppProcess | None = None
    sections: list[tuple[str, list[Line]]] = []
    explained: list[str] = []
    try:
        dsn = await server.new_database(f"pages_{dataset}")
        log(f"{dataset}: filling {args.todos:,} todos over {QUEUES} queues")
        fill_started = time.perf_counter()
        facts = await fill(dsn, args.todos, dataset)
        fill_seconds = time.perf_counter() - fill_started
        log(f"filled in {fill_seconds:.0f} s: {facts['states']}, {facts['size']}")

        pool = await dbmod.create_pool(dsn, min_size=2, max_size=4)
        try:
            accounts = Accounts(pool)
            operator = "bench"
            password = await accounts.add_operator(operator, "operator")
            _, token = await accounts.add_token("bench-agent", [HINT_QUEUE])

            app = AppProcess(dsn, tmp / f"app-{dataset}.log")
            await app.start()
            # Let the app's reaper take the lapsed leases first (as it would in production).
            await asyncio.sleep(2.0)

            timeout = httpx.Timeout(30.0, read=None)
            async with (
                httpx.AsyncClient(base_url=app.base, trust_env=False, timeout=30) as client,
                httpx.AsyncClient(base_url=app.base, trust_env=False, timeout=timeout) as streams,
            ):
                await login(client, operator, password)
                streams.cookies = client.cookies
                specs, notes = await answering(
                    client, page_specs(facts["detail_id"], facts["detail_label"], facts["rare_word"])
                )
                log(
                    f"pages: {args.warmup} warm-up and {args.requests} measured rounds over {len(specs)} URLs"
                )
                with CPUMeter(app) as meter:
                    await measure_pages(client, pool, specs, args, operator)
                app.check_alive()

                log(f"Reads.queue_stats() directly, {args.stats_calls} calls")
                stats = await measure_stats(pool, args.stats_calls)

                # Verdicts and EXPLAIN now, before the hint and burst phases add rows.
                missed: list[tuple[str, Callable]] = []
                sections.append(
                    (
                        f"pages and partials: one request at a time, {args.requests} rounds over all "
                        f"URLs after {args.warmup} warm-up round(s)",
                        page_lines(specs, missed),
                    )
                )
                stats_ok = statistics.median(stats) <= STATS_TARGET_MS
                sections.append(
                    (
                        "the overview's SQL, directly on a pool",
                        [
                            Line.timed(
                                "Reads.queue_stats() (queue_counts + throughput + samples)",
                                stats,
                                STATS_TARGET_MS,
                            )
                        ],
                    )
                )
                if not stats_ok:
                    missed.append(("Reads.queue_stats()", Reads.queue_stats))
                if args.explain:
                    missed = [(s.label, s.reads) for s in specs if s.reads is not None]
                seen: set = set()
                for label, reads in missed:
                    text = await explain_reads(pool, reads, seen)
                    if text:
                        explained.append(f"== {label}")
                        explained.extend(text)

                if dataset == "mixed":
                    live = await measure_live(client, streams, Store(pool), token, dsn, args)
                app.check_alive()
            app.stop()  # the rollup job is measured alone, without the app's own
        finally:
            await pool.close()
        log(f"rollup job: {args.roll_minutes} minute(s) of {ROLL_RATE:,} todos/s")
        roll = await measure_roll(dsn, args)
    finally:
        if app is not None:
            app.stop()
        await server.drop_all()

    sections.append(roll_section(roll))
    if dataset == "mixed":
        sections.extend(live)
    states = facts["states"]
    order = ("done", "ready", "scheduled", "retrying", "claimed", "lapsed", "failed")
    load_after = os.getloadavg()
    header = [
        *harness.heading(f"dashboard pages, dataset {dataset!r}", server, settings, SHOWN_SETTINGS),
        f"{os.cpu_count()} CPUs shared by the bench (load generator), the app process and PostgreSQL; "
        f"load average (1, 5, 15 min) {' '.join(f'{v:.2f}' for v in load_before)} at start, "
        f"{' '.join(f'{v:.2f}' for v in load_after)} at end; "
        f"Python {platform.python_version()}, httpx {httpx.__version__}",
        f"data: {sum(states.values()):,} todos in {QUEUES} queues ("
        + ", ".join(f"{states.get(s, 0):,} {s}" for s in order if s in states)
        + f" after the fill; {facts['done_hour']:,} done in the last hour), "
        f"{facts['history']:,} history rows, todos {facts['size']}; {facts['rollups']:,} rollup rows "
        f"(queues: minutes 48 h, hours 90 d; agents: minutes 48 h); filled in {fill_seconds:.0f} s",
        f"cores used during the page rounds: {meter.result.cores()}",
        "the app's reaper and rollup job run as in production: the lapsed leases are re-surfaced at "
        "start-up, the backlog is sampled every 10 s",
        *notes,
        f"pages measured on {QUEUE}; SQL = the page's main reads directly on a pool (with the operator "
        f"lookup); {time.perf_counter() - started:.0f} s in all",
    ]
    print(render(sections, header), flush=True)
    for title, text in (
        ("the SQL behind " + ("every page" if args.explain else "the missed targets"), explained),
        ("the rollup job's statements, one minute run again and rolled back", roll.explained),
    ):
        if text:
            print(f"\nEXPLAIN (ANALYZE, BUFFERS) of {title}:\n", flush=True)
            print("\n".join(text), flush=True)
    print(flush=True)


async def measure_live(
    client: httpx.AsyncClient, streams: httpx.AsyncClient, store: Store, token: str, dsn: str, args
) -> list[tuple[str, list[Line]]]:
    """The hint latency on both streams, then the burst: their sections of the table."""
    log(f"hint latency on /api/v1/channels: {args.hints} enqueues 100 ms apart")
    async with SSEStream(
        streams, f"/api/v1/channels?queues={HINT_QUEUE}", {"Authorization": f"Bearer {token}"}
    ) as channel:
        chan, chan_lost = await hint_latency(
            channel, store, args.hints, 0.1, lambda s: s.event == "hint" and HINT_QUEUE in s.data
        )
    log(f"hint latency on /events: {args.dash_hints} enqueues 600 ms apart")
    async with SSEStream(streams, "/events") as events:
        dash, dash_lost = await hint_latency(
            events,
            store,
            args.dash_hints,
            0.6,
            lambda s: s.event == "refresh" and HINT_QUEUE in s.data.split(","),
        )
    log(f"burst: ~{BURST_RATE} todos/s for {BURST_SECONDS:.0f} s")
    async with SSEStream(streams, "/events") as events:
        b = await burst(client, events, dsn)
    rate = b.enqueued / b.seconds
    return [
        (
            "hint latency: enqueue's commit returned → matching SSE line read (≤ 0: the line "
            "was read before the producer's await of the commit returned)",
            [
                hint_line("GET /api/v1/channels (agent token), enqueues 100 ms apart", chan, chan_lost),
                hint_line("GET /events (operator session), enqueues 600 ms apart", dash, dash_lost),
            ],
        ),
        (
            f"burst: {b.enqueued:,} todos in {b.seconds:.1f} s ({rate:,.0f}/s, Store.create_many "
            f"of {BURST_BATCH}, own pool) over {QUEUES} queues",
            [
                Line(
                    "`refresh` events on /events per second (avg; max in a 1-s bin)",
                    f"{b.refresh_per_s:.1f}/s",
                    f"max {b.refresh_max_1s}",
                    str(b.refresh_total),
                    "",
                    "",
                    f"≤ {REFRESH_TARGET:.0f}/s",
                    verdict(b.refresh_max_1s <= REFRESH_TARGET),
                ),
                Line.timed(
                    "GET /partials/overview during the burst, every 100 ms", b.overview, PAGE_TARGET_MS
                ),
            ],
        ),
    ]


def hint_line(label: str, samples: list[float], lost: int) -> Line:
    p95 = pct(samples, 95) if samples else float("inf")
    n = f"{len(samples)}" + (f" ({lost} lost)" if lost else "")
    return Line(
        label,
        ms(statistics.median(samples)) if samples else "—",
        ms(p95),
        n,
        "",
        "",
        f"p95 ≤ {HINT_TARGET_MS:.0f} ms",
        verdict(p95 <= HINT_TARGET_MS and not lost),
    )


def roll_section(roll: RollJob) -> tuple[str, list[Line]]:
    totals = [r.ms for r in roll.runs]
    parts: dict[str, list[float]] = {}
    for run in roll.runs:
        for call in run.calls:
            parts.setdefault(call.name, []).append(call.ms)
    first, last = roll.runs[0].minute, roll.runs[-1].minute
    return (
        f"the rollup job, app stopped: {len(roll.runs)} minute(s) ({first:%H:%M}–{last:%H:%M} UTC) of "
        f"{ROLL_RATE:,} todos/s over {QUEUES} queues and {AGENTS} agents, each written in "
        f"{roll.write_seconds:.1f} s and rolled once, oldest first",
        [
            Line.timed(
                f"Rollups._roll of one minute: {ROLL_RATE * 60:,} todos, {roll.history_rows:,} history rows",
                totals,
                ROLL_TARGET_MS,
            ),
            *(Line.timed(f"  {name}", v) for name, v in parts.items()),
            Line.timed(
                f"  the same minute in {60 // ROLL_SLICE} passes of {ROLL_SLICE} s, as the app rolls it",
                roll.sliced_ms,
            ),
            Line.timed("Rollups.sample() (the backlog, every 10 s in the app)", roll.sample_ms),
        ],
    )


def page_lines(specs: list[PageSpec], missed: list) -> list[Line]:
    lines = []
    for spec in specs:
        med = statistics.median(spec.samples)
        is_base = spec.path == "/healthz"
        ok = med <= PAGE_TARGET_MS
        lines.append(
            Line(
                spec.label,
                ms(med),
                ms(pct(spec.samples, 95)),
                str(len(spec.samples)),
                f"{statistics.median(spec.sizes) / 1024:.0f} KiB",
                ms(statistics.median(spec.sql)) if spec.login or spec.reads else "",
                "" if is_base else f"median ≤ {PAGE_TARGET_MS:.0f} ms",
                "" if is_base else verdict(ok),
            )
        )
        if not ok and not is_base and spec.reads is not None:
            missed.append((spec.label, spec.reads))
    return lines


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--todos         1,000,000  20,000  todos in each dataset
--roll-minutes  3          1       minutes written and rolled up
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "20,000 todos per dataset, 8 requests a URL", SIZES)
    parser.add_argument(
        "--dataset", choices=(*DATASETS, "both"), default="both", help="mixed, pending, or both in turn"
    )
    parser.add_argument("--requests", type=int, help="measured requests per URL (50; --quick 8)")
    parser.add_argument("--runs", type=int, help="alias of --requests, for symmetry")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print EXPLAIN (ANALYZE, BUFFERS) of every page's SQL and the rollup job's, not just misses",
    )
    args = parser.parse_args(argv)
    args.datasets = DATASETS if args.dataset == "both" else (args.dataset,)
    args.requests = args.requests or args.runs or (8 if args.quick else 50)
    args.warmup = 2 if args.quick else 5
    args.sql_runs = 5 if args.quick else 20
    args.stats_calls = 20 if args.quick else 50
    args.hints = 20 if args.quick else 50
    args.dash_hints = 8 if args.quick else 25
    if args.todos < 10_000 or args.requests < 1 or not 1 <= args.roll_minutes <= 59:
        parser.error("--todos must be at least 10,000, --requests at least 1, --roll-minutes 1 to 59")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-pages-", run_all, parse_args(None)))
