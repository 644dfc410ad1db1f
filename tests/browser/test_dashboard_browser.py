"""The dashboard in a real Chromium against `switchboard serve`: forms, live updates over
Server-Sent Events (also after the server's LISTEN connection is killed), countdowns,
confirmations, escaping and the Content-Security-Policy.

The live server is shared by every test, so each test works in a queue of its own.
"""

from __future__ import annotations

import html
import re
import time

import pytest
from playwright.sync_api import expect

from tests.factories import unique

pytestmark = pytest.mark.browser

LISTENER = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'switchboard listener'
"""


def csp_violations(console: list[str]) -> list[str]:
    return [m for m in console if "Content Security Policy" in m or "Content-Security-Policy" in m]


@pytest.fixture
def queue() -> str:
    """A queue no other test touches."""
    return unique("pw")


def confirmations(page, *, accept: bool = True) -> list[str]:
    """Every dialog the page opens, answered (accepted by default); their messages."""
    seen: list[str] = []

    def answer(dialog) -> None:
        seen.append(dialog.message)
        if accept:
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", answer)
    return seen


def seconds(countdown: str) -> int:
    match = re.fullmatch(r"(?:(\d+)m )?(\d+)s", countdown.strip())
    assert match, f"not a countdown: {countdown!r}"
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def posted(path: str):
    return lambda r: r.request.method == "POST" and r.url.split("?")[0].endswith(path)


def test_an_operator_logs_in_creates_an_assigned_todo_and_sees_it_on_its_queue_page(
    page, console, shot, operator_account, live_db, queue
):
    name, password = operator_account
    page.context.clear_cookies()  # contexts start logged in; this test logs in through the form
    page.goto("/create")
    expect(page).to_have_url(re.compile(r"/login\?next=/create$"))
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", password)
    page.click("button.primary")
    expect(page).to_have_url(re.compile(r"/create$"))

    page.fill("input[name=queue]", queue)
    page.fill("input[name=title]", "Call the customer back")
    page.fill("input[name=kind]", "phone")
    page.fill("input[name=assignee]", "sam")
    page.fill("textarea[name=payload]", '{"phone": "+44 20 7946 0000"}')
    shot("form")
    with page.expect_response(posted("/create")) as answer:
        page.get_by_role("button", name="Create").click()
    assert answer.value.status == 303, f"the Create form was answered {answer.value.status}"

    expect(page).to_have_url(re.compile(rf"/queues/{queue}$"))
    expect(page.locator("#flash")).to_contain_text("created td_")
    row = page.locator("#todos tbody tr", has_text="Call the customer back")
    expect(row).to_be_visible()
    expect(row).to_contain_text("sam")
    expect(row).to_contain_text("phone")
    stored = live_db.run(
        lambda conn: conn.fetch("SELECT assignee, payload FROM todos WHERE queue = $1", queue)
    )
    assert [tuple(r) for r in stored] == [("sam", {"phone": "+44 20 7946 0000"})]
    assert csp_violations(console) == [], "\n".join(console)


def test_a_todo_enqueued_elsewhere_appears_on_the_open_overview_within_two_seconds(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    listening()
    page.evaluate("window.__sameDocument = true")
    row = page.locator(f'#overview tr[data-queue="{queue}"]')
    expect(row).to_have_count(0)

    live_db.enqueue(queue, "from another connection")

    expect(row).to_be_visible(timeout=2000)
    expect(row.locator(".count.ready")).to_have_text("1")
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert csp_violations(console) == [], "\n".join(console)


def test_the_new_work_notice_names_the_queue_that_got_work(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    page.goto(f"/queues/{queue}")
    listening()
    expect(page.locator("#todos")).to_contain_text("No todos match.")

    live_db.enqueue(queue, "fresh work")

    expect(page.locator("#notice")).to_contain_text(f"new work in {queue}", timeout=2000)
    expect(page.locator("#todos")).to_contain_text("fresh work", timeout=2000)
    assert csp_violations(console) == [], "\n".join(console)


def test_a_todo_written_by_plain_sql_appears_on_the_open_queue_page_at_its_next_poll(
    logged_in, console, listening, live_db, queue, shot
):
    """No hint comes for it (only switchboard's processes send hints): the list's own poll
    (every 5 s) finds it, and no "new work" notice is shown."""
    page = logged_in
    page.goto(f"/queues/{queue}")
    listening()
    expect(page.locator("#todos")).to_contain_text("No todos match.")

    live_db.run(
        lambda conn: conn.execute(
            "INSERT INTO todos (id, queue, title) VALUES ('td_' || gen_random_uuid(), $1, 'by plain sql')",
            queue,
        )
    )

    expect(page.locator("#todos")).to_contain_text("by plain sql", timeout=7000)
    expect(page.locator("#notice")).not_to_contain_text(queue)
    shot()
    assert csp_violations(console) == [], "\n".join(console)


def test_a_dead_letter_retried_from_the_dead_letters_page_moves_to_ready(
    logged_in, console, live_db, queue, shot
):
    page = logged_in
    died = live_db.dead(queue, "bounced mail", error="SMTP 550: mailbox unavailable")
    confirmations(page)
    page.goto(f"/dead?queue={queue}")
    row = page.locator(f'#dead tr[data-todo="{died.id}"]')
    expect(row).to_contain_text("SMTP 550: mailbox unavailable")
    expect(row).to_contain_text("1/1")
    shot("before")

    with page.expect_response(posted("/dead/retry")) as answer:
        row.get_by_role("button", name="Retry", exact=True).click()

    assert answer.value.status == 200, f"the retry was answered {answer.value.status}"
    assert '<p class="flash ok" id="action-result">1 retried</p>' in answer.value.text()
    expect(row).to_have_count(0)
    assert live_db.todo(died.id).state == "pending"
    page.goto(f"/queues/{queue}?state=ready")
    expect(page.locator("#todos")).to_contain_text("bounced mail")
    assert csp_violations(console) == [], "\n".join(console)


@pytest.mark.parametrize("button", ["Retry", "Retry selected", "Retry all"])
def test_every_dead_letter_retry_button_asks_first_and_does_nothing_when_declined(
    logged_in, console, live_db, queue, shot, button
):
    page = logged_in
    died = live_db.dead(queue, "keep me dead")
    asked = confirmations(page, accept=False)
    sent = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    page.goto(f"/dead?queue={queue}")
    row = page.locator(f'#dead tr[data-todo="{died.id}"]')
    row.locator("input[name=ids]").check()

    scope = row if button == "Retry" else page.locator("#dead .actions")
    scope.get_by_role("button", name=button, exact=button != "Retry all").click()

    assert len(asked) == 1, f"{button} was sent without asking: {sent}"
    assert sent == []
    page.goto(f"/dead?queue={queue}")
    expect(page.locator(f'#dead tr[data-todo="{died.id}"]')).to_be_visible()
    assert live_db.todo(died.id).state == "failed"


def test_the_retry_report_stays_on_screen_while_the_table_refreshes_live(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    keyed = live_db.dead(queue, "keyed", idempotency_key="order-7")
    live = live_db.enqueue(queue, "redelivered", idempotency_key="order-7")
    live_db.dead(queue, "plain 1")
    live_db.dead(queue, "plain 2")
    confirmations(page)
    page.goto(f"/dead?queue={queue}")
    listening()
    page.evaluate("""() => {
        window.__deadRefreshes = 0;
        document.addEventListener("htmx:afterSwap", (e) => {
            if (e.detail.elt && e.detail.elt.id === "dead" && e.detail.requestConfig.verb === "get") {
                window.__deadRefreshes += 1;
            }
        });
    }""")

    with page.expect_response(posted("/dead/retry")) as answer:
        page.locator("#dead .actions").get_by_role("button", name=f"Retry all in {queue}").click()
    assert answer.value.status == 200
    body = html.unescape(answer.value.text())
    assert "2 retried; 1 skipped (1 key held by a live todo)" in body
    assert f"a live todo already holds key 'order-7' in queue {queue}: {live.id}" in body

    # Work arriving anywhere refreshes the table live (as the retry's own hints already do).
    page.evaluate("window.__deadRefreshes = 0")
    live_db.enqueue(f"{queue}-other", "unrelated work")
    page.wait_for_function("() => window.__deadRefreshes > 0", timeout=5000)
    shot("after-refresh")
    expect(page.locator(f'#dead tr[data-todo="{keyed.id}"]')).to_be_visible()
    expect(page.locator("#action-result")).to_contain_text(
        "2 retried; 1 skipped (1 key held by a live todo)", timeout=1000
    )


def test_a_lease_is_force_released_from_the_leases_page(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    held = live_db.claimed(queue, "stuck job", owner="agent-gone", ttl=600)
    asked = confirmations(page)
    page.goto("/leases")
    row = page.locator(f'#leases tr[data-todo="{held.id}"]')
    expect(row).to_contain_text("agent-gone")
    shot("before")

    with page.expect_response(posted(f"/todos/{held.id}/release")) as answer:
        row.get_by_role("button", name="Force-release").click()

    assert answer.value.status == 200, f"the release was answered {answer.value.status}"
    assert len(asked) == 1 and "agent-gone" in asked[0], asked
    assert f"lease on {held.id} released: pending again" in answer.value.text()
    expect(row).to_have_count(0)
    after = live_db.todo(held.id)
    assert (after.state, after.owner) == ("pending", None)
    assert live_db.history(held.id)[-1][2:4] == ("operator", operator_account[0])
    assert csp_violations(console) == [], "\n".join(console)


def test_the_todo_page_labels_every_history_row_with_the_kind_of_actor_before_its_name(
    logged_in, console, live_db, queue, shot, operator_account
):
    page = logged_in
    # An agent whose name looks like an operator's (claims take any owner text; agent
    # tokens will refuse ':' in names, old rows keep them): its label still says agent.
    held = live_db.claimed(queue, "look-alike", owner="operator:admin", ttl=600)
    confirmations(page)
    page.goto(f"/todos/{held.id}")
    with page.expect_response(posted(f"/todos/{held.id}/release")) as answer:
        page.get_by_role("button", name="Force-release lease").click()
    assert answer.value.status == 200, answer.value.text()

    actors = page.locator("#todo .timeline .actor")
    expect(actors).to_have_text(
        ["producer producer", "agent operator:admin", f"operator {operator_account[0]}"]
    )
    expect(page.locator("#todo .timeline .actor-kind")).to_have_text(["producer", "agent", "operator"])
    # the label is a styled tag, and an operator's stands out from an agent's
    kinds = page.locator("#todo .timeline .actor-kind")
    assert kinds.nth(0).evaluate("e => getComputedStyle(e).borderRadius") != "0px"
    colour = "e => getComputedStyle(e).color"
    assert kinds.nth(2).evaluate(colour) != kinds.nth(1).evaluate(colour)
    shot()
    assert csp_violations(console) == [], "\n".join(console)


def test_markup_in_a_title_and_payload_is_shown_as_text_and_never_runs(
    logged_in, console, live_db, queue, shot
):
    page = logged_in
    title = '<script>window.__xss = "title"</script><img src=x onerror="window.__xss = 1"><b>bold</b>'
    payload = {"html": "<script>alert('payload')</script>", "tag": "<i>italic</i>"}
    todo = live_db.enqueue(queue, title, payload=payload, kind="<u>kind</u>")
    live_db.dead(queue, title, error="<script>window.__xss = 'error'</script>")
    dialogs = confirmations(page, accept=False)

    for label, path in [
        ("todo", f"/todos/{todo.id}"),
        ("queue", f"/queues/{queue}"),
        ("dead", f"/dead?queue={queue}"),
    ]:
        page.goto(path)
        expect(page.locator("main")).to_contain_text(title)
        assert page.locator("main script, main img, main b, main i, main u").count() == 0, path
        assert page.evaluate("window.__xss === undefined"), path
        shot(label)

    page.goto(f"/todos/{todo.id}")
    expect(page.locator("pre.json").first).to_contain_text('"html": "<script>alert(\'payload\')</script>"')
    expect(page.locator("h1.todo-title")).to_contain_text("<b>bold</b>")
    assert dialogs == []
    assert csp_violations(console) == [], "\n".join(console)


def test_an_open_page_keeps_updating_after_the_servers_listen_connection_is_killed(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    listening()
    listeners = live_db.run(lambda conn: conn.fetch(LISTENER))
    assert len(listeners) == 1, f"expected the hub's one LISTEN connection, found {listeners}"
    old = listeners[0]["pid"]

    assert live_db.run(lambda conn: conn.fetchval("SELECT pg_terminate_backend($1)", old))

    deadline = time.monotonic() + 10
    while not [r for r in live_db.run(lambda conn: conn.fetch(LISTENER)) if r["pid"] != old]:
        assert time.monotonic() < deadline, "the server never re-opened its LISTEN connection"
        time.sleep(0.1)
    # The hub tells open pages to resync (hints sent while it was away are gone).
    page.wait_for_function("() => window.__sse.resyncs > 0", timeout=5000)
    page.evaluate("window.__sameDocument = true")

    live_db.enqueue(queue, "after the outage")

    expect(page.locator(f'#overview tr[data-queue="{queue}"]')).to_be_visible(timeout=2000)
    expect(page.locator("#notice")).to_contain_text(f"new work in {queue}", timeout=2000)
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert csp_violations(console) == [], "\n".join(console)


def test_the_lease_countdown_ticks_down_in_the_browser(logged_in, console, live_db, queue, shot):
    page = logged_in
    held = live_db.claimed(queue, "long job", owner="agent-slow", ttl=50)
    page.goto("/leases")
    countdown = page.locator(f'#leases tr[data-todo="{held.id}"] .countdown')
    expect(countdown).to_have_attribute("data-deadline", re.compile(r"^\d+(\.\d+)?$"))  # app.js took it over
    first_text = countdown.text_content()
    first = seconds(first_text)
    assert 40 <= first <= 50

    expect(countdown).not_to_have_text(first_text, timeout=2500)
    second = seconds(countdown.text_content())
    expect(countdown).not_to_have_text(countdown.text_content(), timeout=2500)
    third = seconds(countdown.text_content())

    assert first > second > third
    assert csp_violations(console) == [], "\n".join(console)


def test_no_page_breaks_the_content_security_policy_which_is_enforced(
    logged_in, console, live_db, queue, shot
):
    page = logged_in
    died = live_db.dead(queue, "a dead one")
    held = live_db.claimed(queue, "a held one")
    pages = {
        "overview": "/",
        "queue": f"/queues/{queue}",
        "leases": "/leases",
        "dead": f"/dead?queue={queue}",
        "dead-todo": f"/todos/{died.id}",
        "held-todo": f"/todos/{held.id}",
        "create": "/create",
        "tokens": "/tokens",
        "not-found": "/todos/td_nope",
    }

    for label, path in pages.items():
        page.goto(path)
        # every script loaded and ran (htmx, its SSE extension, app.js) and live updates are on
        page.wait_for_function("() => window.htmx !== undefined && window.__sse.opened > 0", timeout=5000)
        shot(label)
    page.goto("/login")
    shot("login")

    assert csp_violations(console) == [], console

    # The policy is really in force: an injected inline script does not run, and is reported.
    page.goto("/")
    with page.expect_console_message(lambda m: "Content Security Policy" in m.text) as report:
        ran = page.evaluate("""() => {
            const s = document.createElement("script");
            s.textContent = "window.__inlineRan = true";
            document.body.appendChild(s);
            return window.__inlineRan === true;
        }""")
    assert ran is False
    assert "script-src" in report.value.text


def test_a_new_work_notice_raises_no_script_error(logged_in, console, listening, live_db, queue, shot):
    page = logged_in
    listening()

    live_db.enqueue(queue, "wake up")

    expect(page.locator("#notice")).to_contain_text(f"new work in {queue}", timeout=2000)
    expect(page.locator(f'#overview tr[data-queue="{queue}"]')).to_be_visible(timeout=2000)
    assert [m for m in console if m.startswith("pageerror")] == []


def test_a_ticked_dead_letter_selection_survives_live_refreshes(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    first = live_db.dead(queue, "first to die")
    page.goto(f"/dead?queue={queue}")
    listening()
    page.evaluate("""() => {
        const gets = window.__deadGets = {asked: 0, sent: 0};
        const mine = (e) => e.detail.elt && e.detail.elt.id === "dead"
                            && e.detail.requestConfig.verb === "get";
        document.addEventListener("htmx:beforeRequest", (e) => { if (mine(e)) gets.asked += 1; });
        document.addEventListener("htmx:beforeSend", (e) => { if (mine(e)) gets.sent += 1; });
    }""")
    page.check("#select-all")
    expect(page.locator(f'#dead tr[data-todo="{first.id}"] input[name=ids]')).to_be_checked()

    second = live_db.dead(queue, "second to die")  # a hint: the table wants to refresh

    page.wait_for_function("() => window.__deadGets.asked > 0", timeout=5000)
    assert page.evaluate("window.__deadGets.sent") == 0  # held back while a box is ticked
    expect(page.locator(f'#dead tr[data-todo="{first.id}"] input[name=ids]')).to_be_checked()
    expect(page.locator(f'#dead tr[data-todo="{second.id}"]')).to_have_count(0)
    shot("held")

    page.uncheck("#select-all")
    expect(page.locator("#dead input[name=ids]:checked")).to_have_count(0)
    live_db.dead(queue, "third to die")  # the next hint refreshes the table again
    expect(page.locator(f'#dead tr[data-todo="{second.id}"]')).to_be_visible(timeout=3000)
    assert csp_violations(console) == [], "\n".join(console)


def test_the_forms_still_work_without_javascript(new_context, live_db, queue, shot):
    page = new_context(java_script_enabled=False).new_page()
    died = live_db.dead(queue, "no-js dead")
    held = live_db.claimed(queue, "no-js held", owner="agent-gone")

    page.goto(f"/dead?queue={queue}")
    shot("dead", page=page)
    page.locator(f'#dead tr[data-todo="{died.id}"]').get_by_role("button", name="Retry", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/dead\?queue={queue}$"))
    expect(page.locator("#flash")).to_have_text("1 retried")

    page.goto("/leases")
    page.locator(f'#leases tr[data-todo="{held.id}"]').get_by_role("button", name="Force-release").click()
    expect(page).to_have_url(re.compile(r"/leases$"))
    expect(page.locator("#flash")).to_have_text(f"lease on {held.id} released: pending again")

    page.goto(f"/create?queue={queue}")
    page.fill("input[name=title]", "made without scripts")
    page.get_by_role("button", name="Create").click()
    expect(page).to_have_url(re.compile(rf"/queues/{queue}$"))
    expect(page.locator("#todos")).to_contain_text("made without scripts")

    assert live_db.todo(died.id).state == "pending"
    assert live_db.todo(held.id).state == "pending"
