"""What each index and constraint of todos and todo_history costs a claim + complete.

    .venv/bin/python bench/history_cost.py            # full run, ~4 min on 2 cores
    .venv/bin/python bench/history_cost.py --quick    # smoke run, well under a minute
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/...

pgbench (-M prepared, 4 clients, generic plans, -t per client) runs our own claim_batch
(n=1) + complete statements, the script queue_throughput.py's "limit" runs, on a copy of
the migrated database (CREATE DATABASE … TEMPLATE) in which one thing is dropped: each
secondary index of todos and of todo_history in turn, todo_history's primary key, its
foreign key to todos, both its indexes, its id column; only the claim's index left on
todos; or, with the full schema, the statements without their history inserts (the
`logged` CTE cut out). Every copy is filled alike before its run (10,000 finished todos
with history, then --todos pending ones, VACUUM ANALYZE, CHECKPOINT). The table shows
todos/s and the ratio to the full schema measured next to it (the full schema runs again
after every FULL_EVERY variants; each ratio is to the mean of the full-schema runs just
before and just after the variant's, and the table shows the median over the
repetitions). The drops come after the fill, which needs todos_dedupe (create_todos'
ON CONFLICT). The schema itself is never changed: only the scratch copies are, and they
are dropped right after their run.

Which of these the dashboard needs is in docs/benchmarks.md ("history_cost.py").
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import asyncpg
import harness
import options
import queue_throughput as qt
from harness import Server, log
from stats import Series, rotated, table

CLIENTS = 4
FULL_EVERY = 2  # the full schema runs again after every FULL_EVERY variants


@dataclass
class Variant:
    key: str
    label: str
    changes: list[str] = field(default_factory=list)  # run on the copy after the fill
    history: bool = True  # the statements' history inserts


def without_logged(text: str) -> str:
    """A pgbench script with every statement's `logged` CTE (its history insert) cut out."""
    head = re.compile(r"\)\s*,\s*logged AS \(")
    while found := head.search(text):
        start = found.start()
        i, depth, quoted = found.end(), 1, False
        while depth:
            c = text[i]
            if c == "'":
                quoted = not quoted
            elif not quoted:
                depth += {"(": 1, ")": -1}.get(c, 0)
            i += 1
        text = text[:start] + ")" + text[i:]
    return text


async def variants_of(conn: asyncpg.Connection) -> list[Variant]:
    """The full schema, then one variant per thing to drop, read from the catalog."""
    indexes = await conn.fetch(
        """SELECT c.relname AS table_name, i.relname AS index_name
           FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid
           WHERE c.relname IN ('todos', 'todo_history') AND NOT x.indisprimary
           ORDER BY c.relname DESC, i.relname"""
    )
    fks = await conn.fetch(
        """SELECT conname FROM pg_constraint
           WHERE conrelid = 'todo_history'::regclass AND contype = 'f' ORDER BY conname"""
    )
    found = [
        Variant("full", "full schema (as migrated)"),
        Variant("no_history", "full schema, statements without their history inserts", history=False),
    ]
    for r in indexes:
        found.append(
            Variant(f"-{r['index_name']}", f"without {r['index_name']}", [f'DROP INDEX "{r["index_name"]}"'])
        )
    found.append(
        Variant(
            "-todo_history_pkey",
            "without todo_history_pkey (its primary key)",
            ["ALTER TABLE todo_history DROP CONSTRAINT todo_history_pkey"],
        )
    )
    history_indexes = [r["index_name"] for r in indexes if r["table_name"] == "todo_history"]
    found.append(
        Variant(
            "-history_indexes",
            "todo_history without any index",
            ["ALTER TABLE todo_history DROP CONSTRAINT todo_history_pkey"]
            + [f'DROP INDEX "{name}"' for name in history_indexes],
        )
    )
    found.append(
        Variant(
            "-history_id",
            "todo_history without its id column (identity, pkey, todo_history_todo)",
            ["ALTER TABLE todo_history DROP COLUMN id"],
        )
    )
    for r in fks:
        found.append(
            Variant(
                f"-{r['conname']}",
                f"without {r['conname']} (the history -> todos check)",
                [f'ALTER TABLE todo_history DROP CONSTRAINT "{r["conname"]}"'],
            )
        )
    claim_index = "todos_ready"
    others = [
        r["index_name"] for r in indexes if r["table_name"] == "todos" and r["index_name"] != claim_index
    ]
    found.append(
        Variant(
            "-todos_secondary",
            f"todos with only its pkey and {claim_index} (the claim's)",
            [f'DROP INDEX "{name}"' for name in others],
        )
    )
    return found


async def measure(
    server: Server, base: str, variant: Variant, n: int, tmp: Path, script
) -> tuple[float, float]:
    """One run of `variant` on a fresh copy of database `base`: todos per second, and WAL
    bytes written per todo (the server's, so anything else it runs meanwhile counts too)."""
    dsn = await server.new_empty_database("hcopy", template=base)
    conn = await asyncpg.connect(dsn)
    try:
        per_client = max(1, n // CLIENTS)
        total = per_client * CLIENTS
        await qt.fill(conn, total)  # first: create_todos needs todos_dedupe (ON CONFLICT)
        if variant.changes:
            for change in variant.changes:
                await conn.execute(change)
            await harness.settle(conn)
        history_before = await conn.fetchval("SELECT count(*) FROM todo_history")
        wal_before = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        text = script.text if variant.history else without_logged(script.text)
        run = await qt.run_pgbench(
            dsn,
            replace(script, text=text, name=f"history_{variant.key.strip('-')}"),
            clients=CLIENTS,
            transactions=per_client,
            tmp=tmp,
        )
        wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", wal_before)
        await harness.expect_states(conn, {"done": total + qt.SEED_DONE}, variant.label)
        added = await conn.fetchval("SELECT count(*) FROM todo_history") - history_before
        if added != (2 * total if variant.history else 0):
            raise RuntimeError(f"{variant.label}: {added} history rows for {total} todos")
    finally:
        await conn.close()
    await server.drop(dsn)
    return total / run.seconds, float(wal) / total


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    try:
        settings = await harness.server_settings(server.dsn)
        base_dsn = await server.new_database("history", check=qt.check_parameters)
        conn = await asyncpg.connect(base_dsn)
        try:
            variants = await variants_of(conn)
        finally:
            await conn.close()  # CREATE DATABASE … TEMPLATE needs it unused
        if args.only:
            variants = [v for v in variants if v.key == "full" or v.key.strip("-") in args.only]
        script = qt.pgb_claim_complete()
        series = {v.key: Series(v.key, v.label) for v in variants}
        ratios: dict[str, list[float]] = {v.key: [] for v in variants}
        wal_per_todo: dict[str, list[float]] = {v.key: [] for v in variants}
        others = [v for v in variants if v.key != "full"]
        for rep in range(args.runs):
            log(f"[history] run {rep + 1}/{args.runs}")
            order = rotated(others, rep) if others else []
            plan = [variants[0]]
            for i, v in enumerate(order, 1):
                plan.append(v)
                if i % FULL_EVERY == 0 or i == len(order):
                    plan.append(variants[0])
            measured: list[tuple[str, float]] = []
            for v in plan:
                rate, wal = await measure(server, base_dsn, v, args.todos, tmp, script)
                log(f"  {v.label:<72} {rate:>8,.0f} todos/s  {wal:>7,.0f} WAL bytes/todo")
                series[v.key].rates.append(rate)
                wal_per_todo[v.key].append(wal)
                measured.append((v.key, rate))
            # Each variant against the full-schema runs next to it (the one before and the
            # one after), so a change of the machine's load during the run hits both sides.
            for i, (key, rate) in enumerate(measured):
                if key == "full":
                    continue
                before = next(r for k, r in reversed(measured[:i]) if k == "full")
                after = next(r for k, r in measured[i + 1 :] if k == "full")
                ratios[key].append(rate / ((before + after) / 2))
    finally:
        await server.drop_all()

    rows: list[tuple[str, ...]] = [
        ("schema / statements", "todos/s", "spread", "ratio to full", "ratio range", "WAL/todo", "runs")
    ]
    full_wal = statistics.median(wal_per_todo["full"])
    for v in variants:
        s = series[v.key]
        if v.key == "full":
            ratio, span = "1.00×", ""
        else:
            ratio = f"{statistics.median(ratios[v.key]):.2f}×"
            span = f"{min(ratios[v.key]):.2f}–{max(ratios[v.key]):.2f}" if len(ratios[v.key]) > 1 else ""
        wal = statistics.median(wal_per_todo[v.key])
        wal_cell = f"{wal:,.0f} B" + ("" if v.key == "full" else f" ({wal / full_wal - 1:+.0%})")
        rows.append((v.label, *s.rate_cells(), ratio, span, wal_cell, str(len(s.rates))))
    header = [
        *harness.heading("history cost", server, settings),
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, pgbench {harness.pgbench_version()} "
        f"(-M prepared, -c {CLIENTS} -j 2, -t per client), generic plans",
        f"claim_batch(n=1) + complete, {args.todos:,} todos per run (each on a fresh copy, filled alike), "
        f"median of {args.runs} run(s); the full schema runs every {FULL_EVERY} variants",
        "spread: ± half the min-max range; ratio: median over the runs of (variant / mean of the "
        "full-schema runs just before and after it), and its range over the runs",
        "WAL/todo: bytes of WAL the server wrote during the run per todo, median (the whole "
        "server's: whatever else it runs counts too), and against the full schema's",
        f"{time.perf_counter() - started:.0f} s in all; load average (1/5/15 min) "
        f"{qt.load_text(load_before)} at start, {qt.load_text(os.getloadavg())} at end",
    ]
    print("\n".join([*header, "", *table(rows, {1, 2, 3, 4, 5, 6})]), flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs   3      1      repetitions of every variant
--todos  5,000  1,000  todos per run
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "1,000 todos, 1 run", SIZES)
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this variant (an index or constraint name, no_history, history_indexes, "
        "history_id, todos_secondary; repeatable); the full schema always runs",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.todos < CLIENTS:
        parser.error(f"--runs must be at least 1 and --todos at least {CLIENTS}")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-history-", run_all, parse_args(None)))
