"""The reference worker: `switchboard worker --queue q --exec 'command'`.

It speaks only the HTTP API, so it is also the model for agents in other languages:
long-poll POST /api/v1/claims for up to `--batch` todos (`max`); run the command once per
todo, side by side, with the todo as JSON on stdin, heartbeating each every ttl/3; then
acknowledge them together in one POST /api/v1/acks: complete with the command's stdout
(JSON), or fail with its exit status and the tail of its stderr. SIGTERM/SIGINT: stop
claiming, let running commands finish for `grace` seconds, then kill them and release
their todos.
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

from dashboard.backoff import Backoff

log = logging.getLogger("switchboard.worker")
STDERR_TAIL = 2000
GRACE = 10.0


class ApiError(Exception):
    """The API refused a request for good (a 4xx): its status and problem detail's text."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

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
                    detail = response.json().get("detail")
                except ValueError:
                    detail = response.text
                if response.status_code < 500 and response.status_code != 429:
                    raise ApiError(response.status_code, f"{response.status_code} on {path}: {detail}")
                problem = f"{response.status_code} {detail}"
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
                wait = 0 if self.once else self.wait
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
        in; then acknowledge every finished one in one request."""
        beats = [asyncio.create_task(self.heartbeat(t["id"], t["lease"])) for t in todos]
        try:
            outcomes = await asyncio.gather(*(self.execute(todo) for todo in todos))
            acks = [ack for ack in outcomes if ack is not None]
            if acks:
                await self.acknowledge(acks)
        finally:
            for beat in beats:
                beat.cancel()

    async def execute(self, todo: dict) -> dict | None:
        """Run the command on one todo: its ack (complete or fail), or None when stopping
        killed it (the todo is released)."""
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
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not run.done():  # SIGTERM mid-run: give the command its grace period
            done, _ = await asyncio.wait({run}, timeout=GRACE)
            if not done:  # the whole process group: a shell may have forked the command
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await run
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
            if result["status"] != 200:
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

    async def heartbeat(self, todo_id: str, lease: int) -> None:
        """Every ttl/3, through outages (call retries); stops once the lease is not ours."""
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.call(f"/todos/{todo_id}/heartbeat", {"lease": lease, "ttl": self.ttl})
            except ApiError as exc:
                log.warning("heartbeat for %s refused, no longer heartbeating it: %s", todo_id, exc)
                return


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
