"""An edit of a pending or dead todo: checked against the todo as read, refused when the
todo changed since the caller's read (Stale, saying what changed), written guarded by the
version read, with a history row that says what changed, old → new.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dashboard.errors import Conflict, InvalidInput, NotAllowed, NotFound, Stale
from dashboard.models import EDITABLE, Actor, Scope, Todo, TodoEdit, check_edit, check_version, json_encode
from dashboard.queries import READS
from dashboard.queries import TRANSITIONS as SQL
from dashboard.reads import CHANGES_BYTES_SHOWN, HistoryEntry
from dashboard.writer import recorded, scope_queues

CHANGES_SHOWN = 10  # the latest changes a Stale conflict lists (it counts the rest)


async def read_todo(db, todo_id: str, scope: Scope | None, statement=READS.todo) -> Todo:
    row = await statement.fetchrow(db, id=todo_id)
    if row is None:
        raise NotFound(f"no todo {todo_id}")
    if scope is not None:
        scope.check_todo(todo_id, row["queue"])
    return Todo.from_record(row)


async def unchanged(db, todo: Todo, version: str | None) -> None:
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


async def edit_todo(
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
    todo = await read_todo(db, todo_id, scope)
    await unchanged(db, todo, version)
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
        await agent_may_reassign(db, todo, new["assignee_until"])
    record = await SQL.edit.fetchrow(
        db,
        id=todo_id,
        updated_at=todo.updated_at,
        **new | {"payload": json_encode(new["payload"])},
        run_at=run_at,
        scope=scope_queues(scope),
        **recorded(actor),
        note="edited: " + "; ".join(_described(f, c) for f, c in changes.items()),
        changes=json_encode(changes),
    )
    if record is None:
        await unchanged(db, await read_todo(db, todo_id, scope), version)
        raise Conflict(f"cannot edit todo {todo_id}: it changed while the edit was made; read it again")
    return Todo.from_record(record)


async def agent_may_reassign(db, todo: Todo, until: datetime | None) -> None:
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
    fallback_ahead(until, facts["now"], "assignee_until")


def fallback_ahead(until: datetime | None, now: datetime, field: str) -> None:
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
