"""Waiting for a result (issue 14): how soon after the completing commit a waiter has the
result, and what waits cost the hot path (claim + complete) when nobody waits.

    .venv/bin/python bench/wait_latency.py                  # ~5 min on 2 cores
    .venv/bin/python bench/wait_latency.py --quick          # smoke run, ~1 min
    .venv/bin/python bench/wait_latency.py --only wake      # the wake-up alone
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/wait_latency.py

Wake-up. The app runs as `switchboard serve` in a subprocess. --waiters (100) waiters each
GET /api/v1/todos/{id}?wait=60 on a todo of their own, which the completer holds; once
every one is marked watched (so every waiter is subscribed), the completer, in this
process, completes them one at a time in a random order. The clock starts when
store.complete returns (the commit is done) and stops when that todo's waiter has read
its answer, with the result. The next completion starts once the answer is in, after a
random pause of 0-20 ms. Two completers, alternating by round: a Store with a hub of its
own, as in a web process (the hint goes out on the hub's connection, at most one
statement per 5 ms), and a Store without one, as in the CLI and the reaper (the hint is a
statement of its own, sent before store.complete returns). --rounds (3) rounds each.
Meanwhile every waiter still reads its todo every 1.2-1.8 s (the poll fallback), as it
would in production. Target: p95 <= 25 ms.

Hot path. claim_next + complete (two statements, the second one the completion a watch
could hint), --workers (4) workers, each a Store on its own connection, over --pending
(200,000) todos in one queue, on three databases filled and VACUUM ANALYZEd beforehand.
Each variant is measured in --windows (20) windows of --seconds (2), after a checkpoint
and a 1-s warm-up, the variants interleaved window by window in a rotating order (on a
shared machine, minutes apart would measure the neighbours):

  no column   every migration but 0011_waits.sql: no `watched` column (the same Store
              code runs: it finds no mark in the rows)
  column      migrated to the end: the `watched` column, nobody waiting (the hot path)
  watched     every todo watched (as if each had a waiter), the workers' Stores with a hub:
              each completion is hinted (coalesced per 5 ms); for scale, no target

Each window's three rates are logged side by side; the summary gives the medians and the
median of the per-window ratios against `no column`. The load average is printed with
every table.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import harness
import httpx
import options
from harness import Server, load, log
from stats import pct, rotated, table

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.migrate import MIGRATIONS_DIR, apply_migrations
from dashboard.notify import Hub
from dashboard.store import Store

QUEUE = "work"
TTL = 300.0  # no lease lapses during a run
WAIT = 60  # each waiter's ?wait=
PAUSE = 0.020  # at most this long between one answer and the next completion
WARMUP = 1.0
TARGET_P95_MS = 25.0
WAITS_MIGRATION = "0011_waits.sql"


# -- wake-up -------------------------------------------------------------------------------


async def wake_round(
    base: str, headers: dict, store: Store, conn: asyncpg.Connection, n: int, rng: random.Random
) -> list[float]:
    """One round: n todos claimed, n waiters, completed one at a time; seconds from each
    completion's return to its waiter's answer."""
    todos = [await store.claim_next([QUEUE], "completer", TTL) for _ in range(n)]
    if any(t is None for t in todos):
        raise RuntimeError("the queue ran dry")
    answered: dict[str, asyncio.Future] = {}
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(base_url=base, timeout=WAIT + 10, limits=limits, trust_env=False) as http:

        async def wait(todo_id: str) -> None:
            response = await http.get(f"/api/v1/todos/{todo_id}", headers=headers, params={"wait": WAIT})
            at = time.perf_counter()
            body = response.json()
            if response.status_code != 200 or body["todo"]["result"] != {"id": todo_id}:
                raise RuntimeError(f"waiter of {todo_id}: {response.status_code} {response.text[:300]}")
            answered[todo_id].set_result(at)

        loop = asyncio.get_running_loop()
        for t in todos:
            answered[t.id] = loop.create_future()
        waiters = [asyncio.create_task(wait(t.id)) for t in todos]
        ids = [t.id for t in todos]
        deadline = time.monotonic() + 30
        while await conn.fetchval("SELECT count(*) FROM todos WHERE id = ANY ($1) AND watched", ids) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiters did not all start waiting within 30 s")
            await asyncio.sleep(0.05)
        if any(w.done() for w in waiters):
            raise RuntimeError("a waiter answered before its todo was completed")
        latencies = []
        for t in rng.sample(todos, len(todos)):
            await store.complete(t.id, "completer", t.lease_token, {"id": t.id})
            done = time.perf_counter()
            latencies.append(await asyncio.wait_for(answered[t.id], 10) - done)
            await asyncio.sleep(rng.uniform(0, PAUSE))
        await asyncio.gather(*waiters)
    return latencies


async def run_wake(server: Server, args, tmp: Path) -> list[str]:
    dsn = await server.new_database("wait_wake")
    conn = await dbmod.connect(dsn)
    app = harness.AppProcess(dsn, tmp / "app.log")
    hub = Hub(dsn)
    try:
        total = args.waiters * args.rounds * 2
        await conn.execute(
            "INSERT INTO todos (id, queue, title) SELECT 'td_wake_' || g, $1, 'todo ' || g"
            " FROM generate_series(1, $2::int) AS g",
            QUEUE,
            total,
        )
        _, secret = await Accounts(conn).add_token("waiter", [QUEUE])
        headers = {"Authorization": f"Bearer {secret}"}
        await harness.settle(conn)
        await app.start()
        await hub.start()
        completers = {"hub": Store(conn, hints=hub), "own statement": Store(conn)}
        found: dict[str, list[float]] = {name: [] for name in completers}
        rng = random.Random(14)
        for rep in range(args.rounds):
            for name in rotated(list(completers), rep):
                latencies = await wake_round(app.base, headers, completers[name], conn, args.waiters, rng)
                found[name] += latencies
                app.check_alive()
                log(
                    f"  round {rep + 1}, completer with {name}: p50 {pct(latencies, 50) * 1000:.1f} ms, "
                    f"p95 {pct(latencies, 95) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; {load()}"
                )
    finally:
        await hub.stop()
        app.stop()
        await conn.close()
        await server.drop_all()
    rows = [("completer", "answers", "p50 ms", "p95 ms", "max ms", "target p95", "result")]
    for name, latencies in found.items():
        p95 = pct(latencies, 95) * 1000
        verdict = "PASS" if p95 <= TARGET_P95_MS else "MISS"
        rows.append((
            f"Store with {name}", str(len(latencies)), f"{pct(latencies, 50) * 1000:.1f}", f"{p95:.1f}",
            f"{max(latencies) * 1000:.1f}", f"≤ {TARGET_P95_MS:.0f} ms", verdict,
        ))  # fmt: skip
    return [
        "",
        f"wake-up: from store.complete returning to the waiter having the result; {args.waiters} waiters "
        f"(GET ?wait={WAIT}) on an app subprocess, completed one at a time, {args.rounds} round(s) per "
        f"completer; {load()}",
        *table(rows, {1, 2, 3, 4}),
    ]


# -- the hot path --------------------------------------------------------------------------

VARIANTS = {
    "no column": "every migration but 0011: no `watched` column",
    "column": "the `watched` column, nobody waiting",
    "watched": "every todo watched, Stores with a hub",
}


class HotDatabase:
    """One variant's database, filled and settled, with a connection per worker (and, for
    `watched`, a hub the workers' Stores share)."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.conns: list[asyncpg.Connection] = []
        self.hub: Hub | None = None

    async def open(self, server: Server, args, tmp: Path) -> HotDatabase:
        family = "wait_hot_" + self.variant.replace(" ", "_")
        if self.variant == "no column":
            without = tmp / "migrations_without_waits"
            without.mkdir(exist_ok=True)
            for path in MIGRATIONS_DIR.glob("*.sql"):
                if path.name != WAITS_MIGRATION:
                    shutil.copy(path, without / path.name)
            dsn = await server.new_empty_database(family)
            self.admin = await dbmod.connect(dsn)
            await apply_migrations(self.admin, without)
            await harness.check_durable(self.admin)
        else:
            dsn = await server.new_database(family)
            self.admin = await dbmod.connect(dsn)
        # `watched` todos are created so (an UPDATE of them all would leave the table twice
        # its size, and the claims slower for that, not for the hints).
        column, value = (", watched", ", true") if self.variant == "watched" else ("", "")
        await self.admin.execute(
            f"INSERT INTO todos (id, queue, title, created_at, ready_at{column})"
            f" SELECT 'td_' || g, $1, 'todo ' || g, t, t{value} FROM generate_series(1, $2::int) AS g,"
            " LATERAL (SELECT now() - interval '1 hour' + g * interval '1 microsecond' AS t) AS at",
            QUEUE,
            args.pending,
        )
        if self.variant == "watched":
            self.hub = Hub(dsn)
            await self.hub.start()
        await harness.settle(self.admin)
        for _ in range(args.workers):
            self.conns.append(await dbmod.connect(dsn))
        return self

    async def window(self, seconds: float) -> float:
        """claim + complete todos per second over `seconds`, after a checkpoint and WARMUP."""
        await harness.checkpoint(self.admin)
        done: list[float] = []
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(worker(Store(c, hints=self.hub), f"worker-{i + 1}", done, stop))
            for i, c in enumerate(self.conns)
        ]
        start = time.monotonic() + WARMUP
        end = start + seconds
        while time.monotonic() < end:
            await asyncio.sleep(0.2)
            for task in tasks:
                if task.done():
                    task.result()
        stop.set()
        await asyncio.gather(*tasks)
        return len([t for t in done if start <= t < end]) / seconds

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.stop()
        for conn in (self.admin, *self.conns):
            await conn.close()


async def worker(store: Store, owner: str, done: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        todo = await store.claim_next([QUEUE], owner, TTL)
        if todo is None:
            raise RuntimeError(f"{owner}: the queue ran dry; give more --pending")
        await store.complete(todo.id, owner, todo.lease_token)
        done.append(time.monotonic())


async def run_hot(server: Server, args, tmp: Path) -> list[str]:
    databases = {v: HotDatabase(v) for v in VARIANTS}
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for db in databases.values():
            await db.open(server, args, tmp)
        for rep in range(args.windows):
            for variant in rotated(list(VARIANTS), rep):
                rates[variant].append(await databases[variant].window(args.seconds))
            for variant in VARIANTS:
                ratios[variant].append(rates[variant][-1] / rates["no column"][-1])
            log(
                f"  window {rep + 1}: " + ", ".join(f"{v} {rates[v][-1]:,.0f}" for v in VARIANTS)
                + " todos/s; " + ", ".join(f"{v}/no column {ratios[v][-1]:.3f}" for v in list(VARIANTS)[1:])
                + f"; {load()}"
            )  # fmt: skip
    finally:
        for db in databases.values():
            await db.close()
        await server.drop_all()
    rows = [("variant", "todos/s median", "min", "max", "÷ no column (median of windows)")]
    for variant, label in VARIANTS.items():
        rows.append((
            f"{variant}: {label}", f"{statistics.median(rates[variant]):,.0f}", f"{min(rates[variant]):,.0f}",
            f"{max(rates[variant]):,.0f}", f"{statistics.median(ratios[variant]):.3f}",
        ))  # fmt: skip
    return [
        "",
        f"hot path: claim_next + complete, {args.workers} workers, one queue of {args.pending:,} todos per "
        f"database, {args.windows} windows of {args.seconds:.0f} s per variant, interleaved in a rotating "
        f"order, each after a checkpoint; {load()}",
        *table(rows, {1, 2, 3, 4}),
    ]


# -- main ------------------------------------------------------------------------------------


async def run_all(server: Server, args: argparse.Namespace, tmp: Path) -> int:
    started = time.monotonic()
    settings = await harness.server_settings(server.dsn)
    print(f"{harness.server_line(server, settings)}; {load()}", flush=True)
    try:
        if "wake" in args.only:
            print("\n".join(await run_wake(server, args, tmp)), flush=True)
        if "hot" in args.only:
            print("\n".join(await run_hot(server, args, tmp)), flush=True)
    finally:
        await server.drop_all()
    print(f"\n{time.monotonic() - started:.0f} s in all; {load()}", flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--waiters  100      30      waiters (and todos) per wake-up round
--pending  200,000  20,000  todos in each hot-path database
--seconds  2.0      2.0     each hot-path window
--windows  20       2       hot-path windows per variant
--rounds   3        1       wake-up rounds per completer
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "30 waiters, 20,000 todos, 1 round, 2 windows", SIZES)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--only", action="append", choices=["wake", "hot"], help="run only this part")
    args = parser.parse_args(argv)
    args.only = args.only or ["wake", "hot"]
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-wait-latency-", run_all, parse_args(None)))
