"""The operator dashboard's pages and their htmx partials, through the real app on a fresh
database: the overview, a queue's page (filters, search, pagination), leases, dead-letters,
a todo's page, the create form and the tokens page.

State is set up with the same Store the agents use. Tests that move time by SQL use the app
without its reaper (client_without_reaper), so nothing but the test acts on the rows.
"""

from __future__ import annotations

import html
import re

import pytest

from dashboard.accounts import Accounts
from dashboard.models import NewEvent, Todo
from tests.factories import (
    claimed,
    dead_letter,
    enqueue,
    expire_lease,
    login,
    new_todo,
    retrying,
    todo_row,
)
from tests.web_helpers import (
    HX,
    assert_fragment,
    assert_no_stack_trace,
    count,
    get_page,
    ids_in,
    queue_row,
    text,
)

# -- overview -------------------------------------------------------------------------------


async def test_the_overview_counts_ready_retrying_claimed_and_dead_todos_per_queue(
    client_without_reaper, pool, store
):
    await login(client_without_reaper, pool)
    await enqueue(store, "mail", "one")
    await enqueue(store, "mail", "two")
    await retrying(store, pool, "mail")
    await claimed(store, "mail")
    await dead_letter(store, pool, "mail")
    await enqueue(store, "reports", "r")

    response = await get_page(client_without_reaper, "/")

    mail = queue_row(response.text, "mail")
    counts = [count(mail, kind) for kind in ("ready", "retrying", "claimed", "failed")]
    assert counts == [2, 1, 1, 1]
    assert 'href="/queues/mail"' in mail
    assert 'class="attention"' in mail  # a dead-letter needs the operator's attention
    reports = queue_row(response.text, "reports")
    assert (count(reports, "ready"), count(reports, "failed")) == (1, 0)
    assert "3 ready" in response.text and "1 dead" in response.text  # the totals across queues


async def test_the_overview_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    await enqueue(store, "mail")
    response = await client.get("/partials/overview", headers=HX)
    assert_fragment(response, "overview")
    assert count(queue_row(response.text, "mail"), "ready") == 1


@pytest.mark.parametrize(
    ("path", "words"),
    [("/", "No queues yet"), ("/leases", "No todo is claimed right now."), ("/dead", "No dead-letters")],
    ids=["overview-says-how-to-enqueue", "leases", "dead-letters"],
)
async def test_a_page_with_nothing_to_list_says_so(client, pool, path, words):
    await login(client, pool)
    response = await get_page(client, path)
    assert words in response.text


# -- queue page: filters, search, pagination --------------------------------------------------


async def test_the_queue_page_lists_the_queues_todos_and_no_others(client, pool, store):
    await login(client, pool)
    mine = await enqueue(store, "mail", "to alice", kind="email.send", assignee="alice")
    other = await enqueue(store, "reports", "elsewhere")

    response = await get_page(client, "/queues/mail")

    assert ids_in(response.text) == {mine.id}
    assert other.id not in response.text
    assert "email.send" in response.text and "alice" in response.text
    assert 'href="/create?queue=mail"' in response.text


@pytest.mark.parametrize("state", ["ready", "retrying", "pending", "claimed", "done", "failed"])
async def test_the_queue_page_filters_by_state(client_without_reaper, pool, store, state):
    await login(client_without_reaper, pool)
    ready = await enqueue(store, "mail", "ready one")
    later = await retrying(store, pool, "mail")
    held = await claimed(store, "mail")
    finished = await claimed(store, "mail", "finished")
    await store.complete(finished.id, finished.owner, finished.lease_token, {"ok": True})
    died = await dead_letter(store, pool, "mail")
    expected = {
        "ready": {ready.id},
        "retrying": {later.id},
        "pending": {ready.id, later.id},
        "claimed": {held.id},
        "done": {finished.id},
        "failed": {died.id},
    }[state]

    response = await get_page(client_without_reaper, f"/queues/mail?state={state}")

    assert ids_in(response.text) == expected
    assert f'<option value="{state}" selected>' in response.text


async def test_the_queue_page_filters_by_assignee_owner_and_kind(client, pool, store):
    await login(client, pool)
    for_alice = await enqueue(store, "mail", "for alice", assignee="alice")
    held_by_bot = await claimed(store, "mail", "held", owner="bot-3")
    digest = await enqueue(store, "mail", "digest", kind="email.digest")
    await enqueue(store, "mail", "plain")

    assert ids_in((await client.get("/queues/mail?assignee=alice")).text) == {for_alice.id}
    assert ids_in((await client.get("/queues/mail?owner=bot-3")).text) == {held_by_bot.id}
    assert ids_in((await client.get("/queues/mail?kind=email.digest")).text) == {digest.id}
    assert ids_in((await client.get("/queues/mail?kind=email.digest&assignee=alice")).text) == set()


async def test_the_queue_page_searches_by_id_title_and_idempotency_key(client, pool, store):
    await login(client, pool)
    invoice = await enqueue(store, "mail", "Send the March invoice")
    keyed = await enqueue(store, "mail", "webhook delivery", idempotency_key="gh-delivery-42")
    percent = await enqueue(store, "mail", "100% done")
    await enqueue(store, "mail", "unrelated")

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
        created = await store.create_many([new_todo("mail", "t", kind="k1") for _ in range(30)])
        wanted |= {c.todo.id for c in created}
    await store.create_many([new_todo("mail", "other kind", kind="k2") for _ in range(5)])

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
    await store.create_many([new_todo("mail", f"t{i}") for i in range(55)])
    first = await client.get("/queues/mail")
    cursor = re.search(r"after=([A-Za-z0-9_-]+)", first.text).group(1)

    response = await client.get(f"/partials/queues/mail?after={cursor}", headers=HX)

    assert_fragment(response, "todos")
    assert len(ids_in(response.text)) == 5
    assert ids_in(response.text).isdisjoint(ids_in(first.text))
    assert f"after={cursor}" in response.text  # its own polling keeps the page it shows


async def test_a_bad_queue_name_state_or_cursor_is_a_422_page_not_a_stack_trace(client, pool):
    await login(client, pool)
    for url, words in [
        ("/queues/Not%20A%20Queue!", "is not a queue name"),
        ("/queues/mail?state=sleeping", "State must be one of"),  # beside the filter (test_rough_edges)
        ("/queues/mail?after=garbage", "is not a cursor this server gave out"),
        ("/dead?queue=BAD!", "is not a queue name"),
    ]:
        response = await client.get(url)
        assert response.status_code == 422, url
        assert words in text(response), url
        assert_no_stack_trace(response)


# -- leases -----------------------------------------------------------------------------------


async def test_the_leases_page_shows_owner_attempt_time_left_and_a_release_button(client, pool, store):
    await login(client, pool)
    held = await claimed(store, "mail", "sending", owner="mailer-2", ttl=300)

    response = await get_page(client, "/leases")

    body = response.text
    assert held.id in body and "mailer-2" in body and "1/5" in body
    seconds_left = float(re.search(r'data-seconds-left="([\d.]+)"', body).group(1))
    assert 290 <= seconds_left <= 300  # counted down in the browser by app.js from here
    assert "data-seconds-ago=" in body  # the heartbeat age
    assert f'hx-post="/todos/{held.id}/release"' in body and "Force-release" in body


async def _a_healthy_and_a_lapsed_lease(store, pool) -> tuple[Todo, Todo]:
    """Two leases in mail; the second one lapsed a second ago (by SQL: no waiting, and with no
    reaper in the app nothing takes it before the test looks)."""
    healthy = await claimed(store, "mail", "fine", owner="agent-ok", ttl=300)
    stuck = await claimed(store, "mail", "stuck", owner="agent-gone", ttl=300)
    await expire_lease(pool, stuck.id)
    return healthy, stuck


async def test_a_lapsed_lease_the_reaper_has_not_taken_yet_is_marked_lapsed(
    client_without_reaper, pool, store
):
    await login(client_without_reaper, pool)
    healthy, stuck = await _a_healthy_and_a_lapsed_lease(store, pool)

    leases = await get_page(client_without_reaper, "/leases")

    stuck_row = re.search(rf'<tr class="lapsed" data-todo="{stuck.id}">.*?</tr>', leases.text, re.S)
    assert stuck_row, "the lapsed lease's row is marked"
    assert "lapsed" in stuck_row.group(0) and "data-seconds-left" not in stuck_row.group(0)
    healthy_row = re.search(rf'<tr class="" data-todo="{healthy.id}">.*?</tr>', leases.text, re.S)
    assert healthy_row and "data-seconds-left" in healthy_row.group(0)


async def test_the_overview_counts_a_lapsed_lease_the_reaper_has_not_taken_yet(
    client_without_reaper, pool, store
):
    await login(client_without_reaper, pool)
    await _a_healthy_and_a_lapsed_lease(store, pool)

    overview = await get_page(client_without_reaper, "/")

    assert "1 lapsed" in queue_row(overview.text, "mail")


async def test_the_leases_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    held = await claimed(store, "mail")
    response = await client.get("/partials/leases", headers=HX)
    assert_fragment(response, "leases")
    assert held.id in response.text


# -- dead-letters -------------------------------------------------------------------------------


async def _dead_in_mail_and_reports(store, pool) -> tuple[Todo, Todo]:
    died = await dead_letter(store, pool, "mail", "bounced", error="SMTP 550: mailbox unavailable")
    other = await dead_letter(store, pool, "reports", "broken report")
    await enqueue(store, "mail", "alive")
    return died, other


async def test_the_dead_letters_page_shows_the_last_error_and_attempts(client, pool, store):
    await login(client, pool)
    died, other = await _dead_in_mail_and_reports(store, pool)

    response = await get_page(client, "/dead")

    assert ids_in(response.text) == {died.id, other.id}
    assert "SMTP 550: mailbox unavailable" in text(response)
    assert "1/1" in response.text
    assert "Retry selected" in response.text and "Retry all" in response.text


async def test_the_dead_letters_page_of_one_queue_lists_and_retries_only_that_queue(client, pool, store):
    await login(client, pool)
    died, _ = await _dead_in_mail_and_reports(store, pool)

    only_mail = await get_page(client, "/dead?queue=mail")

    assert ids_in(only_mail.text) == {died.id}
    assert 'name="queue" value="mail"' in only_mail.text  # "retry all" stays inside the filter
    assert "Retry all in mail" in only_mail.text


async def test_the_dead_letters_partial_is_the_table_fragment_alone(client, pool, store):
    await login(client, pool)
    died = await dead_letter(store, pool, "mail")
    await dead_letter(store, pool, "reports")
    response = await client.get("/partials/dead?queue=mail", headers=HX)
    assert_fragment(response, "dead")
    assert ids_in(response.text) == {died.id}


# -- todo detail -----------------------------------------------------------------------------------


async def test_the_todo_page_shows_fields_pretty_json_history_and_the_linked_event(client, pool, store):
    await login(client, pool)
    todo = await enqueue(
        store,
        "mail",
        "Welcome mail",
        kind="email.send",
        assignee="mailer-1",
        idempotency_key="signup-77",
        payload={"to": "a@example.com", "vars": {"name": "Ada", "ids": [1, 2]}},
        max_attempts=3,
        event=NewEvent(source="shop", kind="user.signup", payload={"user": 77}),
    )
    held = await store.claim(todo.id, "mailer-1", 60)
    await store.fail(todo.id, "mailer-1", held.lease_token, "SMTP timeout")

    response = await get_page(client, f"/todos/{todo.id}")

    body = text(response)
    for value in ("Welcome mail", todo.id, "email.send", "mailer-1", "signup-77", "1 of 3", "SMTP timeout"):
        assert value in body, value
    assert '"vars": {\n    "ids": [\n      1,\n      2\n    ],\n    "name": "Ada"\n  }' in body  # pretty JSON
    assert "retrying" in body  # a pending todo with a future retry is shown as retrying
    timeline = re.search(r'<ol class="timeline">(.*?)</ol>', body, re.S).group(1)
    entries = re.findall(r"<li class=\"to-(\w+)\">(.*?)</li>", timeline, re.S)
    assert [state for state, _ in entries] == ["pending", "claimed", "pending"]
    said = [" ".join(re.sub(r"<[^>]+>", " ", entry).split()) for _, entry in entries]
    assert "producer producer" in said[0] and "created" in said[0]  # each actor: its kind, then its name
    assert "agent mailer-1" in said[1]
    assert "agent mailer-1" in said[2] and "SMTP timeout" in said[2]
    event_id = (await todo_row(pool, todo.id)).event_id
    assert event_id and event_id in body
    assert "<bdi>shop</bdi> · <bdi>user.signup</bdi>" in body and '"user": 77' in body


async def test_the_todo_partial_is_the_detail_fragment_alone(client, pool, store):
    await login(client, pool)
    todo = await enqueue(store, "mail", "fragment")
    response = await get_page(client, f"/partials/todos/{todo.id}", headers=HX)
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
    pending = await enqueue(store, "mail", "waiting")
    held = await claimed(store, "mail")
    died = await dead_letter(store, pool, "mail")

    pending_page = (await client.get(f"/todos/{pending.id}")).text
    held_page = (await client.get(f"/todos/{held.id}")).text
    dead_page = (await client.get(f"/todos/{died.id}")).text

    assert "/retry" not in pending_page and "/release" not in pending_page
    assert f'action="/todos/{held.id}/release"' in held_page and "/retry" not in held_page
    assert f'action="/todos/{died.id}/retry"' in dead_page and "/release" not in dead_page
    assert 'value="one_more"' in dead_page  # the budget choice


# -- the create form --------------------------------------------------------------------------------


async def test_the_create_form_is_prefilled_with_the_queue_it_came_from(client, pool):
    await login(client, pool)
    response = await get_page(client, "/create?queue=mail")
    assert 'name="queue" type="text" value="mail"' in response.text
    assert 'name="max_attempts" type="number" value="5"' in response.text
    assert 'name="_csrf_token"' in response.text


# -- tokens --------------------------------------------------------------------------------


async def test_the_tokens_page_lists_tokens_without_their_secrets(client, pool):
    await login(client, pool)
    token_id, secret = await Accounts(pool).add_token("mailer-1", ["mail"])
    response = await get_page(client, "/tokens")
    assert token_id in response.text and "mailer-1" in response.text
    assert secret not in response.text
    assert f'action="/tokens/{token_id}/revoke"' in response.text
