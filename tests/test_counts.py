"""The overview's counts: exact below the limit, the last sample marked approximate above
it, never negative; completions counted from the rollups plus the minutes not rolled yet."""

from __future__ import annotations

import pytest

from dashboard import reads as reads_module
from dashboard.reads import Reads
from dashboard.rollups import Rollups
from dashboard.store import Store
from dashboard.web.templating import figure
from tests.factories import claimed, dead_letter, enqueue, login, new_todo, retrying
from tests.web_helpers import get_page, text


async def stats_of(conn, queue: str):
    (s,) = [s for s in await Reads(conn).queue_stats() if s.queue == queue]
    return s


async def test_counts_are_exact_below_the_limit(conn):
    store = Store(conn)
    for i in range(3):
        await enqueue(store, "exact", f"r{i}")
    await enqueue(store, "exact", "later", delay=600)
    await retrying(store, conn, "exact")
    await claimed(store, "exact")
    await dead_letter(store, conn, "exact")
    done = await claimed(store, "exact")
    await store.complete(done.id, done.owner, done.lease_token)

    s = await stats_of(conn, "exact")

    assert (s.ready, s.scheduled, s.retrying, s.claimed, s.dead, s.done_recent) == (3, 1, 1, 1, 1, 1)
    assert s.approximate == frozenset()
    assert s.oldest_ready_age is not None and s.oldest_ready_age >= 0


async def test_counts_above_the_limit_show_the_sample_as_approximate(conn, monkeypatch):
    monkeypatch.setattr(reads_module, "EXACT_COUNT_LIMIT", 5)
    store = Store(conn)
    for i in range(8):
        await enqueue(store, "big", f"r{i}")
    await enqueue(store, "big", "later", delay=600)

    s = await stats_of(conn, "big")
    assert s.ready == 5 and "ready" in s.approximate  # no sample yet: at least the limit
    assert s.scheduled == 1 and "scheduled" not in s.approximate

    await Rollups(conn).sample()
    s = await stats_of(conn, "big")
    assert s.ready == 8 and "ready" in s.approximate

    # drained below the limit: exact again, whatever the sample said
    await conn.execute("DELETE FROM todos WHERE queue = 'big' AND ready_at <= now() AND title <> 'r0'")
    s = await stats_of(conn, "big")
    assert s.ready == 1 and s.approximate == frozenset()


async def test_counts_are_never_negative_and_empty_queues_leave(conn):
    store = Store(conn)
    todo = await claimed(store, "gone")
    await store.complete(todo.id, todo.owner, todo.lease_token)
    for s in await Reads(conn).queue_stats():
        assert min(s.ready, s.scheduled, s.retrying, s.claimed, s.dead, s.done_recent) >= 0
    await conn.execute("DELETE FROM todos")
    assert await Reads(conn).queue_stats() == []


@pytest.mark.parametrize(
    ("value", "approximate", "shown"),
    [
        (1234, False, "1,234"),
        (1234, True, "about 1.2k"),
        (1_234_567, True, "about 1.2M"),
        (12_345_678, True, "about 12M"),
        (999, True, "about 999"),
    ],
)
def test_figures(value, approximate, shown):
    assert figure(value, approximate) == shown


async def test_leases_above_their_limit_show_the_sample(conn, monkeypatch):
    monkeypatch.setattr(reads_module, "LEASE_COUNT_LIMIT", 3)
    store = Store(conn)
    for i in range(4):
        await claimed(store, "held", f"t{i}")

    s = await stats_of(conn, "held")
    assert s.claimed == 3 and "claimed" in s.approximate

    await Rollups(conn).sample()
    s = await stats_of(conn, "held")
    assert s.claimed == 4 and "claimed" in s.approximate


async def test_a_long_list_says_how_many_match(client_without_reaper, pool, store, monkeypatch):
    """Past a page, the queue page counts up to 1,000 matches; past that it shows the
    queue's count for a state filter ('about …'), and '1,000+' for any other filter."""
    monkeypatch.setattr(reads_module, "EXACT_COUNT_LIMIT", 5)
    await login(client_without_reaper, pool)
    for batch in (range(0, 1000), range(1000, 1003)):
        await store.create_many([new_todo("long", f"t{i}") for i in batch])
    await enqueue(store, "short", "only")

    page = await get_page(client_without_reaper, "/queues/short")
    assert "1 matching" in text(page)
    page = await get_page(client_without_reaper, "/queues/long?state=ready")
    assert "1,000+ matching" in text(page)  # the count stopped at its limit (5), and no sample yet
    await Rollups(pool).sample()
    page = await get_page(client_without_reaper, "/queues/long?state=ready")
    assert "about 1.0k matching" in text(page)
    page = await get_page(client_without_reaper, "/queues/long?q=t1")
    assert "114 matching" in text(page)  # t1, t10…t19, t100…t199, t1000…t1002
    page = await get_page(client_without_reaper, "/queues/long")
    assert "1,000+ matching" in text(page)
