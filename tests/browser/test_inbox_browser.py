"""A person's inbox in a real Chromium against `switchboard serve` (issue 14): an agent
creates a todo for operator alice; alice sees it arrive without reloading, claims it,
extends the claim and completes it with {"approved": true}; the agent reads that result;
the todo's history names every step's actor. Also release and reassign from the inbox, a
viewer who cannot claim, and the page at 1400 and 390 px.

The agent's side is `McpAgent` (the MCP tools over streamable HTTP, the SDK's client);
`HttpAgent` (the Agent HTTP API) has the same two calls, `create_for` and `wait_for`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from playwright.sync_api import Page, expect

from dashboard.accounts import Accounts
from dashboard.control import Control
from dashboard.errors import Conflict
from dashboard.mcp_proxy import connected
from dashboard.models import Actor
from tests.browser.conftest import SSE_PROBE, LiveDatabase, in_thread
from tests.browser.test_dashboard_browser import csp_violations
from tests.factories import unique
from tests.processes import eventually

pytestmark = pytest.mark.browser

ALICE = "alice"
WIDTHS = {"desktop": (1400, 900), "phone": (390, 844)}


class HttpAgent:
    """An agent with a token for `queue`, over the Agent HTTP API."""

    def __init__(self, base_url: str, live_db: LiveDatabase, queue: str):
        self.name, self.queue = unique("refund-bot"), queue
        _, secret = live_db.run(lambda conn: Accounts(conn).add_token(self.name, [queue]))
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=10)

    def create_for(self, assignee: str, title: str, payload: dict) -> str:
        """A todo for `assignee` (a person or an agent); its id."""
        body = {"queue": self.queue, "title": title, "assignee": assignee, "payload": payload}
        answer = self.http.post("/api/v1/todos", json=body)
        assert answer.status_code == 201, answer.text
        return answer.json()["todo"]["id"]

    def wait_for(self, todo_id: str, seconds: float) -> dict:
        """The todo once it is finished (done or failed), or as it is after `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            todo = self.http.get(f"/api/v1/todos/{todo_id}").json()["todo"]
            if todo["state"] in ("done", "failed") or time.monotonic() > deadline:
                return todo
            time.sleep(0.1)

    def close(self) -> None:
        self.http.close()


class McpAgent:
    """An agent with a token for `queue`, over MCP (streamable HTTP at /mcp, the SDK's
    client): the same two calls as HttpAgent, and a wait that runs beside the browser."""

    def __init__(self, base_url: str, live_db: LiveDatabase, queue: str):
        self.name, self.queue, self.base_url = unique("refund-bot"), queue, base_url
        _, self.token = live_db.run(lambda conn: Accounts(conn).add_token(self.name, [queue]))
        self.waits = ThreadPoolExecutor(1)

    def call(self, tool: str, **arguments) -> dict:
        async def run() -> dict:
            async with connected(self.base_url, self.token) as client:
                result = await client.call_tool(tool, arguments)
            assert not result.is_error, result.content
            return result.structured_content

        return in_thread(run())

    def create_for(self, assignee: str, title: str, payload: dict) -> str:
        created = self.call("create_for", queue=self.queue, title=title, assignee=assignee, payload=payload)
        return created["todo"]["id"]

    def wait_for(self, todo_id: str, seconds: float) -> dict:
        return self.call("wait_for", id=todo_id, wait=seconds)["todo"]

    def start_waiting(self, todo_id: str, seconds: float) -> Future:
        """wait_for in the background: its future gives (the todo, when it came back)."""
        return self.waits.submit(lambda: (self.wait_for(todo_id, seconds), time.monotonic()))

    def close(self) -> None:
        self.waits.shutdown()


@pytest.fixture
def agent(base_url, live_db) -> Iterator[McpAgent]:
    bot = McpAgent(base_url, live_db, unique("approvals"))
    yield bot
    bot.close()


@pytest.fixture
def http_agent(base_url, live_db) -> Iterator[HttpAgent]:
    bot = HttpAgent(base_url, live_db, unique("approvals"))
    yield bot
    bot.close()


def account(live_db: LiveDatabase, name: str, role: str) -> str:
    """An operator `name` on the live server (made once per session); its password."""

    async def make(conn):
        accounts = Accounts(conn)
        try:
            return await accounts.add_operator(name, role)
        except Conflict:
            return await accounts.set_password(name)

    return live_db.run(make)


def log_in(browser, base_url: str, name: str, password: str, console: list[str]) -> Page:
    """A new browser (context) logged in as `name` through the login form, on its inbox,
    listening to the server's hints; `console` collects its errors and CSP violations."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 900})
    context.add_init_script(SSE_PROBE)
    page = context.new_page()
    page.on(
        "console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.goto("/login?next=/inbox")
    page.fill('input[name="name"]', name)
    page.fill('input[name="password"]', password)
    page.click("button.primary")
    expect(page).to_have_url(re.compile(r"/inbox$"))
    page.wait_for_function("() => window.__sse && window.__sse.opened > 0", timeout=5000)
    page.evaluate("window.__samePage = true")  # gone if the page were reloaded
    return page


@pytest.fixture(scope="module")
def alice_password(live_db) -> str:
    return account(live_db, ALICE, "operator")


@pytest.fixture
def alice(browser, base_url, alice_password) -> Iterator[tuple[Page, list[str]]]:
    console: list[str] = []
    page = log_in(browser, base_url, ALICE, alice_password, console)
    yield page, console
    page.context.close()


def item(page: Page, todo_id: str):
    return page.locator(f"#inbox-{todo_id}")


def steps(live_db: LiveDatabase, todo_id: str) -> list[tuple[str, str, str]]:
    return [(s.note, s.actor_kind, s.actor) for s in live_db.history(todo_id)]


def test_alice_sees_a_todo_for_her_arrive_claims_it_and_completes_it_with_a_result(
    alice, agent, live_db, shot
):
    page, console = alice
    todo_id = agent.create_for(ALICE, "Approve refund #42", {"order": 42, "amount": "19.99 EUR"})

    card = item(page, todo_id)
    expect(card).to_be_visible(timeout=5000)  # live: a hint (or the 5 s poll), no reload
    assert page.evaluate("window.__samePage") is True
    expect(card).to_contain_text("Approve refund #42")
    expect(card).to_contain_text(agent.name)  # who asked
    expect(card).to_contain_text('"amount": "19.99 EUR"')  # the facts, to decide on
    expect(page.locator("#inbox-count")).to_have_text(re.compile(r"^[1-9]\d*\+?$"), timeout=12000)
    shot("arrived", page=page)

    card.get_by_role("button", name="Claim").click()
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^(59m|1h 0m)"))  # a person's hour
    expect(page.locator("#action-result")).to_contain_text("is yours for 1h 0m")
    card.get_by_role("button", name="Extend").click()
    expect(page.locator("#action-result")).to_contain_text("from now")

    card.locator('textarea[name="result"]').fill('{"approved": true}')
    shot("completing", page=page)
    waiting = agent.start_waiting(todo_id, 30)  # the agent waits through MCP's wait_for

    async def watched(conn):  # the wait has reached the server: it marked the todo (0011)
        return await eventually(
            lambda: conn.fetchval("SELECT watched FROM todos WHERE id = $1", todo_id), bool, within=10
        )

    live_db.run(watched)
    assert not waiting.done()
    clicked = time.monotonic()
    card.get_by_role("button", name="Complete").click()
    expect(page.locator("#action-result")).to_contain_text("“\u2068Approve refund #42\u2069” is done")
    expect(card).to_have_count(0)

    finished, answered = waiting.result(timeout=10)
    assert (finished["state"], finished["result"]) == ("done", {"approved": True})
    assert answered - clicked < 1.0  # within a second of the click
    assert steps(live_db, todo_id) == [
        ("created", "agent", agent.name),
        ("claimed by id", "operator", ALICE),
        ("completed", "operator", ALICE),  # Extend in between: no step, the row holds it
    ]
    page.goto(f"/todos/{todo_id}")
    timeline = page.locator(".timeline li")
    expect(timeline).to_have_count(3)
    for row, who in zip(range(3), [f"agent {agent.name}", *[f"operator {ALICE}"] * 2], strict=True):
        expect(timeline.nth(row).locator(".actor")).to_have_text(who)
    shot("history", page=page)
    assert csp_violations(console) == [], console


def test_alice_releases_one_todo_and_reassigns_another_from_her_inbox(alice, http_agent, live_db, shot):
    page, console = alice
    bob = unique("bob")
    account(live_db, bob, "operator")
    kept = http_agent.create_for(ALICE, "Call the customer back", {"phone": "+44 20 7946 0000"})
    handed = http_agent.create_for(ALICE, "Check the invoice", {"invoice": "INV-7"})
    expect(item(page, handed)).to_be_visible(timeout=5000)

    item(page, kept).get_by_role("button", name="Claim").click()
    expect(item(page, kept).get_by_role("button", name="Release")).to_be_visible()
    item(page, kept).get_by_role("button", name="Release").click()
    expect(page.locator("#action-result")).to_contain_text("waits in your inbox again")
    expect(item(page, kept).get_by_role("button", name="Claim")).to_be_visible()

    item(page, handed).locator('input[name="assignee"]').fill(bob)
    item(page, handed).get_by_role("button", name="Reassign").click()
    expect(page.locator("#action-result")).to_contain_text(f"handed to {bob}: it is in their inbox now")
    expect(item(page, handed)).to_have_count(0)
    shot(page=page)

    assert live_db.todo(handed).assignee == bob
    assert (live_db.todo(kept).state, live_db.todo(kept).owner) == ("pending", None)
    assert steps(live_db, kept)[-2:] == [
        ("claimed by id", "operator", ALICE),
        ("released", "operator", ALICE),
    ]
    assert steps(live_db, handed)[-1] == (f"edited: assignee {ALICE} → {bob}", "operator", ALICE)
    assert csp_violations(console) == [], console


def test_a_viewer_sees_their_inbox_but_cannot_claim(browser, base_url, agent, live_db, shot):
    viewer = unique("vera")
    password = account(live_db, viewer, "viewer")
    todo_id = agent.create_for(viewer, "Read the contract", {})
    console: list[str] = []
    page = log_in(browser, base_url, viewer, password, console)
    try:
        expect(item(page, todo_id)).to_be_visible()
        expect(item(page, todo_id).locator("button, form")).to_have_count(0)
        expect(page.locator(".hint")).to_contain_text("You are a viewer")
        shot(page=page)
        token = page.evaluate("() => JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken']")
        refused = page.request.post(f"/inbox/{todo_id}/claim", headers={"X-CSRFToken": token})
        assert refused.status == 403
        assert live_db.todo(todo_id).state == "pending"
        assert csp_violations(console) == [], console
    finally:
        page.context.close()


@pytest.mark.parametrize("width", list(WIDTHS))
def test_the_inbox_fits_the_width_without_a_csp_violation(alice, agent, width, shot):
    page, console = alice
    held = agent.create_for(
        ALICE,
        "Approve the refund of order 42 for Ada Lovelace, northern region",
        {
            "order": 42,
            "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
            "reason": "parcel arrived damaged; photos attached in the ticket",
        },
    )
    agent.create_for(ALICE, "Call the customer back", {"phone": "+44 20 7946 0000"})
    expect(item(page, held)).to_be_visible(timeout=5000)
    item(page, held).get_by_role("button", name="Claim").click()
    expect(item(page, held).locator("textarea")).to_be_visible()
    page.set_viewport_size(dict(zip(("width", "height"), WIDTHS[width], strict=True)))
    page.goto("/inbox")
    page.wait_for_function("() => window.__sse && window.__sse.opened > 0", timeout=5000)
    expect(page.locator("#inbox-count")).to_be_attached()

    path = shot(page=page)

    scrolled, inner = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert scrolled <= inner, f"/inbox at {width} is {scrolled} px wide in a {inner} px window ({path})"
    assert csp_violations(console) == [], console


def test_a_refused_completion_shows_beside_the_todo_with_what_was_typed(alice, agent, live_db, shot):
    page, console = alice
    todo_id = agent.create_for(ALICE, "Approve refund #43", {"order": 43})
    card = item(page, todo_id)
    expect(card).to_be_visible(timeout=5000)
    card.get_by_role("button", name="Claim").click()
    card.locator('textarea[name="result"]').fill("refunded by hand")
    live_db.run(lambda conn: Control(conn).force_release(todo_id, Actor("operator", "someone-else")))

    card.get_by_role("button", name="Complete").click()

    expect(card.locator(".inbox-error")).to_contain_text(f"cannot complete todo {todo_id}: it is pending")
    expect(card.locator('textarea[name="result"]')).to_have_count(0)  # no longer held: no form
    expect(card.locator(".inbox-error pre")).to_have_text("refunded by hand")  # but the note is there
    expect(page.locator(".inbox-paused")).to_be_visible()
    expect(page.locator("#action-result")).to_contain_text("cannot complete")  # at the top, too
    shot("refused", page=page)
    assert live_db.todo(todo_id).state == "pending" and live_db.todo(todo_id).result is None
    page.get_by_role("link", name="Dismiss and refresh").click()
    expect(page.locator(".inbox-paused")).to_have_count(0)
    expect(card.get_by_role("button", name="Claim")).to_be_visible()
    assert csp_violations(console) == [], console
