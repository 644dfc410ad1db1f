"""Where the server's CPU goes under the HTTP claim + complete loop: py-spy on its process,
or the CPU per request of ours, ours without its access log, and the bare app side by side.

    .venv/bin/python bench/profile_api.py                      # py-spy on ours, 16 agents, 20 s
    .venv/bin/python bench/profile_api.py --variant bare       # … on the bare app (bench/bare_app.py)
    .venv/bin/python bench/profile_api.py --variant quiet      # … on ours, access log off
    .venv/bin/python bench/profile_api.py --compare            # CPU per request of the three, 3 runs
    .venv/bin/python bench/profile_api.py --quick              # smoke run: --compare, 1 run of 400

Not a benchmark with targets: a diagnosis of api_throughput.py's "server CPU per request"
row. Fresh database on DATABASE_URL or an embedded PostgreSQL; the queue filled; the server
driven by api_throughput.py's own claim + complete loop (16 agents by default).

- py-spy (default): `py-spy record --format raw` samples the server process for --seconds
  while the loop runs, and the script prints where the main thread's samples fall: by
  package (the file of the frame on top), and the functions with the most samples, by self
  time (on top) and inclusive (anywhere on the stack), as shares of the main thread's
  samples; other threads (the log listener's) are counted apart: py-spy takes their wait
  for a queue for busy time. C code without Python frames shows as its caller (uvloop and
  httptools as Runner.run, asyncpg's protocol as Connection._do_execute). py-spy must be
  beside this Python (`.venv/bin/py-spy`) or on PATH, and allowed to attach (root, or
  kernel.yama.ptrace_scope 0). The raw profile stays in --out, for a flame graph.
- --compare: ours, `quiet` (ours started with the `switchboard.access` logger at WARNING,
  so no line per request: a diagnostic, not a setting the app has) and the bare app, each
  draining --todos todos per run, in a rotating order, --runs times: the server CPU per
  request (psutil) of each, and ratios (medians of per-run ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import api_throughput as api
import harness
import options
from harness import AppProcess, Server, load, log
from stats import CPUMeter, rotated, table, timed

LINE = re.compile(r":\d+\)$")  # a frame's line number: functions are counted whole
PACKAGES = (  # py-spy names a frame's file from its package: "Store.complete (dashboard/store.py:227)"
    ("dashboard", "(dashboard/"),
    ("the bare app", "bare_app.py"),
    ("litestar", "(litestar/"),
    ("uvicorn", "(uvicorn/"),
    ("asyncpg (C code shows as its caller)", "(asyncpg/"),
    ("msgspec", "(msgspec/"),
    ("prometheus_client", "(prometheus_client/"),
    ("logging", "(logging/"),
    ("threading and queue (the log listener's thread, and handing records to it)", "(threading.py"),
    ("threading and queue (the log listener's thread, and handing records to it)", "(queue.py"),
    ("asyncio (uvloop's C code and httptools show as Runner.run)", "(asyncio/"),
)


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found beside this Python or on PATH (pip install py-spy)")
    return found


def package(frame: str) -> str:
    for name, marker in PACKAGES:
        if marker in frame:
            return name
    return "other"


def summarize(raw: Path, top: int) -> list[str]:
    """The main thread's samples by package and by function; other threads apart."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    others: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [LINE.sub(")", f) for f in stack.split(";")]
        if frames[0].startswith("Thread._bootstrap"):
            others[frames[-1]] += n
            continue
        total += n
        self_time[frames[-1]] += n
        packages[package(frames[-1])] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return ["no samples"]
    out = [
        f"{total:,} samples of the main thread; {sum(others.values()):,} of other threads "
        f"(on top there: {', '.join(f'{f} {n}' for f, n in others.most_common(3)) or 'none'})",
        "",
        "main thread, self time by package (the frame on top):",
    ]
    out += [f"  {n * 100 / total:5.1f}%  {name}" for name, n in packages.most_common()]
    out += ["", f"main thread, top {top} functions, self time:"]
    out += [f"  {n * 100 / total:5.1f}%  {frame}" for frame, n in self_time.most_common(top)]
    out += ["", f"main thread, top {top} functions, inclusive (but those on nearly every stack):"]
    shown = [(f, n) for f, n in inclusive.most_common() if n < total * 0.98][:top]
    out += [f"  {n * 100 / total:5.1f}%  {frame}" for frame, n in shown]
    return out


class QuietApp(AppProcess):
    """Ours with the `switchboard.access` logger at WARNING: no log line per request."""

    STARTER = (
        "import logging, runpy, sys; "
        "logging.getLogger('switchboard.access').setLevel(logging.WARNING); "
        "sys.argv[0] = 'switchboard'; "
        "runpy.run_module('dashboard.cli', run_name='__main__')"
    )

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.STARTER, "serve", "--host", "127.0.0.1", "--port", str(self.port)]


VARIANTS = {
    "ours": ("ours", AppProcess, api.http_claim_complete),
    "quiet": ("ours, access log off", QuietApp, api.http_claim_complete),
    "bare": ("the bare app", api.BareApp, api.bare_claim_complete),
}


async def profile(server_proc: AppProcess, loop, token: str, args) -> tuple[int, float, float]:
    """py-spy on the server while the loop runs: requests, seconds, server CPU ms per request."""
    tally = api.Tally()
    async with api.agents(server_proc.base, token, args.agents) as clients:
        tasks = [asyncio.create_task(loop(c, [], tally)) for c in clients]
        await asyncio.sleep(1.0)  # warm: every pool connection open, statements prepared
        log(f"py-spy on pid {server_proc.proc.pid} for {args.seconds} s → {args.out}")
        before = tally.requests
        started = time.perf_counter()
        with CPUMeter(server_proc) as meter:
            spy = await asyncio.create_subprocess_exec(
                py_spy(),
                "record",
                "-p",
                str(server_proc.proc.pid),
                "-d",
                str(args.seconds),
                "-r",
                str(args.rate),
                *(["--native"] if args.native else []),
                "-f",
                "raw",
                "-o",
                str(args.out),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            _, err = await spy.communicate()
        requests = tally.requests - before
        seconds = time.perf_counter() - started
        drained = any(t.done() for t in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if spy.returncode != 0:
        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    if drained:
        log("warning: the queue ran dry while sampling; give more --todos")
    return requests, seconds, meter.result.app * 1000 / requests


async def compare(servers: dict[str, AppProcess], token: str, admin, fill_store, args) -> list[str]:
    per_request: dict[str, list[float]] = {key: [] for key in servers}
    rates: dict[str, list[float]] = {key: [] for key in servers}
    for rep in range(args.runs):
        for key in rotated(list(servers), rep):
            _, _, loop = VARIANTS[key]
            await api.fill(admin, fill_store, args.todos)
            tally = api.Tally()
            async with api.agents(servers[key].base, token, args.agents) as clients:
                with CPUMeter(servers[key]) as meter:
                    seconds, done = await timed([loop(c, [], tally) for c in clients])
            if done != args.todos:
                raise RuntimeError(f"{key}: {done} of {args.todos} todos")
            per_request[key].append(meter.result.app * 1000 / tally.requests)
            rates[key].append(tally.requests / seconds)
            log(
                f"  run {rep + 1}, {VARIANTS[key][0]:<22} {per_request[key][-1]:.3f} ms per request, "
                f"{rates[key][-1]:,.0f} requests/s, load {os.getloadavg()[0]:.2f}"
            )
    rows: list[tuple] = [("server", "requests/s", "CPU/request", "vs the bare app", "vs ours")]
    for key in servers:
        rows.append(
            (
                VARIANTS[key][0],
                f"{statistics.median(rates[key]):,.0f}",
                f"{statistics.median(per_request[key]):.3f} ms",
                f"{api.paired(per_request[key], per_request['bare']):.2f}×" if key != "bare" else "",
                f"{api.paired(per_request[key], per_request['ours']):.2f}×" if key != "ours" else "",
            )
        )
    return [
        f"server CPU per request (psutil), {args.agents} agents, claim + complete, {args.todos:,} todos per "
        f"run, median of {args.runs}; ratios: medians of per-run ratios",
        load(),
        "",
        *table(rows, {1, 2, 3, 4}),
    ]


async def run_all(server: Server, args, tmp: Path) -> int:
    keys = list(VARIANTS) if args.compare else [args.variant]
    try:
        async with (
            harness.agent_database(server, "profile", [api.QUEUE]) as db,
            contextlib.AsyncExitStack() as running,
        ):
            servers = {
                key: await running.enter_async_context(VARIANTS[key][1](db.dsn, tmp / f"{key}.log"))
                for key in keys
            }
            if args.compare:
                lines = await compare(servers, db.token, db.admin, db.fill, args)
            else:
                log(f"filling {args.todos:,} todos")
                await api.fill(db.admin, db.fill, args.todos)
                what, _, loop = VARIANTS[args.variant]
                requests, seconds, ms = await profile(servers[args.variant], loop, db.token, args)
                lines = [
                    f"py-spy profile of {what}, {args.agents} agents, claim + complete: {requests:,} "
                    f"requests in {seconds:.1f} s ({requests / seconds:,.0f}/s), server CPU {ms:.3f} ms "
                    f"per request (with py-spy attached); {load()}",
                    *summarize(Path(args.out), args.top),
                ]
    finally:
        await server.drop_all()
    print("\n".join(lines), flush=True)
    return 0


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--runs  3  1  runs with --compare
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "--compare, 1 run of 400 todos (no py-spy)", SIZES)
    parser.add_argument("--variant", choices=list(VARIANTS), default="ours", help="the server to profile")
    parser.add_argument("--compare", action="store_true", help="CPU per request of all three, no py-spy")
    parser.add_argument("--agents", type=int, default=16, help="concurrent agents (16)")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of py-spy samples (20)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second (200)")
    parser.add_argument(
        "--todos", type=int, help="todos to fill (40,000 for py-spy; 4,000 per run with --compare)"
    )
    parser.add_argument("--top", type=int, default=25, help="functions to list (25)")
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames too (slower)")
    parser.add_argument("--out", default="/tmp/sb-profile.txt", help="the raw py-spy output")
    args = parser.parse_args(argv)
    args.compare = args.compare or args.quick
    args.todos = args.todos or (400 if args.quick else 4000 if args.compare else 40_000)
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-profile-", run_all, parse_args(None)))
