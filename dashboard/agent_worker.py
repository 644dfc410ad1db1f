"""The reference worker: `switchboard worker --queue q --exec 'command'`.

It speaks only the HTTP API, so it is also the model for agents in other languages:
long-poll POST /api/v1/claims for up to `--batch` todos (`max`); run the command once per
todo, side by side, with the todo as JSON on stdin, heartbeating each every ttl/3; then
acknowledge them together in one POST /api/v1/acks: complete with the command's stdout
(JSON), or fail with its exit status and the tail of its stderr. SIGTERM/SIGINT: stop
claiming, let running commands finish for `grace` seconds, then kill them and release
their todos.

A todo cancelled while its command runs is learnt at the next heartbeat (a 409 whose
problem type ends in `/cancelled`): the command's process group (it runs in a session of
its own, so whatever it started too) gets SIGTERM, then SIGKILL after CANCEL_GRACE
seconds; the todo is not acknowledged (it is already failed, as cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

import httpx
import psutil

from dashboard.backoff import Backoff, shorter_wait

log = logging.getLogger("switchboard.worker")
STDERR_TAIL = 2000
GRACE = 10.0
CANCEL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for the command of a cancelled todo


class ApiError(Exception):
    """The API refused a request for good (a 4xx): its status, the problem detail's text
    and the problem details themselves."""

    def __init__(self, status: int, message: str, problem: dict | None = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}

    @property
    def cancelled(self) -> bool:
        """409 on a todo that was cancelled while we held it: stop working on it."""
        return self.status == 409 and is_cancellation(self.problem)

    @property
    def todo_gone(self) -> bool:
        """404/409 on a todo: it no longer exists or is no longer ours (lease lapsed, fenced)."""
        return self.status in (404, 409)


class CommandWorker:
    def __init__(
        self,
        url: str,
        token: str,
        queues: list[str],
        command: str,
        *,
        ttl: float = 60,
        wait: float = 20,
        once: bool = False,
        batch: int = 1,
    ):
        self.client = httpx.AsyncClient(
            base_url=url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10, read=wait + 10),
        )
        self.queues, self.command, self.ttl, self.wait, self.once = queues, command, ttl, wait, once
        self.batch = batch
        self.stopping = asyncio.Event()

    async def call(self, path: str, body: dict) -> dict | None:
        """POST, retrying what is transient (no connection, a timeout, 5xx, 429) with capped,
        jittered backoff until an answer comes; a 4xx is an ApiError. Retrying an ack is
        safe: it carries its lease, so a duplicate or a late one is refused, never applied
        twice. Once stopping, retries end after the grace period."""
        backoff = Backoff()
        give_up = None
        while True:
            try:
                response = await self.client.post(path, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__} {exc}".strip()
            else:
                if response.status_code == 204:
                    return None
                if response.status_code < 400:
                    return response.json()
                try:
                    answer = response.json()
                except ValueError:
                    answer = None
                answer = answer if isinstance(answer, dict) else {}  # the problem details
                detail = answer.get("detail", response.text)
                status = response.status_code
                if status < 500 and status != 429:
                    raise ApiError(status, f"{status} on {path}: {detail}", answer)
                problem = f"{status} {detail}"
            loop = asyncio.get_running_loop()
            if self.stopping.is_set():
                give_up = give_up or loop.time() + GRACE
                if loop.time() >= give_up:
                    raise ApiError(503, f"{path}: gave up while stopping ({problem})")
            delay = backoff.next()
            log.warning("%s on %s; retrying in %.1fs", problem, path, delay)
            await asyncio.sleep(delay)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        try:
            while not self.stopping.is_set():
                # re-sent as soon as it answers: spread, so that workers started together drift apart
                wait = 0 if self.once else shorter_wait(self.wait)
                claim = asyncio.create_task(
                    self.call(
                        "/claims", {"queues": self.queues, "ttl": self.ttl, "wait": wait, "max": self.batch}
                    )
                )
                stop = asyncio.create_task(self.stopping.wait())
                await asyncio.wait({claim, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not claim.done():  # stopping while waiting for work: nothing is held
                    claim.cancel()
                    break
                todos = claim.result()["todos"]
                if not todos:
                    if self.once:
                        break
                    continue
                await self.process(todos)
        except ApiError as exc:  # refused for good (a bad token, a queue it does not cover)
            print(f"switchboard worker: {exc}", file=sys.stderr)
            return 1
        finally:
            await self.client.aclose()
        return 0

    async def process(self, todos: list[dict]) -> None:
        """Run the command for each todo, side by side, each heartbeated until its ack is
        in; then acknowledge every finished one in one request. A heartbeat that finds its
        todo cancelled settles the todo's `cancelled` future: its command is ended."""
        loop = asyncio.get_running_loop()
        cancellations = [loop.create_future() for _ in todos]
        beats = [
            asyncio.create_task(self.heartbeat(t["id"], t["lease"], cancelled))
            for t, cancelled in zip(todos, cancellations, strict=True)
        ]
        try:
            outcomes = await asyncio.gather(
                *(self.execute(todo, cancelled) for todo, cancelled in zip(todos, cancellations, strict=True))
            )
            acks = [ack for ack in outcomes if ack is not None]
            if acks:
                await self.acknowledge(acks)
        finally:
            for beat in beats:
                beat.cancel()

    async def execute(self, todo: dict, cancelled: asyncio.Future | None = None) -> dict | None:
        """Run the command on one todo: its ack (complete or fail), or None when stopping
        killed it (the todo is released) or when `cancelled` came first (its result: a
        note for the log; the command is ended and the todo left as it is)."""
        cancelled = cancelled if cancelled is not None else asyncio.get_running_loop().create_future()
        todo_id, lease = todo["id"], todo["lease"]
        log.info("claimed %s (attempt %s): %s", todo_id, todo["attempt"], todo["title"])
        proc = await asyncio.create_subprocess_shell(
            self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        run = asyncio.create_task(proc.communicate(json.dumps(todo).encode()))
        stop = asyncio.create_task(self.stopping.wait())
        await asyncio.wait({run, stop, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not run.done() and not cancelled.done():  # SIGTERM mid-run: give the command its grace
            await asyncio.wait({run, cancelled}, timeout=GRACE, return_when=asyncio.FIRST_COMPLETED)
        if not run.done() and cancelled.done():
            log.warning("%s; ending its command (process group %s)", cancelled.result(), proc.pid)
            await end_group(proc.pid, run, CANCEL_GRACE)
            return None
        if not run.done():  # the grace period is over: the whole process group (a shell may
            await end_group(proc.pid, run, 0)  # have forked the command)
            await self.release(todo_id, lease)
            return None
        stdout, stderr = run.result()
        if proc.returncode == 0:
            return {"id": todo_id, "lease": lease, "complete": {"result": as_result(stdout)}}
        tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
        error = f"exit status {proc.returncode}" + (f": {tail}" if tail else "")
        return {"id": todo_id, "lease": lease, "fail": {"error": error}}

    async def acknowledge(self, acks: list[dict]) -> None:
        """POST /acks; an ack refused on its own (404/409: the todo is gone or no longer
        ours, its lease lapsed and it was claimed again) is logged and dropped."""
        answer = await self.call("/acks", {"acks": acks})
        for ack, result in zip(acks, answer["results"], strict=True):
            todo_id = ack["id"]
            if result["status"] == 409 and is_cancellation(result["problem"]):
                log.warning("%s; its ack is dropped", cancellation_note(todo_id, result["problem"]))
            elif result["status"] != 200:
                log.warning("dropping %s, the ack was refused: %s", todo_id, result["problem"]["detail"])
            elif "complete" in ack:
                log.info("completed %s", todo_id)
            else:
                outcome = "will retry" if result["todo"]["state"] == "pending" else "dead-lettered"
                log.info("failed %s (%s): %s", todo_id, outcome, ack["fail"]["error"])

    async def release(self, todo_id: str, lease: int) -> None:
        """Give a todo back; a refusal (it is gone or no longer ours) is logged."""
        try:
            await self.call(f"/todos/{todo_id}/release", {"lease": lease})
            log.info("released %s", todo_id)
        except ApiError as exc:
            if not exc.todo_gone:
                raise
            log.warning("dropping %s, the release was refused: %s", todo_id, exc)

    async def heartbeat(self, todo_id: str, lease: int, cancelled: asyncio.Future | None = None) -> None:
        """Every ttl/3, through outages (call retries); stops once the lease is not ours.
        A refusal saying the todo was cancelled settles `cancelled` with a note for the log."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.call(f"/todos/{todo_id}/heartbeat", {"lease": lease, "ttl": self.ttl})
            except ApiError as exc:
                if exc.cancelled and cancelled is not None:
                    if not cancelled.done():
                        cancelled.set_result(cancellation_note(todo_id, exc.problem))
                    return
                log.warning("heartbeat for %s refused, no longer heartbeating it: %s", todo_id, exc)
                return


async def end_group(pgid: int, run: asyncio.Task, grace: float) -> None:
    """End a command's process group: SIGTERM, and SIGKILL to whatever of it still runs
    after `grace` seconds (no grace: SIGKILL at once); then wait for `run` (its communicate())."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    if grace > 0:
        signal_group(pgid, signal.SIGTERM)
        await asyncio.wait({run}, timeout=grace)
        # The command is over, but a member that left its pipes may still be ending (no
        # event tells when a process group empties: poll it).
        while group_running(pgid) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    if not run.done() or group_running(pgid):
        signal_group(pgid, signal.SIGKILL)
    await run


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_running(pgid: int) -> bool:
    """Whether a process of the group still runs: an exited one its parent has not reaped
    yet (a zombie, say an orphan waiting for init) does not count."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def is_cancellation(problem: dict) -> bool:
    """Problem details saying the todo was cancelled (type `…/cancelled`)."""
    return str(problem.get("type", "")).endswith("/cancelled")


def cancellation_note(todo_id: str, problem: dict) -> str:
    """A log line's start, from the problem details: todo X was cancelled by NAME: REASON."""
    by = problem.get("cancelled_by") or "someone"
    reason = problem.get("reason")
    return f"todo {todo_id} was cancelled by {by}" + (f": {reason}" if reason else " (no reason given)")


def as_result(stdout: bytes) -> dict[str, Any]:
    """The command's stdout as the todo's result: a JSON object as is, anything else wrapped."""
    text = stdout.decode(errors="replace").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"stdout": text[-10000:]}
    return value if isinstance(value, dict) else {"value": value}


async def run_command_worker(args) -> int:
    if not args.token:
        print("switchboard worker: give --token or set SWITCHBOARD_TOKEN", file=sys.stderr)
        return 2
    worker = CommandWorker(
        args.url,
        args.token,
        args.queue,
        args.command,
        ttl=args.ttl,
        wait=args.wait,
        once=args.once,
        batch=args.batch,
    )
    with contextlib.suppress(asyncio.CancelledError):
        return await worker.run()
    return 0
