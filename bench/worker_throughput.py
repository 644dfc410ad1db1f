"""The Python Worker as a user runs it (issue 27): completions per second of one Worker
process, fed by create_many at a steady depth, with 1 ms of work per todo; and its latency
at a fixed offered load.

    .venv/bin/python bench/worker_throughput.py                 # 3 runs of 20 s per tree, ~3 min
    .venv/bin/python bench/worker_throughput.py --quick         # smoke run, ~15 s
    # before and after, alternating run by run in one sitting:
    git worktree add /tmp/before <rev>
    .venv/bin/python bench/worker_throughput.py --tree /tmp/before --tree .

Each tree's `dashboard.worker.Worker` runs in a subprocess of its own (PYTHONPATH=tree),
`Worker(dsn, ["bench"], handle, concurrency=--concurrency, ttl=30)` with an async handler
that sleeps 1 ms, as a user's would. Each run has two windows of --seconds, after the
Worker has completed its first --warmup todos:
- paced: the producer, in this process, creates --rate todos a second (create_many every
  20 ms, as many as are due): how long each todo completed in the window took from
  created_at to completed_at (p50, p99): the latency a user sees below saturation;
- saturated: the producer tops the queue up to --depth pending todos (create_many, batches
  of up to 500, every 20 ms): completions/s (done todos counted at both ends), how long each
  todo completed in the window was held (claimed_at → completed_at: the 1 ms of work, the
  wait for a slot, the ack, the Worker's own overhead; p50 and p99), and WAL bytes per
  completed todo (the whole server's, producer's included: nobody else writes to it).
The Worker is stopped by SIGTERM, by pid, after each run; every run has a fresh database.
The load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import harness
import options
from harness import Server, load, log
from stats import table

from dashboard.models import NewTodo
from dashboard.store import Store

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench"
TOP_UP_EVERY = 0.02  # seconds between the producer's looks at the depth
TOP_UP_BATCH = 500

SIZES = """
    --runs         3      1      runs per tree, alternating
    --seconds      20.0   3.0    seconds measured per run
    --depth        4000   1000   pending todos the producer keeps (saturated window)
    --rate         300    200    todos a second the producer creates (paced window)
    --warmup       500    100    todos the Worker completes before the window opens
    --concurrency  10     10     the Worker's concurrency (handlers at once)
"""
WORKER = """
import asyncio, sys
from dashboard.worker import Worker

async def handle(todo):
    await asyncio.sleep(0.001)

asyncio.run(Worker(sys.argv[1], [{queue!r}], handle, owner="bench-worker",
                   concurrency=int(sys.argv[2]), ttl=30).run())
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "one run of 3 s per tree, depth 1,000", sizes=SIZES)
    parser.add_argument(
        "--tree",
        action="append",
        type=Path,
        help="a checkout whose Worker to run (repeatable; default: this one)",
    )
    return parser.parse_args(argv)


async def done_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM todos WHERE state = 'done'")


async def paced(store: Store, rate: float, stop: asyncio.Event) -> None:
    """Create `rate` todos a second in QUEUE, as many as are due every TOP_UP_EVERY."""
    began, made = time.monotonic(), 0
    while not stop.is_set():
        due = int((time.monotonic() - began) * rate) - made
        if due > 0:
            await store.create_many(
                [NewTodo(queue=QUEUE, title="work") for _ in range(min(due, TOP_UP_BATCH))]
            )
            made += min(due, TOP_UP_BATCH)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TOP_UP_EVERY)


async def producer(store: Store, conn: asyncpg.Connection, depth: int, stop: asyncio.Event) -> None:
    """Keep `depth` todos pending in QUEUE."""
    while not stop.is_set():
        pending = await conn.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM todos WHERE state = 'pending' LIMIT $1) p", depth
        )
        missing = depth - pending
        while missing > 0:
            n = min(missing, TOP_UP_BATCH)
            await store.create_many([NewTodo(queue=QUEUE, title="work") for _ in range(n)])
            missing -= n
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TOP_UP_EVERY)


async def backlog(probe: asyncpg.Connection, n: int, worker, tree: Path) -> None:
    """Wait (2 minutes at most) until `n` todos are pending."""
    deadline = time.monotonic() + 120
    while await probe.fetchval("SELECT count(*) FROM todos WHERE state = 'pending'") < n:
        if worker.returncode is not None or time.monotonic() > deadline:
            raise SystemExit(f"no backlog of {n} for the Worker of {tree} (exit {worker.returncode})")
        await asyncio.sleep(0.05)


async def window(probe: asyncpg.Connection, seconds: float, since: str) -> tuple[int, float, dict]:
    """Completions in a window of `seconds`, its length, and the p50 and p99 in ms of
    completed_at - `since` (a column) of the todos completed in it."""
    first, began = await done_count(probe), time.perf_counter()
    opened = await probe.fetchval("SELECT clock_timestamp()")
    await asyncio.sleep(seconds)
    last, took = await done_count(probe), time.perf_counter() - began
    closed = await probe.fetchval("SELECT clock_timestamp()")
    times = await probe.fetchrow(
        f"""SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99
            FROM (SELECT extract(epoch FROM completed_at - {since}) * 1000 AS ms
                  FROM todos WHERE state = 'done' AND completed_at BETWEEN $1 AND $2) t""",
        opened,
        closed,
    )
    return last - first, took, dict(times)


async def one_run(server: Server, tree: Path, args: argparse.Namespace) -> dict[str, float]:
    dsn = await server.new_database("worker")
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=3)
    conn = await asyncpg.connect(dsn)
    stop = asyncio.Event()
    feeding = asyncio.create_task(paced(Store(pool), args.rate, stop))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER.format(queue=QUEUE),
        dsn,
        str(args.concurrency),
        env=env,
        cwd=tree,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        probe = await asyncpg.connect(dsn)
        try:
            deadline = time.monotonic() + 120
            while await done_count(probe) < args.warmup:
                if worker.returncode is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the Worker of {tree} did not start working (exit {worker.returncode})")
                await asyncio.sleep(0.05)
            _, _, latency = await window(probe, args.seconds, "created_at")
            stop.set()
            await feeding
            stop = asyncio.Event()
            feeding = asyncio.create_task(producer(Store(pool), conn, args.depth, stop))
            await backlog(probe, args.depth // 2, worker, tree)  # before the window opens
            wal = await harness.wal_position(probe)
            completed, took, held = await window(probe, args.seconds, "claimed_at")
            wal_bytes = await harness.wal_since(probe, wal)
        finally:
            await probe.close()
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(worker.wait(), 30)
        except TimeoutError:
            worker.kill()
            await worker.wait()
        stop.set()
        await feeding
        await conn.close()
        await pool.close()
        await server.drop(dsn)
    return {
        "rate": completed / took,
        "p50": held["p50"],
        "p99": held["p99"],
        "paced_p50": latency["p50"],
        "paced_p99": latency["p99"],
        "wal": wal_bytes / max(completed, 1),
    }


async def run_all(server: Server, args: argparse.Namespace, tmp: Path) -> int:
    trees = [tree.resolve() for tree in (args.tree or [ROOT])]
    settings = await harness.server_settings(server.dsn)
    results: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    try:
        for run in range(args.runs):
            for tree in trees if run % 2 == 0 else reversed(trees):
                got = await one_run(server, tree, args)
                results[tree].append(got)
                log(
                    f"run {run + 1}, {tree}: paced created→done p50 {got['paced_p50']:.1f} ms p99 "
                    f"{got['paced_p99']:.1f} ms; saturated {got['rate']:,.0f} completions/s, held p50 "
                    f"{got['p50']:.1f} ms p99 {got['p99']:.1f} ms, {got['wal']:,.0f} WAL B/todo; {load()}"
                )
    finally:
        await server.drop_all()
    print("\n".join(harness.heading("Worker throughput", server, settings)))
    print(
        f"one Worker process, concurrency {args.concurrency}, 1 ms of work per todo; paced at "
        f"{args.rate:,.0f} todos/s, then saturated at depth {args.depth:,}; {args.runs} run(s) of "
        f"2 × {args.seconds:.0f} s per tree (medians); {load()}"
    )
    rows = []
    base = statistics.median(r["rate"] for r in results[trees[0]])
    for tree in trees:
        runs = results[tree]
        rate = statistics.median(r["rate"] for r in runs)
        rows.append(
            (
                str(tree),
                f"{statistics.median(r['paced_p50'] for r in runs):.1f}",
                f"{statistics.median(r['paced_p99'] for r in runs):.1f}",
                f"{rate:,.0f}",
                f"{rate / base:.2f}x",
                f"{statistics.median(r['p50'] for r in runs):.1f}",
                f"{statistics.median(r['p99'] for r in runs):.1f}",
                f"{statistics.median(r['wal'] for r in runs):,.0f}",
            )
        )
    header = (
        "tree",
        "paced: created→done p50 ms",
        "p99 ms",
        "saturated: completions/s",
        f"vs {trees[0].name}",
        "held p50 ms",
        "held p99 ms",
        "WAL B/todo",
    )
    print("\n".join(table([header, *rows], right={1, 2, 3, 4, 5, 6, 7})))
    return 0


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-worker-", run_all, parse_args(None)))
