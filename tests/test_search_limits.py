"""Issue 25, items 2 and 7: no search stalls the server.

2. A payload search sends the caller's object once, as a condition of its own, beside the
   alternatives of its `key.path=value` terms; more than MAX_ALTERNATIVES alternatives, or
   alternatives or an object over MAX_SEARCH_BYTES, are refused naming the field.
7. A list or search read stops after READ_TIMEOUT (503); title search is indexed (pg_trgm,
   migration 0014), at most MAX_WORDS_SEARCH characters, a prefix under SHORT_SEARCH; each
   caller runs at most PER_CALLER searches at once (429).

The attacks run against a real `switchboard serve` over 200,000 todos in one queue, with
another agent heartbeating beside them (tests/latency.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import random
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg
import httpx
import psutil
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard import db as dbmod
from dashboard import reads as reads_module
from dashboard.accounts import Accounts
from dashboard.errors import InvalidInput
from dashboard.migrate import apply_migrations
from dashboard.payload_search import MAX_ALTERNATIVES, MAX_SEARCH_BYTES, containments, parse_terms
from dashboard.queries import READS
from dashboard.reads import MAX_WORDS_SEARCH, SHORT_SEARCH, Reads, TodoFilter, TooSlow
from dashboard.web.searches import PER_CALLER
from tests.conftest import (
    ONE_DATABASE_PER_MODULE,
    analyzed_database,
    build_app,
    connected,
    in_process,
    with_database,
)
from tests.factories import agent_token, enqueue, login, new_todo, unique
from tests.latency import assert_heartbeats_hold
from tests.processes import eventually, free_port, start_serving, stop
from tests.test_pgbouncer import pgbouncer_binary
from tests.test_plans import explain, index_scans, offenders

pytestmark = ONE_DATABASE_PER_MODULE

API = "/api/v1/todos"
MCP = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


def tool_call(tool: str, arguments: dict) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def tool_error(response: httpx.Response) -> dict:
    """The problem details of a refused tool call."""
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert result["isError"], result
    return result["structuredContent"]


# -- the attacks, against a real server ------------------------------------------------------

BIG = 200_000
QUEUE = "big"
# Each attacker sends its next request when its last is answered, and no sooner than PACE
# after it began, from a random start: a search that costs the server seconds goes out as
# fast as before, and a cheap refusal does not turn the test into a flood of requests, which
# any route allows and which is not what these findings are about.
PACE = 0.5


async def _fill(conn) -> None:
    await conn.execute(
        """INSERT INTO todos (id, queue, title, created_at, ready_at, payload, idempotency_key)
           SELECT 'td_big' || g, $2, 'todo ' || g || ' ' || md5(g::text),
                  now() - make_interval(secs => g), now() - make_interval(secs => g),
                  jsonb_build_object('customer', jsonb_build_object('id', g % 2000)),
                  CASE WHEN g % 2 = 0 THEN 'key-' || g END
           FROM generate_series(1, $1) AS g""",
        BIG,
        QUEUE,
    )


@pytest.fixture(scope="module")
def big_db(server_dsn, template_db):
    with analyzed_database(server_dsn, template_db, _fill) as url:
        yield url


@pytest.fixture(scope="module")
def served(big_db, tmp_path_factory):
    """`switchboard serve` on the big database: (base URL, its process)."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": big_db, "PYTHONUNBUFFERED": "1"}
    log = tmp_path_factory.mktemp("search") / "serve.log"
    proc = start_serving(["serve", "--port", str(port)], env, log)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop(proc)


async def attackers(request, n: int, seen: Counter) -> None:
    """`n` callers sending `request()` (see PACE) until cancelled; `seen` counts the answers."""

    async def one():
        await asyncio.sleep(random.uniform(0, PACE))
        while True:
            began = time.monotonic()
            seen[(await request()).status_code] += 1
            await asyncio.sleep(max(0.0, began + PACE - time.monotonic()))

    await asyncio.gather(*(one() for _ in range(n)))


def rss_mb(proc) -> float:
    return psutil.Process(proc.pid).memory_info().rss / 2**20


async def agent_headers(dsn: str) -> dict:
    async with connected(dsn) as db:
        return await agent_token(db, unique("searcher"), [QUEUE])


EIGHT_NUMBERS = " ".join(f"k{i}=1" for i in range(8))  # 2**8 alternatives
HUGE_OBJECT = {"pad": "x" * 240_000}  # ~240 KB of JSON: each alternative carried it


@pytest.mark.slow
async def test_eight_big_mcp_payload_searches_at_once_neither_swell_the_server_nor_stall_heartbeats(
    served, big_db
):
    """The issue's reproduction: 8 MCP list_todos at once, each with 8 bare numbers and a
    240 KB object (RSS went 371 -> 1,163 MB, heartbeats stalled 7.2 s)."""
    base, proc = served
    headers = {**await agent_headers(big_db), **MCP}
    call = tool_call("list_todos", {"search": EIGHT_NUMBERS, "payload": HUGE_OBJECT, "limit": 1})
    seen: Counter = Counter()
    before, peak = rss_mb(proc), [0.0]
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:

        async def attack():
            async def sample():
                while True:
                    peak[0] = max(peak[0], rss_mb(proc))
                    await asyncio.sleep(0.05)

            sampler = asyncio.create_task(sample())
            try:
                await attackers(lambda: http.post("/mcp", json=call, headers=headers), 8, seen)
            finally:
                sampler.cancel()

        try:
            await assert_heartbeats_hold(base, big_db, attack)
        finally:
            print(f"server RSS {before:.0f} MB before, at most {peak[0]:.0f} MB during; answers {dict(seen)}")
        assert tool_error(await http.post("/mcp", json=call, headers=headers))["status"] in (413, 422)
    assert peak[0] - before < 100


NOWHERE = "no such title anywhere"  # matches nothing: unindexed, every title is read


@pytest.mark.slow
async def test_twelve_title_searches_at_once_from_a_viewer_do_not_stall_heartbeats(served, big_db):
    """The issue's reproduction: 12 searches at once from a viewer's queue page (1.1 s each
    at 200,000 todos; heartbeats stalled 3.2 s)."""
    base, _ = served
    seen: Counter = Counter()
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        async with connected(big_db) as db:
            await login(http, db, unique("viewer"), role="viewer")
        search = {"q": NOWHERE}
        await assert_heartbeats_hold(
            base, big_db, lambda: attackers(lambda: http.get(f"/queues/{QUEUE}", params=search), 12, seen)
        )
    print(f"answers {dict(seen)}")
    assert set(seen) <= {200, 429}, seen


@pytest.mark.slow
async def test_twelve_api_title_searches_at_once_from_one_token_do_not_stall_heartbeats(served, big_db):
    base, _ = served
    seen: Counter = Counter()
    longest = "z" * MAX_WORDS_SEARCH  # the longest a search without '=' may be
    async with httpx.AsyncClient(base_url=base, timeout=120, headers=await agent_headers(big_db)) as http:
        await assert_heartbeats_hold(
            base,
            big_db,
            lambda: attackers(
                lambda: http.get(API, params={"search": random.choice([NOWHERE, longest])}), 12, seen
            ),
        )
    print(f"answers {dict(seen)}")
    assert set(seen) <= {200, 429}, seen


@pytest.mark.parametrize("queue", [QUEUE, None], ids=["one queue", "no queue"])
@pytest.mark.parametrize("search", [NOWHERE, "ab", "key-1234"], ids=["words", "short", "a key"])
async def test_a_title_search_reads_the_trigram_index_not_the_queue(big_db, queue, search):
    values = {"search": f"'{search}'", "search_like": f"'{reads_module._like(search)}'", "limit": "51"}
    values |= {"queue": f"'{queue}'"} if queue else {"queues": f"'{{{QUEUE}}}'::text[]"}
    async with connected(big_db, asyncpg.connect) as conn:
        plan = await explain(conn, READS.list_todos, values, "force_custom_plan")
    assert not any(f.startswith("Seq Scan") for f in offenders(plan))  # (its few rows are sorted)
    assert {"todos_pkey", "todos_text_search"} <= index_scans(plan)


# -- item 2: what a payload search sends, and what it refuses -----------------------------------


async def test_the_callers_object_is_sent_once_beside_the_alternatives_of_the_terms():
    obj = {"customer": {"id": 42}, "pad": "x" * 10_000}
    values = reads_module._filter_values(TodoFilter(search="a=1 b=2", payload=obj))
    assert values["payload_has"] is obj
    assert values["payload_any"] == [{"a": a, "b": b} for a in (1, "1") for b in (2, "2")]


async def test_four_bare_numbers_are_searched_and_a_fifth_is_refused():
    four = " ".join(f"k{i}=1" for i in range(4))
    assert len(containments(parse_terms(four))) == MAX_ALTERNATIVES == 16
    assert len(containments(parse_terms(four + ' k4="1" k5=true k6=x k7=[1]'))) == 16  # not bare numbers
    with pytest.raises(InvalidInput) as caught:
        parse_terms(four + " k4=1")
    assert caught.value.field == "search" and "too many bare numbers" in caught.value.message


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(module_dsn, module_pool):
    """The real app in process (no reaper), with a viewer logged in for the pages."""
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        await login(client, module_pool, "vera", role="viewer")
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def bot(module_pool) -> dict:
    return await agent_token(module_pool, unique("bot"), ["shop"])


WIDE = "😀" * 900  # 900 characters, 3,600 bytes as JSON: times 16 alternatives is over the limit


@pytest.mark.parametrize(
    ("params", "status", "field", "says"),
    [
        ({"search": " ".join(f"k{i}=1" for i in range(5))}, 422, "search", "too many bare numbers"),
        ({"search": f'a="{WIDE}" b=1 c=1 d=1 e=1'}, 413, "search", f"the limit is {MAX_SEARCH_BYTES}"),
        (
            {"payload": '{"pad": "%s"}' % ("x" * MAX_SEARCH_BYTES)},
            413,
            "payload",
            f"the limit is {MAX_SEARCH_BYTES}",
        ),
        (
            {"search": "x" * (MAX_WORDS_SEARCH + 1)},
            422,
            "search",
            f"longer than {MAX_WORDS_SEARCH} characters",
        ),
    ],
    ids=["five bare numbers", "wide alternatives", "big object", "long words"],
)
async def test_the_api_refuses_a_search_that_would_explode_naming_the_field(
    web, bot, params, status, field, says
):
    response = await web.get(API, headers=bot, params=params)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field and says in body["detail"], body


async def test_mcp_list_todos_refuses_a_big_object_and_five_bare_numbers_naming_them(web, bot):
    headers = {**bot, **MCP}
    big = tool_call("list_todos", {"payload": {"pad": "x" * MAX_SEARCH_BYTES}})
    problem = tool_error(await web.post("/mcp", json=big, headers=headers))
    assert problem["status"] == 413 and problem["field"] == "payload", problem
    five = tool_call("list_todos", {"search": " ".join(f"k{i}=1" for i in range(5))})
    problem = tool_error(await web.post("/mcp", json=five, headers=headers))
    assert problem["status"] == 422 and "too many bare numbers" in problem["detail"], problem


async def test_the_queue_page_shows_a_refused_search_beside_its_box(web):
    response = await web.get("/queues/shop", params={"q": " ".join(f"k{i}=1" for i in range(5))})
    assert response.status_code == 422
    assert "Too many bare numbers" in response.text and 'aria-invalid="true"' in response.text


async def test_a_search_at_the_limits_still_finds_its_todos(web, bot, module_store):
    hit = await enqueue(
        module_store, "shop", "hit", payload={"a": 1, "b": "2", "c": 3, "d": 4, "pad": "p" * 8000}
    )
    await enqueue(module_store, "shop", "miss", payload={"a": 1, "b": "2", "c": 3, "d": 5})
    params = {"search": "a=1 b=2 c=3 d=4", "payload": '{"pad": "%s"}' % ("p" * 8000)}
    response = await web.get(API, headers=bot, params=params)
    assert response.status_code == 200, response.text
    assert [t["id"] for t in response.json()["items"]] == [hit.id]


# -- item 7: title search finds what it found ----------------------------------------------------

ALPHABET = "aAbB %_\\x"  # LIKE's wildcards and escape among the letters
TITLES = st.text(ALPHABET, max_size=10)


def model_finds(title: str, todo_id: str, key: str | None, term: str) -> bool:
    """README "Searching": an id, an idempotency key, or the title containing the words (any
    case), or beginning with them when they are shorter than SHORT_SEARCH."""
    lowered, words = title.lower(), term.lower()
    found = lowered.startswith(words) if len(term) < SHORT_SEARCH else words in lowered
    return term in (todo_id, key) or found


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(titles=st.lists(TITLES, min_size=1, max_size=12), data=st.data())
async def test_title_search_selects_exactly_the_titles_that_hold_the_words(
    module_pool, module_store, titles, data
):
    await module_pool.execute("DELETE FROM todos")
    keys = [data.draw(st.none() | st.just(f"key{i}" + data.draw(TITLES))) for i in range(len(titles))]
    made = await module_store.create_many(
        [
            new_todo("prop", title=t if t.strip() else "-", idempotency_key=k)
            for t, k in zip(titles, keys, strict=True)
        ]
    )
    todos = [(c.todo.id, c.todo.title, k) for c, k in zip(made, keys, strict=True)]
    reads = Reads(module_pool)
    for _ in range(3):
        source = data.draw(st.sampled_from(todos))
        term = data.draw(
            st.sampled_from([source[0], source[2] or source[1]])
            | st.text(ALPHABET, min_size=1, max_size=4)
            | st.builds(
                lambda t, i, n: t[i : i + n], st.just(source[1]), st.integers(0, 9), st.integers(1, 5)
            )
        ).strip()
        if not term:
            continue
        expected = {i for i, title, key in todos if model_finds(title, i, key, term)}
        found = await reads.list_todos(TodoFilter(queue="prop", search=term), limit=100)
        assert {t.id for t in found.items} == expected, term
        assert set(await reads.matching_ids(TodoFilter(queue="prop", search=term), limit=100)) == expected


# -- item 7: the statement timeout ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def todos_locked(dsn: str):
    """Every read of todos waits while this holds it: a read as slow as we like."""
    async with connected(dsn, asyncpg.connect) as locker, locker.transaction():
        await locker.execute("LOCK TABLE todos IN ACCESS EXCLUSIVE MODE")
        yield


async def lists_waiting(dsn: str, n: int) -> None:
    """Until `n` list reads (list_todos' statement) wait for todos_locked."""
    async with connected(dsn, asyncpg.connect) as conn:
        await eventually(
            lambda: conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND starts_with(query, $1)",
                READS.list_todos.sql[:200],  # (the activity shows the first 1 KB of a statement)
            ),
            lambda count: count >= n,
            within=10,
        )


async def test_a_read_past_its_timeout_is_a_503_saying_so_everywhere(web, bot, module_dsn, monkeypatch):
    monkeypatch.setattr(reads_module, "READ_TIMEOUT", 0.3)
    async with todos_locked(module_dsn):
        began = time.monotonic()
        api = await web.get(API, headers=bot, params={"search": "refund"})
        took = time.monotonic() - began
        mcp = tool_error(
            await web.post("/mcp", json=tool_call("list_todos", {"search": "refund"}), headers={**bot, **MCP})
        )
        page = await web.get("/queues/shop", params={"q": "refund"})
    assert api.status_code == 503 and api.headers["retry-after"], api.text
    assert "took over 0.3 s and was stopped" in api.json()["detail"]
    assert 0.3 <= took < 3
    assert mcp["status"] == 503 and "took over 0.3 s" in mcp["detail"], mcp
    assert page.status_code == 503 and "took over 0.3 s" in page.text
    assert (await web.get(API, headers=bot, params={"search": "refund"})).status_code == 200


async def test_the_timeout_is_the_reads_own_and_never_reaches_the_next_statement(module_dsn, monkeypatch):
    monkeypatch.setattr(reads_module, "READ_TIMEOUT", 0.3)
    async with connected(module_dsn) as conn:
        await Reads(conn).list_todos(TodoFilter(search="refund"))
        assert await conn.fetchval("SHOW statement_timeout") == "0"  # the claim path has none
        async with todos_locked(module_dsn):
            for read in (
                Reads(conn).list_todos(TodoFilter(search="refund")),
                Reads(conn).matching_ids(TodoFilter(), limit=10),
            ):
                with pytest.raises(TooSlow):  # the lists and the bulk actions' "all matching"
                    await asyncio.wait_for(read, 5)
        assert await conn.fetchval("SHOW statement_timeout") == "0"


@pytest.fixture
def transaction_pooler(module_dsn, tmp_path):
    """PgBouncer in transaction pooling with ONE server connection in front of the module's
    database: every client's transaction runs on that same server session in turn."""
    parts = urlsplit(module_dsn)
    host = parse_qs(parts.query).get("host", [parts.hostname or "localhost"])[0]
    name = parts.path.lstrip("/")
    port = free_port()
    config = tmp_path / "pgbouncer.ini"
    config.write_text(
        textwrap.dedent(f"""\
        [databases]
        {name} = host={host} port={parts.port or 5432} dbname={name} user={parts.username or "postgres"}
        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = {port}
        unix_socket_dir =
        auth_type = any
        pool_mode = transaction
        default_pool_size = 1
        """)
    )
    run_as = []
    if os.geteuid() == 0:  # PgBouncer will not run as root: as the server socket's owner
        owner = Path(host).stat().st_uid if host.startswith("/") else 0
        run_as = ["-u", pwd.getpwuid(owner).pw_name if owner else "nobody"]
    log = tmp_path / "pgbouncer.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [pgbouncer_binary(), *run_as, str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while "process up" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield f"postgresql://postgres@127.0.0.1:{port}/{name}"
    finally:
        stop(proc)


@pytest.mark.slow
async def test_the_timeout_holds_and_ends_with_its_transaction_through_pgbouncer_transaction_pooling(
    transaction_pooler, module_dsn, monkeypatch
):
    monkeypatch.setattr(reads_module, "READ_TIMEOUT", 0.3)
    one = await dbmod.connect(transaction_pooler, statement_cache_size=0)
    other = await dbmod.connect(transaction_pooler, statement_cache_size=0)
    try:
        async with todos_locked(module_dsn):
            with pytest.raises(TooSlow):
                await Reads(one).list_todos(TodoFilter(search="refund"))
        assert await other.fetchval("SHOW statement_timeout") == "0"  # the same server session, next
        assert (await Reads(one).list_todos(TodoFilter(search="refund"))).items == []
    finally:
        await one.close()
        await other.close()


# -- item 7: searches per caller ------------------------------------------------------------------


@pytest.mark.slow
async def test_a_caller_runs_at_most_two_searches_at_once_and_others_are_not_held_back(served, big_db):
    base, _ = served
    bot, other = await agent_headers(big_db), await agent_headers(big_db)
    search = {"search": "refund"}
    call = tool_call("list_todos", search)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        async with todos_locked(big_db):
            held = [asyncio.create_task(http.get(API, headers=bot, params=search)) for _ in range(PER_CALLER)]
            await lists_waiting(big_db, PER_CALLER)
            refused = await http.get(API, headers=bot, params=search)
            by_mcp = tool_error(await http.post("/mcp", json=call, headers={**bot, **MCP}))
            others = [
                asyncio.create_task(http.get(API, headers=other, params=search)),  # another agent
                asyncio.create_task(http.get(API, headers=bot)),  # a list without a search
            ]
            await lists_waiting(big_db, PER_CALLER + 2)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
        assert f"at most {PER_CALLER} searches at once" in refused.json()["detail"]
        assert by_mcp["status"] == 429, by_mcp  # the agent's, through either door
        assert [r.status_code for r in await asyncio.gather(*held, *others)] == [200] * (PER_CALLER + 2)
        assert (await http.get(API, headers=bot, params=search)).status_code == 200  # slots given back


@pytest.mark.slow
async def test_an_operator_runs_at_most_two_searches_at_once_over_all_their_sessions(served, big_db):
    base, _ = served
    search, name = {"q": "refund"}, unique("viewer")
    async with connected(big_db) as db:
        password = await Accounts(db).add_operator(name, "viewer")
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as one,
        httpx.AsyncClient(base_url=base, timeout=30) as two,
    ):
        for browser in (one, two):
            await browser.get("/login")
            form = {"name": name, "password": password, "_csrf_token": browser.cookies.get("csrftoken")}
            assert (await browser.post("/login", data=form)).status_code == 303
        async with todos_locked(big_db):
            held = [asyncio.create_task(b.get(f"/queues/{QUEUE}", params=search)) for b in (one, two)]
            await lists_waiting(big_db, PER_CALLER)
            refused = await one.get(f"/queues/{QUEUE}", params=search)
        assert refused.status_code == 429 and f"at most {PER_CALLER} searches at once" in refused.text
        assert [r.status_code for r in await asyncio.gather(*held)] == [200] * PER_CALLER


# -- item 7: without pg_trgm ---------------------------------------------------------------------


async def test_without_pg_trgm_the_migration_warns_and_title_search_still_works(server_dsn):
    """A role that may not create extensions (no CREATE on the database) migrates a fresh
    database: 0014 leaves the index out with a WARNING, and search reads the queue."""
    role, name = unique("nocreate").replace("-", "_"), unique("sb_nocreate").replace("-", "_")
    url = with_database(server_dsn, name)
    parts = urlsplit(url)
    as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    async with connected(server_dsn, asyncpg.connect) as admin:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            async with connected(url, asyncpg.connect) as owner:  # the role owns the schema only
                await owner.execute(f'ALTER SCHEMA public OWNER TO "{role}"')
            warnings: list[str] = []
            async with connected(as_role, asyncpg.connect) as conn:
                conn.add_log_listener(lambda _, message: warnings.append(str(message)))
                await apply_migrations(conn)
                assert await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'pg_trgm'") == 0
                assert await conn.fetchval("SELECT to_regclass('todos_text_search')") is None
            assert any("title search stays unindexed" in w for w in warnings), warnings
            async with connected(as_role) as conn:
                await conn.execute(
                    "INSERT INTO todos (id, queue, title) VALUES ('td_1', 'q', 'Refund order 9')"
                )
                found = await Reads(conn).list_todos(TodoFilter(search="order 9"))
                assert [t.id for t in found.items] == ["td_1"]
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
