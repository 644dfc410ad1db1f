"""Queue control on the dashboard (issue 12) in a real Chromium against `switchboard serve`:
an operator pauses and resumes a queue, schedules a todo and runs it now, bumps
priorities, cancels from the queue page, edits and retries a dead-letter in one step, and
sees changes made elsewhere live; a viewer sees none of the controls and is refused.

The live server is shared by every test, so each test works in a queue of its own.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.sync_api import expect

from dashboard.accounts import Accounts
from dashboard.control import Control
from dashboard.models import Actor
from dashboard.store import Store
from tests.browser.conftest import on_database
from tests.browser.test_dashboard_browser import confirmations, csp_violations, posted
from tests.factories import unique

pytestmark = pytest.mark.browser

VIEWER = "pw-vera"
OTHER_OPERATOR = Actor("operator", "pw-otto")


@pytest.fixture
def queue() -> str:
    """A queue no other test touches."""
    return unique("qc")


def claim_one(live_db, queue: str, owner: str = "agent-9"):
    """What an agent's claim on `queue` gets now (None: nothing)."""
    return live_db.run(lambda conn: Store(conn).claim_next([queue], owner, 30))


def row(page, todo_id: str):
    return page.locator(f'#todos tr[data-todo="{todo_id}"]')


def tick(page, *todo_ids: str) -> None:
    for todo_id in todo_ids:
        row(page, todo_id).locator("input[name=ids]").check()


def apply_bulk(page, queue: str):
    """Click the queue page's Apply; the bulk action's response."""
    with page.expect_response(posted(f"/queues/{queue}/bulk")) as answer:
        page.locator("#todos .bulk").get_by_role("button", name="Apply").click()
    return answer.value


def mark_document(page) -> None:
    """Mark the page's document: same_document(page) says whether it is still the one shown."""
    page.evaluate("window.__sameDocument = true")


def same_document(page) -> bool:
    return page.evaluate("window.__sameDocument === true")


# -- 1. pause and resume ----------------------------------------------------------------------


def test_an_operator_pauses_a_queue_with_a_reason_claims_skip_it_and_resume_brings_pause_back(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    name = operator_account[0]
    waiting = live_db.enqueue(queue, "waiting work")
    asked = confirmations(page)
    page.goto(f"/queues/{queue}")
    control = page.locator("#queue-control")
    expect(control.locator(".paused-banner")).to_have_count(0)

    control.get_by_label("reason for pausing").fill("deploying billing v2")
    with page.expect_response(posted(f"/queues/{queue}/pause")) as answer:
        control.get_by_role("button", name="Pause queue").click()

    assert answer.value.status == 200, answer.value.text()
    assert len(asked) == 1 and f"Pause {queue}?" in asked[0], asked
    banner = control.locator(".paused-banner")
    expect(banner).to_contain_text(re.compile(rf"Paused by {name} .*: deploying billing v2\."))
    expect(page.locator("#flash")).to_contain_text(f"queue {queue} paused: claims skip it until resumed")
    expect(control.get_by_role("button", name="Resume")).to_be_visible()
    expect(control.get_by_role("button", name="Pause queue")).to_have_count(0)
    shot("paused")

    # The overview, in another tab, tags the queue as paused (and counts it).
    overview = page.context.new_page()
    overview.goto("/")
    listed = overview.locator(f'#overview tr[data-queue="{queue}"]')
    expect(listed.locator(".tag.paused")).to_have_text("paused")
    expect(listed.locator(".tag.paused")).to_have_attribute(
        # the operator's name and reason isolated (U+2068 … U+2069): a tooltip can hold no <bdi>
        "title",
        re.compile(rf"paused by \u2068{name}\u2069 .*: \u2068deploying billing v2\u2069$"),
    )
    expect(listed).to_have_class(re.compile(r"\bpaused\b"))
    expect(overview.locator("#overview .pill.paused")).to_contain_text("paused")
    shot("overview", page=overview)

    assert claim_one(live_db, queue) is None, "an agent claimed from a paused queue"

    with page.expect_response(posted(f"/queues/{queue}/resume")) as answer:
        control.get_by_role("button", name="Resume").click()
    assert answer.value.status == 200, answer.value.text()
    expect(control.get_by_role("button", name="Pause queue")).to_be_visible()
    expect(control.locator(".paused-banner")).to_have_count(0)
    expect(page.locator("#flash")).to_contain_text(f"queue {queue} resumed")
    control.locator("details summary").click()
    expect(control.locator("details li")).to_have_count(2)
    expect(control.locator("details li").nth(0)).to_contain_text(f"resumed by {name}")
    expect(control.locator("details li").nth(1)).to_contain_text(f"paused by {name}")
    expect(control.locator("details li").nth(1)).to_contain_text("deploying billing v2")

    claimed = claim_one(live_db, queue)
    assert claimed is not None and claimed.id == waiting.id
    # the overview drops the tag at its next refresh (it polls every 3 s)
    expect(listed.locator(".tag.paused")).to_have_count(0, timeout=5000)
    assert csp_violations(console) == [], "\n".join(console)


# -- 2. scheduling and run now ------------------------------------------------------------------


@pytest.mark.parametrize("when", ["run_at", "delay"])
def test_a_todo_scheduled_from_the_create_form_shows_as_scheduled_and_run_now_makes_it_ready(
    logged_in, console, live_db, queue, shot, when
):
    page = logged_in
    page.goto(f"/create?queue={queue}")
    expect(page.locator("input[name=queue]")).to_have_value(queue)
    page.fill("input[name=title]", "send the monthly report")
    run_at = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M")
    if when == "run_at":
        page.fill("input[name=run_at]", run_at)
    else:
        page.fill("input[name=delay]", "3600")
    shot("form")
    with page.expect_response(posted("/create")) as answer:
        page.get_by_role("button", name="Create").click()
    assert answer.value.status == 303, answer.value.text()

    expect(page).to_have_url(re.compile(rf"/queues/{queue}$"))
    listed = page.locator("#todos tbody tr", has_text="send the monthly report")
    # run_at is days ahead; a delay of 3600 s reads as 59m or 1h 0m a moment later
    badge = re.compile(r"^scheduled in \d+d$" if when == "run_at" else r"^scheduled in (59m|1h 0m)$")
    expect(listed.locator(".badge")).to_have_text(badge)
    todo_id = listed.get_attribute("data-todo")
    assert todo_id
    assert claim_one(live_db, queue) is None, "a scheduled todo was claimed before its time"

    listed.get_by_role("link", name="send the monthly report").click()
    expect(page).to_have_url(re.compile(rf"/todos/{todo_id}$"))
    title_badge = page.locator("h1.todo-title .badge")
    expect(title_badge).to_have_text(badge)
    if when == "run_at":
        expect(page.locator("dl.fields")).to_contain_text(f"Scheduled for{run_at}:00+00:00")
    else:
        expect(page.locator("dl.fields")).to_contain_text("Scheduled for")
    shot("scheduled")
    mark_document(page)

    with page.expect_response(posted(f"/todos/{todo_id}/run-now")) as answer:
        page.get_by_role("button", name="Run now").click()

    assert answer.value.status == 200, answer.value.text()
    expect(title_badge).to_have_text("ready")
    expect(page.locator("#flash")).to_contain_text(f"{todo_id} is ready now")
    expect(page.get_by_role("button", name="Run now")).to_have_count(0)
    expect(page.locator("dl.fields")).not_to_contain_text("Scheduled for")
    assert same_document(page), "the page was reloaded"
    claimed = claim_one(live_db, queue)
    assert claimed is not None and claimed.id == todo_id
    assert csp_violations(console) == [], "\n".join(console)


# -- 3. priority ----------------------------------------------------------------------------------


def test_an_operator_bumps_priority_on_the_edit_page_and_in_bulk_on_the_queue_page(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    until = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    first = live_db.enqueue(queue, "first", assignee="sam", assignee_until=until.isoformat())
    second = live_db.enqueue(queue, "second")
    third = live_db.enqueue(queue, "third")
    untouched = live_db.enqueue(queue, "untouched")

    page.goto(f"/todos/{first.id}")
    page.get_by_role("link", name="Edit", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/todos/{first.id}/edit$"))
    priority = page.get_by_label("Priority")
    expect(priority).to_have_value("0")
    priority.fill("5")
    page.get_by_role("button", name="Save").click()

    expect(page).to_have_url(re.compile(rf"/todos/{first.id}$"))
    expect(page.locator("#flash")).to_have_text(f"{first.id} edited")
    expect(page.locator("h1.todo-title .tag.priority")).to_have_text("P+5")
    after = live_db.todo(first.id)
    assert after.priority == 5
    # Only the priority changed: the assignee and its deadline are kept as they were.
    assert (after.assignee, after.assignee_until) == ("sam", until)
    assert live_db.history(first.id)[-1].note == "edited: priority 0 → 5"

    asked = confirmations(page)
    page.goto(f"/queues/{queue}")
    expect(row(page, first.id).locator(".tag.priority")).to_have_text("P+5")
    tick(page, second.id, third.id)
    page.locator("#todos select[name=action]").select_option("priority")
    page.locator("#todos .bulk").get_by_label("priority to set").fill("3")
    shot("bulk-bar")
    answer = apply_bulk(page, queue)

    assert answer.status == 200, answer.text()
    assert len(asked) == 1, f"Apply asked {len(asked)} times: {asked}"
    expect(page.locator("#action-result")).to_have_text("2 changed")
    expect(row(page, second.id).locator(".tag.priority")).to_have_text("P+3")
    expect(row(page, third.id).locator(".tag.priority")).to_have_text("P+3")
    expect(row(page, untouched.id).locator(".tag.priority")).to_have_count(0)
    expect(row(page, first.id).locator(".tag.priority")).to_have_text("P+5")
    expect(page.locator("#todos input[name=ids]:checked")).to_have_count(0)
    assert [live_db.todo(t.id).priority for t in (first, second, third, untouched)] == [5, 3, 3, 0]

    page.goto(f"/todos/{second.id}")
    expect(page.locator("h1.todo-title .tag.priority")).to_have_text("P+3")
    assert live_db.history(second.id)[-1][2:4] == ("operator", operator_account[0])
    # the highest priority is claimed first (first is assigned to sam)
    assert claim_one(live_db, queue).id in (second.id, third.id)
    assert csp_violations(console) == [], "\n".join(console)


# -- 4. cancel ------------------------------------------------------------------------------------


def test_an_operator_cancels_a_todo_from_the_queue_page_and_finds_it_among_the_dead_letters(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    name = operator_account[0]
    kept = live_db.enqueue(queue, "keep me")
    victim = live_db.enqueue(queue, "duplicate order #41")
    died = live_db.dead(queue, "really dead", error="card declined")
    asked = confirmations(page)
    page.goto(f"/queues/{queue}")
    tick(page, victim.id)
    expect(page.locator("#todos select[name=action]")).to_have_value("cancel")
    page.locator("#todos .bulk").get_by_label("reason for cancelling").fill("entered twice")

    answer = apply_bulk(page, queue)

    assert answer.status == 200, answer.text()
    assert len(asked) == 1 and "Cancel moves them to the dead-letters" in asked[0], asked
    expect(page.locator("#action-result")).to_have_text("1 cancelled")
    expect(row(page, victim.id).locator(".badge")).to_have_text("cancelled")
    expect(row(page, kept.id).locator(".badge")).to_have_text("ready")
    shot("queue")

    page.goto(f"/todos/{victim.id}")
    expect(page.locator("h1.todo-title .badge")).to_have_text("cancelled")
    expect(page.locator("h1.todo-title")).not_to_contain_text("dead")
    expect(page.locator("dl.fields")).to_contain_text(f"by operator {name}: entered twice")
    expect(page.get_by_role("button", name="Cancel todo")).to_have_count(0)
    shot("todo")

    page.goto(f"/dead?queue={queue}")
    cancelled_row = page.locator(f'#dead tr[data-todo="{victim.id}"]')
    dead_row = page.locator(f'#dead tr[data-todo="{died.id}"]')
    expect(cancelled_row.locator(".badge")).to_have_text("cancelled")
    expect(cancelled_row).to_contain_text(f"cancelled by {name}: entered twice")
    expect(dead_row).to_contain_text("card declined")
    expect(dead_row.locator(".badge")).to_have_count(0)
    shot("dead")

    page.get_by_label("Cancelled").select_option("hide")
    page.locator("form.filters").get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"[?&]cancelled=hide"))
    expect(dead_row).to_be_visible()
    expect(cancelled_row).to_have_count(0)

    page.get_by_label("Cancelled").select_option("only")
    page.locator("form.filters").get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"[?&]cancelled=only"))
    expect(cancelled_row).to_be_visible()
    expect(dead_row).to_have_count(0)

    stored = live_db.todo(victim.id)
    assert (stored.state, stored.cancelled_by, stored.cancel_reason) == ("failed", name, "entered twice")
    assert live_db.todo(kept.id).state == "pending"
    assert csp_violations(console) == [], "\n".join(console)


# -- 5. edit and retry ----------------------------------------------------------------------------


def test_a_dead_letter_is_edited_and_retried_in_one_step_from_its_page(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    died = live_db.dead(
        queue,
        "bounced mail",
        error="SMTP 550: mailbox unavailable",
        payload={"to": "old@example.com", "n": 1},
    )
    page.goto(f"/todos/{died.id}")
    expect(page.locator("h1.todo-title .badge")).to_have_text("dead")
    page.get_by_role("link", name="Edit and retry").click()

    expect(page).to_have_url(re.compile(rf"/todos/{died.id}/edit\?retry=1$"))
    retry = page.get_by_label("and retry it")
    expect(retry).to_be_checked()
    payload = page.locator("textarea[name=payload]")
    expect(payload).to_have_value(re.compile(r'"to": "old@example.com"'))
    assert json.loads(payload.input_value()) == {"to": "old@example.com", "n": 1}

    # A mistake is shown by its field, what was typed is kept, and nothing changes.
    payload.fill('{"to": "new@example.com", "n": 1')
    with page.expect_response(posted(f"/todos/{died.id}/edit")) as answer:
        page.get_by_role("button", name="Save").click()
    assert answer.value.status == 422
    expect(page.locator("label.invalid .field-error")).to_contain_text("not valid JSON")
    expect(page.locator("p.flash.error")).to_have_text("Nothing was changed: fix the fields marked below.")
    expect(payload).to_have_value('{"to": "new@example.com", "n": 1')
    expect(payload).to_have_attribute("aria-invalid", "true")
    expect(retry).to_be_checked()
    shot("error")
    assert live_db.todo(died.id).state == "failed"

    payload.fill('{"to": "new@example.com", "n": 1}')
    with page.expect_response(posted(f"/todos/{died.id}/edit")) as answer:
        page.get_by_role("button", name="Save").click()
    assert answer.value.status == 303, answer.value.text()

    expect(page).to_have_url(re.compile(rf"/todos/{died.id}$"))
    expect(page.locator("#flash")).to_have_text(f"{died.id} edited and retried: pending again")
    expect(page.locator("h1.todo-title .badge")).to_have_text("ready")
    expect(page.locator("pre.json").first).to_contain_text('"to": "new@example.com"')
    steps = page.locator("#todo .timeline li")
    expect(steps.nth(-2)).to_contain_text("failed → pending")
    expect(steps.nth(-2)).to_contain_text("retried by operator: fresh budget")
    expect(steps.nth(-1)).to_contain_text("pending → pending")
    expect(steps.nth(-1)).to_contain_text("edited: payload ~to")
    expect(steps.nth(-1).locator(".actor")).to_have_text(f"operator {operator_account[0]}")
    shot("retried")

    stored = live_db.todo(died.id)
    assert (stored.state, stored.attempt, stored.payload) == ("pending", 0, {"to": "new@example.com", "n": 1})
    assert claim_one(live_db, queue).id == died.id
    assert csp_violations(console) == [], "\n".join(console)


# -- 6. changes made elsewhere, live --------------------------------------------------------------


def test_work_scheduled_and_a_pause_made_elsewhere_appear_live_on_the_open_queue_page_and_overview(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    live_db.enqueue(queue, "already here")
    page.goto(f"/queues/{queue}")
    listening()
    mark_document(page)
    overview = page.context.new_page()
    overview.goto("/")
    listed = overview.locator(f'#overview tr[data-queue="{queue}"]')
    expect(listed.locator(".count.scheduled")).to_have_text("0")
    mark_document(overview)

    later = live_db.enqueue(queue, "scheduled by a producer", delay=600)

    expect(row(page, later.id).locator(".badge")).to_have_text(re.compile(r"^scheduled in (10m|9m)"))
    expect(listed.locator(".count.scheduled")).to_have_text("1", timeout=4000)

    live_db.run(lambda conn: Control(conn).pause(queue, OTHER_OPERATOR, "maintenance window"))

    banner = page.locator("#queue-control .paused-banner")
    expect(banner).to_contain_text(re.compile(r"Paused by pw-otto .*: maintenance window"), timeout=7000)
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    expect(listed.locator(".tag.paused")).to_be_visible(timeout=4000)
    shot("overview", page=overview)

    live_db.run(lambda conn: Control(conn).resume(queue, OTHER_OPERATOR))

    expect(banner).to_have_count(0, timeout=7000)
    expect(page.get_by_role("button", name="Pause queue")).to_be_visible()
    expect(listed.locator(".tag.paused")).to_have_count(0, timeout=4000)
    assert same_document(page) and same_document(overview), "a page was reloaded"
    assert csp_violations(console) == [], "\n".join(console)


def test_what_an_operator_has_chosen_in_the_bulk_bar_or_typed_as_a_reason_survives_live_refreshes(
    logged_in, console, listening, live_db, queue, shot
):
    """A refresh while the operator is choosing would put the bar back to its first action
    (Cancel) and empty the fields: Apply would then cancel the todos meant to be bumped."""
    page = logged_in
    target = live_db.enqueue(queue, "bump me")
    page.goto(f"/queues/{queue}")
    listening()
    page.evaluate("""() => {
        const count = (name) => (e) => {
            const id = e.detail.elt && e.detail.elt.id;
            const key = {"todos": "todos", "queue-control": "control"}[id];
            if (key && e.detail.requestConfig && e.detail.requestConfig.verb === "get") {
                window[name][key] += 1;
            }
        };
        window.__asked = {todos: 0, control: 0};  // refreshes about to be asked for
        window.__sent = {todos: 0, control: 0};  // of those, the ones sent (not held back)
        window.__swapped = {todos: 0, control: 0};  // refreshes that replaced the part
        document.addEventListener("htmx:beforeRequest", count("__asked"));
        document.addEventListener("htmx:beforeSend", count("__sent"));
        document.addEventListener("htmx:afterSwap", count("__swapped"));
    }""")
    both = "(n) => n.todos > 0 && n.control > 0"
    # nothing is chosen: the table and the control refresh on the queue's hints
    first = live_db.enqueue(queue, "first arrival")
    page.wait_for_function(f"() => ({both})(window.__swapped)", timeout=5000)
    expect(row(page, first.id)).to_be_visible()

    page.locator("#todos select[name=action]").select_option("priority")
    page.locator("#todos .bulk").get_by_label("priority to set").fill("7")
    page.locator("#queue-control").get_by_label("reason for pausing").fill("half-typed reas")
    page.evaluate("for (const n of ['__asked', '__sent', '__swapped']) window[n] = {todos: 0, control: 0}")
    arrived = live_db.enqueue(queue, "second arrival")  # a hint: both want to refresh

    page.wait_for_function(f"() => ({both})(window.__asked)", timeout=5000)
    assert page.evaluate("window.__sent") == {"todos": 0, "control": 0}  # held back
    expect(page.locator("#todos select[name=action]")).to_have_value("priority")
    expect(page.locator("#todos .bulk").get_by_label("priority to set")).to_have_value("7")
    expect(page.locator("#queue-control").get_by_label("reason for pausing")).to_have_value("half-typed reas")
    assert page.evaluate("window.__swapped") == {"todos": 0, "control": 0}
    expect(row(page, arrived.id)).to_have_count(0)

    confirmations(page)
    tick(page, target.id)
    answer = apply_bulk(page, queue)
    assert answer.status == 200
    expect(page.locator("#action-result")).to_have_text("1 changed")
    expect(row(page, target.id).locator(".tag.priority")).to_have_text("P+7")
    expect(row(page, arrived.id)).to_be_visible()  # the answer shows the table as it is now
    assert live_db.todo(target.id).state == "pending"
    assert csp_violations(console) == [], "\n".join(console)


# -- 7. viewers ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def viewer_cookies(live_dsn, base_url) -> list[dict]:
    """The session cookies of a viewer logged in over HTTP."""
    password = on_database(live_dsn, lambda conn: Accounts(conn).add_operator(VIEWER, "viewer"))
    with httpx.Client(base_url=base_url) as http:
        http.get("/login")
        answer = http.post(
            "/login", data={"name": VIEWER, "password": password, "_csrf_token": http.cookies["csrftoken"]}
        )
        assert answer.status_code == 303, answer.text
        return [
            {"name": c.name, "value": c.value, "domain": "127.0.0.1", "path": "/", "sameSite": "Strict"}
            for c in http.cookies.jar
        ]


@pytest.fixture
def viewer_page(browser, base_url, viewer_cookies):
    context = browser.new_context(base_url=base_url, storage_state={"cookies": viewer_cookies, "origins": []})
    page = context.new_page()
    yield page
    context.close()


POST_AS_PAGE = """async ([path, fields]) => {
    const token = JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
    const answer = await fetch(path, {
        method: "POST",
        headers: {"X-CSRFToken": token, "HX-Request": "true"},
        body: new URLSearchParams(fields),
    });
    return answer.status;
}"""


def test_a_viewer_sees_no_queue_control_and_its_posts_are_refused(viewer_page, live_db, queue, shot):
    page = viewer_page
    quiet = f"{queue}-quiet"
    scheduled = live_db.enqueue(queue, "later", delay=3600)
    died = live_db.dead(queue, "dead one")
    live_db.enqueue(quiet, "nothing to see")
    live_db.run(lambda conn: Control(conn).pause(queue, OTHER_OPERATOR, "viewers may look"))

    page.goto(f"/queues/{queue}")
    expect(page.locator(".who")).to_contain_text(VIEWER)
    expect(row(page, scheduled.id)).to_be_visible()
    expect(page.locator("#queue-control .paused-banner")).to_contain_text("viewers may look")
    expect(page.locator("#queue-control button")).to_have_count(0)
    expect(page.locator("#todos .bulk")).to_have_count(0)
    expect(page.locator("#todos input[type=checkbox]")).to_have_count(0)
    shot("queue", page=page)

    page.goto(f"/queues/{quiet}")
    expect(page.locator("#todos tbody tr")).to_have_count(1)
    expect(page.locator("#queue-control")).to_be_attached()
    expect(page.get_by_role("button", name="Pause queue")).to_have_count(0)

    page.goto(f"/todos/{scheduled.id}")
    expect(page.locator("h1.todo-title .badge")).to_contain_text("scheduled")
    expect(page.locator("#todo .actions")).to_have_count(0)
    for name in ("Run now", "Cancel todo"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    expect(page.get_by_role("link", name="Edit")).to_have_count(0)

    page.goto(f"/todos/{died.id}")
    expect(page.locator("h1.todo-title .badge")).to_have_text("dead")
    expect(page.locator("#todo button:not(.copy)")).to_have_count(0)  # copying the payload changes nothing
    expect(page.get_by_role("link", name="Edit and retry")).to_have_count(0)

    page.goto(f"/dead?queue={queue}")
    expect(page.locator(f'#dead tr[data-todo="{died.id}"]')).to_be_visible()
    expect(page.locator("#dead button, #dead select, #dead input[type=checkbox]")).to_have_count(0)

    page.goto(f"/todos/{scheduled.id}/edit")
    expect(page.get_by_text("Viewers cannot edit todos.")).to_be_visible()
    expect(page.get_by_role("button", name="Save")).to_have_count(0)

    page.goto(f"/queues/{queue}")
    refused = {
        f"/queues/{queue}/resume": {},
        f"/queues/{quiet}/pause": {"reason": "no"},
        f"/queues/{queue}/bulk": {"ids": scheduled.id, "action": "cancel"},
        f"/todos/{scheduled.id}/cancel": {"reason": "no"},
        f"/todos/{scheduled.id}/run-now": {},
        f"/todos/{scheduled.id}/edit": {"title": "renamed", "priority": "9", "max_attempts": "3"},
        f"/todos/{died.id}/edit": {"title": "renamed", "priority": "0", "max_attempts": "3", "retry": "1"},
        "/dead/bulk": {"ids": died.id, "bulk_action": "priority", "priority": "9"},
        "/dead/retry": {"one": died.id},
    }
    statuses = {path: page.evaluate(POST_AS_PAGE, [path, fields]) for path, fields in refused.items()}
    assert statuses == dict.fromkeys(refused, 403)

    after = live_db.todo(scheduled.id)
    assert (after.state, after.title, after.priority, after.ready_at) == (
        "pending",
        "later",
        0,
        scheduled.ready_at,
    )
    assert (live_db.todo(died.id).state, live_db.todo(died.id).priority) == ("failed", 0)
    paused = live_db.run(
        lambda conn: conn.fetchval("SELECT count(*) FROM queue_pauses WHERE queue = $1", queue)
    )
    assert paused == 1
    assert (
        live_db.run(lambda conn: conn.fetchval("SELECT count(*) FROM queue_pauses WHERE queue = $1", quiet))
        == 0
    )
