"""The operator dashboard's actions, through the real app on a fresh database: creating a
todo, retrying dead-letters (one, selected, all), force-releasing a lease, creating and
revoking API tokens; each answered as a page, an htmx fragment or a JSON problem, and
checked in the database afterwards.
"""

from __future__ import annotations

import html
import re

import pytest

from dashboard.accounts import Accounts
from dashboard.errors import Conflict
from dashboard.models import Todo
from tests.factories import (
    claimed,
    dead_letter,
    enqueue,
    history,
    login,
    todo_row,
)
from tests.web_helpers import (
    assert_fragment,
    assert_no_stack_trace,
    field_label,
    flash_of,
    ids_in,
    post,
    shown_message,
    text,
)

# -- create -------------------------------------------------------------------------------------


async def test_creating_a_todo_redirects_to_its_queue_and_stores_it_with_its_assignee(client, pool):
    token = await login(client, pool, "olga")
    response = await post(
        client,
        "/create",
        token,
        {
            "queue": "mail",
            "title": "Call the customer",
            "kind": "phone",
            "assignee": "sam",
            "idempotency_key": "",
            "max_attempts": "7",
            "payload": '{"phone": "+44 20 7946 0000"}',
        },
    )

    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/queues/mail"
    rows = await pool.fetch("SELECT * FROM todos")
    assert len(rows) == 1
    todo = Todo.from_record(rows[0])
    assert (todo.queue, todo.title, todo.kind) == ("mail", "Call the customer", "phone")
    assert (todo.assignee, todo.max_attempts, todo.state) == ("sam", 7, "pending")
    assert todo.payload == {"phone": "+44 20 7946 0000"}
    assert todo.idempotency_key is None
    assert (await history(pool, todo.id))[0][2:4] == ("operator", "olga")
    queue_page = await client.get("/queues/mail")
    assert f"created {todo.id}: \u2068Call the customer\u2069" in flash_of(queue_page.text)
    assert todo.id in ids_in(queue_page.text)


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("payload", '{"to": "a@example.com",', "not valid JSON"),
        ("payload", "[1, 2]", "must be a JSON object"),
        ("queue", "Mail Queue!", "is not a queue name"),
        ("max_attempts", "0", "from 1 to 100"),
        ("max_attempts", "101", "from 1 to 100"),
        ("max_attempts", "three", "whole number from 1 to 100"),
    ],
)
async def test_an_invalid_create_form_is_a_422_with_the_error_by_the_field_and_the_input_kept(
    client,
    pool,
    field,
    bad,
    message,
):
    token = await login(client, pool)
    form = {
        "queue": "mail",
        "title": "Keep my title",
        "kind": "k",
        "assignee": "sam",
        "idempotency_key": "key-1",
        "max_attempts": "4",
        "payload": '{"a": 1}',
    }
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
    existing = await enqueue(store, "mail", "first delivery", idempotency_key="evt-9")

    response = await post(
        client,
        "/create",
        token,
        {
            "queue": "mail",
            "title": "second delivery",
            "idempotency_key": "evt-9",
            "payload": "{}",
            "max_attempts": "5",
        },
    )

    assert response.status_code == 303
    assert response.headers["location"] == f"/todos/{existing.id}"
    assert await pool.fetchval("SELECT count(*) FROM todos") == 1
    assert (await todo_row(pool, existing.id)).dedupe_hits == 1
    shown = await client.get(f"/todos/{existing.id}")
    assert "already holds key 'evt-9'" in flash_of(shown.text)
    assert "nothing new was created" in flash_of(shown.text)


# -- retry ---------------------------------------------------------------------------------------


async def test_retrying_a_dead_letter_with_a_fresh_budget_resets_its_attempts(client, pool, store):
    token = await login(client, pool, "olga")
    died = await dead_letter(store, pool, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "fresh"})

    assert response.status_code == 303
    assert response.headers["location"] == f"/todos/{died.id}"
    after = await todo_row(pool, died.id)
    assert (after.state, after.attempt, after.max_attempts, after.next_retry_at) == ("pending", 0, 1, None)
    last = (await history(pool, died.id))[-1]
    assert last[:4] == ("failed", "pending", "operator", "olga")
    assert "fresh budget" in last.note
    assert f"{died.id} retried" in flash_of((await client.get(f"/todos/{died.id}")).text)


async def test_retrying_a_dead_letter_with_one_more_attempt_raises_its_cap_by_one(client, pool, store):
    token = await login(client, pool)
    died = await dead_letter(store, pool, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "one_more"})

    assert response.status_code == 303
    after = await todo_row(pool, died.id)
    assert (after.state, after.attempt, after.max_attempts) == ("pending", 1, 2)
    assert "one more attempt" in (await history(pool, died.id))[-1].note
    assert (await store.claim_next(["mail"], "agent-1", 30)).id == died.id  # claimable again


async def test_retrying_from_htmx_answers_the_todo_fragment_with_the_outcome(client, pool, store):
    token = await login(client, pool)
    died = await dead_letter(store, pool, "mail")

    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "fresh"}, htmx=True)

    assert_fragment(response, "todo")
    assert f"{died.id} retried: pending again" in response.text
    assert (await todo_row(pool, died.id)).state == "pending"


async def test_retrying_a_todo_that_is_not_dead_explains_the_conflict_and_changes_nothing(
    client,
    pool,
    store,
):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-5")

    response = await post(client, f"/todos/{held.id}/retry", token, {"budget": "fresh"})

    message = await shown_message(client, response)
    assert f"cannot retry todo {held.id}: it is claimed by agent-5" in message
    assert (await todo_row(pool, held.id)).state == "claimed"
    assert len(await history(pool, held.id)) == 2  # created, claimed: the refusal recorded nothing


async def test_a_conflict_answered_to_htmx_is_a_409_with_the_reason(client, pool, store):
    token = await login(client, pool)
    pending = await enqueue(store, "mail", "not dead")

    retried = await post(client, f"/todos/{pending.id}/retry", token, {"budget": "fresh"}, htmx=True)
    released = await post(client, f"/todos/{pending.id}/release", token, htmx=True)

    assert retried.status_code == 409
    assert f"cannot retry todo {pending.id}: it is pending" in retried.text
    assert released.status_code == 409
    assert f"cannot force-release todo {pending.id}: it is pending" in released.text
    assert "<html" not in retried.text + released.text


async def test_a_conflict_answered_to_a_json_caller_is_a_409_problem(client, pool, store):
    token = await login(client, pool)
    pending = await enqueue(store, "mail", "not dead")

    response = await post(
        client,
        f"/todos/{pending.id}/retry",
        token,
        {"budget": "fresh"},
        headers={"Accept": "application/json"},
    )

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
    died = await dead_letter(store, pool, "mail")
    response = await post(client, f"/todos/{died.id}/retry", token, {"budget": "infinite"})
    assert response.status_code == 422
    assert "budget: must be fresh or one_more" in text(response)
    assert (await todo_row(pool, died.id)).state == "failed"


async def test_retrying_the_selected_dead_letters_retries_those_and_no_others(client, pool, store):
    token = await login(client, pool)
    first, second, untouched = [await dead_letter(store, pool, "mail", f"d{i}") for i in range(3)]

    response = await post(
        client, "/dead/retry", token, {"scope": "selected", "ids": [first.id, second.id], "budget": "fresh"}
    )

    assert response.status_code == 303
    assert response.headers["location"] == "/dead"
    states = [(await todo_row(pool, t.id)).state for t in (first, second, untouched)]
    assert states == ["pending", "pending", "failed"]
    assert flash_of((await client.get("/dead")).text) == "2 retried"


async def test_retrying_with_nothing_selected_says_to_select_something(client, pool, store):
    token = await login(client, pool)
    died = await dead_letter(store, pool, "mail")
    response = await post(client, "/dead/retry", token, {"scope": "selected", "budget": "fresh"})
    assert response.status_code == 303  # back to the page, which says it (no "422 ids: …" page)
    assert "Select at least one dead-letter" in await shown_message(client, response)
    assert (await todo_row(pool, died.id)).state == "failed"


async def _dead_in_mail_one_key_taken(store, pool) -> tuple[Todo, Todo, Todo, Todo, Todo]:
    """Three dead-letters in mail (one whose key a live todo took meanwhile) and one in reports."""
    keyed = await dead_letter(store, pool, "mail", "keyed", idempotency_key="order-1")
    live = await enqueue(store, "mail", "redelivered", idempotency_key="order-1")
    plain1 = await dead_letter(store, pool, "mail", "plain 1")
    plain2 = await dead_letter(store, pool, "mail", "plain 2")
    elsewhere = await dead_letter(store, pool, "reports", "other queue")
    return keyed, live, plain1, plain2, elsewhere


async def test_retrying_all_dead_letters_of_a_queue_reports_retried_and_refused(client, pool, store):
    token = await login(client, pool)
    keyed, live, plain1, plain2, elsewhere = await _dead_in_mail_one_key_taken(store, pool)

    response = await post(client, "/dead/retry", token, {"scope": "all", "queue": "mail", "budget": "fresh"})

    assert response.status_code == 303
    assert response.headers["location"] == "/dead?queue=mail"
    states = {t.id: (await todo_row(pool, t.id)).state for t in (keyed, plain1, plain2, elsewhere)}
    assert states == {keyed.id: "failed", plain1.id: "pending", plain2.id: "pending", elsewhere.id: "failed"}
    report = flash_of((await client.get("/dead?queue=mail")).text)
    assert report.startswith("2 retried; 1 skipped (1 key held by a live todo): ")
    assert f"cannot retry todo {keyed.id}: a live todo already holds key 'order-1'" in report
    assert live.id in report


async def test_retrying_all_from_htmx_answers_the_dead_fragment_with_the_report_and_keeps_the_filter(
    client,
    pool,
    store,
):
    token = await login(client, pool)
    keyed, _, _, _, elsewhere = await _dead_in_mail_one_key_taken(store, pool)

    response = await post(
        client, "/dead/retry", token, {"scope": "all", "queue": "mail", "budget": "fresh"}, htmx=True
    )

    assert_fragment(response, "dead")
    assert "2 retried; 1 skipped (1 key held by a live todo)" in text(response)
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
    after = await todo_row(pool, held.id)
    assert (after.state, after.owner, after.lease_expires_at) == ("pending", None, None)
    last = (await history(pool, held.id))[-1]
    assert last[:4] == ("claimed", "pending", "operator", "olga")
    assert "was held by agent-gone" in last.note
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

    assert_fragment(response, "leases")
    assert f"lease on {held.id} released: pending again" in response.text
    assert f'data-todo="{held.id}"' not in response.text
    assert f'data-todo="{kept.id}"' in response.text


async def test_force_releasing_from_the_todo_page_with_htmx_answers_the_todo_fragment(client, pool, store):
    token = await login(client, pool)
    held = await claimed(store, "mail", owner="agent-gone")
    response = await post(client, f"/todos/{held.id}/release", token, htmx=True)
    assert_fragment(response, "todo")
    assert "released: pending again" in response.text


async def test_force_releasing_a_todo_nobody_holds_explains_the_conflict(client, pool, store):
    token = await login(client, pool)
    pending = await enqueue(store, "mail", "waiting")
    response = await post(client, f"/todos/{pending.id}/release", token)
    message = await shown_message(client, response)
    assert f"cannot force-release todo {pending.id}: it is pending" in message
    assert len(await history(pool, pending.id)) == 1  # nothing was recorded but the creation


# -- tokens ----------------------------------------------------------------------------------------


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
    assert response.status_code == 422
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
