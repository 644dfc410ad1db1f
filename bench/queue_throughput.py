"""Queue throughput: the store against a bare asyncpg loop and pgbench over the same SQL,
and PgQueuer; what hints cost an enqueue and how soon they wake a waiter.

    .venv/bin/python bench/queue_throughput.py            # full run, ~7 min on 2 cores
    .venv/bin/python bench/queue_throughput.py --quick    # smoke run, under a minute
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

Everything runs in one process against one server: DATABASE_URL if set, else an embedded
PostgreSQL started on a temporary data dir and stopped at exit. Each scenario family gets
its own fresh database (created, migrated, dropped at exit). fsync and synchronous_commit
must be on: the script refuses to measure a non-durable server.

Every measurement processes --todos todos (--batched-todos in the batched scenarios) and
is repeated --runs times; the table shows the median, and each ratio is the median of the
per-run ratios. Within one repetition the compared variants run one after the other, in a
rotating order, so machine noise hits them alike. Before each measurement the tables are
truncated, seeded with finished todos, refilled (when the measurement consumes todos),
vacuumed, analyzed and checkpointed, so every variant starts from the same state. Each
row also shows the WAL the server inserted per todo during its runs (measured()).
Progress goes to stderr; the table goes to stdout. See docs/benchmarks.md for what each row
measures.

The families: claim (1, 4, 16 workers), batch (against PgQueuer), enqueue, limit (the
Store against pgbench running our own statements, and those against the seed's bare
ones) and hints (Store.create with and without hints at 1, 4, 8 producers; wake-up
latency); --only picks some.

The server, its databases, pgbench and the main loop are harness.py's; every use of
dashboard's SQL text, the pgbench scripts included, is in the "baseline statements"
section below.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import platform
import random
import re
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import asyncpg
import harness
import options
from harness import Server, log
from stats import Series, pct, rotated, table, timed

from dashboard import db as dbmod
from dashboard import queries, reaper
from dashboard.claim_cursor import TOP_RANK
from dashboard.models import PRODUCER, Actor, NewTodo
from dashboard.notify import Hub
from dashboard.rollups import Rollups
from dashboard.store import Store
from dashboard.writer import HintSink

QUEUE = "bench"
TTL = 300.0  # long enough that no lease lapses during a run
WORKER_COUNTS = (1, 4, 16)
BATCH_CLAIM = 10  # Store.claim_batch n, and PgQueuer's default batch_size
ENQUEUE_BATCH = 100
PRODUCERS = 4
FILL_CHUNK = 1000
# Finished todos (with their history) every measurement starts with, as in a queue that
# has been running. Besides being the usual state, it keeps the planner from seeing an
# empty `todos`: a connection that first checks the todo_history -> todos foreign key
# while the table looks empty caches a sequential-scan plan for that check until the next
# ANALYZE, and then scans the whole table for every history row it inserts; which
# producer connection draws that plan is luck, and it made runs 7x slower at random.
SEED_DONE = 10_000


# == baseline statements =================================================================
# The only code in this file that uses dashboard's SQL text, and all of it: the baseline
# loop, and the fill before every measurement, drive the store's own statements
# (dashboard.queries.TRANSITIONS, from sql/queries/transitions.sql) straight through
# asyncpg, with the values dashboard/store.py passes them (scope None: a worker without
# a token). Statement.args maps the names to positions and refuses a name the statement
# does not take, so check_parameters stops the run before timing a wrong call. When the
# statements are renamed or take other parameters, adapt this section, and only it.

SQL = queries.TRANSITIONS
FILLER = Actor("producer", "bench")  # who the fill's history rows name
CLAIM, COMPLETE, CREATE = SQL.claim_batch, SQL.complete, SQL.create_todos


def create_values(ids, numbers, keys, actor: Actor) -> dict:
    """create_todos' values for plain asyncpg (payloads passed as JSON text); `actor` is
    recorded on the history rows as (actor_kind, actor), as Store.create_many does."""
    n = len(ids)
    return {
        "ids": ids,
        "queues": [QUEUE] * n,
        "sources": ["bench"] * n,
        "kinds": ["bench"] * n,
        "titles": [f"todo {i}" for i in numbers],
        "payloads": [f'{{"n": {i}}}' for i in numbers],
        "idempotency_keys": keys,
        "assignees": [None] * n,
        "max_attempts": [5] * n,
        "event_ids": [None] * n,
        "dedupe_hits": [0] * n,
        "priorities": [0] * n,
        "run_ats": [None] * n,
        "delays": [None] * n,
        "assignee_untils": [None] * n,
        "actor_kind": actor.kind,
        "actor": actor.name,
    }


def claim_values(owner: str, rank: int = TOP_RANK, after=None) -> dict:
    """From the oldest, or from (rank, after): where the last claim ended, as the store's
    ClaimCursors passes it between full scans."""
    return {"queues": [QUEUE], "owner": owner, "ttl": TTL, "n": 1, "rank": rank, "after": after}


def complete_values(todo_id: str, owner: str, lease: int) -> dict:
    return {
        "id": todo_id,
        "owner": owner,
        "lease": lease,
        "result": None,
        "scope": None,
        "actor_kind": "agent",
    }


async def check_parameters(conn: asyncpg.Connection) -> None:
    """Every call below names exactly its statement's parameters (Statement.args raises)."""
    try:
        CLAIM.args(claim_values("check"))
        COMPLETE.args(complete_values("td_check", "check", 1))
        CREATE.args(create_values(["td_check"], [0], [None], PRODUCER))
        pgbench_scripts()
    except TypeError as exc:
        raise SystemExit(
            f"sql/queries/transitions.sql changed ({exc}); update the baseline statements in "
            f"{Path(__file__).name} to pass what dashboard/store.py passes"
        ) from None


def pgbench_scripts() -> list[PgbScript]:
    """Every pgbench script of the limit (written out, so checked, at start)."""
    return [
        pgb_claim_complete(),
        pgb_complete_and_claim_next(),
        pgb_batches(BATCH_CLAIM),
        pgb_creates(1, PGB_CREATES_PER_SCRIPT),
        pgb_creates(ENQUEUE_BATCH, PGB_BATCHES_PER_SCRIPT),
    ]


async def enqueue_pending(admin: asyncpg.Connection, n: int) -> None:
    """n pending todos through create_todos, FILL_CHUNK at a time (the fill)."""
    for start in range(0, n, FILL_CHUNK):
        numbers = range(start, min(n, start + FILL_CHUNK))
        ids = [f"td_{uuid.uuid4()}" for _ in numbers]
        await admin.execute(CREATE.sql, *CREATE.args(create_values(ids, numbers, [None] * len(ids), FILLER)))


async def baseline_claim_complete(conn: asyncpg.Connection, owner: str) -> int:
    """claim one, complete it; the store's two statements, straight through asyncpg."""
    done, position = 0, {}
    while True:
        claimed = await conn.fetch(CLAIM.sql, *CLAIM.args(claim_values(owner, **position)))
        if not claimed:
            return done
        todo = claimed[0]
        position = {"rank": -todo["priority"], "after": todo["ready_at"]}
        completed = await conn.fetch(
            COMPLETE.sql, *COMPLETE.args(complete_values(todo["id"], owner, todo["lease_token"]))
        )
        if len(completed) != 1:
            raise RuntimeError(f"baseline: completing {todo['id']} matched nothing")
        done += 1


async def baseline_enqueue_one(conn: asyncpg.Connection, items: list[tuple]) -> int:
    for number, key in items:
        values = create_values([f"td_{uuid.uuid4()}"], [number], [key], PRODUCER)
        await conn.fetch(CREATE.sql, *CREATE.args(values))
    return len(items)


async def baseline_enqueue_batches(conn: asyncpg.Connection, batches: list[list[tuple]]) -> int:
    total = 0
    for batch in batches:
        ids = [f"td_{uuid.uuid4()}" for _ in batch]
        numbers = [number for number, _ in batch]
        keys = [key for _, key in batch]
        total += len(await conn.fetch(CREATE.sql, *CREATE.args(create_values(ids, numbers, keys, PRODUCER))))
    return total


# -- the same statements as pgbench scripts ("the limit") --------------------------------
# pgbench runs the statements' own text. Two things it cannot do decide how: it numbers
# its own parameters (each `:variable` in a script becomes a `$n` under -M prepared), and
# it cannot bind a NULL (a NULL variable goes out as the text 'NULL'). So each `$n` of a
# statement is written back as a pgbench variable, except the parameters the Store passes
# as None here (scope, result), which are written as the literal NULL; comments are
# dropped. The owner is the client's number (pgbench's :client_id), one owner per client
# as w0..w3 on the Store side. Fresh ids and keys come from one SELECT of
# gen_random_uuid() at the top of each create script, for PGB_CREATES_PER_SCRIPT
# statements (each its own transaction), so that round trip costs pgbench ~2% at most.

_PGB_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|\$(\d+)")
_PGB_VARIABLE = re.compile(r"::+|:([A-Za-z_]\w*)")  # as pgbench reads them (quotes or not)
PGB_CREATES_PER_SCRIPT = 50  # Store.create: 50 statements after each SELECT of fresh ids
PGB_BATCHES_PER_SCRIPT = 10  # Store.create_many(100): 10 statements after each SELECT


@dataclass
class PgbScript:
    name: str
    text: str
    variables: dict[str, str]  # pgbench -D
    todos: int  # todos per script execution (pgbench's "transaction")


async def run_pgbench(
    dsn: str, script: PgbScript, *, clients: int, transactions: int, tmp: Path
) -> harness.PgbenchRun:
    """harness.pgbench on one of our scripts, in the app's session settings."""
    return await harness.pgbench(
        dsn,
        script.text,
        clients=clients,
        transactions=transactions,
        tmp=tmp,
        name=script.name,
        variables=script.variables,
        server_settings=dbmod.SERVER_SETTINGS,
    )


def pgbench_text(statement: queries.Statement, values: dict[str, str]) -> str:
    """`statement` as a pgbench command, each parameter written as values[name] (a
    `:variable`, an expression of one such as `-:c_priority`, or NULL), without comments,
    blank lines or the final semicolon."""
    statement.args(values)  # every parameter, and only those (TypeError otherwise)

    def written(match: re.Match) -> str:
        if match.group(0).startswith("--"):
            return ""
        if match.group(1) is None:
            return match.group(0)
        return values[statement.params[int(match.group(1)) - 1]]

    text = _PGB_TOKEN.sub(written, statement.sql)
    text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip()).rstrip(";")
    wanted = {name for v in values.values() for name in re.findall(r"(?<!:):([a-z_][a-z0-9_]*)", v)}
    found = {m.group(1) for m in _PGB_VARIABLE.finditer(text) if m.group(1)}
    if found != wanted:  # pgbench would take something else in the text for a variable
        raise SystemExit(
            f"{statement.name}: pgbench would see variables {sorted(found)}, not {sorted(wanted)}"
        )
    return text


def array_literal(items: list) -> str:
    """A PostgreSQL array literal, as asyncpg sends a list (None is NULL)."""

    def element(item) -> str:
        if item is None:
            return "NULL"
        text = str(item)
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(element(i) for i in items) + "}"


def pgb_claim_values() -> dict[str, str]:
    r"""claim_batch's values. Each claim starts where the client's last one ended (the
    priority and ready_at its `\gset c_` left), as the store's ClaimCursors does between
    full scans."""
    return {
        "queues": ":queues",
        "owner": ":client_id",
        "ttl": ":ttl",
        "n": ":n",
        "rank": "-:c_priority",
        "after": ":c_ready_at",
    }


def pgb_held(todo: str = "c_") -> dict[str, str]:
    r"""complete's values for the todo that `\gset {todo}` left in variables (scope None)."""
    return {"id": f":{todo}id", "owner": ":client_id", "lease": f":{todo}lease_token", "scope": "NULL"}


PGB_CLAIM_VARIABLES = {
    "queues": array_literal([QUEUE]),
    "ttl": str(TTL),
    "c_priority": str(-TOP_RANK),  # from the oldest: the top priority's level, from -infinity
    "c_ready_at": "-infinity",
}


def pgb_claim_complete() -> PgbScript:
    """claim_batch with n=1, then complete: two transactions, as Store.claim_next and
    Store.complete."""
    claim = pgbench_text(CLAIM, pgb_claim_values())
    complete = pgbench_text(COMPLETE, {**pgb_held(), "result": "NULL", "actor_kind": "'agent'"})
    return PgbScript(
        "claim_complete", f"{claim} \\gset c_\n{complete};\n", {**PGB_CLAIM_VARIABLES, "n": "1"}, 1
    )


def pgb_complete_and_claim_next() -> PgbScript:
    r"""One claim the first time, then complete_and_claim_next on the todo it claimed last:
    `\aset` keeps the last row, the 'claimed' one (the run is checked for it)."""
    claim = pgbench_text(CLAIM, pgb_claim_values())
    cacn = pgbench_text(
        SQL.complete_and_claim_next,
        {
            **pgb_held(),
            "queues": ":queues",
            "ttl": ":ttl",
            "result": "NULL",
            "rank": "-:c_priority",
            "after": ":c_ready_at",
        },
    )
    text = f"\\if :started = 0\n{claim} \\gset c_\n\\set started 1\n\\endif\n{cacn} \\aset c_\n"
    return PgbScript("complete_and_claim_next", text, {**PGB_CLAIM_VARIABLES, "n": "1", "started": "0"}, 1)


def pgb_batches(n: int) -> PgbScript:
    """claim_batch(n), then complete_many (all_or_none) of what it claimed, as
    Store.claim_batch and Store.complete_many. pgbench keeps one row of a result, so the
    claim's last line returns its rows' ids and leases as two arrays instead of the rows
    (its CTEs, the work, are the statement's own)."""
    claim = pgbench_text(CLAIM, pgb_claim_values())
    rows = "SELECT * FROM claimed ORDER BY -priority, ready_at"
    if not claim.endswith(rows):
        raise SystemExit(f"claim_batch no longer ends with {rows!r}; adapt pgb_batches")
    claim = claim.removesuffix(rows) + (
        "SELECT array_agg(id ORDER BY -priority, ready_at)::text AS ids,"
        " array_agg(lease_token ORDER BY -priority, ready_at)::text AS leases,"
        " coalesce((array_agg(ready_at ORDER BY -priority DESC, ready_at DESC))[1], :c_ready_at) AS ready_at,"
        " coalesce((array_agg(priority ORDER BY -priority DESC, ready_at DESC))[1], :c_priority) AS priority"
        " FROM claimed"
    )
    many = pgbench_text(
        SQL.complete_many,
        {
            "ids": ":c_ids",
            "leases": ":c_leases",
            "results": ":results",
            "owner": ":client_id",
            "scope": "NULL",
            "all_or_none": ":all_or_none",
        },
    )
    text = f"{claim} \\gset c_\n{many};\n"
    variables = {
        **PGB_CLAIM_VARIABLES,
        "n": str(n),
        "results": array_literal([None] * n),
        "all_or_none": "true",  # as Store.complete_many passes it
    }
    return PgbScript(f"batches_{n}", text, variables, n)


def pgb_creates(batch: int, statements: int) -> PgbScript:
    """`statements` create_todos calls of `batch` items each (Store.create: 1,
    Store.create_many: 100), each its own transaction, with the values create_values()
    passes; one SELECT first makes their fresh ids and keys (keys sorted in each batch,
    as the Store sorts them)."""
    values = create_values(["?"] * batch, range(batch), ["?"] * batch, PRODUCER)  # ids, keys: below
    variables = {k: array_literal(v) if isinstance(v, list) else v for k, v in values.items()}
    del variables["ids"], variables["idempotency_keys"]
    fresh = []
    for i in range(1, statements + 1):
        if batch == 1:
            fresh.append(f"'{{td_' || gen_random_uuid() || '}}' AS ids_{i}")
            fresh.append(f"'{{key-' || gen_random_uuid() || '}}' AS keys_{i}")
        else:
            fresh.append(
                f"(SELECT array_agg('td_' || gen_random_uuid())::text"
                f" FROM generate_series(1, {batch})) AS ids_{i}"
            )
            fresh.append(
                f"(SELECT array_agg(k ORDER BY k)::text FROM (SELECT 'key-' || gen_random_uuid() AS k"
                f" FROM generate_series(1, {batch})) AS g) AS keys_{i}"
            )
    lines = ["SELECT " + ",\n       ".join(fresh) + " \\gset"]
    for i in range(1, statements + 1):
        names = {k: f":{k}" for k in CREATE.params}
        names.update(ids=f":ids_{i}", idempotency_keys=f":keys_{i}")
        lines.append(pgbench_text(CREATE, names) + ";")
    return PgbScript(f"create_{batch}", "\n".join(lines) + "\n", variables, batch * statements)


# == end of the baseline statements =======================================================


# -- results -----------------------------------------------------------------------------


@dataclass
class Row:
    series: Series
    versus: Series | None = None
    target: float | None = None  # minimum ratio series/versus
    target_text: str = ""

    @property
    def ratio(self) -> float | None:
        """The median of the per-run ratios: each run's two variants ran back to back."""
        if self.versus is None:
            return None
        return statistics.median(a / b for a, b in zip(self.series.rates, self.versus.rates, strict=True))

    @property
    def verdict(self) -> str:
        if self.target is None or self.ratio is None:
            return ""
        return "PASS" if self.ratio >= self.target else "MISS"


class Results:
    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.rows: list[Row | str] = []  # a str is a section heading
        self.commit_ms: list[float] = []  # commit probes, before and after each family
        self.loads: list[tuple[str, float]] = []  # (family, 1-minute load average as it began)
        self.latencies: list[Latency] = []  # hint wake-up latency
        self.cpu: dict[str, list[float]] = {}  # client CPU ms per todo (the limit family)
        self.wal: dict[str, list[float]] = {}  # WAL bytes per todo, per run (measured())

    def add(self, key: str, label: str, rate: float, wal: Wal | None = None) -> None:
        self.series.setdefault(key, Series(key, label)).rates.append(rate)
        if wal is not None:
            self.wal.setdefault(key, []).append(wal.per_todo(label))

    def get(self, key: str) -> Series | None:
        return self.series.get(key)

    def wal_ratio(self, row: Row) -> float | None:
        """The median of the per-run WAL-per-todo ratios of a row to its `versus`."""
        if row.versus is None:
            return None
        ours, theirs = self.wal.get(row.series.key, []), self.wal.get(row.versus.key, [])
        if not ours or len(ours) != len(theirs):
            return None
        return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


@dataclass
class Wal:
    """The WAL the server inserted during one run, and the todos that run processed."""

    bytes: int
    todos: int

    def per_todo(self, label: str) -> float:
        if self.bytes <= 0 or self.todos <= 0:  # every durable transition writes WAL
            raise RuntimeError(f"{label}: {self.bytes} bytes of WAL for {self.todos} todos")
        return self.bytes / self.todos


async def measured(
    conn: asyncpg.Connection, run: Callable[[], Awaitable[tuple[float, int]]]
) -> tuple[float, int, Wal]:
    """`run()`'s (seconds, todos) and the Wal the server inserted meanwhile: from
    pg_current_wal_insert_lsn() just before it to just after, read on `conn` (any
    connection to the server). Server-wide, so a measure of the run alone on the
    benchmark's own server."""
    position = await harness.wal_position(conn)
    seconds, done = await run()
    return seconds, done, Wal(await harness.wal_since(conn, position), done)


# -- the server's commit latency -------------------------------------------------------


async def commit_probe(conn: asyncpg.Connection, results: Results) -> None:
    """harness.commit_ms, for the header."""
    results.commit_ms.append(await harness.commit_ms(conn))


# -- filling the queue -------------------------------------------------------------------


async def reset(admin: asyncpg.Connection) -> None:
    """Empty the tables, then add SEED_DONE finished todos and their history."""
    await admin.execute("TRUNCATE todos, todo_history, events")
    await admin.execute(
        """WITH made AS (
               INSERT INTO todos (id, queue, title, state, owner, attempt, lease_token,
                                  created_at, claimed_at, completed_at)
               SELECT 'td_seed_' || g, $2, 'seed ' || g, 'done', 'seed', 1, 1,
                      now() - interval '1 hour', now() - interval '1 hour',
                      now() - interval '1 hour'
               FROM generate_series(1, $1) AS g
               RETURNING id
           )
           INSERT INTO todo_history (todo_id, from_state, to_state, actor_kind, actor, attempt, note)
           SELECT id, 'claimed', 'done', 'agent', 'seed', 1, 'completed' FROM made""",
        SEED_DONE,
        QUEUE,
    )


async def fill(admin: asyncpg.Connection, n: int) -> None:
    """Reset, enqueue n pending todos, vacuum, analyze and checkpoint."""
    await reset(admin)
    await enqueue_pending(admin, n)
    await harness.settle(admin)


# -- connections and timing --------------------------------------------------------------


@contextlib.asynccontextmanager
async def connections(dsn: str, n: int, *, codec: bool):
    """n connections: plain asyncpg (codec=False) or the app's (jsonb as Python objects).

    Both run with the app's server settings (generic plans), so the baseline differs from
    the store only in what Python does around the same statements."""
    opened: list[asyncpg.Connection] = []
    try:
        for _ in range(n):
            opened.append(
                await (
                    dbmod.connect(dsn)
                    if codec
                    else asyncpg.connect(dsn, server_settings=dbmod.SERVER_SETTINGS)
                )
            )
        yield opened
    finally:
        for conn in opened:
            await conn.close()


class NoHints:
    """The hints a Store is given for "no hints at all": send() does nothing."""

    def send(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None:
        return None


NO_HINTS = NoHints()


async def start_hub(hub: Hub) -> None:
    await hub.start()
    if not hub.connected.is_set():
        raise RuntimeError("the hub did not connect")


@contextlib.asynccontextmanager
async def stores(dsn: str, n: int, *, pool: bool, hints: HintSink | None = NO_HINTS):
    """n Stores, each on its own connection, or all on one pool of n connections.

    Without `hints` they send none, as the baseline loop and pgbench send none: the
    comparisons with those measure the Store itself; what hints cost is measured apart
    (family "hints", and create_many with a Hub)."""
    if pool:
        shared = await dbmod.create_pool(dsn, min_size=n, max_size=n)
        try:
            yield [Store(shared, hints=hints) for _ in range(n)]
        finally:
            await shared.close()
    else:
        async with connections(dsn, n, codec=True) as conns:
            yield [Store(c, hints=hints) for c in conns]


# -- workers: the store ------------------------------------------------------------------


async def store_claim_complete(store: Store, owner: str) -> int:
    done = 0
    while (todo := await store.claim_next([QUEUE], owner, TTL)) is not None:
        await store.complete(todo.id, owner, todo.lease_token)
        done += 1
    return done


async def store_complete_and_claim_next(store: Store, owner: str) -> int:
    done = 0
    todo = await store.claim_next([QUEUE], owner, TTL)
    while todo is not None:
        _, todo = await store.complete_and_claim_next(todo.id, owner, todo.lease_token, None, [QUEUE], TTL)
        done += 1
    return done


async def store_batches(store: Store, owner: str) -> int:
    done = 0
    while batch := await store.claim_batch([QUEUE], owner, TTL, BATCH_CLAIM):
        await store.complete_many(owner, [(t.id, t.lease_token, None) for t in batch])
        done += len(batch)
    return done


async def store_claim_complete_n(store: Store, owner: str, count: int) -> int:
    """claim_next + complete, `count` times (the limit's Store side: as many as a pgbench client)."""
    for _ in range(count):
        todo = await store.claim_next([QUEUE], owner, TTL)
        if todo is None:
            raise RuntimeError("the queue ran dry")
        await store.complete(todo.id, owner, todo.lease_token)
    return count


async def store_complete_and_claim_next_n(store: Store, owner: str, count: int) -> int:
    """One claim, then `count` complete_and_claim_next: `count` done, the last one claimed."""
    todo = await store.claim_next([QUEUE], owner, TTL)
    for _ in range(count):
        if todo is None:
            raise RuntimeError("the queue ran dry")
        _, todo = await store.complete_and_claim_next(todo.id, owner, todo.lease_token, None, [QUEUE], TTL)
    return count


async def store_batches_n(store: Store, owner: str, count: int) -> int:
    """claim_batch(10) + complete_many, `count` times."""
    done = 0
    for _ in range(count):
        batch = await store.claim_batch([QUEUE], owner, TTL, BATCH_CLAIM)
        await store.complete_many(owner, [(t.id, t.lease_token, None) for t in batch])
        done += len(batch)
    return done


async def store_enqueue_one(store: Store, items: list[NewTodo]) -> int:
    for item in items:
        await store.create(item)
    return len(items)


async def store_enqueue_batches(store: Store, batches: list[list[NewTodo]]) -> int:
    total = 0
    for batch in batches:
        total += len(await store.create_many(batch))
    return total


# -- scenario families -------------------------------------------------------------------


def rate_line(label: str, n: int, seconds: float, wal: Wal | None = None) -> float:
    rate = n / seconds
    wal_text = f", {wal.bytes / n:,.0f} B of WAL per todo" if wal else ""
    log(f"  {label:<58} {rate:>9,.0f} todos/s  ({n} in {seconds:.2f} s{wal_text})")
    return rate


async def timed_enqueue(
    admin: asyncpg.Connection, results: Results, key: str, label: str, run, n: int
) -> None:
    """One enqueue measurement on emptied, settled tables: `run()` must enqueue `n` todos."""
    await reset(admin)
    await harness.settle(admin)
    seconds, made, wal = await measured(admin, run)
    if made != n:
        raise RuntimeError(f"{label}: enqueued {made} of {n}")
    await harness.expect_states(admin, {"pending": n, "done": SEED_DONE}, label)
    results.add(key, label, rate_line(label, n, seconds, wal), wal)


async def family_claim(server: Server, args, results: Results, _tmp: Path) -> None:
    """claim+complete of pre-enqueued todos: baseline, Store, complete_and_claim_next."""
    dsn = await server.new_database("claim", check=check_parameters)
    n = args.todos
    admin = await asyncpg.connect(dsn)

    def consume(worker: Callable, pooled: bool | None):
        async def run(workers: int) -> tuple[float, int]:
            if pooled is None:
                async with connections(dsn, workers, codec=False) as conns:
                    return await timed([worker(c, f"w{i}") for i, c in enumerate(conns)])
            async with stores(dsn, workers, pool=pooled) as ss:
                return await timed([worker(s, f"w{i}") for i, s in enumerate(ss)])

        return run

    await commit_probe(admin, results)
    variants = [
        ("base", "baseline SQL loop: claim, complete", consume(baseline_claim_complete, None)),
        ("store", "Store.claim_next + Store.complete", consume(store_claim_complete, args.pool)),
        ("cacn", "Store.complete_and_claim_next", consume(store_complete_and_claim_next, args.pool)),
    ]
    try:
        for rep in range(args.runs):
            for workers in WORKER_COUNTS:
                log(f"[claim] run {rep + 1}/{args.runs}, {workers} worker(s)")
                for key, label, run in rotated(variants, rep):
                    await fill(admin, n)
                    seconds, done, wal = await measured(admin, functools.partial(run, workers))
                    if done != n:
                        raise RuntimeError(f"{label}: processed {done} of {n}")
                    await harness.expect_states(admin, {"done": n + SEED_DONE}, label)
                    full = f"{label}, {workers} worker{'s' if workers > 1 else ''}"
                    results.add(f"{key}@{workers}", full, rate_line(full, n, seconds, wal), wal)
        await commit_probe(admin, results)
    finally:
        await admin.close()


async def rollup_job(dsn: str, stop: asyncio.Event) -> None:
    """The rollup job (dashboard/rollups.py) at its worst for the claim path: every
    ROLLUP_EVERY it rolls the last 60,000 history rows again (in production each row is
    rolled once), and every SAMPLE_EVERY it samples the backlog, as the reaper loop does."""
    conn = await dbmod.connect(dsn)
    rollups = Rollups(conn)
    next_sample = 0.0
    try:
        while not stop.is_set():
            await conn.execute(  # a minute of history at the throughput measured here, again
                "UPDATE rollup_progress SET rolled_id = greatest(0, rolled_id - 60000)"
            )
            await rollups.roll()
            if time.monotonic() >= next_sample:
                await rollups.sample()
                next_sample = time.monotonic() + reaper.SAMPLE_EVERY
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), reaper.ROLLUP_EVERY)
    finally:
        await conn.close()


async def family_rollups(server: Server, args, results: Results, _tmp: Path) -> None:
    """complete_and_claim_next at 4 workers, with the rollup job running and without."""
    dsn = await server.new_database("rollups", check=check_parameters)
    n = args.todos * 4  # long enough for several rollup passes
    admin = await asyncpg.connect(dsn)

    async def run(with_job: bool) -> tuple[float, int]:
        stop = asyncio.Event()
        job = asyncio.create_task(rollup_job(dsn, stop)) if with_job else None
        try:
            async with stores(dsn, 4, pool=args.pool) as ss:
                return await timed([store_complete_and_claim_next(s, f"w{i}") for i, s in enumerate(ss)])
        finally:
            stop.set()
            if job is not None:
                await job

    variants = [
        ("norollup", "Store.complete_and_claim_next, no rollup job", lambda: run(False)),
        ("rollup", "Store.complete_and_claim_next, rollup job running", lambda: run(True)),
    ]
    try:
        for rep in range(args.runs):
            log(f"[rollups] run {rep + 1}/{args.runs}, 4 workers")
            for key, label, go in rotated(variants, rep):
                await fill(admin, n)
                seconds, done, wal = await measured(admin, go)
                if done != n:
                    raise RuntimeError(f"{label}: processed {done} of {n}")
                results.add(key, f"{label}, 4 workers", rate_line(label, n, seconds, wal), wal)
    finally:
        await admin.close()


async def family_batch(server: Server, args, results: Results, _tmp: Path) -> None:
    """Store.claim_batch(10) + complete_many at 4 workers, against PgQueuer on the side."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        log("[batch] pgqueuer is not installed (pip install -e '.[bench]'); skipped")
        return
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    workers = 4
    n = args.batched_todos
    dsn = await server.new_database("batch", check=check_parameters)
    pgq_dsn = await server.new_empty_database("pgqueuer")
    admin = await asyncpg.connect(dsn)
    pgq_admin = await asyncpg.connect(pgq_dsn)
    try:
        await install_pgqueuer(pgq_admin)
        await harness.check_durable(pgq_admin)
        await commit_probe(admin, results)

        async def ours() -> tuple[float, int, Wal]:
            await fill(admin, n)
            async with stores(dsn, workers, pool=args.pool) as ss:
                seconds, done, wal = await measured(
                    admin, lambda: timed([store_batches(s, f"w{i}") for i, s in enumerate(ss)])
                )
            await harness.expect_states(admin, {"done": n + SEED_DONE}, "claim_batch + complete_many")
            return seconds, done, wal

        async def theirs() -> tuple[float, int, Wal]:
            return await run_pgqueuer(pgq_dsn, pgq_admin, n, workers)

        variants = [
            ("batch", f"Store.claim_batch({BATCH_CLAIM}) + complete_many, 4 workers", ours),
            ("pgq", f"PgQueuer {pgqueuer_version()} QueueManager, batch {BATCH_CLAIM}, 4 workers", theirs),
        ]
        for rep in range(args.runs):
            log(f"[batch] run {rep + 1}/{args.runs}")
            for key, label, run in rotated(variants, rep):
                seconds, done, wal = await run()
                if done != n:
                    raise RuntimeError(f"{label}: processed {done} of {n}")
                results.add(key, label, rate_line(label, n, seconds, wal), wal)
        await commit_probe(admin, results)
    finally:
        await admin.close()
        await pgq_admin.close()


def pgqueuer_version() -> str:
    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return "?"


async def install_pgqueuer(conn: asyncpg.Connection) -> None:
    """PgQueuer's own installer (what `pgq install` runs), default (durable) settings."""
    from pgqueuer import Queries

    await Queries.from_asyncpg_connection(conn).install()


async def run_pgqueuer(dsn: str, admin: asyncpg.Connection, n: int, workers: int):
    """n jobs, `workers` QueueManagers (one connection each), default batch size, no-op job.

    The jobs are enqueued, vacuumed and checkpointed first, as on our side. Worker start-up
    (schema checks, LISTEN) is kept out of the timing: an open transaction holds an
    EXCLUSIVE lock on the queue table until every worker waits on it in its first
    dequeue; the clock starts as it is released. It stops when every job has run and every
    worker has shut down, which flushes the buffered completions (the job rows are then
    gone from the queue table, checked afterwards). The WAL is counted over the same span.
    """
    from pgqueuer import Queries, QueueManager

    settings = Queries.from_asyncpg_connection(admin).qbe.settings
    table = settings.queue_table
    await admin.execute(f"TRUNCATE {table}, {settings.queue_table_log}, {settings.statistics_table}")
    filler = Queries.from_asyncpg_connection(admin)
    for start in range(0, n, FILL_CHUNK):
        size = min(FILL_CHUNK, n - start)
        await filler.enqueue(
            [QUEUE] * size,
            [f'{{"n": {i}}}'.encode() for i in range(start, start + size)],
            [0] * size,
        )
    await admin.execute(f"VACUUM ANALYZE {table}, {settings.queue_table_log}")
    await harness.checkpoint(admin)

    ran = 0
    all_ran = asyncio.Event()

    async with connections(dsn, workers, codec=False) as conns:
        managers = [QueueManager(Queries.from_asyncpg_connection(c)) for c in conns]
        for qm in managers:

            @qm.entrypoint(QUEUE)
            async def noop(job) -> None:
                nonlocal ran
                ran += 1
                if ran >= n:
                    all_ran.set()

        pids = [c.get_server_pid() for c in conns]
        gate = admin.transaction()
        await gate.start()
        tasks: list[asyncio.Task] = []
        try:
            await admin.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
            tasks = [asyncio.create_task(qm.run(batch_size=BATCH_CLAIM)) for qm in managers]
            deadline = time.monotonic() + 30
            while (
                await admin.fetchval(
                    "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND pid = ANY($1)",
                    pids,
                )
                < workers
            ):
                if time.monotonic() > deadline or any(t.done() for t in tasks):
                    raise RuntimeError("PgQueuer workers did not reach their first dequeue")
                await asyncio.sleep(0.005)
            position = await harness.wal_position(admin)
            start = time.perf_counter()
            await gate.commit()
            gate = None
            await asyncio.wait_for(all_ran.wait(), timeout=600)
            for qm in managers:
                qm.shutdown.set()
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - start
            wal = Wal(await harness.wal_since(admin, position), ran)
        finally:
            if gate is not None:
                await gate.rollback()
            for qm in managers:
                qm.shutdown.set()
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    left = await admin.fetchval(f"SELECT count(*) FROM {table}")
    if left:
        raise RuntimeError(f"PgQueuer: {left} jobs still in {table} after the run")
    return elapsed, ran, wal


def enqueue_items(n: int) -> list[NewTodo]:
    """The todos every enqueue measurement creates: key-00000000 … with a small payload."""
    return [
        NewTodo(
            queue=QUEUE,
            title=f"todo {i}",
            kind="bench",
            source="bench",
            payload={"n": i},
            idempotency_key=f"key-{i:08d}",
        )
        for i in range(n)
    ]


async def family_enqueue(server: Server, args, results: Results, _tmp: Path) -> None:
    """Enqueue one at a time and in batches of 100 (4 producers); what hints through a Hub
    cost the batches."""
    dsn = await server.new_database("enqueue", check=check_parameters)
    admin = await asyncpg.connect(dsn)
    total = max(args.todos, args.batched_todos)
    raw = [(i, f"key-{i:08d}") for i in range(total)]
    items = enqueue_items(total)
    one_raw, one_items = raw[: args.todos], items[: args.todos]
    many_raw, many_items = raw[: args.batched_todos], items[: args.batched_todos]

    def split(seq: list) -> list[list]:
        return [seq[p::PRODUCERS] for p in range(PRODUCERS)]

    def chunks(seq: list) -> list[list]:
        return [seq[i : i + ENQUEUE_BATCH] for i in range(0, len(seq), ENQUEUE_BATCH)]

    async def base_one():
        async with connections(dsn, PRODUCERS, codec=False) as conns:
            return await timed(
                [baseline_enqueue_one(c, part) for c, part in zip(conns, split(one_raw), strict=True)]
            )

    async def store_one():
        async with stores(dsn, PRODUCERS, pool=args.pool) as ss:
            return await timed(
                [store_enqueue_one(s, part) for s, part in zip(ss, split(one_items), strict=True)]
            )

    async def base_many():
        async with connections(dsn, PRODUCERS, codec=False) as conns:
            return await timed(
                [
                    baseline_enqueue_batches(c, part)
                    for c, part in zip(conns, split(chunks(many_raw)), strict=True)
                ]
            )

    def store_many(hints):
        async def run():
            async with stores(dsn, PRODUCERS, pool=args.pool, hints=hints) as ss:
                return await timed(
                    [
                        store_enqueue_batches(s, part)
                        for s, part in zip(ss, split(chunks(many_items)), strict=True)
                    ]
                )

        return run

    hub = Hub(dsn)
    groups = [
        [
            ("enq1_base", "baseline SQL loop: create_todos with 1 item, 4 producers", base_one),
            ("enq1_store", "Store.create, 4 producers", store_one),
        ],
        [
            (
                "enqN_base",
                f"baseline SQL loop: create_todos with {ENQUEUE_BATCH} items, 4 producers",
                base_many,
            ),
            ("enqN_store", f"Store.create_many({ENQUEUE_BATCH}), 4 producers", store_many(NO_HINTS)),
            (
                "enqN_hub",
                f"Store.create_many({ENQUEUE_BATCH}), 4 producers, hints through a Hub",
                store_many(hub),
            ),
        ],
    ]
    try:
        await start_hub(hub)
        await commit_probe(admin, results)
        for rep in range(args.runs):
            log(f"[enqueue] run {rep + 1}/{args.runs}")
            for group in groups:
                for key, label, run in rotated(group, rep):
                    n = args.todos if key.startswith("enq1") else args.batched_todos
                    await timed_enqueue(admin, results, key, label, run, n)
        await commit_probe(admin, results)
    finally:
        await hub.stop()
        await admin.close()


# -- the limit: the Store side by side with pgbench on the same statements ----------------

LIMIT_CLIENTS = 4
SEED_PERF = Path(__file__).resolve().parent / "seed_perf"  # the seed's bare statements


def seed_statements(name: str) -> list[str]:
    """The statements of seed_perf/`name`, one by one (comment lines dropped)."""
    text = "\n".join(
        line for line in (SEED_PERF / name).read_text().splitlines() if not line.lstrip().startswith("--")
    )
    return [part.strip() for part in text.split(";") if part.strip()]


async def seed_fill(bare: asyncpg.Connection) -> None:
    """The seed's fill.sql (200,000 pending rows, VACUUM ANALYZE, CHECKPOINT)."""
    for statement in seed_statements("fill.sql"):
        if statement.upper() == "CHECKPOINT":
            await harness.checkpoint(bare)
        else:
            await bare.execute(statement)


def client_cpu() -> float:
    """CPU seconds used so far on the client side: this process and its finished children
    (pgbench)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def per_client(n: int, todos_per_transaction: int) -> int:
    """pgbench transactions per client (-t) for about n todos over LIMIT_CLIENTS clients."""
    return max(1, n // (LIMIT_CLIENTS * todos_per_transaction))


async def family_limit(server: Server, args, results: Results, tmp: Path) -> None:
    """The Store at 4 workers against pgbench running the same statements on 4 clients
    (the limit for these statements on this machine), and our pgbench figures against the
    seed's bare statements on their own schema."""
    dsn = await server.new_database("limit", check=check_parameters)
    bare_dsn = await server.new_empty_database("bare")
    admin = await asyncpg.connect(dsn)
    bare = await asyncpg.connect(bare_dsn)
    clients = LIMIT_CLIENTS
    try:
        for statement in seed_statements("schema.sql"):
            await bare.execute(statement)
        await harness.check_durable(bare)
        await commit_probe(admin, results)

        async def ours(script: PgbScript, transactions: int) -> tuple[float, int]:
            run = await run_pgbench(dsn, script, clients=clients, transactions=transactions, tmp=tmp)
            return run.seconds, run.transactions * script.todos

        async def theirs(name: str, transactions: int) -> tuple[float, int]:
            script = (SEED_PERF / name).read_text()
            run = await harness.pgbench(
                bare_dsn, script, clients=clients, transactions=transactions, tmp=tmp, name=f"seed_{name}"
            )
            return run.seconds, run.transactions

        def split(seq: list, parts: int = clients) -> list[list]:
            return [seq[p::parts] for p in range(parts)]

        async def on_stores(worker, *per_worker) -> tuple[float, int]:
            async with stores(dsn, clients, pool=args.pool, hints=NO_HINTS) as ss:
                return await timed(
                    [worker(st, f"w{i}", *(a[i] for a in per_worker)) for i, st in enumerate(ss)]
                )

        def producing(worker):
            """A producer (no owner) as a worker."""
            return lambda store, _owner, part: worker(store, part)

        # (key, label, prepare, run, expected states after): one todo per transaction, then batches.
        cc_script, cacn_script, batch_script, create_script, many_script = pgbench_scripts()
        t_cc = per_client(args.todos, 1)
        t_batch = per_client(args.batched_todos // 2, BATCH_CLAIM)
        t_create = per_client(args.todos, create_script.todos)
        t_many = per_client(args.batched_todos // 2, many_script.todos)
        n_cc, n_batch = clients * t_cc, clients * t_batch * BATCH_CLAIM
        n_create, n_many = clients * t_create * create_script.todos, clients * t_many * many_script.todos
        create_items, many_items = enqueue_items(n_create), enqueue_items(n_many)
        many_batches = [many_items[i : i + ENQUEUE_BATCH] for i in range(0, n_many, ENQUEUE_BATCH)]
        slack = clients * BATCH_CLAIM  # left pending after the batched runs, so no claim comes up short

        async def filled(n: int) -> None:
            await fill(admin, n)

        async def emptied() -> None:
            await reset(admin)
            await harness.settle(admin)

        async def seed_filled() -> None:
            await seed_fill(bare)

        async def seed_done(expected: int) -> None:
            done = await bare.fetchval("SELECT count(*) FROM todos WHERE state = 'done'")
            if done != expected:
                raise RuntimeError(f"the seed's claim + complete: {done} done, expected {expected}")

        async def seed_added(expected: int) -> None:
            rows = await bare.fetchval("SELECT count(*) FROM todos")
            if rows != 200_000 + expected:
                raise RuntimeError(f"the seed's enqueue: {rows} rows, expected {200_000 + expected}")

        def states(expected: dict[str, int], label: str):
            return lambda: harness.expect_states(admin, expected, label)

        cc_done = {"done": n_cc + SEED_DONE}
        groups = [
            [
                (
                    "lim_cc",
                    "Store.claim_next + Store.complete",
                    lambda: filled(n_cc),
                    lambda: on_stores(store_claim_complete_n, [t_cc] * clients),
                    states(cc_done, "Store claim + complete"),
                ),
                (
                    "pgb_cc",
                    "pgbench: claim_batch(n=1) + complete",
                    lambda: filled(n_cc),
                    lambda: ours(cc_script, t_cc),
                    states(cc_done, "pgbench claim + complete"),
                ),
                (
                    "bare_cc",
                    "pgbench: the seed's bare claim + complete",
                    seed_filled,
                    lambda: theirs("pgb_claim_complete.sql", t_cc),
                    lambda: seed_done(n_cc),
                ),
            ],
            [
                (
                    "lim_cacn",
                    "Store.complete_and_claim_next",
                    lambda: filled(n_cc + clients),
                    lambda: on_stores(store_complete_and_claim_next_n, [t_cc] * clients),
                    states({**cc_done, "claimed": clients}, "Store complete_and_claim_next"),
                ),
                (
                    "pgb_cacn",
                    "pgbench: complete_and_claim_next",
                    lambda: filled(n_cc + clients),
                    lambda: ours(cacn_script, t_cc),
                    states({**cc_done, "claimed": clients}, "pgbench complete_and_claim_next"),
                ),
            ],
            [
                (
                    "lim_batch",
                    f"Store.claim_batch({BATCH_CLAIM}) + complete_many",
                    lambda: filled(n_batch + slack),
                    lambda: on_stores(store_batches_n, [t_batch] * clients),
                    states({"done": n_batch + SEED_DONE, "pending": slack}, "Store batches"),
                ),
                (
                    "pgb_batch",
                    f"pgbench: claim_batch(n={BATCH_CLAIM}) + complete_many",
                    lambda: filled(n_batch + slack),
                    lambda: ours(batch_script, t_batch),
                    states({"done": n_batch + SEED_DONE, "pending": slack}, "pgbench batches"),
                ),
            ],
            [
                (
                    "lim_create",
                    "Store.create (one todo per call)",
                    emptied,
                    lambda: on_stores(producing(store_enqueue_one), split(create_items)),
                    states({"pending": n_create, "done": SEED_DONE}, "Store.create"),
                ),
                (
                    "pgb_create",
                    "pgbench: create_todos with 1 item",
                    emptied,
                    lambda: ours(create_script, t_create),
                    states({"pending": n_create, "done": SEED_DONE}, "pgbench create_todos"),
                ),
                (
                    "bare_enq",
                    "pgbench: the seed's bare enqueue",
                    seed_filled,
                    lambda: theirs("pgb_enqueue.sql", n_create // clients),
                    lambda: seed_added(n_create),
                ),
            ],
            [
                (
                    "lim_many",
                    f"Store.create_many({ENQUEUE_BATCH})",
                    emptied,
                    lambda: on_stores(producing(store_enqueue_batches), split(many_batches)),
                    states({"pending": n_many, "done": SEED_DONE}, "Store.create_many"),
                ),
                (
                    "pgb_many",
                    f"pgbench: create_todos with {ENQUEUE_BATCH} items",
                    emptied,
                    lambda: ours(many_script, t_many),
                    states({"pending": n_many, "done": SEED_DONE}, "pgbench create_todos(100)"),
                ),
            ],
        ]
        for rep in range(args.runs):
            log(f"[limit] run {rep + 1}/{args.runs}, {clients} workers / pgbench clients")
            for group in groups:
                for key, label, prepare, run, check in rotated(group, rep):
                    await prepare()
                    cpu = client_cpu()
                    seconds, done, wal = await measured(admin, run)
                    cpu = client_cpu() - cpu
                    await check()
                    results.add(key, label, rate_line(label, done, seconds, wal), wal)
                    results.cpu.setdefault(key, []).append(cpu * 1000 / done)
        await commit_probe(admin, results)
    finally:
        await admin.close()
        await bare.close()


# -- hints: what sending them costs an enqueue, and how soon they wake a waiter -----------

HINT_PRODUCERS = (1, 4, 8)
WAKE_QUEUE = "bench-wake"  # the wake-up samples' queue (the load goes to QUEUE)
WAKE_TARGET_MS = 25.0  # p95, enqueue committed -> waiting subscription in another process
LISTENER = Path(__file__).resolve().parent / "hint_listener.py"


@dataclass
class Latency:
    label: str
    from_return: list[float]  # ms from Store.create() returning (committed) to the wake-up
    from_call: list[float]  # ms from calling Store.create() to the wake-up
    lost: int = 0  # enqueues whose wake-up did not come within WAKE_WAIT

    @property
    def p95(self) -> float:
        return pct(self.from_return, 95)

    @property
    def verdict(self) -> str:
        return "PASS" if self.from_return and not self.lost and self.p95 <= WAKE_TARGET_MS else "MISS"


WAKE_WAIT = 2.0  # seconds a sample waits for its wake-up before it counts as lost


async def family_hints(server: Server, args, results: Results, _tmp: Path) -> None:
    """Store.create at 1, 4 and 8 producers with hints through the process's Hub, with
    none at all, and (for context) with hints=None, the Store's own NOTIFY statement after
    each commit; then the wake-up latency from a committed enqueue to a subscription in
    another process, idle and under load."""
    dsn = await server.new_database("hints", check=check_parameters)
    admin = await asyncpg.connect(dsn)
    hub = Hub(dsn)
    n = args.todos
    items = enqueue_items(n)

    def produce(producers: int, hints: HintSink | None):
        async def run() -> tuple[float, int]:
            parts = [items[p::producers] for p in range(producers)]
            async with stores(dsn, producers, pool=args.pool, hints=hints) as ss:
                return await timed([store_enqueue_one(st, part) for st, part in zip(ss, parts, strict=True)])

        return run

    def plural(p: int) -> str:
        return f"{p} producer{'s' if p > 1 else ''}"

    groups = [
        [
            (f"hub@{p}", f"Store.create, {plural(p)}, hints through the Hub", produce(p, hub)),
            (f"nohints@{p}", f"Store.create, {plural(p)}, no hints at all", produce(p, NO_HINTS)),
            (f"ownhint@{p}", f"Store.create, {plural(p)}, hints=None (own NOTIFY)", produce(p, None)),
        ]
        for p in HINT_PRODUCERS
    ]
    idle = Latency("idle: one enqueue at a time", [], [])
    busy = Latency(f"under load: 4 producers enqueue into {QUEUE!r} meanwhile", [], [])
    try:
        await start_hub(hub)
        await commit_probe(admin, results)
        for rep in range(args.runs):
            for group in groups:
                log(f"[hints] run {rep + 1}/{args.runs}, {group[0][1].split(', ')[1]}")
                for key, label, run in rotated(group, rep):
                    await timed_enqueue(admin, results, key, label, run, n)
            for latency, load in rotated([(idle, False), (busy, True)], rep):
                await reset(admin)
                await harness.settle(admin)
                await wake_latency(dsn, hub, latency, args.wake_samples, load=load)
        await commit_probe(admin, results)
    finally:
        await hub.stop()
        await admin.close()
    results.latencies += [idle, busy]


async def wake_latency(dsn: str, hub: Hub, into: Latency, samples: int, *, load: bool) -> None:
    """`samples` enqueues into WAKE_QUEUE through a Store with `hub`, each after a short
    random pause, timed to the wake-up of a subscription in hint_listener.py (another
    process, its own hub); with `load`, 4 producers enqueue into QUEUE through the same
    hub meanwhile."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(LISTENER),
        dsn,
        WAKE_QUEUE,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        cwd=harness.ROOT,
    )
    stop = asyncio.Event()
    loaders: list[asyncio.Task] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if line.strip() != b"ready":
                raise RuntimeError(f"hint_listener.py did not start: {line!r}")
            conn = await dbmod.connect(dsn)
            stack.push_async_callback(conn.close)
            store = Store(conn, hints=hub)
            if load:

                async def producer(st: Store, p: int) -> None:
                    i = 0
                    while not stop.is_set():
                        await st.create(NewTodo(queue=QUEUE, title=f"load {p}-{i}", payload={"n": i}))
                        i += 1

                load_stores = await stack.enter_async_context(stores(dsn, 4, pool=False, hints=hub))
                loaders = [asyncio.create_task(producer(st, p)) for p, st in enumerate(load_stores)]
                await asyncio.sleep(0.5)  # let the load get going
            try:
                await wake_samples(proc, store, into, samples)
            finally:
                stop.set()
                await asyncio.gather(*loaders)
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.terminate()  # by its pid: the one process this function started
            await proc.wait()


async def wake_samples(proc, store: Store, into: Latency, samples: int) -> None:
    for i in range(samples):
        await asyncio.sleep(random.uniform(0.005, 0.015))
        called = time.monotonic()
        await store.create(NewTodo(queue=WAKE_QUEUE, title=f"wake {i}"))
        returned = time.monotonic()
        deadline = returned + WAKE_WAIT
        while True:  # a late wake-up of an earlier sample is skipped
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                into.lost += 1
                break
            woke = float(line.split()[0])
            if woke >= called:
                into.from_return.append((woke - returned) * 1000)
                into.from_call.append((woke - called) * 1000)
                break


# -- the report --------------------------------------------------------------------------


def build_rows(results: Results) -> None:
    rows = results.rows
    s = results.get

    def row(key: str, versus: str | None = None, target: float | None = None, text=""):
        if s(key) is None:
            return
        rows.append(Row(s(key), s(versus) if versus else None, target, text))

    if s("base@1") or s("base@4"):
        rows.append("claim + complete of pre-enqueued todos (one todo per claim)")
    for w in WORKER_COUNTS:
        row(f"base@{w}")
    for w in WORKER_COUNTS:
        row(f"store@{w}", f"base@{w}", 0.85 if w == 4 else None, "≥ 0.85×" if w == 4 else "")
    for w in WORKER_COUNTS:
        row(f"cacn@{w}", f"base@{w}", 1.4 if w == 4 else None, "≥ 1.40×" if w == 4 else "")
    if s("norollup"):
        rows.append("claim + complete while the rollup job runs (dashboard/rollups.py)")
    row("norollup")
    row("rollup", "norollup", 0.95, "≥ 0.95×")
    if s("batch") and s("pgq"):
        rows.append("batched claim + batched completion, side by side with PgQueuer")
        row("pgq")
        row("batch", "pgq", 1.2, "≥ 1.20×")
    if s("enq1_base"):
        rows.append("enqueue, 4 producers (each todo: idempotency key, small payload)")
    row("enq1_base")
    row("enq1_store", "enq1_base", 0.85, "≥ 0.85×")
    row("enqN_base")
    row("enqN_store", "enqN_base", 0.9, "≥ 0.90×")
    # "at most 15% slower": the run with hints takes at most 1.15 times as long.
    row("enqN_hub", "enqN_store", 1 / 1.15, "≤ 15% slower")
    if s("pgb_cc") or s("pgb_create"):
        rows.append("the limit: the Store against pgbench running the same statements (4 workers / clients)")
    for scenario in ("cc", "cacn", "batch", "create", "many"):
        row(f"pgb_{scenario}")
        row(f"lim_{scenario}", f"pgb_{scenario}", 0.85, "≥ 0.85×")
    if s("bare_cc"):
        rows.append("our statements against the seed's bare ones (pgbench, 4 clients, own schemas)")
    row("bare_cc")
    row("pgb_cc", "bare_cc", 0.75, "≥ 0.75×")
    row("bare_enq")
    row("pgb_create", "bare_enq")
    if s("nohints@1"):
        rows.append("enqueue with hints: Store.create, one todo per call, each producer on its connection")
    for p in HINT_PRODUCERS:
        row(f"nohints@{p}")
        row(f"hub@{p}", f"nohints@{p}", 0.9, "≥ 0.90×")
        row(f"ownhint@{p}", f"nohints@{p}")


def render(results: Results, header: list[str]) -> str:
    rows: list[tuple[str, ...]] = [
        (
            "scenario",
            "todos/s",
            "spread",
            "ratio",
            "vs",
            "target",
            "result",
            "client CPU/todo",
            "WAL B/todo",
            "WAL ratio",
        )
    ]
    names = {}
    for r in results.rows:
        if isinstance(r, Row):
            names[r.series.key] = short_name(r.series.key)
    for r in results.rows:
        if isinstance(r, str):
            rows.append((r,))
            continue
        rows.append(
            (
                r.series.label,
                *r.series.rate_cells(),
                "" if r.ratio is None else f"{r.ratio:.2f}×",
                "" if r.versus is None else names.get(r.versus.key, r.versus.key),
                r.target_text,
                r.verdict,
                cpu_cell(results.cpu.get(r.series.key)),
                wal_cell(results.wal.get(r.series.key)),
                "" if (wal := results.wal_ratio(r)) is None else f"{wal:.2f}×",
            )
        )
    out = [*header, "", *table(rows, {1, 2, 3, 7, 8, 9})]
    if results.cpu:
        out.append(
            "client CPU/todo: CPU time of the client side (this process for the Store, pgbench for "
            "pgbench) per todo, median; the server shares the same cores"
        )
    if results.wal:
        out.append(
            "WAL B/todo: bytes of WAL the server inserted during the run (pg_wal_lsn_diff of "
            "pg_current_wal_insert_lsn() after and before) / todos processed, median; each run starts "
            "after a CHECKPOINT, so full-page images are in it; WAL ratio: median of the per-run "
            "ratios to the 'vs' row. Server-wide: it counts whatever else writes to the server"
        )
    if results.latencies:
        out += ["", *latency_table(results.latencies)]
    return "\n".join(out)


def latency_table(latencies: list[Latency]) -> list[str]:
    heading = "hint wake-up, Store.create with the Hub -> another process's hub"
    rows: list[tuple[str, ...]] = [
        (heading, "samples", "p50", "p95", "max", "p95 from the call", "lost", "target", "result")
    ]
    for lat in latencies:
        ms = lat.from_return
        rows.append(
            (
                lat.label,
                f"{len(ms)}",
                f"{pct(ms, 50):.1f} ms",
                f"{pct(ms, 95):.1f} ms",
                f"{max(ms, default=float('nan')):.1f} ms",
                f"{pct(lat.from_call, 95):.1f} ms",
                f"{lat.lost}",
                f"p95 ≤ {WAKE_TARGET_MS:.0f} ms",
                lat.verdict,
            )
        )
    return [
        *table(rows, {1, 2, 3, 4, 5, 6}),
        "(from create() returning, i.e. after its commit, to the wait's return in hint_listener.py;"
        " 'from the call' includes the enqueue itself)",
    ]


def cpu_cell(values: list[float] | None) -> str:
    return f"{statistics.median(values):.3f} ms" if values else ""


# Settings that change how much WAL a todo writes (with checksums, hint bits set after a
# checkpoint log full pages too), printed in the header.
WAL_SETTINGS = ("data_checksums", "wal_compression", "wal_level", "full_page_writes")


def wal_cell(values: list[float] | None) -> str:
    return f"{statistics.median(values):,.0f}" if values else ""


def load_text(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def probe_range(values: list[float]) -> str:
    if not values:
        return "not probed"
    low, high = min(values), max(values)
    return f"{low:.2f} ms" if high - low < 0.005 else f"{low:.2f}-{high:.2f} ms"


def short_name(key: str) -> str:
    base, _, workers = key.partition("@")
    names = {
        "base": "baseline",
        "store": "claim_next+complete",
        "cacn": "complete_and_claim",
        "pgq": "PgQueuer",
        "batch": "claim_batch",
        "enq1_base": "baseline 1/call",
        "enq1_store": "Store.create",
        "enqN_base": "baseline 100/call",
        "enqN_store": "create_many",
        "pgb_cc": "pgbench",
        "pgb_cacn": "pgbench",
        "pgb_batch": "pgbench",
        "pgb_create": "pgbench",
        "pgb_many": "pgbench",
        "bare_cc": "seed's bare",
        "bare_enq": "seed's bare",
    }
    name = names.get(base, base)
    return f"{name} @{workers}" if workers else name


# -- main --------------------------------------------------------------------------------


FAMILIES = {
    "claim": family_claim,
    "rollups": family_rollups,
    "batch": family_batch,
    "enqueue": family_enqueue,
    "limit": family_limit,
    "hints": family_hints,
}


async def run_all(server: Server, args, tmp: Path) -> int:
    results = Results()
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        settings = await harness.server_settings(server.dsn, (*harness.SETTINGS, *WAL_SETTINGS))
        for name in args.only or list(FAMILIES):
            results.loads.append((name, os.getloadavg()[0]))
            await FAMILIES[name](server, args, results, tmp)
    finally:
        await server.drop_all()
    build_rows(results)
    header = [
        *harness.heading("queue throughput", server, settings),
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, asyncpg "
        f"{asyncpg.__version__}, pgqueuer {pgqueuer_version()}, "
        f"{'uvloop' if args.uvloop else 'asyncio'} loop, "
        f"Store on {'a pool' if args.pool else 'one connection per worker'}",
        f"{args.todos:,} todos per measurement ({args.batched_todos:,} in the batched ones), "
        f"median of {args.runs} run(s)",
        "spread: ± half the min-max range; ratio: median of the per-run ratios",
        *(
            [f"pgbench {harness.pgbench_version()} (-M prepared, -c 4 -j 2, -t per client), generic plans"]
            if results.get("pgb_cc") or results.get("pgb_create")
            else []
        ),
        f"{time.perf_counter() - started:.0f} s in all; load average (1/5/15 min) "
        f"{load_text(load_before)} at start, {load_text(os.getloadavg())} at end; (1 min) as each "
        "family began: " + ", ".join(f"{name} {load:.1f}" for name, load in results.loads),
        f"one-row INSERT + commit: {probe_range(results.commit_ms)} (median of 50, probed "
        "before and after each family)",
        "what the WAL column depends on: " + harness.settings_line(settings, WAL_SETTINGS),
    ]
    dump = {
        "settings": settings,
        "server": server.description,
        "todos": args.todos,
        "batched_todos": args.batched_todos,
        "runs": args.runs,
        "commit_ms": results.commit_ms,
        "series": {
            k: {"label": v.label, "rates": v.rates, "median": v.median} for k, v in results.series.items()
        },
        "rows": [
            {
                "key": r.series.key,
                "versus": r.versus.key if r.versus else None,
                "ratio": r.ratio,
                "target": r.target,
                "result": r.verdict,
            }
            for r in results.rows
            if isinstance(r, Row)
        ],
        "client_cpu_ms_per_todo": results.cpu,
        "wal_bytes_per_todo": results.wal,
        "wake_ms": [
            {"label": lat.label, "from_return": lat.from_return, "from_call": lat.from_call, "lost": lat.lost}
            for lat in results.latencies
        ],
    }
    return report(results, header, dump, args)


def report(results: Results, header: list[str], dump: dict, args) -> int:
    """Print the table, write the JSON if asked; the exit status."""
    print(render(results, header), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dump, indent=2))
    missed = any(isinstance(r, Row) and r.verdict == "MISS" for r in results.rows) or any(
        lat.verdict == "MISS" for lat in results.latencies
    )
    return 1 if (missed and args.strict) else 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs          3      1    repetitions of every measurement
--todos         5,000  200  todos per measurement
--wake-samples  200    20   hint wake-up samples per run and condition
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "200 todos, 1 run, 20 wake-ups (unless given)", SIZES, targets=True)
    parser.add_argument(
        "--batched-todos",
        type=int,
        metavar="N",
        help="todos per measurement in the batched scenarios (claim_batch "
        "vs PgQueuer, batched enqueue); default 10 x --todos, since "
        "5,000 todos in batches take well under a second",
    )
    parser.add_argument(
        "--only", action="append", choices=list(FAMILIES), help="run only this scenario family (repeatable)"
    )
    parser.add_argument(
        "--pool", action="store_true", help="Store on one shared pool instead of one connection per worker"
    )
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    args.batched_todos = args.batched_todos or 10 * args.todos
    if args.runs < 1 or min(args.todos, args.batched_todos) < ENQUEUE_BATCH:
        parser.error(f"--runs must be at least 1, and --todos and --batched-todos at least {ENQUEUE_BATCH}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    return harness.run_on_server("sb-bench-", run_all, args, use_uvloop=args.uvloop)


if __name__ == "__main__":
    sys.exit(main())
