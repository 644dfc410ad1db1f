"""Every page, at a desktop width (1400 px) and a phone's (390 px): a screenshot of each
(into one temporary directory, printed, to look at), no sideways scrolling of the page,
and no Content Security Policy violation.

PAGES is the one list of pages: a new page is one more line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

from dashboard.accounts import Accounts
from dashboard.store import Store
from tests.browser.conftest import on_database
from tests.browser.test_dashboard_browser import csp_violations
from tests.factories import make_retry_due, unique

pytestmark = pytest.mark.browser

WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}
# (name, path): {queue} and {todo} are filled from the seeded data.
PAGES = [
    ("overview", "/"),
    ("queue", "/queues/{queue}"),
    ("leases", "/leases"),
    ("dead", "/dead"),
    ("todo", "/todos/{todo}"),
    ("create", "/create"),
    ("tokens", "/tokens"),
    ("patterns", "/patterns"),
    ("login", "/login"),
    ("agents", "/agents"),
    ("inbox", "/inbox"),
]
LONG_TITLE = "Send the quarterly statement to every customer of the northern region with their attachments"
LONG_ERROR = "smtp: 451 4.7.1 Try again later — the receiving server greylisted us " * 3


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("layout")
    print(f"\nlayout screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def seeded(live_db, live_dsn) -> dict:
    """A queue with a todo in every state (long titles, a long error, a payload of some
    size), a token on many queues: the pages drawn full, as an operator sees them."""
    queue = unique("layout-queue-with-a-long-name")
    payload = {"customer": {"id": 42, "name": "Ada Lovelace", "tags": [f"tag-{i}" for i in range(30)]}}

    async def seed(conn):
        store = Store(conn)
        from tests.factories import claimed, dead_letter, enqueue, retrying

        await enqueue(store, queue, LONG_TITLE, kind="statement.send", assignee="mailer-7", payload=payload)
        await enqueue(store, queue, "scheduled for later", delay=3600, priority=3)
        await claimed(store, queue, "being worked on", owner="worker-with-a-long-name-01", ttl=300)
        await retrying(store, conn, queue, "waiting for a retry")
        await dead_letter(store, conn, queue, LONG_TITLE, error=LONG_ERROR)
        done = await claimed(store, queue, "done on the second attempt", max_attempts=3, payload=payload)
        failed = await store.fail(done.id, done.owner, done.lease_token, LONG_ERROR)
        await make_retry_due(conn, failed.id)
        again = await store.claim(done.id, "worker-2", 30)
        await store.complete(again.id, "worker-2", again.lease_token, {"sent": True})
        queues = [queue] + [f"reports-{i}" for i in range(6)]
        await Accounts(conn).add_token("statement-mailer-northern", queues)
        return done.id

    todo = on_database(live_dsn, seed)
    return {"queue": queue, "todo": todo}


def scroll_width(page) -> tuple[int, int]:
    return page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize(("name", "path"), PAGES, ids=[name for name, _ in PAGES])
def test_every_page_fits_the_width_without_a_csp_violation(
    logged_in, console, seeded, screenshots, name, path, width
):
    page = logged_in
    url = path.format(**seeded)
    page.set_viewport_size(dict(zip(("width", "height"), WIDTHS[width], strict=True)))

    assert page.goto(url).status == 200
    if name != "login":  # the login page has no scripts
        page.wait_for_function("() => window.htmx !== undefined && window.__sse.opened > 0", timeout=5000)
    expect(page.locator("body")).to_be_visible()
    shot = screenshots / f"{name}-{width}.png"
    page.screenshot(path=str(shot), full_page=True, caret="initial")

    scrolled, inner = scroll_width(page)
    assert scrolled <= inner, f"{url} at {width} is {scrolled} px wide in a {inner} px window ({shot})"
    if width == "phone" and name != "login":
        top = page.locator("header.top")
        menu = page.locator("header.top nav")
        assert menu.evaluate("e => e.getBoundingClientRect().height") < 40, "the menu is on one line"
        beyond = menu.evaluate(
            "e => [...e.querySelectorAll('a')].filter(a => a.getBoundingClientRect().right > innerWidth)"
            ".map(a => a.textContent)"
        )
        assert beyond == [], f"menu links off the screen: {beyond}"
        assert top.evaluate("e => e.getBoundingClientRect().height") < 100, "the header is two short lines"
    assert csp_violations(console) == [], console
