"""Query-plan regressions for the hot statements, on a table big enough to matter.

200,000 pending todos over 20 queues at three priorities (one queue paused) plus 50,000
claimed ones (half of them lapsed), then ANALYZE. The claim and ack statements and `reap`
are planned both as custom plans (parameter values known) and as the generic plan that a
prepared statement switches to (`plan_cache_mode = force_generic_plan`, what our pool
connections use). None may read
todos with a Seq Scan, or sort rows it read from todos. The list statements run with
custom plans only (Reads plans them for each call's values), so they are checked so.

The claim ends with `ORDER BY ready_at` over the rows it just claimed (at most n, read
from its own CTE): that Sort reads no table and is allowed. Claims are planned both from
the oldest (`after` NULL, a full scan) and from a position (ClaimCursors).

A second table, `quiet`, is what a drained queue looks like when it was analyzed: 100,000
finished todos, a handful claimed and pending. There the statements on one todo by id must
still plan on the primary key: with a near-empty partial index costing the same as the
primary key, a generic plan once took todos_leases, and walked every dead entry in it
while vacuum was held back.

The generic plans are the ones that regress: the planner cannot see `LIMIT :n`, guesses
10% of the pending rows, and (as the claim once did, joining `FROM picked`) hash-joins the
UPDATE against a Seq Scan of the whole table.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from dashboard.queries import READS, TRANSITIONS, Statement
from tests.conftest import analyzed_database, connected

QUEUES = [f"q{i:02d}" for i in range(20)]
SORTS = {"Sort", "Incremental Sort"}


async def _fill(conn) -> None:
    await conn.execute(
        """INSERT INTO todos (id, queue, title, created_at, ready_at, priority)
           SELECT 'td_p' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'pending ' || g,
                  now() - make_interval(secs => g), now() - make_interval(secs => g), g % 3 - 1
           FROM generate_series(1, 200000) AS g"""
    )
    await conn.execute("INSERT INTO queue_pauses (queue, actor_kind, actor) VALUES ('q01', 'operator', 'o')")
    await conn.execute(
        """INSERT INTO todos (id, queue, title, state, owner, attempt, lease_token,
                              claimed_at, lease_expires_at, created_at)
           SELECT 'td_c' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'claimed ' || g,
                  'claimed', 'agent-' || (g % 50), 1, 1, now(),
                  now() + make_interval(secs => (g % 1000) - 500),
                  now() - make_interval(secs => 300000 + g)
           FROM generate_series(1, 50000) AS g"""
    )


@pytest.fixture(scope="module")
def big_db(server_dsn, template_db):
    """One database for the module: 250,000 todos, analyzed."""
    with analyzed_database(server_dsn, template_db, _fill) as url:
        yield url


@pytest.fixture
async def big(big_db):
    """A plain asyncpg connection (the app's sets plan_cache_mode, which explain() sets itself)."""
    async with connected(big_db, asyncpg.connect) as conn:
        yield conn


async def _fill_backlog(conn) -> None:
    await conn.execute(
        """INSERT INTO todos (id, queue, title, created_at, ready_at, priority)
           SELECT 'td_p' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'pending ' || g,
                  now() - make_interval(secs => g), now() - make_interval(secs => g), g % 3 - 1
           FROM generate_series(1, 200000) AS g"""
    )


@pytest.fixture(scope="module")
def backlog_db(server_dsn, template_db):
    """A fresh backlog: 200,000 pending todos at three priorities over 20 queues, nothing
    claimed yet, analyzed. Its statistics once led generic claim plans to read a whole
    priority level through a (queue, -priority, ready_at) index and sort it."""
    with analyzed_database(server_dsn, template_db, _fill_backlog) as url:
        yield url


@pytest.fixture
async def backlog(backlog_db):
    async with connected(backlog_db, asyncpg.connect) as conn:
        yield conn


async def _fill_quiet(conn) -> None:
    await conn.execute(
        """INSERT INTO todos (id, queue, title, state, owner, attempt, completed_at, created_at)
           SELECT 'td_d' || g, 'q' || lpad((g % 20)::text, 2, '0'), 'done ' || g, 'done',
                  'agent-' || (g % 50), 1, now() - make_interval(secs => g),
                  now() - make_interval(secs => g)
           FROM generate_series(1, 100000) AS g"""
    )
    await conn.execute(
        """INSERT INTO todos (id, queue, title, state, owner, attempt, lease_token, claimed_at,
                              lease_expires_at)
           SELECT 'td_c' || g, 'q00', 'claimed ' || g, 'claimed', 'agent-1', 1, 1, now(),
                  now() + interval '30 seconds'
           FROM generate_series(1, 4) AS g"""
    )
    await conn.execute(
        "INSERT INTO todos (id, queue, title)"
        " SELECT 'td_p' || g, 'q00', 'pending' FROM generate_series(1, 4) g"
    )


@pytest.fixture(scope="module")
def quiet_db(server_dsn, template_db):
    with analyzed_database(server_dsn, template_db, _fill_quiet) as url:
        yield url


@pytest.fixture
async def quiet(quiet_db):
    async with connected(quiet_db, asyncpg.connect) as conn:
        yield conn


async def explain(conn, statement: Statement, values: dict[str, str], mode: str) -> dict:
    """The plan of `statement` executed with the SQL literals `values` (by parameter name),
    under `mode`. Parameters not given (optional filters such as a token's queue scope)
    are passed as NULL, their "not used" value.
    """
    unknown = set(values) - set(statement.params)
    assert not unknown, f"{statement.name} takes no {unknown}"
    literals = ", ".join(values.get(p, "NULL") for p in statement.params)
    await conn.execute(f"SET plan_cache_mode = {mode}")
    await conn.execute(f"PREPARE plan_probe AS {statement.sql}")
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


def sorted_input(sort: dict) -> list[dict]:
    """What a Sort sorts: its input, not the statement's CTEs hung on it as InitPlans."""
    return [c for c in sort.get("Plans", []) if c.get("Parent Relationship") not in ("InitPlan", "SubPlan")]


def offenders(plan: dict) -> list[str]:
    found = []
    for node in nodes(plan):
        kind = node["Node Type"]
        if kind == "Seq Scan" and node.get("Relation Name") == "todos":
            found.append(f"Seq Scan on todos (estimated {node['Plan Rows']} rows)")
        if kind in SORTS and any(reads_todos(c) for c in sorted_input(node)):
            found.append(f"{kind} over todos by {node.get('Sort Key')}")
    return found


def index_scans(plan: dict) -> set[str]:
    return {n["Index Name"] for n in nodes(plan) if "Index Name" in n}


def text_array(values: list[str]) -> str:
    return f"'{{{','.join(values)}}}'::text[]"


def claim_args(queues: list[str], n: int = 1, position: tuple[str, str] = ("-10", "NULL")) -> dict[str, str]:
    rank, after = position
    return {
        "queues": text_array(queues),
        "owner": "'agent-1'",
        "ttl": "30",
        "n": str(n),
        "rank": rank,
        "after": after,
    }


MODES = pytest.mark.parametrize(
    "mode", ["force_custom_plan", "force_generic_plan"], ids=["custom", "generic"]
)
# Where a claim starts, as (rank, after): from the oldest, or from a claimer's position
# (ClaimCursors) at the default priority or a lower one (rank 1: priority -1).
AFTER = pytest.mark.parametrize(
    "position",
    [("-10", "NULL"), ("0", "now() - interval '1000 seconds'"), ("1", "now() - interval '1000 seconds'")],
    ids=["full-scan", "from-position", "from-a-lower-priority"],
)
CLAIM_INDEXES = {"todos_ready", "todos_ready_by_queue"}


@MODES
@AFTER
@pytest.mark.parametrize("queue_count", [1, 3, 20], ids=lambda n: f"{n}-queues")
async def test_claim_batch_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode, position, queue_count):
    plan = await explain(big, TRANSITIONS.claim_batch, claim_args(QUEUES[:queue_count], 10, position), mode)
    assert offenders(plan) == []
    assert index_scans(plan) & CLAIM_INDEXES


@MODES
@pytest.mark.parametrize("rank", ["-1", "0", "1"], ids=lambda r: f"rank{r}")
@pytest.mark.parametrize("queue_count", [1, 20], ids=lambda n: f"{n}-queues")
async def test_claims_walk_the_claim_index_in_order_on_a_fresh_mixed_priority_backlog(
    backlog, mode, rank, queue_count
):
    position = (rank, "now() - interval '100000 seconds'")
    plan = await explain(
        backlog, TRANSITIONS.claim_batch, claim_args(QUEUES[:queue_count], 1, position), mode
    )
    assert offenders(plan) == []
    rank_, after = position
    values = {**held_values("complete_and_claim_next"), "queues": text_array(QUEUES[:queue_count])}
    plan = await explain(
        backlog, TRANSITIONS.complete_and_claim_next, {**values, "rank": rank_, "after": after}, mode
    )
    assert offenders(plan) == []


BULK = {
    "cancel_many": {"reason": "'x'"},
    "run_now_many": {},
    "set_many": {"priority": "5", "set_assignee": "false", "assignee": "NULL"},
    "retry_many": {"one_more": "false"},
}


@MODES
@pytest.mark.parametrize("statement", BULK)
async def test_bulk_statements_find_their_rows_by_id_and_join_them_once(big, mode, statement):
    """A thousand ids: each row is looked up on the primary key, never found by walking
    a partial index of its state, and `held` is never rescanned for each updated row."""
    ids = text_array([f"td_p{i}" for i in range(1, 1001)])
    values = {"ids": ids, "actor_kind": "'operator'", "actor": "'o'", **BULK[statement]}
    plan = await explain(big, getattr(TRANSITIONS, statement), values, mode)
    # retry_many keeps one dead todo per key (DISTINCT ON): a sort of at most its ids
    found = [f for f in offenders(plan) if not (statement == "retry_many" and "idempotency_key" in f)]
    assert found == []
    assert index_scans(plan) <= {"todos_pkey", "todos_dedupe"}, index_scans(plan)
    for node in nodes(plan):
        if node["Node Type"] == "Nested Loop":
            inner = [c for c in node["Plans"] if c.get("Parent Relationship") == "Inner"]
            assert not any(c["Node Type"] == "CTE Scan" for c in inner), node


def held_values(statement: str, todo: str = "td_c1", pending: str = "td_p1") -> dict[str, str]:
    """The values of a statement on one todo by id (`pending` for a claim by id)."""
    held = {"id": f"'{todo}'", "owner": "'agent-1'", "lease": "1"}
    return {
        "claim": {"id": f"'{pending}'", "owner": "'agent-1'", "ttl": "30"},
        "complete": {**held, "result": "NULL"},
        "heartbeat": {**held, "ttl": "30"},
        "release": held,
        "fail": {**held, "error": "'boom'"},
        "complete_and_claim_next": {
            **held,
            "result": "NULL",
            "queues": text_array(QUEUES[:3]),
            "ttl": "30",
            "rank": "0",
            "after": "now() - interval '1000 seconds'",
        },
        "complete_many": {
            "ids": text_array([todo, "td_c2"]),
            "leases": "'{1,1}'::bigint[]",
            "results": "'{NULL,NULL}'::text[]",
            "owner": "'agent-1'",
            "all_or_none": "true",
        },
    }[statement]


BY_ID = pytest.mark.parametrize(
    "statement",
    ["claim", "complete", "heartbeat", "release", "fail", "complete_and_claim_next", "complete_many"],
)


@MODES
@AFTER
async def test_complete_and_claim_next_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode, position):
    rank, after = position
    values = {**held_values("complete_and_claim_next"), "rank": rank, "after": after}
    plan = await explain(big, TRANSITIONS.complete_and_claim_next, values, mode)
    assert offenders(plan) == []
    assert "todos_pkey" in index_scans(plan)
    assert index_scans(plan) & CLAIM_INDEXES


@MODES
@BY_ID
async def test_transitions_by_id_plan_on_the_primary_key(big, mode, statement):
    plan = await explain(big, getattr(TRANSITIONS, statement), held_values(statement), mode)
    assert offenders(plan) == []
    assert "todos_pkey" in index_scans(plan)


@MODES
@BY_ID
async def test_transitions_by_id_plan_on_the_primary_key_when_little_is_live(quiet, mode, statement):
    """(A Sort of the few pending rows is allowed here: it is what the planner picks for them.)"""
    plan = await explain(quiet, getattr(TRANSITIONS, statement), held_values(statement), mode)
    assert not any(f.startswith("Seq Scan") for f in offenders(plan))
    assert "todos_pkey" in index_scans(plan)
    assert index_scans(plan) - {"todos_pkey", "queue_pauses_pkey"} <= CLAIM_INDEXES, index_scans(plan)


@MODES
async def test_complete_many_in_both_modes_plans_on_the_primary_key(big, mode):
    for all_or_none in ("true", "false"):  # a worker's batch, POST /acks
        values = {**held_values("complete_many"), "all_or_none": all_or_none}
        plan = await explain(big, TRANSITIONS.complete_many, values, mode)
        assert offenders(plan) == []
        assert "todos_pkey" in index_scans(plan)


@MODES
async def test_promote_due_retries_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode):
    plan = await explain(big, TRANSITIONS.promote_due_retries, {"limit": "500"}, mode)
    assert offenders(plan) == []


@MODES
async def test_reap_plans_without_a_seq_scan_or_a_sort_of_todos(big, mode):
    plan = await explain(big, TRANSITIONS.reap, {"limit": "500"}, mode)
    assert offenders(plan) == []
    assert "todos_leases" in index_scans(plan)


# Filters whose page comes straight off todos_by_queue (queue, created_at, id), in order.
ORDERED_LISTS = {
    "a queue": {"queue": "'q03'"},
    "claimed in a queue": {"queue": "'q03'", "state": "'claimed'"},
    "a queue, page 2": {
        "queue": "'q03'",
        "before_at": "now() - interval '1000 seconds'",
        "before_id": "'td_p1000'",
    },
}
# Filters served by another index (a partial one, or several queues at once) whose rows
# are then sorted: no index holds them in (created_at, id) order. Never a Seq Scan.
SORTED_LISTS = {
    "ready in a queue": {"queue": "'q03'", "state": "'pending'", "face": "'ready'"},
    "a token's queues": {"queues": text_array(QUEUES[:2])},
    "a search in a queue": {"queue": "'q03'", "search": "'td_p3'", "search_like": "'%td\\_p3%'"},
}


@pytest.mark.parametrize("filters", ORDERED_LISTS.values(), ids=ORDERED_LISTS.keys())
async def test_the_todo_list_walks_the_queue_index_in_order(big, filters):
    plan = await explain(big, READS.list_todos, {**filters, "limit": "51"}, "force_custom_plan")
    assert offenders(plan) == []
    assert "todos_by_queue" in index_scans(plan)


@pytest.mark.parametrize("filters", SORTED_LISTS.values(), ids=SORTED_LISTS.keys())
async def test_the_todo_list_reads_through_an_index_for_every_other_filter(big, filters):
    plan = await explain(big, READS.list_todos, {**filters, "limit": "51"}, "force_custom_plan")
    assert not any(f.startswith("Seq Scan") for f in offenders(plan))
    assert index_scans(plan)


@pytest.mark.parametrize("queue", ["NULL", "'q03'"], ids=["all queues", "one queue"])
async def test_the_dead_letter_list_walks_its_index_in_order(big, queue):
    plan = await explain(big, READS.list_dead_letters, {"queue": queue, "limit": "51"}, "force_custom_plan")
    assert offenders(plan) == []
    assert "todos_dead" in index_scans(plan)


async def test_the_plan_checker_catches_a_seq_scan_and_a_sort_of_todos(big):
    """The walk above must see a bad plan when there is one."""
    await big.execute("SET enable_indexscan = off")
    await big.execute("SET enable_bitmapscan = off")
    try:
        plan = await explain(big, TRANSITIONS.claim_batch, claim_args(QUEUES[:1]), "force_custom_plan")
    finally:
        await big.execute("RESET enable_indexscan")
        await big.execute("RESET enable_bitmapscan")
    found = offenders(plan)
    assert any(f.startswith("Seq Scan on todos") for f in found)
    assert any(" over todos by " in f for f in found)
