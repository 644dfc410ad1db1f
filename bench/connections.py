"""Memory and connections: the app holding 1,000 waiting long-poll claims and 1,000 open SSE
channels while agents heartbeat.

    .venv/bin/python bench/connections.py            # ~1 min
    .venv/bin/python bench/connections.py --quick    # 100 + 100 held, 5 s of heartbeats
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/connections.py

One fresh database (migrated, dropped at exit) on DATABASE_URL or an embedded PostgreSQL,
an API token for one agent, and the real app in a subprocess (`python -m dashboard.cli
serve`, its own pool of 10 and its LISTEN connection) with SWITCHBOARD_MAX_CONNECTIONS=2500
in its environment (the default, 1000, would answer 503 to most of the 2,000 held
connections) and `application_name=switchboard-app` in its DATABASE_URL, so its sessions
can be told from this script's in pg_stat_activity.

1. Heartbeats with nothing held, for comparison: 20 todos in queue `beat` are claimed over
   the API, then 20 agents (one keep-alive httpx client each) heartbeat one each, every
   --interval seconds, for half of --seconds.
2. Held: --channels GET /api/v1/channels?queues=idle-<k> SSE streams, then --long-polls
   POST /api/v1/claims {"wait": 60} on the empty queues idle-0 … idle-9, each on its own
   raw asyncio connection (a request written by hand, the answer's status line awaited:
   cheaper than 2,000 httpx clients). The streams must answer 200 with
   text/event-stream; the long-polls must not answer at all while held (a 204, 429 or
   503 would be a claim that is not waiting). The script waits until the app is idle again
   (its CPU time stops rising) before going on.
3. While all of them are held: the same heartbeats for --seconds; meanwhile, every
   half second, the app process's RSS (psutil) and its sessions in pg_stat_activity
   (every session in the bench database but this script's own: the LISTEN connection is
   the one named "switchboard listener", or else the one whose last query is its LISTEN or
   its health check, SELECT 1; the rest are the pool's, named switchboard-app).
4. How many long-polls are still waiting and how many streams still open at the end (all
   the long-polls are opened within the 60 s they wait, and checked before it ends).

Targets (reported, never changed; a miss exits 0 unless --strict): the app's RSS while
holding < 300 MB; its database sessions no more than its pool (10) plus the LISTEN
connection; heartbeat p99 ≤ 100 ms while holding. Progress goes to stderr, the table to
stdout, with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import harness
import httpx
import options
import psutil
from harness import AppProcess, Server, log
from stats import pct, table

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.models import NewTodo
from dashboard.store import Store

MAX_CONNECTIONS = 2500  # SWITCHBOARD_MAX_CONNECTIONS for the app in this bench
APP_NAME = "switchboard-app"  # application_name of the app's sessions, given in its DATABASE_URL
LISTENER_NAME = "switchboard listener"  # the LISTEN connection's own, where it names itself
POOL_SIZE = 10  # dashboard.web.app.create_app's pool_size, the app's default
IDLE_QUEUES = [f"idle-{k}" for k in range(10)]  # never given any work
BEAT_QUEUE = "beat"
WAIT = 60.0  # the long-polls' wait, the most the API takes (dashboard.models.MAX_WAIT)
TTL = 120.0
OPEN_AT_ONCE = 50  # connections opened concurrently while building up the held ones
RSS_TARGET_MB = 300.0
HEARTBEAT_P99_TARGET_MS = 100.0
HEAD_LIMIT = 64 * 1024


# -- held connections: raw HTTP/1.1 on asyncio streams ------------------------------------


@dataclass
class Held:
    """One request on its own connection, held open: its status once answered, and
    whether the connection has ended."""

    kind: str
    writer: asyncio.StreamWriter | None = None
    status: int | None = None
    answered_after: float | None = None  # s from the request's sending
    closed: bool = False
    received: int = 0  # bytes of an SSE stream's body
    task: asyncio.Task | None = field(default=None, repr=False)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.writer is not None:
            self.writer.close()


def request(method: str, path: str, port: int, token: str, body: bytes = b"") -> bytes:
    head = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {token}",
    ]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    else:
        head.append("Accept: text/event-stream")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > HEAD_LIMIT:
        raise RuntimeError("response head too long")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def open_long_poll(port: int, token: str, queue: str) -> Held:
    held = Held("long-poll")
    reader, held.writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"queues": [queue], "ttl": TTL, "wait": WAIT}).encode()
    held.writer.write(request("POST", "/api/v1/claims", port, token, body))
    await held.writer.drain()
    sent = time.perf_counter()

    async def watch() -> None:
        try:
            held.status, _ = await read_head(reader)
            held.answered_after = time.perf_counter() - sent
        except (asyncio.IncompleteReadError, ConnectionError):
            held.closed = True

    held.task = asyncio.create_task(watch())
    return held


async def open_channel(port: int, token: str, queue: str) -> Held:
    """An SSE stream, returned once its head has arrived; its body is read (and counted)
    in the background until it ends."""
    held = Held("channel")
    reader, held.writer = await asyncio.open_connection("127.0.0.1", port)
    held.writer.write(request("GET", f"/api/v1/channels?queues={queue}", port, token))
    await held.writer.drain()
    sent = time.perf_counter()
    held.status, headers = await read_head(reader)
    held.answered_after = time.perf_counter() - sent
    if held.status != 200 or not headers.get("content-type", "").startswith("text/event-stream"):
        held.closed = True
        held.writer.close()
        return held

    async def drain() -> None:
        try:
            while chunk := await reader.read(65536):
                held.received += len(chunk)
        except ConnectionError:
            pass
        held.closed = True

    held.task = asyncio.create_task(drain())
    return held


async def open_many(opener, n: int, port: int, token: str) -> list[Held]:
    """n connections, OPEN_AT_ONCE at a time, spread over the idle queues."""
    held: list[Held] = []
    for start in range(0, n, OPEN_AT_ONCE):
        batch = range(start, min(n, start + OPEN_AT_ONCE))
        held += await asyncio.gather(*(opener(port, token, IDLE_QUEUES[k % len(IDLE_QUEUES)]) for k in batch))
    return held


def raise_file_limit(needed: int) -> tuple[int, int]:
    """This process's soft RLIMIT_NOFILE raised to fit `needed` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise SystemExit(f"this process may open {soft} files (ulimit -Hn {hard}); the bench needs {needed}")
    return soft, hard


# -- heartbeats ------------------------------------------------------------------------------


async def claim_beats(base: str, token: str, n: int) -> list[tuple[httpx.AsyncClient, dict]]:
    """n agents, each a keep-alive client holding one claimed todo of BEAT_QUEUE."""
    agents = []
    for _ in range(n):
        client = httpx.AsyncClient(
            base_url=base,
            trust_env=False,
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=1),
        )
        r = await client.post("/api/v1/claims", json={"queues": [BEAT_QUEUE], "ttl": TTL})
        if r.status_code != 200:
            raise RuntimeError(f"claim for the heartbeats: HTTP {r.status_code} {r.text[:200]}")
        agents.append((client, r.json()))
    return agents


@dataclass
class Beats:
    """One heartbeat phase: ms per heartbeat and when each was sent (perf_counter), the
    failures, the load average at its end and the cores the app used meanwhile."""

    ms: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    load: float = 0.0
    app_cores: float = 0.0

    def slow(self, limit: float, origin: float) -> str:
        """In which second after `origin` the heartbeats slower than `limit` ms were sent,
        with how many in each."""
        at: dict[int, int] = {}
        for ms, sent in zip(self.ms, self.sent, strict=True):
            if ms > limit:
                second = int(sent - origin)
                at[second] = at.get(second, 0) + 1
        return ", ".join(f"{t}–{t + 1} s: {n}" for t, n in sorted(at.items()))


async def heartbeats(
    app: AppProcess, agents: list[tuple[httpx.AsyncClient, dict]], seconds: float, interval: float
) -> Beats:
    """Every agent heartbeats its todo every `interval` s for `seconds`."""
    beats = Beats()
    samples, sent, failures = beats.ms, beats.sent, beats.failures
    cpu0 = app.cpu_seconds()
    started_all = time.perf_counter()
    deadline = started_all + seconds

    async def agent(client: httpx.AsyncClient, todo: dict) -> None:
        path = f"/api/v1/todos/{todo['id']}/heartbeat"
        body = {"lease": todo["lease"], "ttl": TTL}
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                r = await client.post(path, json=body)
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
            else:
                if r.status_code == 200:
                    samples.append((time.perf_counter() - started) * 1000)
                    sent.append(started)
                else:
                    failures.append(f"HTTP {r.status_code} {r.text[:120]}")
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))

    async with asyncio.TaskGroup() as group:
        for client, todo in agents:
            group.create_task(agent(client, todo))
    beats.app_cores = (app.cpu_seconds() - cpu0) / (time.perf_counter() - started_all)
    beats.load = os.getloadavg()[0]
    return beats


# -- what the app holds --------------------------------------------------------------------


@dataclass
class Sample:
    rss: int  # bytes
    pool: int  # the app's sessions that are not the LISTEN connection
    listen: int
    names: set[str]  # the application_name of every session but this script's
    other: set[str]  # backend types other than "client backend" (none expected)


def is_listener(row: asyncpg.Record) -> bool:
    """The hub's LISTEN connection: named so (dashboard/notify.py's APPLICATION_NAME, when
    it sets one), or else known by its last query, its LISTEN or its health check."""
    query = (row["query"] or "").strip()
    return (
        row["application_name"] == LISTENER_NAME or query.upper().startswith("LISTEN") or query == "SELECT 1"
    )


async def sample(app: AppProcess, admin: asyncpg.Connection) -> Sample:
    """The app's RSS and its sessions: all in the bench database but this script's own."""
    rss = psutil.Process(app.proc.pid).memory_info().rss
    rows = await admin.fetch(
        "SELECT application_name, backend_type, query FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    listen = sum(1 for r in rows if is_listener(r))
    return Sample(
        rss,
        len(rows) - listen,
        listen,
        {r["application_name"] or "(none)" for r in rows},
        {r["backend_type"] for r in rows if r["backend_type"] != "client backend"},
    )


async def watch_app(app: AppProcess, admin: asyncpg.Connection, samples: list[Sample], stop: asyncio.Event):
    while not stop.is_set():
        samples.append(await sample(app, admin))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def settle_app(app: AppProcess, quiet: float = 0.02, longest: float = 20.0) -> float:
    """Wait until the app uses less than `quiet` of a core over half a second (it has
    answered, or parked, every request sent); seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < longest:
        before = app.cpu_seconds()
        await asyncio.sleep(0.5)
        if app.cpu_seconds() - before < quiet * 0.5:
            break
    return time.perf_counter() - started


def with_app_name(dsn: str) -> str:
    parts = urlsplit(dsn)
    query = "&".join(q for q in (parts.query, f"application_name={APP_NAME}") if q)
    return urlunsplit(parts._replace(query=query))


def mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB"


# -- main ------------------------------------------------------------------------------------


async def run_all(server: Server, args, tmp: Path) -> int:
    started = time.perf_counter()
    load_before = os.getloadavg()
    files = raise_file_limit(args.long_polls + args.channels + 200)
    app: AppProcess | None = None
    held: list[Held] = []
    agents: list[tuple[httpx.AsyncClient, dict]] = []
    out: dict = {}
    try:
        settings = await harness.server_settings(server.dsn)
        dsn = await server.new_database("connections")
        admin = await asyncpg.connect(dsn, server_settings={"application_name": "sb-bench-connections"})
        try:
            _, token = await Accounts(admin).add_token("bench-agent", [*IDLE_QUEUES, BEAT_QUEUE])
            app = AppProcess(
                with_app_name(dsn), tmp / "app.log", env={"SWITCHBOARD_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
            )
            log(f"the app gets SWITCHBOARD_MAX_CONNECTIONS={MAX_CONNECTIONS}")
            await app.start()
            fill = await dbmod.connect(dsn)
            try:
                await Store(fill).create_many(
                    [NewTodo(queue=BEAT_QUEUE, title=f"beat {i}", kind="bench") for i in range(args.agents)]
                )
            finally:
                await fill.close()
            agents = await claim_beats(app.base, token, args.agents)
            await heartbeats(
                app, agents, 1.0, args.interval
            )  # warm-up: pool connections, prepared statements
            await settle_app(app)
            out["idle"] = await sample(app, admin)

            log(
                f"[alone] {args.agents} agents heartbeat every {args.interval} s for {args.seconds / 2:.0f} s"
            )
            out["alone"] = await heartbeats(app, agents, args.seconds / 2, args.interval)

            log(f"[hold] opening {args.channels} SSE channels")
            t = time.perf_counter()
            held += await open_many(open_channel, args.channels, app.port, token)
            out["channels_opened_in"] = time.perf_counter() - t
            log(f"[hold] opening {args.long_polls} long-poll claims (wait={WAIT:.0f})")
            t = time.perf_counter()
            polls = await open_many(open_long_poll, args.long_polls, app.port, token)
            held += polls
            out["first_poll"] = first_poll = t
            out["polls_sent_in"] = time.perf_counter() - t
            out["settled_in"] = await settle_app(app)
            log(f"[hold] the app is idle again after {out['settled_in']:.1f} s; sampling")
            out["holding"] = await sample(app, admin)
            out["polls_answered_early"] = sum(1 for h in polls if h.status is not None or h.closed)

            log(f"[hold] {args.agents} agents heartbeat for {args.seconds:.0f} s while all are held")
            samples: list[Sample] = []
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch_app(app, admin, samples, stop))
            out["held"] = await heartbeats(app, agents, args.seconds, args.interval)
            stop.set()
            await watcher
            samples.append(await sample(app, admin))
            out["samples"] = samples
            out["end_after"] = time.perf_counter() - first_poll
            if out["end_after"] >= WAIT:
                log(
                    f"warning: the end came {out['end_after']:.0f} s after the first long-poll "
                    f"(wait={WAIT:.0f})"
                )
            app.check_alive()
        finally:
            for h in held:
                h.close()
            for client, _ in agents:
                await client.aclose()
            await admin.close()
    finally:
        if app is not None:
            app.stop()
        await server.drop_all()

    polls = [h for h in held if h.kind == "long-poll"]
    channels = [h for h in held if h.kind == "channel"]
    report = render(args, settings, server, polls, channels, out, files, load_before, started)
    print(report, flush=True)
    misses = out.get("misses", [])
    if misses:
        log(f"targets missed: {', '.join(misses)}")
    return 1 if misses and args.strict else 0


def statuses(held: list[Held]) -> str:
    counts: dict[str, int] = {}
    for h in held:
        key = f"HTTP {h.status}" if h.status is not None else "closed unanswered"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"


def render(args, settings, server, polls, channels, out, files, load_before, started) -> str:
    misses: list[str] = out.setdefault("misses", [])
    samples: list[Sample] = out["samples"]
    peak_rss = max(s.rss for s in samples)
    peak_pool = max(s.pool for s in samples)
    peak_listen = max(s.listen for s in samples)
    peak_total = max(s.pool + s.listen for s in samples)
    odd = sorted({kind for s in samples for kind in s.other})
    names = sorted({name for s in samples for name in s.names})
    waiting = [h for h in polls if h.status is None and not h.closed]
    answered = [h for h in polls if h.status is not None or h.closed]
    streaming = [h for h in channels if h.status == 200 and not h.closed]
    refused = [h for h in channels if h.status != 200 or h.closed]
    alone: Beats = out["alone"]
    held: Beats = out["held"]
    now = os.getloadavg()

    def verdict(ok: bool, what: str) -> str:
        if not ok:
            misses.append(what)
        return "PASS" if ok else "MISS"

    rows: list[tuple] = [("", "figure", "target", "result")]
    rows.append(
        (f"held: {len(channels):,} SSE channels, then {len(polls):,} long-poll claims (wait={WAIT:.0f})",)
    )
    rows.append(
        (
            "SSE channels streaming at the end",
            f"{len(streaming):,} of {len(channels):,}",
            f"all {len(channels):,}",
            verdict(not refused, "SSE channels"),
        )
    )
    rows.append(("  answers to the GETs", statuses(channels), "", ""))
    rows.append(
        (
            "  opened in; median head time",
            f"{out['channels_opened_in']:.1f} s; "
            f"{statistics.median(h.answered_after for h in channels) * 1000:.1f} ms"
            if channels
            else "",
            "",
            "",
        )
    )
    rows.append(
        (
            "long-poll claims still waiting at the end",
            f"{len(waiting):,} of {len(polls):,}",
            f"all {len(polls):,}",
            verdict(not answered, "long-polls waiting"),
        )
    )
    rows.append(("  answered before the end", statuses(answered) if answered else "none", "", ""))
    rows.append(
        (
            "  sent in; app idle again after",
            f"{out['polls_sent_in']:.1f} s; {out['settled_in']:.1f} s",
            "",
            "",
        )
    )
    rows.append(
        (
            "  the end came, after the first long-poll",
            f"{out['end_after']:.0f} s",
            f"< {WAIT:.0f} s",
            verdict(out["end_after"] < WAIT, "held within the wait"),
        )
    )
    rows.append(("the app process (psutil RSS)",))
    rows.append((f"RSS idle ({args.agents} todos claimed for the heartbeats)", mb(out["idle"].rss), "", ""))
    rows.append(("RSS holding, before the heartbeats", mb(out["holding"].rss), "", ""))
    rows.append(
        (
            "RSS holding, peak while heartbeating",
            mb(peak_rss),
            f"< {RSS_TARGET_MB:.0f} MB",
            verdict(peak_rss < RSS_TARGET_MB * 2**20, "RSS"),
        )
    )
    rows.append(
        (
            "  per held connection, over idle",
            f"{(peak_rss - out['idle'].rss) / max(1, len(polls) + len(channels)) / 1024:.1f} KiB",
            "",
            "",
        )
    )
    rows.append(("the app's database sessions (pg_stat_activity: the bench database's, but this script's)",))
    rows.append(("  application_name seen", ", ".join(names), "", ""))
    rows.append(("idle: pool + LISTEN", f"{out['idle'].pool} + {out['idle'].listen}", "", ""))
    rows.append(
        (
            "holding, peak: pool (client backends, not LISTEN)",
            str(peak_pool),
            f"≤ {POOL_SIZE} (pool size)",
            verdict(peak_pool <= POOL_SIZE, "pool sessions"),
        )
    )
    rows.append(
        (
            "holding, peak: the LISTEN connection",
            str(peak_listen),
            "1",
            verdict(peak_listen <= 1, "LISTEN sessions"),
        )
    )
    rows.append(
        (
            "holding, peak: all of the app's sessions",
            str(peak_total),
            f"≤ {POOL_SIZE + 1}",
            verdict(peak_total <= POOL_SIZE + 1, "database sessions"),
        )
    )
    if odd:
        rows.append(("  sessions of another backend_type", ", ".join(odd), "", ""))
    rows.append((f"heartbeats: {args.agents} agents, one each every {args.interval:g} s",))

    def beat_row(label: str, beats: Beats, target: bool) -> None:
        v, failures = beats.ms, beats.failures
        figure = "no samples"
        if v:
            figure = f"p50 {pct(v, 50):.1f}  p95 {pct(v, 95):.1f}  p99 {pct(v, 99):.1f}  max {max(v):.1f} ms"
            figure += f"  (n {len(v):,})"
        ok = bool(v) and pct(v, 99) <= HEARTBEAT_P99_TARGET_MS and not failures
        rows.append(
            (
                label,
                figure,
                f"p99 ≤ {HEARTBEAT_P99_TARGET_MS:.0f} ms" if target else "",
                verdict(ok, "heartbeat p99") if target else "",
            )
        )
        if failures:
            rows.append(("  failed heartbeats", f"{len(failures)}: {failures[0]}", "", ""))
        rows.append(("  the app's CPU meanwhile", f"{beats.app_cores:.2f} cores", "", ""))

    beat_row(f"nothing held, {args.seconds / 2:.0f} s (load {alone.load:.2f})", alone, False)
    beat_row(f"all held, {args.seconds:.0f} s (load {held.load:.2f})", held, True)
    slow = held.slow(HEARTBEAT_P99_TARGET_MS, out["first_poll"])
    if slow:
        rows.append(
            (
                f"  sent at (s after the first long-poll), those over {HEARTBEAT_P99_TARGET_MS:.0f} ms",
                slow,
                "",
                "",
            )
        )

    header = [
        *harness.heading("memory and connections", server, settings, harness.SETTINGS),
        f"the app: python -m dashboard.cli serve (uvicorn, 1 worker, pool of {POOL_SIZE}) with "
        f"SWITCHBOARD_MAX_CONNECTIONS={MAX_CONNECTIONS} set in its environment for this bench "
        "(the default, 1000, is fewer than the connections held)",
        f"this process: held connections on raw asyncio streams, heartbeats on httpx; open-file limit "
        f"{files[0]} (hard {files[1]}); Python {platform.python_version()}, httpx {httpx.__version__}",
        f"load average {load_before[0]:.2f} at start, {now[0]:.2f} at end; now {now[0]:.2f} / {now[1]:.2f} / "
        f"{now[2]:.2f} (1 / 5 / 15 min, {os.cpu_count()} CPUs); {time.perf_counter() - started:.0f} s in all",
    ]
    return "\n".join([*header, "", *table(rows, set())])


# --quick and full-run sizes (options.Options): flag, full run, --quick, what it is.
SIZES = """
--long-polls  1,000  100  waiting long-poll claims to hold
--channels    1,000  100  SSE channels to hold
--seconds     20.0   5.0  seconds of heartbeats while holding
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = options.Options(__doc__, "100 + 100 held, 5 s of heartbeats", SIZES, targets=True)
    parser.add_argument("--agents", type=int, default=20, help="heartbeating agents, one todo each (20)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between an agent's heartbeats")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.seconds <= 0 or args.interval < 0:
        parser.error("--agents at least 1, --seconds above 0, --interval not negative")
    if args.seconds > 40:
        parser.error("--seconds at most 40: the long-polls wait 60 s at most, and must still wait at the end")
    return args


if __name__ == "__main__":
    sys.exit(harness.run_on_server("sb-bench-conn-", run_all, parse_args(None)))
