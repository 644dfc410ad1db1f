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
- the bare app (bench/bare_app.py: Litestar + asyncpg under uvicorn, one worker, uvloop and
  httptools, no auth, no middleware) at 4 and 16 agents, serving POST /claims and POST
  /complete with the same two statements (TRANSITIONS.claim_batch n=1, .complete with
  scope NULL) on a pool of the same size, driven by the same client loop: the server
  CPU per request (the server process's CPU time over the measurement / requests sent)
  of ours against it;
- batches of 10 at 4 agents: POST /api/v1/claims with max=10 (→ {"todos": [...]}), then
  one POST /api/v1/acks completing them all (→ {"results": [...]}), over --batched-todos
  todos, against the single-todo HTTP loop (skipped, with a note, when the app refuses
  `max`);
- claim latency: every POST /api/v1/claims that returned a todo in the HTTP
  claim + complete runs (all repetitions pooled), and the bare app's beside it;
- long-poll wake-up: POST /api/v1/claims with wait=10 on an empty queue, then (300 ms
  later, once it waits) an enqueue from another connection; from the enqueue's commit
  returning to the agent having the todo (response read).

The load generator (this process), the app process and PostgreSQL share the machine's
cores: the CPU column gives the CPU milliseconds per todo spent in the app process and in
this process (the httpx clients, or the Store workers), and how many cores the rest of
the machine kept busy meanwhile (PostgreSQL, and anything else running: on a shared
machine, that is noise to read the figures against). Every table is printed with the load
average. Ratios are medians of per-repetition ratios (variants that ran back to back).
Progress goes to stderr; the tables to stdout. Targets are reported, never adjusted: a
miss is printed and the exit status is 0 unless --strict.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import harness
import httpx
import options
from harness import AppProcess, Server, log
from stats import CPU, CPUMeter, Series, pct, rotated, table, timed

from dashboard import db as dbmod
from dashboard.models import NewTodo
from dashboard.store import Store

QUEUE = "bench"
WAKE_QUEUE = "wake"
TTL = 300.0  # long enough that no lease lapses during a run
AGENT_COUNTS = (1, 4, 16)
FILL_CHUNK = 1000  # Store.create_many's limit
WAKE_DELAY = 0.3  # s between sending the long-poll claim and the enqueue
HTTP_RATIO_TARGET = 0.5  # HTTP ≥ 0.5× direct at 16 agents
BARE_AGENT_COUNTS = (4, 16)
BARE_CPU_TARGET = 1.2  # server CPU per request: ours ≤ 1.2× the bare app's, at 4 and 16 agents
BATCH = 10  # todos per claim and per acks request in the batch row
BATCH_AGENTS = 4
BATCH_RATIO_TARGET = 4.0  # batches of 10 ≥ 4× the single-todo HTTP loop, at 4 agents
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


@dataclass(frozen=True)
class Routes:
    """Where the claim + complete loop sends its two requests: our API, or the bare app's."""

    claim: str
    complete: Callable[[dict], tuple[str, dict]]  # the claimed todo → (path, body)


OURS = Routes("/api/v1/claims", lambda t: (f"/api/v1/todos/{t['id']}/complete", {"lease": t["lease"]}))
BARE = Routes("/claims", lambda t: ("/complete", {"id": t["id"], "lease": t["lease"]}))


@dataclass
class Tally:
    """Requests sent by all the agents of one measurement."""

    requests: int = 0


async def http_claim_complete(
    client: httpx.AsyncClient, latencies: list[float], tally: Tally, routes: Routes = OURS
) -> int:
    done = 0
    while True:
        started = time.perf_counter()
        r = await client.post(routes.claim, json=CLAIM_BODY)
        tally.requests += 1
        if r.status_code == 204:
            return done
        latencies.append((time.perf_counter() - started) * 1000)
        check(r, "claim")
        todo = r.json()
        path, body = routes.complete(todo)
        r = await client.post(path, json=body)
        tally.requests += 1
        check(r, "complete")
        done += 1


async def bare_claim_complete(client: httpx.AsyncClient, latencies: list[float], tally: Tally) -> int:
    """The same loop, against the bare app's routes."""
    return await http_claim_complete(client, latencies, tally, BARE)


async def http_complete_next(client: httpx.AsyncClient, latencies: list[float], tally: Tally) -> int:
    done = 0
    r = await client.post("/api/v1/claims", json=CLAIM_BODY)
    tally.requests += 1
    if r.status_code == 204:
        return done
    check(r, "claim")
    todo = r.json()
    while todo is not None:
        r = await client.post(
            f"/api/v1/todos/{todo['id']}/complete", json={"lease": todo["lease"], "next": NEXT}
        )
        tally.requests += 1
        check(r, "complete with next")
        todo = r.json()["next"]
        done += 1
    return done


BATCH_CLAIM_BODY = {"queues": [QUEUE], "ttl": TTL, "max": BATCH}


def acks_body(todos: list[dict]) -> dict:
    return {"acks": [{"id": t["id"], "lease": t["lease"], "complete": {"result": None}} for t in todos]}


async def http_batches(client: httpx.AsyncClient, latencies: list[float], tally: Tally) -> int:
    """Claim up to BATCH todos in one request, complete them all in one POST /api/v1/acks."""
    done = 0
    while True:
        started = time.perf_counter()
        r = await client.post("/api/v1/claims", json=BATCH_CLAIM_BODY)
        tally.requests += 1
        if r.status_code == 204:
            return done
        check(r, "batch claim")
        todos = r.json()["todos"]
        if not todos:
            return done
        latencies.append((time.perf_counter() - started) * 1000)
        r = await client.post("/api/v1/acks", json=acks_body(todos))
        tally.requests += 1
        check(r, "acks")
        results = r.json()["results"]
        answered = [(a.get("id"), a.get("status")) for a in results]
        if answered != [(t["id"], 200) for t in todos]:
            raise RuntimeError(f"acks: {len(todos)} acks answered {r.text[:300]}")
        done += len(todos)


async def batches_available(base: str, token: str) -> str | None:
    """None when the app takes a batch claim ({"max": n} → {"todos": [...]}); else why not."""
    async with agents(base, token, 1) as (client,):
        r = await client.post("/api/v1/claims", json=BATCH_CLAIM_BODY)
    if r.status_code == 200 and isinstance(r.json().get("todos"), list):
        return None
    return f"POST /api/v1/claims with max={BATCH} answered HTTP {r.status_code} {r.text[:200]}"


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

    cpus: list[tuple[float, float, float]] = field(default_factory=list)  # server ms, bench ms, rest
    per_request: list[float] = field(default_factory=list)  # server CPU ms per request (HTTP rows)
    request_rates: list[float] = field(default_factory=list)  # requests/s (HTTP rows)

    def cpu(self) -> str:
        server, bench, rest = (statistics.median(c[i] for c in self.cpus) for i in range(3))
        return f"{server:.2f} / {bench:.2f} ms  {rest:.2f}"


def paired(a: list[float], b: list[float]) -> float | None:
    """The median of the per-repetition ratios a[i] / b[i]: each taken between two variants
    that ran back to back, steadier than a ratio of medians when the load drifts."""
    n = min(len(a), len(b))
    return statistics.median(a[i] / b[i] for i in range(n)) if n else None


def spread(values: list[float]) -> str:
    """± half the min-max range, as a percentage of the median."""
    if len(values) < 2:
        return ""
    return f"±{(max(values) - min(values)) * 50 / statistics.median(values):.0f}%"


class Results:
    def __init__(self) -> None:
        self.series: dict[str, CPUSeries] = {}
        self.latency: dict[str, list[float]] = {}
        self.loads: list[float] = []  # the 1-minute load average after each measurement
        self.notes: list[str] = []

    def add(self, key: str, label: str, rate: float, cpu: CPU, done: int, requests: int) -> None:
        s = self.series.setdefault(key, CPUSeries(key, label))
        s.rates.append(rate)
        s.cpus.append((*cpu.per_todo(done), cpu.rest))
        if requests:
            s.per_request.append(cpu.app * 1000 / requests)
            s.request_rates.append(rate * requests / done)
        self.loads.append(os.getloadavg()[0])


def load_line(results: Results) -> str:
    now = os.getloadavg()
    during = f"; 1-min load after each measurement {min(results.loads):.2f}–{max(results.loads):.2f}"
    return (
        f"load average now {now[0]:.2f} / {now[1]:.2f} / {now[2]:.2f} (1 / 5 / 15 min, "
        f"{os.cpu_count()} CPUs){during if results.loads else ''}"
    )


# -- the measurements ------------------------------------------------------------------------


@dataclass
class Variant:
    key: str
    label: str
    todos: int
    run: Callable[[], Awaitable[tuple[float, int, CPU, int]]]


async def throughput(
    app: AppProcess,
    bare: AppProcess,
    db: harness.AgentDatabase,
    args,
    results: Results,
    rep: int,
    with_batches: bool,
) -> None:
    dsn, token, admin, fill_store = db.dsn, db.token, db.admin, db.fill

    async def http(
        server: AppProcess, n_agents: int, loop: Callable, latencies: list[float]
    ) -> tuple[float, int, CPU, int]:
        tally = Tally()
        async with agents(server.base, token, n_agents) as clients:
            with CPUMeter(server) as meter:
                seconds, done = await timed([loop(c, latencies, tally) for c in clients])
        return seconds, done, meter.result, tally.requests

    async def direct(n_workers: int, latencies: list[float]) -> tuple[float, int, CPU, int]:
        pool = await dbmod.create_pool(dsn, min_size=n_workers, max_size=n_workers)
        try:
            store = Store(pool)
            with CPUMeter(app) as meter:
                seconds, done = await timed(
                    [store_claim_complete(store, f"w{i}", latencies) for i in range(n_workers)]
                )
        finally:
            await pool.close()
        return seconds, done, meter.result, 0

    for n in AGENT_COUNTS:
        count = args.todos if n > 1 else max(100, args.todos // 8)
        plural = "s" if n > 1 else ""
        lat = {k: results.latency.setdefault(f"{k}@{n}", []) for k in ("claim", "direct", "bare", "batch")}
        variants = [
            Variant(
                f"http@{n}",
                f"HTTP claim + complete, {n} agent{plural}",
                count,
                lambda n=n, lat=lat: http(app, n, http_claim_complete, lat["claim"]),
            ),
            Variant(
                f"direct@{n}",
                f"Store.claim_next + Store.complete, {n} worker{plural}",
                count,
                lambda n=n, lat=lat: direct(n, lat["direct"]),
            ),
        ]
        if n > 1:
            variants.append(
                Variant(
                    f"next@{n}",
                    f"HTTP complete with next (1 request/todo), {n} agents",
                    count,
                    lambda n=n: http(app, n, http_complete_next, []),
                )
            )
        if n in BARE_AGENT_COUNTS:
            variants.append(
                Variant(
                    f"bare@{n}",
                    f"bare Litestar + asyncpg app, same loop, {n} agents",
                    count,
                    lambda n=n, lat=lat: http(bare, n, bare_claim_complete, lat["bare"]),
                )
            )
        if n == BATCH_AGENTS and with_batches:
            variants.append(
                Variant(
                    f"batch@{n}",
                    f"HTTP batches of {BATCH}: claims max={BATCH} + acks, {n} agents",
                    args.batched_todos,
                    lambda n=n, lat=lat: http(app, n, http_batches, lat["batch"]),
                )
            )
        log(f"[throughput] run {rep + 1}/{args.runs}, {n} agent{plural}")
        for v in rotated(variants, rep):
            await fill(admin, fill_store, v.todos)
            seconds, done, cpu, requests = await v.run()
            if done != v.todos:
                raise RuntimeError(f"{v.label}: processed {done} of {v.todos}")
            await harness.expect_states(admin, {"done": v.todos}, v.label)
            app.check_alive()
            bare.check_alive()
            rate = done / seconds
            server_ms, bench_ms = cpu.per_todo(done)
            per_request = f", {cpu.app * 1000 / requests:.2f} ms per request" if requests else ""
            log(
                f"  {v.label:<58} {rate:>8,.0f} todos/s  ({done} in {seconds:.2f} s; CPU per todo: "
                f"server {server_ms:.2f} ms{per_request}, bench {bench_ms:.2f} ms; rest of machine "
                f"{cpu.rest:.2f} cores; load {os.getloadavg()[0]:.2f})"
            )
            results.add(v.key, v.label, rate, cpu, done, requests)


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


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


SHORT = {"direct": "Store direct", "http": "HTTP single", "bare": "bare app"}


def short(key: str) -> str:
    """What a ratio is taken against, in a few words: `direct@4` → `Store direct, 4`."""
    kind, _, n = key.partition("@")
    return f"{SHORT.get(kind, kind)}, {n}"


def without_empty_sections(rows: list[tuple]) -> list[tuple]:
    """Drop the section headings (one-cell rows) that no row follows."""
    return [r for i, r in enumerate(rows) if len(r) > 1 or (i + 1 < len(rows) and len(rows[i + 1]) > 1)]


def render(results: Results, header: list[str]) -> str:
    s = results.series
    rows: list[tuple] = [
        ("scenario", "todos/s", "spread", "ratio", "vs", "target", "result", "CPU/todo: server / bench  rest")
    ]

    def row(key: str, versus: str | None = None, target: float | None = None) -> None:
        if key not in s:
            return
        series = s[key]
        ratio = paired(series.rates, s[versus].rates) if versus in s else None
        rows.append(
            (
                series.label,
                *series.rate_cells(),
                "" if ratio is None else f"{ratio:.2f}×",
                "" if ratio is None else short(versus),
                "" if target is None else f"≥ {target:.2f}×",
                "" if target is None or ratio is None else verdict(ratio >= target),
                series.cpu(),
            )
        )

    rows.append(("claim + complete of pre-enqueued todos (two requests or statements per todo)",))
    for n in AGENT_COUNTS:
        row(f"direct@{n}")
        row(f"http@{n}", f"direct@{n}", HTTP_RATIO_TARGET if n == 16 else None)
        row(f"bare@{n}", f"direct@{n}")
    rows.append(("complete carrying next: one request per todo",))
    for n in AGENT_COUNTS[1:]:
        row(f"next@{n}", f"direct@{n}")
    rows.append((f"batches: claim up to {BATCH} in one request, complete them in one POST /api/v1/acks",))
    row(f"batch@{BATCH_AGENTS}", f"http@{BATCH_AGENTS}", BATCH_RATIO_TARGET)
    lines = [*header, load_line(results), "", *table(without_empty_sections(rows), {1, 2, 3})]
    lines += [f"note: {note}" for note in results.notes]

    cpu: list[tuple] = [
        (
            "server CPU per HTTP request",
            "requests/s",
            "CPU/request",
            "spread",
            "CPU/todo",
            "ratio",
            "target",
            "result",
        )
    ]
    for n in BARE_AGENT_COUNTS:
        bare = s.get(f"bare@{n}")
        if bare is None:
            continue
        cpu.append(
            (f"{n} agents; ratio: ours / the bare app, both claim + complete (two requests per todo)",)
        )
        for key in (f"bare@{n}", f"http@{n}", f"next@{n}", f"batch@{n}"):
            series = s.get(key)
            if series is None or not series.per_request:
                continue
            ours = key == f"http@{n}"
            ratio = paired(series.per_request, bare.per_request) if ours else None
            cpu.append(
                (
                    series.label,
                    f"{statistics.median(series.request_rates):,.0f}",
                    f"{statistics.median(series.per_request):.3f} ms",
                    spread(series.per_request),
                    f"{statistics.median(c[0] for c in series.cpus):.3f} ms",
                    "" if ratio is None else f"{ratio:.2f}×",
                    f"≤ {BARE_CPU_TARGET:.2f}×" if ours else "",
                    "" if ratio is None else verdict(ratio <= BARE_CPU_TARGET),
                )
            )
    if len(cpu) > 1:
        lines += [
            "",
            "server CPU: the server process's user + system CPU time (psutil) over the measurement, "
            "per request; ratio: median of the per-repetition ratios",
            load_line(results),
            "",
            *table(cpu, {1, 2, 3, 4, 5}),
        ]

    lat: list[tuple] = [("latency", "p50", "p95", "p99", "n", "target", "result")]

    def lat_row(label: str, v: list[float], target: float | None = None, q: int = 99) -> None:
        if not v:
            return
        lat.append(
            (
                label,
                f"{pct(v, 50):.1f} ms",
                f"{pct(v, 95):.1f} ms",
                f"{pct(v, 99):.1f} ms",
                f"{len(v):,}",
                "" if target is None else f"p{q} ≤ {target:.0f} ms",
                "" if target is None else verdict(pct(v, q) <= target),
            )
        )

    if results.latency.get("healthz"):
        lat.append(("baseline: the same app, no database",))
        lat_row("GET /healthz, 1 client", results.latency["healthz"])
    lat.append(("POST /api/v1/claims when work is ready (inside the claim + complete loops)",))
    for n in AGENT_COUNTS:
        lat_row(
            f"claim latency, {n} agent{'s' if n > 1 else ''}",
            results.latency.get(f"claim@{n}"),
            CLAIM_P99_TARGET_MS,
        )
    lat.append(("the bare app's POST /claims, same loop, for comparison",))
    for n in BARE_AGENT_COUNTS:
        lat_row(f"bare app claim latency, {n} agents", results.latency.get(f"bare@{n}"))
    lat.append((f"POST /api/v1/claims max={BATCH} that returned todos (inside the batch loop)",))
    lat_row(f"batch claim latency, {BATCH_AGENTS} agents", results.latency.get(f"batch@{BATCH_AGENTS}"))
    lat.append(("Store.claim_next directly, for comparison (inside the direct loops)",))
    for n in AGENT_COUNTS:
        lat_row(
            f"Store.claim_next latency, {n} worker{'s' if n > 1 else ''}", results.latency.get(f"direct@{n}")
        )
    if results.latency.get("wake"):
        lat.append(("long-poll wake-up: POST /api/v1/claims wait=10, then an enqueue",))
        lat_row(
            "enqueue's commit returned → the agent has the todo",
            results.latency["wake"],
            WAKE_P95_TARGET_MS,
            95,
        )
    lines += ["", load_line(results), "", *table(without_empty_sections(lat), {1, 2, 3, 4})]
    return "\n".join(lines)


def missed(results: Results) -> list[str]:
    """The targets missed, for --strict."""
    s = results.series
    out = []

    def ratio(a: str, b: str, per_request: bool = False) -> float | None:
        if a not in s or b not in s:
            return None
        if per_request:
            return paired(s[a].per_request, s[b].per_request)
        return paired(s[a].rates, s[b].rates)

    r = ratio("http@16", "direct@16")
    if r is not None and r < HTTP_RATIO_TARGET:
        out.append("HTTP vs direct at 16 agents")
    for n in BARE_AGENT_COUNTS:
        r = ratio(f"http@{n}", f"bare@{n}", per_request=True)
        if r is not None and r > BARE_CPU_TARGET:
            out.append(f"server CPU per request vs the bare app at {n} agents")
    r = ratio(f"batch@{BATCH_AGENTS}", f"http@{BATCH_AGENTS}")
    if r is not None and r < BATCH_RATIO_TARGET:
        out.append(f"batches vs single todos at {BATCH_AGENTS} agents")
    claims = results.latency.get("claim@16")
    if claims and pct(claims, 99) > CLAIM_P99_TARGET_MS:
        out.append("claim p99 at 16 agents")
    wake = results.latency.get("wake")
    if wake and pct(wake, 95) > WAKE_P95_TARGET_MS:
        out.append("long-poll wake-up p95")
    return out


# -- main --------------------------------------------------------------------------------


class BareApp(AppProcess):
    """bench/bare_app.py under uvicorn (one worker, uvloop, httptools), stopped by its pid."""

    name = "the bare app"

    def __init__(self, dsn: str, log_path: Path) -> None:
        path = os.pathsep.join(p for p in (str(harness.ROOT), os.environ.get("PYTHONPATH", "")) if p)
        super().__init__(dsn, log_path, env={"PYTHONPATH": path})

    def command(self) -> list[str]:
        script = Path(__file__).resolve().parent / "bare_app.py"
        return [sys.executable, str(script), "--host", "127.0.0.1", "--port", str(self.port)]


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    results = Results()
    try:
        settings = await harness.server_settings(server.dsn)
        async with (
            harness.agent_database(server, "api", [QUEUE, WAKE_QUEUE]) as db,
            AppProcess(db.dsn, tmp / "app.log") as app,
            BareApp(db.dsn, tmp / "bare.log") as bare,
        ):
            await db.admin.execute("TRUNCATE todos, todo_history, events")
            why_not = await batches_available(app.base, db.token)
            if why_not:
                results.notes.append(f"no batch row: {why_not}")
                log(f"no batch row: {why_not}")
            app_conns = await db.admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND pid <> $1",
                db.fill.db.get_server_pid(),
            )
            wake_per_run = -(-args.wake // args.runs)
            for rep in range(args.runs):
                await throughput(app, bare, db, args, results, rep, with_batches=not why_not)
                log(f"[wake-up] run {rep + 1}/{args.runs}, {wake_per_run} samples")
                await db.admin.execute("TRUNCATE todos, todo_history, events")
                results.latency.setdefault("wake", []).extend(
                    await wake_up(app, db.token, db.fill, wake_per_run)
                )
                results.latency.setdefault("healthz", []).extend(
                    await healthz(app, db.token, 20 if args.quick else 100)
                )
                app.check_alive()
    finally:
        await server.drop_all()

    cpus = os.cpu_count()
    header = [
        *harness.heading("agent API throughput", server, settings),
        f"{cpus} CPUs shared by the load generator (this process: httpx clients or Store workers), "
        f"the app process (uvicorn, 1 worker, {app_conns} database connections at start), the bare "
        "app's process (idle but for its rows) and PostgreSQL — the HTTP rows pay for the client too",
        f"load average {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end; Python "
        f"{platform.python_version()}, httpx {httpx.__version__}, asyncpg {asyncpg.__version__}",
        f"{args.todos:,} todos per measurement ({max(100, args.todos // 8):,} at 1 agent, "
        f"{args.batched_todos:,} in batches), median of "
        f"{args.runs} run(s) (spread: ± half the min-max range); {time.perf_counter() - started:.0f} s "
        "in all",
        "CPU/todo: CPU ms per todo of the server process (ours, or the bare app in its rows) and of "
        "this process (the client side); rest: cores busy elsewhere on the machine (PostgreSQL, and "
        "anything else running) — medians; ratio: median of the per-repetition ratios",
    ]
    print(render(results, header), flush=True)
    misses = missed(results)
    if misses:
        log(f"targets missed: {', '.join(misses)}")
    return 1 if misses and args.strict else 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs   3      1    repetitions of every measurement
--todos  4,000  200  todos per measurement
--wake   30     10   long-poll wake-up samples in all
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "200 todos, 1 run, 10 wake-ups (unless given)", SIZES, targets=True)
    parser.add_argument(
        "--batched-todos", type=int, help="todos per measurement in the batch row (4 × --todos)"
    )
    args = parser.parse_args(argv)
    args.batched_todos = args.batched_todos or 4 * args.todos
    if args.runs < 1 or args.todos < 100 or args.wake < 1 or args.batched_todos < 100:
        parser.error("--runs and --wake must be at least 1, --todos and --batched-todos at least 100")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-api-", run_all, parse_args(None)))
