"""Operators' control of todos and queues: retry, force-release, pause and resume, cancel,
run now, edit, and their bulk forms (DESIGN.md "Queue control").

Operators act from the dashboard and the CLI; agents and producers over the API, within
their token's `scope`. Each change is one guarded statement with its history row; a bulk
action runs BULK_BATCH todos a statement and reports what it changed and what it skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import msgspec

from dashboard import metrics, misses
from dashboard.db import transaction
from dashboard.edits import edit_todo, read_todo, unchanged
from dashboard.errors import Conflict, InvalidInput
from dashboard.models import (
    MAX_REASON,
    Actor,
    QueuePause,
    Scope,
    Todo,
    TodoEdit,
    check_actor,
    check_id,
    check_priority,
    check_queue,
    check_text,
    check_version,
)
from dashboard.queries import TRANSITIONS as SQL
from dashboard.writer import Writer, recorded, scope_queues


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


class Control(Writer):
    """The operators' transitions (queue control included); hints after the commit."""

    async def retry(self, todo_id: str, actor: Actor, *, one_more: bool = False) -> Todo:
        """Dead-letter back to pending: a fresh budget, or (one_more) one more attempt."""
        try:
            record = await _retried(self.db, check_id(todo_id), check_actor(actor), one_more=one_more)
        except asyncpg.UniqueViolationError:
            raise await misses.key_taken(self.db, todo_id) from None
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
                return await SQL.retry_many.fetch(self.db, ids=ids, **recorded(actor), one_more=one_more)
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
                    report.examples.append(str(misses.key_conflict(todo_id, row)))
        for todo in report.changed:
            metrics.retried(todo)
        await self._hint(t.queue for t in report.changed)
        return report

    async def force_release(self, todo_id: str, actor: Actor) -> Todo:
        """Take a lease back from an agent that is gone; recorded as `actor` (the operator)."""
        record = await SQL.force_release.fetchrow(
            self.db, id=check_id(todo_id), **recorded(check_actor(actor))
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
        paused = await SQL.pause_queue.fetchrow(self.db, queue=queue, **recorded(actor), reason=reason)
        if paused is not None:
            await self._hint([queue])  # pages showing the queue refresh; claimers find nothing
        return QueuePause(**dict(paused or await SQL.queue_pause.fetchrow(self.db, queue=queue)))

    async def resume(
        self, queue: str, actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> bool:
        """Claims take from the queue again, and its waiting claimers are woken at once.
        False when it was not paused."""
        queue, actor, reason = _queue_in(queue, scope), check_actor(actor), _reason(reason)
        resumed = await SQL.resume_queue.fetchrow(self.db, queue=queue, **recorded(actor), reason=reason)
        if resumed is not None:
            await self._put_back([queue])
        return resumed is not None

    async def cancel(
        self, todo_id: str, actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> Todo:
        """A pending or claimed todo is dead-lettered as cancelled (who, when, why); its
        holder, if any, learns it at its next heartbeat or ack (Cancelled)."""
        report = await self.cancel_many([todo_id], actor, reason, scope=scope)
        if not report.changed:
            raise await self._refusal(todo_id, "cancel", actor.name, None, scope)
        return report.changed[0]

    async def cancel_many(
        self, todo_ids: Sequence[str], actor: Actor, reason: str | None = None, *, scope: Scope | None = None
    ) -> BulkReport:
        actor, reason = check_actor(actor), _reason(reason)
        report = await self._bulk(
            "cancelled",
            todo_ids,
            lambda ids: SQL.cancel_many.fetch(
                self.db, ids=ids, **recorded(actor), reason=reason, scope=scope_queues(scope)
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
            miss = await self._refusal(todo_id, "run", actor.name, None, scope)
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
            lambda ids: SQL.run_now_many.fetch(
                self.db, ids=ids, **recorded(actor), scope=scope_queues(scope)
            ),
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
                **recorded(actor),
                priority=priority,
                set_assignee=set_assignee,
                assignee=assignee,
                scope=scope_queues(scope),
            ),
        )
        await self._put_back((t.queue for t in report.changed if t.state == "pending"), anywhere=True)
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
            todo = await edit_todo(self.db, todo_id, actor, edit, scope, version)
        else:
            try:
                async with transaction(self.db) as conn:
                    if version is not None:  # before the retry changes it
                        await unchanged(conn, await read_todo(conn, todo_id, scope, SQL.lock_todo), version)
                    record = await _retried(conn, todo_id, actor, one_more=False)
                    if record is None:
                        raise await self._refusal(todo_id, "retry", actor.name, None, scope)
                    todo = await edit_todo(conn, todo_id, actor, edit, scope)
            except asyncpg.UniqueViolationError:
                raise await misses.key_taken(self.db, todo_id) from None
            metrics.retried(todo)
        await self._put_back([todo.queue] if todo.state == "pending" else [], anywhere=True)
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
            changed += await self._after_transition(await run(ids[at : at + BULK_BATCH]))
        left = sorted(set(ids) - {t.id for t in changed})
        skipped = {}
        if left:
            skipped = {r["state"]: r["n"] for r in await SQL.states_of.fetch(self.db, ids=left)}
            if missing := len(left) - sum(skipped.values()):
                skipped["gone"] = missing
        return BulkReport(done=done, changed=changed, skipped=skipped)


async def _retried(db, todo_id: str, actor: Actor, *, one_more: bool):
    """The retry statement's row (None: not dead); raises UniqueViolationError when a live
    todo holds the key (then a transaction it ran in is aborted: classify outside it)."""
    return await SQL.retry.fetchrow(db, id=todo_id, **recorded(actor), one_more=one_more)


def _reason(reason: Any) -> str | None:
    reason = check_text(reason, "reason", limit=MAX_REASON)
    return reason.strip() or None if reason is not None else None


def _queue_in(queue: Any, scope: Scope | None) -> str:
    queue = check_queue(queue)
    if scope is not None:
        scope.check([queue])
    return queue
