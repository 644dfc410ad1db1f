"""Acks behind a burst of expiring long-polls (issue 24, item 8): an agent's heartbeat and
complete latency while 200 long-poll claims that began in the same instant expire and are
re-sent, against the same agent with no long-polls, side by side in one run.

    .venv/bin/python bench/longpoll_acks.py            # ~1.5 min
    .venv/bin/python bench/longpoll_acks.py --quick    # smoke run, ~20 s
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/longpoll_acks.py

One fresh database (migrated, dropped at exit) on DATABASE_URL or an embedded PostgreSQL,
an API token for the agent and one for each claimer, and the real app in a subprocess
(`python -m dashboard.cli serve`: uvicorn, one process, as users run it), --beat-todos
todos in queue `beat` and none in `idle`.

The agent (one keep-alive httpx client, as the reference worker has) claims a todo of
`beat`, heartbeats it --beats times, completes it with `next` (the next todo in the same
call) and goes on, for the whole of each phase. Its requests fall due one every --interval
seconds; each is timed to its answer from when it was sent and from when it was due (one
that fell due while the previous one was still out waited for it: a stall counts for as
long as it lasts, as it would for the many agents whose acks fall due meanwhile).

1. alone: the agent for --baseline seconds, nothing else.
2. long-polls: --long-polls claimers, each with its own token (one token may hold at most
   100 long-polls at once) on its own raw keep-alive connection (a request
   written by hand, cheaper than as many httpx clients), connected first and then sent
   `POST /api/v1/claims {"queues": ["idle"], "wait": --wait}` in the same instant, as a
   fleet restarted together would; each re-sends at once when its answer (204) comes. The
   agent runs for --seconds meanwhile, starting with them.

Reported per phase: heartbeat and complete latency (p50 / p95 / p99 / max), the app's CPU,
and for the long-polls how many cycled, how long each waited (min / median / max: the
server's spread of expiries), and the most answered within any 100 ms. The figure is the
heartbeat p99 (from due) with the long-polls against alone; the target (reported, exit 0 unless
--strict) is heartbeat p99 ≤ 100 ms while they cycle. Progress goes to stderr, the table to
stdout, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import harness
import httpx
import options
from harness import AppProcess, Server, load, log
from stats import pct, table

from dashboard import db as dbmod
from dashboard.accounts import Accounts

IDLE_QUEUE = "idle"  # never given any work: every long-poll runs to its end
BEAT_QUEUE = "beat"
TTL = 120.0
HEARTBEAT_P99_TARGET_MS = 100.0
BURST_WINDOW = 0.1  # s: the most long-polls answered within any window this long
SLOW_MS = 50.0  # heartbeats slower than this (from due) are shown by when they fell due


# -- the agent -------------------------------------------------------------------------------


@dataclass
class Timings:
    """ms to each answer (200) from when the request was due (the schedule) and from when it
    was sent, and when it was due (perf_counter)."""

    due: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    at: list[float] = field(default_factory=list)

    def slow(self, limit: float, origin: float) -> str:
        """How many took over `limit` ms from due, by the second after `origin` they fell due in."""
        seconds: dict[int, int] = {}
        for ms, at in zip(self.due, self.at, strict=True):
            if ms > limit:
                seconds[int(at - origin)] = seconds.get(int(at - origin), 0) + 1
        return ", ".join(f"{t}–{t + 1} s: {n}" for t, n in sorted(seconds.items())) or "none"


@dataclass
class Agent:
    """What the agent measured in one phase, the failures, and the app's CPU (cores) and
    the load average over the phase."""

    heartbeats: Timings = field(default_factory=Timings)
    completes: Timings = field(default_factory=Timings)
    failures: list[str] = field(default_factory=list)
    app_cores: float = 0.0
    load: float = 0.0
    started: float = 0.0  # perf_counter


class Schedule:
    """The agent's requests fall due every `interval` s. One that is due while the previous
    one is still out is sent as soon as that answers, and timed from when it was due: a
    stalled request then counts as long as it stalls, not once (no coordinated omission)."""

    def __init__(self, interval: float) -> None:
        self.interval, self.next = interval, time.perf_counter()

    async def due(self) -> float:
        due, self.next = self.next, self.next + self.interval
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        return due


async def timed_post(
    client: httpx.AsyncClient, path: str, body: dict, due: float, into: Timings, agent: Agent
):
    """POST, timed into `into` when it answers 200; its JSON (None on a failure)."""
    sent = time.perf_counter()
    try:
        r = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        agent.failures.append(f"{path}: {type(exc).__name__} {exc}")
        return None
    if r.status_code != 200:
        agent.failures.append(f"{path}: HTTP {r.status_code} {r.text[:160]}")
        return None
    answered = time.perf_counter()
    into.due.append((answered - due) * 1000)
    into.sent.append((answered - sent) * 1000)
    into.at.append(due)
    return r.json()


async def run_agent(app: AppProcess, token: str, seconds: float, args) -> Agent:
    """The agent's loop for `seconds`: claim, --beats heartbeats, complete with next, one
    request due every --interval."""
    agent = Agent()
    cpu0, started = app.cpu_seconds(), time.perf_counter()
    deadline, agent.started = started + seconds, started
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(
        base_url=app.base, headers=headers, limits=limits, timeout=60, trust_env=False
    ) as client:
        r = await client.post("/api/v1/claims", json={"queues": [BEAT_QUEUE], "ttl": TTL})
        if r.status_code != 200:
            raise RuntimeError(f"the agent's first claim: HTTP {r.status_code} {r.text[:200]}")
        todo = r.json()
        schedule = Schedule(args.interval)
        while time.perf_counter() < deadline:
            path = f"/api/v1/todos/{todo['id']}"
            for _ in range(args.beats):
                beat = {"lease": todo["lease"], "ttl": TTL}
                await timed_post(
                    client, path + "/heartbeat", beat, await schedule.due(), agent.heartbeats, agent
                )
            done = {
                "lease": todo["lease"],
                "result": {"ok": True},
                "next": {"queues": [BEAT_QUEUE], "ttl": TTL},
            }
            answer = await timed_post(
                client, path + "/complete", done, await schedule.due(), agent.completes, agent
            )
            if answer is None or answer.get("next") is None:
                raise RuntimeError(f"the agent could not go on: {agent.failures[-1:] or 'beat ran dry'}")
            todo = answer["next"]
    agent.app_cores = (app.cpu_seconds() - cpu0) / (time.perf_counter() - started)
    agent.load = os.getloadavg()[0]
    return agent


# -- the long-poll claimers ------------------------------------------------------------------


@dataclass
class Polls:
    """The long-polls' answers: when each came (perf_counter) and how long it had waited (s),
    and anything but a 204."""

    answered_at: list[float] = field(default_factory=list)
    waited: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def biggest_burst(self) -> int:
        """The most answers within any BURST_WINDOW."""
        times = sorted(self.answered_at)
        most, lo = 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] > BURST_WINDOW:
                lo += 1
            most = max(most, hi - lo + 1)
        return most


async def answer(reader: asyncio.StreamReader) -> int:
    """One HTTP/1.1 response read off the stream (head, then its Content-Length body): its
    status."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = 0
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return int(head[0].split(" ", 2)[1])


async def claimer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, polls: Polls):
    """One agent's long-poll, re-sent at once on every answer on its keep-alive connection,
    until cancelled."""
    try:
        while True:
            writer.write(request)
            sent = time.perf_counter()
            status = await answer(reader)
            now = time.perf_counter()
            polls.answered_at.append(now)
            polls.waited.append(now - sent)
            if status != 204:
                polls.failures.append(f"HTTP {status}")
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        polls.failures.append(f"connection ended: {type(exc).__name__}")
    finally:
        writer.close()


def claim_request(port: int, token: str, wait: float) -> bytes:
    body = json.dumps({"queues": [IDLE_QUEUE], "ttl": TTL, "wait": wait}).encode()
    head = [
        "POST /api/v1/claims HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {token}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def fleet(port: int, tokens: list[str], wait: float, seconds: float, pipe: Connection) -> None:
    """The claimers, one per token, in a process of their own (their burst of answers must
    not hold up the agent's own event loop): their connections opened, "ready" sent up the
    pipe, then every long-poll sent in the same instant and cycled for `seconds`; their
    Polls sent up last. A token each, as agents have: one token may hold at most
    SWITCHBOARD_MAX_WAITS_PER_TOKEN (100) long-polls at once."""

    async def run() -> Polls:
        polls = Polls()
        streams = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in tokens))
        pipe.send("ready")
        tasks = [
            asyncio.create_task(claimer(r, w, claim_request(port, token, wait), polls))
            for (r, w), token in zip(streams, tokens, strict=True)
        ]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return polls

    pipe.send(asyncio.run(run()))


async def receive(pipe: Connection, what: str, within: float):
    """The next message up the pipe from the claimers' process."""
    if not await asyncio.to_thread(pipe.poll, within):
        raise RuntimeError(f"the claimers' process sent no {what} within {within:.0f} s")
    return pipe.recv()


async def with_long_polls(app: AppProcess, token: str, fleet_tokens: list[str], args) -> tuple[Agent, Polls]:
    """The agent for --seconds while --long-polls claimers cycle, all sent in one instant."""
    context = multiprocessing.get_context("spawn")
    pipe, child_end = context.Pipe()
    claimers = context.Process(
        target=fleet, args=(app.port, fleet_tokens, args.wait, args.seconds, child_end)
    )
    claimers.start()
    try:
        await receive(pipe, "ready", 60)
        agent = await run_agent(app, token, args.seconds, args)
        polls = await receive(pipe, "answers", 30)
    finally:
        if claimers.is_alive():
            claimers.terminate()  # by its pid
        claimers.join()
    return agent, polls


# -- main ------------------------------------------------------------------------------------


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    settings = await harness.server_settings(server.dsn)
    app: AppProcess | None = None
    try:
        dsn = await server.new_database("longpoll_acks")
        conn = await dbmod.connect(dsn)
        try:
            _, token = await Accounts(conn).add_token("bench-agent", [IDLE_QUEUE, BEAT_QUEUE])
            fleet_tokens = [
                (await Accounts(conn).add_token(f"bench-claimer-{i}", [IDLE_QUEUE]))[1]
                for i in range(args.long_polls)
            ]
            await conn.execute(
                "INSERT INTO todos (id, queue, title) SELECT 'td_beat_' || g, $1, 'beat ' || g"
                " FROM generate_series(1, $2::int) AS g",
                BEAT_QUEUE,
                args.beat_todos,
            )
            await harness.settle(conn)
        finally:
            await conn.close()
        app = AppProcess(dsn, tmp / "app.log")
        await app.start()
        await run_agent(app, token, 1.0, args)  # warm-up: pool connections, prepared statements
        log(f"[alone] the agent for {args.baseline:.0f} s; {load()}")
        alone = await run_agent(app, token, args.baseline, args)
        log(f"[long-polls] {args.long_polls} of wait={args.wait:g}, the agent for {args.seconds:.0f} s")
        polled, polls = await with_long_polls(app, token, fleet_tokens, args)
        app.check_alive()
    finally:
        if app is not None:
            app.stop()
        await server.drop_all()
    report, missed = render(args, settings, server, alone, polled, polls, load_before, started)
    print(report, flush=True)
    return 1 if missed and args.strict else 0


def latency(values: list[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"p50 {pct(values, 50):.1f}  p95 {pct(values, 95):.1f}  p99 {pct(values, 99):.1f}  "
        f"max {max(values):.1f} ms  (n {len(values):,})"
    )


def render(args, settings, server, alone: Agent, polled: Agent, polls: Polls, load_before, started):
    p99_alone, p99_polled = pct(alone.heartbeats.due, 99), pct(polled.heartbeats.due, 99)
    missed = (
        not polled.heartbeats.due or p99_polled > HEARTBEAT_P99_TARGET_MS or polled.failures or polls.failures
    )
    rows: list[tuple] = [("", "figure")]
    for label, agent in (
        (f"alone, {args.baseline:.0f} s", alone),
        (f"with the long-polls, {args.seconds:.0f} s", polled),
    ):
        rows.append((f"{label} (load {agent.load:.2f}; the app used {agent.app_cores:.2f} cores)",))
        rows.append(("  heartbeat, from due", latency(agent.heartbeats.due)))
        rows.append(("  heartbeat, from sent", latency(agent.heartbeats.sent)))
        rows.append(("  complete (with next), from due", latency(agent.completes.due)))
        rows.append(("  complete (with next), from sent", latency(agent.completes.sent)))
        rows.append(
            (
                f"  heartbeats over {SLOW_MS:.0f} ms from due, by second",
                agent.heartbeats.slow(SLOW_MS, agent.started),
            )
        )
        if agent.failures:
            rows.append(("  failed requests", f"{len(agent.failures)}: {agent.failures[0]}"))
    rows.append((f"the long-polls: {args.long_polls} claimers, wait={args.wait:g}, sent in one instant",))
    rows.append(("  long-polls cycled (answered 204 and re-sent)", f"{len(polls.waited):,}"))
    if polls.waited:
        rows.append((
            "  each waited min / median / max",
            f"{min(polls.waited):.2f} / {statistics.median(polls.waited):.2f} / {max(polls.waited):.2f} s",
        ))  # fmt: skip
    rows.append((f"  the most answered within {BURST_WINDOW * 1000:.0f} ms", str(polls.biggest_burst())))
    if polls.failures:
        rows.append(("  answers other than 204", f"{len(polls.failures)}: {polls.failures[0]}"))
    rows.append(("the figure",))
    rows.append(("  heartbeat p99 with the long-polls ÷ alone", f"{p99_polled / p99_alone:.1f}×"))
    rows.append((
        f"  heartbeat p99 with the long-polls ≤ {HEARTBEAT_P99_TARGET_MS:.0f} ms",
        f"{p99_polled:.1f} ms: {'MISS' if missed else 'PASS'}",
    ))  # fmt: skip
    now = os.getloadavg()
    header = [
        *harness.heading("acks behind expiring long-polls", server, settings),
        "the app: python -m dashboard.cli serve (uvicorn, 1 process); the agent: one httpx client, "
        f"one request due every {args.interval * 1000:.0f} ms: {args.beats} heartbeats, then complete "
        "with next",
        f"load average {load_before[0]:.2f} at start, {now[0]:.2f} at end; now {now[0]:.2f} / {now[1]:.2f} / "
        f"{now[2]:.2f} (1 / 5 / 15 min, {os.cpu_count()} CPUs); {time.perf_counter() - started:.0f} s in all",
    ]
    return "\n".join([*header, "", *table(rows, set())]), missed


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--baseline  20.0  3.0  seconds of the agent alone
--seconds   60.0  7.0  seconds of the agent with the long-polls
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "3 s alone, 7 s with the long-polls", SIZES, targets=True)
    parser.add_argument("--long-polls", type=int, default=200, help="long-poll claimers (200)")
    parser.add_argument("--wait", type=float, default=5.0, help="the long-polls' wait, s (5)")
    parser.add_argument("--beats", type=int, default=10, help="heartbeats per todo (10)")
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between the agent's requests")
    parser.add_argument("--beat-todos", type=int, default=3000, help="todos in queue beat (3000)")
    args = parser.parse_args(argv)
    if args.long_polls < 1 or not 0 < args.wait <= 60 or args.beats < 1 or args.interval < 0:
        parser.error(
            "--long-polls and --beats at least 1, --wait above 0 and at most 60, --interval not negative"
        )
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-longpoll-acks-", run_all, parse_args(None)))
