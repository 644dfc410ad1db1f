"""Claim + complete through MCP (the tools at /mcp, streamable HTTP, the SDK's own client)
beside the agent API over HTTP: same app, same client machine, one run.

    .venv/bin/python bench/mcp_throughput.py            # 3 runs of 2,000 todos each way, ~2 min
    .venv/bin/python bench/mcp_throughput.py --quick    # smoke run: 1 run of 400
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/mcp_throughput.py

One server (DATABASE_URL, else an embedded PostgreSQL on a temporary data dir), one fresh
database, one agent token, and the real app in a subprocess (`python -m dashboard.cli
serve`: uvicorn, one worker, its pool and reaper), as api_throughput.py runs them.

4 agents each way, each over its own keep-alive connection:
- MCP: an `mcp.Client` session on /mcp (it negotiates the protocol once and lists the tools,
  as any agent does, before the clock starts), calling `claim` then `complete` until claim
  returns no todo. The client checks every result against the tool's output schema, as it
  always does: that is part of what MCP costs an agent.
- HTTP: api_throughput.py's loop, POST /api/v1/claims then POST /api/v1/todos/{id}/complete
  until a claim answers 204.
Both over the same count of todos, pre-enqueued with Store.create_many (tables truncated,
refilled, vacuumed, analyzed and checkpointed before each measurement); the two alternate
within each repetition, in a rotating order, so load drifts hit them alike. The ratio is
MCP / HTTP, the median of the per-repetition ratios; target ≥ 0.5×. CPU per todo: the
server process and this process (the clients). Progress goes to stderr, the table to
stdout; a missed target is printed, and the exit status is 1 for it only with --strict.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import harness
import options
from api_throughput import QUEUE, TTL, Tally, agents, fill, http_claim_complete, paired
from harness import AppProcess, Server, log
from mcp import Client
from stats import CPU, CPUMeter, Series, rotated, table, timed

from dashboard.mcp_proxy import connected

AGENTS = 4
RATIO_TARGET = 0.5  # MCP ≥ 0.5× the HTTP API


async def mcp_claim_complete(client: Client) -> int:
    done = 0
    while True:
        claimed = await client.call_tool("claim", {"queues": [QUEUE], "ttl": TTL})
        if claimed.is_error:
            raise RuntimeError(f"claim: {claimed.content[0].text}")
        todo = claimed.structured_content["todo"]
        if todo is None:
            return done
        completed = await client.call_tool("complete", {"id": todo["id"], "lease": todo["lease"]})
        if completed.is_error:
            raise RuntimeError(f"complete: {completed.content[0].text}")
        done += 1


async def over_mcp(app: AppProcess, token: str) -> tuple[float, int, CPU]:
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connected(app.base, token)) for _ in range(AGENTS)]
        for client in clients:
            await client.list_tools()
        with CPUMeter(app) as meter:
            seconds, done = await timed([mcp_claim_complete(c) for c in clients])
    return seconds, done, meter.result


async def over_http(app: AppProcess, token: str) -> tuple[float, int, CPU]:
    async with agents(app.base, token, AGENTS) as clients:
        with CPUMeter(app) as meter:
            seconds, done = await timed([http_claim_complete(c, [], Tally()) for c in clients])
    return seconds, done, meter.result


@dataclass
class Measured(Series):
    cpus: list[tuple[float, float]] = field(default_factory=list)  # server ms, bench ms per todo

    def cpu(self) -> str:
        server, bench = (statistics.median(c[i] for c in self.cpus) for i in range(2))
        return f"{server:.2f} / {bench:.2f} ms"


VARIANTS = {
    "mcp": (f"MCP tools claim + complete, {AGENTS} agents", over_mcp),
    "http": (f"agent API claim + complete, {AGENTS} agents", over_http),
}


async def run_all(server: Server, args, tmp: Path) -> int:
    started, load_before = time.perf_counter(), os.getloadavg()
    series = {key: Measured(key, label) for key, (label, _) in VARIANTS.items()}
    try:
        settings = await harness.server_settings(server.dsn)
        async with (
            harness.agent_database(server, "mcp", [QUEUE]) as db,
            AppProcess(db.dsn, tmp / "app.log") as app,
        ):
            for rep in range(args.runs):
                log(f"[throughput] run {rep + 1}/{args.runs}")
                for key in rotated(list(VARIANTS), rep):
                    label, measure = VARIANTS[key]
                    await fill(db.admin, db.fill, args.todos)
                    seconds, done, cpu = await measure(app, db.token)
                    if done != args.todos:
                        raise RuntimeError(f"{label}: processed {done} of {args.todos}")
                    await harness.expect_states(db.admin, {"done": args.todos}, label)
                    app.check_alive()
                    series[key].rates.append(done / seconds)
                    series[key].cpus.append(cpu.per_todo(done))
                    log(
                        f"  {label:<44} {done / seconds:>7,.0f} todos/s ({done} in {seconds:.2f} s; "
                        f"CPU per todo: server {cpu.per_todo(done)[0]:.2f} ms, bench "
                        f"{cpu.per_todo(done)[1]:.2f} ms; load {os.getloadavg()[0]:.2f})"
                    )
    finally:
        await server.drop_all()

    ratio = paired(series["mcp"].rates, series["http"].rates)
    ok = ratio >= RATIO_TARGET
    rows = [("scenario", "todos/s", "spread", "ratio", "target", "result", "CPU/todo: server / bench")]
    for key, s in series.items():
        mcp = key == "mcp"
        rows.append(
            (
                s.label,
                *s.rate_cells(),
                f"{ratio:.2f}×" if mcp else "",
                f"≥ {RATIO_TARGET:.2f}× HTTP" if mcp else "",
                ("PASS" if ok else "MISS") if mcp else "",
                s.cpu(),
            )
        )
    now = os.getloadavg()
    lines = [
        *harness.heading("MCP vs agent API throughput", server, settings),
        f"{os.cpu_count()} CPUs shared by this process (the {AGENTS} clients of each side), the app process "
        "(uvicorn, 1 worker) and PostgreSQL",
        f"Python {platform.python_version()}, mcp {version('mcp')}; {args.todos:,} todos per measurement, "
        f"median of {args.runs} run(s) (spread: ± half the min-max range); ratio: median of the "
        f"per-run MCP / HTTP ratios; {time.perf_counter() - started:.0f} s in all",
        f"load average {load_before[0]:.2f} at start; now {now[0]:.2f} / {now[1]:.2f} / {now[2]:.2f} "
        "(1 / 5 / 15 min)",
        "",
        *table(rows, {1, 2, 3}),
    ]
    print("\n".join(lines), flush=True)
    if not ok:
        log("target missed: MCP vs the agent API")
    return 1 if not ok and args.strict else 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs   3      1    repetitions
--todos  2,000  400  todos per measurement
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "400 todos, 1 run (unless given)", SIZES, targets=True)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.todos < 100:
        parser.error("--runs must be at least 1 and --todos at least 100")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-mcp-", run_all, parse_args(None)))
