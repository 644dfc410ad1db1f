"""The patterns page: every UI piece renders, styled, under the CSP."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_the_patterns_page_shows_every_ui_piece_without_a_csp_violation(logged_in, console, shot):
    page = logged_in
    page.goto("/patterns")
    for heading in ("State badges and pills", "Messages", "Table", "Form with errors", "History timeline"):
        expect(page.get_by_role("heading", name=heading)).to_be_visible()
    expect(page.locator(".badge.retrying")).to_contain_text("retrying in")
    # the error flash, the error banner and the "select at least one" hint
    expect(page.locator(".flash.error")).to_have_count(3)
    expect(page.locator(".field-error")).to_have_count(2)
    expect(page.locator(".timeline li")).to_have_count(7)
    expect(page.locator(".timeline .actor")).to_have_text(
        ["producer cli", "agent mailer-1", "system reaper", "agent mailer-1", "operator admin"]
        + ["agent mailer-2"] * 2
    )
    # the stylesheet applies: a badge is not an unstyled inline span
    assert page.locator(".badge.failed").first.evaluate("e => getComputedStyle(e).borderRadius") != "0px"
    shot()
    assert [m for m in console if "Content Security Policy" in m or m.startswith("pageerror")] == []


def test_the_login_page_extends_the_base_layout_without_scripts(browser, base_url, shot):
    context = browser.new_context(base_url=base_url)  # not logged in
    page = context.new_page()
    page.goto("/login")
    expect(page).to_have_title("Log in · switchboard")
    expect(page.locator("link[rel=stylesheet][href='/static/app.css']")).to_have_count(1)
    expect(page.locator("script")).to_have_count(0)
    expect(page.locator("header.top")).to_have_count(0)
    shot(page=page)
    context.close()
