"""The producers', agents' and reaper's transitions of a todo, each one SQL statement from
sql/queries/transitions.sql; the operators' are in dashboard/control.py.

The agent API, MCP, the Python worker and the reaper move todos through this module and
nowhere else. A transition whose guard matched nothing raises NotFound, Conflict or
Cancelled, saying the todo's state, owner and assignee (dashboard/misses.py). Every input
is checked here, once, whoever the caller is; agent calls pass their token's `Scope`.
A transition that makes work claimable (create, release, fail, reap, a due retry) is
hinted after its commit (dashboard/writer.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from dashboard import metrics
from dashboard.claim_cursor import ClaimCursors
from dashboard.db import transaction
from dashboard.edits import fallback_ahead
from dashboard.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    SwitchboardError,
    TooLarge,
)
from dashboard.models import (
    MAX_ERROR,
    PRODUCER,
    Ack,
    Actor,
    Created,
    NewTodo,
    Scope,
    Todo,
    check_actor,
    check_id,
    check_json_object,
    check_lease,
    check_new_todo,
    check_queues,
    check_text,
    check_ttl,
)
from dashboard.queries import TRANSITIONS as SQL
from dashboard.writer import Writer, recorded, scope_queues

MAX_BATCH = 1000


def new_ids(prefix: str, n: int) -> list[str]:
    """n random version-4 UUIDs after `prefix`, from one read of the system's randomness
    (uuid.uuid4() per id cost a tenth of a batch create's Python time)."""
    raw = bytearray(os.urandom(16 * n))
    for at in range(0, 16 * n, 16):
        raw[at + 6] = raw[at + 6] & 0x0F | 0x40  # version 4
        raw[at + 8] = raw[at + 8] & 0x3F | 0x80  # RFC 4122 variant
    h = raw.hex()
    return [
        f"{prefix}{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-"
        f"{h[i + 16 : i + 20]}-{h[i + 20 : i + 32]}"
        for i in range(0, 32 * n, 32)
    ]


class Store(Writer):
    """The producers', agents' and reaper's transitions (see dashboard/writer.py)."""

    # -- producers -------------------------------------------------------------------

    async def create(self, item: NewTodo, *, actor: Actor = PRODUCER, scope: Scope | None = None) -> Created:
        """Create one todo; a live todo with the same (queue, key) is returned instead."""
        return (await self.create_many([item], actor=actor, scope=scope))[0]

    async def create_many(
        self, items: Sequence[NewTodo], *, actor: Actor = PRODUCER, scope: Scope | None = None
    ) -> list[Created]:
        """Create many todos in one round trip (two with events), results in input order.

        Duplicates of one (queue, key), within the batch or against a live todo, collapse
        onto one todo and are counted in its dedupe_hits. With `scope`, every item's queue
        must be one the token covers (checked before anything else). `actor` is recorded
        on each history row (the agent, for the API; the operator, for the dashboard).
        """
        check_actor(actor)
        if scope is not None:
            scope.check(dict.fromkeys(item.queue for item in items))
        if not items:
            return []
        if len(items) > MAX_BATCH:
            raise TooLarge("todos", f"at most {MAX_BATCH} todos per batch")
        # One row per distinct (queue, key); later duplicates count as hits on the first.
        ids: list[str] = []
        rows: dict[Any, tuple[str, NewTodo, tuple[str, str | None]]] = {}
        extra_hits: dict[str, int] = {}
        untils: list[datetime | None] = []  # each item's assignee_until
        for i, (item, todo_id) in enumerate(zip(items, new_ids("td_", len(items)), strict=True)):
            try:
                encoded = check_new_todo(item)
            except InvalidInput as exc:
                field = f"todos[{i}].{exc.field}" if len(items) > 1 else exc.field
                raise type(exc)(field, exc.message) from None
            untils.append(encoded.assignee_until)
            slot = (item.queue, item.idempotency_key) if item.idempotency_key else todo_id
            if slot in rows:
                first_id = rows[slot][0]
                extra_hits[first_id] += 1
                ids.append(first_id)
            else:
                rows[slot] = (todo_id, item, encoded)
                extra_hits[todo_id] = 0
                ids.append(todo_id)
        if actor.kind == "agent" and any(untils):
            now = (await SQL.assignment_facts.fetchrow(self.db, assignee=None))["now"]
            for i, until in enumerate(untils):
                fallback_ahead(
                    until, now, f"todos[{i}].assignee_until" if len(items) > 1 else "assignee_until"
                )
        ordered = sorted(rows.values(), key=lambda r: (r[1].queue, r[1].idempotency_key or ""))
        with_events = [(tid, it, enc) for tid, it, enc in ordered if it.event]
        events = {
            tid: (event_id, it.event, enc.event_payload)
            for (tid, it, enc), event_id in zip(with_events, new_ids("ev_", len(with_events)), strict=True)
        }

        columns = dict(
            zip(
                _TODO_COLUMNS,
                zip(
                    *(
                        (
                            tid,
                            it.queue,
                            it.source,
                            it.kind,
                            it.title,
                            enc.payload,
                            it.idempotency_key,
                            it.assignee,
                            it.max_attempts,
                            events[tid][0] if tid in events else None,
                            extra_hits[tid],
                            it.priority,
                            enc.run_at,
                            enc.delay,
                            enc.assignee_until,
                        )
                        for tid, it, enc in ordered
                    ),
                    strict=True,
                ),
                strict=True,
            )
        )
        if events:
            async with transaction(self.db) as conn:
                await SQL.create_events.execute(
                    conn,
                    **dict(
                        zip(
                            _EVENT_COLUMNS,
                            zip(
                                *((eid, ev.source, ev.kind, payload) for eid, ev, payload in events.values()),
                                strict=True,
                            ),
                            strict=True,
                        )
                    ),
                )
                records = await SQL.create_todos.fetch(conn, **columns, **recorded(actor))
        else:
            records = await SQL.create_todos.fetch(self.db, **columns, **recorded(actor))

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
        metrics.created(results)
        await self._hint(c.todo.queue for c in results if c.created)
        return results

    # -- agents ----------------------------------------------------------------------
    # `scope`, when given (an API token's), limits the call to the token's queues.

    async def claim_next(
        self, queues: Sequence[str], owner: str, ttl: float, *, scope: Scope | None = None
    ) -> Todo | None:
        """Claim the next todo in `queues` (highest priority, then longest ready), or None."""
        claimed = await self.claim_batch(queues, owner, ttl, 1, scope=scope)
        return claimed[0] if claimed else None

    async def claim_batch(
        self, queues: Sequence[str], owner: str, ttl: float, n: int, *, scope: Scope | None = None
    ) -> list[Todo]:
        """Claim up to n todos in one statement, in claim order (highest priority, then
        longest ready, first)."""
        queues, n = _claimable_from(queues, scope), _batch(n)
        owner, ttl = _owner(owner), check_ttl(ttl)
        records = await self._claiming(
            owner,
            queues,
            lambda rank, after: SQL.claim_batch.fetch(
                self.db, queues=queues, owner=owner, ttl=ttl, n=n, rank=rank, after=after
            ),
        )
        todos = [Todo.from_record(r) for r in records]
        metrics.claimed(todos)
        return todos

    async def claim(
        self, todo_id: str, owner: str, ttl: float, *, scope: Scope | None = None, actor_kind: str = "agent"
    ) -> Todo:
        """Claim one todo by id (due, and not assigned to someone else)."""
        record = await SQL.claim.fetchrow(
            self.db,
            id=check_id(todo_id),
            owner=_owner(owner),
            ttl=check_ttl(ttl),
            scope=scope_queues(scope),
            actor_kind=_holder(actor_kind),
        )
        todo = await self._one(record, todo_id, "claim", owner, None, scope)
        metrics.claimed([todo])
        return todo

    async def heartbeat(
        self,
        todo_id: str,
        owner: str,
        lease: int,
        ttl: float,
        *,
        scope: Scope | None = None,
    ) -> Todo:
        """Extend the lease to ttl seconds from now (no history row: the row holds it)."""
        record = await SQL.heartbeat.fetchrow(
            self.db, **_held(todo_id, owner, lease, scope), ttl=check_ttl(ttl)
        )
        return await self._one(record, todo_id, "heartbeat", owner, lease, scope)

    async def release(
        self, todo_id: str, owner: str, lease: int, *, scope: Scope | None = None, actor_kind: str = "agent"
    ) -> Todo:
        """Give the todo back to the queue; the attempt stays counted."""
        record = await SQL.release.fetchrow(
            self.db, **_held(todo_id, owner, lease, scope), actor_kind=_holder(actor_kind)
        )
        todo = await self._one(record, todo_id, "release", owner, lease, scope)
        metrics.released(todo)
        await self._hint([todo.queue])
        return todo

    async def give_back(self, todos: Sequence[Todo], owner: str) -> list[Todo]:
        """Undo claims whose client went before they reached it (a long-poll whose connection
        closed): pending again, the attempt not counted, the place in line kept. A todo no
        longer held under its claim's lease (reaped, cancelled meanwhile) is left alone."""
        if not todos:
            return []
        records = await SQL.give_back.fetch(
            self.db, ids=[t.id for t in todos], leases=[t.lease_token for t in todos], owner=_owner(owner)
        )
        given = [Todo.from_record(r) for r in records]
        await self._put_back(t.queue for t in given)
        return given

    async def complete(
        self,
        todo_id: str,
        owner: str,
        lease: int,
        result: dict | None = None,
        *,
        scope: Scope | None = None,
        actor_kind: str = "agent",
    ) -> Todo:
        record = await SQL.complete.fetchrow(
            self.db,
            id=check_id(todo_id),
            owner=_owner(owner),
            lease=check_lease(lease),
            scope=scope_queues(scope),
            result=_result(result),
            actor_kind=_holder(actor_kind),
        )
        todo = await self._one(record, todo_id, "complete", owner, lease, scope)
        metrics.completed([todo])
        return todo

    async def complete_many(
        self, owner: str, items: Sequence[tuple[str, int, dict | None]], *, scope: Scope | None = None
    ) -> list[Todo]:
        """Complete (id, lease, result) items in one statement: all of them, or a Conflict
        and none."""
        _owner(owner)
        if len(items) > MAX_BATCH:
            raise InvalidInput("todos", f"batches hold up to {MAX_BATCH} todos")
        ids = [check_id(todo_id) for todo_id, _, _ in items]
        if len(set(ids)) < len(ids):
            raise InvalidInput("todos", "the same todo appears twice")
        leases = [check_lease(lease) for _, lease, _ in items]
        results = [_result(result) for _, _, result in items]
        records = await SQL.complete_many.fetch(
            self.db,
            ids=ids,
            leases=leases,
            results=results,
            owner=owner,
            scope=scope_queues(scope),
            all_or_none=True,
        )
        if len(records) < len(ids):
            raise await self._batch_refusal(ids, leases, owner, scope)
        by_id = {todo.id: todo for todo in await self._after_transition(records)}
        metrics.completed(by_id.values())
        return [by_id[todo_id] for todo_id in ids]

    async def ack_many(
        self, owner: str, acks: Sequence[Ack], *, scope: Scope | None = None
    ) -> list[Todo | SwitchboardError]:
        """Complete or fail each of `acks`, each on its own: the answer, in input order, is
        the todo, or why that one was refused (a stale lease is its Conflict, and the
        others still go through). Completions take one statement; failures one each.
        Malformed input (or a todo named twice) refuses the whole call, before any change."""
        owner, checked = _owner(owner), _checked_acks(acks)
        completing = [ack for ack in checked if ack.error is None]
        records = []
        if completing:
            records = await SQL.complete_many.fetch(
                self.db, **_listed(completing), owner=owner, scope=scope_queues(scope), all_or_none=False
            )
        return await self._answered(owner, checked, records, scope)

    async def ack_and_claim(
        self, owner: str, acks: Sequence[Ack], queues: Sequence[str], ttl: float, n: int
    ) -> tuple[list[Todo | SwitchboardError], list[Todo]]:
        """ack_many, and claim_batch of up to `n` more, in one round trip: the completions
        and the claim are one statement and one commit (the Python Worker's, whose handlers
        free their slots as they finish); failures follow one each, as in ack_many."""
        owner, checked = _owner(owner), _checked_acks(acks)
        queues, ttl, n = _claimable_from(queues, None), check_ttl(ttl), _batch(n)
        listed = _listed([ack for ack in checked if ack.error is None])
        records = await self._claiming(
            owner,
            queues,
            lambda rank, after: SQL.complete_many_and_claim.fetch(
                self.db,
                **listed,
                owner=owner,
                scope=None,
                all_or_none=False,
                queues=queues,
                ttl=ttl,
                n=n,
                rank=rank,
                after=after,
            ),
        )
        claimed = [Todo.from_record(r) for r in records if r["part"] == "claimed"]
        metrics.claimed(claimed)
        done = [r for r in records if r["part"] == "completed"]
        return await self._answered(owner, checked, done, None), claimed

    async def _answered(
        self, owner: str, checked: list[Ack], completed: list, scope: Scope | None
    ) -> list[Todo | SwitchboardError]:
        """The answers of ack_many, in input order, once the completions' statement
        returned `completed`: the failures are made one each, the misses classified."""
        done = await self._after_transition(completed)
        metrics.completed(done)
        answers: dict[str, Todo | SwitchboardError] = {todo.id: todo for todo in done}
        for ack in checked:
            if ack.id in answers:
                continue
            try:
                if ack.error is None:
                    raise await self._refusal(ack.id, "complete", owner, ack.lease, scope)
                answers[ack.id] = await self.fail(ack.id, owner, ack.lease, ack.error, scope=scope)
            except (Conflict, NotFound) as exc:
                answers[ack.id] = exc
        return [answers[ack.id] for ack in checked]

    async def complete_and_claim_next(
        self,
        todo_id: str,
        owner: str,
        lease: int,
        result: dict | None,
        queues: Sequence[str],
        ttl: float,
        *,
        scope: Scope | None = None,
    ) -> tuple[Todo, Todo | None]:
        """Complete one todo and claim the next, in one round trip and one commit."""
        queues = _claimable_from(queues, scope)
        held, result, ttl = _held(todo_id, owner, lease, scope), _result(result), check_ttl(ttl)
        records = await self._claiming(
            held["owner"],
            queues,
            lambda rank, after: SQL.complete_and_claim_next.fetch(
                self.db, **held, result=result, queues=queues, ttl=ttl, rank=rank, after=after
            ),
        )
        done = await self._after_transition(r for r in records if r["part"] == "completed")
        if not done:
            raise await self._refusal(todo_id, "complete", owner, lease, scope)
        claimed = [Todo.from_record(r) for r in records if r["part"] == "claimed"]
        metrics.completed(done)
        metrics.claimed(claimed)
        return done[0], (claimed[0] if claimed else None)

    async def fail(
        self,
        todo_id: str,
        owner: str,
        lease: int,
        error: str,
        *,
        scope: Scope | None = None,
        actor_kind: str = "agent",
    ) -> Todo:
        """Below max_attempts: pending with a retry time; at the cap: dead-lettered."""
        record = await SQL.fail.fetchrow(
            self.db,
            **_held(todo_id, owner, lease, scope),
            error=_error(error),
            actor_kind=_holder(actor_kind),
        )
        todo = await self._one(record, todo_id, "fail", owner, lease, scope)
        metrics.failed(todo)
        await self._hint([todo.queue])
        return todo

    # -- the reaper ------------------------------------------------------------------

    async def reap(self, limit: int = 500) -> list[Todo]:
        """Re-surface (or dead-letter) up to `limit` todos whose lease lapsed."""
        todos = await self._after_transition(await SQL.reap.fetch(self.db, limit=limit))
        metrics.reaped(todos)
        await self._hint(t.queue for t in todos)
        return todos

    async def promote_due_retries(self, limit: int = 500) -> int:
        """Clear the retry time of up to `limit` due retries, so their queues are hinted
        (claims take a due retry without this)."""
        row = await SQL.promote_due_retries.fetchrow(self.db, limit=limit)
        await self._hint(row["queues"])
        return row["promoted"]

    async def prune(self, older_than: float, *, batch: int = 500) -> int:
        """Delete finished todos older than `older_than` seconds, `batch` rows a statement."""
        total = 0
        while True:
            status = await SQL.prune_finished.execute(self.db, older_than=float(older_than), batch=batch)
            deleted = int(status.split()[-1])
            total += deleted
            if deleted < batch:
                return total

    # -- waiters ---------------------------------------------------------------------

    async def watch(self, todo_id: str, *, scope: Scope | None = None) -> None:
        """Mark a pending or claimed todo watched: whichever transition finishes it then
        hints it by id. Subscribe first (Hub.watch) and read the todo after this: either
        the finishing statement sees the mark, or the read sees the todo finished."""
        await SQL.watch.execute(self.db, id=check_id(todo_id), scope=scope_queues(scope))

    # -- internals -------------------------------------------------------------------

    async def _claiming(
        self, owner: str, queues: list[str], claim: Callable[[int, datetime | None], Awaitable[list]]
    ) -> list:
        """`claim(rank, after)` from this claimer's position, which then moves to the last
        todo it claimed (dashboard/claim_cursor.py); its rows."""
        key = ClaimCursors.key(owner, queues)
        start = self.cursors.start(key)
        began = time.monotonic()
        records = await claim(*start)
        claimed = [(-r["priority"], r["ready_at"]) for r in records if r.get("part", "claimed") == "claimed"]
        self.cursors.ended(key, start, claimed, time.monotonic() - began)
        return records

    async def _batch_refusal(
        self, ids: list[str], leases: list[int], owner: str, scope: Scope | None
    ) -> Exception:
        """Why an all-or-none batch completed nothing: the first of its todos not held."""
        for todo_id, lease in zip(ids, leases, strict=True):
            row = await SQL.classify_miss.fetchrow(self.db, id=todo_id)
            held = row is not None and (row["state"], row["owner"], row["lease_token"]) == (
                "claimed",
                owner,
                lease,
            )
            if not held or (scope is not None and row["queue"] not in scope.queues):
                return await self._refusal(todo_id, "complete", owner, lease, scope)
        return Conflict("cannot complete the batch: its todos changed meanwhile; try again")


_TODO_COLUMNS = (
    "ids",
    "queues",
    "sources",
    "kinds",
    "titles",
    "payloads",
    "idempotency_keys",
    "assignees",
    "max_attempts",
    "event_ids",
    "dedupe_hits",
    "priorities",
    "run_ats",
    "delays",
    "assignee_untils",
)
_EVENT_COLUMNS = ("ids", "sources", "kinds", "payloads")


def _held(todo_id: Any, owner: Any, lease: Any, scope: Scope | None) -> dict[str, Any]:
    """The checked values every statement on a held todo takes (its guard's)."""
    return {
        "id": check_id(todo_id),
        "owner": _owner(owner),
        "lease": check_lease(lease),
        "scope": scope_queues(scope),
    }


def _checked_acks(acks: Sequence[Ack]) -> list[Ack]:
    """`acks` checked (ack_many): at most MAX_BATCH, each todo once."""
    if len(acks) > MAX_BATCH:
        raise InvalidInput("acks", f"batches hold up to {MAX_BATCH} acks")
    checked = [_checked_ack(i, ack) for i, ack in enumerate(acks)]
    if len({ack.id for ack in checked}) < len(checked):
        raise InvalidInput("acks", "the same todo appears twice")
    return checked


def _listed(completing: list[Ack]) -> dict[str, list]:
    """complete_listed's parameters (fragments.sql) for these completions."""
    return {
        "ids": [ack.id for ack in completing],
        "leases": [ack.lease for ack in completing],
        "results": [ack.result for ack in completing],
    }


def _batch(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BATCH:
        raise InvalidInput("n", f"batches hold 0 to {MAX_BATCH} todos")
    return n


def _checked_ack(i: int, ack: Ack) -> Ack:
    """`ack` with its values checked (the result encoded), errors naming acks[i]."""
    try:
        if ack.error is not None:
            return Ack(check_id(ack.id), check_lease(ack.lease), error=_error(ack.error))
        return Ack(check_id(ack.id), check_lease(ack.lease), result=_result(ack.result))
    except InvalidInput as exc:
        raise type(exc)(f"acks[{i}].{exc.field}", exc.message) from None


def _error(error: Any) -> str:
    return check_text(error, "error", required=True, limit=MAX_ERROR)


def _owner(owner: Any) -> str:
    return check_text(owner, "owner", required=True)


def _holder(kind: Any) -> str:
    """Who may hold a lease, as its history rows record them: an agent, or an operator
    working their inbox (DESIGN.md "Inbox"), under the same name as `owner`."""
    if kind not in ("agent", "operator"):
        raise InvalidInput("actor_kind", "a lease is held by an agent or an operator")
    return kind


def _claimable_from(queues: Sequence[str], scope: Scope | None) -> list[str]:
    """The queues a claim names, checked: valid names first, then the token's scope."""
    queues = check_queues(queues)
    if scope is not None:
        scope.check(queues)
    return queues


def _result(result: dict | None) -> str | None:
    return None if result is None else check_json_object(result, "result")
