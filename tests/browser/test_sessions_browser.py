"""Sessions end where the server says (issue 9): a cookie saved before logout, replayed in
another browser context, opens nothing."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def test_logout_in_one_browser_context_ends_the_session_for_a_cookie_saved_in_another(
    browser, base_url, operator_account, shot
):
    name, password = operator_account
    first = browser.new_context(base_url=base_url)
    second = browser.new_context(base_url=base_url)
    try:
        page = first.new_page()
        page.goto("/login?next=/tokens")
        page.fill('input[name="name"]', name)
        page.fill('input[name="password"]', password)
        page.click("button.primary")
        expect(page).to_have_url(re.compile(r"/tokens$"))
        expect(page.locator("nav")).to_contain_text("Tokens")
        shot("tokens", page=page)
        saved = first.cookies()
        assert any(c["name"] == "session" for c in saved)

        page.click("text=Log out")
        expect(page).to_have_url(re.compile(r"/login$"))
        shot("logged-out", page=page)

        second.add_cookies(saved)
        other = second.new_page()
        other.goto("/tokens")
        expect(other).to_have_url(re.compile(r"/login\?next=/tokens$"))
        expect(other.locator("form.login-card")).to_be_visible()
    finally:
        first.close()
        second.close()
