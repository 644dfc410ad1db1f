"""Queue control on the dashboard (dashboard/web/pages/), through the real app on a fresh
database: pause and resume, cancel, run now, edit (and edit and retry), bulk actions on
ticked rows and on everything a filter matches, the create form's new fields; refusals as
inline errors with the values kept; viewers refused. Checked in the database afterwards."""

from __future__ import annotations

import asyncio
import html
import re

from dashboard import db as dbmod
from dashboard.models import Actor, TodoEdit
from dashboard.reads import Reads, TodoFilter
from dashboard.store import Store
from tests.factories import claimed, db_now, dead_letter, enqueue, history, login, new_todo, todo_row
from tests.web_helpers import assert_fragment, field_label, flash_of, get_page, post, text

OP = Actor("operator", "olga")


# -- pause and resume ---------------------------------------------------------------------------


async def test_an_operator_pauses_and_resumes_a_queue_from_its_page(client, pool, store):
    token = await login(client, pool, "olga")
    await enqueue(store, "mail")
    response = await post(client, "/queues/mail/pause", token, {"reason": "SMTP down"})
    assert response.status_code == 303 and response.headers["location"] == "/queues/mail"
    page = text(await client.get("/queues/mail"))
    assert "queue mail paused" in flash_of(page)
    assert re.search(r"Paused\s+by\s+olga [^:]*:\s+SMTP down", text_of(page))
    assert 'action="/queues/mail/resume"' in page
    overview = text(await get_page(client, "/"))
    assert re.search(r'data-queue="mail".*?<span class="tag paused"', overview, re.S)
    assert await store.claim_next(["mail"], "w1", 30) is None

    fragment = assert_fragment(await post(client, "/queues/mail/resume", token, htmx=True), "queue-control")
    assert "queue mail resumed" in text_of(fragment)
    assert 'action="/queues/mail/pause"' in fragment
    assert (await store.claim_next(["mail"], "w1", 30)) is not None


async def test_a_viewer_sees_no_controls_and_cannot_use_them(client, pool, store):
    todo = await enqueue(store, "mail", delay=3600)
    token = await login(client, pool, "vera", role="viewer")
    queue_page = (await get_page(client, "/queues/mail")).text
    todo_page = (await get_page(client, f"/todos/{todo.id}")).text
    for absent in ('action="/queues/mail/pause"', 'name="ids"', 'name="action"'):
        assert absent not in queue_page
    for absent in ("/cancel", "/run-now", "/edit"):
        assert absent not in todo_page
    for url, data in [
        ("/queues/mail/pause", {}),
        (f"/todos/{todo.id}/cancel", {}),
        (f"/todos/{todo.id}/run-now", {}),
        (f"/todos/{todo.id}/edit", {"title": "x", "priority": "0", "max_attempts": "5", "payload": "{}"}),
        ("/queues/mail/bulk", {"scope": "all", "action": "cancel"}),
    ]:
        assert (await post(client, url, token, data)).status_code == 403, url
    assert (await todo_row(pool, todo.id)).state == "pending"
    assert await pool.fetchval("SELECT count(*) FROM queue_pauses") == 0


# -- one todo -----------------------------------------------------------------------------------


async def test_cancel_from_the_todo_page_shows_it_cancelled_with_the_reason(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await claimed(store, "mail", owner="w1")
    response = await post(client, f"/todos/{todo.id}/cancel", token, {"reason": "duplicate order"}, htmx=True)
    fragment = text_of(assert_fragment(response, "todo"))
    assert f"{todo.id} cancelled" in fragment
    assert 'class="badge cancelled"' in response.text
    assert "duplicate order" in fragment
    row = await todo_row(pool, todo.id)
    assert (row.state, row.cancelled_by, row.cancel_reason) == ("failed", "olga", "duplicate order")


async def test_run_now_makes_a_scheduled_todo_ready(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", delay=3600)
    assert re.search(r"scheduled in (59m|1h)", text(await client.get(f"/todos/{todo.id}")))
    fragment = assert_fragment(await post(client, f"/todos/{todo.id}/run-now", token, htmx=True), "todo")
    assert 'class="badge ready"' in fragment
    assert (await todo_row(pool, todo.id)).ready_at <= await db_now(pool)


async def test_an_edit_with_a_bad_value_keeps_what_was_typed_and_changes_nothing(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", "old", payload={"a": 1})
    form = {"title": "new title", "priority": "11", "max_attempts": "5", "payload": '{"a": 2}'}
    response = await post(client, f"/todos/{todo.id}/edit", token, form)
    assert response.status_code == 422
    assert "must be a whole number from -10 to 10" in field_label(text(response), "priority")
    assert 'value="new title"' in response.text
    assert (await todo_row(pool, todo.id)).title == "old"
    response = await post(client, f"/todos/{todo.id}/edit", token, {**form, "priority": "x", "payload": "{"})
    assert response.status_code == 422
    assert "not valid JSON" in field_label(text(response), "payload")
    assert "must be a whole number" in field_label(text(response), "priority")


async def test_an_edit_is_saved_with_its_diff_and_a_claimed_todo_is_refused(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", "old", payload={"a": 1})
    form = {
        "title": "new",
        "priority": "4",
        "max_attempts": "5",
        "payload": '{"a": 2}',
        "kind": "",
        "assignee": "",
    }
    response = await post(client, f"/todos/{todo.id}/edit", token, form)
    assert response.status_code == 303, response.text
    assert (await history(pool, todo.id))[-1].note == "edited: title old → new; payload ~a; priority 0 → 4"
    held = await claimed(store, "mail", owner="w1")
    response = await post(client, f"/todos/{held.id}/edit", token, form)
    assert response.status_code == 422
    assert "it is claimed by w1" in text(response)


async def test_edit_and_retry_from_the_form(client, pool, store):
    token = await login(client, pool, "olga")
    dead = await dead_letter(store, pool, "mail", payload={"to": "bad@"})
    page = (await get_page(client, f"/todos/{dead.id}/edit?retry=1")).text
    assert 'name="retry" value="1" checked' in page
    form = {
        "title": dead.title,
        "priority": "0",
        "max_attempts": "5",
        "payload": '{"to": "ok@"}',
        "retry": "1",
    }
    response = await post(client, f"/todos/{dead.id}/edit", token, form)
    assert response.status_code == 303
    assert "edited and retried" in flash_of((await client.get(f"/todos/{dead.id}")).text)
    row = await todo_row(pool, dead.id)
    assert (row.state, row.payload) == ("pending", {"to": "ok@"})


# -- bulk ---------------------------------------------------------------------------------------


async def test_a_bulk_action_with_nothing_selected_says_so_and_changes_nothing(client, pool, store):
    token = await login(client, pool, "olga")
    await enqueue(store, "mail")
    response = await post(
        client, "/queues/mail/bulk", token, {"scope": "selected", "action": "cancel"}, htmx=True
    )
    assert response.status_code == 200  # the list again, with the message (not "422 ids: …")
    assert "Select at least one todo" in text(response)
    assert await pool.fetchval("SELECT count(*) FROM todos WHERE state = 'failed'") == 0


async def test_bulk_cancel_of_ticked_rows_answers_the_list_with_the_result(client, pool, store):
    token = await login(client, pool, "olga")
    a, b, c = [await enqueue(store, "mail", f"t{i}") for i in range(3)]
    response = await client.post(
        "/queues/mail/bulk",
        data={"scope": "selected", "action": "cancel", "reason": "spam", "ids": [a.id, b.id]},
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    fragment = assert_fragment(response, "todos")
    assert "2 cancelled" in text_of(fragment)
    assert [(await todo_row(pool, t.id)).state for t in (a, b, c)] == ["failed", "failed", "pending"]


async def test_all_matching_is_applied_again_in_the_database_while_claimers_take_todos(
    dsn, client, pool, store
):
    """The filter (ready todos of mail) is sent with the action; four claimers take todos
    meanwhile. Each todo ends either at the new priority or claimed, and the result line
    counts both right."""
    token = await login(client, pool, "olga")
    await store.create_many([new_todo("mail", f"t{i}") for i in range(600)])
    conns = await asyncio.gather(*(dbmod.connect(dsn) for _ in range(4)))
    stop = asyncio.Event()

    async def claimer(conn, name):
        mine = Store(conn)
        while not stop.is_set() and await mine.claim_next(["mail"], name, 60):
            pass

    try:
        claiming = [asyncio.create_task(claimer(c, f"w{i}")) for i, c in enumerate(conns)]
        response = await post(
            client,
            "/queues/mail/bulk",
            token,
            {"scope": "all", "action": "priority", "priority": "7", "state": "ready"},
            htmx=True,
        )
        stop.set()
        await asyncio.gather(*claiming)
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    summary = text_of(assert_fragment(response, "todos"))
    changed = int(re.search(r"(\d+) changed", summary).group(1))
    skipped = re.search(r"(\d+) skipped \((\d+) claimed\)", summary)
    assert changed == await pool.fetchval("SELECT count(*) FROM todos WHERE priority = 7")
    assert changed == await pool.fetchval("SELECT count(*) FROM todo_history WHERE note = 'edited'")
    left = await pool.fetchval("SELECT count(*) FROM todos WHERE priority = 0 AND state = 'pending'")
    assert left == 0  # every ready todo was changed, or claimed first
    if skipped:
        assert skipped.group(1) == skipped.group(2)
        assert changed + int(skipped.group(1)) <= 600


async def test_matching_ids_applies_the_same_filter_as_the_list(pool, store):
    for i in range(30):
        await enqueue(store, "mail", f"hello {i}" if i % 2 else f"bye {i}", kind="k" if i % 3 else None)
    await enqueue(store, "other", "hello elsewhere")
    await enqueue(store, "mail", "later", delay=600)
    reads = Reads(pool)
    for filters in [
        TodoFilter(queue="mail"),
        TodoFilter(queue="mail", state="ready"),
        TodoFilter(queue="mail", state="scheduled"),
        TodoFilter(queue="mail", kind="k", search="hello"),
    ]:
        listed, after = [], None
        while True:
            page = await reads.list_todos(filters, limit=7, after=after)
            listed += [t.id for t in page.items]
            if not (after := page.next_cursor):
                break
        assert sorted(await reads.matching_ids(filters, limit=1000)) == sorted(listed), filters


# -- the create form and the dead-letters page ------------------------------------------------------


async def test_the_create_form_schedules_with_a_priority_and_keeps_values_on_a_bad_delay(client, pool):
    token = await login(client, pool, "olga")
    form = {
        "queue": "mail",
        "title": "later",
        "payload": "{}",
        "priority": "3",
        "delay": "-5",
        "max_attempts": "5",
    }
    response = await post(client, "/create", token, form)
    assert response.status_code == 422
    assert "must be a number of seconds from 0" in field_label(text(response), "delay")
    assert 'value="later"' in response.text
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0
    response = await post(client, "/create", token, {**form, "delay": "", "run_at": "2099-01-01T10:00"})
    assert response.status_code == 422
    assert "within a year" in field_label(text(response), "run_at")
    response = await post(client, "/create", token, {**form, "delay": "600"})
    assert response.status_code == 303
    row = await pool.fetchrow("SELECT priority, ready_at - created_at AS wait FROM todos")
    assert row["priority"] == 3 and 599 < row["wait"].total_seconds() < 601


async def test_the_dead_letters_page_shows_hides_or_shows_only_cancelled_ones(control, client, pool, store):
    await login(client, pool, "olga")
    died = await dead_letter(store, pool, "mail")
    cancelled = await control.cancel((await enqueue(store, "mail")).id, OP, "no longer needed")
    both = (await get_page(client, "/dead")).text
    assert died.id in both and cancelled.id in both
    assert "cancelled by <bdi>olga</bdi>: <bdi>no longer needed</bdi>" in text(await client.get("/dead"))
    hidden = (await get_page(client, "/dead?cancelled=hide")).text
    assert died.id in hidden and cancelled.id not in hidden
    only = (await get_page(client, "/dead?cancelled=only")).text
    assert died.id not in only and cancelled.id in only
    assert (await client.get("/dead?cancelled=maybe")).status_code == 422


def text_of(fragment: str) -> str:
    """A fragment's words, tags dropped."""
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


# -- edit: every problem at once, and a todo changed since the form was drawn --------------------


def form_version(body: str) -> str:
    """The version of the todo the edit form was drawn from (its hidden field)."""
    match = re.search(r'<input type="hidden" name="version" value="(\d+)">', body)
    assert match, "no version in the edit form"
    return match.group(1)


async def test_an_edit_form_with_several_bad_fields_marks_them_all_and_changes_nothing(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", "old", payload={"a": 1})
    version = form_version((await get_page(client, f"/todos/{todo.id}/edit")).text)
    form = {
        "version": version,
        "title": " ",
        "assignee": "",
        "run_at": "tomorrow",
        "priority": "11",
        "max_attempts": "three",
        "payload": '{"a": 2',
    }
    response = await post(client, f"/todos/{todo.id}/edit", token, form)
    assert response.status_code == 422
    page = text(response)
    assert "Title is required" in field_label(page, "title")
    assert "is not a time" in field_label(page, "run_at")
    assert "must be a whole number from -10 to 10" in field_label(page, "priority")
    assert "must be a whole number from 1 to 100" in field_label(page, "max_attempts")
    assert "not valid JSON" in field_label(page, "payload")
    assert 'value="three"' in response.text and 'value="tomorrow"' in response.text
    assert form_version(response.text) == version
    assert (await todo_row(pool, todo.id)).version == todo.version


async def test_a_stale_save_comes_back_409_with_the_input_kept_and_saving_again_applies_it(
    control, client, pool, store
):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", "old", payload={"a": 1})
    version = form_version((await get_page(client, f"/todos/{todo.id}/edit")).text)
    await control.edit(todo.id, Actor("operator", "sam"), TodoEdit(title="sam's"))
    form = {
        "version": version,
        "title": "olga's",
        "kind": "call",
        "assignee": "",
        "priority": "3",
        "max_attempts": "5",
        "payload": '{"a": 2}',
    }
    response = await post(client, f"/todos/{todo.id}/edit", token, form)
    assert response.status_code == 409
    conflict = re.search(r'<div class="flash error conflict" id="conflict".*?</div>', text(response), re.S)
    assert conflict and "changed after you opened this form" in conflict.group(0)
    assert re.search(
        r"operator</small> <bdi>sam</bdi></span>\s*<span class=\"muted\">attempt 0</span>", conflict.group(0)
    )
    assert "edited: title old → sam's" in conflict.group(0)
    assert all(f'value="{v}"' in text(response) for v in ("olga's", "call", "3"))
    assert '{"a": 2}</textarea>' in text(response)
    now = await todo_row(pool, todo.id)
    assert now.title == "sam's" and form_version(response.text) == now.version

    again = await post(client, f"/todos/{todo.id}/edit", token, {**form, "version": now.version})
    assert again.status_code == 303, again.text
    row = await todo_row(pool, todo.id)
    assert (row.title, row.kind, row.priority, row.payload) == ("olga's", "call", 3, {"a": 2})


async def test_edit_and_retry_from_a_stale_form_is_refused_and_leaves_the_todo_dead(
    control, client, pool, store
):
    token = await login(client, pool, "olga")
    dead = await dead_letter(store, pool, "mail", payload={"to": "bad@"})
    version = form_version((await get_page(client, f"/todos/{dead.id}/edit?retry=1")).text)
    await control.edit(dead.id, Actor("operator", "sam"), TodoEdit(priority=2))
    form = {"version": version, "title": dead.title, "priority": "0", "max_attempts": "5"}
    form |= {"payload": '{"to": "ok@"}', "retry": "1"}
    response = await post(client, f"/todos/{dead.id}/edit", token, form)
    assert response.status_code == 409
    assert 'name="retry" value="1" checked' in response.text
    assert (await todo_row(pool, dead.id)).state == "failed"
    again = await post(
        client, f"/todos/{dead.id}/edit", token, {**form, "version": form_version(response.text)}
    )
    assert again.status_code == 303
    row = await todo_row(pool, dead.id)
    assert (row.state, row.priority, row.payload) == ("pending", 0, {"to": "ok@"})


async def test_an_edit_form_whose_version_is_not_one_says_so_and_changes_nothing(client, pool, store):
    token = await login(client, pool, "olga")
    todo = await enqueue(store, "mail", "old")
    form = {"version": "yesterday", "title": "new", "priority": "0", "max_attempts": "5", "payload": "{}"}
    response = await post(client, f"/todos/{todo.id}/edit", token, form)
    assert response.status_code == 422
    assert "does not say which version of the todo it shows" in text(response)
    assert (await todo_row(pool, todo.id)).title == "old"
