"""The rough edges a new operator found (issue 13, item 6), each kept fixed: forms that
report every error in words, a bulk action with nothing ticked, filters PostgreSQL
cannot take, unknown queues and query parameters, times without milliseconds, earlier
attempts' errors, the viewer's menu and create page, the favicon, the "new work" line.

One app and one database for the module (emptied before each test), logged in as an
operator; each test uses its own queue names. The browser halves (the page's script, the
CSP, the layout at 390 px) are in tests/browser/test_rough_edges_browser.py.
"""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import msgspec
import pytest
import pytest_asyncio

from dashboard.durations import ago, duration
from dashboard.reads import QueueStats
from dashboard.web.pages.overview import TOTALS
from tests.conftest import ONE_DATABASE_PER_MODULE, build_app, in_process
from tests.factories import (
    agent_token,
    claimed,
    dead_letter,
    enqueue,
    login,
    make_retry_due,
    retrying,
    todo_row,
    unique,
)
from tests.web_helpers import field_label, flash_of, get_page, post, text

pytestmark = ONE_DATABASE_PER_MODULE


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(module_dsn, module_pool):
    """The real app in process (no reaper: tests move time by SQL), logged in as olga;
    yields (client, CSRF token)."""
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        yield client, await login(client, module_pool, "olga")


@pytest.fixture
def queue() -> str:
    return unique("re")


CREATE_FORM = {"queue": "", "title": "", "kind": "k", "assignee": "sam", "max_attempts": "5", "payload": "{}"}


def errors_of(body: str) -> dict[str, str]:
    """The field errors a form shows, by field name (each inside the field's label)."""
    found = {}
    for name in re.findall(r'<(?:input|textarea|select) name="(\w+)"', body):
        label = field_label(body, name)
        match = re.search(r'class="field-error"[^>]*>(.*?)</span>', label, re.S)
        if match:
            found[name] = text_of(match.group(1))
    return found


def text_of(fragment: str) -> str:
    """A fragment's text as read: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


# -- 1. every error of the create form at once, in words ----------------------------------------


async def test_creating_with_queue_and_title_empty_shows_both_errors_in_words(web):
    client, token = web
    response = await post(client, "/create", token, CREATE_FORM)

    assert response.status_code == 422
    assert errors_of(response.text) == {"queue": "Queue is required.", "title": "Title is required."}
    assert "'' is not a queue name" not in text(response)
    assert 'value="sam"' in response.text  # what was typed is kept


async def test_every_bad_field_of_the_create_form_is_reported_at_once(web, module_pool):
    client, token = web
    form = {**CREATE_FORM, "queue": "Mail Queue!", "max_attempts": "three", "payload": "[1, 2]"}

    response = await post(client, "/create", token, form)

    errors = errors_of(response.text)
    assert set(errors) == {"queue", "title", "max_attempts", "payload"}
    assert errors["queue"] == (
        "'Mail Queue!' is not a queue name: queue names use lowercase letters, digits, '.', '_' and '-', "
        "up to 63 characters, starting with a letter or digit."
    )
    assert errors["max_attempts"] == "Max attempts must be a whole number from 1 to 100."
    assert errors["payload"] == "Payload must be a JSON object."
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


# -- 2. a payload nested too deeply -------------------------------------------------------------


async def test_a_too_deeply_nested_payload_is_an_inline_error_with_the_values_kept(web, module_pool, queue):
    client, token = web
    deep = "[" * 100_000 + "]" * 100_000
    form = {**CREATE_FORM, "queue": queue, "title": "Keep me", "payload": deep}

    response = await post(client, "/create", token, form)

    assert response.status_code == 422  # the form again, not a bare 400 page
    assert errors_of(response.text) == {
        "payload": "Payload is nested too deeply (JSON arrays and objects inside each other)."
    }
    assert 'value="Keep me"' in response.text and f'value="{queue}"' in response.text
    assert deep in response.text  # the payload as typed
    assert '<header class="top">' in response.text and "olga" in response.text  # the whole page
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


# -- 3. the tokens form -------------------------------------------------------------------------


async def test_the_tokens_form_keeps_the_values_and_reports_every_error(web, module_pool):
    client, token = web
    response = await post(client, "/tokens", token, {"agent": "mailer 1", "queues": "emails, Bad!"})

    assert response.status_code == 422
    errors = errors_of(response.text)
    assert set(errors) == {"agent", "queues"}
    assert errors["agent"].startswith("'mailer 1' is not a name: names use letters, digits")
    assert errors["queues"].startswith("'Bad!' is not a queue name")
    assert 'value="mailer 1"' in response.text and 'value="emails, Bad!"' in response.text
    assert await module_pool.fetchval("SELECT count(*) FROM api_tokens") == 0

    empty = await post(client, "/tokens", token, {"agent": "", "queues": ""})
    assert errors_of(empty.text) == {
        "agent": "Agent is required.",
        "queues": "Queues must name at least one queue.",
    }


async def test_a_token_for_a_queue_with_no_todo_yet_is_made_with_a_warning(web, module_store, queue):
    client, token = web
    await enqueue(module_store, queue)
    fresh = unique("typo")

    response = await post(client, "/tokens", token, {"agent": "mailer-1", "queues": f"{queue},{fresh}"})

    assert response.status_code == 200
    assert "sbt_" in response.text  # made: the new secret is shown
    warning = re.search(r'<p class="flash info" id="unknown-queues">(.*?)</p>', response.text, re.S)
    assert warning and f"No todo has been in queue {fresh} yet" in text_of(warning.group(1))
    assert queue not in text_of(warning.group(1))

    known = await post(client, "/tokens", token, {"agent": "mailer-2", "queues": queue})
    assert 'id="unknown-queues"' not in known.text


# -- 4. a bulk action with nothing ticked -------------------------------------------------------


async def test_retry_selected_with_nothing_ticked_says_select_at_least_one(
    web, module_store, module_pool, queue
):
    client, token = web
    died = await dead_letter(module_store, module_pool, queue)

    answer = await post(client, "/dead/retry", token, {"scope": "selected", "queue": queue}, htmx=True)

    assert answer.status_code == 200  # the list again, with the message beside it
    assert flash_of(answer.text) == (
        "Select at least one dead-letter (tick its box), or choose all that match the filter."
    )
    # not the validation error it once was ("422 Invalid input: ids: …"), which names no queue
    assert "Invalid input" not in answer.text and "ids:" not in answer.text
    assert (await todo_row(module_pool, died.id)).state == "failed"


async def test_the_bulk_buttons_tell_the_page_script_when_they_need_a_selection(
    web, module_store, module_pool, queue
):
    client, _ = web
    await enqueue(module_store, queue)
    await dead_letter(module_store, module_pool, queue)

    todos = (await get_page(client, f"/queues/{queue}")).text
    dead = (await get_page(client, f"/dead?queue={queue}")).text

    assert 'data-selection-scope="scope"' in todos  # the form: its "scope" select decides
    assert re.search(r"<button[^>]*data-needs-selection[^>]*>Retry selected</button>", dead, re.S)
    assert 'data-selection-scope="bulk_scope"' in dead
    for body, noun in ((todos, "todo"), (dead, "dead-letter")):
        assert re.search(rf'class="selection-hint[^"]*"[^>]*hidden>Select at least one {noun}\b', body)


# -- 5. htmx is told not to add inline styles ---------------------------------------------------


async def test_htmx_is_configured_to_add_no_inline_style_and_the_indicator_css_is_in_the_stylesheet(web):
    client, _ = web
    body = (await get_page(client, "/")).text
    config = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", body).group(1)
    assert '"includeIndicatorStyles": false' in config
    assert '"attributesToSettle": ["class", "width", "height"]' in config  # never a style attribute
    css = (await client.get("/static/app.css")).text
    assert ".htmx-request .htmx-indicator" in css


# -- 6. input PostgreSQL cannot take --------------------------------------------------------------


@pytest.mark.parametrize("field", ["assignee", "owner", "kind", "q"])
async def test_a_nul_in_a_filter_is_an_inline_error_beside_it(web, queue, field):
    client, _ = web
    response = await client.get(f"/queues/{queue}", params={field: "a\x00b", "state": "ready"})

    assert response.status_code == 422
    body = text(response)
    assert "PostgreSQL" not in body and "invalid byte sequence" not in body
    label = re.search(rf'<label\b(?:(?!</label>).)*? name="{field}".*?</label>', response.text, re.S).group(0)
    assert 'aria-invalid="true"' in label and "must not contain a NUL character (a zero byte)" in text_of(
        label
    )
    assert re.search(r'<option value="ready"\s+selected', response.text)  # the other filters kept
    assert '<header class="top">' in response.text


async def test_a_nul_in_the_cursor_is_not_a_cursor_not_a_database_error(web, queue):
    import base64

    client, _ = web
    cursor = base64.urlsafe_b64encode(b"2026-01-01T00:00:00+00:00|td\x00x").decode().rstrip("=")
    response = await client.get(f"/queues/{queue}", params={"after": cursor})
    assert response.status_code == 422
    assert "is not a cursor this server gave out" in text(response)
    assert "PostgreSQL" not in text(response)


async def test_the_api_answers_a_nul_in_a_filter_with_a_422_naming_the_field(web, module_pool, queue):
    client, _ = web
    headers = await agent_token(module_pool, "bot", [queue])
    response = await client.get("/api/v1/todos", params={"queue": queue, "assignee": "\x00"}, headers=headers)
    assert response.status_code == 422
    body = response.json()
    assert body["field"] == "assignee" and "NUL character" in body["detail"]


async def test_a_nul_in_a_login_name_is_a_failed_login_not_a_database_error(module_dsn, module_pool):
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as anonymous:
        await anonymous.get("/login")
        form = {"name": "ol\x00ga", "password": "x", "_csrf_token": anonymous.cookies.get("csrftoken")}
        response = await anonymous.post("/login", data=form, follow_redirects=False)
    assert response.status_code == 401
    assert "That name and password do not match an operator." in text(response)


# -- 7. unknown queues and unknown query parameters ---------------------------------------------


async def test_a_queue_that_never_had_a_todo_says_so(web, module_store, queue):
    client, _ = web
    never = (await get_page(client, f"/queues/{unique('nobody')}")).text
    assert "has never had a todo" in text_of(never)

    await enqueue(module_store, queue)
    filtered = (await get_page(client, f"/queues/{queue}?state=claimed")).text
    assert "No todos match." in filtered and "has never had a todo" not in filtered


@pytest.mark.parametrize(
    ("path", "takes"),
    [
        ("/", ()),
        ("/queues/mail", ("after", "assignee", "kind", "owner", "q", "state")),
        ("/partials/queues/mail", ("after", "assignee", "kind", "owner", "q", "state")),
        ("/leases", ()),
        ("/dead", ("after", "cancelled", "queue")),
        ("/create", ("queue",)),
        ("/tokens", ()),
    ],
)
async def test_an_unknown_query_parameter_is_a_400_naming_what_the_page_takes(web, path, takes):
    client, _ = web
    response = await client.get(path, params={"cursor": "x"})
    assert response.status_code == 400
    detail = re.search(r"This page does not know the parameter 'cursor' \(it takes ([^)]*)\)", text(response))
    assert detail, text(response)
    named = detail.group(1).split(", ")
    assert set(takes) <= set(named) and "cursor" not in named  # pages may take more (a chart's range)


async def test_the_parameters_a_page_takes_are_accepted(web, queue):
    client, _ = web
    for path in (
        f"/queues/{queue}?state=ready&assignee=a&owner=o&kind=k&q=x",
        "/dead?queue=mail&cancelled=hide",
    ):
        assert (await client.get(path)).status_code == 200, path


async def test_an_unknown_parameter_does_not_stop_the_login_redirect(module_dsn, module_pool):
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as anonymous:
        response = await anonymous.get("/queues/mail?cursor=x", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"].startswith("/login")


# -- 8. numbers and times as people read them ---------------------------------------------------


async def test_the_overview_total_beside_the_bars_is_the_sum_of_the_bars(web):
    """Drawn from a made-up row: where the per-minute figures come from is the rollups' business."""
    client, _ = web
    required = {f.name: 0 for f in msgspec.structs.fields(QueueStats) if f.required}
    row = QueueStats(**{**required, "queue": "mail", "throughput": [0] * 12 + [2, 3, 0]})
    context = {"stats": [row], "totals": dict.fromkeys(TOTALS, 0), "approximate": set()}

    html_ = client.app.template_engine.get_template("partials/overview.html").render(
        **context, horizon=SimpleNamespace(held_back=False)
    )

    cell = re.search(r'<span class="spark".*?</small>', html_, re.S).group(0)
    assert "5 in 15 min" in cell and "/min" not in cell
    assert len(re.findall(r'<i class="h[1-8]">', cell)) == 2  # the two bars the 5 are in


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.752, "in under a second"), (-0.4, "just now"), (1.4, "in 1s"), (-61, "1m 1s ago")],
)
async def test_relative_times_never_show_milliseconds(seconds, shown):
    now = datetime(2026, 12, 4, tzinfo=UTC)
    assert ago(now + timedelta(seconds=seconds), now) == shown
    assert "ms" not in duration(abs(seconds))


async def test_a_done_row_shows_the_earlier_attempts_error_muted_not_in_red(
    web, module_store, module_pool, queue
):
    client, _ = web
    todo = await claimed(module_store, queue, max_attempts=3)
    await module_store.fail(todo.id, todo.owner, todo.lease_token, "smtp timeout")
    await make_retry_due(module_pool, todo.id)
    todo = await module_store.claim(todo.id, "w2", 30)
    await module_store.complete(todo.id, "w2", todo.lease_token, {})

    row = re.search(
        rf'<tr data-todo="{todo.id}">.*?</tr>', (await get_page(client, f"/queues/{queue}")).text, re.S
    )
    detail = (await get_page(client, f"/todos/{todo.id}")).text

    shown = '<td class="last-error muted">earlier attempt: <bdi>smtp timeout</bdi></td>'
    assert row and shown in row.group(0)
    assert "error-text" not in row.group(0)
    assert "An earlier attempt's error" in detail and '<pre class="error-text">' not in detail


async def test_a_retrying_todo_says_when_it_failed_and_when_it_retries_not_claimed(
    web, module_store, module_pool, queue
):
    client, _ = web
    todo = await retrying(module_store, module_pool, queue)

    body = (await get_page(client, f"/todos/{todo.id}")).text

    attempt = text_of(re.search(r'<dd id="last-attempt">(.*?)</dd>', body, re.S).group(1))
    assert re.fullmatch(
        r"failed (just now|\d+s ago), retrying in (59m( \d+s)?|1h 0m)", " ".join(attempt.split())
    )
    assert "<dt>Claimed</dt>" not in body
    assert "ms" not in re.search(r'<span class="badge retrying"[^>]*>(.*?)</span>', body).group(1)


async def test_history_times_are_relative_with_the_utc_time_in_the_tooltip(web, module_store, queue):
    client, _ = web
    todo = await enqueue(module_store, queue)

    body = (await get_page(client, f"/todos/{todo.id}")).text

    stamp = re.search(
        r'<ol class="timeline">.*?<time datetime="[^"]+" title="([^"]+)">([^<]+)</time>', body, re.S
    )
    assert stamp and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", stamp.group(1))
    assert stamp.group(2) in ("just now", "1s ago", "2s ago")
    assert '<span class="transition">— → pending</span>' in body


async def test_one_dash_means_empty_on_every_page(web, module_store, module_pool, queue):
    client, _ = web
    todo = await enqueue(module_store, queue)
    await dead_letter(module_store, module_pool, queue)
    for path in (
        "/",
        f"/queues/{queue}",
        "/leases",
        "/dead",
        f"/todos/{todo.id}",
        "/create",
        "/tokens",
        "/patterns",
    ):
        assert "–" not in text(await get_page(client, path)), path  # an en dash


# -- 9. viewers ---------------------------------------------------------------------------------


async def test_a_viewer_has_no_create_or_tokens_in_the_menu_and_no_create_form(module_dsn, module_pool):
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        token = await login(client, module_pool, "vera", role="viewer")
        overview = (await get_page(client, "/")).text
        create = (await get_page(client, "/create?queue=mail")).text
        refused = await post(client, "/create", token, {"queue": "mail", "title": "t", "payload": "{}"})

    nav = re.search(r"<nav>.*?</nav>", overview, re.S).group(0)
    assert 'href="/create"' not in nav and 'href="/tokens"' not in nav and 'href="/dead"' in nav
    main = create.split("<main>", 1)[1]
    assert 'action="/create"' not in main and "<textarea" not in main and "<input" not in main
    assert "Viewers cannot create todos. You are logged in as a viewer" in text_of(create)
    assert refused.status_code == 403
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_an_operator_has_create_and_tokens_in_the_menu(web):
    client, _ = web
    nav = re.search(r"<nav>.*?</nav>", (await get_page(client, "/")).text, re.S).group(0)
    assert 'href="/create"' in nav and 'href="/tokens"' in nav


async def test_an_error_page_keeps_the_operators_header(web):
    client, _ = web
    response = await client.get("/todos/td_nope")
    assert response.status_code == 404
    assert "olga" in response.text and 'href="/tokens"' in response.text


# -- 11. the payload view and the favicon ---------------------------------------------------------


async def test_the_payload_has_a_copy_button_and_collapses(web, module_store, queue):
    client, _ = web
    small = await enqueue(module_store, queue, payload={"to": "a@example.com"})
    big = await enqueue(module_store, queue, payload={f"k{i}": i for i in range(100)})

    shown = (await get_page(client, f"/todos/{small.id}")).text
    folded = (await get_page(client, f"/todos/{big.id}")).text

    assert '<details id="payload-view" class="payload" open>' in shown
    assert '<button type="button" class="small copy" data-copy="#payload-json">Copy</button>' in shown
    assert '<pre class="json" id="payload-json">' in shown
    assert '<details id="payload-view" class="payload" >' in folded  # long: closed until asked
    assert "102 lines" in folded


async def test_the_favicon_is_an_svg_served_from_static_and_linked_from_every_page(web):
    client, _ = web
    icon = await client.get("/static/favicon.svg")
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg") and "<script" not in icon.text and "style=" not in icon.text
    for path in ("/", "/login"):
        assert (
            '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
            in (await client.get(path)).text
        )


# -- 12. the "new work" line ----------------------------------------------------------------------


async def test_the_new_work_line_is_only_on_the_overview_and_queue_pages(web, module_store, queue):
    client, _ = web
    todo = await enqueue(module_store, queue)
    pages = {
        "/": '<p id="notice" class="new-work" sse-swap="notice" aria-live="polite" hidden>',
        f"/queues/{queue}": f'sse-swap="notice" data-notice-for="{queue}"',
    }
    for path, line in pages.items():
        assert line in (await get_page(client, path)).text, path
    for path in (f"/todos/{todo.id}", "/leases", "/dead", "/create"):
        assert 'sse-swap="notice"' not in (await get_page(client, path)).text, path


async def test_the_new_work_hint_names_every_queue_for_the_page_script_to_filter():
    from jinja2 import Environment, FileSystemLoader

    from tests.conftest import ROOT

    hint = Environment(loader=FileSystemLoader(ROOT / "templates")).get_template("partials/new_work.html")
    rendered = hint.render(queues=["a", "b", "c", "d"]).strip()
    assert 'data-queues="a,b,c,d"' in rendered and "new work in a, b, c …" in rendered
