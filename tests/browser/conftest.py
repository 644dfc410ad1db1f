"""Playwright against the shared `switchboard serve` subprocess (tests/conftest.py's live_server).

Debian's /usr/bin/chromium is launched through pytest-playwright's launch-args fixture
(never `playwright install`); page.goto("/") is relative to the live server. Each test
gets a console recorder (CSP violations show up there) and a screenshot helper; every test
leaves at least its final screenshot in test-artifacts/screenshots/, named after it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.models import Todo
from dashboard.store import Store
from tests.conftest import ROOT
from tests.factories import Step, claimed, dead_letter, enqueue, history, todo_row

SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
OPERATOR = "pw-olga"

# Counts EventSource openings and the hub's "resync" events, so a test can wait until the
# page is really listening (and see that a lost LISTEN connection was reported). Init
# scripts are injected by the browser itself, outside the page's CSP.
SSE_PROBE = """
(() => {
  const Original = window.EventSource;
  window.__sse = {opened: 0, resyncs: 0, refreshes: 0};
  function Probed(url, config) {
    const source = new Original(url, config);
    source.addEventListener("open", () => { window.__sse.opened += 1; });
    source.addEventListener("resync", () => { window.__sse.resyncs += 1; });
    source.addEventListener("refresh", () => { window.__sse.refreshes += 1; });
    return source;
  }
  Probed.prototype = Original.prototype;
  Probed.CONNECTING = Original.CONNECTING;
  Probed.OPEN = Original.OPEN;
  Probed.CLOSED = Original.CLOSED;
  window.EventSource = Probed;
  document.addEventListener("securitypolicyviolation", (e) => {
    console.error(`Content Security Policy violation: ${e.violatedDirective} by ${e.sourceFile}:` +
                  `${e.lineNumber}:${e.columnNumber} sample ${JSON.stringify(e.sample)}`);
  });
})();
"""


def in_thread(coro: Coroutine) -> Any:
    """Run a coroutine from a sync Playwright test (which must not start an event loop itself)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def on_database(dsn: str, work: Callable[[Any], Coroutine]) -> Any:
    """work(conn) on a fresh connection to the live server's database, in a helper thread."""

    async def run():
        conn = await dbmod.connect(dsn)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return in_thread(run())


def pytest_collection_modifyitems(session, config, items):
    """Browser tests run last. Once the sync Playwright API has started (it stays up for the
    session), this thread counts as running an event loop, so any async test or asyncio.run()
    after it would fail; pytest would otherwise collect tests/browser/ first."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": "/usr/bin/chromium",
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--disable-sync",
        ],
    }


@pytest.fixture(scope="session")
def base_url(live_server):
    return live_server[0]


@pytest.fixture(scope="session")
def live_dsn(live_server) -> str:
    return live_server[1]


@pytest.fixture(scope="session")
def operator_account(live_dsn) -> tuple[str, str]:
    """(name, password) of an operator on the live server."""
    return OPERATOR, on_database(live_dsn, lambda conn: Accounts(conn).add_operator(OPERATOR, "operator"))


@pytest.fixture(scope="session", autouse=True)
def _live_server_before_playwright(live_server, operator_account):
    """The live server (and its database) are made with asyncio.run in this thread, which the
    sync Playwright API forbids once it has started: so they come first."""
    return live_server


@pytest.fixture
def console(page) -> list[str]:
    """Everything the page logged as an error or warning, uncaught page errors, and every CSP
    violation (with its directive and source). Also installs the SSE probe above."""
    messages: list[str] = []
    page.on(
        "console",
        lambda m: (
            messages.append(f"{m.type}: {m.text} @ {m.location}") if m.type in ("error", "warning") else None
        ),
    )
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    page.add_init_script(SSE_PROBE)
    return messages


@pytest.fixture
def shot(request) -> Callable[..., Path]:
    """shot("label") saves test-artifacts/screenshots/<test>-<label>.png of the test's page (or of
    `page=`, which then becomes the test's page); at the end the final one is <test>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name).strip("_")
    current = {"page": request.getfixturevalue("page") if "page" in request.fixturenames else None}

    def take(label: str | None = None, page=None) -> Path:
        current["page"] = page or current["page"]
        path = SCREENSHOTS / (f"{name}-{label}.png" if label else f"{name}.png")
        # caret="initial": hiding the caret leaves style="" on inputs, which htmx would then copy
        # onto swapped-in elements (a style-src-attr CSP violation caused by the test, not the app)
        current["page"].screenshot(path=str(path), full_page=True, caret="initial")
        return path

    yield take
    if current["page"] is not None and not current["page"].is_closed():
        take()


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args, base_url, operator_account):
    """Every browser context starts logged in as the operator (one login over HTTP for the
    session, instead of one through the form per test)."""
    import httpx

    name, password = operator_account
    with httpx.Client(base_url=base_url) as http:
        http.get("/login")
        answer = http.post(
            "/login", data={"name": name, "password": password, "_csrf_token": http.cookies["csrftoken"]}
        )
        assert answer.status_code == 303, answer.text
        cookies = [
            {
                "name": c.name,
                "value": c.value,
                "domain": "127.0.0.1",
                "path": "/",
                "expires": -1,
                "httpOnly": True,
                "secure": False,
                "sameSite": "Strict",
            }
            for c in http.cookies.jar
        ]
    return {**browser_context_args, "storage_state": {"cookies": cookies, "origins": []}}


@pytest.fixture
def logged_in(page, console, shot):
    """The page, logged in as the live server's operator, on the overview."""
    page.goto("/")
    expect(page.locator(".who")).to_contain_text(OPERATOR)
    return page


@pytest.fixture
def listening(page) -> Callable[[], None]:
    """listening(): wait until the page's Server-Sent Events stream is open."""

    def wait() -> None:
        page.wait_for_function("() => window.__sse && window.__sse.opened > 0", timeout=5000)

    return wait


class LiveDatabase:
    """The live server's database, driven from another connection as an agent or producer would."""

    def __init__(self, dsn: str):
        self.dsn = dsn

    def run(self, work: Callable[[Any], Coroutine]) -> Any:
        return on_database(self.dsn, work)

    def enqueue(self, queue: str, title: str, **fields) -> Todo:
        return self.run(lambda conn: enqueue(Store(conn), queue, title, **fields))

    def claimed(self, queue: str, title: str, *, owner: str = "agent-7", ttl: float = 300, **fields) -> Todo:
        return self.run(lambda conn: claimed(Store(conn), queue, title, owner=owner, ttl=ttl, **fields))

    def dead(self, queue: str, title: str, *, error: str = "boom", **fields) -> Todo:
        return self.run(
            lambda conn: dead_letter(Store(conn), conn, queue, title, owner="agent-1", error=error, **fields)
        )

    def todo(self, todo_id: str) -> Todo:
        return self.run(lambda conn: todo_row(conn, todo_id))

    def history(self, todo_id: str) -> list[Step]:
        return self.run(lambda conn: history(conn, todo_id))


@pytest.fixture(scope="session")
def live_db(live_dsn) -> LiveDatabase:
    return LiveDatabase(live_dsn)
