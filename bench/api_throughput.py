"""The agent API over HTTP against the Store directly: throughput, claim latency, long-poll wake-up.

    .venv/bin/python bench/api_throughput.py            # full run: minutes (longer on a busy machine)
    .venv/bin/python bench/api_throughput.py --quick    # smoke run, well under a minute
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

Everything runs on one server: DATABASE_URL if set, else an embedded PostgreSQL started on
a temporary data dir and stopped at exit. The script creates one fresh database (migrated,
dropped at exit), an API token for one agent, and starts the real app in a subprocess
(`python -m dashboard.cli serve`: uvicorn, one worker, the app's own pool and reaper).

Measurements, each over a fixed count of todos pre-enqueued with Store.create_many (the
tables truncated, refilled, vacuumed, analyzed and checkpointed before each one):

- claim + complete: N agents, each a task with its own keep-alive httpx.AsyncClient doing
  POST /api/v1/claims then POST /api/v1/todos/{id}/complete until a claim answers 204;
  beside the same loop through the Store directly (Store.claim_next + Store.complete, N
  workers on a pool of N connections); and the HTTP loop with `complete` carrying `next`
  (one request per todo). The variants of one agent count run one after the other in a
  rotating order within each repetition, so machine noise hits them alike;
- claim latency: every POST /api/v1/claims that returned a todo in the HTTP
  claim + complete runs (all repetitions pooled);
- long-poll wake-up: POST /api/v1/claims with wait=10 on an empty queue, then (300 ms
  later, once it waits) an enqueue from another connection; from the enqueue's commit
  returning to the agent having the todo (response read).

The load generator (this process), the app process and PostgreSQL share the machine's
cores: the CPU column gives the CPU milliseconds per todo spent in the app process and in
this process (the httpx clients, or the Store workers), and how many cores the rest of
the machine kept busy meanwhile (PostgreSQL, and anything else running: on a shared
machine, that is noise to read the figures against). Progress goes to stderr; the
tables to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import harness
import httpx
from harness import AppProcess, Server, log
from stats import CPU, CPUMeter, Series, pct, rotated, table, timed

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.models import NewTodo
from dashboard.store import Store

QUEUE = "bench"
WAKE_QUEUE = "wake"
TTL = 300.0  # long enough that no lease lapses during a run
AGENT_COUNTS = (1, 4, 16)
FILL_CHUNK = 1000  # Store.create_many's limit
WAKE_DELAY = 0.3  # s between sending the long-poll claim and the enqueue
HTTP_RATIO_TARGET = 0.5  # HTTP ≥ 0.5× direct at 16 agents
CLAIM_P99_TARGET_MS = 50.0
WAKE_P95_TARGET_MS = 25.0


# -- filling the queue -------------------------------------------------------------------


async def fill(admin: asyncpg.Connection, store: Store, n: int, queue: str = QUEUE) -> None:
    """Empty the tables, enqueue n todos with Store.create_many, vacuum, analyze, checkpoint."""
    await admin.execute("TRUNCATE todos, todo_history, events")
    for start in range(0, n, FILL_CHUNK):
        await store.create_many(
            [
                NewTodo(queue=queue, title=f"todo {i}", kind="bench", source="bench", payload={"n": i})
                for i in range(start, min(n, start + FILL_CHUNK))
            ]
        )
    await harness.settle(admin)


# -- the loops -----------------------------------------------------------------------------


CLAIM_BODY = {"queues": [QUEUE], "ttl": TTL}
NEXT = {"queues": [QUEUE], "ttl": TTL}


def check(r: httpx.Response, what: str) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"{what}: HTTP {r.status_code} {r.text[:300]}")


async def http_claim_complete(client: httpx.AsyncClient, latencies: list[float]) -> int:
    done = 0
    while True:
        started = time.perf_counter()
        r = await client.post("/api/v1/claims", json=CLAIM_BODY)
        if r.status_code == 204:
            return done
        latencies.append((time.perf_counter() - started) * 1000)
        check(r, "claim")
        todo = r.json()
        r = await client.post(f"/api/v1/todos/{todo['id']}/complete", json={"lease": todo["lease"]})
        check(r, "complete")
        done += 1


async def http_complete_next(client: httpx.AsyncClient, latencies: list[float]) -> int:
    done = 0
    r = await client.post("/api/v1/claims", json=CLAIM_BODY)
    if r.status_code == 204:
        return done
    check(r, "claim")
    todo = r.json()
    while todo is not None:
        r = await client.post(
            f"/api/v1/todos/{todo['id']}/complete", json={"lease": todo["lease"], "next": NEXT}
        )
        check(r, "complete with next")
        todo = r.json()["next"]
        done += 1
    return done


async def store_claim_complete(store: Store, owner: str, latencies: list[float]) -> int:
    done = 0
    while True:
        started = time.perf_counter()
        todo = await store.claim_next([QUEUE], owner, TTL)
        if todo is None:
            return done
        latencies.append((time.perf_counter() - started) * 1000)
        await store.complete(todo.id, owner, todo.lease_token)
        done += 1


@contextlib.asynccontextmanager
async def agents(base: str, token: str, n: int):
    """n keep-alive clients, each with its connection open already."""
    clients = [
        httpx.AsyncClient(
            base_url=base,
            trust_env=False,
            timeout=60,
            headers={"Authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=1),
        )
        for _ in range(n)
    ]
    try:
        for client in clients:
            (await client.get("/healthz")).raise_for_status()
        yield clients
    finally:
        for client in clients:
            await client.aclose()


# -- results -----------------------------------------------------------------------------


@dataclass
class CPUSeries(Series):
    """A Series with the CPU use of each repetition."""

    cpus: list[tuple[float, float, float]] = field(default_factory=list)  # app ms, bench ms, rest

    def cpu(self) -> str:
        app, bench, rest = (statistics.median(c[i] for c in self.cpus) for i in range(3))
        return f"{app:.2f} / {bench:.2f} ms  {rest:.2f}"


class Results:
    def __init__(self) -> None:
        self.series: dict[str, CPUSeries] = {}
        self.latency: dict[str, list[float]] = {}

    def add(self, key: str, label: str, rate: float, cpu: tuple[float, float, float]) -> None:
        s = self.series.setdefault(key, CPUSeries(key, label))
        s.rates.append(rate)
        s.cpus.append(cpu)


# -- the measurements ------------------------------------------------------------------------


async def throughput(
    app: AppProcess,
    dsn: str,
    token: str,
    admin: asyncpg.Connection,
    fill_store: Store,
    args,
    results: Results,
    rep: int,
) -> None:
    async def http(n_agents: int, loop: Callable, latencies: list[float]) -> tuple[float, int, CPU]:
        async with agents(app.base, token, n_agents) as clients:
            with CPUMeter(app) as meter:
                seconds, done = await timed([loop(c, latencies) for c in clients])
        return seconds, done, meter.result

    async def direct(n_workers: int, latencies: list[float]) -> tuple[float, int, CPU]:
        pool = await dbmod.create_pool(dsn, min_size=n_workers, max_size=n_workers)
        try:
            store = Store(pool)
            with CPUMeter(app) as meter:
                seconds, done = await timed(
                    [store_claim_complete(store, f"w{i}", latencies) for i in range(n_workers)]
                )
        finally:
            await pool.close()
        return seconds, done, meter.result

    for n in AGENT_COUNTS:
        count = args.todos if n > 1 else max(100, args.todos // 8)
        plural = "s" if n > 1 else ""
        claim_lat = results.latency.setdefault(f"claim@{n}", [])
        direct_lat = results.latency.setdefault(f"direct@{n}", [])
        variants = [
            (
                f"http@{n}",
                f"HTTP claim + complete, {n} agent{plural}",
                lambda n=n, lat=claim_lat: http(n, http_claim_complete, lat),
            ),
            (
                f"direct@{n}",
                f"Store.claim_next + Store.complete, {n} worker{plural}",
                lambda n=n, lat=direct_lat: direct(n, lat),
            ),
        ]
        if n > 1:
            variants.append(
                (
                    f"next@{n}",
                    f"HTTP complete with next (1 request/todo), {n} agents",
                    lambda n=n: http(n, http_complete_next, []),
                )
            )
        log(f"[throughput] run {rep + 1}/{args.runs}, {n} agent{plural}, {count} todos each")
        for key, label, run in rotated(variants, rep):
            await fill(admin, fill_store, count)
            seconds, done, cpu = await run()
            if done != count:
                raise RuntimeError(f"{label}: processed {done} of {count}")
            await harness.expect_states(admin, {"done": count}, label)
            app.check_alive()
            rate = done / seconds
            app_ms, bench_ms = cpu.per_todo(done)
            log(
                f"  {label:<58} {rate:>8,.0f} todos/s  ({done} in {seconds:.2f} s; CPU per todo: "
                f"app {app_ms:.2f} ms, bench {bench_ms:.2f} ms; rest of machine {cpu.rest:.2f} cores)"
            )
            results.add(key, label, rate, (app_ms, bench_ms, cpu.rest))


async def healthz(app: AppProcess, token: str, n: int) -> list[float]:
    """ms per GET /healthz (no database), one client, one request at a time."""
    samples = []
    async with agents(app.base, token, 1) as (client,):
        for _ in range(n):
            started = time.perf_counter()
            (await client.get("/healthz")).raise_for_status()
            samples.append((time.perf_counter() - started) * 1000)
    return samples


async def wake_up(app: AppProcess, token: str, store: Store, n: int) -> list[float]:
    """ms from an enqueue's commit to the waiting long-poll claim's response, n samples."""
    samples = []
    async with agents(app.base, token, 1) as (client,):
        for k in range(n):

            async def waiting() -> tuple[httpx.Response, float]:
                r = await client.post("/api/v1/claims", json={"queues": [WAKE_QUEUE], "ttl": 60, "wait": 10})
                return r, time.perf_counter()

            task = asyncio.create_task(waiting())
            await asyncio.sleep(WAKE_DELAY)
            if task.done():
                r, _ = task.result()
                raise RuntimeError(f"the long-poll claim returned before the enqueue: {r.status_code}")
            created = await store.create(NewTodo(queue=WAKE_QUEUE, title=f"wake {k}", kind="bench"))
            committed = time.perf_counter()
            r, answered = await task
            check(r, "long-poll claim")
            todo = r.json()
            if todo["id"] != created.todo.id:
                raise RuntimeError(f"the long-poll claim got {todo['id']}, not {created.todo.id}")
            samples.append((answered - committed) * 1000)
            r = await client.post(f"/api/v1/todos/{todo['id']}/complete", json={"lease": todo["lease"]})
            check(r, "complete")
            await asyncio.sleep(0.05)
    return samples


# -- the report --------------------------------------------------------------------------------


def render(results: Results, header: list[str]) -> str:
    s = results.series
    rows: list[tuple] = [
        ("scenario", "todos/s", "spread", "ratio", "vs", "target", "result", "CPU/todo: app / bench  rest")
    ]

    def row(key: str, versus: str | None = None, target: float | None = None) -> None:
        if key not in s:
            return
        series = s[key]
        ratio = series.median / s[versus].median if versus in s else None
        verdict = "" if target is None or ratio is None else ("PASS" if ratio >= target else "MISS")
        rows.append(
            (
                series.label,
                *series.rate_cells(),
                "" if ratio is None else f"{ratio:.2f}×",
                "" if versus is None else ("direct" if versus.startswith("direct") else versus),
                "" if target is None else f"≥ {target:.2f}×",
                verdict,
                series.cpu(),
            )
        )

    rows.append(("claim + complete of pre-enqueued todos (two requests or statements per todo)",))
    for n in AGENT_COUNTS:
        row(f"direct@{n}")
        row(f"http@{n}", f"direct@{n}", HTTP_RATIO_TARGET if n == 16 else None)
    rows.append(("complete carrying next: one request per todo",))
    for n in AGENT_COUNTS[1:]:
        row(f"next@{n}", f"direct@{n}")
    lines = [*header, "", *table(rows, {1, 2, 3})]

    lat: list[tuple] = [("latency", "p50", "p95", "p99", "n", "target", "result")]
    base = results.latency.get("healthz") or []
    if base:
        lat.append(("baseline: the same app, no database",))
        lat.append(
            (
                "GET /healthz, 1 client",
                f"{pct(base, 50):.1f} ms",
                f"{pct(base, 95):.1f} ms",
                f"{pct(base, 99):.1f} ms",
                f"{len(base):,}",
                "",
                "",
            )
        )
    lat.append(("POST /api/v1/claims when work is ready (inside the claim + complete loops)",))
    for n in AGENT_COUNTS:
        v = results.latency.get(f"claim@{n}") or []
        if not v:
            continue
        p99 = pct(v, 99)
        lat.append(
            (
                f"claim latency, {n} agent{'s' if n > 1 else ''}",
                f"{pct(v, 50):.1f} ms",
                f"{pct(v, 95):.1f} ms",
                f"{p99:.1f} ms",
                f"{len(v):,}",
                f"p99 ≤ {CLAIM_P99_TARGET_MS:.0f} ms",
                "PASS" if p99 <= CLAIM_P99_TARGET_MS else "MISS",
            )
        )
    lat.append(("Store.claim_next directly, for comparison (inside the direct loops)",))
    for n in AGENT_COUNTS:
        v = results.latency.get(f"direct@{n}") or []
        if v:
            lat.append(
                (
                    f"Store.claim_next latency, {n} worker{'s' if n > 1 else ''}",
                    f"{pct(v, 50):.1f} ms",
                    f"{pct(v, 95):.1f} ms",
                    f"{pct(v, 99):.1f} ms",
                    f"{len(v):,}",
                    "",
                    "",
                )
            )
    wake = results.latency.get("wake") or []
    if wake:
        p95 = pct(wake, 95)
        lat.append(("long-poll wake-up: POST /api/v1/claims wait=10, then an enqueue",))
        lat.append(
            (
                "enqueue's commit returned → the agent has the todo",
                f"{pct(wake, 50):.1f} ms",
                f"{p95:.1f} ms",
                f"{pct(wake, 99):.1f} ms",
                str(len(wake)),
                f"p95 ≤ {WAKE_P95_TARGET_MS:.0f} ms",
                "PASS" if p95 <= WAKE_P95_TARGET_MS else "MISS",
            )
        )
    lines += ["", *table(lat, {1, 2, 3, 4})]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    results = Results()
    app: AppProcess | None = None
    try:
        settings = await harness.server_settings(server.dsn)
        dsn = await server.new_database("api")
        admin = await asyncpg.connect(dsn)
        fill_conn = await dbmod.connect(dsn)
        try:
            _, token = await Accounts(admin).add_token("bench-agent", [QUEUE, WAKE_QUEUE])
            app = AppProcess(dsn, tmp / "app.log")
            log(f"starting the app on {app.base}")
            await app.start()
            app_conns = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND pid <> $1",
                fill_conn.get_server_pid(),
            )
            fill_store = Store(fill_conn)
            wake_per_run = -(-args.wake // args.runs)
            for rep in range(args.runs):
                await throughput(app, dsn, token, admin, fill_store, args, results, rep)
                log(f"[wake-up] run {rep + 1}/{args.runs}, {wake_per_run} samples")
                await admin.execute("TRUNCATE todos, todo_history, events")
                results.latency.setdefault("wake", []).extend(
                    await wake_up(app, token, fill_store, wake_per_run)
                )
                results.latency.setdefault("healthz", []).extend(
                    await healthz(app, token, 20 if args.quick else 100)
                )
                app.check_alive()
        finally:
            await fill_conn.close()
            await admin.close()
    finally:
        if app is not None:
            app.stop()
        await server.drop_all()

    cpus = os.cpu_count()
    header = [
        f"switchboard agent API throughput — PostgreSQL {settings['version']} ({server.description})",
        harness.settings_line(settings, harness.SHOWN_SETTINGS),
        f"{cpus} CPUs shared by the load generator (this process: httpx clients or Store workers), "
        f"the app process (uvicorn, 1 worker, {app_conns} database connections at start) and "
        "PostgreSQL — the HTTP rows pay for the client too",
        f"load average {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end; Python "
        f"{platform.python_version()}, httpx {httpx.__version__}, asyncpg {asyncpg.__version__}",
        f"{args.todos:,} todos per measurement ({max(100, args.todos // 8):,} at 1 agent), median of "
        f"{args.runs} run(s) (spread: ± half the min-max range); {time.perf_counter() - started:.0f} s "
        "in all",
        "CPU/todo: CPU ms per todo of the app process and of this process (the client side); rest: "
        "cores busy elsewhere on the machine (PostgreSQL, and anything else running) — medians",
    ]
    print(render(results, header), flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, help="repetitions of every measurement (3)")
    parser.add_argument("--todos", type=int, help="todos per measurement (4000)")
    parser.add_argument("--wake", type=int, help="long-poll wake-up samples in all (30)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 400 todos, 1 run, 10 wake-ups (unless given)"
    )
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 3)
    args.todos = args.todos or (400 if args.quick else 4000)
    args.wake = args.wake or (10 if args.quick else 30)
    if args.runs < 1 or args.todos < 100 or args.wake < 1:
        parser.error("--runs and --wake must be at least 1, --todos at least 100")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-api-", run_all, parse_args(None)))
