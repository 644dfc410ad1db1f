"""What title search's trigram index (migration 0014, todos_text_search) costs enqueue and
claim + complete, and what it saves a search: the schema as migrated against the schema
before 0014, side by side in one run.

    .venv/bin/python bench/title_search_cost.py          # 200,000 todos, 5,000 a run, 3 runs
    .venv/bin/python bench/title_search_cost.py --quick  # 10,000 todos, 1,000 a run, 1 run
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

One database is migrated and filled with --table finished todos in the bench queue with
titles as people write them ("Refund order 123 for customer 4567 (card declined) …", about
70 characters), half of them with an idempotency key; a second one is a copy of it without
todos_text_search: the schema before 0014. Then --runs rounds, each over both in a rotated
order, each on a fresh copy (CREATE DATABASE … TEMPLATE) of its database:
1. enqueue: --todos pending todos with such titles through create_todos (the store's
   statement), batches of 100 from PRODUCERS connections;
2. claim + complete of those todos by pgbench (-M prepared, CLIENTS clients, generic plans:
   queue_throughput.py's "limit" script). Each claim and each completion rewrites the row
   outside HOT (state is in other indexes' predicates), so each inserts the title's
   trigrams into the index again; GIN's pending list (fastupdate) batches them, and a
   search reads through it.
The table shows each schema's rates (medians over the rounds) and their ratio with the
index to without (the median of each round's ratio), the index's size, then title searches
through Reads.list_todos (a page of 50, in the queue and over a token's queues) on both
databases: median and slowest of SEARCH_SAMPLES calls after one warm-up. The load average
is printed at the start and the end. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import harness
import options
import queue_throughput as qt
from harness import Server, log
from stats import Series, rotated, table, timed

from dashboard import db as dbmod
from dashboard.models import PRODUCER
from dashboard.reads import Reads, TodoFilter

INDEX = "todos_text_search"
PRODUCERS = 4
CLIENTS = 4
BATCH = 100
SEARCH_SAMPLES = 7
# A title as people write them; the SQL fill and the enqueue make the same ones.
VERBS = ("Refund", "Ship", "Email", "Invoice", "Review", "Escalate", "Translate", "Check")
WHY = ("card declined", "address changed", "asked twice", "damaged in transit", "VIP")


def title(i: int) -> str:
    return (
        f"{VERBS[i % len(VERBS)]} order {i} for customer {i * 7919 % 50_000} "
        f"({WHY[i % len(WHY)]}) ref {uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex[:12]}"
    )


def key(i: int) -> str | None:
    return f"order-{i}-{uuid.uuid5(uuid.NAMESPACE_URL, str(i)).hex[:8]}" if i % 2 else None


# (label, search, in the queue): a rare phrase, none at all, a two-character prefix, a key.
SEARCHES = (
    ("a phrase of one title", "order 4242 for customer", True),
    ("a phrase of one title, no queue", "order 4242 for customer", False),
    ("words no title holds", "no such words anywhere", True),
    ("two characters (a prefix)", "Zq", True),
    ("an idempotency key", key(4243) or "", False),
)


async def fill_table(conn: asyncpg.Connection, n: int) -> None:
    """n finished todos in the bench queue (with a history row each), titled and keyed as
    title() and key() do, created over the last n seconds."""
    for start in range(0, n, 10_000):
        numbers = list(range(start, min(n, start + 10_000)))
        await conn.execute(
            """WITH made AS (
                   INSERT INTO todos (id, queue, title, idempotency_key, state, owner, attempt,
                                      lease_token, created_at, claimed_at, completed_at)
                   SELECT 'td_t' || i, $1, t, k, 'done', 'seed', 1, 1,
                          now() - make_interval(secs => $4 - i), now(), now()
                   FROM unnest($2::int[], $3::text[], $5::text[]) AS u(i, t, k)
                   RETURNING id
               )
               INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
               SELECT id, 'claimed', 'done', 'agent', 'seed', 1, 'completed' FROM made""",
            qt.QUEUE,
            numbers,
            [title(i) for i in numbers],
            n,
            [key(i) for i in numbers],
        )


async def enqueue(dsn: str, first: int, n: int) -> float:
    """n pending todos (numbers from `first`) by PRODUCERS connections; seconds taken."""
    numbers = list(range(first, first + n))

    async def produce(conn: asyncpg.Connection, share: list[int]) -> int:
        for start in range(0, len(share), BATCH):
            batch = share[start : start + BATCH]
            ids = [f"td_{uuid.uuid4()}" for _ in batch]
            values = qt.create_values(ids, batch, [key(i) for i in batch], PRODUCER)
            await conn.fetch(qt.CREATE.sql, *qt.CREATE.args({**values, "titles": [title(i) for i in batch]}))
        return len(share)

    async with qt.connections(dsn, PRODUCERS, codec=False) as conns:
        seconds, made = await timed([produce(c, numbers[p::PRODUCERS]) for p, c in enumerate(conns)])
    assert made == n, (made, n)
    return seconds


async def one_run(server: Server, base: str, args, tmp: Path, label: str) -> tuple[float, float]:
    """Enqueue, then claim + complete, on a fresh copy of database `base`: both rates."""
    dsn = await server.new_empty_database("tcopy", template=base)
    per_client = max(1, args.todos // CLIENTS)
    total = per_client * CLIENTS
    conn = await asyncpg.connect(dsn)
    try:
        await harness.checkpoint(conn)
        enqueue_rate = total / await enqueue(dsn, args.table, total)
        await harness.settle(conn)
        script = qt.pgb_claim_complete()
        run = await qt.run_pgbench(dsn, script, clients=CLIENTS, transactions=per_client, tmp=tmp)
        await harness.expect_states(conn, {"done": args.table + total}, label)
    finally:
        await conn.close()
    await server.drop(dsn)
    return enqueue_rate, total / run.seconds


async def search_times(dsn: str) -> list[tuple[float, float]]:
    """(median, slowest) ms of each of SEARCHES through Reads.list_todos."""
    conn = await dbmod.connect(dsn)
    try:
        reads, found = Reads(conn), []
        for _, words, in_queue in SEARCHES:
            where = {"queue": qt.QUEUE} if in_queue else {"queues": (qt.QUEUE, "other")}
            filters = TodoFilter(**where, search=words)
            await reads.list_todos(filters)
            times = []
            for _ in range(SEARCH_SAMPLES):
                began = time.perf_counter()
                await reads.list_todos(filters)
                times.append((time.perf_counter() - began) * 1000)
            found.append((statistics.median(times), max(times)))
        return found
    finally:
        await conn.close()


async def run_all(server: Server, args, tmp: Path) -> int:
    started, load_before = time.perf_counter(), os.getloadavg()
    try:
        settings = await harness.server_settings(server.dsn)
        with_dsn = await server.new_database("title", check=qt.check_parameters)
        conn = await asyncpg.connect(with_dsn)
        try:
            if await conn.fetchval("SELECT to_regclass($1)", INDEX) is None:
                raise SystemExit(f"{INDEX} is missing: pg_trgm is not available on this server")
            log(f"[title] filling {args.table:,} todos")
            await fill_table(conn, args.table)
            await harness.settle(conn)
            size = await conn.fetchval("SELECT pg_size_pretty(pg_relation_size($1::regclass))", INDEX)
        finally:
            await conn.close()
        without_dsn = await server.new_empty_database("title_without", template=with_dsn)
        conn = await asyncpg.connect(without_dsn)
        try:
            await conn.execute(f"DROP INDEX {INDEX}")
            await harness.settle(conn)
        finally:
            await conn.close()

        variants = {
            "with": (with_dsn, f"with {INDEX} (0014)"),
            "without": (without_dsn, "without it (before 0014)"),
        }
        enqueues = {k: Series(k, label) for k, (_, label) in variants.items()}
        claims = {k: Series(k, label) for k, (_, label) in variants.items()}
        for rep in range(args.runs):
            log(f"[title] run {rep + 1}/{args.runs}")
            for k in rotated(list(variants), rep):
                base, label = variants[k]
                enqueue_rate, claim_rate = await one_run(server, base, args, tmp, label)
                log(f"  {label:<40} enqueue {enqueue_rate:>7,.0f}/s  claim + complete {claim_rate:>7,.0f}/s")
                enqueues[k].rates.append(enqueue_rate)
                claims[k].rates.append(claim_rate)
        searched = {"with": await search_times(with_dsn), "without": await search_times(without_dsn)}
    finally:
        await server.drop_all()

    def ratio(series: dict[str, Series]) -> str:
        each = [w / wo for w, wo in zip(series["with"].rates, series["without"].rates, strict=True)]
        span = f" ({min(each):.2f}–{max(each):.2f})" if len(each) > 1 else ""
        return f"{statistics.median(each):.2f}×{span}"

    rows: list[tuple[str, ...]] = [("schema", "enqueue/s", "spread", "claim + complete/s", "spread")]
    for k, (_, label) in variants.items():
        rows.append((label, *enqueues[k].rate_cells(), *claims[k].rate_cells()))
    rows.append(("ratio, with / without", ratio(enqueues), "", ratio(claims), ""))
    searches: list[tuple[str, ...]] = [
        (
            "title search (Reads.list_todos, 50 a page)",
            "with: median",
            "slowest",
            "without: median",
            "slowest",
        )
    ]
    for (label, words, in_queue), w, wo in zip(SEARCHES, searched["with"], searched["without"], strict=True):
        where = "" if in_queue else " (a token's queues)"
        searches.append(
            (
                f"{label}{where}: {words!r}",
                f"{w[0]:.1f} ms",
                f"{w[1]:.1f} ms",
                f"{wo[0]:.1f} ms",
                f"{wo[1]:.1f} ms",
            )
        )
    header = [
        *harness.heading("title search cost", server, settings),
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, pgbench {harness.pgbench_version()} "
        f"(-M prepared, -c {CLIENTS}), generic plans",
        f"{args.table:,} finished todos in the table; each run {args.todos:,} more enqueued "
        f"(create_todos, {PRODUCERS} producers, batches of {BATCH}), then claimed + completed; "
        f"median of {args.runs} run(s), each schema on a fresh copy, in a rotated order",
        f"{INDEX}: {size} after the fill; ratio: the median of each run's with / without, and its range",
        f"{time.perf_counter() - started:.0f} s in all; load average (1/5/15 min) "
        f"{qt.load_text(load_before)} at start, {qt.load_text(os.getloadavg())} at end",
    ]
    print(
        "\n".join([*header, "", *table(rows, {1, 2, 3, 4}), "", *table(searches, {1, 2, 3, 4})]), flush=True
    )
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs   3        1       rounds over both schemas
--table  200,000  10,000  finished todos in the table
--todos  5,000    1,000   todos enqueued, claimed and completed per run
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "10,000 todos, 1,000 per run, 1 run", SIZES)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.todos < CLIENTS or args.table < 1:
        parser.error(f"--runs and --table must be at least 1, --todos at least {CLIENTS}")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-title-", run_all, parse_args(None)))
