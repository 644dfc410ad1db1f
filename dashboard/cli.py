"""The `switchboard` command: up, serve, migrate, reap, enqueue, worker, mcp, operator, token, queue, todo."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys

from dashboard.config import Settings
from dashboard.errors import InvalidInput, SwitchboardError
from dashboard.models import MAX_HTTP_BATCH


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        settings = Settings.from_environ()  # a bad setting is a usage error, whatever the command
        return args.run(args, settings) or 0
    except SwitchboardError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def serving(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        # a string default goes through type=int too: a bad PORT is a usage error, not a traceback
        cmd.add_argument("--port", type=int, default=os.environ.get("PORT", "8000"))

    up = sub.add_parser("up", help="newcomer: embedded database, migrate, serve, reap")
    serving(up)
    up.set_defaults(run=cmd_up)
    serve = sub.add_parser("serve", help="serve the dashboard and API (and reap) on DATABASE_URL")
    serving(serve)
    serve.set_defaults(run=cmd_serve)

    sub.add_parser("migrate", help="apply pending migrations").set_defaults(run=cmd_migrate)

    reap = sub.add_parser("reap", help="re-surface lapsed leases and promote due retries")
    reap.add_argument("--once", action="store_true", help="one pass, then exit")
    reap.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    reap.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (not with --once)"
    )
    reap.add_argument(
        "--metrics-address", default="127.0.0.1", help="where --metrics-port listens (default 127.0.0.1)"
    )
    reap.set_defaults(run=cmd_reap)

    enq = sub.add_parser("enqueue", help="create a todo (prints it as JSON)")
    enq.add_argument("queue")
    enq.add_argument("title")
    enq.add_argument("--payload", default="{}", help="a JSON object")
    enq.add_argument("--kind")
    enq.add_argument("--source")
    enq.add_argument("--key", dest="idempotency_key", help="idempotency key")
    enq.add_argument("--assignee")
    enq.add_argument("--max-attempts", type=int, default=5)
    enq.add_argument("--priority", default="0", help="-10 to 10; higher is claimed first (default 0)")
    enq.add_argument("--run-at", help="not claimable before this time (ISO 8601 with a zone)")
    enq.add_argument("--delay", help="not claimable for this many seconds")
    enq.add_argument("--assignee-until", help="after this time (ISO 8601 with a zone) any agent may claim it")
    enq.set_defaults(run=cmd_enqueue)

    def acting(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
        cmd.add_argument(
            "--as",
            dest="actor",
            metavar="NAME",
            default="cli",
            help="the operator's name the history records (default cli)",
        )
        return cmd

    queue = sub.add_parser("queue", help="pause and resume queues").add_subparsers(
        dest="action", required=True
    )
    qpause = acting(queue.add_parser("pause", help="claims skip the queue until it is resumed"))
    qpause.add_argument("name")
    qpause.add_argument("--reason")
    qpause.set_defaults(run=cmd_queue_pause)
    qresume = acting(queue.add_parser("resume", help="claims take from the queue again"))
    qresume.add_argument("name")
    qresume.add_argument("--reason")
    qresume.set_defaults(run=cmd_queue_resume)
    queue.add_parser("paused", help="list the paused queues (as JSON)").set_defaults(run=cmd_queue_paused)

    todo = sub.add_parser("todo", help="cancel, run now or edit a todo").add_subparsers(
        dest="action", required=True
    )
    tcancel = acting(todo.add_parser("cancel", help="dead-letter a pending or claimed todo as cancelled"))
    tcancel.add_argument("id")
    tcancel.add_argument("--reason")
    tcancel.set_defaults(run=cmd_todo_cancel)
    trun = acting(todo.add_parser("run-now", help="make a scheduled or retrying todo claimable now"))
    trun.add_argument("id")
    trun.set_defaults(run=cmd_todo_run_now)
    tedit = acting(
        todo.add_parser("edit", help="change a pending or dead todo (the fields given; never while claimed)")
    )
    tedit.add_argument("id")
    tedit.add_argument("--title")
    tedit.add_argument("--kind", help='"" clears it')
    tedit.add_argument("--payload", help="a JSON object (replaces the payload)")
    tedit.add_argument("--assignee", help='"" clears it')
    tedit.add_argument("--assignee-until", help='ISO 8601 with a zone; "" clears it')
    tedit.add_argument("--priority", help="-10 to 10")
    tedit.add_argument("--max-attempts")
    tedit.add_argument("--run-at", help="reschedule a pending todo (ISO 8601 with a zone)")
    tedit.add_argument("--retry", action="store_true", help="retry the dead todo too, in the same step")
    tedit.set_defaults(run=cmd_todo_edit)

    worker = sub.add_parser("worker", help="claim todos over HTTP and run a command for each")
    worker.add_argument("--queue", action="append", required=True, help="repeat for several")
    worker.add_argument("--exec", dest="command", required=True, help="shell command; todo JSON on stdin")
    worker.add_argument("--url", help="the server (default $SWITCHBOARD_URL, else http://127.0.0.1:8000)")
    worker.add_argument("--token", help="an agent token (default $SWITCHBOARD_TOKEN)")
    worker.add_argument("--ttl", type=float, default=60)
    worker.add_argument("--wait", type=float, default=20, help="long-poll seconds per claim")
    worker.add_argument("--once", action="store_true", help="exit when no work is ready")
    worker.add_argument(
        "--batch", type=batch_size, default=1, help="claim up to N todos at once and run them side by side"
    )
    worker.set_defaults(run=cmd_worker)

    mcp = sub.add_parser(
        "mcp", help="the MCP tools over stdio for a local MCP client, relayed to a server's /mcp"
    )
    mcp.add_argument("--url", help="the server (default $SWITCHBOARD_URL, else http://127.0.0.1:8000)")
    mcp.add_argument("--token", help="an agent token (default $SWITCHBOARD_TOKEN)")
    mcp.set_defaults(run=cmd_mcp)

    op = sub.add_parser("operator", help="dashboard accounts").add_subparsers(dest="action", required=True)
    add = op.add_parser("add", help="create an operator; prints the password once")
    add.add_argument("name")
    add.add_argument("--role", choices=("viewer", "operator"), default="operator")
    add.set_defaults(run=cmd_operator_add)
    passwd = op.add_parser(
        "passwd", help="give an operator a new password (printed once); ends their sessions"
    )
    passwd.add_argument("name")
    passwd.set_defaults(run=cmd_operator_passwd)
    remove = op.add_parser("remove", help="delete an operator; ends their sessions (their history stays)")
    remove.add_argument("name")
    remove.set_defaults(run=cmd_operator_remove)

    tok = sub.add_parser("token", help="API tokens for agents").add_subparsers(dest="action", required=True)
    tadd = tok.add_parser("add", help="create a token; prints it once, as the last line")
    tadd.add_argument("agent")
    tadd.add_argument("--queues", required=True, help="comma-separated queue names")
    tadd.set_defaults(run=cmd_token_add)
    tok.add_parser("list", help="list tokens (never their secrets)").set_defaults(run=cmd_token_list)
    trev = tok.add_parser("revoke", help="revoke a token by id")
    trev.add_argument("token_id")
    trev.set_defaults(run=cmd_token_revoke)
    return p


def batch_size(text: str) -> int:
    """--batch: as many todos as one claim may take (the API's `max`)."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_HTTP_BATCH:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_HTTP_BATCH}")
    return int(text)


def number(text: str | None, kind: type[int] | type[float]):
    """A command-line number as `kind`; text that is not one goes to the store as it is,
    which refuses it saying what the value must be (one message for the CLI and the API)."""
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        return text


def json_object(text: str, field: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(field, f"is not JSON: {exc}") from None


def print_json(value) -> None:
    import msgspec

    print(msgspec.json.format(msgspec.json.encode(value)).decode())


def operator(args):
    """The operator a queue or todo command acts as (--as)."""
    from dashboard.models import Actor

    return Actor("operator", args.actor)


def server_address(args, settings: Settings) -> None:
    """--url and --token, from the settings where not given."""
    args.url = args.url or settings.url
    args.token = args.token or settings.token


@contextlib.asynccontextmanager
async def database(settings: Settings):
    """The database open (migrated), closed afterwards."""
    from dashboard.migrate import open_database

    db = await open_database(settings)
    try:
        yield db
    finally:
        await db.close()


def with_database(fn):
    """A command that runs `fn(db, args)` with the database open."""

    async def runner(args, settings: Settings):
        async with database(settings) as db:
            return await fn(db, args)

    return lambda args, settings: asyncio.run(runner(args, settings))


def cmd_up(args, settings: Settings) -> int:
    from dashboard.web.server import serve

    return serve(args.host, args.port, settings, newcomer=True)


def cmd_serve(args, settings: Settings) -> int:
    from dashboard.web.server import serve

    return serve(args.host, args.port, settings, newcomer=False)


@with_database
async def cmd_migrate(db, args) -> int:
    for name in db.migrated:  # open_database applied whatever was missing
        print(f"applied {name}")
    print("migrations are up to date")
    return 0


def cmd_reap(args, settings: Settings) -> int:
    return asyncio.run(reap(args, settings))


async def reap(args, settings: Settings) -> int:
    from dashboard.horizon import HorizonWatch
    from dashboard.lapsed import reap_once
    from dashboard.reaper import run_reaper
    from dashboard.store import Store

    async with database(settings) as db:
        store = Store(db.pool)
        if args.once:
            reaped, promoted = await reap_once(store)
            print(f"reaped {reaped} lapsed leases, promoted {promoted} due retries")
            return 0
        if args.metrics_port is not None:
            from prometheus_client import disable_created_metrics, start_http_server

            disable_created_metrics()
            start_http_server(args.metrics_port, addr=args.metrics_address)
            print(f"metrics on http://{args.metrics_address}:{args.metrics_port}/metrics", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # what process managers send; PID 1 has no default
            loop.add_signal_handler(sig, stop.set)
        horizon = HorizonWatch(db.pool, warn=settings.horizon_warn_seconds)
        await run_reaper(store, settings, interval=args.interval, stop=stop, horizon=horizon)
        logging.getLogger("switchboard.reaper").info("reaper stopped")
        return 0


@with_database
async def cmd_enqueue(db, args) -> int:
    from dashboard.models import Actor, NewTodo
    from dashboard.store import Store

    payload = json_object(args.payload, "payload")
    item = NewTodo(
        queue=args.queue,
        title=args.title,
        payload=payload,
        kind=args.kind,
        source=args.source,
        idempotency_key=args.idempotency_key,
        assignee=args.assignee,
        max_attempts=args.max_attempts,
        priority=number(args.priority, int),
        run_at=args.run_at,
        delay=number(args.delay, float),
        assignee_until=args.assignee_until,
    )
    created = await Store(db.pool).create(item, actor=Actor("producer", "cli"))
    print_json(created)
    return 0


@with_database
async def cmd_queue_pause(db, args) -> int:
    from dashboard.control import Control

    print_json(await Control(db.pool).pause(args.name, operator(args), args.reason))
    return 0


@with_database
async def cmd_queue_resume(db, args) -> int:
    from dashboard.control import Control

    resumed = await Control(db.pool).resume(args.name, operator(args), args.reason)
    print_json({"queue": args.name, "resumed": resumed})
    return 0


@with_database
async def cmd_queue_paused(db, args) -> int:
    from dashboard.reads import Reads

    print_json(await Reads(db.pool).paused_queues())
    return 0


@with_database
async def cmd_todo_cancel(db, args) -> int:
    from dashboard.control import Control

    print_json(await Control(db.pool).cancel(args.id, operator(args), args.reason))
    return 0


@with_database
async def cmd_todo_run_now(db, args) -> int:
    from dashboard.control import Control

    print_json(await Control(db.pool).run_now(args.id, operator(args)))
    return 0


@with_database
async def cmd_todo_edit(db, args) -> int:
    from dashboard.control import Control
    from dashboard.models import TodoEdit

    given = {
        "title": args.title,
        "kind": args.kind,
        "assignee": args.assignee,
        "assignee_until": args.assignee_until,
        "priority": number(args.priority, int),
        "max_attempts": number(args.max_attempts, int),
        "run_at": args.run_at,
    }
    fields = {name: value for name, value in given.items() if value is not None}
    for clearable in ("kind", "assignee", "assignee_until"):
        if fields.get(clearable) == "":
            fields[clearable] = None
    if args.payload is not None:
        fields["payload"] = json_object(args.payload, "payload")
    todo = await Control(db.pool).edit(args.id, operator(args), TodoEdit(**fields), retry=args.retry)
    print_json(todo)
    return 0


def cmd_worker(args, settings: Settings) -> int:
    from dashboard.agent_worker import run_command_worker

    server_address(args, settings)
    return asyncio.run(run_command_worker(args))


def cmd_mcp(args, settings: Settings) -> int:
    from dashboard.mcp_proxy import serve_stdio

    server_address(args, settings)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # stderr is the MCP client's log
    return asyncio.run(serve_stdio(args.url, args.token))


@with_database
async def cmd_operator_add(db, args) -> int:
    from dashboard.accounts import Accounts

    password = await Accounts(db.pool).add_operator(args.name, args.role)
    print(f"operator {args.name} ({args.role}) created; password (shown once):")
    print(password)
    return 0


@with_database
async def cmd_operator_passwd(db, args) -> int:
    from dashboard.accounts import Accounts

    password = await Accounts(db.pool).set_password(args.name)
    print(f"operator {args.name} has a new password (shown once); their sessions have ended:")
    print(password)
    return 0


@with_database
async def cmd_operator_remove(db, args) -> int:
    from dashboard.accounts import Accounts

    await Accounts(db.pool).remove_operator(args.name)
    print(f"operator {args.name} removed; their sessions have ended")
    return 0


@with_database
async def cmd_token_add(db, args) -> int:
    from dashboard.accounts import Accounts

    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    token_id, secret = await Accounts(db.pool).add_token(args.agent, queues)
    print(f"token {token_id} for agent {args.agent} on queues {', '.join(queues)} (shown once):")
    print(secret)
    return 0


@with_database
async def cmd_token_list(db, args) -> int:
    from dashboard.accounts import Accounts

    for t in await Accounts(db.pool).list_tokens():
        state = f"revoked {t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "active"
        print(f"{t.id}  {t.agent:<20} {','.join(t.queues):<30} {state}")
    return 0


@with_database
async def cmd_token_revoke(db, args) -> int:
    from dashboard.accounts import Accounts

    await Accounts(db.pool).revoke_token(args.token_id, actor="cli")
    print(f"token {args.token_id} revoked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
