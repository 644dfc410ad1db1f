"""Where claims start (dashboard/claim_cursor.py): the bookkeeping on its own, on the
process's clock (a stand-in here: no database time is involved), and then what it buys
on a real server: a claim from its position reads a handful of pages however many todos
were claimed before it, with vacuum held back, where a claim from the oldest reads them all."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from dashboard import claim_cursor
from dashboard.claim_cursor import FROM_THE_OLDEST, FULL_SCAN_EVERY, MAX_FULL_SCAN_EVERY, ClaimCursors
from dashboard.queries import TRANSITIONS
from tests.factories import new_todo
from tests.test_horizon import report
from tests.test_plans import CLAIM_INDEXES, nodes

T0 = datetime(2026, 1, 1, tzinfo=UTC)
P0 = (0, T0)  # a place in claim order: (rank, ready_at), rank = -priority
KEY = ClaimCursors.key("w1", ["b", "a", "a"])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cursors(clock) -> ClaimCursors:
    return ClaimCursors(clock)


def test_a_claimer_is_its_owner_and_its_set_of_queues():
    assert KEY == ClaimCursors.key("w1", ["a", "b"]) != ClaimCursors.key("w2", ["a", "b"])


def test_the_first_claim_scans_from_the_oldest_and_the_next_from_where_it_ended(cursors):
    assert cursors.start(KEY) == FROM_THE_OLDEST
    cursors.ended(KEY, FROM_THE_OLDEST, [P0, (0, T0 + timedelta(seconds=1))], took=0.001)
    assert cursors.start(KEY) == (0, T0 + timedelta(seconds=1))


def test_a_claim_that_took_nothing_leaves_the_position(cursors):
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=0.001)
    after = cursors.start(KEY)
    cursors.ended(KEY, after, [], took=0.001)
    assert cursors.start(KEY) == P0


def test_a_full_scan_comes_again_after_a_second(cursors, clock):
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=0.001)
    clock.now += FULL_SCAN_EVERY - 0.01
    assert cursors.start(KEY) == P0
    clock.now += 0.02
    assert cursors.start(KEY) == FROM_THE_OLDEST


def test_expensive_full_scans_come_less_often_but_within_the_poll_interval(cursors, clock):
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=0.05)  # 50 ms: the next one 2.5 s later
    clock.now += 2.4
    assert cursors.start(KEY) == P0
    clock.now += 0.2
    assert cursors.start(KEY) == FROM_THE_OLDEST
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=3.0)  # far too slow: still within the poll interval
    clock.now += MAX_FULL_SCAN_EVERY - 0.01
    assert cursors.start(KEY) == P0
    clock.now += 0.02
    assert cursors.start(KEY) == FROM_THE_OLDEST


def test_claims_that_start_during_a_full_scan_use_the_position(cursors, clock):
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=0.001)
    clock.now += FULL_SCAN_EVERY
    assert cursors.start(KEY) == FROM_THE_OLDEST  # a full scan, still running
    assert cursors.start(KEY) == P0


def test_a_full_scan_that_finds_a_todo_behind_moves_the_position_back_to_it(cursors, clock):
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [P0], took=0.001)
    clock.now += FULL_SCAN_EVERY
    cursors.start(KEY)
    cursors.ended(KEY, FROM_THE_OLDEST, [(0, T0 - timedelta(hours=1))], took=0.001)
    assert cursors.start(KEY) == (0, T0 - timedelta(hours=1))


def test_the_least_recently_used_claimer_is_forgotten_first(monkeypatch, cursors):
    monkeypatch.setattr(claim_cursor, "CAPACITY", 2)
    for owner in ("a", "b"):
        key = ClaimCursors.key(owner, ["q"])
        cursors.start(key)
        cursors.ended(key, FROM_THE_OLDEST, [P0], took=0.001)
    cursors.start(ClaimCursors.key("a", ["q"]))  # a used again: b is the oldest now
    cursors.start(ClaimCursors.key("c", ["q"]))
    assert cursors.start(ClaimCursors.key("a", ["q"])) == P0
    assert cursors.start(ClaimCursors.key("b", ["q"])) == FROM_THE_OLDEST  # forgotten: from the oldest


# -- on a real server ----------------------------------------------------------------------


async def pages_read(conn, after: str) -> int:
    """Shared buffers the scans of a claim of one todo read from `after` (a SQL literal),
    in its generic plan, rolled back: index pages and the heap pages of the rows it steps
    over (the claim's writes are not counted)."""
    literals = {
        "queues": "'{q}'::text[]",
        "owner": "'probe'",
        "ttl": "30",
        "n": "1",
        "rank": "0",
        "after": after,
    }
    args = ", ".join(literals[p] for p in TRANSITIONS.claim_batch.params)
    await conn.execute("BEGIN")
    try:
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE probe AS {TRANSITIONS.claim_batch.sql}")
        for _ in range(2):  # the first run also reads what any first run reads (queue_pauses)
            text = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe({args})")
    finally:
        await conn.execute("ROLLBACK")
        await conn.execute("DEALLOCATE ALL")
    scans = [n for n in nodes(json.loads(text)[0]["Plan"]) if n.get("Index Name") in CLAIM_INDEXES]
    assert len(scans) == 3, scans  # higher, same and lower priority levels
    return sum(s["Shared Hit Blocks"] + s["Shared Read Blocks"] for s in scans)


async def test_a_claim_from_its_position_steps_over_nothing_claimed_before_it(dsn, conn, store):
    """5,000 todos claimed and completed while a report holds vacuum back: their dead
    index entries stay, and a claim from the oldest reads through them all."""
    async with report(dsn):
        for start in range(0, 6000, 1000):
            await store.create_many([new_todo("q", f"t{i}") for i in range(start, start + 1000)])
        last = None
        for _ in range(50):
            batch = await store.claim_batch(["q"], "w1", 30, 100)
            await store.complete_many("w1", [(t.id, t.lease_token, None) for t in batch])
            last = batch[-1]
        from_position = await pages_read(conn, f"'{last.ready_at.isoformat()}'::timestamptz")
        from_oldest = await pages_read(conn, "NULL")
    # From its position a claim pays the three scans' first probes alone (tests/test_claim_cost.py);
    # from the oldest it reads through the entries of everything claimed before (PostgreSQL 15
    # counts a heap page read again for the next row on it once: 33 against 5 here).
    assert from_position <= 8 and from_oldest > 4 * from_position, (from_oldest, from_position)
