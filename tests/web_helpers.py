"""Helpers for the dashboard tests: posting forms as a browser does, and reading pages as a
person would (decoded text, the ids listed, a queue's counts, the flash message)."""

from __future__ import annotations

import html
import re

HX = {"HX-Request": "true"}
XSS_TITLE = '<script>alert("title")</script><img src=x onerror=alert(1)>'
XSS_PAYLOAD = {"html": "<script>alert('payload')</script>", "b": "<b>bold</b>"}


async def post(
    client,
    url: str,
    token: str | None,
    data: dict | None = None,
    *,
    htmx: bool = False,
    headers: dict | None = None,
):
    """A form post as the browser sends it: the CSRF token in the form, or in X-CSRFToken for htmx."""
    data = dict(data or {})
    headers = dict(headers or {})
    if htmx:
        headers.update(HX)
        if token is not None:
            headers["X-CSRFToken"] = token
    elif token is not None:
        data["_csrf_token"] = token
    return await client.post(url, data=data, headers=headers, follow_redirects=False)


async def get_page(client, url: str, **kwargs):
    """GET that must answer 200; the response."""
    response = await client.get(url, **kwargs)
    assert response.status_code == 200, (url, response.status_code, response.text[:500])
    return response


def assert_fragment(response, div_id: str) -> str:
    """An answer to htmx: 200 and the fragment <div id="div_id" …> alone, no page around it."""
    assert response.status_code == 200, response.text[:500]
    assert response.text.lstrip().startswith(f'<div id="{div_id}"'), response.text[:200]
    assert "<html" not in response.text
    return response.text


def text(response) -> str:
    """The body with entities decoded, for reading what a person sees."""
    return html.unescape(response.text)


def ids_in(body: str) -> set[str]:
    """The todos a page links to."""
    return set(re.findall(r'href="/todos/(td_[0-9a-f-]+)"', body))


def queue_row(body: str, queue: str) -> str:
    """The overview's table row of `queue`."""
    match = re.search(rf'<tr[^>]*data-queue="{re.escape(queue)}".*?</tr>', body, re.S)
    assert match, f"no overview row for {queue}"
    return match.group(0)


def count(row_html: str, kind: str) -> int:
    """One count (ready, retrying, claimed, failed) of an overview row."""
    match = re.search(rf'class="count {kind}">(\d+)<', row_html)
    assert match, f"no {kind} count in {row_html}"
    return int(match.group(1))


def field_label(body: str, name: str) -> str:
    """The <label> around the form field `name` (input or textarea)."""
    for match in re.finditer(r"<label\b.*?</label>", body, re.S):
        if re.search(rf'<(input|textarea) name="{name}"', match.group(0)):
            return match.group(0)
    raise AssertionError(f"no field {name}")


def flash_of(body: str) -> str:
    """The flash message's text, or ""."""
    match = re.search(r'<div id="flash"[^>]*>(.*?)</div>', body, re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).strip() if match else ""


def assert_no_stack_trace(response) -> None:
    assert "Traceback" not in response.text
    assert 'File "' not in response.text


async def shown_message(client, response) -> str:
    """What an operator reads after a refused form post: a 409 page, or the flash message on the
    page it is sent back to."""
    if response.status_code == 303:
        return flash_of((await client.get(response.headers["location"])).text)
    assert response.status_code == 409, response.status_code
    assert "<html" in response.text  # a page, with the way back
    assert_no_stack_trace(response)
    return text(response)


def csp_directives(response) -> dict[str, list[str]]:
    """The Content-Security-Policy header, directive by directive."""
    policy = response.headers["content-security-policy"]
    directives = {}
    for part in policy.split(";"):
        name, *values = part.split()
        directives[name] = values
    return directives
