"""Search by payload at 1,000,000 todos: which index on todos.payload, by measurement.

    .venv/bin/python bench/payload_search.py            # 1,000,000 todos, 15 rounds, ~20 min on 2 cores
    .venv/bin/python bench/payload_search.py --quick    # 100,000 todos, 2 rounds, ~1 min
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

One run against one server: DATABASE_URL if set, else an embedded PostgreSQL on a
temporary data dir. One database is filled once with --todos todos over 20 queues
q0…q19 (93% done, 5% pending, 2% dead, created over two days) with payloads of three
shapes by queue: orders (q0-q9: a customer with an id and a tier, an order with a
status, a total and a currency, 0-8 tags; one customer id in seven written as a string),
emails (q10-q14) and webhooks (q15-q19), each naming one of 50,000 customers (about 20
todos each, all in one queue).

Each candidate index (none; GIN jsonb_path_ops; GIN jsonb_ops; GIN jsonb_path_ops with
a 16 MB pending list (gin_pending_list_limit; 4 MB by default) or with fastupdate off; GIN
jsonb_path_ops, with either pending list, and a btree on (created_at, id), which lets a
search in no queue walk the newest todos first) gets its own copy of that database
(CREATE DATABASE … TEMPLATE; the fill dropped migration 0010's indexes from it first),
where it is built (timed) and the table vacuumed and analyzed. Then:
1. the list without a search, then every search of `searches()`, through the real
   Reads.list_todos (a page of 50), in queue q3 and in no queue, on each copy: median
   and p95 over up to --samples calls after one warm-up call (a search stops after
   SEARCH_BUDGET seconds, with at least three calls), and the scans its plan used;
2. --runs rounds, each over every copy in a rotated order: --enqueue todos (payloads,
   titles and kinds sampled from the table once) in Store.create_many batches of 100 by
   PRODUCERS producers, each on its own connection; then claim + complete of those todos
   by PRODUCERS workers (Store.claim_batch of 10, then Store.complete_many). Each claim
   and each completion rewrites the row outside HOT (state is in index predicates), so
   it inserts into every index of todos, these too. The todos stay (done), in every copy
   alike;
3. the most selective search again on each copy, with the GIN pending list (the entries
   of recent inserts, which every search reads through) as the rounds left it.

The table shows, per index, its build time and size, the enqueue and claim + complete
rates (medians over the rounds) and their ratio to no index (the median of each round's
ratio: the copies run side by side, so a busy minute costs them alike; target: enqueue
≥ 0.90×), then each search's median / p95 (target: ≤ 100 ms median) and its plan's scans.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import harness
import options
from harness import Server, log
from stats import pct, rotated, table, timed

from dashboard import db as dbmod
from dashboard.models import NewTodo
from dashboard.queries import READS
from dashboard.reads import READ_TIMEOUT, Reads, TodoFilter, _filter_values
from dashboard.store import Store

QUEUES = 20
QUEUE = "q3"  # an orders queue, for the searches within one queue
ENQUEUED = "enqueued"  # the queue of the enqueue and claim runs, emptied after each
PRODUCERS = 4
BATCH = 100
SEARCH_BUDGET = 10.0  # seconds per search, at least MIN_SAMPLES calls
MIN_SAMPLES = 3
SEARCH_TARGET_MS = 100.0
ENQUEUE_TARGET = 0.90  # of the rate without an index
SHOWN_SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "work_mem", "maintenance_work_mem")
CUSTOMERS = 50_000

_CUSTOMER = f"(1 + (i * 7919::bigint) % {CUSTOMERS})::int"
# Three shapes, by queue (i % 20 is the queue's number in dashboard_pages' fill).
PAYLOAD = f"""CASE
  WHEN i % 20 < 10 THEN jsonb_build_object(
    'customer', jsonb_build_object(
        'id', CASE WHEN i % 7 = 0 THEN to_jsonb({_CUSTOMER}::text) ELSE to_jsonb({_CUSTOMER}) END,
        'tier', (ARRAY['free', 'free', 'free', 'pro', 'pro', 'enterprise'])[1 + ({_CUSTOMER} / 20) % 6]),
    'order', jsonb_build_object(
        'id', 'ord_' || i,
        'status', (ARRAY['paid', 'paid', 'paid', 'paid', 'pending', 'pending', 'shipped', 'shipped',
                         'refunded', 'cancelled'])[1 + floor(random() * 10)::int],
        'total', round((random() * 500)::numeric, 2),
        'currency', (ARRAY['EUR', 'USD', 'GBP'])[1 + i % 3]),
    'tags', (SELECT coalesce(jsonb_agg(tag), '[]') FROM unnest(ARRAY['vip', 'eu', 'us', 'gift',
             'b2b', 'fragile', 'express', 'returning']) AS tag WHERE random() < 0.15 AND i > 0))
  WHEN i % 20 < 15 THEN jsonb_build_object(
    'customer', jsonb_build_object('id', {_CUSTOMER}),
    'email', jsonb_build_object(
        'to', 'user' || {_CUSTOMER} || '@example.com',
        'template', (ARRAY['welcome', 'receipt', 'reset', 'digest'])[1 + i % 4],
        'locale', (ARRAY['en', 'en', 'de', 'fr', 'nl'])[1 + i % 5]))
  ELSE jsonb_build_object(
    'event', jsonb_build_object(
        'id', 'evt_' || md5(i::text),
        'type', (ARRAY['invoice.paid', 'invoice.payment_failed', 'customer.updated',
                       'charge.refunded'])[1 + i % 4]),
    'customer', jsonb_build_object('id', {_CUSTOMER}),
    'attempt', 1 + i % 3)
END"""


@dataclass
class Variant:
    key: str
    label: str
    create: list[str]  # the CREATE INDEX statements; none: no index
    build_s: float = 0.0
    size: str = ""
    enqueue: list[float] = field(default_factory=list)  # todos/s, one per round
    claims: list[float] = field(default_factory=list)
    searches: dict[str, tuple[list[float], int, str]] = field(default_factory=dict)  # ms, rows, scans


# The index names (migration 0010 creates todos_payload): the fill drops them first, so that every copy
# starts without them.
INDEX = "todos_payload"
NEWEST = "todos_newest"  # a candidate not chosen: newest first across queues (migration 0010)
PATH_OPS = f"CREATE INDEX {INDEX} ON todos USING gin (payload jsonb_path_ops)"
VARIANTS = [
    Variant("none", "no index on payload", []),
    Variant("path_ops", "GIN (payload jsonb_path_ops)", [PATH_OPS]),
    Variant("ops", "GIN (payload) (jsonb_ops)", [f"CREATE INDEX {INDEX} ON todos USING gin (payload)"]),
    Variant(
        "path_ops_16mb",
        "GIN (payload jsonb_path_ops) WITH (gin_pending_list_limit = 16MB)",
        [f"{PATH_OPS} WITH (gin_pending_list_limit = 16384)"],
    ),
    Variant(
        "path_ops_nofast",
        "GIN (payload jsonb_path_ops) WITH (fastupdate = off)",
        [f"{PATH_OPS} WITH (fastupdate = off)"],
    ),
    Variant(
        "path_ops_newest",
        "GIN (payload jsonb_path_ops) + btree (created_at, id)",
        [PATH_OPS, f"CREATE INDEX {NEWEST} ON todos (created_at, id)"],
    ),
    Variant(
        "path_ops_16mb_newest",
        "GIN (payload jsonb_path_ops) WITH (gin_pending_list_limit = 16MB) + btree (created_at, id)",
        [
            f"{PATH_OPS} WITH (gin_pending_list_limit = 16384)",
            f"CREATE INDEX {NEWEST} ON todos (created_at, id)",
        ],
    ),
]


def searches(customer: str) -> list[tuple[str, str | None]]:
    """(label, search box text), the list without a search first, then the most selective
    search first; each runs in QUEUE and in no queue."""
    return [
        ("the list without a search", None),
        (f"customer.id={customer} (one customer's, number or string)", f"customer.id={customer}"),
        (
            "customer.tier=enterprise order.status=refunded (~0.8%)",
            "customer.tier=enterprise order.status=refunded",
        ),
        ('tags=["vip"] (~7%)', 'tags=["vip"]'),
        ("order.status=paid (~20%)", "order.status=paid"),
        ("customer.id=999999 (no match)", "customer.id=999999"),
    ]


# -- the fill ---------------------------------------------------------------------------------


FILL = f"""
INSERT INTO todos (queue, source, kind, title, payload, idempotency_key, state, owner, lease_token,
                   attempt, last_error, created_at, updated_at, ready_at, claimed_at, completed_at)
SELECT 'q' || (i % {QUEUES}), 'bench',
       (ARRAY['order', 'email', 'webhook'])[1 + (i % 20) / 10 + (i % 20) / 15],
       'todo #' || i || ' for customer ' || {_CUSTOMER}, {PAYLOAD},
       CASE WHEN i % 3 = 0 THEN 'key-' || i END, state,
       CASE WHEN state <> 'pending' THEN 'worker-' || i % 8 END, (state <> 'pending')::int * 1,
       (state <> 'pending')::int * 1, CASE WHEN state = 'failed' THEN 'HTTP 502 from upstream' END,
       t, t, CASE WHEN state = 'pending' THEN t END,
       CASE WHEN state <> 'pending' THEN t + interval '30 seconds' END,
       CASE WHEN state <> 'pending' THEN t + interval '1 minute' END
FROM (SELECT i, now() - make_interval(secs => ($1 - i) * 172800.0 / $1) AS t,
             (CASE WHEN i % 100 < 93 THEN 'done' WHEN i % 100 < 98 THEN 'pending'
                   ELSE 'failed' END)::todo_state AS state
      FROM generate_series(1, $1) AS i) s
"""


async def fill(dsn: str, n: int) -> dict:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP INDEX IF EXISTS {INDEX}, {NEWEST}")
        await conn.execute("SELECT setseed(0.13)")
        await conn.execute(FILL, n)
        await harness.settle(conn)
        customer = await conn.fetchval(
            "SELECT payload->'customer'->>'id' FROM todos WHERE queue = $1 ORDER BY id LIMIT 1", QUEUE
        )
        return {
            "customer": customer,
            "size": await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('todos'))"),
            "payload_bytes": await conn.fetchval(
                "SELECT avg(pg_column_size(payload))::int FROM todos TABLESAMPLE SYSTEM (1)"
            ),
        }
    finally:
        await conn.close()


# -- measurements -----------------------------------------------------------------------------


async def scans(pool: asyncpg.Pool, filters: TodoFilter) -> str:
    """How the list's plan reads todos for these filters: gin, queue (todos_by_queue), seq…"""
    values = {**_filter_values(filters), "before_at": None, "before_id": None, "limit": 51}
    async with pool.acquire() as conn, conn.transaction():
        await READS.plan_for_values.execute(conn, timeout=f"{READ_TIMEOUT * 1000:.0f}")  # as Reads plans it
        text = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) " + READS.list_todos.sql, *READS.list_todos.args(values)
        )
    found: list[str] = []

    def walk(node: dict) -> None:
        name = node.get("Index Name")
        if name:
            short = {INDEX: "gin", NEWEST: "newest", "todos_by_queue": "queue"}.get(name, name)
            if short not in found:
                found.append(short)
        elif node["Node Type"] == "Seq Scan":
            found.append("seq")
        for child in node.get("Plans", []):
            walk(child)

    walk(json.loads(text)[0]["Plan"])
    return "+".join(found)


async def time_search(reads: Reads, filters: TodoFilter, samples: int) -> tuple[list[float], int]:
    page = await reads.list_todos(filters, limit=50)  # warm-up
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < samples and (
        len(times) < MIN_SAMPLES or time.perf_counter() - started < SEARCH_BUDGET
    ):
        t0 = time.perf_counter()
        page = await reads.list_todos(filters, limit=50)
        times.append((time.perf_counter() - t0) * 1000)
    return times, len(page.items)


async def measure_searches(
    pool: asyncpg.Pool, variant: Variant, cases: list[tuple[str, str | None]], samples: int, when: str = ""
) -> None:
    reads = Reads(pool)
    for label, text in cases:
        for queue in (QUEUE, None):
            filters = TodoFilter(queue=queue, search=text)
            times, rows = await time_search(reads, filters, samples)
            key = f"{label} in {queue or 'no queue'}{when}"
            variant.searches[key] = (times, rows, await scans(pool, filters))
            how = variant.searches[key][2]
            log(f"    {key}: {statistics.median(times):.1f} ms median, {rows} rows, {how}")


async def sample_todos(dsn: str, n: int) -> list[list[NewTodo]]:
    """n todos to enqueue, in batches, with payloads, titles and kinds taken from the table."""
    conn = await dbmod.connect(dsn)
    try:
        rows = await conn.fetch("SELECT title, kind, payload FROM todos ORDER BY random() LIMIT $1", n)
    finally:
        await conn.close()
    todos = [NewTodo(queue=ENQUEUED, title=r["title"], kind=r["kind"], payload=r["payload"]) for r in rows]
    return [todos[i : i + BATCH] for i in range(0, len(todos), BATCH)]


async def enqueue_and_claim(dsn: str, batches: list[list[NewTodo]]) -> tuple[float, float]:
    """(todos/s enqueued, todos/s claimed and completed), PRODUCERS connections each."""
    conns = [await dbmod.connect(dsn) for _ in range(PRODUCERS)]
    try:
        stores = [Store(c) for c in conns]

        async def produce(store: Store, mine: list[list[NewTodo]]) -> int:
            for batch in mine:
                await store.create_many(batch)
            return sum(len(b) for b in mine)

        async def work(store: Store, owner: str) -> int:
            done = 0
            while held := await store.claim_batch([ENQUEUED], owner, 60, 10):
                await store.complete_many(owner, [(t.id, t.lease_token, None) for t in held])
                done += len(held)
            return done

        made_s, made = await timed([produce(s, batches[i::PRODUCERS]) for i, s in enumerate(stores)])
        await harness.checkpoint(conns[0])
        done_s, done = await timed([work(s, f"worker-{i}") for i, s in enumerate(stores)])
        if done != made:
            raise RuntimeError(f"{made} todos enqueued but {done} claimed and completed")
        return made / made_s, done / done_s
    finally:
        for c in conns:
            await c.close()


async def copy_of(server: Server, filled: str, variant: Variant) -> str:
    """A copy of the filled database with the variant's indexes, vacuumed and analyzed."""
    family = f"payload_{variant.key}"
    dsn = await server.new_empty_database(family, template=filled, strategy="FILE_COPY")
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        for statement in variant.create:
            await conn.execute(statement)
        variant.build_s = time.perf_counter() - started
        variant.size = await conn.fetchval(
            "SELECT pg_size_pretty(sum(pg_relation_size(oid))) FROM pg_class WHERE relname = ANY ($1)",
            [INDEX, NEWEST],
        )
        await harness.settle(conn)
    finally:
        await conn.close()
    return dsn


# -- the report -------------------------------------------------------------------------------


def report(variants: list[Variant], header: list[str]) -> str:
    base = variants[0]
    rows: list[tuple[str, ...]] = [
        ("index", "build", "size", "enqueue/s", "× none", "claim+complete/s", "× none", "verdict")
    ]
    for v in variants:
        enq = statistics.median([a / b for a, b in zip(v.enqueue, base.enqueue, strict=True)])
        clm = statistics.median([a / b for a, b in zip(v.claims, base.claims, strict=True)])
        fast = all(statistics.median(t) <= SEARCH_TARGET_MS for t, _, _ in v.searches.values())
        rows.append(
            (
                v.label,
                f"{v.build_s:.1f} s" if v.create else "",
                v.size or "",
                f"{statistics.median(v.enqueue):,.0f}",
                f"{enq:.2f}",
                f"{statistics.median(v.claims):,.0f}",
                f"{clm:.2f}",
                "both targets met"
                if fast and enq >= ENQUEUE_TARGET
                else ("searches MISS" if not fast else "enqueue MISS"),
            )
        )
    out = [*header, "", *table(rows, right={1, 2, 3, 4, 5, 6})]
    search_rows: list[tuple[str, ...]] = [
        ("search (Reads.list_todos, page of 50)", "rows", *(v.key for v in variants))
    ]
    for key in variants[0].searches:
        cells = []
        for v in variants:
            times, _, how = v.searches[key]
            cells.append(f"{statistics.median(times):.1f} / {pct(times, 95):.1f} {how}")
        search_rows.append((key, str(variants[0].searches[key][1]), *cells))
    out += [
        "",
        f"searches: median / p95 ms and the scans of the plan (target ≤ {SEARCH_TARGET_MS:.0f} ms median)",
    ]
    out += table(search_rows, right={1})
    return "\n".join(out)


# -- main -------------------------------------------------------------------------------------


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    settings = await harness.server_settings(server.dsn, (*SHOWN_SETTINGS, "max_connections"))
    variants = [dataclasses.replace(v, enqueue=[], claims=[], searches={}) for v in args.indexes]
    loads = []
    try:
        filled = await server.new_database("payload")
        log(f"filling {args.todos:,} todos over {QUEUES} queues")
        fill_started = time.perf_counter()
        facts = await fill(filled, args.todos)
        fill_s = time.perf_counter() - fill_started
        log(f"filled in {fill_s:.0f} s: {facts['size']}, payloads {facts['payload_bytes']} bytes on average")
        batches = await sample_todos(filled, args.enqueue)
        cases = searches(facts["customer"])
        dsns = {}
        for variant in variants:
            log(f"{variant.label}: copying the database, building, VACUUM ANALYZE")
            dsns[variant.key] = await copy_of(server, filled, variant)
            if variant.create:
                log(f"  built in {variant.build_s:.1f} s, {variant.size}")
            pool = await dbmod.create_pool(dsns[variant.key], min_size=1, max_size=2)
            try:
                await measure_searches(pool, variant, cases, args.samples)
            finally:
                await pool.close()
        for rnd in range(args.runs):
            loads.append(os.getloadavg()[0])
            log(f"enqueue and claim, round {rnd + 1} of {args.runs}, load average {loads[-1]:.1f}")
            for variant in rotated(variants, rnd):
                made, done = await enqueue_and_claim(dsns[variant.key], batches)
                variant.enqueue.append(made)
                variant.claims.append(done)
                log(f"  {variant.label}: enqueue {made:,.0f} todos/s, claim + complete {done:,.0f} todos/s")
        log("the most selective search again, with the GIN pending lists as the enqueues left them")
        for variant in variants:
            pool = await dbmod.create_pool(dsns[variant.key], min_size=1, max_size=2)
            try:
                await measure_searches(pool, variant, cases[1:2], args.samples, ", after the enqueue rounds")
            finally:
                await pool.close()
    finally:
        await server.drop_all()
    header = [
        *harness.heading("payload search", server, settings, SHOWN_SETTINGS),
        f"{os.cpu_count()} CPUs shared by the bench and PostgreSQL; load average {load_before[0]:.1f} at "
        f"start, {os.getloadavg()[0]:.1f} at end, at each enqueue round's start "
        + ", ".join(f"{x:.1f}" for x in loads)
        + f"; Python {platform.python_version()}",
        f"data: {args.todos:,} todos over {QUEUES} queues (93% done, 5% pending, 2% dead), todos "
        f"{facts['size']}, payloads {facts['payload_bytes']} bytes on average; filled in {fill_s:.0f} s; "
        "one copy of the database per index",
        f"enqueue: {args.enqueue:,} todos in Store.create_many batches of {BATCH} by {PRODUCERS} producers, "
        f"then claimed (claim_batch of 10) and completed (complete_many) by {PRODUCERS} workers; "
        f"{args.runs} rounds, the indexes in a rotated order; × none is the median of each round's ratio; "
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    print(report(variants, header), flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--todos    1,000,000  100,000  todos in the table
--runs     15         2        rounds of enqueue and claim runs
--enqueue  20,000     5,000    todos per enqueue run
--samples  30         10       calls per search at most
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "100,000 todos, 2 rounds, about a minute", SIZES)
    parser.add_argument(
        "--indexes",
        help=f"the candidates to compare, comma-separated (all: {','.join(v.key for v in VARIANTS)}); "
        "none is always one",
    )
    args = parser.parse_args(argv)
    keys = {"none", *(args.indexes or ",".join(v.key for v in VARIANTS)).split(",")}
    unknown = keys - {v.key for v in VARIANTS}
    if unknown:
        parser.error(
            f"no index {', '.join(sorted(unknown))}: choose from {', '.join(v.key for v in VARIANTS)}"
        )
    args.indexes = [v for v in VARIANTS if v.key in keys]
    if args.todos < 10_000 or args.runs < 1 or args.enqueue < BATCH:
        parser.error(f"--todos must be at least 10,000, --runs at least 1, --enqueue at least {BATCH}")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-payload-", run_all, parse_args(None)))
