"""Sustained claims: does the claim slow down as a queue drains, or while a transaction
elsewhere holds back vacuum? (issue 11)

    .venv/bin/python bench/sustained.py                  # the full run: 4 runs of 5 min, ~23 min
    .venv/bin/python bench/sustained.py --seconds 60     # shorter runs, same shape
    .venv/bin/python bench/sustained.py --quick          # smoke run: 5-s runs of 20,000 pending
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/sustained.py

Four runs, one after another, each on a fresh database holding --pending (400,000) pending
todos, VACUUM ANALYZEd and checkpointed, drained by --workers (4) workers for --seconds
(300). Each worker is its own connection (one pool, this process) and its own owner name;
it claims one todo by id, then calls complete_and_claim_next on the todo it holds, again
and again. 400,000 todos last well under 5 minutes at these rates, so a producer on a
connection of its own tops the backlog up every second with as many todos as were
completed since (one INSERT, no history: the claim is what is measured), and the queue
holds --pending todos throughout, the new ones behind the old:

  ours          Store.complete_and_claim_next: each claim starts where the worker's last
                one ended, with a scan from the oldest now and then (dashboard/claim_cursor.py)
  ours, held    the same, while a REPEATABLE READ transaction the bench opened (and ran one
                statement in) before the workers started stays open for the whole run
  before        the statement as it was before migration 0007 (TODAY_SQL below: every claim
                scans the pending index from its oldest entry) on the indexes it had then
                (todos_leases keyed by state too), run by the same loop, each row parsed
                into a Todo as the store does
  before, held  the same, with the held transaction

Autovacuum runs as the server has it. Every --window (20) s each run prints a row: todos
completed per second in that window, the call's latency (p50 and p99, ms), and the todos
table's dead tuples (pg_stat_user_tables, which lags a little). At the end, the four runs side by side
with the ratios the targets name: last minute / first minute without the held transaction
(≥ 0.8), each window held / not held (≥ 0.5), p99 under the held transaction (≤ 20 ms),
and ours / before. The load average is printed with every table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import harness
import options
from harness import Server, load, log
from stats import pct, table

from dashboard import db as dbmod
from dashboard.models import Todo
from dashboard.queries import Statement
from dashboard.store import Store

QUEUE = "sustained"
TTL = 300.0

# complete_and_claim_next as it was before migration 0007 (sql/queries/transitions.sql at
# 21a89ce), and the indexes it planned on then: the two pending ones and todos_leases.
TODAY_SQL = """
WITH completed AS (
    UPDATE todos
    SET state = 'done', result = :result::text::jsonb, lease_expires_at = NULL, heartbeat_at = NULL,
        completed_at = clock_timestamp(), updated_at = clock_timestamp()
    WHERE id = :id AND state = 'claimed' AND owner = :owner AND lease_token = :lease
      AND (:scope::text[] IS NULL OR queue = ANY (:scope::text[]))
    RETURNING *
), picked AS (
    SELECT id FROM todos
    WHERE state = 'pending' AND queue = ANY (:queues::text[])
      AND (next_retry_at IS NULL OR next_retry_at <= now())
      AND (assignee IS NULL OR assignee = :owner)
      AND EXISTS (SELECT FROM completed)
    ORDER BY created_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE todos t
    SET state = 'claimed', owner = :owner, attempt = t.attempt + 1,
        lease_token = t.lease_token + 1, next_retry_at = NULL,
        lease_expires_at = clock_timestamp() + make_interval(secs => :ttl),
        claimed_at = clock_timestamp(), heartbeat_at = clock_timestamp(),
        updated_at = clock_timestamp()
    WHERE t.id = ANY (ARRAY (SELECT id FROM picked))
    RETURNING t.*
), logged AS (
    INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
    SELECT id, 'claimed'::todo_state, 'done'::todo_state, 'agent', :owner, attempt, 'completed'
    FROM completed
    UNION ALL
    SELECT id, 'pending', 'claimed', 'agent', :owner, attempt, 'claimed' FROM claimed
)
SELECT 'completed' AS part, * FROM completed
UNION ALL
SELECT 'claimed' AS part, * FROM claimed
"""
TODAY = Statement("complete_and_claim_next_before_0007", TODAY_SQL)
TODAY_INDEXES = [
    "DROP INDEX todos_ready",
    "DROP INDEX todos_ready_by_queue",
    "CREATE INDEX todos_pending_by_queue ON todos (queue, created_at) INCLUDE (next_retry_at)"
    " WHERE state = 'pending'",
    "CREATE INDEX todos_pending_by_age ON todos (created_at, queue) WHERE state = 'pending'",
    "DROP INDEX todos_leases",
    "CREATE INDEX todos_leases ON todos (lease_expires_at) INCLUDE (queue) WHERE state = 'claimed'",
]

# The pending todos: created (and ready) one microsecond apart, oldest first, in one queue.
FILL = """
INSERT INTO todos (id, queue, title, created_at, ready_at)
SELECT 'td_s' || g, $1, 'sustained ' || g, t, t
FROM generate_series(1, $2::int) AS g,
     LATERAL (SELECT now() - interval '1 hour' + g * interval '1 microsecond' AS t) AS at
"""
# The producer's top-up: created (and ready) now, behind everything already pending.
REFILL = """
INSERT INTO todos (id, queue, title)
SELECT 'td_r' || $2::int || '_' || g, $1, 'refill' FROM generate_series(1, $3::int) AS g
"""
REFILL_EVERY = 1.0  # seconds
HEADER, WIDTHS = ("s", "todos/s", "p50 ms", "p99 ms", "dead tuples"), (4, 7, 6, 6, 11)
DEAD_TUPLES = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'todos'"


@dataclass
class Run:
    key: str
    label: str
    ours: bool
    held: bool
    latencies: dict[int, list[float]] = field(default_factory=dict)  # window → seconds per call
    dead: dict[int, int] = field(default_factory=dict)  # window → n_dead_tup at its end
    window: float = 20.0  # seconds: --window

    def rate(self, w: int) -> float:
        return len(self.latencies.get(w, [])) / self.window

    def p(self, w: int, q: float) -> float:
        return pct(self.latencies.get(w, []), q) * 1000


RUNS = [
    Run("ours", "ours", ours=True, held=False),
    Run("ours_held", "ours, held", ours=True, held=True),
    Run("before", "before", ours=False, held=False),
    Run("before_held", "before, held", ours=False, held=True),
]


async def prepare(server: Server, run: Run, pending: int) -> str:
    dsn = await server.new_database("sustained")
    conn = await asyncpg.connect(dsn)
    try:
        if not run.ours:
            for sql in TODAY_INDEXES:
                await conn.execute(sql)
        await conn.execute(FILL, QUEUE, pending)
        await harness.settle(conn)
    finally:
        await conn.close()
    return dsn


async def worker(store: Store, run: Run, owner: str, todo: Todo, started: float, until: float) -> None:
    while todo is not None and time.perf_counter() < until:
        began = time.perf_counter()
        if run.ours:
            held = (todo.id, owner, todo.lease_token)
            _, todo = await store.complete_and_claim_next(*held, None, [QUEUE], TTL)
        else:
            rows = await TODAY.fetch(
                store.db, id=todo.id, owner=owner, lease=todo.lease_token, scope=None,
                result=None, queues=[QUEUE], ttl=TTL,
            )  # fmt: skip
            claimed = [Todo.from_record(r) for r in rows if r["part"] == "claimed"]
            todo = claimed[0] if claimed else None
        ended = time.perf_counter()
        run.latencies.setdefault(int((ended - started) // run.window), []).append(ended - began)


async def refill(conn: asyncpg.Connection, run: Run, until: float) -> None:
    """Every REFILL_EVERY, insert as many todos as were completed since the last time."""
    added = tick = 0
    while time.perf_counter() < until:
        await asyncio.sleep(REFILL_EVERY)
        done = sum(len(v) for v in run.latencies.values())
        if done > added:
            tick += 1
            await conn.execute(REFILL, QUEUE, tick, done - added)
            added = done


async def reporter(admin: asyncpg.Connection, run: Run, started: float, windows: int) -> None:
    print("  ".join(c.rjust(n) for c, n in zip(HEADER, WIDTHS, strict=True)), flush=True)
    for w in range(windows):
        await asyncio.sleep(max(0.0, started + (w + 1) * run.window - time.perf_counter()) + 0.05)
        run.dead[w] = await admin.fetchval(DEAD_TUPLES) or 0
        row = (f"{(w + 1) * run.window:.0f}", f"{run.rate(w):,.0f}", f"{run.p(w, 50):.2f}",
               f"{run.p(w, 99):.2f}", f"{run.dead[w]:,}")  # fmt: skip
        print("  ".join(c.rjust(n) for c, n in zip(row, WIDTHS, strict=True)), flush=True)


async def measure(server: Server, run: Run, args: argparse.Namespace) -> None:
    run.window = args.window
    dsn = await prepare(server, run, args.pending)
    print(f"\n{run.label}: {args.workers} workers, {args.pending:,} pending, {args.seconds:.0f} s; {load()}")
    held = admin = producer = pool = None
    try:
        admin = await asyncpg.connect(dsn)
        producer = await asyncpg.connect(dsn)
        if run.held:
            held = await asyncpg.connect(dsn, server_settings={"application_name": "sustained: held"})
            await held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await held.fetchval("SELECT count(*) FROM todos WHERE state = 'pending'")
        pool = await dbmod.create_pool(dsn, min_size=args.workers, max_size=args.workers)
        store = Store(pool)
        owners = [f"worker-{i + 1}" for i in range(args.workers)]
        firsts = [await store.claim(f"td_s{i + 1}", owner, TTL) for i, owner in enumerate(owners)]
        windows = int(args.seconds // args.window)
        started = time.perf_counter()
        until = started + windows * args.window
        async with asyncio.TaskGroup() as group:
            group.create_task(reporter(admin, run, started, windows))
            group.create_task(refill(producer, run, until))
            for owner, first in zip(owners, firsts, strict=True):
                group.create_task(worker(store, run, owner, first, started, until))
        left = await admin.fetchval("SELECT count(*) FROM todos WHERE state = 'pending'")
        if left < args.pending // 2:
            log(f"{run.label}: the backlog fell to {left:,} pending; the top-up did not keep up")
    finally:
        for conn in (held, admin, producer):
            if conn is not None:
                await conn.close()
        if pool is not None:
            await pool.close()
        await server.drop_all()


def summary(args: argparse.Namespace) -> list[str]:
    runs = {r.key: r for r in RUNS}
    ours, held, before, before_held = (runs[k] for k in ("ours", "ours_held", "before", "before_held"))
    windows = int(args.seconds // args.window)
    rows = [("s", "ours", "ours, held", "held / not", "p99 held ms", "before", "before, held",
             "held / not", "ours / before", "held: ours / before")]  # fmt: skip

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "–"

    for w in range(windows):
        rows.append((
            f"{(w + 1) * args.window:.0f}", f"{ours.rate(w):,.0f}", f"{held.rate(w):,.0f}",
            ratio(held.rate(w), ours.rate(w)), f"{held.p(w, 99):.2f}",
            f"{before.rate(w):,.0f}", f"{before_held.rate(w):,.0f}",
            ratio(before_held.rate(w), before.rate(w)), ratio(ours.rate(w), before.rate(w)),
            ratio(held.rate(w), before_held.rate(w)),
        ))  # fmt: skip
    heading = f"todos/s per {args.window:.0f}-s window, side by side; {load()}"
    out = ["", heading, *table(rows, set(range(10)))]
    per_minute = int(60 // args.window)
    if windows >= 2 * per_minute:
        for run in (ours, held, before, before_held):
            first = sum(run.rate(w) for w in range(per_minute)) / per_minute
            last = sum(run.rate(w) for w in range(windows - per_minute, windows)) / per_minute
            out.append(
                f"{run.label}: last minute {last:,.0f} / first minute {first:,.0f} todos/s"
                f" = {ratio(last, first)}"
            )
    worst = min(range(windows), key=lambda w: held.rate(w) / ours.rate(w) if ours.rate(w) else 0)
    worst_ratio = ratio(held.rate(worst), ours.rate(worst))
    out.append(f"ours, held / ours: worst window {worst_ratio} (at {(worst + 1) * args.window:.0f} s)")
    all_held = [x for w in range(windows) for x in held.latencies.get(w, [])]
    out.append(f"ours, held: claim latency p99 over the run {pct(all_held, 99) * 1000:.2f} ms")
    return out


async def run_all(server: Server, args: argparse.Namespace, tmp: Path) -> int:
    settings = await harness.server_settings(server.dsn)
    print(harness.server_line(server, settings))
    selected = [r for r in RUNS if args.only is None or r.key in args.only]
    for run in selected:
        await measure(server, run, args)
    if len(selected) == len(RUNS):
        print("\n".join(summary(args)), flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--seconds  300.0    5.0     each run's length
--window   20.0     5.0     seconds a row of the report covers
--pending  400,000  20,000  pending todos at the start
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "20,000 pending, one 5-s window a run", SIZES)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--only", nargs="+", choices=[r.key for r in RUNS], help="run only these")
    args = parser.parse_args(argv)
    if args.seconds < args.window:
        parser.error(f"--seconds must be at least --window ({args.window:.0f})")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-sustained-", run_all, parse_args(None)))
