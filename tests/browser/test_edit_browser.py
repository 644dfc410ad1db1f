"""The edit form in a real Chromium against `switchboard serve` (issue 24.3): two tabs edit
one todo, and the second save is not applied over the first unseen: it comes back saying
who changed what, with everything typed kept, and saving again applies it. A form with
several mistakes marks them all at once.

The live server is shared by every test, so each test works in a queue of its own.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard_browser import csp_violations, posted
from tests.factories import unique

pytestmark = pytest.mark.browser


@pytest.fixture
def queue() -> str:
    """A queue no other test touches."""
    return unique("ed")


def save(page, todo_id: str) -> int:
    """Click Save on the edit form; the status the post was answered with."""
    with page.expect_response(posted(f"/todos/{todo_id}/edit")) as answer:
        page.get_by_role("button", name="Save").click()
    return answer.value.status


def test_two_tabs_edit_one_todo_and_the_second_save_shows_the_first_with_its_input_kept(
    logged_in, console, live_db, queue, shot, operator_account
):
    first = logged_in
    second = first.context.new_page()
    todo = live_db.enqueue(queue, "welcome mail", payload={"lang": "en"})
    for tab in (first, second):
        tab.goto(f"/todos/{todo.id}/edit")
        expect(tab.get_by_label("Title")).to_have_value("welcome mail")

    first.get_by_label("Title").fill("welcome mail (de)")
    assert save(first, todo.id) == 303
    expect(first.locator("#flash")).to_have_text(f"{todo.id} edited")

    second.get_by_label("Title").fill("welcome mail, v2")
    second.get_by_label("Priority").fill("4")
    second.locator("textarea[name=payload]").fill('{"lang": "en", "v": 2}')
    assert save(second, todo.id) == 409
    conflict = second.locator("#conflict")
    expect(conflict).to_contain_text("Not saved: this todo was changed after you opened this form.")
    change = conflict.locator(".timeline li")
    expect(change).to_have_count(1)
    expect(change.locator(".actor")).to_have_text(f"operator {operator_account[0]}")
    expect(change).to_contain_text("edited: title welcome mail → welcome mail (de)")
    expect(second.get_by_label("Title")).to_have_value("welcome mail, v2")
    expect(second.get_by_label("Priority")).to_have_value("4")
    expect(second.locator("textarea[name=payload]")).to_have_value('{"lang": "en", "v": 2}')
    shot("conflict", page=second)
    assert live_db.todo(todo.id).title == "welcome mail (de)"

    assert save(second, todo.id) == 303  # deliberately, over the change it was shown
    expect(second).to_have_url(re.compile(rf"/todos/{todo.id}$"))
    expect(second.locator("#flash")).to_have_text(f"{todo.id} edited")
    stored = live_db.todo(todo.id)
    assert (stored.title, stored.priority, stored.payload) == ("welcome mail, v2", 4, {"lang": "en", "v": 2})
    assert live_db.history(todo.id)[-1].note == (
        "edited: title welcome mail (de) → welcome mail, v2; payload +v; priority 0 → 4"
    )
    assert csp_violations(console) == [], "\n".join(console)


def test_an_edit_form_with_several_mistakes_marks_every_one(logged_in, console, live_db, queue, shot):
    page = logged_in
    todo = live_db.enqueue(queue, "monthly report", payload={"month": 11})
    page.goto(f"/todos/{todo.id}/edit")
    page.get_by_label("Title").fill("   ")
    page.get_by_label("Priority").fill("11")
    page.get_by_label("Max attempts").fill("0")
    page.locator("textarea[name=payload]").fill('{"month": 12')
    assert save(page, todo.id) == 422

    expect(page.locator("p.flash.error")).to_have_text("Nothing was changed: fix the fields marked below.")
    errors = page.locator("label.invalid .field-error")
    expect(errors).to_have_count(4)
    expect(errors.nth(0)).to_have_text("Title is required.")
    expect(errors.nth(1)).to_contain_text("Priority must be a whole number from -10 to 10")
    expect(errors.nth(2)).to_contain_text("Max attempts must be a whole number from 1 to 100")
    expect(errors.nth(3)).to_contain_text("not valid JSON")
    expect(page.get_by_label("Priority")).to_have_value("11")
    expect(page.locator("textarea[name=payload]")).to_have_value('{"month": 12')
    shot("errors")
    assert live_db.todo(todo.id).version == todo.version
    assert csp_violations(console) == [], "\n".join(console)
