"""What a claim reads in the plain case: one queue, one priority, nothing paused.

claim_scan (sql/queries/fragments.sql) gates its branches on what is in use: the pause
lookup only when a queue is paused, `higher` only below the top level, `same` only from
a claimer's position. These tests run the claim for real (EXPLAIN ANALYZE, rolled back)
under the generic plan our connections use, on 5,000 pending todos, and count the
buffers its scan reads (the LockRows nodes, which hold the todos_ready scans, and any
node on queue_pauses): a count, not a timing. Measured: 6 from a position, 4 from the
oldest (8 before the gates).
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from dashboard.queries import TRANSITIONS
from tests.conftest import analyzed_database, connected

PENDING = 5_000
SCAN_FROM_A_POSITION = 8  # buffers; measured 6 (the `higher` descent, the claim's probe)
SCAN_FROM_THE_OLDEST = 5  # measured 4: one index scan
WHOLE_CLAIM = 40  # the statement, writes and history included; measured 29


async def _fill(conn) -> None:
    await conn.execute(
        """INSERT INTO todos (id, queue, title, ready_at)
           SELECT 'td_p' || lpad(g::text, 5, '0'), 'plain', 'pending ' || g,
                  now() - make_interval(secs => 100000 - g)
           FROM generate_series(1, $1) AS g""",
        PENDING,
    )
    await conn.execute(
        "INSERT INTO todos (id, queue, title) SELECT 'td_o' || g, 'other', 'x' FROM generate_series(1, 50) g"
    )
    await conn.execute("VACUUM todos")


@pytest.fixture(scope="module")
def plain_db(server_dsn, template_db):
    with analyzed_database(server_dsn, template_db, _fill) as url:
        yield url


@pytest.fixture
async def plain(plain_db):
    # No statement cache: claim_plan's DEALLOCATE ALL would drop asyncpg's statements.
    async with connected(plain_db, lambda url: asyncpg.connect(url, statement_cache_size=0)) as conn:
        yield conn


async def claim_plan(conn, rank: int, after: str, paused: str | None = None) -> dict:
    """claim_batch(n=1) for queue 'plain' from (rank, after), run by EXPLAIN ANALYZE under
    the generic plan, then rolled back; `paused`: a queue paused first, in that transaction.
    The second of two runs: the first also reads the catalogs into this connection's caches."""
    await _claim_plan(conn, rank, after, paused)
    return await _claim_plan(conn, rank, after, paused)


async def _claim_plan(conn, rank: int, after: str, paused: str | None) -> dict:
    values = {
        "queues": "'{plain}'",
        "owner": "'agent-1'",
        "ttl": "30",
        "n": "1",
        "rank": str(rank),
        "after": after,
    }
    literals = ", ".join(values[p] for p in TRANSITIONS.claim_batch.params)
    transaction = conn.transaction()
    await transaction.start()
    try:
        if paused:
            await conn.execute(
                "INSERT INTO queue_pauses (queue, actor_kind, actor) VALUES ($1, 'operator', 'o')", paused
            )
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE probe AS {TRANSITIONS.claim_batch.sql}")
        text = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe({literals})")
    finally:
        await transaction.rollback()
        await conn.execute("DEALLOCATE ALL")
    plan = json.loads(text)[0]["Plan"]
    updates = [n for n in nodes(plan) if n["Node Type"] == "ModifyTable" and n["Relation Name"] == "todos"]
    assert [n["Actual Rows"] for n in updates] == [1]  # it claimed one todo
    return plan


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def buffers(node: dict) -> int:
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def scan_buffers(plan: dict) -> int:
    return sum(
        buffers(n)
        for n in nodes(plan)
        if n["Node Type"] == "LockRows" or n.get("Relation Name") == "queue_pauses"
    )


def ran(plan: dict, predicate) -> list[dict]:
    return [n for n in nodes(plan) if predicate(n) and n.get("Actual Loops", 0) > 0]


def claim_index_scans(plan: dict) -> list[dict]:
    return ran(plan, lambda n: n.get("Index Name") == "todos_ready")


def pause_lookups(plan: dict) -> list[dict]:
    """Nodes that ran on queue_pauses other than the one look at whether it is empty."""
    return ran(plan, lambda n: n.get("Relation Name") == "queue_pauses" and n.get("Alias") == "p")


POSITION = "now() - interval '97500 seconds'"  # mid-backlog: todos are ready 99,999 to 95,000 s ago


async def test_a_plain_claim_from_a_position_reads_the_claim_index_twice_and_nothing_for_pauses(plain):
    plan = await claim_plan(plain, 0, POSITION)
    assert len(claim_index_scans(plan)) == 2  # `higher`: one descent, no row; `same`: the claim
    assert pause_lookups(plan) == []
    assert scan_buffers(plan) <= SCAN_FROM_A_POSITION
    assert buffers(plan) <= WHOLE_CLAIM


async def test_a_plain_claim_from_the_oldest_is_one_index_scan(plain):
    plan = await claim_plan(plain, -10, "NULL")
    assert len(claim_index_scans(plan)) == 1
    assert pause_lookups(plan) == []
    assert scan_buffers(plan) <= SCAN_FROM_THE_OLDEST
    assert buffers(plan) <= WHOLE_CLAIM


async def test_a_claim_looks_pauses_up_once_a_queue_is_paused(plain):
    plan = await claim_plan(plain, 0, POSITION, paused="other")
    assert pause_lookups(plan) != []
    plan = await claim_plan(plain, -10, "NULL", paused="other")
    assert pause_lookups(plan) != []
