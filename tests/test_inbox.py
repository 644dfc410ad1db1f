"""A person's inbox (DESIGN.md "Inbox"), through the real app on a fresh database: the list
shows only the logged-in operator's todos; claim, extend, complete (JSON or a note), fail,
release and reassign are the agents' own transitions, recorded as operator <name>; a
viewer can look but not act; a stale lease or someone else's claim is an inline error.

Agents act through the same Store (as the API would); time is moved by SQL, with the app
that has no reaper where a lease is made to lapse.
"""

from __future__ import annotations

import html
import re

import pytest

from dashboard.accounts import Accounts
from dashboard.config import Settings
from dashboard.errors import InvalidInput
from dashboard.inbox import inbox, waiting_count
from dashboard.models import Actor, NewTodo
from dashboard.queries import INBOX
from dashboard.store import Store
from dashboard.web.pages.inbox import parse_result
from tests.conftest import build_app, in_process
from tests.factories import expire_lease, history, login, make_retry_due, todo_row
from tests.test_plans import explain, index_scans, offenders
from tests.web_helpers import assert_fragment, flash_of, get_page, ids_in, post, text

AGENT = Actor("agent", "refund-bot")

DEFAULT_LEASE = Settings().inbox_lease  # SWITCHBOARD_INBOX_LEASE unset


async def created_for(store: Store, assignee: str | None, title: str = "approve refund #42", **fields):
    """A todo an agent creates for `assignee` (a person, or nobody)."""
    item = NewTodo(queue="approvals", title=title, assignee=assignee, payload={"refund": 42}, **fields)
    return (await store.create(item, actor=AGENT)).todo


def text_of(body: str) -> str:
    """What a person reads: tags dropped, entities decoded, white space collapsed."""
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def card(body: str, todo_id: str) -> str:
    """One todo's card on the inbox page."""
    match = re.search(rf'<article [^>]*id="inbox-{re.escape(todo_id)}".*?</article>', body, re.S)
    assert match, f"no card for {todo_id}"
    return match.group(0)


def typed_in(item: str, field: str = "result") -> str:
    """What a card's textarea or input `field` holds, as a person sees it."""
    match = re.search(rf'<textarea[^>]*name="{field}"[^>]*>(.*?)</textarea>', item, re.S) or re.search(
        rf'<input name="{field}" value="([^"]*)"', item
    )
    return html.unescape(match.group(1))


def lease_of(body: str, todo_id: str) -> str:
    """The lease token the card's forms carry."""
    return re.search(r'name="lease" value="(\d+)"', card(body, todo_id)).group(1)


async def steps(pool, todo_id: str) -> list[tuple]:
    """(event note, actor kind, actor) of each history row."""
    return [(s.note, s.actor_kind, s.actor) for s in await history(pool, todo_id)]


# -- the list ------------------------------------------------------------------------------


async def test_the_inbox_lists_only_my_todos_held_and_waiting_and_the_menu_counts_them(client, pool, store):
    token = await login(client, pool, "alice")
    mine = await created_for(store, "alice", "mine")
    urgent = await created_for(store, "alice", "urgent", priority=5)
    held = await created_for(store, "alice", "held")
    later = await created_for(store, "alice", "later", delay=3600)
    bobs = await created_for(store, "bob", "bob's")
    nobodys = await created_for(store, None, "nobody's")
    agents = await store.claim(nobodys.id, "refund-bot", 60)
    await post(client, f"/inbox/{held.id}/claim", token, htmx=True)

    body = (await get_page(client, "/inbox")).text

    assert ids_in(body) == {mine.id, urgent.id, held.id, later.id}
    assert bobs.id not in body and agents.id not in body
    waiting = body.split('id="waiting-heading"')[1]
    assert waiting.index(urgent.id) < waiting.index(mine.id) < waiting.index(later.id)  # claim order
    assert "2 ready, 1 later" in text(await get_page(client, "/inbox"))
    assert "Time left" in card(body, held.id) and "Claim" not in card(body, held.id)
    assert "disabled" in card(body, later.id)  # scheduled: not claimable yet
    assert "from" in card(body, mine.id) and "refund-bot" in card(body, mine.id)  # who asked
    badge = await get_page(client, "/partials/inbox/count")
    assert re.search(r'id="inbox-count"[^>]*>2</span>', badge.text), badge.text
    assert "2 waiting in your inbox" in text(await get_page(client, "/partials/overview"))
    assert 'href="/inbox"' in body and 'id="inbox-count"' in body  # the menu link and its badge


async def test_an_empty_inbox_says_so_and_its_badge_is_hidden(client, pool):
    await login(client, pool, "alice")
    body = text(await get_page(client, "/inbox"))
    assert "Nothing is assigned to you" in body and "You hold nothing right now" in body
    badge = (await get_page(client, "/partials/inbox/count")).text
    assert "hidden" in badge and ">0</span>" in badge


# -- claim, extend, complete ----------------------------------------------------------------


async def test_claim_extend_and_complete_with_json_are_the_agents_transitions_in_my_name(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await created_for(store, "alice")

    claimed = await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)
    fragment = assert_fragment(claimed, "inbox")
    row = await todo_row(pool, todo.id)
    assert (row.state, row.owner, row.attempt) == ("claimed", "alice", 1)
    left = (row.lease_expires_at - row.heartbeat_at).total_seconds()
    assert left == pytest.approx(DEFAULT_LEASE, abs=1)
    assert "is yours for 1h 0m" in text(claimed)
    assert 'hx-swap-oob="true"' in fragment and re.search(r'id="inbox-count"[^>]*>0<', fragment)

    await pool.execute(
        "UPDATE todos SET lease_expires_at = now() + interval '10 seconds' WHERE id = $1", todo.id
    )
    extended = await post(
        client, f"/inbox/{todo.id}/extend", token, {"lease": lease_of(fragment, todo.id)}, htmx=True
    )
    assert extended.status_code == 200, extended.text
    row = await todo_row(pool, todo.id)
    assert (row.lease_expires_at - await pool.fetchval("SELECT now()")).total_seconds() > DEFAULT_LEASE - 5

    done = await post(
        client,
        f"/inbox/{todo.id}/complete",
        token,
        {"lease": str(row.lease_token), "result": '{"approved": true}'},
        htmx=True,
    )
    assert done.status_code == 200, done.text
    row = await todo_row(pool, todo.id)
    assert (row.state, row.result) == ("done", {"approved": True})
    assert todo.id not in ids_in(done.text)  # done: it left the inbox
    assert await steps(pool, todo.id) == [
        ("created", "agent", "refund-bot"),
        ("claimed by id", "operator", "alice"),
        ("completed", "operator", "alice"),  # the Extend between: no step, the row holds it
    ]
    page = text_of((await get_page(client, f"/todos/{todo.id}")).text)
    assert page.count("operator alice") == 2  # the todo's history says who did each step


@pytest.mark.parametrize(
    ("typed", "stored"),
    [
        ("Looks fine, refunded by hand.", {"note": "Looks fine, refunded by hand."}),
        ("  42 ", {"note": "42"}),  # JSON, but not an object: a note
        ('["a"]', {"note": '["a"]'}),
        ('{"approved": false, "why": "duplicate"}', {"approved": False, "why": "duplicate"}),
        ("", None),
    ],
)
async def test_a_result_is_a_json_object_as_it_is_any_other_text_a_note(client, pool, store, typed, stored):
    token = await login(client, pool, "alice")
    todo = await store.claim((await created_for(store, "alice")).id, "alice", 600, actor_kind="operator")
    response = await post(
        client, f"/inbox/{todo.id}/complete", token, {"lease": str(todo.lease_token), "result": typed}
    )
    assert response.status_code == 303 and response.headers["location"] == "/inbox"  # without htmx
    assert "“\u2068approve refund #42\u2069” is done" in flash_of((await client.get("/inbox")).text)
    assert (await todo_row(pool, todo.id)).result == stored


async def test_a_result_that_opens_like_json_but_is_not_is_refused_with_the_text_kept(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await store.claim((await created_for(store, "alice")).id, "alice", 600, actor_kind="operator")
    typed = '{"approved": tru'
    response = await post(
        client,
        f"/inbox/{todo.id}/complete",
        token,
        {"lease": str(todo.lease_token), "result": typed},
        htmx=True,
    )
    assert response.status_code == 422
    item = card(response.text, todo.id)
    assert "not valid JSON" in text(response) and 'role="alert"' in item
    assert typed_in(item) == typed
    assert (await todo_row(pool, todo.id)).state == "claimed"
    assert "sse:refresh" not in response.text.split(">", 1)[0]  # the list holds still while shown


def test_parse_result_reads_a_person_s_text():
    assert parse_result(' {"a": 1} ') == {"a": 1}
    assert parse_result("ok") == {"note": "ok"}
    assert parse_result("   ") is None
    with pytest.raises(InvalidInput, match="not valid JSON"):
        parse_result("{oops")


# -- fail, release, reassign ------------------------------------------------------------------


async def test_fail_follows_the_normal_rule_retry_below_the_cap_dead_at_it(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await created_for(store, "alice", max_attempts=2)
    body = (await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)).text
    assert "it comes back here after a short wait, as attempt 2 of 2" in text_of(body)

    failed = await post(
        client,
        f"/inbox/{todo.id}/fail",
        token,
        {"lease": lease_of(body, todo.id), "reason": "no receipt"},
        htmx=True,
    )
    row = await todo_row(pool, todo.id)
    assert (row.state, row.last_error, row.assignee) == ("pending", "no receipt", "alice")
    assert row.next_retry_at is not None and "comes back to your inbox" in text(failed)
    assert todo.id in ids_in(failed.text)  # still mine, retrying

    await make_retry_due(pool, todo.id)
    body = (await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)).text
    assert "this is its last attempt, so it is dead-lettered" in text_of(body)
    assert "hx-confirm" in card(body, todo.id)
    dead = await post(
        client,
        f"/inbox/{todo.id}/fail",
        token,
        {"lease": lease_of(body, todo.id), "reason": "fraud"},
        htmx=True,
    )
    assert (await todo_row(pool, todo.id)).state == "failed"
    assert "is dead-lettered" in text(dead)
    assert [s for s in await steps(pool, todo.id) if s[0] in ("no receipt", "fraud")] == [
        ("no receipt", "operator", "alice"),
        ("fraud", "operator", "alice"),
    ]


async def test_fail_without_a_reason_is_refused_beside_the_todo(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await store.claim((await created_for(store, "alice")).id, "alice", 600, actor_kind="operator")
    response = await post(
        client, f"/inbox/{todo.id}/fail", token, {"lease": str(todo.lease_token), "reason": " "}, htmx=True
    )
    assert response.status_code == 422
    assert "Reason is required." in text_of(card(response.text, todo.id))
    assert (await todo_row(pool, todo.id)).state == "claimed"


async def test_release_puts_it_back_in_my_inbox_unclaimed(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await store.claim((await created_for(store, "alice")).id, "alice", 600, actor_kind="operator")
    response = await post(
        client, f"/inbox/{todo.id}/release", token, {"lease": str(todo.lease_token)}, htmx=True
    )
    row = await todo_row(pool, todo.id)
    assert (row.state, row.owner, row.assignee) == ("pending", None, "alice")
    assert "waits in your inbox again" in text(response)
    assert "Claim" in card(response.text, todo.id)
    assert (await steps(pool, todo.id))[-1] == ("released", "operator", "alice")


async def test_reassign_hands_a_waiting_or_a_held_todo_to_someone_else(client, pool, store):
    token = await login(client, pool, "alice")
    await Accounts(pool).add_operator("bob", "operator")
    waiting = await created_for(store, "alice", "waiting")
    held = await store.claim(
        (await created_for(store, "alice", "held")).id, "alice", 600, actor_kind="operator"
    )

    first = await post(client, f"/inbox/{waiting.id}/reassign", token, {"assignee": "bob"}, htmx=True)
    assert "handed to bob: it is in their inbox now" in text(first)
    second = await post(
        client,
        f"/inbox/{held.id}/reassign",
        token,
        {"assignee": "refund-bot", "lease": str(held.lease_token)},
        htmx=True,
    )
    assert "not an operator" in text(second)

    assert ids_in(second.text) == set()  # both left my inbox
    assert (await todo_row(pool, waiting.id)).assignee == "bob"
    row = await todo_row(pool, held.id)
    assert (row.state, row.owner, row.assignee) == ("pending", None, "refund-bot")
    assert (await steps(pool, held.id))[-2:] == [
        ("released", "operator", "alice"),
        ("edited: assignee alice → refund-bot", "operator", "alice"),
    ]
    assert [i.todo.id for i in (await inbox(pool, "bob")).waiting] == [waiting.id]


@pytest.mark.parametrize(
    ("name", "error"),
    [("", "must be an operator"), ("bad name!", "must be an operator"), ("alice", "yours already")],
)
async def test_reassign_to_no_name_or_to_myself_is_refused(client, pool, store, name, error):
    token = await login(client, pool, "alice")
    todo = await created_for(store, "alice")
    response = await post(client, f"/inbox/{todo.id}/reassign", token, {"assignee": name}, htmx=True)
    assert response.status_code == 422
    assert error in text_of(card(response.text, todo.id))
    assert (await todo_row(pool, todo.id)).assignee == "alice"


# -- viewers ---------------------------------------------------------------------------------


async def test_a_viewer_sees_their_inbox_without_buttons_and_cannot_claim(client, pool, store):
    token = await login(client, pool, "vera", role="viewer")
    todo = await created_for(store, "vera")
    body = (await get_page(client, "/inbox")).text
    assert todo.id in ids_in(body)
    item = card(body, todo.id)
    assert "<form" not in item and "<button" not in item
    assert "You are a viewer" in text(await get_page(client, "/inbox"))

    response = await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)
    assert response.status_code == 403
    assert (await todo_row(pool, todo.id)).state == "pending"
    assert len(await history(pool, todo.id)) == 1


# -- conflicts ------------------------------------------------------------------------------


async def test_completing_with_a_stale_lease_is_an_inline_error_and_stores_nothing(
    client_without_reaper, pool, store
):
    client = client_without_reaper
    token = await login(client, pool, "alice")
    todo = await created_for(store, "alice")
    body = (await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)).text
    stale = lease_of(body, todo.id)
    await expire_lease(pool, todo.id)
    await store.reap()  # the lease lapsed: a failed attempt, back to pending
    await make_retry_due(pool, todo.id)
    await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)  # claimed again (in another tab)

    response = await post(
        client, f"/inbox/{todo.id}/complete", token, {"lease": stale, "result": "all good"}, htmx=True
    )

    assert response.status_code == 409
    item = card(response.text, todo.id)
    assert f"lease {stale} is stale" in text_of(item) and 'role="alert"' in item
    assert typed_in(item) == "all good"  # what was typed is kept
    assert lease_of(response.text, todo.id) != stale  # the form now carries the current lease
    row = await todo_row(pool, todo.id)
    assert (row.state, row.result) == ("claimed", None)


async def test_a_todo_someone_else_claimed_first_is_an_inline_error(client, pool, store):
    token = await login(client, pool, "alice")
    todo = await created_for(store, "alice")
    mine = await store.claim(todo.id, "alice", 600, actor_kind="operator")  # alice's other tab, say
    await store.release(todo.id, "alice", mine.lease_token, actor_kind="operator")
    await pool.execute("UPDATE todos SET assignee_until = now() WHERE id = $1", todo.id)
    await store.claim(todo.id, "refund-bot", 60)  # its time with alice was up: an agent took it

    response = await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)

    assert response.status_code == 409
    assert todo.id not in ids_in(response.text)  # it left the inbox: the error is above the list
    alert = re.search(r'<div class="flash error inbox-error" role="alert">.*?</div>', response.text, re.S)
    assert f"cannot claim todo {todo.id}: it is claimed by refund-bot" in text_of(alert.group(0))
    page = await post(client, f"/inbox/{todo.id}/claim", token)  # the same form without script
    assert page.status_code == 409 and "<html" in page.text
    assert "it is claimed by refund-bot" in text_of(page.text)


# -- the store and the settings -----------------------------------------------------------------


async def test_store_transitions_record_an_agent_unless_told_an_operator(store, pool):
    todo = await created_for(store, None)
    held = await store.claim(todo.id, "w1", 60)
    await store.heartbeat(held.id, "w1", held.lease_token, 60)
    await store.complete(held.id, "w1", held.lease_token)
    assert {(kind, name) for _, kind, name in (await steps(pool, todo.id))[1:]} == {("agent", "w1")}
    with pytest.raises(InvalidInput, match="agent or an operator"):
        await store.claim(todo.id, "w1", 60, actor_kind="system")


async def test_a_claim_from_the_inbox_lasts_switchboard_inbox_lease(monkeypatch, dsn, pool, store):
    monkeypatch.setenv("SWITCHBOARD_INBOX_LEASE", "120")
    async with in_process(await build_app(dsn, pool, reaper=False)) as client:
        token = await login(client, pool, "alice")
        todo = await created_for(store, "alice")
        claimed = await post(client, f"/inbox/{todo.id}/claim", token, htmx=True)
    row = await todo_row(pool, todo.id)
    assert (row.lease_expires_at - row.heartbeat_at).total_seconds() == pytest.approx(120, abs=1)
    assert "is yours for 2m 0s" in text(claimed)


async def test_the_inbox_and_its_count_read_the_inbox_index_not_every_pending_todo(pool, store):
    """Beside 20,000 unassigned pending todos the count is bounded and on todos_inbox."""
    await pool.execute(
        "INSERT INTO todos (id, queue, title)"
        " SELECT 'td_x' || i, 'bulk', 't' FROM generate_series(1, 20000) AS i"
    )
    for i in range(3):
        await created_for(store, "alice", f"a{i}")
    await pool.execute("ANALYZE todos")
    assert await waiting_count(pool, "alice") == 3
    async with pool.acquire() as conn:
        for mode in ("force_generic_plan", "force_custom_plan"):
            for statement in (INBOX.waiting_count, INBOX.inbox):
                plan = await explain(conn, statement, {"name": "'alice'", "limit": "100"}, mode)
                assert "todos_inbox" in index_scans(plan), (statement.name, mode)
                assert not [o for o in offenders(plan) if o.startswith("Seq Scan")], (statement.name, mode)
