"""GET /metrics and what it counts: transitions by queue, the queue gauges (the overview's
counts, from the same cache), the histograms, who may scrape, and the reaper's endpoint.

The metric objects are process-global (every test in this process moves them), so tests
compare a scrape before with one after, never absolute values; each uses its own queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.errors import Conflict
from dashboard.models import Actor
from tests.conftest import ROOT, build_app, in_process
from tests.factories import (
    claimed,
    dead_letter,
    enqueue,
    expire_lease,
    login,
    make_retry_due,
    new_todo,
    retrying,
    unique,
)
from tests.test_horizon import report
from tests.web_helpers import count, get_page, queue_row

TOKEN = "s3cret-metrics-token"
TRANSITIONS = (
    "created",
    "deduplicated",
    "claimed",
    "completed",
    "failed",
    "retried",
    "dead_lettered",
    "reaped",
    "released",
)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, by (sample name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scrape: dict, name: str, **labels) -> float:
    return scrape.get((name, frozenset(labels.items())), 0.0)


def transitions(scrape: dict, queue: str) -> dict[str, float]:
    return {t: value(scrape, f"switchboard_todos_{t}_total", queue=queue) for t in TRANSITIONS}


def moved(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.fixture
async def open_metrics(monkeypatch, dsn, pool):
    """A client of the app (no reaper) with SWITCHBOARD_METRICS=open."""
    monkeypatch.setenv("SWITCHBOARD_METRICS", "open")
    monkeypatch.delenv("SWITCHBOARD_METRICS_TOKEN", raising=False)
    async with in_process(await build_app(dsn, pool, reaper=False)) as client:
        yield client


async def scrape(client, **headers) -> dict:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "_created{" not in response.text  # no creation-time twin of each series
    return samples(response.text)


# -- counters ----------------------------------------------------------------------------


async def test_each_transition_moves_its_counter_for_its_queue_only(control, open_metrics, store, pool):
    q, other = unique("m"), unique("m")
    await enqueue(store, other)
    start = await scrape(open_metrics)

    async def step(action) -> dict:
        before = transitions(await scrape(open_metrics), q)
        await action()
        return moved(before, transitions(await scrape(open_metrics), q))

    async def create_and_complete():
        todo = await claimed(store, q, idempotency_key="k")
        await store.create(new_todo(q, idempotency_key="k"))
        await store.complete(todo.id, todo.owner, todo.lease_token)

    assert await step(create_and_complete) == {"created": 1, "deduplicated": 1, "claimed": 1, "completed": 1}

    todo = await claimed(store, q, max_attempts=2)

    async def fail_twice():
        await store.fail(todo.id, todo.owner, todo.lease_token, "once")
        await make_retry_due(pool, todo.id)
        again = await store.claim(todo.id, todo.owner, 30)
        await store.fail(todo.id, todo.owner, again.lease_token, "twice")

    assert await step(fail_twice) == {"failed": 2, "claimed": 1, "dead_lettered": 1}
    assert await step(lambda: control.retry(todo.id, Actor("operator", "olga"))) == {"retried": 1}

    held = await claimed(store, q)
    assert await step(lambda: store.release(held.id, "w1", held.lease_token)) == {"released": 1}
    held = await store.claim(held.id, "w1", 30)
    assert await step(lambda: control.force_release(held.id, Actor("operator", "olga"))) == {"released": 1}

    held = await store.claim(held.id, "w1", 30)
    dying = await claimed(store, q, max_attempts=1)
    await expire_lease(pool, held.id)
    await expire_lease(pool, dying.id)
    assert await step(store.reap) == {"reaped": 2, "dead_lettered": 1}
    assert moved(transitions(start, other), transitions(await scrape(open_metrics), other)) == {}


async def test_an_ack_with_a_superseded_lease_counts_as_a_fencing_refusal(open_metrics, store, pool):
    q = unique("m")
    old = await claimed(store, q)
    await expire_lease(pool, old.id)
    await store.reap()
    await make_retry_due(pool, old.id)
    current = await store.claim(old.id, "w2", 30)
    before = await scrape(open_metrics)

    for call in (
        lambda: store.complete(old.id, old.owner, old.lease_token),
        lambda: store.heartbeat(old.id, old.owner, old.lease_token, 30),
        lambda: store.complete_and_claim_next(old.id, old.owner, old.lease_token, None, [q], 30),
    ):
        with pytest.raises(Conflict):
            await call()
    with pytest.raises(Conflict):  # not fencing: w9 never held it, and names the current lease
        await store.complete(old.id, "w9", current.lease_token)

    after = await scrape(open_metrics)

    def refused(scrape, action):
        return value(scrape, "switchboard_fencing_refusals_total", queue=q, action=action)

    assert refused(after, "complete") - refused(before, "complete") == 2
    assert refused(after, "heartbeat") - refused(before, "heartbeat") == 1


# -- gauges ------------------------------------------------------------------------------


async def test_the_queue_gauges_are_the_overviews_counts(open_metrics, store, pool):
    q = unique("m")
    await enqueue(store, q, "one")
    await enqueue(store, q, "two")
    await retrying(store, pool, q)
    lapsed = await claimed(store, q)
    await expire_lease(pool, lapsed.id)
    await dead_letter(store, pool, q)
    await login(open_metrics, pool)

    got = await scrape(open_metrics)
    overview = queue_row((await get_page(open_metrics, "/")).text, q)
    [stats] = [s for s in await open_metrics.app.state.services.stats.get() if s.queue == q]

    def gauge(state):
        return value(got, "switchboard_queue_todos", queue=q, state=state)

    assert [gauge(s) for s in ("ready", "retrying", "claimed", "dead")] == [2, 1, 1, 1]
    assert [count(overview, k) for k in ("ready", "retrying", "claimed", "failed")] == [2, 1, 1, 1]
    assert (stats.ready, stats.retrying, stats.claimed, stats.dead, stats.lapsed) == (2, 1, 1, 1, 1)
    assert value(got, "switchboard_queue_lapsed_leases", queue=q) == 1
    age = value(got, "switchboard_queue_oldest_ready_age_seconds", queue=q)
    assert 0 < age <= float(stats.oldest_ready_age)  # or a later count, if a hint came in between


async def test_when_the_counts_cannot_be_read_the_process_metrics_still_answer(open_metrics, store, pool):
    await enqueue(store, unique("m"))
    name = await pool.fetchval("SELECT current_database()")
    await pool.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 200')
    await open_metrics.app.state.services.store.db.expire_connections()  # new sessions take it
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("LOCK TABLE todos IN ACCESS EXCLUSIVE MODE")  # the count waits, then times out
        response = await open_metrics.get("/metrics")
    assert response.status_code == 200
    assert "switchboard_todos_created_total{" in response.text
    assert "switchboard_queue_todos{" not in response.text
    assert "switchboard_queue_todos{" in (await open_metrics.get("/metrics")).text  # once it can again


# -- histograms --------------------------------------------------------------------------


async def test_time_in_queue_run_time_and_request_latency_are_observed(open_metrics, store, pool):
    q = unique("m")
    todo = await enqueue(store, q)
    await pool.execute(
        "UPDATE todos SET created_at = now() - interval '40 seconds',"
        " ready_at = now() - interval '30 seconds' WHERE id = $1",
        todo.id,
    )  # time in queue counts from when it became ready (a scheduled todo's run_at)
    before = await scrape(open_metrics)
    todo = await store.claim(todo.id, "w1", 60)
    await pool.execute("UPDATE todos SET claimed_at = now() - interval '5 seconds' WHERE id = $1", todo.id)
    await store.complete(todo.id, "w1", todo.lease_token)
    await open_metrics.get("/healthz")
    after = await scrape(open_metrics)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    wait = "switchboard_todo_time_in_queue_seconds"
    assert delta(f"{wait}_count", queue=q) == 1
    assert 30 <= delta(f"{wait}_sum", queue=q) < 40
    assert delta(f"{wait}_bucket", queue=q, le="10.0") == 0
    assert delta(f"{wait}_bucket", queue=q, le="60.0") == 1
    run = "switchboard_todo_run_seconds"
    assert delta(f"{run}_count", queue=q, outcome="completed") == 1
    assert 5 <= delta(f"{run}_sum", queue=q, outcome="completed") < 15
    http = "switchboard_http_request_duration_seconds_count"
    assert delta(http, method="GET", route="/healthz", status="200") == 1
    assert delta(http, method="GET", route="/metrics", status="200") == 1  # the scrape before


# -- who may scrape ----------------------------------------------------------------------


async def metrics_client(monkeypatch, dsn, pool, **env):
    for name in ("SWITCHBOARD_METRICS", "SWITCHBOARD_METRICS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, setting in env.items():
        monkeypatch.setenv(name, setting)
    return in_process(await build_app(dsn, pool, reaper=False))


async def test_metrics_are_off_by_default_and_say_how_to_turn_them_on(monkeypatch, dsn, pool):
    async with await metrics_client(monkeypatch, dsn, pool) as client:
        response = await client.get("/metrics", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "SWITCHBOARD_METRICS_TOKEN" in response.json()["detail"]
    assert "SWITCHBOARD_METRICS=open" in response.json()["detail"]


async def test_with_a_token_metrics_answer_only_to_its_bearer(monkeypatch, dsn, pool):
    env = {"SWITCHBOARD_METRICS_TOKEN": TOKEN, "SWITCHBOARD_METRICS": "open"}  # the token wins
    async with await metrics_client(monkeypatch, dsn, pool, **env) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = await client.get("/metrics", headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert refused.json()["status"] == 401
        await scrape(client, Authorization=f"Bearer {TOKEN}")


async def test_switchboard_metrics_open_serves_anyone(monkeypatch, dsn, pool):
    async with await metrics_client(monkeypatch, dsn, pool, SWITCHBOARD_METRICS="open") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert "# TYPE switchboard_todos_created_total counter" in response.text


# -- the reaper's own endpoint -----------------------------------------------------------


async def test_switchboard_reap_serves_its_counts_on_its_metrics_port(dsn, store, pool, tmp_path):
    q = unique("m")
    todo = await claimed(store, q, max_attempts=1)
    await expire_lease(pool, todo.id)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "reap.log"
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "dashboard.cli", "reap", "--interval", "0.1"),
            *("--metrics-port", str(port)),
            env={**os.environ, "DATABASE_URL": dsn},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        deadline = asyncio.get_running_loop().time() + 30
        got: dict = {}
        while value(got, "switchboard_todos_reaped_total", queue=q) != 1:
            assert proc.returncode is None, log.read_text()
            assert asyncio.get_running_loop().time() < deadline, log.read_text()
            await asyncio.sleep(0.1)
            with contextlib.suppress(OSError):
                got = samples(await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics"))
    finally:
        proc.terminate()
        await proc.wait()
    assert value(got, "switchboard_todos_dead_lettered_total", queue=q) == 1
    assert f"metrics on http://127.0.0.1:{port}/metrics" in log.read_text()
    assert (await pool.fetchval("SELECT state::text FROM todos WHERE id = $1", todo.id)) == "failed"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read().decode()


@pytest.mark.parametrize("held", [False, True], ids=["nothing-held", "transaction-held"])
async def test_metrics_export_what_holds_back_vacuum_and_the_dead_tuples(dsn, open_metrics, held):
    async with report(dsn) if held else contextlib.nullcontext():
        found = await scrape(open_metrics)
    age = value(found, "switchboard_vacuum_held_back_seconds")
    assert age > 0 if held else age == 0
    for table in ("todos", "todo_history"):
        assert ("switchboard_dead_tuples", frozenset({("table", table)})) in found
