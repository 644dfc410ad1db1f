"""What every writer of todos shares: the database, where hints go, this process's claim
positions, and the way a transition's rows come back or are refused.

Two writers move todos, each one SQL statement a transition from
sql/queries/transitions.sql: `dashboard.store.Store` (producers, agents and the reaper)
and `dashboard.control.Control` (operators, and tokens within their scope). Neither owns
the pool or connection it is given.

Hints (DESIGN.md "Notifications") go after the commit, never inside it: through `hints`
(the process's Hub, which coalesces them), or without one by a statement of its own.
Claims and completions, the hot path, send none, except for a todo someone waits on
(`Store.watch`): finished, it is hinted by id (`_after_transition`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import asyncpg

from dashboard import misses
from dashboard.claim_cursor import ClaimCursors
from dashboard.errors import DatabaseUnavailable
from dashboard.models import FINISHED, Actor, Scope, Todo
from dashboard.queries import HINTS

log = logging.getLogger("switchboard.store")


class HintSink(Protocol):
    """Where hints go after a commit (dashboard.notify.Hub): `send` must not wait."""

    def send(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None: ...


class Writer:
    def __init__(
        self,
        db: asyncpg.Pool | asyncpg.Connection,
        hints: HintSink | None = None,
        cursors: ClaimCursors | None = None,
    ):
        """`cursors`: the claim positions of this process's claimers, shared by its
        writers, since an operator's change can leave todos behind them."""
        self.db = db
        self.hints = hints
        self.cursors = cursors if cursors is not None else ClaimCursors()

    async def _hint(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None:
        """Hint `queues` (and finished watched `todos`) after the commit. Without a hub, by
        one statement, whose failure is logged, not raised: the change is committed, and a
        lost hint only delays work (claimers and waiters poll)."""
        due, finished = set(queues), set(todos)
        if not due and not finished:
            return
        if self.hints is not None:
            self.hints.send(due, finished)
            return
        try:
            await HINTS.send.execute(self.db, queues=sorted(due), todos=sorted(finished))
        except DatabaseUnavailable as exc:
            log.warning("hint for %s not sent (%s): claimers and waiters poll", sorted(due | finished), exc)

    async def _put_back(self, queues: Iterable[str], *, anywhere: bool = False) -> None:
        """Todos are claimable again at a place this process's claimers may have passed (given
        back, a queue resumed, an edit): the claimers of `queues` scan from the oldest next
        time (claim_cursor.py), and the queues are hinted. `anywhere`: the change may have
        put todos behind any claimer (an edit can move one to another queue, priority or
        owner), so every claimer does. The one place claim positions are reset."""
        queues = set(queues)
        if anywhere:
            self.cursors.forget()
        for queue in queues:
            self.cursors.forget(queue)
        await self._hint(queues)

    async def _after_transition(self, records: Iterable) -> list[Todo]:
        """The todos of a transition's rows, with its waiters woken: the one place where
        finishing is hinted, so a watched todo (`watch`) the statement left done or failed
        is hinted by id, after the commit. An unwatched one, the hot path, costs a look at
        a column of the row in hand."""
        records = list(records)
        finished = [r["id"] for r in records if r.get("watched") and r["state"] in FINISHED]
        if finished:
            await self._hint((), finished)
        return [Todo.from_record(r) for r in records]

    async def _one(self, record, todo_id: str, action: str, actor: str, lease: int | None, scope) -> Todo:
        """The todo of a one-row transition, or its refusal raised."""
        if record is None:
            raise await self._refusal(todo_id, action, actor, lease, scope)
        return (await self._after_transition([record]))[0]

    async def _refusal(
        self, todo_id: str, action: str, actor: str, lease: int | None = None, scope: Scope | None = None
    ) -> Exception:
        """Why `action` matched nothing (dashboard/misses.py); a stale lease is recorded."""
        miss = await misses.classify(self.db, todo_id, action, actor, lease, scope)
        if miss.stale and miss.queue is not None and lease is not None:
            await misses.record_stale_ack(self.db, todo_id, action, actor, lease, miss.queue)
        return miss.error


def recorded(actor: Actor) -> dict[str, str]:
    """The (:actor_kind, :actor) a history row records."""
    return {"actor_kind": actor.kind, "actor": actor.name}


def scope_queues(scope: Scope | None) -> list[str] | None:
    """The :scope a statement takes: a token's queues, or None for everything."""
    return None if scope is None else list(scope.queues)
