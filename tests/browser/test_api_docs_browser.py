"""The API docs page in a real Chromium with the network outside our origin cut off: the
vendored Swagger UI renders the schema, nothing is fetched from another host, and the
page's Content-Security-Policy (the same as every page's) is never violated."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from playwright.sync_api import expect

from dashboard.accounts import Accounts

pytestmark = pytest.mark.browser


def offline(page, base_url: str) -> list[str]:
    """Abort every request to a host other than the app's own; the URLs that tried."""
    ours = urlsplit(base_url).netloc
    refused: list[str] = []

    def route(r) -> None:
        if urlsplit(r.request.url).netloc == ours:
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return refused


def test_the_api_docs_render_offline_under_the_content_security_policy(page, console, shot, base_url):
    refused = offline(page, base_url)
    loaded: list[str] = []
    page.on("requestfinished", lambda r: loaded.append(r.url))

    answer = page.goto("/api/v1/docs")

    assert answer is not None and answer.status == 200
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("switchboard agent API")
    claim = page.locator(".opblock-summary", has_text="/api/v1/claims").first
    expect(claim).to_be_visible()
    expect(claim).to_contain_text("Claim the next todo")
    claim.click()  # an operation opens: its parameters and responses render too
    expect(page.locator(".opblock.is-open .responses-table").first).to_be_visible()
    # the vendored stylesheet applies: a POST block has Swagger UI's green border
    assert claim.evaluate("e => getComputedStyle(e.parentElement).borderColor") == "rgb(73, 204, 144)"
    page.wait_for_load_state("networkidle")
    shot()

    assert refused == []
    assert loaded and all(urlsplit(u).netloc == urlsplit(base_url).netloc for u in loaded), loaded
    assert any(u.endswith("/openapi.json") for u in loaded), loaded
    assert console == [], "\n".join(console)


def test_trying_an_operation_from_the_docs_stays_on_our_origin_and_within_the_csp(
    page, console, shot, base_url, live_db
):
    refused = offline(page, base_url)
    page.goto("/api/v1/docs#/agents/ClaimNextTodo")
    block = page.locator(".opblock", has=page.locator(".opblock-summary", has_text="/api/v1/claims")).first
    block.locator(".opblock-summary").click()
    block.get_by_role("button", name="Try it out").click()
    with page.expect_response(lambda r: r.url.endswith("/api/v1/claims")) as answer:
        block.get_by_role("button", name="Execute").click()

    assert answer.value.status == 401  # no bearer token: the problem details are shown
    expect(block.locator(".live-responses-table")).to_contain_text("401")
    expect(block.locator(".curl-command")).to_contain_text("/api/v1/claims")

    _, secret = live_db.run(lambda db: Accounts(db).add_token("docs-reader", ["work"]))
    page.locator(".auth-wrapper .authorize").click()  # the bearer scheme in the schema
    page.locator(".modal-ux input").fill(secret)
    page.locator(".modal-ux button.modal-btn.authorize").click()
    page.locator(".modal-ux button.btn-done").click()
    block.locator("textarea.body-param__text").fill('{"queues": ["work"], "ttl": 30}')
    with page.expect_response(lambda r: r.url.endswith("/api/v1/claims")) as answer:
        block.get_by_role("button", name="Execute").click()
    assert answer.value.request.headers["authorization"] == f"Bearer {secret}"
    assert answer.value.status in (200, 204)  # a todo, or nothing ready: the token was taken
    shot()
    assert refused == []
    # Chromium logs the 401 itself as "Failed to load resource"; anything else is a finding
    expected = "status of 401 (Unauthorized) @ {'url': '" + base_url + "/api/v1/claims'"
    assert [m for m in console if expected not in m] == [], "\n".join(console)
