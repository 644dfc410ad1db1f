"""The operator dashboard, route by route, through the real app on a fresh database.

Every page, partial and action of DESIGN.md's "Web surface" is requested with the
in-process client (its lifespan runs the LISTEN hub and the reaper); state is set up with
the same Store the agents use and checked in the database afterwards. Security: roles,
CSRF, the login wall, the no-operator 503, CSP, cookie flags and escaping.
"""

from __future__ import annotations

import asyncio
import html
import re

import pytest

from dashboard.accounts import Accounts
from dashboard.errors import Conflict
from dashboard.models import NewEvent, NewTodo, Todo
from tests.factories import login

HX = {"HX-Request": "true"}
XSS_TITLE = '<script>alert("title")</script><img src=x onerror=alert(1)>'
XSS_PAYLOAD = {"html": "<script>alert('payload')</script>", "b": "<b>bold</b>"}

# -- helpers ------------------------------------------------------------------------------

async def new(store, queue: str = "work", title: str = "a todo", **fields) -> Todo:
    return (await store.create(NewTodo(queue=queue, title=title, **fields))).todo


async def claimed(store, queue: str = "work", title: str = "held", *, owner: str = "agent-7",
                  ttl: float = 300, **fields) -> Todo:
    todo = await new(store, queue, title, **fields)
    return await store.claim(todo.id, owner, ttl)


async def dead(store, queue: str = "work", title: str = "died", *, error: str = "boom", **fields) -> Todo:
    """A dead-letter: one attempt allowed, claimed once, failed."""
    fields.setdefault("max_attempts", 1)
    todo = await claimed(store, queue, title, owner="agent-1", ttl=60, **fields)
    died = await store.fail(todo.id, "agent-1", todo.lease_token, error)
    assert died.state == "failed"
    return died


async def retrying(store, pool, queue: str = "work", title: str = "retrying") -> Todo:
    """A pending todo whose next retry is an hour away (set by SQL so the reaper leaves it)."""
    todo = await claimed(store, queue, title, owner="agent-2", ttl=60, max_attempts=3)
    await store.fail(todo.id, "agent-2", todo.lease_token, "try later")
    await pool.execute("UPDATE todos SET next_retry_at = now() + interval '1 hour' WHERE id = $1", todo.id)
    return await row(pool, todo.id)


async def row(pool, todo_id: str) -> Todo:
    return Todo.from_record(await pool.fetchrow("SELECT * FROM todos WHERE id = $1", todo_id))


async def history(pool, todo_id: str) -> list[dict]:
    rows = await pool.fetch(
        "SELECT from_state, to_state, actor, attempt, note FROM todo_history WHERE todo_id = $1 ORDER BY id",
        todo_id,
    )
    return [dict(r) for r in rows]


async def snapshot(pool) -> tuple:
    """Everything an action could change: todos, history rows, tokens."""
    todos = await pool.fetch(
        "SELECT id, state, owner, attempt, max_attempts, dedupe_hits FROM todos ORDER BY id")
    hist = await pool.fetchval("SELECT count(*) FROM todo_history")
    tokens = await pool.fetch("SELECT id, revoked_at FROM api_tokens ORDER BY id")
    return [tuple(r) for r in todos], hist, [tuple(r) for r in tokens]


async def post(client, url: str, token: str | None, data: dict | None = None, *, htmx: bool = False,
               headers: dict | None = None):
    """A form post as the browser sends it: the CSRF token in the form, or in X-CSRFToken for htmx."""
    data = dict(data or {})
    headers = dict(headers or {})
    if htmx:
        headers.update(HX)
        if token is not None:
            headers["X-CSRFToken"] = token
    elif token is not None:
        data["_csrf_token"] = token
    return await client.post(url, data=data, headers=headers, follow_redirects=False)


def text(response) -> str:
    """The body with entities decoded, for reading what a person sees."""
    return html.unescape(response.text)


def ids_in(body: str) -> set[str]:
    return set(re.findall(r'href="/todos/(td_[0-9a-f-]+)"', body))


def queue_row(body: str, queue: str) -> str:
    match = re.search(rf'<tr[^>]*data-queue="{re.escape(queue)}".*?</tr>', body, re.S)
    assert match, f"no overview row for {queue}"
    return match.group(0)


def count(row_html: str, kind: str) -> int:
    match = re.search(rf'class="count {kind}">(\d+)<', row_html)
    assert match, f"no {kind} count in {row_html}"
    return int(match.group(1))


def field_label(body: str, name: str) -> str:
    """The <label> around the form field `name` (input or textarea)."""
    for match in re.finditer(r"<label\b.*?</label>", body, re.S):
        if re.search(rf'<(input|textarea) name="{name}"', match.group(0)):
            return match.group(0)
    raise AssertionError(f"no field {name}")


def flash_of(body: str) -> str:
    match = re.search(r'<div id="flash"[^>]*>(.*?)</div>', body, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).strip() if match else ""


def assert_no_stack_trace(response) -> None:
    assert "Traceback" not in response.text
    assert 'File "' not in response.text


async def shown_message(client, response) -> str:
    """What an operator reads after a refused form post: a 409 page, or the flash message on the
    page it is sent back to."""
    if response.status_code == 303:
        return flash_of((await client.get(response.headers["location"])).text)
    assert response.status_code == 409, response.status_code
    assert "<html" in response.text  # a page, with the way back
    assert_no_stack_trace(response)
    return text(response)


async def until_past(pool, moment) -> None:
    """Wait until the database's clock has passed `moment` (a lease expiry)."""
    for _ in range(200):
        if await pool.fetchval("SELECT clock_timestamp() > $1", moment):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the database clock never passed {moment}")


def csp_directives(response) -> dict[str, list[str]]:
    policy = response.headers["content-security-policy"]
    directives = {}
    for part in policy.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives


# -- overview -------------------------------------------------------------------------------

async def test_the_overview_counts_ready_retrying_claimed_and_dead_todos_per_queue(client, pool, store):
    await login(client, pool)
    await new(store, "mail", "one")
    await new(store, "mail", "two")
    await retrying(store, pool, "mail")
    await claimed(store, "mail")
    await dead(store, "mail")
    await new(store, "reports", "r")

    response = await client.get("/")

    assert response.status_code == 200
    mail = queue_row(response.text, "mail")
    assert (count(mail, "ready"), count(mail, "retrying"), count(mail, "claimed"), count(mail, "failed")) == (
        2, 1, 1, 1)
    assert 'href="/queues/mail"' in mail
    assert 'class="attention"' in mail  # a dead-letter needs the operator's attention
    reports = queue_row(response.text, "reports")
    assert (count(reports, "ready"), count(reports, "failed")) == (1, 0)
    assert "3 ready" in response.text and "1 dead" in response.text  # the totals across queues


async def test_the_overview_says_how_to_enqueue_when_there_are_no_queues(client, pool):
    await login(client, pool)
    response = await client.get("/")
    assert response.status_code == 200
    assert "No queues yet" in response.text


async def test_the_overview_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    await new(store, "mail")
    response = await client.get("/partials/overview", headers=HX)
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="overview"')
    assert "<html" not in response.text
    assert count(queue_row(response.text, "mail"), "ready") == 1


# -- queue page: filters, search, pagination --------------------------------------------------

async def test_the_queue_page_lists_the_queues_todos_and_no_others(client, pool, store):
    await login(client, pool)
    mine = await new(store, "mail", "to alice", kind="email.send", assignee="alice")
    other = await new(store, "reports", "elsewhere")

    response = await client.get("/queues/mail")

    assert response.status_code == 200
    assert ids_in(response.text) == {mine.id}
    assert other.id not in response.text
    assert "email.send" in response.text and "alice" in response.text
    assert 'href="/create?queue=mail"' in response.text


@pytest.mark.parametrize("state", ["ready", "retrying", "pending", "claimed", "done", "failed"])
async def test_the_queue_page_filters_by_state(client, pool, store, state):
    await login(client, pool)
    ready = await new(store, "mail", "ready one")
    later = await retrying(store, pool, "mail")
    held = await claimed(store, "mail")
    finished = await claimed(store, "mail", "finished")
    await store.complete(finished.id, finished.owner, finished.lease_token, {"ok": True})
    died = await dead(store, "mail")
    expected = {"ready": {ready.id}, "retrying": {later.id}, "pending": {ready.id, later.id},
                "claimed": {held.id}, "done": {finished.id}, "failed": {died.id}}[state]

    response = await client.get(f"/queues/mail?state={state}")

    assert response.status_code == 200
    assert ids_in(response.text) == expected
    assert f'<option value="{state}" selected>' in response.text


async def test_the_queue_page_filters_by_assignee_owner_and_kind(client, pool, store):
    await login(client, pool)
    for_alice = await new(store, "mail", "for alice", assignee="alice")
    held_by_bot = await claimed(store, "mail", "held", owner="bot-3")
    digest = await new(store, "mail", "digest", kind="email.digest")
    await new(store, "mail", "plain")

    assert ids_in((await client.get("/queues/mail?assignee=alice")).text) == {for_alice.id}
    assert ids_in((await client.get("/queues/mail?owner=bot-3")).text) == {held_by_bot.id}
    assert ids_in((await client.get("/queues/mail?kind=email.digest")).text) == {digest.id}
    assert ids_in((await client.get("/queues/mail?kind=email.digest&assignee=alice")).text) == set()


async def test_the_queue_page_searches_by_id_title_and_idempotency_key(client, pool, store):
    await login(client, pool)
    invoice = await new(store, "mail", "Send the March invoice")
    keyed = await new(store, "mail", "webhook delivery", idempotency_key="gh-delivery-42")
    percent = await new(store, "mail", "100% done")
    await new(store, "mail", "unrelated")

    assert ids_in((await client.get("/queues/mail?q=march")).text) == {invoice.id}
    assert ids_in((await client.get("/queues/mail?q=gh-delivery-42")).text) == {keyed.id}
    assert ids_in((await client.get(f"/queues/mail?q={keyed.id}")).text) == {keyed.id}
    assert ids_in((await client.get("/queues/mail?q=100%25")).text) == {percent.id}  # % is literal
    searched = await client.get("/queues/mail?q=nothing-like-this")
    assert ids_in(searched.text) == set()
    assert "No todos match." in searched.text
    assert 'value="nothing-like-this"' in searched.text  # the search box keeps the term


async def test_the_queue_pages_older_link_gives_the_next_page_without_overlap(client, pool, store):
    await login(client, pool)
    # Two batches of 30: each batch shares one created_at, so the keyset must break ties by id.
    wanted = set()
    for _ in range(2):
        created = await store.create_many([NewTodo(queue="mail", title="t", kind="k1") for _ in range(30)])
        wanted |= {c.todo.id for c in created}
    await store.create_many([NewTodo(queue="mail", title="other kind", kind="k2") for _ in range(5)])

    first = await client.get("/queues/mail?kind=k1")
    page1 = ids_in(first.text)
    older = re.search(r'<a href="([^"]+)">older »</a>', first.text)
    assert older, "the first page links to the next one"
    link = html.unescape(older.group(1))
    assert "kind=k1" in link and "after=" in link  # the filter survives paging

    second = await client.get(link)
    page2 = ids_in(second.text)

    assert len(page1) == 50
    assert len(page2) == 10
    assert page1.isdisjoint(page2)
    assert page1 | page2 == wanted
    assert "older »" not in second.text  # the last page
    assert "« newest" in second.text


async def test_the_queue_partial_honours_the_filters_and_the_cursor(client, pool, store):
    await login(client, pool)
    await store.create_many([NewTodo(queue="mail", title=f"t{i}") for i in range(55)])
    first = await client.get("/queues/mail")
    cursor = re.search(r"after=([A-Za-z0-9_-]+)", first.text).group(1)

    response = await client.get(f"/partials/queues/mail?after={cursor}", headers=HX)

    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="todos"')
    assert "<html" not in response.text
    assert len(ids_in(response.text)) == 5
    assert ids_in(response.text).isdisjoint(ids_in(first.text))
    assert f"after={cursor}" in response.text  # its own polling keeps the page it shows


async def test_a_bad_queue_name_state_or_cursor_is_a_422_page_not_a_stack_trace(client, pool):
    await login(client, pool)
    for url, words in [("/queues/Not%20A%20Queue!", "is not a queue name"),
                       ("/queues/mail?state=sleeping", "state: must be one of"),
                       ("/queues/mail?after=garbage", "is not a cursor this server gave out"),
                       ("/dead?queue=BAD!", "is not a queue name")]:
        response = await client.get(url)
        assert response.status_code == 422, url
        assert words in text(response), url
        assert_no_stack_trace(response)


# -- leases -----------------------------------------------------------------------------------

async def test_the_leases_page_shows_owner_attempt_time_left_and_a_release_button(client, pool, store):
    await login(client, pool)
    held = await claimed(store, "mail", "sending", owner="mailer-2", ttl=300)

    response = await client.get("/leases")

    assert response.status_code == 200
    body = response.text
    assert held.id in body and "mailer-2" in body and "1/5" in body
    seconds_left = float(re.search(r'data-seconds-left="([\d.]+)"', body).group(1))
    assert 290 <= seconds_left <= 300  # counted down in the browser by app.js from here
    assert "data-seconds-ago=" in body  # the heartbeat age
    assert f'hx-post="/todos/{held.id}/release"' in body and "Force-release" in body


async def test_a_lapsed_lease_the_reaper_has_not_taken_yet_is_marked_lapsed(client, pool, store):
    await login(client, pool)
    healthy = await claimed(store, "mail", "fine", owner="agent-ok", ttl=300)
    stuck = await claimed(store, "mail", "stuck", owner="agent-gone", ttl=1)
    # Hold the row so the app's reaper (FOR UPDATE SKIP LOCKED) passes it over, then let it lapse.
    async with pool.acquire() as lock, lock.transaction():
        await lock.execute("SELECT 1 FROM todos WHERE id = $1 FOR SHARE", stuck.id)
        await until_past(pool, stuck.lease_expires_at)

        leases = await client.get("/leases")
        overview = await client.get("/")

    stuck_row = re.search(rf'<tr class="lapsed" data-todo="{stuck.id}">.*?</tr>', leases.text, re.S)
    assert stuck_row, "the lapsed lease's row is marked"
    assert "lapsed" in stuck_row.group(0) and "data-seconds-left" not in stuck_row.group(0)
    healthy_row = re.search(rf'<tr class="" data-todo="{healthy.id}">.*?</tr>', leases.text, re.S)
    assert healthy_row and "data-seconds-left" in healthy_row.group(0)
    assert "1 lapsed" in queue_row(overview.text, "mail")


async def test_the_leases_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    held = await claimed(store, "mail")
    response = await client.get("/partials/leases", headers=HX)
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="leases"')
    assert "<html" not in response.text
    assert held.id in response.text


async def test_the_leases_page_says_when_nothing_is_claimed(client, pool):
    await login(client, pool)
    response = await client.get("/leases")
    assert "No todo is claimed right now." in response.text


# -- dead-letters -------------------------------------------------------------------------------

async def test_the_dead_letters_page_shows_the_last_error_and_attempts(client, pool, store):
    await login(client, pool)
    died = await dead(store, "mail", "bounced", error="SMTP 550: mailbox unavailable")
    other = await dead(store, "reports", "broken report")
    await new(store, "mail", "alive")

    response = await client.get("/dead")

    assert response.status_code == 200
    assert ids_in(response.text) == {died.id, other.id}
    assert "SMTP 550: mailbox unavailable" in text(response)
    assert "1/1" in response.text
    assert "Retry selected" in response.text and "Retry all" in response.text

    only_mail = await client.get("/dead?queue=mail")
    assert ids_in(only_mail.text) == {died.id}
    assert 'name="queue" value="mail"' in only_mail.text  # "retry all" stays inside the filter
    assert "Retry all in mail" in only_mail.text


async def test_the_dead_letters_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    died = await dead(store, "mail")
    await dead(store, "reports")
    response = await client.get("/partials/dead?queue=mail", headers=HX)
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="dead"')
    assert "<html" not in response.text
    assert ids_in(response.text) == {died.id}


async def test_the_dead_letters_page_says_when_there_are_none(client, pool):
    await login(client, pool)
    response = await client.get("/dead")
    assert "No dead-letters" in response.text


# -- todo detail -----------------------------------------------------------------------------------

async def test_the_todo_page_shows_fields_pretty_json_history_and_the_linked_event(client, pool, store):
    await login(client, pool)
    todo = await new(
        store, "mail", "Welcome mail", kind="email.send", assignee="mailer-1", idempotency_key="signup-77",
        payload={"to": "a@example.com", "vars": {"name": "Ada", "ids": [1, 2]}}, max_attempts=3,
        event=NewEvent(source="shop", kind="user.signup", payload={"user": 77}),
    )
    held = await store.claim(todo.id, "mailer-1", 60)
    await store.fail(todo.id, "mailer-1", held.lease_token, "SMTP timeout")

    response = await client.get(f"/todos/{todo.id}")

    assert response.status_code == 200
    body = text(response)
    for value in ("Welcome mail", todo.id, "email.send", "mailer-1", "signup-77", "1 of 3", "SMTP timeout"):
        assert value in body, value
    assert '"vars": {\n    "ids": [\n      1,\n      2\n    ],\n    "name": "Ada"\n  }' in body  # pretty JSON
    assert "retrying" in body  # a pending todo with a future retry is shown as retrying
    timeline = re.search(r'<ol class="timeline">(.*?)</ol>', body, re.S).group(1)
    entries = re.findall(r"<li class=\"to-(\w+)\">(.*?)</li>", timeline, re.S)
    assert [state for state, _ in entries] == ["pending", "claimed", "pending"]
    assert "producer" in entries[0][1] and "created" in entries[0][1]
    assert "mailer-1" in entries[1][1]
    assert "SMTP timeout" in entries[2][1]
    event_id = (await row(pool, todo.id)).event_id
    assert event_id and event_id in body
    assert "shop · user.signup" in body and '"user": 77' in body


async def test_the_todo_partial_is_the_detail_fragment_alone(client, pool, store):
    await login(client, pool)
    todo = await new(store, "mail", "fragment")
    response = await client.get(f"/partials/todos/{todo.id}", headers=HX)
    assert response.status_code == 200
    assert response.text.lstrip().startswith(f'<div id="todo" hx-get="/partials/todos/{todo.id}"')
    assert "<html" not in response.text
    assert "fragment" in response.text


async def test_an_unknown_todo_is_a_404_page_not_a_stack_trace(client, pool):
    await login(client, pool)
    for url in ("/todos/td_does-not-exist", "/partials/todos/td_does-not-exist"):
        response = await client.get(url)
        assert response.status_code == 404, url
        assert "no todo td_does-not-exist" in response.text
        assert_no_stack_trace(response)
    page = await client.get("/todos/td_does-not-exist")
    assert "Back to the overview" in page.text  # a whole page, with the way out


async def test_an_unknown_todo_asked_for_by_htmx_is_an_error_fragment_for_the_flash_area(client, pool):
    await login(client, pool)
    response = await client.get("/partials/todos/td_nope", headers=HX)
    assert response.status_code == 404
    assert response.headers["hx-retarget"] == "#flash"
    assert "<html" not in response.text and "no todo td_nope" in response.text


async def test_the_todo_page_offers_only_the_actions_its_state_allows(client, pool, store):
    await login(client, pool)
    pending = await new(store, "mail", "waiting")
    held = await claimed(store, "mail")
    died = await dead(store, "mail")

    pending_page = (await client.get(f"/todos/{pending.id}")).text
    held_page = (await client.get(f"/todos/{held.id}")).text
    dead_page = (await client.get(f"/todos/{died.id}")).text

    assert "/retry" not in pending_page and "/release" not in pending_page
    assert f'action="/todos/{held.id}/release"' in held_page and "/retry" not in held_page
    assert f'action="/todos/{died.id}/retry"' in dead_page and "/release" not in dead_page
    assert 'value="one_more"' in dead_page  # the budget choice


# -- create -------------------------------------------------------------------------------------

async def test_the_create_form_is_prefilled_with_the_queue_it_came_from(client, pool):
    await login(client, pool)
    response = await client.get("/create?queue=mail")
    assert response.status_code == 200
    assert 'name="queue" type="text" value="mail"' in response.text
    assert 'name="max_attempts" type="number" value="5"' in response.text
    assert 'name="_csrf_token"' in response.text


async def test_creating_a_todo_redirects_to_its_queue_and_stores_it_with_its_assignee(client, pool):
    token = await login(client, pool, "olga")
    response = await post(client, "/create", token, {
        "queue": "mail", "title": "Call the customer", "kind": "phone", "assignee": "sam",
        "idempotency_key": "", "max_attempts": "7", "payload": '{"phone": "+44 20 7946 0000"}',
    })

    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/queues/mail"
    rows = await pool.fetch("SELECT * FROM todos")
    assert len(rows) == 1
    todo = Todo.from_record(rows[0])
    assert (todo.queue, todo.title, todo.kind, todo.assignee, todo.max_attempts, todo.state) == (
        "mail", "Call the customer", "phone", "sam", 7, "pending")
    assert todo.payload == {"phone": "+44 20 7946 0000"}
    assert todo.idempotency_key is None
    assert (await history(pool, todo.id))[0]["actor"] == "operator:olga"
    queue_page = await client.get("/queues/mail")
    assert f"created {todo.id}: Call the customer" in flash_of(queue_page.text)
    assert todo.id in ids_in(queue_page.text)


@pytest.mark.parametrize(("field", "bad", "message"), [
    ("payload", '{"to": "a@example.com",', "not valid JSON"),
    ("payload", "[1, 2]", "must be a JSON object"),
    ("queue", "Mail Queue!", "is not a queue name"),
    ("max_attempts", "0", "from 1 to 100"),
    ("max_attempts", "101", "from 1 to 100"),
    ("max_attempts", "three", "whole number from 1 to 100"),
])
async def test_an_invalid_create_form_is_a_422_with_the_error_by_the_field_and_the_input_kept(
    client, pool, field, bad, message,
):
    token = await login(client, pool)
    form = {"queue": "mail", "title": "Keep my title", "kind": "k", "assignee": "sam",
            "idempotency_key": "key-1", "max_attempts": "4", "payload": '{"a": 1}'}
    form[field] = bad

    response = await post(client, "/create", token, form)

    assert response.status_code == 422
    assert await pool.fetchval("SELECT count(*) FROM todos") == 0
    label = field_label(response.text, field)
    assert 'class="field-error"' in label and message in html.unescape(label)
    assert 'aria-invalid="true"' in label
    assert "fix the fields marked below" in response.text
    body = text(response)
    assert 'value="Keep my title"' in body and 'value="sam"' in body and 'value="key-1"' in body
    if field == "payload":
        assert f">{bad}</textarea>" in body
    else:
        assert f'value="{bad}"' in body and '{"a": 1}</textarea>' in body


async def test_creating_with_a_live_key_shows_the_existing_todo_and_counts_the_duplicate(client, pool, store):
    token = await login(client, pool)
    existing = await new(store, "mail", "first delivery", idempotency_key="evt-9")

    response = await post(client, "/create", token, {
        "queue": "mail", "title": "second delivery", "idempotency_key": "evt-9", "payload": "{}",
        "max_attempts": "5",
    })

    assert response.status_code == 303
    assert response.headers["location"] == f"/todos/{existing.id}"
    assert await pool.fetchval("SELECT count(*) FROM todos") == 1
    assert (await row(pool, existing.id)).dedupe_hits == 1
    shown = await client.get(f"/todos/{existing.id}")
    assert "already holds key 'evt-9'" in flash_of(shown.text)
    assert "nothing new was created" in flash_of(shown.text)


# -- retry ---------------------------------------------------------------------------------------

async def test_retrying_a_dead_letter_with_a_fresh_budget_resets_its_attempts(client, pool, store):
    token = await login(client, pool, "olga")
    died = await dead(store, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "fresh"})

    assert response.status_code == 303
    assert response.headers["location"] == f"/todos/{died.id}"
    after = await row(pool, died.id)
    assert (after.state, after.attempt, after.max_attempts, after.next_retry_at) == ("pending", 0, 1, None)
    last = (await history(pool, died.id))[-1]
    assert (last["from_state"], last["to_state"], last["actor"]) == ("failed", "pending", "operator:olga")
    assert "fresh budget" in last["note"]
    assert f"{died.id} retried" in flash_of((await client.get(f"/todos/{died.id}")).text)


async def test_retrying_a_dead_letter_with_one_more_attempt_raises_its_cap_by_one(client, pool, store):
    token = await login(client, pool)
    died = await dead(store, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "one_more"})

    assert response.status_code == 303
    after = await row(pool, died.id)
    assert (after.state, after.attempt, after.max_attempts) == ("pending", 1, 2)
    assert "one more attempt" in (await history(pool, died.id))[-1]["note"]
    assert (await store.claim_next(["mail"], "agent-1", 30)).id == died.id  # claimable again


async def test_retrying_from_htmx_answers_the_todo_fragment_with_the_outcome(client, pool, store):
    token = await login(client, pool)
    died = await dead(store, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "fresh"}, htmx=True)

    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="todo"')
    assert "<html" not in response.text
    assert f"{died.id} retried: pending again" in response.text
    assert (await row(pool, died.id)).state == "pending"


async def test_retrying_a_todo_that_is_not_dead_explains_the_conflict_and_changes_nothing(
    client, pool, store,
):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-5")

    response = await post(client, f"/todos/{held.id}/retry", token, {"budget": "fresh"})

    message = await shown_message(client, response)
    assert f"cannot retry todo {held.id}: it is claimed by agent-5" in message
    assert (await row(pool, held.id)).state == "claimed"
    assert len(await history(pool, held.id)) == 2  # created, claimed: the refusal recorded nothing


async def test_a_conflict_answered_to_htmx_is_a_409_with_the_reason(client, pool, store):
    token = await login(client, pool)
    pending = await new(store, "mail", "not dead")

    retried = await post(client, f"/todos/{pending.id}/retry", token, {"budget": "fresh"}, htmx=True)
    released = await post(client, f"/todos/{pending.id}/release", token, htmx=True)

    assert retried.status_code == 409
    assert f"cannot retry todo {pending.id}: it is pending" in retried.text
    assert released.status_code == 409
    assert f"cannot force-release todo {pending.id}: it is pending" in released.text
    assert "<html" not in retried.text + released.text


async def test_a_conflict_answered_to_a_json_caller_is_a_409_problem(client, pool, store):
    token = await login(client, pool)
    pending = await new(store, "mail", "not dead")

    response = await post(client, f"/todos/{pending.id}/retry", token, {"budget": "fresh"},
                          headers={"Accept": "application/json"})

    assert response.status_code == 409
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["detail"].startswith(f"cannot retry todo {pending.id}: it is pending")


async def test_retrying_an_unknown_todo_answers_404_with_its_id(client, pool):
    token = await login(client, pool)
    response = await post(client, "/todos/td_missing/retry", token, {"budget": "fresh"})
    assert response.status_code == 404
    assert "no todo td_missing" in response.text
    assert_no_stack_trace(response)


async def test_retrying_with_an_unknown_budget_is_refused(client, pool, store):
    token = await login(client, pool)
    died = await dead(store, "mail")
    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "infinite"})
    assert response.status_code == 422
    assert "budget: must be fresh or one_more" in text(response)
    assert (await row(pool, died.id)).state == "failed"


async def test_retrying_the_selected_dead_letters_retries_those_and_no_others(client, pool, store):
    token = await login(client, pool)
    first, second, untouched = [await dead(store, "mail", f"d{i}") for i in range(3)]

    response = await post(client, "/dead/retry", token,
                          {"scope": "selected", "ids": [first.id, second.id], "budget": "fresh"})

    assert response.status_code == 303
    assert response.headers["location"] == "/dead"
    states = [(await row(pool, t.id)).state for t in (first, second, untouched)]
    assert states == ["pending", "pending", "failed"]
    assert flash_of((await client.get("/dead")).text) == "2 retried"


async def test_retrying_with_nothing_selected_says_to_select_something(client, pool, store):
    token = await login(client, pool)
    died = await dead(store, "mail")
    response = await post(client, "/dead/retry", token, {"scope": "selected", "budget": "fresh"})
    assert response.status_code == 422
    assert "select at least one dead-letter" in text(response)
    assert (await row(pool, died.id)).state == "failed"


async def _dead_in_mail_one_key_taken(store) -> tuple[Todo, Todo, Todo, Todo, Todo]:
    """Three dead-letters in mail (one whose key a live todo took meanwhile) and one in reports."""
    keyed = await dead(store, "mail", "keyed", idempotency_key="order-1")
    live = await new(store, "mail", "redelivered", idempotency_key="order-1")
    plain1 = await dead(store, "mail", "plain 1")
    plain2 = await dead(store, "mail", "plain 2")
    elsewhere = await dead(store, "reports", "other queue")
    return keyed, live, plain1, plain2, elsewhere


async def test_retrying_all_dead_letters_of_a_queue_reports_retried_and_refused(client, pool, store):
    token = await login(client, pool)
    keyed, live, plain1, plain2, elsewhere = await _dead_in_mail_one_key_taken(store)

    response = await post(client, "/dead/retry", token, {"scope": "all", "queue": "mail", "budget": "fresh"})

    assert response.status_code == 303
    assert response.headers["location"] == "/dead?queue=mail"
    states = {t.id: (await row(pool, t.id)).state for t in (keyed, plain1, plain2, elsewhere)}
    assert states == {keyed.id: "failed", plain1.id: "pending", plain2.id: "pending", elsewhere.id: "failed"}
    report = flash_of((await client.get("/dead?queue=mail")).text)
    assert report.startswith("2 retried, 1 refused: ")
    assert f"cannot retry todo {keyed.id}: a live todo already holds key 'order-1'" in report
    assert live.id in report


async def test_retrying_all_from_htmx_answers_the_dead_fragment_with_the_report_and_keeps_the_filter(
    client, pool, store,
):
    token = await login(client, pool)
    keyed, _, _, _, elsewhere = await _dead_in_mail_one_key_taken(store)

    response = await post(client, "/dead/retry", token, {"scope": "all", "queue": "mail", "budget": "fresh"},
                          htmx=True)

    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="dead"')
    assert "2 retried, 1 refused" in text(response)
    # Still the mail view: its poll, its "retry all" button and its rows stay inside the filter.
    assert 'hx-get="/partials/dead?queue=mail"' in response.text
    assert 'name="queue" value="mail"' in response.text
    assert ids_in(response.text) == {keyed.id}
    assert elsewhere.id not in response.text


# -- force-release --------------------------------------------------------------------------------

async def test_force_releasing_a_lease_makes_the_todo_pending_and_records_the_operator(client, pool, store):
    token = await login(client, pool, "olga")
    held = await claimed(store, "mail", owner="agent-gone")

    response = await post(client, f"/todos/{held.id}/release", token)

    assert response.status_code == 303
    assert response.headers["location"] == f"/todos/{held.id}"
    after = await row(pool, held.id)
    assert (after.state, after.owner, after.lease_expires_at) == ("pending", None, None)
    last = (await history(pool, held.id))[-1]
    assert (last["from_state"], last["to_state"], last["actor"]) == ("claimed", "pending", "operator:olga")
    assert "was held by agent-gone" in last["note"]
    with pytest.raises(Conflict):  # the gone agent's late result is refused
        await store.complete(held.id, "agent-gone", held.lease_token, {"late": True})


async def test_force_releasing_from_the_leases_page_goes_back_there(client, pool, store):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-gone")

    response = await post(client, f"/todos/{held.id}/release", token, {"back": "leases"})

    assert response.status_code == 303
    assert response.headers["location"] == "/leases"
    leases = await client.get("/leases")
    assert f"lease on {held.id} released" in flash_of(leases.text)
    assert held.id not in re.sub(r'<div id="flash".*?</div>', "", leases.text, flags=re.S)


async def test_force_releasing_from_htmx_answers_the_leases_fragment_without_the_row(client, pool, store):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-gone")
    kept = await claimed(store, "mail", "still working", owner="agent-alive")

    response = await post(client, f"/todos/{held.id}/release", token, {"back": "leases"}, htmx=True)

    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="leases"')
    assert f"lease on {held.id} released: pending again" in response.text
    assert f'data-todo="{held.id}"' not in response.text
    assert f'data-todo="{kept.id}"' in response.text


async def test_force_releasing_from_the_todo_page_with_htmx_answers_the_todo_fragment(client, pool, store):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-gone")
    response = await post(client, f"/todos/{held.id}/release", token, htmx=True)
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="todo"')
    assert "released: pending again" in response.text


async def test_force_releasing_a_todo_nobody_holds_explains_the_conflict(client, pool, store):
    token = await login(client, pool)
    pending = await new(store, "mail", "waiting")
    response = await post(client, f"/todos/{pending.id}/release", token)
    message = await shown_message(client, response)
    assert f"cannot force-release todo {pending.id}: it is pending" in message
    assert len(await history(pool, pending.id)) == 1  # nothing was recorded but the creation


# -- tokens ----------------------------------------------------------------------------------------

async def test_the_tokens_page_lists_tokens_without_their_secrets(client, pool):
    await login(client, pool)
    token_id, secret = await Accounts(pool).add_token("mailer-1", ["mail"])
    response = await client.get("/tokens")
    assert response.status_code == 200
    assert token_id in response.text and "mailer-1" in response.text
    assert secret not in response.text
    assert f'action="/tokens/{token_id}/revoke"' in response.text


async def test_creating_a_token_shows_its_secret_once_and_the_secret_works(client, pool):
    token = await login(client, pool, "olga")

    response = await post(client, "/tokens", token, {"agent": "mailer-1", "queues": "mail, reports"})

    assert response.status_code == 200
    secret = re.search(r'<pre class="mono secret">(sbt_[^<]+)</pre>', response.text).group(1)
    stored = await pool.fetchrow("SELECT agent, queues, created_by FROM api_tokens")
    assert tuple(stored) == ("mailer-1", ["mail", "reports"], "operator:olga")
    api = await client.get("/api/v1/todos?queue=mail", headers={"Authorization": f"Bearer {secret}"})
    assert api.status_code == 200
    assert secret not in (await client.get("/tokens")).text  # shown once


async def test_creating_a_token_for_a_bad_queue_says_why_and_creates_nothing(client, pool):
    token = await login(client, pool)
    response = await post(client, "/tokens", token, {"agent": "mailer-1", "queues": "Mail!"})
    assert response.status_code == 200
    assert "is not a queue name" in text(response)
    assert await pool.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_revoking_a_token_stops_it_at_once(client, pool):
    token = await login(client, pool, "olga")
    token_id, secret = await Accounts(pool).add_token("mailer-1", ["mail"])
    bearer = {"Authorization": f"Bearer {secret}"}
    assert (await client.get("/api/v1/todos?queue=mail", headers=bearer)).status_code == 200

    response = await post(client, f"/tokens/{token_id}/revoke", token)

    assert response.status_code == 303
    assert response.headers["location"] == "/tokens"
    assert (await client.get("/api/v1/todos?queue=mail", headers=bearer)).status_code == 401
    assert await pool.fetchval("SELECT revoked_by FROM api_tokens WHERE id = $1", token_id) == "operator:olga"
    page = await client.get("/tokens")
    assert f"token {token_id} revoked" in flash_of(page.text)
    assert f'action="/tokens/{token_id}/revoke"' not in page.text


async def test_revoking_a_revoked_token_is_a_409_with_the_reason_for_pages_htmx_and_json(client, pool):
    token = await login(client, pool)
    token_id, _ = await Accounts(pool).add_token("mailer-1", ["mail"])
    await Accounts(pool).revoke_token(token_id, actor="cli")

    page = await post(client, f"/tokens/{token_id}/revoke", token)
    fragment = await post(client, f"/tokens/{token_id}/revoke", token, htmx=True)
    problem = await post(client, f"/tokens/{token_id}/revoke", token, headers={"Accept": "application/json"})

    assert page.status_code == fragment.status_code == problem.status_code == 409
    assert f"token {token_id} is already revoked" in page.text and "<html" in page.text
    assert f"token {token_id} is already revoked" in fragment.text and "<html" not in fragment.text
    assert fragment.headers["hx-retarget"] == "#flash"
    assert problem.json()["detail"] == f"token {token_id} is already revoked"
    for response in (page, fragment, problem):
        assert_no_stack_trace(response)


# -- security: roles, CSRF, login wall ----------------------------------------------------------------

async def _one_of_everything(store, pool) -> dict:
    token_id, _ = await Accounts(pool).add_token("mailer-1", ["mail"])
    return {"dead": await dead(store, "mail"), "held": await claimed(store, "mail"),
            "pending": await new(store, "mail", "waiting"), "token": token_id}


def _every_action(things: dict) -> list[tuple[str, dict]]:
    dead_id, held_id = things["dead"].id, things["held"].id
    return [
        ("/create", {"queue": "mail", "title": "sneaky", "payload": "{}", "max_attempts": "5"}),
        (f"/todos/{dead_id}/retry", {"budget": "fresh"}),
        (f"/todos/{held_id}/release", {}),
        (f"/todos/{held_id}/release", {"back": "leases"}),
        ("/dead/retry", {"one": dead_id, "budget": "fresh"}),
        ("/dead/retry", {"scope": "selected", "ids": [dead_id], "budget": "fresh"}),
        ("/dead/retry", {"scope": "all", "budget": "one_more"}),
        ("/tokens", {"agent": "sneaky", "queues": "mail"}),
        (f"/tokens/{things['token']}/revoke", {}),
    ]


async def test_a_viewer_gets_403_for_every_action_and_nothing_changes(client, pool, store):
    token = await login(client, pool, "vera", "viewer")
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        for htmx in (False, True):
            response = await post(client, url, token, data, htmx=htmx)
            assert response.status_code == 403, (url, htmx)
            assert "viewers can look but not change anything" in response.text
            assert_no_stack_trace(response)

    assert await snapshot(pool) == before


async def test_a_viewer_sees_the_pages_without_any_action_buttons(client, pool, store):
    await login(client, pool, "vera", "viewer")
    things = await _one_of_everything(store, pool)

    leases = (await client.get("/leases")).text
    dead_page = (await client.get("/dead")).text
    dead_todo = (await client.get(f"/todos/{things['dead'].id}")).text
    create = (await client.get("/create")).text
    tokens = (await client.get("/tokens")).text

    assert things["held"].id in leases and "Force-release" not in leases
    assert things["dead"].id in dead_page and "Retry selected" not in dead_page
    assert "/retry" not in dead_todo
    assert "Viewers cannot create todos." in create
    assert '<button class="primary">Create</button>' not in create
    assert "/revoke" not in tokens and "Create token" not in tokens


async def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(client, pool, store):
    token = await login(client, pool)
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        missing = await post(client, url, None, data)
        forged = await post(client, url, "0" * len(token), data)
        missing_htmx = await post(client, url, None, data, htmx=True)
        for response in (missing, forged, missing_htmx):
            assert response.status_code == 403, url
            assert "CSRF" in response.text
            assert_no_stack_trace(response)

    assert await snapshot(pool) == before


async def test_logging_out_needs_the_csrf_token_too(client, pool):
    token = await login(client, pool)
    assert (await post(client, "/logout", None)).status_code == 403
    assert (await client.get("/", follow_redirects=False)).status_code == 200  # still logged in
    response = await post(client, "/logout", token)
    assert response.status_code == 303
    assert (await client.get("/", follow_redirects=False)).status_code == 303


PAGES = ["/", "/queues/mail", "/leases", "/dead", "/create", "/tokens", "/todos/{id}", "/partials/overview",
         "/partials/queues/mail", "/partials/leases", "/partials/dead", "/partials/todos/{id}", "/events"]


async def test_anonymous_requests_to_every_page_are_sent_to_the_login_page(client, pool, store):
    await Accounts(pool).add_operator("olga", "operator")
    todo = await new(store, "mail")

    for path in (p.format(id=todo.id) for p in PAGES):
        response = await client.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"] == f"/login?next={path}", path


async def test_anonymous_actions_change_nothing(client, pool, store):
    await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    token = client.cookies.get("csrftoken")
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        response = await post(client, url, token, data)
        assert response.status_code == 303, url
        assert response.headers["location"].startswith("/login?next="), url
        fragment = await post(client, url, token, data, htmx=True)
        assert fragment.headers["hx-redirect"].startswith("/login"), url

    assert await snapshot(pool) == before


async def test_an_anonymous_htmx_request_gets_a_redirect_htmx_can_act_on(client, pool):
    await Accounts(pool).add_operator("olga", "operator")
    response = await client.get("/partials/overview", headers=HX, follow_redirects=False)
    assert response.headers.get("hx-redirect", "").startswith("/login")
    assert not 300 <= response.status_code < 400


async def test_logging_in_goes_to_the_page_asked_for_but_never_off_site(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login?next=/leases")
    csrf = client.cookies.get("csrftoken")

    wrong = await client.post("/login", data={"name": "olga", "password": "nope", "next": "/leases",
                                              "_csrf_token": csrf}, follow_redirects=False)
    assert wrong.status_code == 401
    assert "do not match an operator" in text(wrong)

    for target, landing in [("/leases", "/leases"), ("//evil.example/x", "/"), ("https://evil.example", "/")]:
        response = await client.post("/login", data={"name": "olga", "password": password, "next": target,
                                                     "_csrf_token": csrf}, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"] == landing, target


async def test_with_no_operator_account_the_dashboard_is_a_503_saying_how_to_make_one(client, pool, store):
    todo = await new(store, "mail")
    for path in (p.format(id=todo.id) for p in PAGES):
        response = await client.get(path, follow_redirects=False)
        assert response.status_code == 503, path
        assert "switchboard operator add NAME --role operator" in response.text
        assert "no operator account" in response.text

    await Accounts(pool).add_operator("olga", "operator")  # then it serves the login wall
    assert (await client.get("/", follow_redirects=False)).status_code == 303


# -- security: headers, cookies, escaping ---------------------------------------------------------------

async def test_every_response_forbids_inline_script_in_its_content_security_policy(client, pool, store):
    no_operator = await client.get("/")
    await login(client, pool)
    todo = await new(store, "mail")
    responses = [no_operator, await client.get("/login")]
    responses += [await client.get(p.format(id=todo.id)) for p in PAGES if p != "/events"]
    responses += [await client.get("/todos/td_nope"), await client.get("/queues/BAD!")]

    for response in responses:
        directives = csp_directives(response)
        scripts = directives.get("script-src", directives.get("default-src"))
        assert scripts == ["'self'"], response.url
        assert "'unsafe-inline'" not in directives.get("default-src", [])
        assert response.headers["x-content-type-options"] == "nosniff"
        # and the HTML needs none: every script is a file, no inline event handlers
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", response.text), response.url
        assert not re.search(r"\son[a-z]+\s*=", response.text, re.I), response.url
    assert (await client.get("/healthz")).headers["content-security-policy"]


async def test_the_csrf_refusal_page_carries_the_content_security_policy_too(client, pool):
    await login(client, pool)
    response = await post(client, "/create", None, {"queue": "mail", "title": "t"})
    assert response.status_code == 403
    assert "<script src=" in response.text  # a whole page, with the app's scripts
    assert "script-src 'self'" in response.headers.get("content-security-policy", "")
    assert response.headers.get("x-frame-options") == "DENY"


async def test_the_session_and_csrf_cookies_are_httponly_and_samesite(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    first = await client.get("/login")
    csrf = client.cookies.get("csrftoken")
    response = await client.post("/login", data={"name": "olga", "password": password, "_csrf_token": csrf},
                                 follow_redirects=False)

    cookies = {c.split("=", 1)[0]: c.lower() for c in
               response.headers.get_list("set-cookie") + first.headers.get_list("set-cookie")}
    assert "session" in cookies and "csrftoken" in cookies
    for name, cookie in cookies.items():
        assert "httponly" in cookie, name
        assert re.search(r"samesite=(strict|lax)", cookie), name


async def test_attacker_controlled_text_is_escaped_on_every_page(client, pool, store):
    await login(client, pool)
    fields = {"payload": XSS_PAYLOAD, "kind": "<b>kind</b>", "assignee": "<i>agent</i>",
              "idempotency_key": "<u>key</u>"}
    pending = await new(store, "mail", XSS_TITLE, **fields)
    held = await claimed(store, "mail", XSS_TITLE)
    died = await dead(store, "mail", XSS_TITLE, error="<script>alert('error')</script>")

    pages = [await client.get(u) for u in (
        "/queues/mail", f"/todos/{pending.id}", f"/todos/{held.id}", f"/todos/{died.id}", "/leases", "/dead",
        "/partials/leases", "/partials/dead", f"/partials/todos/{pending.id}", "/partials/queues/mail",
    )]

    for response in pages:
        assert response.status_code == 200
        body = response.text
        assert "<script>alert" not in body, response.url
        assert "<img src=x" not in body and "<b>" not in body and "<i>agent" not in body, response.url
        assert "&lt;script&gt;alert(" in body, response.url  # shown, as text
    detail = text(pages[1])
    assert XSS_TITLE in detail and "<script>alert('payload')</script>" in detail and "<u>key</u>" in detail
    assert "<script>alert('error')</script>" in text(pages[3])


async def test_a_login_name_with_markup_is_escaped_in_the_login_form(client, pool):
    await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    csrf = client.cookies.get("csrftoken")
    response = await client.post(
        "/login", data={"name": '"><script>alert(1)</script>', "password": "x", "_csrf_token": csrf})
    assert response.status_code == 401
    assert "<script>alert(1)</script>" not in response.text
    assert "&lt;script&gt;" in response.text


async def test_the_created_flash_escapes_the_title(client, pool):
    token = await login(client, pool)
    await post(client, "/create", token, {"queue": "mail", "title": XSS_TITLE, "payload": "{}",
                                           "max_attempts": "5"})
    page = await client.get("/queues/mail")
    assert XSS_TITLE in flash_of(page.text)
    assert "<script>alert" not in page.text
