"""The operator dashboard's security, through the real app on a fresh database: roles,
CSRF, the login wall, the no-operator 503, the Content-Security-Policy, cookie flags and
escaping of attacker-controlled text.

A refused action is shown to change nothing by comparing every table before and after,
the rollups included, so those tests use the app without its reaper: its rollup job would
write them meanwhile.
"""

from __future__ import annotations

import re

from dashboard.accounts import Accounts
from dashboard.web import pages
from dashboard.web.csrf import CSRFMiddleware
from tests.factories import (
    agent_token,
    claimed,
    dead_letter,
    enqueue,
    history,
    login,
    snapshot,
)
from tests.web_helpers import (
    HX,
    XSS_PAYLOAD,
    XSS_TITLE,
    assert_no_stack_trace,
    csp_directives,
    flash_of,
    post,
    text,
)

# -- security: roles, CSRF, login wall ----------------------------------------------------------------


async def _one_of_everything(store, pool) -> dict:
    token_id, _ = await Accounts(pool).add_token("mailer-1", ["mail"])
    return {
        "dead": await dead_letter(store, pool, "mail"),
        "held": await claimed(store, "mail"),
        "pending": await enqueue(store, "mail", "waiting"),
        "token": token_id,
    }


def _every_action(things: dict) -> list[tuple[str, dict]]:
    dead_id, held_id = things["dead"].id, things["held"].id
    return [
        ("/create", {"queue": "mail", "title": "sneaky", "payload": "{}", "max_attempts": "5"}),
        (f"/todos/{dead_id}/retry", {"budget": "fresh"}),
        (f"/todos/{held_id}/release", {}),
        (f"/todos/{held_id}/release", {"back": "leases"}),
        ("/dead/retry", {"one": dead_id, "budget": "fresh"}),
        ("/dead/retry", {"scope": "selected", "ids": [dead_id], "budget": "fresh"}),
        ("/dead/retry", {"scope": "all", "budget": "one_more"}),
        ("/tokens", {"agent": "sneaky", "queues": "mail"}),
        (f"/tokens/{things['token']}/revoke", {}),
    ]


async def test_a_viewer_gets_403_for_every_action_and_nothing_changes(client_without_reaper, pool, store):
    client = client_without_reaper
    token = await login(client, pool, "vera", "viewer")
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        for htmx in (False, True):
            response = await post(client, url, token, data, htmx=htmx)
            assert response.status_code == 403, (url, htmx)
            assert "viewers can look but not change anything" in response.text
            assert_no_stack_trace(response)

    assert await snapshot(pool) == before


async def test_every_form_action_of_every_page_is_refused_to_a_viewer(client, pool):
    """Whatever page a POST belongs to, it needs an operator: the guard is the pages' own
    router's (dashboard/web/pages/__init__.py), so an action added later has it too."""
    token = await login(client, pool, "vera", "viewer")
    actions = {path for h in pages.HANDLERS if "POST" in h.http_methods for path in h.paths}
    assert len(actions) > 10
    for path in sorted(actions):
        url = re.sub(r"\{\w+:\w+\}", "x", path)
        response = await post(client, url, token)
        assert response.status_code == 403, url
        assert "viewers can look but not change anything" in response.text


async def test_a_viewer_sees_the_pages_without_any_action_buttons(client, pool, store):
    await login(client, pool, "vera", "viewer")
    things = await _one_of_everything(store, pool)

    leases = (await client.get("/leases")).text
    dead_page = (await client.get("/dead")).text
    dead_todo = (await client.get(f"/todos/{things['dead'].id}")).text
    create = (await client.get("/create")).text
    tokens = (await client.get("/tokens")).text

    assert things["held"].id in leases and "Force-release" not in leases
    assert things["dead"].id in dead_page and "Retry selected" not in dead_page
    assert "/retry" not in dead_todo
    assert "Viewers cannot create todos." in create
    assert '<button class="primary">Create</button>' not in create
    assert "/revoke" not in tokens and "Create token" not in tokens


async def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(
    client_without_reaper, pool, store
):
    client = client_without_reaper
    token = await login(client, pool)
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        missing = await post(client, url, None, data)
        forged = await post(client, url, "0" * len(token), data)
        missing_htmx = await post(client, url, None, data, htmx=True)
        for response in (missing, forged, missing_htmx):
            assert response.status_code == 403, url
            assert "CSRF" in response.text
            assert_no_stack_trace(response)

    assert await snapshot(pool) == before


async def test_logging_out_needs_the_csrf_token_too(client, pool):
    token = await login(client, pool)
    assert (await post(client, "/logout", None)).status_code == 403
    assert (await client.get("/", follow_redirects=False)).status_code == 200  # still logged in
    response = await post(client, "/logout", token)
    assert response.status_code == 303
    assert (await client.get("/", follow_redirects=False)).status_code == 303


# Routes no browser session reaches: bearer tokens (the agent API, /mcp) or nothing at all.
WITHOUT_COOKIES = ("/api/", "/mcp", "/healthz", "/readyz", "/metrics", "/static")


async def test_the_csrf_check_covers_every_dashboard_route_and_none_without_cookies(app):
    """The middleware sits on the dashboard's routers only (app.py): a dashboard route added
    outside them would go unchecked, and the agent API would pay for a check it never needs."""
    covered: dict[str, bool] = {}
    for route in app.routes:
        handlers = getattr(route, "route_handlers", None) or [route.route_handler]
        for handler in handlers:
            checked = any(isinstance(m, CSRFMiddleware) for m in handler.resolve_middleware())
            covered[route.path] = covered.get(route.path, checked) and checked
    assert covered["/login"] and covered["/logout"] and covered["/todos/{todo_id:str}/retry"]
    assert not covered["/api/v1/claims"] and not covered["/api/v1/todos/{todo_id:str}/complete"]
    wrong = {path for path, checked in covered.items() if checked == path.startswith(WITHOUT_COOKIES)}
    assert not wrong, wrong


PAGES = [
    "/",
    "/queues/mail",
    "/leases",
    "/dead",
    "/create",
    "/tokens",
    "/todos/{id}",
    "/partials/overview",
    "/partials/queues/mail",
    "/partials/leases",
    "/partials/dead",
    "/partials/todos/{id}",
    "/events",
]


async def test_anonymous_requests_to_every_page_are_sent_to_the_login_page(client, pool, store):
    await Accounts(pool).add_operator("olga", "operator")
    todo = await enqueue(store, "mail")

    for path in (p.format(id=todo.id) for p in PAGES):
        response = await client.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"] == f"/login?next={path}", path


async def test_anonymous_actions_change_nothing(client_without_reaper, pool, store):
    client = client_without_reaper
    await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    token = client.cookies.get("csrftoken")
    things = await _one_of_everything(store, pool)
    before = await snapshot(pool)

    for url, data in _every_action(things):
        response = await post(client, url, token, data)
        assert response.status_code == 303, url
        assert response.headers["location"].startswith("/login?next="), url
        fragment = await post(client, url, token, data, htmx=True)
        assert fragment.headers["hx-redirect"].startswith("/login"), url

    assert await snapshot(pool) == before


async def test_an_anonymous_htmx_request_gets_a_redirect_htmx_can_act_on(client, pool):
    await Accounts(pool).add_operator("olga", "operator")
    response = await client.get("/partials/overview", headers=HX, follow_redirects=False)
    assert response.headers.get("hx-redirect", "").startswith("/login")
    assert not 300 <= response.status_code < 400


async def test_logging_in_goes_to_the_page_asked_for_but_never_off_site(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login?next=/leases")
    csrf = client.cookies.get("csrftoken")

    wrong = await client.post(
        "/login",
        data={"name": "olga", "password": "nope", "next": "/leases", "_csrf_token": csrf},
        follow_redirects=False,
    )
    assert wrong.status_code == 401
    assert "do not match an operator" in text(wrong)

    for target, landing in [("/leases", "/leases"), ("//evil.example/x", "/"), ("https://evil.example", "/")]:
        response = await client.post(
            "/login",
            data={"name": "olga", "password": password, "next": target, "_csrf_token": csrf},
            follow_redirects=False,
        )
        assert response.status_code == 303
        assert response.headers["location"] == landing, target
        csrf = client.cookies.get("csrftoken")  # each login renews the token


async def test_with_no_operator_account_the_dashboard_is_a_503_saying_how_to_make_one(client, pool, store):
    todo = await enqueue(store, "mail")
    for path in (p.format(id=todo.id) for p in PAGES):
        response = await client.get(path, follow_redirects=False)
        assert response.status_code == 503, path
        assert "switchboard operator add NAME --role operator" in response.text
        assert "no operator account" in response.text

    await Accounts(pool).add_operator("olga", "operator")  # then it serves the login wall
    assert (await client.get("/", follow_redirects=False)).status_code == 303


# -- security: headers, cookies, escaping ---------------------------------------------------------------


async def test_every_response_forbids_inline_script_in_its_content_security_policy(client, pool, store):
    no_operator = await client.get("/")
    await login(client, pool)
    todo = await enqueue(store, "mail")
    responses = [no_operator, await client.get("/login")]
    responses += [await client.get(p.format(id=todo.id)) for p in PAGES if p != "/events"]
    responses += [await client.get("/todos/td_nope"), await client.get("/queues/BAD!")]

    for response in responses:
        directives = csp_directives(response)
        scripts = directives.get("script-src", directives.get("default-src"))
        assert scripts == ["'self'"], response.url
        assert "'unsafe-inline'" not in directives.get("default-src", [])
        assert response.headers["x-content-type-options"] == "nosniff"
        # and the HTML needs none: every script is a file, no inline event handlers
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", response.text), response.url
        assert not re.search(r"\son[a-z]+\s*=", response.text, re.I), response.url
    assert (await client.get("/healthz")).headers["content-security-policy"]


async def test_the_api_docs_page_has_the_same_csp_and_names_nothing_on_another_origin(client):
    response = await client.get("/api/v1/docs")

    assert response.status_code == 200
    directives = csp_directives(response)
    assert directives["script-src"] == ["'self'"] and directives["style-src"] == ["'self'"]
    assert "'unsafe-inline'" not in response.headers["content-security-policy"]
    page = response.text
    assert not re.search(r'https?://|="//', page)  # no absolute or protocol-relative URL at all
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    assert not re.search(r"<style|\sstyle\s*=|\son[a-z]+\s*=", page, re.I)
    # every script and stylesheet it names is ours, and is there
    assets = re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+)"', page)
    assert len(assets) == 4, assets  # icon, Swagger UI's css and bundle, static/api-docs.js
    for url in assets:
        assert url.startswith("/static/"), url
        assert (await client.get(url)).status_code == 200, url
    spec = re.search(r'data-spec-url="([^"]+)"', page).group(1)
    assert (await client.get(spec)).json()["info"]["title"] == "switchboard agent API"


async def test_the_csrf_refusal_page_carries_the_content_security_policy_too(client, pool):
    await login(client, pool)
    response = await post(client, "/create", None, {"queue": "mail", "title": "t"})
    assert response.status_code == 403
    assert "<script src=" in response.text  # a whole page, with the app's scripts
    assert "script-src 'self'" in response.headers.get("content-security-policy", "")
    assert response.headers.get("x-frame-options") == "DENY"


async def test_the_session_and_csrf_cookies_are_httponly_and_samesite(client, pool):
    password = await Accounts(pool).add_operator("olga", "operator")
    first = await client.get("/login")
    csrf = client.cookies.get("csrftoken")
    response = await client.post(
        "/login", data={"name": "olga", "password": password, "_csrf_token": csrf}, follow_redirects=False
    )

    cookies = {
        c.split("=", 1)[0]: c.lower()
        for c in response.headers.get_list("set-cookie") + first.headers.get_list("set-cookie")
    }
    assert "session" in cookies and "csrftoken" in cookies
    for name, cookie in cookies.items():
        assert "httponly" in cookie, name
        assert re.search(r"samesite=(strict|lax)", cookie), name


async def test_attacker_controlled_text_is_escaped_on_every_page(client, pool, store):
    await login(client, pool)
    fields = {
        "payload": XSS_PAYLOAD,
        "kind": "<b>kind</b>",
        "assignee": "<i>agent</i>",
        "idempotency_key": "<u>key</u>",
    }
    pending = await enqueue(store, "mail", XSS_TITLE, **fields)
    held = await claimed(store, "mail", XSS_TITLE)
    died = await dead_letter(store, pool, "mail", XSS_TITLE, error="<script>alert('error')</script>")

    pages = [
        await client.get(u)
        for u in (
            "/queues/mail",
            f"/todos/{pending.id}",
            f"/todos/{held.id}",
            f"/todos/{died.id}",
            "/leases",
            "/dead",
            "/partials/leases",
            "/partials/dead",
            f"/partials/todos/{pending.id}",
            "/partials/queues/mail",
        )
    ]

    for response in pages:
        assert response.status_code == 200
        body = response.text
        assert "<script>alert" not in body, response.url
        assert "<img src=x" not in body and "<b>" not in body and "<i>agent" not in body, response.url
        assert "&lt;script&gt;alert(" in body, response.url  # shown, as text
    detail = text(pages[1])
    assert XSS_TITLE in detail and "<script>alert('payload')</script>" in detail and "<u>key</u>" in detail
    assert "<script>alert('error')</script>" in text(pages[3])


async def test_a_login_name_with_markup_is_escaped_in_the_login_form(client, pool):
    await Accounts(pool).add_operator("olga", "operator")
    await client.get("/login")
    csrf = client.cookies.get("csrftoken")
    response = await client.post(
        "/login", data={"name": '"><script>alert(1)</script>', "password": "x", "_csrf_token": csrf}
    )
    assert response.status_code == 401
    assert "<script>alert(1)</script>" not in response.text
    assert "&lt;script&gt;" in response.text


async def test_the_created_flash_escapes_the_title(client, pool):
    token = await login(client, pool)
    await post(
        client, "/create", token, {"queue": "mail", "title": XSS_TITLE, "payload": "{}", "max_attempts": "5"}
    )
    page = await client.get("/queues/mail")
    assert XSS_TITLE in flash_of(page.text)
    assert "<script>alert" not in page.text


# -- actors: an agent's rows say agent, an operator's say operator --------------------------------


async def test_an_agent_token_only_ever_writes_agent_rows_and_an_operators_retry_writes_an_operator_row(
    client, pool
):
    csrf = await login(client, pool, "olga")
    mallory = await agent_token(pool, "mallory", ["mail"])
    api = "/api/v1"

    async def call(path: str, body: dict, status: int = 200) -> dict:
        response = await client.post(f"{api}{path}", headers=mallory, json=body)
        assert response.status_code == status, response.text
        return response.json()

    doomed = (await call("/todos", {"queue": "mail", "title": "doomed", "max_attempts": 1}, 201))["todo"]
    batch = await call(
        "/todos/batch", {"todos": [{"queue": "mail", "title": "a"}, {"queue": "mail", "title": "b"}]}
    )
    [a, b] = [r["todo"] for r in batch["results"]]
    held = await call("/claims", {"queues": ["mail"], "ttl": 30})
    assert held["id"] == doomed["id"]
    await call(f"/todos/{held['id']}/heartbeat", {"lease": held["lease"], "ttl": 30})
    await call(
        f"/todos/{held['id']}/fail", {"lease": held["lease"], "error": "retried by operator: fresh budget"}
    )
    held = await call(f"/todos/{a['id']}/claim", {"ttl": 30})
    await call(f"/todos/{a['id']}/release", {"lease": held["lease"]})
    held = await call("/claims", {"queues": ["mail"], "ttl": 30})
    done = await call(
        f"/todos/{held['id']}/complete", {"lease": held["lease"], "next": {"queues": ["mail"], "ttl": 30}}
    )
    await call(f"/todos/{done['next']['id']}/complete", {"lease": done["next"]["lease"]})

    ids = [doomed["id"], a["id"], b["id"]]
    rows = [step for todo_id in ids for step in await history(pool, todo_id)]
    assert len(rows) == 3 + 8  # the heartbeat writes none: the row holds it
    assert {(r.actor_kind, r.actor) for r in rows} == {("agent", "mallory")}

    response = await post(client, f"/todos/{doomed['id']}/retry", csrf, {"budget": "fresh"})
    assert response.status_code == 303, response.text
    steps = await history(pool, doomed["id"])
    assert steps[-1] == ("failed", "pending", "operator", "olga", 0, "retried by operator: fresh budget")
    assert [s for s in steps if s.actor_kind == "operator"] == steps[-1:]
    detail = await client.get(f"{api}/todos/{doomed['id']}", headers=mallory)
    said = [(h["actor_kind"], h["actor"]) for h in detail.json()["history"]]
    assert said == [("agent", "mallory")] * 3 + [("operator", "olga")]
