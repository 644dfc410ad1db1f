"""The agents page in a real Chromium against `switchboard serve`: an agent that claims
through the Store shows up with its token, a short lease is highlighted, and an ack refused
by fencing is counted on the open page without a reload; laid out at 1400 and 390 px wide."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from dashboard.accounts import Accounts
from dashboard.errors import Conflict
from dashboard.store import Store
from tests.factories import claimed, enqueue, expire_lease, make_retry_due, unique

pytestmark = pytest.mark.browser


async def fencing_conflict(conn, queue: str, agent: str, rival: str) -> None:
    """`agent` claims, its lease lapses and is reaped, `rival` claims the todo again, and then
    `agent` completes it with its old lease: refused (Conflict), and recorded."""
    store = Store(conn)
    todo = await enqueue(store, queue, "fenced")
    first = await store.claim(todo.id, agent, 300)
    await expire_lease(conn, todo.id)
    await store.reap()  # or the server's reaper did it already
    await make_retry_due(conn, todo.id)
    await store.claim(todo.id, rival, 300)
    with pytest.raises(Conflict):
        await store.complete(todo.id, agent, first.lease_token)


async def short_lease(conn, queue: str, agent: str) -> None:
    """A lease of 300 s with 50 s left (under a fifth): its agent has not beaten for 250 s."""
    todo = await claimed(Store(conn), queue, "slow", owner=agent, ttl=300)
    await conn.execute(
        "UPDATE todos SET heartbeat_at = now() - interval '250 seconds',"
        " lease_expires_at = now() + interval '50 seconds' WHERE id = $1",
        todo.id,
    )


def test_the_agents_page_shows_a_live_agent_and_counts_a_refused_ack_without_a_reload(
    logged_in, console, shot, live_db, listening
):
    page = logged_in
    page.set_viewport_size({"width": 1400, "height": 900})
    queue, agent, rival = unique("pw-agents"), unique("worker"), unique("rival")
    token_id, _ = live_db.run(lambda conn: Accounts(conn).add_token(agent, [queue]))
    live_db.claimed(queue, "working on it", owner=agent, ttl=300)
    live_db.run(lambda conn: short_lease(conn, queue, rival))

    page.locator(".top nav").get_by_role("link", name="Agents", exact=True).click()
    listening()
    page.evaluate("window.__samePage = true")  # gone if the page were reloaded

    row = page.locator(f'tr[data-agent="{agent}"]')
    expect(row.locator('[data-label="Leases now"]')).to_have_text("1")
    expect(row.locator(".countdown")).to_have_text(re.compile(r"^[45]m \d+s$"))  # the soonest lease
    expect(row.locator(".stale-acks")).to_have_text("0")
    rival_row = page.locator(f'tr[data-agent="{rival}"]')
    expect(rival_row).to_have_class("short")
    expect(rival_row.locator(".tag.short")).to_have_text("1 short")

    live_db.run(lambda conn: fencing_conflict(conn, queue, agent, rival))

    # the page polls (and follows hints): the count changes where it is, no reload
    expect(row.locator(".stale-acks")).to_have_text("1", timeout=10_000)
    expect(row.locator(".stale-acks")).to_have_class("count failed stale-acks")
    expect(rival_row.locator('[data-label="Leases now"] a')).to_have_text("2")
    assert page.evaluate("window.__samePage === true")
    shot("1400")

    page.set_viewport_size({"width": 390, "height": 844})
    expect(row).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot("390")

    rival_row.locator('[data-label="Leases now"] a').click()  # its leases: the short one marked there too
    expect(page).to_have_url(re.compile(rf"/leases\?owner={rival}$"))
    expect(page.locator("#leases tbody tr")).to_have_count(2)
    expect(page.locator("#leases tr.short")).to_have_count(1)
    expect(page.locator("#leases tr.short .countdown")).to_have_attribute(
        "title", re.compile("left of a 5m 0s lease")
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot("leases-390")

    page.go_back()
    row.get_by_role("link", name=token_id).click()  # to its token, on the tokens page
    expect(page).to_have_url(re.compile(rf"/tokens#token-{token_id}$"))
    expect(page.locator(f"#token-{token_id}")).to_contain_text(queue)
    assert [m for m in console if "Content Security Policy" in m] == []
