"""An edit names the version of the todo it was made from (README "Queue control", "Agents
over HTTP"): the store refuses it (Stale, 409) when the todo changed since, saying what
changed, and the API carries the version as ETag / If-Match. Without a version an edit
writes over the todo as it is, as before. After every refusal the database is compared
with a snapshot taken before it. The dashboard's form: tests/test_web_control.py."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime

import pytest

from dashboard.control import Control
from dashboard.edits import CHANGES_SHOWN
from dashboard.errors import Conflict, InvalidInput, Stale
from dashboard.models import Actor, TodoEdit, check_version, version_of
from dashboard.queries import TRANSITIONS
from tests.agent_api import API, problem
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import dead_letter, enqueue, snapshot, todo_row
from tests.processes import eventually

pytestmark = ONE_DATABASE_PER_MODULE
OLGA, SAM = Actor("operator", "olga"), Actor("operator", "sam")


# -- the version --------------------------------------------------------------------------------


async def test_a_version_is_the_exact_microsecond_of_updated_at():
    at = datetime(2025, 12, 5, 10, 0, 0, 123457, tzinfo=UTC)
    assert version_of(at) == "1764928800123457"
    assert check_version(version_of(at)) == at
    late = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)  # past a float's 2**53
    assert check_version(version_of(late)) == late


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1.5", " 1", "1" * 19, "9" * 18, None, 17])
async def test_anything_no_todo_could_have_had_is_not_a_version(bad):
    with pytest.raises(InvalidInput) as caught:
        check_version(bad)
    assert caught.value.field == "version"


async def test_every_statement_that_changes_a_todo_moves_its_version():
    """A todo's version is its updated_at: every statement that writes a todo sets it, on
    the clock when it has the row (not its transaction's start), but the watch mark
    (0011_waits.sql), which changes nothing an edit could overwrite."""
    writes = [s for s in TRANSITIONS if re.search(r"\bUPDATE todos\b|\bDO UPDATE SET\b", s.sql)]
    assert len(writes) >= 19
    for statement in writes:
        if statement.name != "watch":
            assert "updated_at = clock_timestamp()" in statement.sql, statement.name


# -- the store ----------------------------------------------------------------------------------


async def test_an_edit_of_the_version_read_applies_and_one_of_an_older_version_says_what_changed(
    module_store, module_control, module_pool
):
    store, control = module_store, module_control
    todo = await enqueue(store, "e", "a")
    read = todo.version
    edited = await control.edit(todo.id, OLGA, TodoEdit(title="b"), version=read)
    assert edited.title == "b" and edited.version != read
    assert edited.version == (await todo_row(module_pool, todo.id)).version
    held = await store.claim(todo.id, "w1", 30)
    released = await store.release(todo.id, "w1", held.lease_token)

    before = await snapshot(module_pool)
    with pytest.raises(Stale) as caught:
        await control.edit(todo.id, SAM, TodoEdit(title="c"), version=read)
    assert await snapshot(module_pool) == before
    stale = caught.value
    changes = stale.current["changed_since"]
    assert [(c.actor_kind, c.actor, c.note) for c in changes] == [
        ("operator", "olga", "edited: title a → b"),
        ("agent", "w1", "claimed by id"),
        ("agent", "w1", "released"),
    ]  # not the create, which made the version read
    assert stale.current["version"] == released.version and stale.current["state"] == "pending"
    assert stale.current["changes_untold"] is None
    assert "operator olga: edited: title a → b; " in str(stale)
    assert str(stale).endswith(f"it is version {released.version} now")
    assert (await control.edit(todo.id, SAM, TodoEdit(title="c"), version=released.version)).title == "c"


async def test_a_version_a_heartbeat_made_lists_every_change_after_it(module_store, module_control):
    """A heartbeat makes a version but writes no history row (DESIGN "History"): the
    changes since it are the rows after it, none skipped as the one that made it."""
    store, control = module_store, module_control
    todo = await enqueue(store, "e", "a")
    held = await store.claim(todo.id, "w1", 30)
    beat = await store.heartbeat(todo.id, "w1", held.lease_token, 30)
    released = await store.release(todo.id, "w1", held.lease_token)

    with pytest.raises(Stale) as caught:
        await control.edit(todo.id, SAM, TodoEdit(title="b"), version=beat.version)
    assert [c.note for c in caught.value.current["changed_since"]] == ["released"]
    assert caught.value.current["version"] == released.version


async def test_a_stale_edit_is_refused_before_it_is_judged_and_the_latest_changes_are_listed(
    module_store, module_control
):
    store, control = module_store, module_control
    todo = await enqueue(store, "e", "t")
    for n in range(1, CHANGES_SHOWN + 3):
        await control.edit(todo.id, OLGA, TodoEdit(title=f"t{n}"))
    await store.claim(todo.id, "w1", 30)
    with pytest.raises(Stale) as caught:  # a claimed todo: the version speaks first
        await control.edit(todo.id, SAM, TodoEdit(priority=-11), version=todo.version)
    changes = caught.value.current["changed_since"]
    assert len(changes) == CHANGES_SHOWN and caught.value.current["changes_untold"] == 3
    last = f"edited: title t{CHANGES_SHOWN + 1} → t{CHANGES_SHOWN + 2}"
    assert [c.note for c in changes[-2:]] == [last, "claimed by id"]
    assert "3 earlier changes; " in str(caught.value)
    current = caught.value.current["version"]
    with pytest.raises(Conflict, match="it is claimed by w1") as caught:
        await control.edit(todo.id, SAM, TodoEdit(priority=1), version=current)
    assert not isinstance(caught.value, Stale)


async def test_without_a_version_an_edit_writes_over_the_todo_as_it_is(module_control, module_store):
    todo = await enqueue(module_store, "e", "a")
    await module_control.edit(todo.id, OLGA, TodoEdit(title="b"))
    assert (await module_control.edit(todo.id, SAM, TodoEdit(title="c"))).title == "c"


async def test_a_malformed_version_is_refused_and_changes_nothing(module_control, module_store, module_pool):
    todo = await enqueue(module_store, "e", "a")
    before = await snapshot(module_pool)
    for bad in ("abc", "", f'"{todo.version}"'):
        with pytest.raises(InvalidInput) as caught:
            await module_control.edit(todo.id, OLGA, TodoEdit(title="b"), version=bad)
        assert caught.value.field == "version"
    assert await snapshot(module_pool) == before


async def test_edit_and_retry_checks_the_version_before_the_retry(module_store, module_control, module_pool):
    store, control = module_store, module_control
    dead = await dead_letter(store, module_pool, "e", payload={"to": "bad@"})
    changed = await control.edit(dead.id, OLGA, TodoEdit(title="renamed"))
    before = await snapshot(module_pool)
    with pytest.raises(Stale) as caught:
        await control.edit(dead.id, SAM, TodoEdit(payload={"to": "ok@"}), retry=True, version=dead.version)
    assert [c.note for c in caught.value.current["changed_since"]] == ["edited: title t → renamed"]
    assert await snapshot(module_pool) == before
    retried = await control.edit(
        dead.id, SAM, TodoEdit(payload={"to": "ok@"}), retry=True, version=changed.version
    )
    assert (retried.state, retried.title, retried.payload) == ("pending", "renamed", {"to": "ok@"})


async def lock_waiters(db) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )


async def test_a_change_between_the_edits_read_and_its_write_is_named_too(
    module_control, module_store, module_pool
):
    """The todo is at the version read when the edit reads it, and changed (by a transaction
    that held its row) before the edit's write: refused, naming that change."""
    todo = await enqueue(module_store, "e", "a")
    async with module_pool.acquire() as conn, conn.transaction():
        await Control(conn).edit(todo.id, OLGA, TodoEdit(title="b"))
        late = asyncio.create_task(
            module_control.edit(todo.id, SAM, TodoEdit(title="c"), version=todo.version)
        )
        await eventually(lambda: lock_waiters(module_pool), lambda n: n >= 1, within=30)
    with pytest.raises(Stale) as caught:
        await late
    assert [c.note for c in caught.value.current["changed_since"]] == ["edited: title a → b"]
    assert (await todo_row(module_pool, todo.id)).title == "b"


async def test_a_duplicate_delivery_moves_the_version_after_the_change_it_waited_for(
    module_control, module_store, module_pool
):
    """A create that collapses onto a live todo whose row another transaction holds sets
    updated_at when it gets the row (not when it began): so the changes since the version
    it made are what came after it, and the change it waited for is not among them."""
    todo = await enqueue(module_store, "e", "a", idempotency_key="k")
    async with module_pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM todos WHERE id = $1 FOR UPDATE", todo.id)
        duplicate = asyncio.create_task(enqueue(module_store, "e", "a", idempotency_key="k"))
        await eventually(lambda: lock_waiters(module_pool), lambda n: n >= 1, within=30)
        await Control(conn).edit(todo.id, OLGA, TodoEdit(title="b"))
    assert (await duplicate).id == todo.id
    read = await todo_row(module_pool, todo.id)
    assert (read.title, read.dedupe_hits) == ("b", 1)
    await module_control.edit(todo.id, OLGA, TodoEdit(priority=2))
    with pytest.raises(Stale) as caught:
        await module_control.edit(todo.id, SAM, TodoEdit(title="c"), version=read.version)
    assert [c.note for c in caught.value.current["changed_since"]] == ["edited: priority 0 → 2"]


# -- the API ------------------------------------------------------------------------------------


def etag_of(response) -> str:
    """The response's ETag: a strong one, the todo's version in quotes."""
    tag = response.headers["etag"]
    assert tag.startswith('"') and tag.endswith('"') and tag[1:-1].isdigit(), tag
    return tag


async def edit(client, headers, todo_id: str, body: dict, if_match: str | None = None, **params):
    if if_match is not None:
        headers = {**headers, "If-Match": if_match}
    return await client.patch(f"{API}/todos/{todo_id}", headers=headers, json=body, params=params)


async def test_get_and_patch_answer_the_todos_version_as_etag_and_if_match_guards_the_edit(
    api_client, module_store, module_pool, bot
):
    todo = await enqueue(module_store, "work", "a")
    got = await api_client.get(f"{API}/todos/{todo.id}", headers=bot)
    assert got.status_code == 200
    read = etag_of(got)
    assert read == f'"{todo.version}"'

    first = await edit(api_client, bot, todo.id, {"title": "b"}, if_match=read)
    assert first.status_code == 200, first.text
    assert first.json()["title"] == "b"
    assert etag_of(first) == f'"{(await todo_row(module_pool, todo.id)).version}"' != read

    before = await snapshot(module_pool)
    stale = await edit(api_client, bot, todo.id, {"title": "c"}, if_match=read)
    body = problem(stale, 409)
    assert await snapshot(module_pool) == before
    assert "agent bot: edited: title a → b" in body["detail"]
    assert body["version"] == etag_of(first).strip('"')
    assert [(c["actor_kind"], c["actor"], c["note"]) for c in body["changed_since"]] == [
        ("agent", "bot", "edited: title a → b")
    ]
    assert "etag" not in stale.headers

    again = await edit(api_client, bot, todo.id, {"title": "c"}, if_match=f'"{body["version"]}"')
    assert again.status_code == 200 and again.json()["title"] == "c"


@pytest.mark.parametrize("bad", ['W/"1764928800123457"', "1764928800123457", '"1", "2"', '"abc"', '""'])
async def test_a_malformed_if_match_is_a_422_naming_it_and_changes_nothing(
    api_client, module_store, module_pool, bot, bad
):
    todo = await enqueue(module_store, "work", "a")
    before = await snapshot(module_pool)
    body = problem(await edit(api_client, bot, todo.id, {"title": "b"}, if_match=bad), 422, field="If-Match")
    assert "quotes included" in body["detail"]
    assert await snapshot(module_pool) == before


async def test_without_if_match_or_with_a_star_an_edit_applies_to_the_todo_as_it_is(
    module_control, api_client, module_store, module_pool, bot
):
    todo = await enqueue(module_store, "work", "a")
    await module_control.edit(todo.id, OLGA, TodoEdit(title="b"))
    blind = await edit(api_client, bot, todo.id, {"title": "c"})
    assert blind.status_code == 200 and blind.json()["title"] == "c"
    star = await edit(api_client, bot, todo.id, {"title": "d"}, if_match="*")
    assert star.status_code == 200 and star.json()["title"] == "d"
    assert etag_of(star) == f'"{(await todo_row(module_pool, todo.id)).version}"'


async def test_edit_and_retry_over_the_api_with_a_stale_if_match_leaves_the_todo_dead(
    module_control, api_client, module_store, module_pool, bot
):
    dead = await dead_letter(module_store, module_pool, "work")
    read = etag_of(await api_client.get(f"{API}/todos/{dead.id}", headers=bot))
    await module_control.edit(dead.id, OLGA, TodoEdit(priority=3))
    before = await snapshot(module_pool)
    stale = await edit(api_client, bot, dead.id, {"title": "fixed"}, if_match=read, retry="true")
    assert [c["note"] for c in problem(stale, 409)["changed_since"]] == ["edited: priority 0 → 3"]
    assert await snapshot(module_pool) == before


async def test_the_schema_documents_if_match_and_the_etag(api_client, bot):
    schema = (await api_client.get(f"{API}/docs/openapi.json", headers=bot)).json()
    todo = schema["paths"]["/api/v1/todos/{todo_id}"]
    (if_match,) = [p for p in todo["patch"]["parameters"] if p["name"] == "If-Match"]
    assert if_match["in"] == "header" and not if_match.get("required")
    assert (
        "409" in todo["patch"]["description"]
        and "If-Match" in todo["patch"]["responses"]["409"]["description"]
    )
    for method in ("get", "patch"):
        assert "ETag" in todo[method]["responses"]["200"]["headers"], method
