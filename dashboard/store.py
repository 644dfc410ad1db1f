"""Every transition of a todo, each one SQL statement from sql/queries/transitions.sql.

The dashboard, the agent API, the Python worker and the reaper all move todos through
this module and nowhere else. `Store` wraps an asyncpg pool or connection (it does not
own it). A transition whose guard matched nothing raises NotFound or Conflict with a
message that says the todo's state, owner and assignee. Every input is checked here,
once, whoever the caller is; agent calls pass their token's `Scope`.

A transition that makes work claimable or dead (create, release, fail, reap, a due
retry, retry, force-release) is hinted after its commit, never inside it (DESIGN.md,
"Notifications"): through `hints` (the process's Hub, which coalesces them), or without
one by a statement of its own. Claims and completions, the hot path, send none, except
for a todo someone waits on (`watch`): finished, it is hinted by id (`_todos`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg
import msgspec

from dashboard import metrics
from dashboard.claim_cursor import ClaimCursors
from dashboard.db import transaction
from dashboard.errors import (
    Cancelled,
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    NotAllowed,
    NotFound,
    Stale,
    SwitchboardError,
    TooLarge,
)
from dashboard.models import (
    EDITABLE,
    MAX_ERROR,
    MAX_REASON,
    PRODUCER,
    Ack,
    Actor,
    Created,
    NewTodo,
    QueuePause,
    Scope,
    Todo,
    TodoEdit,
    check_actor,
    check_edit,
    check_id,
    check_json_object,
    check_lease,
    check_new_todo,
    check_priority,
    check_queue,
    check_queues,
    check_text,
    check_ttl,
    check_version,
    json_encode,
)
from dashboard.queries import HINTS, READS
from dashboard.queries import TRANSITIONS as SQL
from dashboard.reads import CHANGES_BYTES_SHOWN, HistoryEntry

log = logging.getLogger("switchboard.store")
MAX_BATCH = 1000
FINISHED = frozenset({"done", "failed"})  # what a waiter waits for (dashboard/web/waits.py)


class HintSink(Protocol):
    """Where hints go after a commit (dashboard.notify.Hub): `send` must not wait."""

    def send(self, queues: Iterable[str], todos: Iterable[str] = ()) -> None: ...


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


class BulkReport(msgspec.Struct):
    """What a bulk action did: the todos it changed, and how many it skipped, by the state
    they were in (a todo already in the asked-for shape counts under its state too)."""

    done: str  # the verb: "cancelled", "made ready", …
    changed: list[Todo]
    skipped: dict[str, int]
    examples: list[str] = msgspec.field(default_factory=list)  # why some were skipped, in words

    def summary(self) -> str:
        text = f"{len(self.changed)} {self.done}"
        if self.skipped:
            skipped = sorted(self.skipped.items())
            reasons = ", ".join(f"{n} {_SKIPPED.get(state, state)}" for state, n in skipped)
            text += f"; {sum(self.skipped.values())} skipped ({reasons})"
        if self.examples:
            more = "; …" if sum(self.skipped.values()) > len(self.examples) else ""
            text += ": " + "; ".join(self.examples) + more
        return text


_SKIPPED = {
    "pending": "pending",
    "claimed": "claimed",
    "done": "already done",
    "failed": "dead",
    "gone": "no longer there",
}
BULK_BATCH = 1000  # todos per statement of a bulk action
EXAMPLES = 3  # skipped todos a bulk report explains one by one


class Store:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection, hints: HintSink | None = None):
        self.db = db
        self.hints = hints
        self.cursors = ClaimCursors()

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
                _fallback_ahead(
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
                records = await SQL.create_todos.fetch(conn, **columns, **_recorded(actor))
        else:
            records = await SQL.create_todos.fetch(self.db, **columns, **_recorded(actor))

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
        queues = _claimable_from(queues, scope)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BATCH:
            raise InvalidInput("n", f"batches hold 0 to {MAX_BATCH} todos")
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
            scope=_queues(scope),
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
        actor_kind: str = "agent",
    ) -> Todo:
        """Extend the lease to ttl seconds from now."""
        record = await SQL.heartbeat.fetchrow(
            self.db, **_held(todo_id, owner, lease, scope), ttl=check_ttl(ttl), actor_kind=_holder(actor_kind)
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
        queues = {t.queue for t in given}
        for queue in queues:  # this process's claimers have passed their place in line
            self.cursors.forget(queue)
        await self._hint(queues)
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
            **_held(todo_id, owner, lease, scope),
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
            scope=_queues(scope),
            all_or_none=True,
        )
        if len(records) < len(ids):
            raise await self._batch_miss(ids, leases, owner, scope)
        by_id = {todo.id: todo for todo in await self._todos(records)}
        metrics.completed(by_id.values())
        return [by_id[todo_id] for todo_id in ids]

    async def ack_many(
        self, owner: str, acks: Sequence[Ack], *, scope: Scope | None = None
    ) -> list[Todo | SwitchboardError]:
        """Complete or fail each of `acks`, each on its own: the answer, in input order, is
        the todo, or why that one was refused (a stale lease is its Conflict, and the
        others still go through). Completions take one statement; failures one each.
        Malformed input (or a todo named twice) refuses the whole call, before any change."""
        _owner(owner)
        if len(acks) > MAX_BATCH:
            raise InvalidInput("acks", f"batches hold up to {MAX_BATCH} acks")
        checked = [_checked_ack(i, ack) for i, ack in enumerate(acks)]
        if len({ack.id for ack in checked}) < len(checked):
            raise InvalidInput("acks", "the same todo appears twice")
        completing = [ack for ack in checked if ack.error is None]
        answers: dict[str, Todo | SwitchboardError] = {}
        if completing:
            records = await SQL.complete_many.fetch(
                self.db,
                ids=[ack.id for ack in completing],
                leases=[ack.lease for ack in completing],
                results=[ack.result for ack in completing],
                owner=owner,
                scope=_queues(scope),
                all_or_none=False,
            )
            done = await self._todos(records)
            metrics.completed(done)
            answers.update((todo.id, todo) for todo in done)
        for ack in checked:
            if ack.id in answers:
                continue
            try:
                if ack.error is None:
                    raise await self._miss(ack.id, "complete", owner, ack.lease, scope)
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
        done = await self._todos(r for r in records if r["part"] == "completed")
        if not done:
            raise await self._miss(todo_id, "complete", owner, lease, scope)
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
        todos = await self._todos(await SQL.reap.fetch(self.db, limit=limit))
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

    # -- operators -------------------------------------------------------------------

    async def retry(self, todo_id: str, actor: Actor, *, one_more: bool = False) -> Todo:
        """Dead-letter back to pending: a fresh budget, or (one_more) one more attempt."""
        try:
            record = await _retried(self.db, check_id(todo_id), check_actor(actor), one_more=one_more)
        except asyncpg.UniqueViolationError:
            raise await self._key_taken(todo_id) from None
        todo = await self._one(record, todo_id, "retry", actor.name, None, None)
        metrics.retried(todo)
        await self._hint([todo.queue])
        return todo

    async def retry_many(
        self, todo_ids: Sequence[str], actor: Actor, *, one_more: bool = False
    ) -> BulkReport:
        """Retry many dead-letters, BULK_BATCH a statement; one whose key a live todo holds
        stays dead (counted among the skipped)."""
        actor = check_actor(actor)

        async def batch(ids: list[str]) -> list:
            try:
                return await SQL.retry_many.fetch(self.db, ids=ids, **_recorded(actor), one_more=one_more)
            except asyncpg.UniqueViolationError:  # a key taken meanwhile: one by one
                records = []
                for todo_id in ids:
                    with contextlib.suppress(asyncpg.UniqueViolationError):
                        if record := await _retried(self.db, todo_id, actor, one_more=one_more):
                            records.append(record)
                return records

        report = await self._bulk("retried", todo_ids, batch)
        if "failed" in report.skipped:  # still dead: a live todo holds its key
            report.skipped["key held by a live todo"] = report.skipped.pop("failed")
            retried = {t.id for t in report.changed}
            for todo_id in [i for i in todo_ids if i not in retried][:EXAMPLES]:
                row = await SQL.live_todo_with_key.fetchrow(self.db, id=todo_id)
                if row is not None and row["live_id"]:
                    report.examples.append(str(_key_conflict(todo_id, row)))
        for todo in report.changed:
            metrics.retried(todo)
        await self._hint(t.queue for t in report.changed)
        return report

    async def force_release(self, todo_id: str, actor: Actor) -> Todo:
        """Take a lease back from an agent that is gone; recorded as `actor` (the operator)."""
        record = await SQL.force_release.fetchrow(
            self.db, id=check_id(todo_id), **_recorded(check_actor(actor))
        )
        todo = await self._one(record, todo_id, "force-release", actor.name, None, None)
        metrics.released(todo)
        await self._hint([todo.queue])
        return todo

    # -- queue control (DESIGN.md "Queue control") ----------------------------------
    # Operators from the dashboard and the CLI; agents and producers over the API, within
    # their token's `scope`. Each change is one guarded statement with its history row.

    async def pause(
        self, queue: str, actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> QueuePause:
        """Claims skip the queue until it is resumed; enqueue, heartbeats and acks go on.
        Pausing a paused queue keeps the first pause (who, when, why)."""
        queue, actor, reason = _queue_in(queue, scope), check_actor(actor), _reason(reason)
        paused = await SQL.pause_queue.fetchrow(self.db, queue=queue, **_recorded(actor), reason=reason)
        if paused is not None:
            await self._hint([queue])  # pages showing the queue refresh; claimers find nothing
        return QueuePause(**dict(paused or await SQL.queue_pause.fetchrow(self.db, queue=queue)))

    async def resume(
        self, queue: str, actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> bool:
        """Claims take from the queue again, and its waiting claimers are woken at once.
        False when it was not paused."""
        queue, actor, reason = _queue_in(queue, scope), check_actor(actor), _reason(reason)
        resumed = await SQL.resume_queue.fetchrow(self.db, queue=queue, **_recorded(actor), reason=reason)
        if resumed is not None:
            self.cursors.forget(queue)
            await self._hint([queue])
        return resumed is not None

    async def cancel(
        self, todo_id: str, actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> Todo:
        """A pending or claimed todo is dead-lettered as cancelled (who, when, why); its
        holder, if any, learns it at its next heartbeat or ack (Cancelled)."""
        report = await self.cancel_many([todo_id], actor, reason, scope=scope)
        if not report.changed:
            raise await self._miss(todo_id, "cancel", actor.name, None, scope)
        return report.changed[0]

    async def cancel_many(
        self, todo_ids: Sequence[str], actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> BulkReport:
        actor, reason = check_actor(actor), _reason(reason)
        report = await self._bulk(
            "cancelled",
            todo_ids,
            lambda ids: SQL.cancel_many.fetch(
                self.db, ids=ids, **_recorded(actor), reason=reason, scope=_queues(scope)
            ),
        )
        for todo in report.changed:
            metrics.cancelled(todo)
        await self._hint(t.queue for t in report.changed)
        return report

    async def run_now(self, todo_id: str, actor: Actor, *, scope: Scope | None = None) -> Todo:
        """A scheduled or retrying todo becomes claimable now."""
        report = await self.run_now_many([todo_id], actor, scope=scope)
        if not report.changed:
            miss = await self._miss(todo_id, "run", actor.name, None, scope)
            if isinstance(miss, Conflict) and miss.current.get("state") == "pending":
                miss = Conflict(
                    f"todo {todo_id} is ready already: there is nothing to run now", current=miss.current
                )
            raise miss
        return report.changed[0]

    async def run_now_many(
        self, todo_ids: Sequence[str], actor: Actor, *, scope: Scope | None = None
    ) -> BulkReport:
        actor = check_actor(actor)
        report = await self._bulk(
            "made ready",
            todo_ids,
            lambda ids: SQL.run_now_many.fetch(self.db, ids=ids, **_recorded(actor), scope=_queues(scope)),
        )
        await self._hint(t.queue for t in report.changed)
        return report

    async def set_many(
        self,
        todo_ids: Sequence[str],
        actor: Actor,
        *,
        priority: int | None = None,
        assignee: str | msgspec.UnsetType | None = msgspec.UNSET,
        scope: Scope | None = None,
    ) -> BulkReport:
        """Set the priority and/or the assignee (None: nobody) of pending and dead todos;
        those already so are skipped."""
        actor = check_actor(actor)
        if priority is None and assignee is msgspec.UNSET:
            raise InvalidInput("priority", "say what to set: a priority or an assignee")
        if priority is not None:
            check_priority(priority)
        set_assignee = assignee is not msgspec.UNSET
        assignee = check_text(assignee, "assignee") if set_assignee else None
        report = await self._bulk(
            "changed",
            todo_ids,
            lambda ids: SQL.set_many.fetch(
                self.db,
                ids=ids,
                **_recorded(actor),
                priority=priority,
                set_assignee=set_assignee,
                assignee=assignee,
                scope=_queues(scope),
            ),
        )
        self.cursors.forget()
        await self._hint(t.queue for t in report.changed if t.state == "pending")
        return report

    async def edit(
        self,
        todo_id: str,
        actor: Actor,
        edit: TodoEdit,
        *,
        retry: bool = False,
        version: str | None = None,
        scope: Scope | None = None,
    ) -> Todo:
        """Change a pending or dead todo (never a claimed one); the history row says what
        changed, old → new. With `retry`, a dead todo is retried (a fresh budget) and
        edited in one transaction: both or neither. With `version` (Todo.version of what
        the caller read), a todo changed since is refused (Stale, saying what changed);
        without, the fields given are written over the todo as it is."""
        check_actor(actor)
        todo_id = check_id(todo_id)
        if version is not None:
            check_version(version)
        if not retry:
            todo = await _edit(self.db, todo_id, actor, edit, scope, version)
        else:
            try:
                async with transaction(self.db) as conn:
                    if version is not None:  # before the retry changes it
                        await _unchanged(conn, await _read(conn, todo_id, scope, SQL.lock_todo), version)
                    record = await _retried(conn, todo_id, actor, one_more=False)
                    if record is None:
                        raise await self._miss(todo_id, "retry", actor.name, None, scope)
                    todo = await _edit(conn, todo_id, actor, edit, scope)
            except asyncpg.UniqueViolationError:
                raise await self._key_taken(todo_id) from None
            metrics.retried(todo)
        self.cursors.forget()
        if todo.state == "pending":
            await self._hint([todo.queue])
        return todo

    async def _bulk(
        self, done: str, todo_ids: Sequence[str], run: Callable[[list[str]], Awaitable[list]]
    ) -> BulkReport:
        """`run` over `todo_ids` in batches of BULK_BATCH, one statement each; the report
        says what changed and, for the rest, what state they were in instead."""
        ids = list(dict.fromkeys(check_id(todo_id) for todo_id in todo_ids))
        if not ids:
            raise InvalidInput("ids", "select at least one todo")
        changed: list[Todo] = []
        for at in range(0, len(ids), BULK_BATCH):
            changed += await self._todos(await run(ids[at : at + BULK_BATCH]))
        left = sorted(set(ids) - {t.id for t in changed})
        skipped = {}
        if left:
            skipped = {r["state"]: r["n"] for r in await SQL.states_of.fetch(self.db, ids=left)}
            if missing := len(left) - sum(skipped.values()):
                skipped["gone"] = missing
        return BulkReport(done=done, changed=changed, skipped=skipped)

    # -- waiters ---------------------------------------------------------------------

    async def watch(self, todo_id: str, *, scope: Scope | None = None) -> None:
        """Mark a pending or claimed todo watched: whichever transition finishes it then
        hints it by id. Subscribe first (Hub.watch) and read the todo after this: either
        the finishing statement sees the mark, or the read sees the todo finished."""
        await SQL.watch.execute(self.db, id=check_id(todo_id), scope=_queues(scope))

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

    async def _todos(self, records: Iterable) -> list[Todo]:
        """The todos of a transition's rows; the one place where finishing is hinted, so
        every transition that turns its rows into todos here wakes waiters: a watched todo
        (`watch`) the statement left done or failed is hinted by id, after the commit. An
        unwatched one, the hot path, costs a look at a column of the row in hand."""
        records = list(records)
        finished = [r["id"] for r in records if r.get("watched") and r["state"] in FINISHED]
        if finished:
            await self._hint((), finished)
        return [Todo.from_record(r) for r in records]

    async def _one(self, record, todo_id: str, action: str, owner: str, lease: int | None, scope) -> Todo:
        if record is None:
            raise await self._miss(todo_id, action, owner, lease, scope)
        return (await self._todos([record]))[0]

    async def _miss(
        self, todo_id: str, action: str, actor: str, lease: int | None = None, scope: Scope | None = None
    ) -> Exception:
        """Classify a guarded transition that matched nothing (a todo outside `scope`
        raises NotFound right here: to its token, it does not exist)."""
        row = await SQL.classify_miss.fetchrow(self.db, id=todo_id)
        if row is None:
            return NotFound(f"no todo {todo_id}")
        if scope is not None:
            scope.check_todo(todo_id, row["queue"])
        state, owner, assignee = row["state"], row["owner"], row["assignee"]
        if row["cancelled_at"] is not None:
            by = f"{row['cancelled_by_kind']} {row['cancelled_by']}"
            why = f": {row['cancel_reason']}" if row["cancel_reason"] else ""
            facts = f"it was cancelled by {by} at {row['cancelled_at'].isoformat()}{why}"
            if lease is not None and owner == actor and lease == row["lease_token"]:
                # Its holder: stop the work, nobody wants it any more.
                return Cancelled(
                    f"cannot {action} todo {todo_id}: {facts}; stop working on it",
                    current={
                        "state": state,
                        "cancelled_by_kind": row["cancelled_by_kind"],
                        "cancelled_by": row["cancelled_by"],
                        "reason": row["cancel_reason"],
                    },
                )
        else:
            facts = f"it is {state}"
        if state == "claimed":
            facts += f" by {owner}"
        elif owner and row["cancelled_at"] is None:
            facts += f" (last owner {owner})"
        if state == "pending" and row["ready_at"] > row["now"]:
            if row["next_retry_at"]:
                facts += f", retrying at {row['next_retry_at'].isoformat()}"
            else:
                facts += f", scheduled for {row['ready_at'].isoformat()}"
        if assignee:
            facts += f", assigned to {assignee}"
            if row["assignee_until"]:
                facts += f" until {row['assignee_until'].isoformat()}"
        if row["paused_at"] is not None and state == "pending":
            facts += f"; queue {row['queue']} is paused"
            if row["paused_reason"]:
                facts += f" ({row['paused_reason']})"
        if lease is not None and state == "claimed" and owner == actor and lease != row["lease_token"]:
            facts += f"; lease {lease} is stale (the current lease is {row['lease_token']})"
        if lease is not None and lease != row["lease_token"]:  # a later claim superseded it
            metrics.fenced(row["queue"], action)
            await SQL.record_stale_ack.execute(
                self.db, agent=actor, id=todo_id, queue=row["queue"], action=action, lease=lease
            )
        current = {
            "state": state,
            "owner": owner,
            "assignee": assignee,
        }
        return Conflict(f"cannot {action} todo {todo_id}: {facts}", current=current)

    async def _batch_miss(
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
                return await self._miss(todo_id, "complete", owner, lease, scope)
        return Conflict("cannot complete the batch: its todos changed meanwhile; try again")

    async def _key_taken(self, todo_id: str) -> Conflict:
        return _key_conflict(todo_id, await SQL.live_todo_with_key.fetchrow(self.db, id=todo_id))


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
        "scope": _queues(scope),
    }


def _checked_ack(i: int, ack: Ack) -> Ack:
    """`ack` with its values checked (the result encoded), errors naming acks[i]."""
    try:
        if ack.error is not None:
            return Ack(check_id(ack.id), check_lease(ack.lease), error=_error(ack.error))
        return Ack(check_id(ack.id), check_lease(ack.lease), result=_result(ack.result))
    except InvalidInput as exc:
        raise type(exc)(f"acks[{i}].{exc.field}", exc.message) from None


async def _retried(db, todo_id: str, actor: Actor, *, one_more: bool):
    """The retry statement's row (None: not dead); raises UniqueViolationError when a live
    todo holds the key (then a transaction it ran in is aborted: classify outside it)."""
    return await SQL.retry.fetchrow(db, id=todo_id, **_recorded(actor), one_more=one_more)


def _key_conflict(todo_id: str, row) -> Conflict:
    """Why dead todo `todo_id` cannot be retried: `row` (live_todo_with_key) names the live
    todo that holds its key."""
    holder = f"{row['live_id']} ({row['live_state']})" if row["live_id"] else "another todo"
    return Conflict(
        f"cannot retry todo {todo_id}: a live todo already holds key "
        f"{row['idempotency_key']!r} in queue {row['queue']}: {holder}",
        current={"live_todo": row["live_id"]},
    )


def _reason(reason: Any) -> str | None:
    reason = check_text(reason, "reason", limit=MAX_REASON)
    return reason.strip() or None if reason is not None else None


def _queue_in(queue: Any, scope: Scope | None) -> str:
    queue = check_queue(queue)
    if scope is not None:
        scope.check([queue])
    return queue


CHANGES_SHOWN = 10  # the latest changes a Stale conflict lists (it counts the rest)


async def _read(db, todo_id: str, scope: Scope | None, statement=READS.todo) -> Todo:
    row = await statement.fetchrow(db, id=todo_id)
    if row is None:
        raise NotFound(f"no todo {todo_id}")
    if scope is not None:
        scope.check_todo(todo_id, row["queue"])
    return Todo.from_record(row)


async def _unchanged(db, todo: Todo, version: str | None) -> None:
    """Refuse an edit by a caller that read another version of `todo` (Stale), saying
    what changed it since: who, when, what, from its history."""
    if version is None or version == todo.version:
        return
    rows = await READS.history_since.fetch(
        db, id=todo.id, since=check_version(version), limit=CHANGES_SHOWN, changes_max=CHANGES_BYTES_SHOWN
    )
    rows.reverse()
    untold = rows[0]["total"] - len(rows) if rows else 0
    told = [
        f"{row['at'].astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC {row['actor_kind']} {row['actor']}: "
        + _short(row["note"], 200)
        for row in rows
    ]
    if untold:
        told.insert(0, f"{untold} earlier change" + ("s" if untold > 1 else ""))
    what = ": " + "; ".join(told) if told else ""
    raise Stale(
        f"cannot edit todo {todo.id}: it changed after version {version} was read{what}; "
        f"it is version {todo.version} now",
        current={
            "state": todo.state,
            "version": todo.version,
            "changed_since": [HistoryEntry(**{k: v for k, v in row.items() if k != "total"}) for row in rows],
            "changes_untold": untold or None,
        },
    )


async def _edit(
    db, todo_id: str, actor: Actor, edit: TodoEdit, scope: Scope | None, version: str | None = None
) -> Todo:
    """Read the todo, check the edit against it, and write it guarded by the version read
    (updated_at): a todo claimed or changed meanwhile is refused, not overwritten. With
    `version`, the caller's read must be that one too."""
    given = edit.given()
    if not given:
        raise InvalidInput("edit", "give at least one field to change")
    if "idempotency_key" in given:  # forbid_unknown_fields refuses it from JSON already
        raise InvalidInput("idempotency_key", "cannot be edited")
    todo = await _read(db, todo_id, scope)
    await _unchanged(db, todo, version)
    if todo.state not in ("pending", "failed"):
        held = f" by {todo.owner}" if todo.state == "claimed" else ""
        raise Conflict(
            f"cannot edit todo {todo_id}: it is {todo.state}{held}; "
            "only pending and dead todos can be edited",
            current={"state": todo.state, "owner": todo.owner, "assignee": todo.assignee},
        )
    new, run_at = check_edit(todo, edit)
    changes = {f: [_plain(getattr(todo, f)), _plain(new[f])] for f in EDITABLE if getattr(todo, f) != new[f]}
    if "payload" in changes:
        changes["payload"] = payload_diff(todo.payload, new["payload"])
    if run_at is not None:
        changes["run_at"] = [_plain(todo.ready_at), _plain(run_at)]
    if not changes:
        return todo
    if actor.kind == "agent" and changes.keys() & {"assignee", "assignee_until"}:
        await _agent_may_reassign(db, todo, new["assignee_until"])
    record = await SQL.edit.fetchrow(
        db,
        id=todo_id,
        updated_at=todo.updated_at,
        **new | {"payload": json_encode(new["payload"])},
        run_at=run_at,
        scope=_queues(scope),
        **_recorded(actor),
        note="edited: " + "; ".join(_described(f, c) for f, c in changes.items()),
        changes=json_encode(changes),
    )
    if record is None:
        await _unchanged(db, await _read(db, todo_id, scope), version)
        raise Conflict(f"cannot edit todo {todo_id}: it changed while the edit was made; read it again")
    return Todo.from_record(record)


async def _agent_may_reassign(db, todo: Todo, until: datetime | None) -> None:
    """A todo assigned to a person is theirs until its fallback (DESIGN, "Assignment"):
    only an operator may reassign it before then, and an agent's fallback must lie ahead,
    or the todo would go to any agent at once. The edit's guard (the version read) makes
    the check hold at the write."""
    facts = await SQL.assignment_facts.fetchrow(db, assignee=todo.assignee)
    if facts["person"] and (todo.assignee_until is None or todo.assignee_until > facts["now"]):
        until_then = f" until {todo.assignee_until.isoformat()}" if todo.assignee_until else ""
        raise NotAllowed(
            f"todo {todo.id} is assigned to {todo.assignee}, a person{until_then}: "
            "only an operator may reassign it before then"
        )
    _fallback_ahead(until, facts["now"], "assignee_until")


def _fallback_ahead(until: datetime | None, now: datetime, field: str) -> None:
    if until is not None and until <= now:
        raise InvalidInput(
            field, "must be in the future: a fallback already past hands the todo to any agent at once"
        )


def payload_diff(old: dict, new: dict) -> dict:
    """What an edit did to a payload, by top-level key: added, removed, changed (old, new)."""
    return {
        "added": {k: v for k, v in new.items() if k not in old},
        "removed": {k: v for k, v in old.items() if k not in new},
        "changed": {k: [old[k], new[k]] for k in old.keys() & new.keys() if old[k] != new[k]},
    }


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _described(field: str, change: Any) -> str:
    if field == "payload":
        parts = [
            f"{sign}{', '.join(sorted(change[k]))}"
            for k, sign in (("added", "+"), ("removed", "−"), ("changed", "~"))
            if change[k]
        ]
        return f"payload {' '.join(parts)}"
    old, new = change
    return f"{field} {_short(old)} → {_short(new)}"


def _short(value: Any, limit: int = 60) -> str:
    text = "none" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error(error: Any) -> str:
    return check_text(error, "error", required=True, limit=MAX_ERROR)


def _recorded(actor: Actor) -> dict[str, str]:
    """The (:actor_kind, :actor) a history row records."""
    return {"actor_kind": actor.kind, "actor": actor.name}


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


def _queues(scope: Scope | None) -> list[str] | None:
    return None if scope is None else list(scope.queues)
