"""Input bounds: every argument Store takes out of range or of the wrong kind is refused
as InvalidInput naming the field, and a refused call writes nothing.

The module's tests share one database, emptied before each test (fresh_module_db).
"""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from dashboard.errors import InvalidInput
from dashboard.models import MAX_JSON_BYTES
from tests.conftest import ONE_DATABASE_PER_MODULE
from tests.factories import (
    claimed,
    enqueue,
    new_todo,
    snapshot,
    todo_row,
)

pytestmark = ONE_DATABASE_PER_MODULE


# -- input bounds ----------------------------------------------------------------------

BAD_TTLS = [0, 0.5, -1, 43200.5, 86400, True, "30", None, math.nan, math.inf]


async def test_a_ttl_outside_one_second_to_twelve_hours_is_refused_and_writes_nothing(
    module_store, module_pool
):
    pending = await enqueue(module_store)
    held = await claimed(module_store)
    before = await snapshot(module_pool)
    for ttl in BAD_TTLS:
        calls = {
            "claim_next": lambda ttl=ttl: module_store.claim_next(["q"], "w1", ttl),
            "claim_batch": lambda ttl=ttl: module_store.claim_batch(["q"], "w1", ttl, 5),
            "claim": lambda ttl=ttl: module_store.claim(pending.id, "w1", ttl),
            "heartbeat": lambda ttl=ttl: module_store.heartbeat(held.id, "w1", held.lease_token, ttl),
            "complete_and_claim_next": lambda ttl=ttl: module_store.complete_and_claim_next(
                held.id, "w1", held.lease_token, None, ["q"], ttl
            ),
        }
        for name, call in calls.items():
            with pytest.raises(InvalidInput) as exc:
                await call()
            assert exc.value.field == "ttl", (name, ttl)
    assert await snapshot(module_pool) == before


async def test_a_ttl_at_either_bound_is_accepted(module_store, module_pool):
    await module_store.create_many([new_todo(), new_todo()])
    for ttl in (1, 43200):
        todo = await module_store.claim_next(["q"], "w1", ttl)
        lease = (todo.lease_expires_at - todo.claimed_at).total_seconds()
        assert abs(lease - ttl) < 1, ttl


async def test_max_attempts_outside_one_to_a_hundred_is_refused_and_writes_nothing(module_store, module_pool):
    for max_attempts in (0, -1, 101, True, 2.5, "3", None):
        with pytest.raises(InvalidInput) as exc:
            await module_store.create(new_todo(max_attempts=max_attempts))
        assert exc.value.field == "max_attempts", max_attempts
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0
    assert await module_pool.fetchval("SELECT count(*) FROM todo_history") == 0


async def test_max_attempts_at_either_bound_is_accepted(module_store):
    for max_attempts in (1, 100):
        assert (await enqueue(module_store, max_attempts=max_attempts)).max_attempts == max_attempts


BAD_QUEUES = ["", "A", "Mail", "-x", "_x", ".x", "has space", "x" * 64, "é", "a/b", None, 7]


async def test_a_bad_queue_name_is_refused_and_writes_nothing(module_store, module_pool):
    await module_store.create(new_todo(queue="ok"))
    before = await snapshot(module_pool)
    for queue in BAD_QUEUES:
        with pytest.raises(InvalidInput) as exc:
            await module_store.create(new_todo(queue=queue))
        assert exc.value.field == "queue", queue
        with pytest.raises(InvalidInput) as exc:
            await module_store.claim_next(["ok", queue], "w1", 30)
        assert exc.value.field == "queues", queue
    assert await snapshot(module_pool) == before


async def test_claim_next_needs_a_non_empty_list_of_queues(module_store, module_pool):
    await module_store.create(new_todo())
    for queues in ([], "q", None):
        with pytest.raises(InvalidInput) as exc:
            await module_store.claim_next(queues, "w1", 30)
        assert exc.value.field == "queues", queues
    assert await module_pool.fetchval("SELECT state::text FROM todos") == "pending"


async def test_good_queue_names_are_accepted(module_store):
    for queue in ("a", "0", "a.b_c-d", "x" * 63):
        assert (await enqueue(module_store, queue=queue)).queue == queue


async def test_a_queue_name_with_a_trailing_newline_is_refused_as_invalid_input(module_store, module_pool):
    """re.match with `$` accepts "q\\n"; the database CHECK does not."""
    with pytest.raises(InvalidInput):
        await module_store.create(new_todo(queue="q\n"))


def _payload_of_size(size: int) -> dict:
    """A payload whose JSON encoding (compact, as the store measures it) is `size` bytes."""
    return {"x": "a" * (size - len('{"x":""}'))}


async def test_a_payload_at_the_size_limit_is_accepted(module_store):
    assert (await module_store.create(new_todo(payload=_payload_of_size(MAX_JSON_BYTES)))).created


async def test_a_payload_over_256_kib_is_refused_and_writes_nothing(module_store, module_pool):
    with pytest.raises(InvalidInput) as exc:
        await module_store.create(new_todo(payload=_payload_of_size(MAX_JSON_BYTES + 1)))
    assert exc.value.field == "payload"
    assert "262144" in exc.value.message
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_a_payload_that_is_not_a_json_object_is_refused_and_writes_nothing(module_store, module_pool):
    for payload in ([], ["a"], "text", 3, None):
        with pytest.raises(InvalidInput) as exc:
            await module_store.create(new_todo(payload=payload))
        assert exc.value.field == "payload", payload
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_a_result_that_is_not_a_json_object_within_the_limit_is_refused(module_store, module_pool):
    held = await claimed(module_store)
    waiting = await enqueue(module_store)
    before = await snapshot(module_pool)
    for result in (["a"], "done", 1, _payload_of_size(MAX_JSON_BYTES + 1)):
        for call in (
            lambda r=result: module_store.complete(held.id, "w1", held.lease_token, r),
            lambda r=result: module_store.complete_many("w1", [(held.id, held.lease_token, r)]),
            lambda r=result: module_store.complete_and_claim_next(
                held.id, "w1", held.lease_token, r, ["q"], 30
            ),
        ):
            with pytest.raises(InvalidInput) as exc:
                await call()
            assert exc.value.field == "result", str(result)[:20]
    assert await snapshot(module_pool) == before
    assert (await todo_row(module_pool, waiting.id)).state == "pending"


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("payload", {"payload": {"x": math.nan}}),
        ("payload", {"payload": {"at": datetime(2026, 1, 1)}}),
        ("payload", {"payload": {"x": "nul\x00byte"}}),
        ("title", {"title": "nul\x00byte"}),
    ],
    ids=["nan", "datetime", "nul-in-payload", "nul-in-title"],
)
async def test_a_value_postgres_cannot_store_is_refused_as_invalid_input(
    module_store, module_pool, field, fields
):
    """NaN, non-JSON types and NUL characters once escaped as raw asyncpg errors."""
    with pytest.raises(InvalidInput) as exc:
        await module_store.create(new_todo(**fields))
    assert exc.value.field == field
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


EMPTY_KEYS = pytest.mark.parametrize("key", ["", "   "], ids=["empty", "blank"])


@EMPTY_KEYS
async def test_an_empty_idempotency_key_is_refused_and_writes_nothing(module_store, module_pool, key):
    """Once: KeyError after counting the hit."""
    with pytest.raises(InvalidInput) as exc:
        await module_store.create(new_todo(idempotency_key=key))
    assert exc.value.field == "idempotency_key"
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


@EMPTY_KEYS
async def test_an_empty_idempotency_key_in_a_batch_is_refused_naming_the_item(module_store, module_pool, key):
    """Once: CardinalityViolation in a batch."""
    with pytest.raises(InvalidInput) as exc:
        await module_store.create_many([new_todo(idempotency_key=key), new_todo(idempotency_key=key)])
    assert exc.value.field == "todos[0].idempotency_key"
    assert await module_pool.fetchval("SELECT count(*) FROM todos") == 0


async def test_an_empty_owner_is_refused(module_store, module_pool):
    todo = await enqueue(module_store)
    for call in (
        lambda: module_store.claim_next(["q"], "", 30),
        lambda: module_store.claim(todo.id, " ", 30),
    ):
        with pytest.raises(InvalidInput) as exc:
            await call()
        assert exc.value.field == "owner"
    assert (await todo_row(module_pool, todo.id)).state == "pending"
