"""Text an agent writes cannot reorder the words around it (issue 25, item 11): a
right-to-left override (U+202E) in a todo's kind or title would otherwise reverse the rest
of its line, so that the Inbox card's "from agent …" read backwards. Every such text is
isolated (<bdi>), and in a real Chromium our words keep their order on the Inbox card and
the todo page.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Locator, Page, expect

from dashboard.control import Control
from dashboard.models import Actor
from dashboard.store import Store
from tests.browser.conftest import OPERATOR, LiveDatabase
from tests.browser.test_dashboard_browser import csp_violations
from tests.factories import new_todo, unique

pytestmark = pytest.mark.browser

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE, never closed

# The left edge of the first occurrence of `word` in the element's text, as laid out.
WORD_LEFT = """(element, word) => {
  const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf(word);
    if (at >= 0) {
      const range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, at + word.length);
      return range.getBoundingClientRect().left;
    }
  }
  return null;
}"""


def left_of(locator: Locator, word: str) -> float:
    left = locator.evaluate(WORD_LEFT, word)
    assert left is not None, f"no {word!r} in {locator.inner_text()!r}"
    return left


def box_left(locator: Locator) -> float:
    return locator.bounding_box()["x"]


def created_by_agent(live_db: LiveDatabase, agent: str, **fields) -> str:
    """A todo created by `agent` (its history's first step says so); its id."""

    async def create(conn):
        item = new_todo(unique("bidi"), **fields)
        return (await Store(conn).create(item, actor=Actor("agent", agent))).todo.id

    return live_db.run(create)


def isolated(locator: Locator, text: str) -> Locator:
    """The element holding `text`, which must isolate it: a <bdi>, or an element with dir=auto."""
    holder = locator.locator("bdi, [dir=auto]", has_text=text)
    expect(holder).to_have_count(1)
    return holder


def test_an_override_in_a_kind_does_not_reverse_the_inbox_cards_from_agent_line(
    logged_in: Page, live_db, console, shot
):
    page, agent = logged_in, unique("refund-bot")
    todo_id = created_by_agent(
        live_db, agent, title=f"{RLO}Approve refund", kind=f"{RLO}evil.kind", assignee=OPERATOR
    )
    page.goto("/inbox")
    card = page.locator(f"#inbox-{todo_id}")
    expect(card).to_be_visible()
    meta = card.locator(".inbox-meta")

    kind = isolated(meta, "evil.kind")
    name = isolated(meta.locator(".actor"), agent)
    assert box_left(kind) < left_of(meta, "from") < left_of(meta, "agent") < box_left(name)
    assert box_left(name) < left_of(meta, "created") < left_of(meta, "attempt")
    title = isolated(card.locator(".inbox-title"), "Approve refund")
    assert box_left(title) < box_left(card.locator(".inbox-title .badge"))  # the title, then its state
    shot("inbox", page=page)
    assert csp_violations(console) == [], "\n".join(console)


def test_an_override_in_a_title_or_assignee_does_not_reorder_the_todo_page(logged_in: Page, live_db, shot):
    page = logged_in
    todo_id = created_by_agent(
        live_db,
        unique("refund-bot"),
        title=f"{RLO}Approve refund",
        kind=f"{RLO}evil.kind",
        assignee=f"{RLO}bob",
        assignee_until=(datetime.now(UTC) + timedelta(days=30)).isoformat(),
    )
    page.goto(f"/todos/{todo_id}")
    heading = page.locator("h1.todo-title")
    assert box_left(isolated(heading, "Approve refund")) < box_left(heading.locator(".badge"))
    assignee = page.locator("dt:text-is('Assignee') + dd")
    assert box_left(isolated(assignee, "bob")) < left_of(assignee, "any agent may claim it")
    isolated(page.locator("dt:text-is('Kind') + dd"), "evil.kind")
    shot("todo", page=page)


def test_an_override_in_a_canceller_or_an_error_does_not_reorder_the_dead_letters(
    logged_in: Page, live_db, shot
):
    page, queue = logged_in, unique("bidi")

    async def cancel(conn):
        todo = (await Store(conn).create(new_todo(queue, "Send invoice"))).todo
        return (await Control(conn).cancel(todo.id, Actor("agent", f"{RLO}bot"), f"{RLO}no longer needed")).id

    cancelled = live_db.run(cancel)
    died = live_db.dead(queue, "Send reminder", error=f"{RLO}SMTP timeout")
    page.goto(f"/dead?queue={queue}")
    row = page.locator(f"tr:has(a[href='/todos/{cancelled}']) td.last-error")
    name, reason = isolated(row, "bot"), isolated(row, "no longer needed")
    assert left_of(row, "cancelled by") < box_left(name) < box_left(reason)
    page.goto(f"/queues/{queue}?state=failed")
    isolated(page.locator(f"tr[data-todo='{died.id}'] td.last-error"), "SMTP timeout")
    shot("queue", page=page)
