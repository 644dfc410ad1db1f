"""A model-based test of the queue: random operation sequences against the real store.

A hypothesis state machine drives create / claim / heartbeat / release / complete / fail /
reap / operator retry / force-release (and the time travel that makes leases lapse and
retries come due), and queue control — pause / resume, priorities, schedules (run_at or
delay on create), run now, cancel, edit and bulk set — against a fresh database per
example, and against a small pure-Python model of DESIGN.md's state-machine table
(tests/model.py). After every operation the outcome (success, NotFound, Conflict,
Cancelled, InvalidInput) and the returned todo must match the model; after every step the
whole todos table, its history and the paused queues must match too
(tests/model_machine.py). The rules: tests/model_agents.py and tests/model_operators.py.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from dashboard.errors import Conflict
from dashboard.models import TodoEdit
from tests import factories
from tests.model import OPERATOR, TTL
from tests.model_agents import AgentRules
from tests.model_operators import OperatorRules


class QueueMachine(AgentRules, OperatorRules):
    """Every rule of producers, agents, time and operators on one store."""


def test_queue_matches_model(server_dsn, template_db):
    QueueMachine.server_dsn = server_dsn
    QueueMachine.template_db = template_db
    QueueMachine.databases = made = []
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=80,  # steps are cheap next to cloning a database per example
            deadline=None,
            database=None,  # no .hypothesis folder in the tree
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    # Every example's database was dropped again (teardown closes its connection first).
    assert made
    assert not asyncio.run(_existing(server_dsn, made))


async def _existing(server_dsn: str, names: list[str]) -> list[str]:
    conn = await asyncpg.connect(server_dsn)
    try:
        rows = await conn.fetch("SELECT datname FROM pg_database WHERE datname = ANY ($1::text[])", names)
        return [r["datname"] for r in rows]
    finally:
        await conn.close()


# -- two cases the model found ----------------------------------------------------------


async def test_an_edit_conflict_says_the_assignee(store, control):
    """DESIGN: a refused transition's Conflict says the todo's state, owner and assignee."""
    todo = await factories.claimed(store, "q", assignee="w1", owner="w1")
    with pytest.raises(Conflict) as refused:
        await control.edit(todo.id, OPERATOR, TodoEdit(title="new"))
    assert refused.value.current == {"state": "claimed", "owner": "w1", "assignee": "w1"}


async def test_an_edit_that_keeps_max_attempts_is_not_refused_for_it(store, control):
    """DESIGN: a pending todo's title (priority, …) can be edited. One released at its cap
    and claimed again has used more attempts than max_attempts; an edit that does not
    lower max_attempts has nothing to refuse."""
    todo = await factories.claimed(store, "q", max_attempts=1)
    await store.release(todo.id, "w1", todo.lease_token)
    todo = await store.claim(todo.id, "w1", TTL)
    todo = await store.release(todo.id, "w1", todo.lease_token)
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 2, 1)
    edited = await control.edit(todo.id, OPERATOR, TodoEdit(title="new"))
    assert edited.title == "new"
