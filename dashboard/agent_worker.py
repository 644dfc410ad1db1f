"""The reference worker: `switchboard worker --queue q --exec 'command'`.

It speaks only the HTTP API, so it is also the model for agents in other languages:
long-poll POST /api/v1/claims; run the command with the todo as JSON on stdin while
heartbeating every ttl/3; complete with its stdout (JSON) or fail with its exit status
and the tail of its stderr. SIGTERM/SIGINT: stop claiming, let the running command
finish for `grace` seconds, then kill it and release the todo.
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
    ):
        self.client = httpx.AsyncClient(
            base_url=url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10, read=wait + 10),
        )
        self.queues, self.command, self.ttl, self.wait, self.once = queues, command, ttl, wait, once
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
                    self.call("/claims", {"queues": self.queues, "ttl": self.ttl, "wait": wait})
                )
                stop = asyncio.create_task(self.stopping.wait())
                await asyncio.wait({claim, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not claim.done():  # stopping while waiting for work: nothing is held
                    claim.cancel()
                    break
                todo = claim.result()
                if todo is None:
                    if self.once:
                        break
                    continue
                await self.process(todo)
        except ApiError as exc:  # refused for good (a bad token, a queue it does not cover)
            print(f"switchboard worker: {exc}", file=sys.stderr)
            return 1
        finally:
            await self.client.aclose()
        return 0

    async def process(self, todo: dict) -> None:
        todo_id, lease = todo["id"], todo["lease"]
        log.info("claimed %s (attempt %s): %s", todo_id, todo["attempt"], todo["title"])
        proc = await asyncio.create_subprocess_shell(
            self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        beat = asyncio.create_task(self.heartbeat(todo_id, lease))
        run = asyncio.create_task(proc.communicate(json.dumps(todo).encode()))
        try:
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not run.done():  # SIGTERM mid-run: give the command its grace period
                done, _ = await asyncio.wait({run}, timeout=GRACE)
                if not done:  # the whole process group: a shell may have forked the command
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    await run
                    if await self.ack(todo_id, "release", {"lease": lease}) is not None:
                        log.info("released %s", todo_id)
                    return
            stdout, stderr = run.result()
        finally:
            beat.cancel()
        if proc.returncode == 0:
            if await self.ack(todo_id, "complete", {"lease": lease, "result": as_result(stdout)}) is not None:
                log.info("completed %s", todo_id)
        else:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
            error = f"exit status {proc.returncode}" + (f": {tail}" if tail else "")
            answer = await self.ack(todo_id, "fail", {"lease": lease, "error": error})
            if answer is not None:
                outcome = "will retry" if answer["will_retry"] else "dead-lettered"
                log.info("failed %s (%s): %s", todo_id, outcome, error)

    async def ack(self, todo_id: str, action: str, body: dict) -> dict | None:
        """complete, fail or release; None (logged) when the todo is gone or no longer ours."""
        try:
            return await self.call(f"/todos/{todo_id}/{action}", body)
        except ApiError as exc:
            if not exc.todo_gone:
                raise
            log.warning("dropping %s, the %s was refused: %s", todo_id, action, exc)
            return None

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
        args.url, args.token, args.queue, args.command, ttl=args.ttl, wait=args.wait, once=args.once
    )
    with contextlib.suppress(asyncio.CancelledError):
        return await worker.run()
    return 0
