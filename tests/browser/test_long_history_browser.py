"""A todo whose agent made its history long (issue 25, item 1): the todo page shows the
newest HISTORY_SHOWN steps and says that earlier ones are left out, in a real Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from dashboard.reads import HISTORY_SHOWN
from tests.browser.conftest import LiveDatabase
from tests.factories import unique
from tests.test_history_bounds import grow_history

pytestmark = pytest.mark.browser


def test_the_todo_page_shows_the_newest_steps_of_a_long_history(logged_in: Page, live_db: LiveDatabase, shot):
    page = logged_in
    todo = live_db.claimed(unique("hist"), "Summarise the quarterly filings")
    live_db.run(lambda conn: grow_history(conn, todo.id, 3 * HISTORY_SHOWN))
    page.goto(f"/todos/{todo.id}")
    expect(page.locator("#older-history")).to_contain_text(f"these are the newest {HISTORY_SHOWN}")
    expect(page.locator("ol.timeline > li")).to_have_count(HISTORY_SHOWN)
    shot()
