"""Waiting for a result: GET /api/v1/todos/{id}?wait=S (dashboard/agents.py), against
the real app and a real database, the completer another request, another Store or
another process.

Most tests set WAIT_POLL to a minute, so that a waiter can only answer early because a
hint woke it; the poll fallback has its own test. Each waiter is known to be waiting
(subscribed, and the todo marked watched) before the todo is finished.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

import httpx
import pytest
import pytest_asyncio
import uvicorn

from dashboard import agents
from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.config import Settings
from dashboard.control import Control
from dashboard.models import Ack, Actor, NewTodo, Scope
from dashboard.store import Store
from dashboard.web.server import uvicorn_config
from tests.conftest import ONE_DATABASE_PER_MODULE, build_app
from tests.factories import agent_token, expire_lease, make_retry_due
from tests.processes import eventually, free_port, start_serving, stop

API = "/api/v1"
HINTED_WITHIN = 2.0  # seconds from the finishing commit to the answer, when a hint must have woken it

pytestmark = ONE_DATABASE_PER_MODULE


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(module_dsn, module_pool):
    """The real app (its hub, no reaper) under uvicorn as `switchboard serve` configures it,
    on this event loop: waits run concurrently, and the test can see the app's hub."""
    app = await build_app(module_dsn, module_pool, reaper=False)
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, Settings.from_environ()))
    running = asyncio.create_task(server.serve())

    async def up() -> bool:
        return server.started or running.done()

    await eventually(up, bool, within=30)
    assert not running.done(), "uvicorn did not start"
    app.state.base = f"http://127.0.0.1:{port}"
    yield app
    server.should_exit = True
    await running


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(app):
    limits = httpx.Limits(max_connections=60, max_keepalive_connections=60)
    async with httpx.AsyncClient(base_url=app.state.base, timeout=60, limits=limits) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def bot(module_pool) -> dict:
    return await agent_token(module_pool, "bot", ["work"])


@pytest.fixture
def hints_only(monkeypatch):
    """No poll fallback within a test's time: only a hint can end a wait early."""
    monkeypatch.setattr(agents, "WAIT_POLL", 60.0)


class Recorder:
    """A Store's hint sink that keeps what it was given."""

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.todos: list[str] = []

    def send(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None:
        self.queues += queues
        self.todos += todos


# -- helpers --------------------------------------------------------------------------------


async def create(api, headers, **body) -> dict:
    response = await api.post(f"{API}/todos", headers=headers, json={"queue": "work", "title": "t", **body})
    assert response.status_code == 201, response.text
    return response.json()["todo"]


async def claim(api, headers, todo_id: str) -> dict:
    response = await api.post(f"{API}/todos/{todo_id}/claim", headers=headers, json={"ttl": 60})
    assert response.status_code == 200, response.text
    return response.json()


async def act(api, headers, todo: dict, action: str, **body) -> dict:
    response = await api.post(
        f"{API}/todos/{todo['id']}/{action}", headers=headers, json={"lease": todo["lease"], **body}
    )
    assert response.status_code == 200, response.text
    return response.json()


def waiter(api, headers, todo_id: str, wait: float = 30) -> asyncio.Task:
    """GET ?wait=… in the background; its task answers (response, seconds it took)."""

    async def get():
        began = time.monotonic()
        response = await api.get(f"{API}/todos/{todo_id}", headers=headers, params={"wait": wait})
        return response, time.monotonic() - began

    return asyncio.create_task(get())


async def waiting(app, pool, todo_id: str, waiters: int = 1) -> None:
    """Until `waiters` waits on the todo are subscribed in `app` and the todo is marked watched."""
    watches = app.state.services.hub._watches

    async def seen():
        watched = await pool.fetchval("SELECT watched FROM todos WHERE id = $1", todo_id)
        return watched, len(watches.get(todo_id, ()))

    await eventually(seen, lambda s: s == (True, waiters), within=10)


async def answered(task: asyncio.Task, within: float = HINTED_WITHIN) -> dict:
    """The wait's 200 answer, which must come within `within` seconds from now."""
    response, _ = await asyncio.wait_for(task, within)
    assert response.status_code == 200, response.text
    return response.json()


# -- it answers when the todo is finished ---------------------------------------------------


async def test_a_wait_answers_with_the_result_as_soon_as_the_todo_is_done(
    app, api, module_pool, bot, hints_only
):
    todo = await claim(api, bot, (await create(api, bot))["id"])
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    assert not task.done()
    await act(api, bot, todo, "complete", result={"approved": True})
    body = await answered(task)
    assert body["todo"]["state"] == "done" and body["todo"]["result"] == {"approved": True}
    assert [h["to_state"] for h in body["history"]] == ["pending", "claimed", "done"]


async def test_a_wait_answers_when_the_todo_is_dead_lettered_with_its_error(
    app, api, module_pool, bot, hints_only
):
    todo = await claim(api, bot, (await create(api, bot, max_attempts=1))["id"])
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    assert (await act(api, bot, todo, "fail", error="the printer is on fire"))["will_retry"] is False
    body = await answered(task)
    assert body["todo"]["state"] == "failed" and body["todo"]["last_error"] == "the printer is on fire"
    assert body["todo"]["cancelled_at"] is None


async def test_a_wait_answers_when_the_todo_is_cancelled(app, api, module_pool, bot, hints_only):
    todo = await create(api, bot)
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    response = await api.post(f"{API}/todos/{todo['id']}/cancel", headers=bot, json={"reason": "not needed"})
    assert response.status_code == 200, response.text
    body = await answered(task)
    assert body["todo"]["state"] == "failed"
    assert (body["todo"]["cancelled_by"], body["todo"]["cancel_reason"]) == ("bot", "not needed")


async def test_a_todo_dead_lettered_by_another_store_without_a_hub_wakes_the_wait(
    app, api, module_pool, bot, hints_only
):
    """The reaper's Store sends its hint by a statement of its own: it reaches the app's hub."""
    todo = await claim(api, bot, (await create(api, bot, max_attempts=1))["id"])
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    await expire_lease(module_pool, todo["id"])
    assert [t.state for t in await Store(module_pool).reap()] == ["failed"]
    body = await answered(task)
    assert body["todo"]["state"] == "failed" and body["todo"]["last_error"].startswith("lease expired")


async def test_a_retryable_failure_does_not_end_the_wait(app, api, module_pool, bot, monkeypatch):
    monkeypatch.setattr(agents, "WAIT_POLL", 0.02)  # the waiter reads the todo again and again
    todo = await claim(api, bot, (await create(api, bot, max_attempts=3))["id"])
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    assert (await act(api, bot, todo, "fail", error="try again"))["will_retry"] is True
    await asyncio.sleep(0.3)  # what must not happen: the wait answering while the todo is retrying
    assert not task.done(), (await task)[0].json()["todo"]["state"]
    await make_retry_due(module_pool, todo["id"])
    again = await claim(api, bot, todo["id"])
    await act(api, bot, again, "complete", result={"second": "try"})
    body = await answered(task)
    assert body["todo"]["state"] == "done" and body["todo"]["attempt"] == 2
    assert [h["to_state"] for h in body["history"]] == ["pending", "claimed", "pending", "claimed", "done"]


async def test_fifty_waits_on_one_todo_all_answer_when_it_finishes(app, api, module_pool, bot, hints_only):
    todo = await claim(api, bot, (await create(api, bot))["id"])
    tasks = [waiter(api, bot, todo["id"]) for _ in range(50)]
    await waiting(app, module_pool, todo["id"], waiters=50)
    assert not any(t.done() for t in tasks)
    await act(api, bot, todo, "complete", result={"n": 50})
    bodies = await asyncio.wait_for(asyncio.gather(*(answered(t) for t in tasks)), HINTED_WITHIN * 2)
    assert [(b["todo"]["state"], b["todo"]["result"]) for b in bodies] == [("done", {"n": 50})] * 50
    assert app.state.services.hub._watches.get(todo["id"]) is None  # every watch closed


# -- it answers after S with the todo as it is then -----------------------------------------


async def test_a_wait_answers_after_s_seconds_with_the_todo_still_pending(api, module_pool, bot):
    todo = await create(api, bot)
    response, took = await waiter(api, bot, todo["id"], wait=1.0)
    assert response.status_code == 200, response.text
    assert response.json()["todo"]["state"] == "pending"
    assert 1.0 <= took < 1.6, took


async def test_without_wait_or_with_zero_the_todo_is_read_at_once_and_not_marked(api, module_pool, bot):
    todo = await create(api, bot)
    for params in ({}, {"wait": 0}):
        began = time.monotonic()
        response = await api.get(f"{API}/todos/{todo['id']}", headers=bot, params=params)
        assert response.status_code == 200 and response.json()["todo"]["state"] == "pending"
        assert time.monotonic() - began < 1
    assert await module_pool.fetchval("SELECT watched FROM todos WHERE id = $1", todo["id"]) is False


async def test_a_missed_hint_costs_one_poll(app, api, module_pool, bot):
    """Finished by a Store whose hints go nowhere (as if lost), it is found by the next read."""
    todo = await claim(api, bot, (await create(api, bot))["id"])
    task = waiter(api, bot, todo["id"])
    await waiting(app, module_pool, todo["id"])
    deaf = Recorder()
    await Store(module_pool, hints=deaf).complete(todo["id"], "bot", todo["lease"], {"late": True})
    assert deaf.todos == [todo["id"]]  # the hint that never went out
    body = await answered(task, within=agents.WAIT_POLL * 1.2 + 1)
    assert body["todo"]["result"] == {"late": True}


# -- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "60.5", "61", "nan", "inf", "1e400", "abc", ""])
async def test_a_bad_wait_is_refused_naming_it_and_marks_nothing(api, module_pool, bot, value):
    todo = await create(api, bot)
    response = await api.get(f"{API}/todos/{todo['id']}", headers=bot, params={"wait": value})
    assert response.status_code == 422, response.text
    assert response.json().get("field") == "wait" or "wait" in response.json()["detail"], response.text
    assert await module_pool.fetchval("SELECT watched FROM todos WHERE id = $1", todo["id"]) is False


async def test_a_todo_outside_the_tokens_queues_is_404_at_once_and_not_marked(api, module_pool, bot):
    todo = await create(api, bot)
    outsider = await agent_token(module_pool, "outsider", ["other"])
    for todo_id in (todo["id"], "td_no-such-todo"):
        began = time.monotonic()
        response = await api.get(f"{API}/todos/{todo_id}", headers=outsider, params={"wait": 30})
        assert response.status_code == 404, response.text
        assert time.monotonic() - began < 1
    assert await module_pool.fetchval("SELECT watched FROM todos WHERE id = $1", todo["id"]) is False


async def test_a_token_revoked_while_waiting_ends_the_wait_with_401(app, api, module_pool, bot, hints_only):
    todo = await create(api, bot)
    token_id, secret = await Accounts(module_pool).add_token("waiter", ["work"])
    task = waiter(api, {"Authorization": f"Bearer {secret}"}, todo["id"])
    await waiting(app, module_pool, todo["id"])
    await Accounts(module_pool).revoke_token(token_id, actor="test")
    response, _ = await asyncio.wait_for(task, HINTED_WITHIN)
    assert response.status_code == 401, response.text


# -- the store hints finished todos only when watched ---------------------------------------


FINISHERS = ["complete", "complete_many", "ack_many", "complete_and_claim_next", "fail", "reap", "cancel"]


async def finish(store: Store, pool, how: str, todo_id: str, lease: int) -> str:
    """Finish claimed todo `todo_id` (of bot, max_attempts 1) by `how`; its state then."""
    if how == "complete":
        return (await store.complete(todo_id, "bot", lease)).state
    if how == "complete_many":
        return (await store.complete_many("bot", [(todo_id, lease, None)]))[0].state
    if how == "ack_many":
        return (await store.ack_many("bot", [Ack(todo_id, lease)]))[0].state
    if how == "complete_and_claim_next":
        return (await store.complete_and_claim_next(todo_id, "bot", lease, None, ["none"], 30))[0].state
    if how == "fail":
        return (await store.fail(todo_id, "bot", lease, "broken")).state
    if how == "reap":
        await expire_lease(pool, todo_id)
        return (await store.reap())[0].state
    return (await Control(store.db, store.hints).cancel(todo_id, Actor("operator", "olga"))).state


@pytest.mark.parametrize("how", FINISHERS)
async def test_every_finishing_transition_hints_a_watched_todo_and_no_other(module_pool, how):
    recorder = Recorder()
    store = Store(module_pool, hints=recorder)
    todos = []
    for _ in range(2):
        created = await store.create_many([_new()])
        todos.append(await store.claim(created[0].todo.id, "bot", 60))
    watched, unwatched = todos
    await store.watch(watched.id)
    assert await finish(store, module_pool, how, unwatched.id, unwatched.lease_token) in ("done", "failed")
    assert recorder.todos == []  # the hot path: no hint for an unwatched todo
    assert await finish(store, module_pool, how, watched.id, watched.lease_token) in ("done", "failed")
    assert recorder.todos == [watched.id]


async def test_a_retryable_failure_of_a_watched_todo_hints_its_queue_not_the_todo(module_pool):
    recorder = Recorder()
    store = Store(module_pool, hints=recorder)
    todo = (await store.create(_new(max_attempts=2))).todo
    await store.watch(todo.id)
    held = await store.claim(todo.id, "bot", 60)
    recorder.queues.clear()  # the create's
    assert (await store.fail(todo.id, "bot", held.lease_token, "again")).state == "pending"
    assert (recorder.queues, recorder.todos) == (["work"], [])


async def test_watch_marks_only_a_live_todo_in_scope(module_pool):
    store = Store(module_pool)
    live, done = (await store.create(_new())).todo, (await store.create(_new())).todo
    held = await store.claim(done.id, "bot", 60)
    await store.complete(done.id, "bot", held.lease_token)
    await store.watch(live.id, scope=Scope("tk_other", ("other",)))
    await store.watch(done.id)
    marks = await module_pool.fetch("SELECT id, watched FROM todos ORDER BY id")
    assert not any(r["watched"] for r in marks)
    await store.watch(live.id, scope=Scope("tk_work", ("work",)))
    assert await module_pool.fetchval("SELECT watched FROM todos WHERE id = $1", live.id) is True


def _new(**fields) -> NewTodo:
    return NewTodo(queue="work", title="t", **{"max_attempts": 1, **fields})


# -- across processes -----------------------------------------------------------------------


@pytest.mark.slow
async def test_waits_in_two_server_processes_are_woken_by_a_completion_in_one_of_them(dsn, tmp_path):
    """Two `switchboard serve` processes on one database. 50 waits on one todo, 25 in
    each, all answer when it is completed through one of them. Then 20 todos, each waited
    on in the other process, are completed one by one: every wait answers within 0.75 s
    of its completion (the poll, every 1.2-1.8 s, could not do that 20 times: the hint
    crossed from one process to the other through PostgreSQL)."""
    conn = await dbmod.connect(dsn)
    servers = []
    try:
        headers = await agent_token(conn, "bot", ["work"])
        env = {**os.environ, "DATABASE_URL": dsn, "PYTHONUNBUFFERED": "1"}
        for name in ("a", "b"):
            port = free_port()
            args = ["serve", "--host", "127.0.0.1", "--port", str(port)]
            proc = await asyncio.to_thread(start_serving, args, env, tmp_path / f"{name}.log")
            servers.append((proc, f"http://127.0.0.1:{port}"))
        limits = httpx.Limits(max_connections=60, max_keepalive_connections=60)
        async with (
            httpx.AsyncClient(base_url=servers[0][1], timeout=60, limits=limits) as a,
            httpx.AsyncClient(base_url=servers[1][1], timeout=60, limits=limits) as b,
        ):
            todo = await claim(b, headers, (await create(b, headers))["id"])
            tasks = [waiter(http, headers, todo["id"]) for http in (a, b) for _ in range(25)]
            await eventually(
                lambda: conn.fetchval("SELECT watched FROM todos WHERE id = $1", todo["id"]), bool, 10
            )
            await act(b, headers, todo, "complete", result={"everyone": "sees"})
            answers = await asyncio.wait_for(asyncio.gather(*tasks), 10)
            assert [r.status_code for r, _ in answers] == [200] * 50
            assert {r.json()["todo"]["state"] for r, _ in answers} == {"done"}
            assert [r.json()["todo"]["result"] for r, _ in answers] == [{"everyone": "sees"}] * 50

            held = [await claim(b, headers, (await create(b, headers))["id"]) for _ in range(20)]
            tasks = [waiter(a, headers, t["id"]) for t in held]
            ids = [t["id"] for t in held]
            await eventually(
                lambda: conn.fetchval("SELECT count(*) FROM todos WHERE id = ANY ($1) AND watched", ids),
                lambda n: n == 20,
                10,
            )
            latencies = []
            for t, task in zip(held, tasks, strict=True):
                await act(b, headers, t, "complete")
                completed = time.monotonic()
                response, _ = await asyncio.wait_for(task, 10)
                assert response.json()["todo"]["state"] == "done"
                latencies.append(time.monotonic() - completed)
            assert max(latencies) < 0.75, latencies
    finally:
        for proc, _ in servers:
            stop(proc)
        await conn.close()
