"""Queue control at speed (issue 12): claims with priorities in use and with a paused
queue against plain claims, and bulk actions over 10,000 todos while other queues' claims
go on.

    .venv/bin/python bench/queue_control.py                 # full run, ~4-5 min on 2 cores
    .venv/bin/python bench/queue_control.py --quick         # smoke run, ~1 min
    .venv/bin/python bench/queue_control.py --only bulk     # the bulk actions alone
    .venv/bin/python bench/queue_control.py --only single   # the plain claim alone (also
                                                            # runs on a checkout before issue 12)
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/queue_control.py

Claims. --workers (4) workers, each a Store on its own connection and its own owner name,
claim over all 20 queues (q00..q19) holding --pending (200,000) pending todos between
them, interleaved, ready one microsecond apart (appended in order, as a backlog is): one
claim_next, then complete_and_claim_next on the todo held, again and again (--loop claim:
claim_next + complete, two round trips). Three variants, each on a fresh database, VACUUM
ANALYZEd and checkpointed, measured for --seconds (15) after a 1-s warm-up, in --rounds
(3) rounds in a rotating order:

  single      every todo priority 0, nothing paused: the claim as it was before issue 12
  priorities  priorities 1, 0 and -1 mixed in every queue (todo g: ((g / 20) % 3) - 1)
  paused      priority 0, and q07 (a twentieth of the todos) paused with Control.pause

Each round prints the three side by side with b/a and c/a; the summary gives the medians,
the median of the per-round ratios and the target (>= 0.9). --explain also prints, before
each variant's first measurement, the generic plans of claim_batch and
complete_and_claim_next from the oldest and from a position (EXPLAIN ANALYZE, rolled
back): time, pages, rows per scan of todos, sorts. `--only single` uses nothing that
issue 12 added (the fill names no new column), so it runs unchanged with PYTHONPATH
pointing at a checkout from before it: that is the before/after of the plain claim.

Bulk actions. A fresh database per round: --pending todos in the workers' queues, --bulk
(10,000) pending todos in queue `bulk`, 200 done todos in `bulk` and 200 pending in
`probe`. An operator in another process (this script, --bulk-child: its Python work does
not stall the workers' event loop) runs Control.set_many(priority=p), Control.cancel_many and
Control.retry_many (on the todos cancel_many made dead) over the --bulk ids plus the 200
done ones, which every one of the three must skip: first each alone, then again while
the 4 workers claim + complete, each from a queue of its own (--bulk-claim all: all from
the 20), in an order that changes with the round; every action starts after a CHECKPOINT
(3 s after, with the workers). For each action: its wall time (target <= 2 s) and the CPU
its process and its backend used; the workers' completions per second during it against
the same length of time just before it, and the claim latency (p50, p99, max) in both;
and whether it locked a row it does not change: all the while, a probe connection takes
FOR UPDATE NOWAIT on the 200 skipped ids and the 200 `probe` todos (never found locked,
or the action locks rows it does not change), another on 40 of the changed ids (found
locked now and then: the probe can see a lock), and a monitor samples pg_stat_activity
every 10 ms for a worker waiting on a lock, and pg_locks for the operator's locks on
`todos`.

Autovacuum runs as the server has it. The load average is printed with every table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import harness
import options
import psutil
from harness import Server, load, log
from stats import Series, pct, rotated, table

from dashboard import db as dbmod
from dashboard.control import Control
from dashboard.models import Actor
from dashboard.queries import TRANSITIONS
from dashboard.store import Store

QUEUES = [f"q{i:02d}" for i in range(20)]
PAUSED = "q07"
TTL = 300.0  # no lease lapses during a run
WARMUP = 1.0  # seconds before each measurement window
GAP = 3.0  # seconds between bulk actions (the window before each one is taken from it)
SKIPPED_IDS = 200  # done todos in `bulk` the actions are given and must skip
PROBE_IDS = 200  # pending todos in `probe`, not given to the actions
POSITIVE_IDS = 40  # changed ids the positive-control probe locks
OPERATOR = Actor("operator", "bench")
RATIO_TARGET = 0.9
BULK_TARGET = 2.0  # seconds
ALONE_PRIORITY = 5  # set_many's priority when it runs alone (the round's runs use 1 or 2)
LOOPS = {"cacn": "complete_and_claim_next", "claim": "claim_next + complete"}
CHILD = str(Path(__file__).resolve())  # this script, run as the operator's process


async def commit_ms(server: Server) -> float:
    """harness.commit_ms in a scratch database of its own."""
    conn = await asyncpg.connect(await server.new_empty_database("qc_probe"))
    try:
        return await harness.commit_ms(conn)
    finally:
        await conn.close()
        await server.drop_all()


# -- filling -------------------------------------------------------------------------------


def fill_sql(priorities: bool) -> str:
    """$1 pending todos over the queues q00.. ($2 of them), interleaved, ready (and created)
    one microsecond apart, the oldest an hour ago; with `priorities`, 1, 0 and -1 mixed.
    Without, it names no column issue 12 added (it runs on the schema before it too)."""
    column, value = (", priority", ", ((g / $2::int) % 3) - 1") if priorities else ("", "")
    return f"""
INSERT INTO todos (id, queue, title, created_at, ready_at{column})
SELECT 'td_' || g, 'q' || lpad((g % $2::int)::text, 2, '0'), 'todo ' || g, t, t{value}
FROM generate_series(1, $1::int) AS g,
     LATERAL (SELECT now() - interval '1 hour' + g * interval '1 microsecond' AS t) AS at
"""


BULK_FILL = """
INSERT INTO todos (id, queue, title, created_at, ready_at)
SELECT 'td_bulk_' || g, 'bulk', 'bulk ' || g, t, t
FROM generate_series(1, $1::int) AS g,
     LATERAL (SELECT now() - interval '2 hours' + g * interval '1 microsecond' AS t) AS at
"""
DONE_FILL = """
INSERT INTO todos (id, queue, title, state, owner, attempt, lease_token, completed_at)
SELECT 'td_bulkdone_' || g, 'bulk', 'done ' || g, 'done', 'bench', 1, 1, now()
FROM generate_series(1, $1::int) AS g
"""
PROBE_FILL = """
INSERT INTO todos (id, queue, title) SELECT 'td_probe_' || g, 'probe', 'probe ' || g
FROM generate_series(1, $1::int) AS g
"""


def bulk_ids(n: int) -> list[str]:
    """The ids every bulk action is given: the n to change, then the done ones to skip."""
    return [f"td_bulk_{g}" for g in range(1, n + 1)] + [f"td_bulkdone_{g}" for g in range(1, SKIPPED_IDS + 1)]


# -- workers -------------------------------------------------------------------------------

Calls = list[tuple[float, float]]  # (monotonic end time, seconds) of each completion


async def worker(store: Store, owner: str, queues: list[str], loop: str, calls: Calls, stop) -> None:
    """Claim + complete on `queues` until `stop` is set; every completion into `calls`."""
    todo = await store.claim_next(queues, owner, TTL)
    while not stop.is_set():
        if todo is None:
            raise RuntimeError(f"{owner}: the queues ran dry; give more --pending")
        began = time.monotonic()
        if loop == "cacn":
            _, todo = await store.complete_and_claim_next(todo.id, owner, todo.lease_token, None, queues, TTL)
        else:
            await store.complete(todo.id, owner, todo.lease_token)
            todo = await store.claim_next(queues, owner, TTL)
        ended = time.monotonic()
        calls.append((ended, ended - began))


class Workers:
    """`async with Workers(dsn, queues, loop) as w:` a worker per item of `queues` (the
    queues it claims from) claiming until the block ends."""

    def __init__(self, dsn: str, queues: list[list[str]], loop: str) -> None:
        self.dsn, self.n, self.queues, self.loop = dsn, len(queues), queues, loop
        self.calls: Calls = []
        self.conns: list[asyncpg.Connection] = []
        self.pids: list[int] = []

    async def __aenter__(self) -> Workers:
        for _ in range(self.n):
            self.conns.append(await dbmod.connect(self.dsn))
        self.pids = [c.get_server_pid() for c in self.conns]
        self.stop = asyncio.Event()
        self.tasks = [
            asyncio.create_task(worker(Store(c), f"worker-{i + 1}", qs, self.loop, self.calls, self.stop))
            for i, (c, qs) in enumerate(zip(self.conns, self.queues, strict=True))
        ]
        self.started = time.monotonic()
        return self

    def check(self) -> None:
        for task in self.tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        try:
            await asyncio.gather(*self.tasks)
        finally:
            for conn in self.conns:
                await conn.close()

    def window(self, start: float, end: float) -> list[float]:
        """Latencies of the completions that ended in [start, end)."""
        return [s for t, s in self.calls if start <= t < end]


# -- claims: the three variants --------------------------------------------------------------


@dataclass
class Variant:
    key: str
    label: str
    priorities: bool
    paused: bool
    series: Series = field(init=False)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.series = Series(self.key, self.label)


VARIANTS = [
    Variant("single", "(a) single priority, nothing paused", priorities=False, paused=False),
    Variant("priorities", "(b) priorities -1/0/1 mixed", priorities=True, paused=False),
    Variant("paused", f"(c) single priority, {PAUSED} paused (1 of 20)", priorities=False, paused=True),
]


async def measure_claims(server: Server, variant: Variant, args, explain: bool) -> float:
    dsn = await server.new_database(f"qc_{variant.key}")
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(fill_sql(variant.priorities), args.pending, len(QUEUES))
        if variant.paused:
            await Control(admin).pause(PAUSED, OPERATOR, "bench")
        await harness.settle(admin)
        if explain:
            await print_plans(dsn, variant)
        async with Workers(dsn, [QUEUES] * args.workers, args.loop) as w:
            start = w.started + WARMUP
            end = start + args.seconds
            while time.monotonic() < end:
                await asyncio.sleep(0.2)
                w.check()
        window = w.window(start, end)
        rate = len(window) / args.seconds
        variant.series.rates.append(rate)
        variant.p50.append(pct(window, 50) * 1000)
        variant.p99.append(pct(window, 99) * 1000)
        log(f"  {variant.label:<42} {rate:>8,.0f} todos/s  p50 {variant.p50[-1]:.2f} ms  "
            f"p99 {variant.p99[-1]:.2f} ms")  # fmt: skip
        done = len(w.calls)
        states = await harness.count_states(admin)
        expected = {"done": done, "claimed": args.workers, "pending": args.pending - done - args.workers}
        if states != expected:
            raise RuntimeError(f"{variant.label}: expected {expected}, the table holds {states}")
        if variant.paused:
            taken = await admin.fetchval(
                "SELECT count(*) FROM todos WHERE queue = $1 AND state <> 'pending'", PAUSED
            )
            if taken:
                raise RuntimeError(f"{taken} todos of the paused queue {PAUSED} were claimed")
        return rate
    finally:
        await admin.close()
        await server.drop_all()


HOLD = (
    "UPDATE todos SET state = 'claimed', owner = 'explain', lease_token = lease_token + 1,"
    " lease_expires_at = now() + interval '5 minutes', claimed_at = now() WHERE id = $1 RETURNING lease_token"
)


async def print_plans(dsn: str, variant: Variant) -> None:
    """The generic plans of claim_batch (n = 1) and complete_and_claim_next as the workers
    are about to run them, each run by EXPLAIN ANALYZE and rolled back, from the oldest and
    from a position (the first todo in claim order, held for the completion): time, pages
    read, and the rows each scan of todos returned (a Sort over todos is the bad sign)."""
    conn = await dbmod.connect(dsn)
    print(f"\n{variant.label}: generic plans, EXPLAIN ANALYZE (rolled back) before the workers start")
    try:
        for statement in (TRANSITIONS.claim_batch, TRANSITIONS.complete_and_claim_next):
            for where in ("from the oldest", "from a position"):
                with contextlib.suppress(_RolledBack):
                    async with conn.transaction():
                        top = await _explain(conn, statement, where == "from the oldest")
                        raise _RolledBack
                plan = top["Plan"]
                scans = [
                    f"{n['Index Name']} {n['Actual Rows'] * n['Actual Loops']:,.0f} rows"
                    for n in _nodes(plan)
                    if n.get("Relation Name") == "todos" and n.get("Index Name") and n.get("Actual Loops")
                ]
                sorts = [
                    f"Sort by {', '.join(n['Sort Key'])}" for n in _nodes(plan) if n["Node Type"] == "Sort"
                ]
                print(
                    f"  {statement.name} {where}: {top['Execution Time']:.2f} ms, "
                    f"{plan.get('Shared Hit Blocks', 0) + plan.get('Shared Read Blocks', 0):,} pages; "
                    + "; ".join(scans + sorts)
                )
    finally:
        await conn.close()


async def _explain(conn: asyncpg.Connection, statement, oldest: bool) -> dict:
    """EXPLAIN ANALYZE of `statement`'s generic plan (the connection forces generic plans)
    in the caller's transaction; runs on the schema before issue 12 too (no rank there)."""
    ranked = "rank" in statement.params
    first = await conn.fetchrow(
        f"SELECT id, {'-priority' if ranked else '0'} AS rank, ready_at FROM todos WHERE state = 'pending'"
        f" AND queue = ANY ($1::text[]) ORDER BY {'-priority, ' if ranked else ''}ready_at LIMIT 1",
        QUEUES,
    )
    lease = await conn.fetchval(HOLD, first["id"])
    rank, after = (-10, None) if oldest else (first["rank"], first["ready_at"])
    values = {"queues": QUEUES, "owner": "explain", "ttl": TTL, "rank": rank, "after": after, "n": 1}
    values |= {"id": first["id"], "lease": lease, "scope": None, "result": None}
    literals = [
        await conn.fetchval("SELECT quote_nullable($1::text)", _text(v)) + _cast(v)
        for v in statement.args({k: v for k, v in values.items() if k in statement.params})
    ]
    await conn.execute(f"PREPARE qc_plan AS {statement.sql}")
    text = await conn.fetchval(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE qc_plan({', '.join(literals)})"
    )
    await conn.execute("DEALLOCATE qc_plan")
    return json.loads(text)[0]


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


class _RolledBack(Exception):
    """Leaves the transaction of an EXPLAIN ANALYZE (it claimed a todo) by rolling it back."""


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return "{" + ",".join(value) + "}"
    return str(value)


def _cast(value) -> str:
    return "::text[]" if isinstance(value, list) else ""


def claims_report(variants: list[Variant], rounds: list[dict[str, float]], args) -> list[str]:
    by_key = {v.key: v for v in variants}
    base = by_key.get("single")
    out = [
        "",
        f"claim + complete ({LOOPS[args.loop]}), "
        f"{args.workers} workers over {len(QUEUES)} queues, {args.pending:,} pending; {args.seconds:.0f} s "
        f"per measurement after {WARMUP:.0f} s, {args.rounds} round(s) in rotating order; {load()}",
    ]
    keys = [v.key for v in variants]
    letter = {"single": "a", "priorities": "b", "paused": "c"}
    ratio_keys = [k for k in keys if k != "single" and base is not None]
    rows: list[tuple[str, ...]] = [
        ("round", *(f"({letter[k]}) {k} todos/s" for k in keys), *(f"{letter[k]}/a" for k in ratio_keys))
    ]
    for i, r in enumerate(rounds):
        rows.append((
            str(i + 1), *(f"{r[k]:,.0f}" for k in keys), *(f"{r[k] / r['single']:.2f}" for k in ratio_keys),
        ))  # fmt: skip
    out += table(rows, set(range(1, len(rows[0]))))
    rows = [("variant", "todos/s", "spread", "p50 ms", "p99 ms", "ratio vs (a)", "target", "result")]
    for v in variants:
        ratio = target = verdict = ""
        if v.key != "single" and base is not None:
            r = statistics.median(x[v.key] / x["single"] for x in rounds)
            ratio, target, verdict = (
                f"{r:.2f}×",
                f"≥ {RATIO_TARGET:.2f}×",
                "PASS" if r >= RATIO_TARGET else "MISS",
            )
        rows.append((v.label, *v.series.rate_cells(), f"{statistics.median(v.p50):.2f}",
                     f"{statistics.median(v.p99):.2f}", ratio, target, verdict))  # fmt: skip
    out += ["", *table(rows, {1, 2, 3, 4, 5})]
    out.append(
        "todos/s: median over the rounds (spread ± half the min-max range); ratio: median of the "
        "per-round ratios; p50/p99: latency of one claim + complete, median over the rounds"
    )
    return out


async def run_claims(server: Server, args) -> list[str]:
    variants = [v for v in VARIANTS if v.key in args.only]
    rounds: list[dict[str, float]] = []
    for rep in range(args.rounds):
        log(f"[claims] round {rep + 1}/{args.rounds}; {load()}")
        rounds.append({})
        for v in rotated(variants, rep):
            rounds[-1][v.key] = await measure_claims(server, v, args, explain=args.explain and rep == 0)
    return claims_report(variants, rounds, args)


# -- bulk actions ------------------------------------------------------------------------------

ACTIONS = ("set_many", "cancel_many", "retry_many")
# The order of each round's actions (set_many changes pending and dead todos alike, so it
# can go anywhere; retry_many needs the todos cancel_many made dead).
ORDERS = [
    ("set_many", "cancel_many", "retry_many"),
    ("cancel_many", "set_many", "retry_many"),
    ("cancel_many", "retry_many", "set_many"),
]


async def bulk_child(dsn: str, n: int) -> int:
    """The operator's process: connect, say the backend pid, then run each action asked for
    on stdin (`set_many P`, `cancel_many`, `retry_many`, `quit`) and say what it did."""
    conn = await dbmod.connect(dsn)
    control = Control(conn)
    ids = bulk_ids(n)
    print(json.dumps({"pid": conn.get_server_pid()}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while (line := (await loop.run_in_executor(None, sys.stdin.readline)).split()) and line[0] != "quit":
            t0 = time.monotonic()
            if line[0] == "set_many":
                report = await control.set_many(ids, OPERATOR, priority=int(line[1]))
            elif line[0] == "cancel_many":
                report = await control.cancel_many(ids, OPERATOR, "bench")
            else:
                report = await control.retry_many(ids, OPERATOR)
            t1 = time.monotonic()
            print(json.dumps({"t0": t0, "t1": t1, "changed": len(report.changed), "skipped": report.skipped}),
                  flush=True)  # fmt: skip
    finally:
        await conn.close()
    return 0


class Operator:
    """The bulk child process, stopped by its pid."""

    def __init__(self, dsn: str, n: int) -> None:
        self.dsn, self.n = dsn, n
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Operator:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, CHILD, "--bulk-child", self.dsn, str(self.n),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            self.backend = (await self._answer())["pid"]
        except BaseException:
            await self._stop()
            raise
        return self

    async def _stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()

    def cpu_seconds(self) -> float | None:
        """CPU time of this process and its backend (None when the backend is not local)."""
        try:
            procs = [psutil.Process(self.proc.pid), psutil.Process(self.backend)]
            return sum(t.user + t.system for t in (p.cpu_times() for p in procs))
        except (psutil.Error, OSError):
            return None

    async def _answer(self) -> dict:
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bulk child exited ({await self.proc.wait()})")
        return json.loads(line)

    async def run(self, command: str) -> dict:
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._answer()

    async def __aexit__(self, *exc) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(OSError, ConnectionError):
            self.proc.stdin.write(b"quit\n")
            await self.proc.stdin.drain()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        finally:
            await self._stop()


@dataclass
class Watch:
    """What the probes and the monitor saw during one action."""

    unchanged_tries: int = 0
    unchanged_locked: int = 0
    changed_tries: int = 0
    changed_locked: int = 0
    samples: int = 0
    worker_waits: int = 0  # samples in which a worker waited on a lock
    modes: set[str] = field(default_factory=set)  # the operator's locks on todos


NOWAIT = "SELECT count(*) FROM (SELECT 1 FROM todos WHERE id = ANY ($1::text[]) FOR UPDATE NOWAIT) AS s"
WAITING = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY ($1::int[]) AND wait_event_type = 'Lock'"
MODES = (
    "SELECT coalesce(array_agg(DISTINCT mode), '{}') FROM pg_locks "
    "WHERE pid = $1 AND locktype = 'relation' AND relation = 'todos'::regclass"
)


async def probe(
    conn: asyncpg.Connection, ids: list[str], watch: Watch, which: str, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            await conn.fetchval(NOWAIT, ids)
            locked = 0
        except asyncpg.LockNotAvailableError:
            locked = 1
        setattr(watch, f"{which}_tries", getattr(watch, f"{which}_tries") + 1)
        setattr(watch, f"{which}_locked", getattr(watch, f"{which}_locked") + locked)
        await asyncio.sleep(0.005)


async def monitor(conn: asyncpg.Connection, workers: list[int], operator: int, watch: Watch, stop) -> None:
    while not stop.is_set():
        watch.samples += 1
        watch.worker_waits += bool(await conn.fetchval(WAITING, workers))
        watch.modes.update(await conn.fetchval(MODES, operator))
        await asyncio.sleep(0.01)


@dataclass
class ActionRun:
    action: str
    wall: float
    changed: int
    skipped: dict
    before: float  # the workers' todos/s in the same length of time just before
    during: float
    p99_before: float  # ms
    p99_during: float
    max_during: float
    watch: Watch
    cpu: float | None  # cores the operator's process and its backend used during it
    position: int  # 1st, 2nd or 3rd action of its round
    round: int


async def bulk_round(server: Server, args, rep: int, quiet: list[float], alone: dict) -> list[ActionRun]:
    dsn = await server.new_database("qc_bulk")
    admin = await asyncpg.connect(dsn)
    conns: list[asyncpg.Connection] = []
    try:
        if args.bulk_claim == "all":
            claimers = [QUEUES] * args.workers
        else:  # each worker its own queue, all of them filled
            claimers = [[q] for q in QUEUES[: args.workers]]
        await admin.execute(fill_sql(False), args.pending, len({q for qs in claimers for q in qs}))
        await admin.execute(BULK_FILL, args.bulk)
        await admin.execute(DONE_FILL, SKIPPED_IDS)
        await admin.execute(PROBE_FILL, PROBE_IDS)
        await harness.settle(admin)
        for _ in range(3):
            conns.append(await asyncpg.connect(dsn))
        priority = 1 + rep % 2
        runs: list[ActionRun] = []
        async with Operator(dsn, args.bulk) as operator:
            # First each action alone (nothing else running), after a checkpoint: its own cost.
            for action in ACTIONS:
                await harness.checkpoint(admin)
                cpu0 = operator.cpu_seconds()
                done = await operator.run(f"{action} {ALONE_PRIORITY}" if action == "set_many" else action)
                length = done["t1"] - done["t0"]
                cpu = (operator.cpu_seconds() - cpu0) / length if cpu0 is not None else None
                alone[(rep, action)] = (length, cpu)
                if done["changed"] != args.bulk or done["skipped"] != {"done": SKIPPED_IDS}:
                    raise RuntimeError(
                        f"{action} alone: changed {done['changed']}, skipped {done['skipped']}"
                    )
                log(f"  {action:<12} alone {length:.2f} s")
            async with Workers(dsn, claimers, args.loop) as w:
                await asyncio.sleep(WARMUP)
                await _with_workers(args, rep, operator, w, admin, conns, quiet, runs, priority)
        left = await admin.fetch(
            "SELECT state::text, priority, count(*) FROM todos WHERE queue = 'bulk' GROUP BY 1, 2 ORDER BY 1"
        )
        expected = [("done", 0, SKIPPED_IDS), ("pending", priority, args.bulk)]
        if [tuple(r) for r in left] != expected:
            raise RuntimeError(f"queue bulk: expected {expected}, found {[tuple(r) for r in left]}")
        return runs
    finally:
        for conn in (admin, *conns):
            await conn.close()
        await server.drop_all()


async def _with_workers(args, rep, operator, w, admin, conns, quiet, runs, priority) -> None:
    """The round's actions while the workers claim, each with the probes and the monitor."""
    unchanged = [f"td_bulkdone_{g}" for g in range(1, SKIPPED_IDS + 1)]
    unchanged += [f"td_probe_{g}" for g in range(1, PROBE_IDS + 1)]
    step = max(1, args.bulk // POSITIVE_IDS)
    changed = [f"td_bulk_{g}" for g in range(step, args.bulk + 1, step)]
    for action in ORDERS[rep % len(ORDERS)]:
        # Each action starts GAP after a checkpoint (the same full-page writes ahead).
        await harness.checkpoint(admin)
        await asyncio.sleep(GAP)
        if len(quiet) < rep + 1:  # the first action's: nothing bulk has happened yet
            quiet.append(len(w.window(time.monotonic() - GAP, time.monotonic())) / GAP)
        w.check()
        cpu0 = operator.cpu_seconds()
        watch, stop = Watch(), asyncio.Event()
        tasks = [
            asyncio.create_task(probe(conns[0], unchanged, watch, "unchanged", stop)),
            asyncio.create_task(probe(conns[1], changed, watch, "changed", stop)),
            asyncio.create_task(monitor(conns[2], w.pids, operator.backend, watch, stop)),
        ]
        try:
            done = await operator.run(f"{action} {priority}" if action == "set_many" else action)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        t0, t1 = done["t0"], done["t1"]
        length = t1 - t0
        cpu = (operator.cpu_seconds() - cpu0) / length if cpu0 is not None else None
        await asyncio.sleep(0.2)  # the last completions during the action are in
        before, during = w.window(max(t0 - length, t0 - GAP), t0), w.window(t0, t1)
        span = min(length, GAP)
        run = ActionRun(
            action, length, done["changed"], done["skipped"],
            len(before) / span, len(during) / length,
            pct(before, 99) * 1000, pct(during, 99) * 1000, max(during, default=0.0) * 1000, watch,
            cpu, 1 + len([r for r in runs if r.round == rep]), rep,
        )  # fmt: skip
        runs.append(run)
        log(f"  {action:<12} {length:.2f} s, {run.changed:,} changed, skipped {run.skipped}; workers "
            f"{run.before:,.0f} → {run.during:,.0f} todos/s, p99 {run.p99_before:.1f} → "
            f"{run.p99_during:.1f} ms; unchanged rows locked {watch.unchanged_locked}/"
            f"{watch.unchanged_tries}, changed {watch.changed_locked}/"
            f"{watch.changed_tries}")  # fmt: skip
        if run.changed != args.bulk or run.skipped != {"done": SKIPPED_IDS}:
            raise RuntimeError(f"{action}: changed {run.changed}, skipped {run.skipped}")


def _cores(cpu: float | None) -> str:
    return "n/a" if cpu is None else f"{cpu:.2f}"


def bulk_report(runs: list[ActionRun], quiet: list[float], alone: dict, args) -> list[str]:
    claim = "all from q00..q19" if args.bulk_claim == "all" else "each from one queue of its own"
    out = [
        "",
        f"bulk actions over {args.bulk:,} todos (+{SKIPPED_IDS} done ids to skip) by another process, while "
        f"{args.workers} workers claim + complete on other queues ({claim}, {args.pending:,} pending); "
        f"{args.rounds} round(s); {load()}",
    ]
    rows: list[tuple[str, ...]] = [
        ("action", "round", "alone s", "cores", "nth", "wall s", "target", "result", "cores",
         "others todos/s before",
         "during", "during/before", "claim p99 ms before", "during", "max during", "unchanged rows locked",
         "changed rows locked", "worker lock waits", "operator's locks on todos"),
    ]  # fmt: skip
    for action in ACTIONS:
        for r in [r for r in runs if r.action == action]:
            w = r.watch
            rows.append((
                action.replace("set_many", "set_many(priority)"), str(r.round + 1),
                f"{alone[r.round, action][0]:.2f}", _cores(alone[r.round, action][1]), str(r.position),
                f"{r.wall:.2f}", f"≤ {BULK_TARGET:.0f} s", "PASS" if r.wall <= BULK_TARGET else "MISS",
                _cores(r.cpu), f"{r.before:,.0f}", f"{r.during:,.0f}", f"{r.during / r.before:.2f}",
                f"{r.p99_before:.1f}", f"{r.p99_during:.1f}", f"{r.max_during:.1f}",
                f"{w.unchanged_locked} of {w.unchanged_tries}", f"{w.changed_locked} of {w.changed_tries}",
                f"{w.worker_waits} of {w.samples}", ", ".join(sorted(w.modes)),
            ))  # fmt: skip
    out += table(rows, set(range(1, 18)) - {6, 7})
    quiet_text = ", ".join(f"{q:,.0f}" for q in quiet)
    out += [
        "alone s: the action with nothing else running, right after a checkpoint; nth: its place in its "
        f"round with the workers ({GAP:.0f} s after a checkpoint); cores: CPU of the operator's process and "
        "its backend / wall time; others todos/s before: the same length of time just before the action; "
        f"before the round's first action: {quiet_text}",
        "unchanged rows locked: FOR UPDATE NOWAIT probes on the skipped done ids and on untouched todos of "
        "another queue that found a row locked (must be 0); changed rows locked: the same on 40 of the "
        "changed ids (the probe can see the action's locks); worker lock waits: 10-ms samples of "
        "pg_stat_activity with a worker waiting on a lock",
    ]
    for action in ACTIONS:
        walls = [r.wall for r in runs if r.action == action]
        ratios = [r.during / r.before for r in runs if r.action == action]
        out.append(
            f"{action}: wall median {statistics.median(walls):.2f} s, max {max(walls):.2f} s "
            f"({'PASS' if max(walls) <= BULK_TARGET else 'MISS'} ≤ {BULK_TARGET:.0f} s); others' throughput "
            f"during / before, median {statistics.median(ratios):.2f}"
        )
    return out


async def run_bulk(server: Server, args) -> list[str]:
    runs: list[ActionRun] = []
    quiet: list[float] = []
    alone: dict[tuple[int, str], tuple[float, float | None]] = {}
    for rep in range(args.rounds):
        log(f"[bulk] round {rep + 1}/{args.rounds}; {load()}")
        runs += await bulk_round(server, args, rep, quiet, alone)
    return bulk_report(runs, quiet, alone, args)


# -- main ------------------------------------------------------------------------------------


async def run_all(server: Server, args: argparse.Namespace, _tmp: Path) -> int:
    started = time.monotonic()
    settings = await harness.server_settings(server.dsn)
    print(f"{harness.server_line(server, settings)}; {load()}", flush=True)
    try:
        print(f"one-row INSERT + commit: {await commit_ms(server):.2f} ms (median of 50)", flush=True)
        if any(v.key in args.only for v in VARIANTS):
            print("\n".join(await run_claims(server, args)), flush=True)
            print(f"one-row INSERT + commit: {await commit_ms(server):.2f} ms (median of 50)", flush=True)
        if "bulk" in args.only:
            print("\n".join(await run_bulk(server, args)), flush=True)
            print(f"one-row INSERT + commit: {await commit_ms(server):.2f} ms (median of 50)", flush=True)
    finally:
        await server.drop_all()
    print(f"\n{time.monotonic() - started:.0f} s in all; {load()}", flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--pending  200,000  20,000  pending todos over the 20 queues
--seconds  15.0     2.0     each claim measurement's window
--rounds   3        1       rounds of every measurement
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "20,000 pending, 2-s windows, 1 round", SIZES)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bulk", type=int, default=10_000, help="todos each bulk action changes (10,000)")
    parser.add_argument(
        "--loop", choices=("cacn", "claim"), default="cacn",
        help="cacn: complete_and_claim_next, as the busy worker (default); claim: claim_next + complete",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", choices=[*(v.key for v in VARIANTS), "bulk"],
        help="run only this part (repeatable): a claim variant, or the bulk actions",
    )  # fmt: skip
    parser.add_argument(
        "--bulk-claim", choices=("own", "all"), default="own",
        help="in the bulk part, each worker claims from a queue of its own (default), or all from all 20",
    )  # fmt: skip
    parser.add_argument("--explain", action="store_true", help="print the claim's plans for each variant")
    parser.add_argument("--bulk-child", nargs=2, metavar=("DSN", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.only = args.only or [*(v.key for v in VARIANTS), "bulk"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bulk_child:
        return asyncio.run(bulk_child(args.bulk_child[0], int(args.bulk_child[1])))
    return harness.run_on_server("sb-queue-control-", run_all, args)


if __name__ == "__main__":
    sys.exit(main())
