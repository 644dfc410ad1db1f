"""switchboard as a user gets it: the wheel in a fresh venv, `switchboard up` in an empty
folder outside the checkout (embedded PostgreSQL), a todo through its whole life over
HTTP, then SIGTERM (what systemd, Docker and Procfile runners send) with an SSE stream
and a long-poll claim open: both end, the process exits within the bound, and neither
the server nor its PostgreSQL is left running."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import ROOT
from tests.processes import STOP_WITHIN, free_port

pytestmark = [pytest.mark.slow, pytest.mark.wheel]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """The bin folder of a fresh venv holding the wheel built from this checkout."""
    base = tmp_path_factory.mktemp("wheel")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "check": True}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", base / "dist", ROOT], **quiet)
    subprocess.run([sys.executable, "-m", "venv", base / "venv"], **quiet)
    wheel = next((base / "dist").glob("switchboard-*.whl"))
    subprocess.run([base / "venv" / "bin" / "pip", "install", "--disable-pip-version-check", wheel], **quiet)
    return str(base / "venv" / "bin")


def start_up(bin_dir: str, folder, port: int) -> tuple[subprocess.Popen, str]:
    """`switchboard up` in `folder`; returns the process and the first operator's password,
    once it says it is up (which it only says after its socket listens)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SWITCHBOARD_DATA")}
    proc = subprocess.Popen(
        [f"{bin_dir}/switchboard", "up", "--port", str(port)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    password, seen = None, []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        seen.append(line)
        if match := re.search(r"first operator: name admin, password (\S+)", line):
            password = match.group(1)
        if "switchboard is up on" in line:
            httpx.get(f"http://127.0.0.1:{port}/healthz").raise_for_status()  # listening already
            return proc, password
        assert time.monotonic() < deadline, "".join(seen)
    raise AssertionError("switchboard up exited:\n" + "".join(seen))


def postmaster(folder) -> psutil.Process | None:
    pid_file = folder / ".pgdata" / "postmaster.pid"
    if not pid_file.exists():
        return None
    try:
        return psutil.Process(int(pid_file.read_text().split()[0]))
    except psutil.NoSuchProcess:
        return None


async def life_of_a_todo(base: str, password: str, token: str) -> None:
    async with httpx.AsyncClient(base_url=base) as browser:
        await browser.get("/login")
        login = await browser.post(
            "/login",
            data={"name": "admin", "password": password, "_csrf_token": browser.cookies["csrftoken"]},
        )
        assert login.status_code == 303 and (await browser.get("/")).status_code == 200
        docs = (await browser.get("/api/v1/docs")).text  # its vendored assets came in the wheel
        assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', docs)
        assert assets and all([(await browser.get(url)).status_code == 200 for url in assets]), assets
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=f"{base}/api/v1", headers=headers) as api:
        created = await api.post("/todos", json={"queue": "work", "title": "from the wheel"})
        assert created.status_code == 201, created.text
        held = (await api.post("/claims", json={"queues": ["work"], "ttl": 30})).json()
        done = await api.post(f"/todos/{held['id']}/complete", json={"lease": held["lease"]})
        assert done.json()["todo"]["state"] == "done"


async def stop_with_streams_open(proc: subprocess.Popen, base: str, token: str) -> float:
    """SIGTERM while a channel stream and a waiting claim are open; both must end."""
    headers = {"Authorization": f"Bearer {token}"}
    long_poll = {"queues": ["work"], "ttl": 30, "wait": 30}
    async with (
        httpx.AsyncClient(base_url=f"{base}/api/v1", headers=headers, timeout=30) as api,
        api.stream("GET", "/channels", params={"queues": "work"}) as stream,
    ):
        lines = stream.aiter_lines()
        assert (await anext(lines)).startswith("event: resync")  # the stream is open
        waiting = asyncio.create_task(api.post("/claims", json=long_poll))
        # Time for the request to reach the server; it then waits there (nothing to claim),
        # which nothing outside the server can observe.
        await asyncio.sleep(0.5)
        assert not waiting.done()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        answer = await asyncio.wait_for(waiting, STOP_WITHIN)
        async with asyncio.timeout(STOP_WITHIN):
            async for _ in lines:  # the server ends the stream
                pass
    assert answer.status_code == 204  # the waiting claim claimed nothing
    await asyncio.to_thread(proc.wait, STOP_WITHIN)
    return time.monotonic() - started


def test_the_wheel_runs_up_from_an_empty_folder_and_stops_cleanly_on_sigterm(installed, tmp_path):
    port = free_port()
    proc, password = start_up(installed, tmp_path, port)
    try:
        assert password, "switchboard up did not print the first operator's password"
        server = postmaster(tmp_path)
        assert server is not None and server.is_running()
        token = subprocess.run(
            [f"{installed}/switchboard", "token", "add", "bot", "--queues", "work"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[-1]
        base = f"http://127.0.0.1:{port}"
        asyncio.run(life_of_a_todo(base, password, token))
        took = asyncio.run(stop_with_streams_open(proc, base, token))
        output = proc.stdout.read()
        assert proc.returncode == 0, output
        assert took < STOP_WITHIN
        assert "stopped (SIGTERM)" in output
        psutil.wait_procs([server], timeout=STOP_WITHIN)
        assert not server.is_running(), "the embedded PostgreSQL was left running"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = postmaster(tmp_path)
        if left is not None:
            left.terminate()
