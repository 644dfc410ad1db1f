"""Every transition of a todo, each one SQL statement from sql/queries/transitions.sql.

The dashboard, the agent API, the Python worker and the reaper all move todos through
this module and nowhere else. `Store` wraps an asyncpg pool or connection (it does not
own it). A transition whose guard matched nothing raises NotFound or Conflict with a
message that says the todo's state, owner and assignee.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import msgspec

from dashboard.errors import Conflict, InvalidInput, NotFound, OutOfScope, TooLarge
from dashboard.models import (
    MAX_ERROR,
    Created,
    NewTodo,
    Todo,
    check_json_object,
    check_lease,
    check_new_todo,
    check_queues,
    check_text,
    check_ttl,
)
from dashboard.queries import TRANSITIONS as SQL

MAX_BATCH = 1000


def new_todo_id() -> str:
    return f"td_{uuid.uuid4()}"


class RetryReport(msgspec.Struct):
    retried: list[str]
    refused: list[tuple[str, str]]  # (todo id, why)

    def summary(self) -> str:
        text = f"{len(self.retried)} retried"
        if self.refused:
            text += f", {len(self.refused)} refused: " + "; ".join(r for _, r in self.refused[:3])
            if len(self.refused) > 3:
                text += "; …"
        return text


class Store:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    # -- producers -------------------------------------------------------------------

    async def create(self, item: NewTodo, *, actor: str = "producer") -> Created:
        """Create one todo; a live todo with the same (queue, key) is returned instead."""
        return (await self.create_many([item], actor=actor))[0]

    async def create_many(self, items: Sequence[NewTodo], *, actor: str = "producer") -> list[Created]:
        """Create many todos in one round trip (two with events), results in input order.

        Duplicates of one (queue, key), within the batch or against a live todo, collapse
        onto one todo and are counted in its dedupe_hits.
        """
        if not items:
            return []
        if len(items) > MAX_BATCH:
            raise TooLarge("todos", f"at most {MAX_BATCH} todos per batch")
        # One row per distinct (queue, key); later duplicates count as hits on the first.
        ids: list[str] = []
        rows: dict[Any, tuple[str, NewTodo, tuple[str, str | None]]] = {}
        extra_hits: dict[str, int] = {}
        for i, item in enumerate(items):
            try:
                encoded = check_new_todo(item)
            except InvalidInput as exc:
                field = f"todos[{i}].{exc.field}" if len(items) > 1 else exc.field
                raise type(exc)(field, exc.message) from None
            todo_id = new_todo_id()
            slot = (item.queue, item.idempotency_key) if item.idempotency_key else todo_id
            if slot in rows:
                first_id = rows[slot][0]
                extra_hits[first_id] += 1
                ids.append(first_id)
            else:
                rows[slot] = (todo_id, item, encoded)
                extra_hits[todo_id] = 0
                ids.append(todo_id)
        ordered = sorted(rows.values(), key=lambda r: (r[1].queue, r[1].idempotency_key or ""))
        events = {tid: (f"ev_{uuid.uuid4()}", it.event, enc[1]) for tid, it, enc in ordered if it.event}

        columns = list(zip(*(
            (tid, it.queue, it.source, it.kind, it.title, payload, it.idempotency_key,
             it.assignee, it.max_attempts, events[tid][0] if tid in events else None,
             extra_hits[tid])
            for tid, it, (payload, _) in ordered
        ), strict=True))
        if events:
            async with self._transaction() as conn:
                await conn.execute(SQL["create_events"], *zip(*(
                    (eid, ev.source, ev.kind, payload) for eid, ev, payload in events.values()
                ), strict=True))
                records = await conn.fetch(SQL["create_todos"], *columns, actor)
        else:
            records = await self.db.fetch(SQL["create_todos"], *columns, actor)

        by_key = {}
        for record in records:
            todo = Todo.from_record(record)
            by_key[todo.id] = todo
            if todo.idempotency_key:
                by_key[(todo.queue, todo.idempotency_key)] = todo
        results, seen = [], set()
        for tid, item in zip(ids, items, strict=True):
            todo = by_key.get(tid) or by_key[(item.queue, item.idempotency_key)]
            results.append(Created(todo=todo, created=todo.id == tid and tid not in seen))
            seen.add(tid)
        return results

    # -- agents ----------------------------------------------------------------------

    async def claim_next(self, queues: Sequence[str], owner: str, ttl: float) -> Todo | None:
        """Claim the oldest claimable todo in `queues`, or None."""
        claimed = await self.claim_batch(queues, owner, ttl, 1)
        return claimed[0] if claimed else None

    async def claim_batch(self, queues: Sequence[str], owner: str, ttl: float, n: int) -> list[Todo]:
        """Claim up to n todos in one statement, oldest first."""
        _, claimed = await self._complete_and_claim(owner, [], queues, ttl, n)
        return claimed

    async def claim(self, todo_id: str, owner: str, ttl: float) -> Todo:
        """Claim one todo by id (due, and not assigned to someone else)."""
        _check_owner(owner)
        record = await self.db.fetchrow(SQL["claim"], check_id(todo_id), owner, check_ttl(ttl))
        if record is None:
            raise await self._miss(todo_id, "claim", owner)
        return Todo.from_record(record)

    # The agent transitions below take `scope`: when given (an API token's queues), a todo
    # outside it is refused with OutOfScope, whoever holds it.

    async def heartbeat(self, todo_id: str, owner: str, lease: int, ttl: float, *, scope=None) -> Todo:
        """Extend the lease to ttl seconds from now."""
        record = await self.db.fetchrow(
            SQL["heartbeat"], check_id(todo_id), owner, check_lease(lease), check_ttl(ttl), _scope(scope))
        return await self._one(record, todo_id, "heartbeat", owner, lease, scope)

    async def release(self, todo_id: str, owner: str, lease: int, *, scope=None) -> Todo:
        """Give the todo back to the queue; the attempt stays counted."""
        record = await self.db.fetchrow(
            SQL["release"], check_id(todo_id), owner, check_lease(lease), _scope(scope))
        return await self._one(record, todo_id, "release", owner, lease, scope)

    async def complete(
        self, todo_id: str, owner: str, lease: int, result: dict | None = None, *, scope=None
    ) -> Todo:
        done, _ = await self._complete_and_claim(owner, [(todo_id, lease, result)], [], 1, 0, scope)
        return done[0]

    async def complete_many(
        self, owner: str, items: Sequence[tuple[str, int, dict | None]], *, scope=None
    ) -> list[Todo]:
        """Complete (id, lease, result) items in one statement: all of them, or a Conflict
        and none."""
        done, _ = await self._complete_and_claim(owner, items, [], 1, 0, scope)
        return done

    async def complete_and_claim_next(
        self, todo_id: str, owner: str, lease: int, result: dict | None,
        queues: Sequence[str], ttl: float, *, scope=None,
    ) -> tuple[Todo, Todo | None]:
        """Complete one todo and claim the next, in one round trip and one commit."""
        done, claimed = await self._complete_and_claim(
            owner, [(todo_id, lease, result)], queues, ttl, 1, scope
        )
        return done[0], (claimed[0] if claimed else None)

    async def fail(self, todo_id: str, owner: str, lease: int, error: str, *, scope=None) -> Todo:
        """Below max_attempts: pending with a retry time; at the cap: dead-lettered."""
        error = check_text(error, "error", required=True, limit=MAX_ERROR)
        record = await self.db.fetchrow(
            SQL["fail"], check_id(todo_id), owner, check_lease(lease), error, _scope(scope))
        return await self._one(record, todo_id, "fail", owner, lease, scope)

    # -- the reaper ------------------------------------------------------------------

    async def reap(self, limit: int = 500) -> list[Todo]:
        """Re-surface (or dead-letter) up to `limit` todos whose lease lapsed."""
        return [Todo.from_record(r) for r in await self.db.fetch(SQL["reap"], limit)]

    async def promote_due_retries(self, limit: int = 500) -> int:
        return await self.db.fetchval(SQL["promote_due_retries"], limit)

    async def prune(self, older_than: float, *, batch: int = 500) -> int:
        """Delete finished todos older than `older_than` seconds, `batch` rows a statement."""
        total = 0
        while True:
            status = await self.db.execute(SQL["prune_finished"], float(older_than), batch)
            deleted = int(status.split()[-1])
            total += deleted
            if deleted < batch:
                return total

    # -- operators -------------------------------------------------------------------

    async def retry(self, todo_id: str, operator: str, *, one_more: bool = False) -> Todo:
        """Dead-letter back to pending: a fresh budget, or (one_more) one more attempt."""
        try:
            record = await self.db.fetchrow(SQL["retry"], check_id(todo_id), operator, one_more)
        except asyncpg.UniqueViolationError:
            raise await self._key_taken(todo_id) from None
        if record is None:
            raise await self._miss(todo_id, "retry", operator)
        return Todo.from_record(record)

    async def retry_many(
        self, todo_ids: Sequence[str], operator: str, *, one_more: bool = False
    ) -> RetryReport:
        """Retry each todo on its own, so one refusal does not stop the rest."""
        report = RetryReport(retried=[], refused=[])
        for todo_id in todo_ids:
            try:
                await self.retry(todo_id, operator, one_more=one_more)
                report.retried.append(todo_id)
            except (Conflict, NotFound) as exc:
                report.refused.append((todo_id, str(exc)))
        return report

    async def force_release(self, todo_id: str, operator: str) -> Todo:
        """Take a lease back from an agent that is gone; recorded with the operator's name."""
        record = await self.db.fetchrow(SQL["force_release"], check_id(todo_id), operator)
        if record is None:
            raise await self._miss(todo_id, "force-release", operator)
        return Todo.from_record(record)

    # -- internals -------------------------------------------------------------------

    async def _complete_and_claim(
        self, owner: str, to_complete: Sequence[tuple[str, int, dict | None]],
        queues: Sequence[str], ttl: float, n: int, scope=None,
    ) -> tuple[list[Todo], list[Todo]]:
        _check_owner(owner)
        if n:
            queues, ttl = check_queues(queues), check_ttl(ttl)
        if len(to_complete) > MAX_BATCH or n > MAX_BATCH or n < 0:
            raise InvalidInput("n", f"batches hold 0 to {MAX_BATCH} todos")
        ids, leases, results = [], [], []
        for todo_id, lease, result in to_complete:
            ids.append(check_id(todo_id))
            leases.append(check_lease(lease))
            results.append(None if result is None else check_json_object(result, "result"))
        if len(set(ids)) < len(ids):
            raise InvalidInput("todos", "the same todo appears twice")
        args = (SQL["complete_and_claim"], list(queues), owner, float(ttl), n, ids, leases, results,
                _scope(scope))
        if len(ids) < 2:  # a miss changed nothing: no transaction needed
            records = await self.db.fetch(*args)
            await self._check_completed(records, to_complete, owner, scope)
        else:  # all or none: a miss rolls back the others
            async with self._transaction() as conn:
                records = await conn.fetch(*args)
                await self._check_completed(records, to_complete, owner, scope)
        return ([Todo.from_record(r) for r in records if r["part"] == "completed"],
                [Todo.from_record(r) for r in records if r["part"] == "claimed"])

    async def _check_completed(self, records, to_complete, owner: str, scope) -> None:
        done = {r["id"] for r in records if r["part"] == "completed"}
        for todo_id, lease, _ in to_complete:
            if todo_id not in done:
                raise await self._miss(todo_id, "complete", owner, lease, scope)

    @asynccontextmanager
    async def _transaction(self):
        if isinstance(self.db, asyncpg.Pool):
            async with self.db.acquire() as conn, conn.transaction():
                yield conn
        else:
            async with self.db.transaction():
                yield self.db

    async def _one(self, record, todo_id: str, action: str, owner: str, lease: int, scope=None) -> Todo:
        if record is None:
            raise await self._miss(todo_id, action, owner, lease, scope)
        return Todo.from_record(record)

    async def _miss(self, todo_id: str, action: str, actor: str, lease: int | None = None, scope=None):
        """Classify a guarded transition that matched nothing."""
        row = await self.db.fetchrow(SQL["classify_miss"], todo_id)
        if row is None:
            return NotFound(f"no todo {todo_id}")
        if scope is not None and row["queue"] not in scope:
            return OutOfScope(f"todo {todo_id} is in queue {row['queue']}, which this token does not cover")
        state, owner, assignee = row["state"], row["owner"], row["assignee"]
        facts = f"it is {state}"
        if state == "claimed":
            facts += f" by {owner}"
        elif owner:
            facts += f" (last owner {owner})"
        if state == "pending" and row["next_retry_at"] and row["next_retry_at"] > row["now"]:
            facts += f", retrying at {row['next_retry_at'].isoformat()}"
        if assignee:
            facts += f", assigned to {assignee}"
        if (
            lease is not None and state == "claimed" and owner == actor
            and lease != row["lease_token"]
        ):
            facts += f"; lease {lease} is stale (the current lease is {row['lease_token']})"
        current = {
            "state": state, "owner": owner, "assignee": assignee,
        }
        return Conflict(f"cannot {action} todo {todo_id}: {facts}", current=current)

    async def _key_taken(self, todo_id: str) -> Conflict:
        row = await self.db.fetchrow("SELECT queue, idempotency_key FROM todos WHERE id = $1", todo_id)
        live = await self.db.fetchrow(SQL["live_todo_with_key"], row["queue"], row["idempotency_key"])
        holder = f"{live['id']} ({live['state']})" if live else "another todo"
        return Conflict(
            f"cannot retry todo {todo_id}: a live todo already holds key "
            f"{row['idempotency_key']!r} in queue {row['queue']}: {holder}",
            current={"live_todo": live["id"] if live else None},
        )


def _check_owner(owner: Any) -> None:
    check_text(owner, "owner", required=True)


def check_id(todo_id: Any) -> str:
    """A todo id PostgreSQL can look up; anything else cannot name a todo."""
    if not isinstance(todo_id, str) or len(todo_id) > 100 or "\x00" in todo_id:
        raise NotFound(f"no todo {todo_id!r}")
    return todo_id


def _scope(scope) -> list[str] | None:
    return None if scope is None else list(scope)
