"""The overview's warning that vacuum is held back, in a real Chromium against `switchboard
serve`: it appears within one refresh of a transaction passing the threshold (the live
server runs with SWITCHBOARD_HORIZON_WARN_SECONDS=3, tests/conftest.py) and goes away
within one refresh of its end."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

import asyncpg
import pytest
from playwright.sync_api import expect

from tests.browser.test_dashboard_browser import csp_violations
from tests.conftest import LIVE_HORIZON_WARN_SECONDS

pytestmark = pytest.mark.browser

REFRESH = 3 + 1  # the overview polls every 3 s; the horizon is read at most once a second


@contextmanager
def held_transaction(dsn: str, application: str):
    """A REPEATABLE READ transaction with its snapshot taken, idle, kept open by a thread of
    its own (the sync Playwright API owns this one's event loop) until the block ends."""
    opened, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    async def hold() -> None:
        conn = await asyncpg.connect(dsn, server_settings={"application_name": application})
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await conn.fetchval("SELECT count(*) FROM todos")
            opened.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait)
        finally:
            await conn.close()

    def run() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:  # reported to the test below
            failure.append(exc)
            opened.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert opened.wait(10) and not failure, failure
        yield
    finally:
        done.set()
        thread.join(10)


def test_the_overview_warns_while_a_transaction_holds_back_vacuum(logged_in, live_dsn, console, shot):
    page = logged_in
    warning = page.locator("#horizon-warning")
    expect(warning).to_have_count(0)

    with held_transaction(live_dsn, "quarterly report"):
        expect(warning).to_be_visible(timeout=(LIVE_HORIZON_WARN_SECONDS + REFRESH) * 1000)
        expect(warning).to_contain_text("Vacuum is held back")
        expect(warning).to_contain_text("'quarterly report'")
        expect(warning).to_contain_text("idle in transaction")
        expect(warning).to_contain_text("pg_terminate_backend(")
        shot("held")

    expect(warning).to_have_count(0, timeout=REFRESH * 1000)
    assert csp_violations(console) == [], "\n".join(console)
