"""Input at the edges (issue 25, items 8 and 9 and the Info notes): a lone UTF-16 surrogate
anywhere a client sends text is a 4xx naming the field, never a 500, and changes nothing;
a static path no file can have is a 404; /readyz keeps the database's error text to the
log; every dashboard page says `Cache-Control: no-store`; operator and agent names that
switchboard uses for itself, or that differ from a taken name only by case, are refused.

One app and one database for the module (emptied before each test), logged in as olga.
"""

from __future__ import annotations

import html
import json
import logging
import re
from urllib.parse import quote

import pytest
import pytest_asyncio

from dashboard.accounts import Accounts, token_hash
from dashboard.errors import Conflict, InvalidInput
from tests.conftest import ONE_DATABASE_PER_MODULE, build_app, in_process
from tests.factories import agent_token, claimed, enqueue, login, snapshot, todo_row, unique
from tests.web_helpers import field_label, get_page, post

pytestmark = ONE_DATABASE_PER_MODULE

LONE = "\\ud800"  # JSON's escape for half of a character, as a client sends it
SURROGATE = "must not contain a lone UTF-16 surrogate"
JSON = {"content-type": "application/json"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(module_dsn, module_pool):
    return await build_app(module_dsn, module_pool, reaper=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(app, module_pool):
    """The app in process, logged in as olga; yields (client, CSRF token)."""
    async with in_process(app) as client:
        yield client, await login(client, module_pool, "olga")


@pytest.fixture
def queue() -> str:
    return unique("edge")


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def assert_problem(response, status: int, field: str) -> None:
    """A problem details answer naming `field` as the one with the surrogate."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field, body
    assert SURROGATE in body["detail"], body


def assert_error_beside(response, field: str) -> None:
    """A form page (422) with the surrogate's refusal under the field it was typed into."""
    assert response.status_code == 422, response.text[:300]
    label = field_label(response.text, field)
    assert 'aria-invalid="true"' in label and SURROGATE in text_of(label), label


# -- 8. a lone surrogate: searches --------------------------------------------------------------


async def test_a_lone_surrogate_in_a_payload_search_term_is_shown_beside_the_search_box(web, queue):
    client, _ = web
    response = await client.get(f"/queues/{queue}?q=" + quote(f'customer.name="{LONE}"'))
    assert response.status_code == 422
    label = re.search(r'<label\b(?:(?!</label>).)*? name="q".*?</label>', response.text, re.S).group(0)
    assert 'aria-invalid="true"' in label and SURROGATE in text_of(label)


@pytest.mark.parametrize(
    "params",
    [
        {"search": f'customer.name="{LONE}"'},
        {"payload": f'{{"customer": "{LONE}"}}'},
        {"payload": f'{{"{LONE}": 1}}'},
    ],
    ids=["search term", "payload value", "payload key"],
)
async def test_a_lone_surrogate_in_an_api_search_is_a_422_naming_it(web, module_pool, queue, params):
    client, _ = web
    bot = await agent_token(module_pool, "bot", [queue])
    response = await client.get("/api/v1/todos", params={"queue": queue, **params}, headers=bot)
    assert_problem(response, 422, next(iter(params)))


async def test_a_lone_surrogate_in_an_mcp_search_is_a_tool_error_naming_it(web, module_pool, queue):
    client, _ = web
    bot = await agent_token(module_pool, "bot", [queue])
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "list_todos", "arguments": {"queue": queue, "search": f'a="{LONE}"'}},
    }
    headers = {**bot, **JSON, "Accept": "application/json, text/event-stream"}
    response = await client.post("/mcp", content=json.dumps(call), headers=headers)
    result = response.json()["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["status"] == 422
    assert result["structuredContent"]["field"] == "search"
    assert SURROGATE in result["content"][0]["text"]


# -- 8. a lone surrogate: the API's bodies ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": LONE}, "title"),
        ({"title": "t", "kind": f"a{LONE}b"}, "kind"),
        ({"title": "t", "payload": {"customer": {"name": LONE}}}, "payload.customer.name"),
        ({"title": "t", "payload": {LONE: 1}}, f"payload.{LONE}"),
    ],
    ids=["title", "kind", "payload value", "payload key"],
)
async def test_a_lone_surrogate_in_a_created_todo_is_a_422_naming_the_field(
    web, module_pool, queue, body, field
):
    client, _ = web
    bot = await agent_token(module_pool, "bot", [queue])
    before = await snapshot(module_pool)
    raw = json.dumps({"queue": queue, **body}).replace("\\\\ud800", LONE)  # the escape, not a backslash
    response = await client.post("/api/v1/todos", content=raw, headers={**bot, **JSON})
    assert_problem(response, 422, field)
    assert await snapshot(module_pool) == before


async def test_a_lone_surrogate_in_a_batch_edit_or_ack_names_where_it_is(
    web, module_pool, module_store, queue
):
    client, _ = web
    bot = await agent_token(module_pool, "bot", [queue])
    pending = await enqueue(module_store, queue)
    held = await claimed(module_store, queue, owner="bot")
    before = await snapshot(module_pool)
    for method, url, raw, field in [
        (
            "POST",
            "/api/v1/todos/batch",
            f'{{"todos": [{{"queue": "{queue}", "title": "{LONE}"}}]}}',
            "todos[0].title",
        ),
        ("PATCH", f"/api/v1/todos/{pending.id}", f'{{"title": "{LONE}"}}', "title"),
        (
            "POST",
            f"/api/v1/todos/{held.id}/complete",
            f'{{"lease": {held.lease_token}, "result": {{"a": "{LONE}"}}}}',
            "result.a",
        ),
        (
            "POST",
            f"/api/v1/todos/{held.id}/fail",
            f'{{"lease": {held.lease_token}, "error": "{LONE}"}}',
            "error",
        ),
    ]:
        response = await client.request(method, url, content=raw, headers={**bot, **JSON})
        assert_problem(response, 422, field)
    raw_cesu = b'{"queue": "%s", "title": "\xed\xa0\x80"}' % queue.encode()  # the surrogate as UTF-8 bytes
    assert_problem(
        await client.post("/api/v1/todos", content=raw_cesu, headers={**bot, **JSON}), 422, "title"
    )
    assert await snapshot(module_pool) == before


# -- 8. a lone surrogate: the dashboard's forms and the Inbox -----------------------------------

CREATE = {"title": "t", "max_attempts": "5", "priority": "0", "payload": "{}"}


async def test_a_lone_surrogate_in_the_create_form_is_shown_beside_its_field(web, module_pool, queue):
    client, csrf = web
    before = await snapshot(module_pool)
    for payload in (f'{{"customer": "{LONE}"}}', f'{{"{LONE}": 1}}'):
        response = await post(client, "/create", csrf, {**CREATE, "queue": queue, "payload": payload})
        assert_error_beside(response, "payload")
        assert payload in html.unescape(response.text)  # what was typed is kept
    assert await snapshot(module_pool) == before


async def test_a_surrogate_a_multipart_charset_makes_is_refused_beside_the_field_and_shown(
    web, module_pool, queue
):
    """A part may name its own charset; unicode_escape turns the text \\ud800 into half a character."""
    client, csrf = web
    before = await snapshot(module_pool)
    fields = {**CREATE, "queue": queue, "_csrf_token": csrf}
    del fields["title"]
    title = {"title": (None, b"half \\ud800 a character", "text/plain; charset=unicode_escape")}
    response = await client.post("/create", data=fields, files=title)
    assert_error_beside(response, "title")
    assert 'value="half \ufffd a character"' in response.text  # shown as U+FFFD, as UTF-8 can send it
    for part in [
        (None, b"\xed\xa0\x80", "text/plain; charset=utf-8"),
        (None, b"x", "text/plain; charset=nonsense"),
    ]:
        response = await client.post("/create", data=fields, files={"title": part})
        assert response.status_code == 400, response.text[:300]
        assert "not text in the character set it names" in html.unescape(response.text)
    assert await snapshot(module_pool) == before


async def test_a_lone_surrogate_in_the_edit_form_is_shown_beside_its_field(
    web, module_pool, module_store, queue
):
    client, csrf = web
    todo = await enqueue(module_store, queue, payload={"keep": 1})
    form = {**CREATE, "version": todo.version, "payload": f'{{"customer": "{LONE}"}}'}
    response = await post(client, f"/todos/{todo.id}/edit", csrf, form)
    assert_error_beside(response, "payload")
    assert (await todo_row(module_pool, todo.id)).payload == {"keep": 1}


async def test_a_lone_surrogate_in_an_inbox_result_is_shown_beside_the_todo(
    web, module_pool, module_store, queue
):
    client, csrf = web
    held = await claimed(module_store, queue, owner="olga", assignee="olga")
    form = {"lease": str(held.lease_token), "result": f'{{"answer": "{LONE}"}}'}
    response = await post(client, f"/inbox/{held.id}/complete", csrf, form)
    assert response.status_code == 422, response.text[:300]
    error = re.search(rf'id="error-{held.id}".*?</div>', response.text, re.S).group(0)
    assert "Result must not contain a lone UTF-16 surrogate" in text_of(error)
    assert (await todo_row(module_pool, held.id)).state == "claimed"


# -- 9. static paths no file can have -----------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/static/app.js/x", "/static/" + "a" * 300, "/static/app.css/" + "b" * 300, "/static/%00"]
)
async def test_a_static_path_no_file_can_have_is_not_found(web, path):
    client, _ = web
    response = await client.get(path)
    assert response.status_code == 404, response.text[:300]
    assert (await client.get("/static/app.js")).status_code == 200


# -- Info: /readyz, Cache-Control, reserved and case-insensitive names --------------------------


async def test_readyz_keeps_the_databases_error_to_the_log(app, web, module_dsn, caplog):
    """A database that cannot be reached (here: the pool's new connections go to a port
    nobody listens on) is a 503 that says so, without the driver's text (its host and
    port); the log has it."""
    client, _ = web
    pool = app.state.services.reads.db
    pool.set_connect_args("postgresql://127.0.0.1:9/nowhere")
    await pool.expire_connections()
    try:
        with caplog.at_level(logging.WARNING, logger="switchboard.web"):
            response = await client.get("/readyz")
    finally:
        pool.set_connect_args(module_dsn, timeout=10)  # as create_pool had them
        await pool.expire_connections()
    assert response.status_code == 503 and response.headers["retry-after"] == "2"
    assert response.json() == {
        "ready": False,
        "checks": {"listening": True, "database": False, "migrations": False, "writable": False},
    }
    assert "127.0.0.1', 9" in caplog.text and "/readyz" in caplog.text
    assert (await client.get("/readyz")).status_code == 200


async def test_pages_and_the_api_keep_the_databases_error_to_the_log_too(
    app, web, module_dsn, module_pool, caplog
):
    """The login page (anyone may ask for it) and the API say the database is away, and no
    more: its host and port, and the driver's text, are for the log."""
    client, _ = web
    headers = await agent_token(module_pool, "bot", ["work"])
    services_pool = app.state.services.reads.db
    services_pool.set_connect_args("postgresql://127.0.0.1:9/nowhere")
    await services_pool.expire_connections()
    try:
        with caplog.at_level(logging.WARNING, logger="switchboard.web"):
            page = await client.get("/", follow_redirects=False)
            api = await client.get("/api/v1/todos", headers=headers)
    finally:
        services_pool.set_connect_args(module_dsn, timeout=10)
        await services_pool.expire_connections()
    for answer in (page, api):
        assert answer.status_code == 503, answer.text[:300]
        assert "unreachable right now" in answer.text
        assert "127.0.0.1" not in answer.text and "Connect call failed" not in answer.text
    assert "Connect call failed" in caplog.text


async def test_every_dashboard_page_is_kept_by_no_cache(web, module_store, queue):
    client, csrf = web
    todo = await enqueue(module_store, queue, payload={"secret": "s3cr3t"}, assignee="olga")
    pages = [
        "/",
        f"/queues/{queue}",
        f"/partials/queues/{queue}",
        f"/todos/{todo.id}",
        f"/partials/todos/{todo.id}",
        f"/todos/{todo.id}/edit",
        f"/queues/{queue}?q=secret%3Ds3cr3t",
        "/inbox",
        "/partials/inbox",
        "/dead",
        "/leases",
        "/agents",
        "/create",
        "/tokens",
    ]
    for url in pages:
        assert (await get_page(client, url)).headers.get("cache-control") == "no-store", url
    refused = await post(client, "/create", csrf, {**CREATE, "queue": queue, "title": ""})
    missing = await client.get("/todos/td_nothing")
    for response in (refused, missing):
        assert response.status_code in (404, 422) and response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    "name", ["cli", "reaper", "system", "producer", "agent", "operator", "Reaper", "SYSTEM"]
)
async def test_the_names_switchboard_records_its_own_steps_under_are_reserved(module_pool, name):
    accounts = Accounts(module_pool)
    for attempt, field in (
        (accounts.add_token(name, ["work"]), "agent"),
        (accounts.add_operator(name, "viewer"), "name"),
    ):
        with pytest.raises(InvalidInput) as refused:
            await attempt
        assert refused.value.field == field and "is reserved" in refused.value.message


async def test_names_that_differ_only_by_case_are_one_name(module_pool):
    accounts = Accounts(module_pool)
    person, agent = unique("Olga"), unique("mailer")
    await accounts.add_operator(person, "operator")
    await accounts.add_token(agent, ["work"])
    for attempt in (
        accounts.add_token(person.lower(), ["work"]),
        accounts.add_operator(person.upper(), "viewer"),
        accounts.add_operator(agent.title(), "viewer"),
        accounts.add_token(agent.upper(), ["work"]),
    ):
        with pytest.raises(Conflict, match="differs only by case"):
            await attempt
    await accounts.add_token(agent, ["other"])  # the very same agent: another token is fine
    assert [t.agent for t in await accounts.list_tokens()] == [agent, agent]


async def test_the_tokens_form_says_why_a_reserved_name_or_one_differing_only_by_case_is_refused(
    web, module_pool
):
    client, csrf = web
    response = await post(client, "/tokens", csrf, {"agent": "OLGA", "queues": "work"})
    assert response.status_code == 409
    assert "differs only by case from operator olga" in text_of(field_label(response.text, "agent"))
    response = await post(client, "/tokens", csrf, {"agent": "Reaper", "queues": "work"})
    assert response.status_code == 422
    assert "'Reaper' is reserved" in text_of(field_label(response.text, "agent"))
    assert await module_pool.fetchval("SELECT count(*) FROM api_tokens") == 0


async def test_a_token_made_before_names_were_reserved_still_works(web, module_pool, queue):
    """Existing rows are left as they are: only new names are checked."""
    client, _ = web
    secret = "sbt_" + unique("legacy")
    await module_pool.execute(
        "INSERT INTO api_tokens (id, agent, queues, token_hash, created_by) VALUES ($1, $2, $3, $4, 'cli')",
        "tk_legacy0001",
        "system",
        [queue],
        token_hash(secret),
    )
    response = await client.get(
        "/api/v1/todos", params={"queue": queue}, headers={"Authorization": f"Bearer {secret}"}
    )
    assert response.status_code == 200, response.text
