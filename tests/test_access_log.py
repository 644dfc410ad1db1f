"""The access log: a line per request with method, route template, status and duration."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import time

import httpx

from dashboard import logs
from dashboard.logs import FLUSH_EVERY, BackgroundHandler
from dashboard.web.access_log import access_log
from tests.conftest import scratch_database
from tests.factories import agent_token
from tests.processes import free_port, start_serving, stop


async def test_each_request_logs_its_method_route_template_status_and_duration(client, pool, caplog):
    bot = await agent_token(pool)
    with caplog.at_level(logging.INFO, logger="switchboard.access"):
        await client.get("/api/v1/todos/td_nope", headers=bot)
        await client.post("/api/v1/todos", headers=bot, json={"queue": "work", "title": "t"})
    lines = [r.getMessage() for r in caplog.records if r.name == "switchboard.access"]
    assert re.fullmatch(r"GET /api/v1/todos/\{todo_id\} 404 \d+\.\dms", lines[0]), lines
    assert re.fullmatch(r"POST /api/v1/todos 201 \d+\.\dms", lines[1]), lines


async def test_with_the_json_format_each_line_is_a_json_object(caplog):
    async def teapot(scope, receive, send):
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def ignore(message):
        pass

    with caplog.at_level(logging.INFO, logger="switchboard.access"):
        logged = access_log(as_json=True)(teapot)
        await logged({"type": "http", "method": "GET", "path_template": "/tea"}, None, ignore)
    line = json.loads(caplog.records[-1].getMessage())
    assert line["method"] == "GET" and line["route"] == "/tea" and line["status"] == 418
    assert line["duration_ms"] >= 0


def test_serves_log_writer_writes_from_its_thread_and_still_writes_once_logging_config_closed_it():
    """dashboard/logs.py: a record reaches the real handler within a few flushes; after a
    logging.config call (uvicorn makes one) has closed the writer, records are written at once."""
    stream = io.StringIO()
    writer = BackgroundHandler([logging.StreamHandler(stream)])
    logger = logging.getLogger("switchboard.test-writer")
    logger.addHandler(writer)
    logger.propagate = False
    try:
        logger.warning("first")
        deadline = time.monotonic() + 20 * FLUSH_EVERY
        while "first" not in stream.getvalue():
            assert time.monotonic() < deadline, "the writer thread never wrote the record"
            time.sleep(FLUSH_EVERY / 10)
        writer.close()  # as logging.config does to every handler (uvicorn configures logging)
        logger.warning("second")
        assert "second" in stream.getvalue()
    finally:
        logger.removeHandler(writer)
        writer.close()


async def test_under_serves_log_writer_a_request_hands_over_its_facts_and_the_thread_logs_them(
    monkeypatch,
):
    """dashboard/logs.py defer: the record is made on the writer's thread, not the request's,
    and dated when the request ended, not when the thread got to it."""
    stream = io.StringIO()
    target = logging.StreamHandler(stream)
    target.setFormatter(logging.Formatter("%(created)f %(threadName)s %(message)s"))
    writer = BackgroundHandler([target])
    access = logging.getLogger("switchboard.access")
    monkeypatch.setattr(logs, "_writer", writer)
    monkeypatch.setattr(access, "propagate", False)
    monkeypatch.setattr(access, "level", logging.INFO)
    access.addHandler(writer)

    async def teapot(scope, receive, send):
        await send({"type": "http.response.start", "status": 418, "headers": []})

    async def ignore(message):
        pass

    try:
        ended = time.time()
        await access_log(as_json=False)(teapot)(
            {"type": "http", "method": "GET", "path_template": "/tea"}, None, ignore
        )
        deadline = time.monotonic() + 20 * FLUSH_EVERY
        while "/tea" not in stream.getvalue():
            assert time.monotonic() < deadline, "the writer thread never logged the request"
            await asyncio.sleep(FLUSH_EVERY / 10)
        created, thread, line = stream.getvalue().strip().split(" ", 2)
        assert re.fullmatch(r"GET /tea 418 \d+\.\dms", line)
        assert thread == "switchboard-log"
        assert abs(float(created) - ended) < FLUSH_EVERY / 2
    finally:
        access.removeHandler(writer)
        writer.close()


def test_serve_writes_every_requests_line_before_it_exits_on_sigterm(server_dsn, template_db, tmp_path):
    """The log thread may hold lines for FLUSH_EVERY seconds: a stop right after the requests
    still writes each of them (the app's lifespan flushes them, and the process at exit)."""
    log = tmp_path / "serve.log"
    with scratch_database(server_dsn, template_db) as url:
        port = free_port()
        env = {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
        proc = start_serving(["serve", "--port", str(port)], env, log)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
                for _ in range(20):
                    assert http.get("/healthz").status_code == 200
        finally:
            assert stop(proc) == 0
    assert len(re.findall(r"switchboard\.access GET /healthz 200 \d+\.\dms", log.read_text())) == 20
