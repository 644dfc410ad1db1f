"""Query-plan regressions for the hot statements, on a table big enough to matter.

200,000 pending todos over 20 queues plus 50,000 claimed ones (half of them lapsed), then
ANALYZE. The claim (`complete_and_claim`, which with nothing to complete is claim_next)
and `reap` are planned both as custom plans (parameter values known) and as the generic
plan that a prepared statement switches to (`plan_cache_mode = force_generic_plan`).
Neither may read todos with a Seq Scan, or sort rows it read from todos.

The claim ends with `ORDER BY created_at` over the rows it just claimed (at most n, read
from its own CTE): that Sort reads no table and is allowed.

The generic plans are the ones that regress: the planner cannot see `LIMIT $4`, guesses
10% of the pending rows, and (as the claim once did, joining `FROM picked`) hash-joins the
UPDATE against a Seq Scan of the whole table.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from dashboard.queries import TRANSITIONS
from tests.conftest import connected, scratch_database

QUEUES = [f"q{i:02d}" for i in range(20)]
SORTS = {"Sort", "Incremental Sort"}


async def _fill(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """INSERT INTO todos (id, queue, title, created_at)
               SELECT 'td_p' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'pending ' || g,
                      now() - make_interval(secs => g)
               FROM generate_series(1, 200000) AS g"""
        )
        await conn.execute(
            """INSERT INTO todos (id, queue, title, state, owner, attempt, lease_token,
                                  claimed_at, lease_expires_at, created_at)
               SELECT 'td_c' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'claimed ' || g,
                      'claimed', 'agent-' || (g % 50), 1, 1, now(),
                      now() + make_interval(secs => (g % 1000) - 500),
                      now() - make_interval(secs => 300000 + g)
               FROM generate_series(1, 50000) AS g"""
        )
        await conn.execute("ANALYZE todos")
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def big_db(server_dsn, template_db):
    """One database for the module: 250,000 todos, analyzed."""
    with scratch_database(server_dsn, template_db) as url:
        asyncio.run(_fill(url))
        yield url


@pytest.fixture
async def big(big_db):
    """A plain asyncpg connection (the app's sets plan_cache_mode, which explain() sets itself)."""
    async with connected(big_db, asyncpg.connect) as conn:
        yield conn


async def explain(conn, statement: str, args: list[str], mode: str) -> dict:
    """The plan of TRANSITIONS[statement] executed with literal `args`, under `mode`.

    Parameters past the ones given (optional filters such as a token's queue scope) are
    passed as NULL, their "not used" value.
    """
    sql = TRANSITIONS[statement]
    count = len((await conn.prepare(sql)).get_parameters())
    assert count >= len(args), f"{statement} takes {count} parameters, {len(args)} given"
    literals = ", ".join(args + ["NULL"] * (count - len(args)))
    await conn.execute(f"SET plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE plan_probe AS {sql}")
    try:
        text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE plan_probe({literals})")
    finally:
        await conn.execute("DEALLOCATE plan_probe")
        await conn.execute("RESET plan_cache_mode")
    return json.loads(text)[0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def reads_todos(plan: dict) -> bool:
    return any(n.get("Relation Name") == "todos" for n in nodes(plan))


def offenders(plan: dict) -> list[str]:
    found = []
    for node in nodes(plan):
        kind = node["Node Type"]
        if kind == "Seq Scan" and node.get("Relation Name") == "todos":
            found.append(f"Seq Scan on todos (estimated {node['Plan Rows']} rows)")
        if kind in SORTS and reads_todos(node):
            found.append(f"{kind} over todos by {node.get('Sort Key')}")
    return found


def index_scans(plan: dict) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


def claim_args(queues: list[str], complete: str | None = None, n: int = 1) -> list[str]:
    ids, leases = (f"{{{complete}}}", "{1}") if complete else ("{}", "{}")
    results = "{NULL}" if complete else "{}"
    return [
        f"'{{{','.join(queues)}}}'::text[]",
        "'agent-1'",
        "30",
        str(n),
        f"'{ids}'::text[]",
        f"'{leases}'::bigint[]",
        f"'{results}'::jsonb[]",
    ]


MODES = pytest.mark.parametrize(
    "mode", ["force_custom_plan", "force_generic_plan"], ids=["custom", "generic"]
)


@MODES
@pytest.mark.parametrize("queue_count", [1, 3, 20], ids=lambda n: f"{n}-queues")
async def test_claim_next_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode, queue_count):
    plan = await explain(big, "complete_and_claim", claim_args(QUEUES[:queue_count]), mode)
    assert offenders(plan) == []
    assert index_scans(plan) & {"todos_pending_by_queue", "todos_pending_by_age"}


@MODES
async def test_complete_and_claim_next_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode):
    args = claim_args(QUEUES[:3], complete="td_c1")
    plan = await explain(big, "complete_and_claim", args, mode)
    assert offenders(plan) == []
    assert "todos_pkey" in index_scans(plan)


@MODES
async def test_reap_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode):
    plan = await explain(big, "reap", ["500"], mode)
    assert offenders(plan) == []
    assert "todos_leases" in index_scans(plan)


async def test_the_plan_checker_catches_a_seq_scan_and_a_sort_of_todos(big):
    """The walk above must see a bad plan when there is one."""
    await big.execute("SET enable_indexscan = off")
    await big.execute("SET enable_bitmapscan = off")
    try:
        plan = await explain(big, "complete_and_claim", claim_args(QUEUES[:1]), "force_custom_plan")
    finally:
        await big.execute("RESET enable_indexscan")
        await big.execute("RESET enable_bitmapscan")
    found = offenders(plan)
    assert any(f.startswith("Seq Scan on todos") for f in found)
    assert any(" over todos by " in f for f in found)
