"""A failover under load: what the clients were told that the promoted replica no longer
has, and whether an ack from a lease the lost primary handed out is accepted.

    .venv/bin/python bench/failover.py            # 12 s of load on each side, 48 agents
    .venv/bin/python bench/failover.py --quick    # smoke run, under a minute in all

For asynchronous and then synchronous replication (`synchronous_standby_names = '*'`,
`synchronous_commit = on`), a primary and a streaming replica of the script's own
(tests/replication.py: the embedded PostgreSQL's binaries, so DATABASE_URL is not used)
take a load: producers create todos; agents (asyncio tasks, a few agent NAMES shared by
several tasks, as restarted agents keep their names) claim one, work 0.5-2 s and complete
it, from a backlog. Mid-run the replica falls behind (it is stopped --lag seconds before),
the primary stops hard (`pg_ctl stop -m immediate`), and --detect seconds later (a
failover manager noticing) the replica is started and promoted.
Everyone carries on against it through the same pool (a DSN listing both servers with
target_session_attrs=read-write); a call that fails on the way is retried as the workers
do (an ack with the same lease), and given up only on 404/409.

Counted from the clients' own logs, against the new primary's rows at the end:
- acknowledged creates lost: a create answered with its todo, the todo not there;
- acknowledged completions lost: a complete answered `done`, the todo not done with that
  completion's result;
- stale acks accepted: a complete answered `done` that closed another claim than the
  agent's own (the row's claimed_at is not the one its claim returned): the todo was
  claimed again on the new primary, and the old holder's ack won.
Targets: synchronous, all three 0; asynchronous, stale acks accepted 0 (the loss within
the lag is expected, and reported).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import options
from harness import log
from stats import table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the replica pair is the failover test's (tests/replication.py)

from dashboard import db as dbmod  # noqa: E402
from dashboard.backoff import Backoff  # noqa: E402
from dashboard.errors import Conflict, DatabaseUnavailable, NotFound  # noqa: E402
from dashboard.migrate import apply_migrations  # noqa: E402
from dashboard.models import NewTodo  # noqa: E402
from dashboard.store import Store  # noqa: E402
from tests.replication import Cluster  # noqa: E402

QUEUE = "failover"
TTL = 60.0  # longer than the run: a lease the new primary has lapses only after it
MODES = {"async": {}, "sync": {"synchronous_standby_names": "*", "synchronous_commit": "on"}}
# What must be 0, and under which modes.
TARGETS = [
    ("creates lost", "sync"),
    ("completions lost", "sync"),
    ("stale acks accepted", "async"),
    ("stale acks accepted", "sync"),
]


@dataclass
class Logs:
    """What the clients were told."""

    created: list[str] = field(default_factory=list)  # ids answered with their todo
    completed: list[tuple[str, dict]] = field(default_factory=list)  # (id, result) answered done
    stale_accepted: int = 0
    refused: int = 0  # acks answered 404/409
    retried: int = 0  # calls that failed on the way and were sent again


async def retried(call, logs: Logs, stop: asyncio.Event | None = None):
    """`call()`, again after a connection-class failure with the workers' own backoff,
    unless `stop` is set meanwhile (then None)."""
    backoff = Backoff()
    while True:
        try:
            return await call()
        except DatabaseUnavailable:
            logs.retried += 1
            if stop is not None and stop.is_set():
                return None
            await asyncio.sleep(backoff.next())


async def produce(store: Store, logs: Logs, stop: asyncio.Event, every: float) -> None:
    while not stop.is_set():
        try:
            created = await store.create(NewTodo(queue=QUEUE, title="work"))
            logs.created.append(created.todo.id)
        except DatabaseUnavailable:
            pass  # not acknowledged: its producer would send it again
        await asyncio.sleep(every)


async def agent(store: Store, name: str, logs: Logs, stop: asyncio.Event, work: tuple[float, float]) -> None:
    serial = itertools.count()
    while not stop.is_set():
        todo = await retried(lambda: store.claim_next([QUEUE], name, TTL), logs, stop)
        if todo is None:
            await asyncio.sleep(0.25)  # an idle agent polls
            continue
        await asyncio.sleep(random.uniform(*work))
        result = {"by": name, "n": f"{id(asyncio.current_task())}-{next(serial)}"}
        try:
            done = await retried(lambda t=todo, r=result: store.complete(t.id, name, t.lease_token, r), logs)
        except (Conflict, NotFound):
            logs.refused += 1
            continue
        logs.completed.append((todo.id, result))
        if done.claimed_at != todo.claimed_at:
            logs.stale_accepted += 1


async def measure(mode: str, args: argparse.Namespace) -> dict[str, object]:
    cluster = Cluster(MODES[mode])
    try:
        await cluster.start(migrate)
        pool = await dbmod.create_pool(cluster.dsn(), min_size=2, max_size=args.agents + args.producers + 2)
        try:
            return await _load_and_fail_over(cluster, pool, args)
        finally:
            await pool.close()
    finally:
        cluster.close()


async def migrate(dsn: str) -> None:
    conn = await dbmod.connect(dsn)
    try:
        await apply_migrations(conn)
    finally:
        await conn.close()


async def _load_and_fail_over(cluster: Cluster, pool, args: argparse.Namespace) -> dict[str, object]:
    logs, stop = Logs(), asyncio.Event()
    backlog = await Store(pool).create_many([NewTodo(queue=QUEUE, title="work")] * args.backlog)
    logs.created += [c.todo.id for c in backlog]
    names = [f"agent-{i}" for i in range(args.names)]
    tasks = [
        asyncio.create_task(agent(Store(pool), names[i % len(names)], logs, stop, (0.5, 2.0)))
        for i in range(args.agents)
    ]
    tasks += [
        asyncio.create_task(produce(Store(pool), logs, stop, args.producers / args.rate))
        for _ in range(args.producers)
    ]
    await asyncio.sleep(args.seconds - args.lag)
    cluster.replica.stop("fast")  # the replica falls behind: everything from here is the lag
    await asyncio.sleep(args.lag)
    started = time.monotonic()
    await cluster.fail_over(args.detect)
    promoted = time.monotonic() - started
    await asyncio.sleep(args.seconds)
    stop.set()
    await asyncio.gather(*tasks)

    kept = {r["id"] for r in await pool.fetch("SELECT id FROM todos")}
    results = {
        r["id"]: r["result"] for r in await pool.fetch("SELECT id, result FROM todos WHERE state = 'done'")
    }
    return {
        "creates": len(logs.created),
        "creates lost": sum(i not in kept for i in logs.created),
        "completions": len(logs.completed),
        "completions lost": sum(results.get(i) != r for i, r in logs.completed),
        "stale acks accepted": logs.stale_accepted,
        "acks refused": logs.refused,
        "calls retried": logs.retried,
        "promotion s": f"{promoted:.1f}",
    }


async def run(args: argparse.Namespace) -> int:
    """Both modes, one after the other; SIGTERM cancels like Ctrl-C, so the servers stop."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    loads = [os.getloadavg()]
    rows = {}
    for mode in MODES:
        log(f"{mode}: {args.seconds:.0f} s of load, the failover ({args.lag:.0f} s of lag), as long again")
        rows[mode] = await measure(mode, args)
        loads.append(os.getloadavg())
    print(
        f"switchboard failover: {args.agents} agents under {args.names} names, {args.producers} producers "
        f"at {args.rate:.0f} todos/s from a backlog of {args.backlog}, work 0.5-2 s; the replica stopped "
        f"{args.lag:.0f} s before the primary (pg_ctl stop -m immediate), promoted {args.detect:.0f} s after"
    )
    print("load average (1/5/15 min): " + " → ".join("/".join(f"{v:.1f}" for v in load) for load in loads))
    header = ("", *rows)
    body = [(name, *(str(rows[mode][name]) for mode in rows)) for name in rows["async"]]
    missed = [
        f"{name} under {mode}: {rows[mode][name]} (target 0)" for name, mode in TARGETS if rows[mode][name]
    ]
    print("\n".join(table([header, *body], right=set(range(1, len(header))))))
    print(
        "\n".join(f"MISS {m}" for m in missed)
        or "targets met: nothing acknowledged lost under sync, no stale ack accepted"
    )
    return 1 if missed and args.strict else 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--seconds  12.0  5.0   seconds of load before and after the failover
--agents   48    16    agent tasks
--rate     30.0  12.0  todos created per second, all producers
--backlog  100   40    todos waiting when the load starts
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "5 s on each side, 16 agents", SIZES, targets=True)
    parser.add_argument(
        "--lag", type=float, default=2.0, help="seconds the replica is behind at the failover (2)"
    )
    parser.add_argument("--names", type=int, default=2, help="agent names the tasks share (2)")
    parser.add_argument("--producers", type=int, default=2, help="producer tasks (2)")
    parser.add_argument(
        "--detect", type=float, default=3.0, help="seconds from the primary's end to the promotion (3)"
    )
    args = parser.parse_args(argv)
    if args.lag >= args.seconds:
        parser.error("--lag must be shorter than --seconds")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(run(parse_args(None))))
