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

log = logging.getLogger("switchboard.worker")
STDERR_TAIL = 2000
GRACE = 10.0


class ApiError(Exception):
    """The API refused a request (the problem detail's text)."""


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
        response = await self.client.post(path, json=body)
        if response.status_code == 204:
            return None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text
            raise ApiError(f"{response.status_code} on {path}: {detail}")
        return response.json()

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
        except (ApiError, httpx.HTTPError) as exc:
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
                    await self.call(f"/todos/{todo_id}/release", {"lease": lease})
                    log.info("released %s", todo_id)
                    return
            stdout, stderr = run.result()
        finally:
            beat.cancel()
        if proc.returncode == 0:
            await self.call(f"/todos/{todo_id}/complete", {"lease": lease, "result": as_result(stdout)})
            log.info("completed %s", todo_id)
        else:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
            error = f"exit status {proc.returncode}" + (f": {tail}" if tail else "")
            answer = await self.call(f"/todos/{todo_id}/fail", {"lease": lease, "error": error})
            log.info("failed %s (%s)", todo_id, "will retry" if answer["will_retry"] else "dead-lettered")

    async def heartbeat(self, todo_id: str, lease: int) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.call(f"/todos/{todo_id}/heartbeat", {"lease": lease, "ttl": self.ttl})
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("heartbeat failed: %s", exc)


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
