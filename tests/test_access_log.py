"""The access log: a line per request with method, route template, status and duration."""

from __future__ import annotations

import io
import json
import logging
import re
import time

from dashboard.logs import FLUSH_EVERY, BackgroundHandler
from dashboard.web.access_log import access_log
from tests.factories import agent_token


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
