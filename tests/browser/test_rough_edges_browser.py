"""The rough edges a new operator found (issue 13, item 6), in a real Chromium: a bulk
action with nothing ticked, htmx error swaps under the CSP, a NUL in a filter, the
payload's copy button and collapse, the favicon, and the calm "new work" line.

The web halves (messages, markup, status codes) are in tests/test_rough_edges.py; the
layout at 1400 and 390 px in tests/browser/test_layout_browser.py.
"""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard_browser import confirmations, csp_violations, posted
from tests.factories import unique

pytestmark = pytest.mark.browser


@pytest.fixture
def queue() -> str:
    return unique("rb")


def posts(page) -> list[str]:
    """The URL of every POST the page sends from now on."""
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    return sent


# -- a bulk action with nothing ticked --------------------------------------------------------


def test_apply_with_nothing_ticked_says_select_at_least_one_without_asking_or_sending(
    logged_in, console, live_db, queue, shot
):
    page = logged_in
    todo = live_db.enqueue(queue, "leave me be")
    asked, sent = confirmations(page), posts(page)
    page.goto(f"/queues/{queue}")
    hint = page.locator("#todos .selection-hint")
    expect(hint).to_be_hidden()

    page.locator("#todos .bulk").get_by_role("button", name="Apply").click()

    expect(hint).to_be_visible()
    expect(hint).to_have_text("Select at least one todo (tick its box), or choose all that match the filter.")
    shot("hint")
    assert asked == [] and sent == []
    page.locator(f'#todos tr[data-todo="{todo.id}"] input[name=ids]').check()
    expect(hint).to_be_hidden()
    with page.expect_response(posted(f"/queues/{queue}/bulk")) as answer:
        page.locator("#todos .bulk").get_by_role("button", name="Apply").click()
    assert answer.value.status == 200 and len(asked) == 1  # with a box ticked: asked, then sent
    assert live_db.todo(todo.id).state == "failed"  # the first action: cancel
    assert csp_violations(console) == [], console


@pytest.mark.parametrize("button", ["Retry selected", "Apply"])
def test_dead_letter_bulk_buttons_with_nothing_ticked_ask_nothing_and_send_nothing(
    logged_in, console, live_db, queue, shot, button
):
    page = logged_in
    died = live_db.dead(queue, "still dead")
    asked, sent = confirmations(page), posts(page)
    page.goto(f"/dead?queue={queue}")

    page.locator("#dead").get_by_role("button", name=button, exact=True).click()

    expect(page.locator("#dead .selection-hint")).to_contain_text("Select at least one dead-letter")
    assert asked == [] and sent == []
    assert "Invalid input" not in page.locator("#flash").inner_text()  # not "422 Invalid input: ids: …"
    assert live_db.todo(died.id).state == "failed"
    # "all that match" needs no ticked box: the Apply goes out
    page.locator("#dead select[name=bulk_scope]").select_option("all")
    expect(page.locator("#dead .selection-hint")).to_be_hidden()


# -- htmx error swaps and the CSP ---------------------------------------------------------------


def test_an_htmx_error_swap_shows_the_error_without_a_csp_violation(logged_in, console, live_db, queue, shot):
    """An action that fails (here on a todo that is gone) is swapped into the page's
    message area by htmx's error handling, with no inline style added on the way."""
    page = logged_in
    todo = live_db.enqueue(queue, "about to be acted on")
    page.goto(f"/todos/{todo.id}")

    with page.expect_response(posted("/todos/td_gone/cancel")) as answer:
        page.evaluate("htmx.ajax('POST', '/todos/td_gone/cancel', {source: '#todo', target: '#todo'})")

    assert answer.value.status == 404
    expect(page.locator("#flash .flash.error")).to_contain_text("404 Not found")
    expect(page.locator("#todo")).to_contain_text("about to be acted on")  # the page stays
    shot()
    assert page.locator("[style]").count() == 0  # htmx added no inline style anywhere
    assert csp_violations(console) == [], console


def test_a_nul_in_a_filter_is_shown_beside_it_on_the_page(logged_in, console, live_db, queue, shot):
    page = logged_in
    live_db.enqueue(queue, "present")

    page.goto(f"/queues/{queue}?owner=a%00b&state=ready")

    label = page.locator("label.invalid")
    expect(label).to_contain_text("Owner must not contain a NUL character (a zero byte).")
    expect(page.locator("select[name=state]")).to_have_value("ready")
    expect(page.locator("main")).not_to_contain_text("PostgreSQL")
    expect(page.locator("header.top .who")).to_be_visible()
    shot()
    assert csp_violations(console) == [], console


# -- the payload view and the favicon -------------------------------------------------------------


def test_the_payload_copies_to_the_clipboard_and_stays_folded_across_refreshes(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    payload = {"order": {"id": 42, "lines": [{"sku": f"sku-{i}", "qty": i} for i in range(3)]}}
    todo = live_db.enqueue(queue, "copy me", payload=payload)
    page.goto(f"/todos/{todo.id}")
    listening()

    page.get_by_role("button", name="Copy").click()

    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert json.loads(page.evaluate("navigator.clipboard.readText()")) == payload

    page.locator("#payload-view > summary").click()  # fold it
    expect(page.locator("#payload-json")).to_be_hidden()
    page.evaluate("""() => { window.__todoSwaps = 0;
        document.addEventListener("htmx:afterSettle", () => { window.__todoSwaps += 1; }); }""")
    live_db.enqueue(queue, "a hint that redraws the todo's part of the page")
    page.wait_for_function("() => window.__todoSwaps > 0", timeout=7000)
    expect(page.locator("#payload-json")).to_be_hidden()  # still folded after the redraw
    shot()
    assert csp_violations(console) == [], console


def test_the_favicon_loads_under_the_csp(logged_in, console, shot):
    page = logged_in
    href = page.locator("link[rel=icon]").get_attribute("href")
    answer = page.request.get(href)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    page.goto("/leases")
    assert [m for m in console if "favicon" in m] == []  # no 404 for /favicon.ico either
    assert csp_violations(console) == [], console


# -- the "new work" line ----------------------------------------------------------------------------


def test_new_work_shows_only_on_its_queue_page_once_and_in_place(
    logged_in, console, listening, live_db, queue, shot
):
    page = logged_in
    other = unique("rb-other")
    page.goto(f"/queues/{queue}")
    listening()
    line = page.locator("#notice")

    live_db.enqueue(other, "elsewhere")
    page.wait_for_function("() => window.__sse.refreshes > 0", timeout=5000)
    expect(line).to_be_hidden()  # another queue's work is not this page's news

    live_db.enqueue(queue, "mine")
    expect(line).to_contain_text(f"new work in {queue}", timeout=3000)
    page.evaluate("window.__line = document.querySelector('#notice span[data-since]')")
    seen = page.evaluate("window.__sse.refreshes")
    live_db.enqueue(queue, "mine again")
    page.wait_for_function(f"() => window.__sse.refreshes > {seen}", timeout=5000)
    # within the quiet interval: the same line, not drawn again (no pop, no flash)
    assert page.evaluate("document.querySelector('#notice span[data-since]') === window.__line")
    assert line.evaluate("e => getComputedStyle(e).animationName") == "none"
    expect(line).to_be_visible()
    shot()
    assert csp_violations(console) == [], console


def test_a_todo_page_shows_no_new_work_line(logged_in, console, listening, live_db, queue, shot):
    page = logged_in
    todo = live_db.enqueue(queue, "reading this one")
    page.goto(f"/todos/{todo.id}")
    listening()

    live_db.enqueue(queue, "more work in the same queue")

    page.wait_for_function("() => window.__sse.refreshes > 0", timeout=5000)
    expect(page.locator("#notice")).to_have_count(0)
    expect(page.locator("text=new work in")).to_have_count(0)
