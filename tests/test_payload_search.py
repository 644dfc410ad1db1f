"""Search by payload (issue 13): the API's `payload` object and the search box's
`key.path=value` terms, through Reads, the API and the queue page.

Every search is checked against what a plain Python reading of jsonb containment selects,
by hand and by a property test over random payloads and random searches.
"""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.errors import InvalidInput
from dashboard.payload_search import containments, parse_terms
from dashboard.queries import READS
from dashboard.reads import Reads, TodoFilter
from tests.conftest import ONE_DATABASE_PER_MODULE, analyzed_database, build_app, connected, in_process
from tests.factories import agent_token, enqueue, login, new_todo
from tests.test_plans import explain, index_scans, offenders
from tests.web_helpers import ids_in, text

pytestmark = ONE_DATABASE_PER_MODULE


# -- a Python reading of jsonb containment (the PostgreSQL manual, "jsonb Containment") -----


def contains(a: Any, b: Any) -> bool:
    """jsonb's a @> b below the top level: objects by key, arrays as sets of elements,
    scalars by equal JSON type and value (1 and 1.0 are equal, true is not 1)."""
    if isinstance(b, dict):
        return isinstance(a, dict) and all(k in a and contains(a[k], v) for k, v in b.items())
    if isinstance(b, list):
        return isinstance(a, list) and all(any(contains(x, y) for x in a) for y in b)
    return not isinstance(a, dict | list) and json_type(a) == json_type(b) and a == b


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, int | float) else type(value).__name__


async def listed(reads: Reads, filters: TodoFilter, limit: int = 500) -> list[str]:
    """Every id the list shows for `filters`, page after page."""
    ids, after = [], None
    while True:
        page = await reads.list_todos(filters, limit=limit, after=after)
        ids += [t.id for t in page.items]
        if not (after := page.next_cursor):
            return ids


# -- Reads ---------------------------------------------------------------------------------


async def test_a_payload_object_lists_the_todos_whose_payload_contains_it(module_pool, module_store):
    a = await enqueue(module_store, "shop", "a", payload={"customer": {"id": 42, "tier": "gold"}})
    b = await enqueue(module_store, "shop", "b", payload={"customer": {"id": 42}, "tags": ["vip", "eu"]})
    await enqueue(module_store, "shop", "c", payload={"customer": {"id": 43, "tier": "gold"}})
    await enqueue(module_store, "shop", "d", payload={"customer": 42})
    reads = Reads(module_pool)
    assert await listed(reads, TodoFilter(payload={"customer": {"id": 42}})) == [b.id, a.id]
    assert await listed(reads, TodoFilter(payload={"tags": ["eu"]})) == [b.id]
    assert await listed(reads, TodoFilter(payload={"customer": {"id": 42, "tier": "gold"}})) == [a.id]
    assert await listed(reads, TodoFilter(payload={"customer": {"id": "42"}})) == []
    assert len(await listed(reads, TodoFilter(payload={}))) == 4


async def test_key_path_terms_search_the_payload(module_pool, module_store):
    number = await enqueue(
        module_store, "shop", "n", payload={"customer": {"id": 42}, "order": {"status": "paid"}}
    )
    string = await enqueue(
        module_store, "shop", "s", payload={"customer": {"id": "42"}, "order": {"status": "open"}}
    )
    spaced = await enqueue(module_store, "shop", "w", payload={"note": "two words", "ok": True, "gone": None})
    tagged = await enqueue(module_store, "shop", "t", payload={"tags": ["vip", "eu"], "customer": {"id": 7}})
    reads = Reads(module_pool)

    async def found(search: str) -> set[str]:
        return set(await listed(reads, TodoFilter(search=search)))

    assert await found("customer.id=42") == {number.id, string.id}  # a bare number: either way
    assert await found('customer.id="42"') == {string.id}  # quoted: the string only
    assert await found("customer.id=42 order.status=paid") == {number.id}  # every term
    assert await found("  order.status=open  ") == {string.id}
    assert await found('note="two words" ok=true gone=null') == {spaced.id}
    assert await found('tags=["vip"]') == {tagged.id}  # any JSON: a list the tags contain
    assert await found("ok=True") == set()  # not JSON: the string "True"
    assert await found("ok=true ok=1") == set()  # true is not 1
    assert await found("customer.id=42 customer.id=7") == set()  # nothing is both
    assert await found("customer=7") == set()  # customer is an object, not 7


async def test_a_search_without_an_equals_sign_keeps_its_meaning(module_pool, module_store):
    """An id, an idempotency key or words of a title, as before payload search."""
    todo = await enqueue(module_store, "shop", "refund order 9", idempotency_key="k-1", payload={"a": 1})
    await enqueue(module_store, "shop", "other", payload={"a": 1})
    reads = Reads(module_pool)
    for search in (todo.id, "k-1", "order 9"):
        assert await listed(reads, TodoFilter(search=search)) == [todo.id], search


async def test_payload_search_combines_with_the_other_filters(module_pool, module_store):
    hit = await enqueue(module_store, "shop", "hit", kind="refund", assignee="ann", payload={"c": 1})
    await enqueue(module_store, "shop", "other kind", kind="email", assignee="ann", payload={"c": 1})
    await enqueue(module_store, "shop", "other assignee", kind="refund", assignee="bob", payload={"c": 1})
    await enqueue(module_store, "mail", "other queue", kind="refund", assignee="ann", payload={"c": 1})
    held = await enqueue(module_store, "shop", "claimed", kind="refund", assignee="ann", payload={"c": 1})
    await module_store.claim(held.id, "ann", 60)
    reads = Reads(module_pool)
    base = {"queue": "shop", "kind": "refund", "assignee": "ann"}
    assert await listed(reads, TodoFilter(**base, state="pending", search="c=1")) == [hit.id]
    assert await listed(reads, TodoFilter(**base, state="claimed", payload={"c": 1})) == [held.id]
    assert await listed(reads, TodoFilter(**base, owner="ann", search="c=1")) == [held.id]
    both = TodoFilter(**base, state="pending", payload={"c": 1}, search="c=2")
    assert await listed(reads, both) == []  # the object and the terms must all match


async def test_payload_search_pages_by_keyset_and_matches_the_bulk_selection(module_pool, module_store):
    for i in range(23):
        await enqueue(module_store, "shop", f"t{i}", payload={"batch": i % 2, "i": i})
    reads = Reads(module_pool)
    expected = [
        r["id"]
        for r in await module_pool.fetch(
            "SELECT id FROM todos WHERE payload @> '{\"batch\": 1}' ORDER BY created_at DESC, id DESC"
        )
    ]
    assert len(expected) == 11
    for filters in (TodoFilter(queue="shop", search="batch=1"), TodoFilter(payload={"batch": 1})):
        pages, after = [], None
        while True:
            page = await reads.list_todos(filters, limit=4, after=after)
            pages.append([t.id for t in page.items])
            if not (after := page.next_cursor):
                break
        assert [len(p) for p in pages] == [4, 4, 3]
        assert [i for p in pages for i in p] == expected
        assert sorted(await reads.matching_ids(filters, limit=100)) == sorted(expected)


@pytest.mark.parametrize(
    ("search", "says"),
    [
        ("=5", "empty key"),
        ("a..b=1", "empty key"),
        ("customer.=1", "empty key"),
        ("a=1 stray", "'stray' is not key.path=value"),
        ("a= 1", "needs a value"),
        ('a="\\u0000"', "NUL"),
        (" ".join(f"k{i}=1" for i in range(9)), "at most 8"),
        (" ".join(f"k{i}=1" for i in range(5)), "too many bare numbers"),  # 2**5 objects to contain
    ],
)
async def test_a_malformed_search_is_refused_naming_the_search(module_pool, search, says):
    reads = Reads(module_pool)
    for call in (
        reads.list_todos(TodoFilter(queue="shop", search=search)),
        reads.matching_ids(TodoFilter(queue="shop", search=search), limit=10),
    ):
        with pytest.raises(InvalidInput) as caught:
            await call
        assert caught.value.field == "search" and says in caught.value.message, caught.value


# -- the API and the queue page ------------------------------------------------------------

API = "/api/v1/todos"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def web(module_dsn, module_pool):
    """The real app in process (no reaper), with an operator logged in for the pages."""
    async with in_process(await build_app(module_dsn, module_pool, reaper=False)) as client:
        await login(client, module_pool, "pat")
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def bot(module_pool) -> dict:
    return await agent_token(module_pool, "bot", ["shop", "mail"])


async def api_ids(web, bot, **params) -> list[str]:
    response = await web.get(API, headers=bot, params=params)
    assert response.status_code == 200, response.text
    return [t["id"] for t in response.json()["items"]]


async def test_the_api_lists_by_payload_object_and_by_search_terms(web, bot, module_store):
    paid = await enqueue(
        module_store, "shop", "a", payload={"customer": {"id": 42}, "order": {"status": "paid"}}
    )
    other = await enqueue(module_store, "shop", "b", payload={"customer": {"id": "42"}})
    await enqueue(module_store, "shop", "c", payload={"customer": {"id": 7}})
    await enqueue(module_store, "secret", "not the bot's", payload={"customer": {"id": 42}})
    assert await api_ids(web, bot, payload='{"customer": {"id": 42}}') == [paid.id]
    assert await api_ids(web, bot, search="customer.id=42") == [other.id, paid.id]
    assert await api_ids(web, bot, search="customer.id=42 order.status=paid") == [paid.id]
    assert await api_ids(web, bot, payload='{"order": {"status": "paid"}}', search="customer.id=7") == []


async def test_the_api_combines_payload_search_with_the_other_filters(web, bot, module_store):
    hit = await enqueue(module_store, "shop", "hit", kind="refund", assignee="ann", payload={"c": 1})
    await enqueue(module_store, "mail", "other queue", kind="refund", assignee="ann", payload={"c": 1})
    await enqueue(module_store, "shop", "other kind", kind="email", assignee="ann", payload={"c": 1})
    await enqueue(module_store, "shop", "no match", kind="refund", assignee="ann", payload={"c": 2})
    held = await enqueue(module_store, "shop", "held", kind="refund", assignee="ann", payload={"c": 1})
    await module_store.claim(held.id, "ann", 60)
    common = {"queue": "shop", "kind": "refund", "assignee": "ann", "payload": '{"c": 1}'}
    assert await api_ids(web, bot, **common, state="pending") == [hit.id]
    assert await api_ids(web, bot, **common, owner="ann") == [held.id]
    assert await api_ids(web, bot, **common) == [held.id, hit.id]


async def test_the_api_pages_a_payload_search_with_next_and_after(web, bot, module_store, module_pool):
    for i in range(7):
        await enqueue(module_store, "shop", f"t{i}", payload={"even": i % 2 == 0})
    expected = [
        r["id"]
        for r in await module_pool.fetch(
            "SELECT id FROM todos WHERE payload @> '{\"even\": true}' ORDER BY created_at DESC, id DESC"
        )
    ]
    pages, after = [], None
    while True:
        params = {"search": "even=true", "limit": 3, **({"after": after} if after else {})}
        body = (await web.get(API, headers=bot, params=params)).json()
        pages.append([t["id"] for t in body["items"]])
        if not (after := body["next"]):
            break
    assert [len(p) for p in pages] == [3, 1]
    assert [i for p in pages for i in p] == expected


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"payload": "{not json"}, "payload"),
        ({"payload": "[1, 2]"}, "payload"),
        ({"payload": '"text"'}, "payload"),
        ({"payload": '{"a": "\\u0000"}'}, "payload"),
        ({"search": "a..b=1"}, "search"),
        ({"search": "=5"}, "search"),
        ({"search": "a=1 b"}, "search"),
    ],
)
async def test_the_api_refuses_a_malformed_payload_search_naming_it(web, bot, params, field):
    response = await web.get(API, headers=bot, params=params)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["field"] == field and body["detail"].startswith(f"{field}: "), body


async def test_the_queue_page_searches_the_payload_and_shows_a_malformed_search_inline(web, module_store):
    hit = await enqueue(module_store, "shop", "order 1", kind="refund", payload={"order": {"status": "paid"}})
    await enqueue(module_store, "shop", "order 2", kind="refund", payload={"order": {"status": "open"}})

    found = await web.get("/queues/shop", params={"q": "order.status=paid", "kind": "refund"})
    assert found.status_code == 200
    assert ids_in(found.text) == {hit.id}
    assert 'value="order.status=paid"' in found.text

    bad = await web.get(
        "/queues/shop", params={"q": "order..status=paid", "kind": "refund", "state": "ready"}
    )
    assert bad.status_code == 422
    page = text(bad)
    assert "'order..status=' has an empty key" in page
    assert 'class="grow invalid"' in bad.text and 'aria-invalid="true"' in bad.text
    assert 'value="order..status=paid"' in page and 'value="refund"' in page  # the values kept
    assert re.search(r'<option value="ready"\s+selected', bad.text)
    assert ids_in(bad.text) == set() and 'id="todos"' not in bad.text  # no list, nothing refreshing
    assert "<nav" in bad.text  # the whole page, header and all


# -- property: exactly the todos a Python containment filter selects ---------------------------

KEYS = st.sampled_from(["a", "b"])
# Few keys and values, with 1 and "1" often, so that payloads share paths and values.
SCALARS = st.sampled_from([1, "1", 1, "1", 1.0, 0, 1.5, "x", "", True, False, None])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
PAYLOADS = st.dictionaries(KEYS, VALUES, min_size=1, max_size=3)


def nested(path: tuple[str, ...], value: Any) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def paths_in(value: Any, path: tuple[str, ...] = ()):
    """Every (key path, value) of an object, at every depth."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield (*path, key), inner
            yield from paths_in(inner, (*path, key))


@st.composite
def written(draw, value: Any) -> tuple[str, tuple]:
    """A value as a search term writes it, and the values any one of which it matches, as
    the README describes them (written here independently of the parser)."""
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":")), (value,)
    if isinstance(value, int | float):  # bare: the number, or the same digits as a string
        return json.dumps(value), (value, json.dumps(value))
    if value == "x" and draw(st.booleans()):
        return "x", ("x",)  # not JSON: a string
    if value == "1" and draw(st.booleans()):
        return "1", (1, "1")  # a bare number after all
    return json.dumps(value), (value,)


@st.composite
def terms(draw, source: dict) -> tuple[str, list[tuple[tuple[str, ...], tuple]]]:
    """A search box text of 1 or 2 key.path=value terms, and what each term matches. A term
    is mostly a path of `source` with its value there (a list: some of its elements),
    sometimes with another value; or any path and value."""
    found = list(paths_in(source))
    words, meant = [], []
    for _ in range(draw(st.integers(1, 2))):
        if found and draw(st.integers(0, 4)):
            path, value = draw(st.sampled_from(found))
            if isinstance(value, list) and value:
                value = draw(st.lists(st.sampled_from(value), max_size=2))
            if not draw(st.integers(0, 4)):
                value = draw(SCALARS)
        else:
            path, value = tuple(draw(st.lists(KEYS, min_size=1, max_size=3))), draw(VALUES)
        text, choices = draw(written(value))
        words.append(f"{'.'.join(path)}={text}")
        meant.append((path, choices))
    return draw(st.sampled_from([" ", "  ", "\t"])).join(words), meant


@st.composite
def objects(draw, source: dict) -> dict:
    """An object for the API's `payload`: some of `source`'s keys, or any object."""
    if draw(st.integers(0, 3)):
        return {k: v for k, v in source.items() if draw(st.booleans())}
    return draw(PAYLOADS)


def selects(payload: dict, obj: dict | None, meant) -> bool:
    return (obj is None or contains(payload, obj)) and all(
        any(contains(payload, nested(path, v)) for v in choices) for path, choices in meant
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(PAYLOADS, min_size=1, max_size=12), data=st.data())
async def test_payload_search_selects_exactly_what_containment_does(
    module_pool, module_store, payloads, data
):
    await module_pool.execute("DELETE FROM todos")
    made = await module_store.create_many([new_todo("prop", payload=p) for p in payloads])
    ids = {c.todo.id: p for c, p in zip(made, payloads, strict=True)}
    reads = Reads(module_pool)
    for _ in range(3):
        source = data.draw(st.sampled_from(payloads))  # what the query is mostly made of
        given = data.draw(st.sampled_from(["payload", "search", "both"]))
        obj = data.draw(objects(source), label="payload") if given != "search" else None
        search, meant = data.draw(terms(source), label="search") if given != "payload" else (None, [])
        filters = TodoFilter(queue="prop", payload=obj, search=search)
        expected = {i for i, p in ids.items() if selects(p, obj, meant)}
        assert set(await listed(reads, filters, limit=5)) == expected
        assert set(await reads.matching_ids(filters, limit=100)) == expected


# -- plans at scale ----------------------------------------------------------------------------

PLAN_TODOS = 200_000


async def _fill_payloads(conn) -> None:
    """200,000 todos over 20 queues; 2,000 customers of 100 todos each, all in one queue;
    an order status in five (paid in one todo of five)."""
    await conn.execute(
        """INSERT INTO todos (id, queue, title, created_at, ready_at, payload)
           SELECT 'td_' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'todo ' || g,
                  now() - make_interval(secs => g), now() - make_interval(secs => g),
                  jsonb_build_object(
                      'customer', jsonb_build_object('id', g % 2000),
                      'order', jsonb_build_object(
                          'status', (ARRAY['paid', 'open', 'shipped', 'refunded', 'held'])[1 + g % 5]))
           FROM generate_series(1, $1) AS g""",
        PLAN_TODOS,
    )


@pytest.fixture(scope="module")
def payload_db(server_dsn, template_db):
    with analyzed_database(server_dsn, template_db, _fill_payloads) as url:
        yield url


def search_values(search: str, queue: str | None = None) -> dict[str, str]:
    """list_todos' values, as SQL literals, for a search box text (through the parser)."""
    alternatives = containments(parse_terms(search))
    array = "ARRAY[" + ", ".join(f"'{json.dumps(a)}'::jsonb" for a in alternatives) + "]"
    return {"payload_any": array, "limit": "51", **({"queue": f"'{queue}'"} if queue else {})}


@pytest.mark.parametrize("queue", [None, "q07"], ids=["no queue", "one queue"])
async def test_a_selective_payload_search_reads_the_payload_index(payload_db, queue):
    async with connected(payload_db, asyncpg.connect) as conn:
        plan = await explain(
            conn, READS.list_todos, search_values("customer.id=7", queue), "force_custom_plan"
        )
    assert not any(f.startswith("Seq Scan") for f in offenders(plan))  # (its few rows are sorted)
    assert "todos_payload" in index_scans(plan)


async def test_a_broad_payload_search_in_a_queue_walks_it_newest_first_until_a_page_is_found(payload_db):
    """A fifth of the todos match: reading them all through the GIN index and sorting
    them would cost far more than walking the queue newest first."""
    async with connected(payload_db, asyncpg.connect) as conn:
        plan = await explain(
            conn, READS.list_todos, search_values("order.status=paid", "q07"), "force_custom_plan"
        )
    assert offenders(plan) == []
    assert index_scans(plan) == {"todos_by_queue"}
