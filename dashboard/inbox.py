"""A person's inbox (DESIGN.md "Inbox"): the todos an operator holds and those assigned to
them, and how many wait. Reads only, without HTTP: the inbox's actions are the Store's own
transitions, made in the operator's name (dashboard/web/pages/inbox.py).

An operator's name is also an owner and an assignee: agent and operator names share one
namespace (DESIGN.md "Actors"), so "assigned to alice" names exactly one party.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from dashboard.models import Todo
from dashboard.queries import INBOX as SQL

SHOWN = 100  # of each list: held, and waiting
BADGE_LIMIT = 100  # the menu counts this far, then says "99+"


class Item(msgspec.Struct, kw_only=True):
    todo: Todo
    created_by_kind: str | None  # who asked: the todo's first history row
    created_by: str | None
    seconds_left: float | None  # held: its lease's time left (below 0: lapsed, not yet reaped)
    ttl: float | None  # held: the lease's length, from its last claim or heartbeat


class Inbox(msgspec.Struct, kw_only=True):
    holding: list[Item]  # claimed by them, soonest expiry first
    waiting: list[Item]  # pending and assigned to them, in claim order
    read_at: datetime  # the database's clock: it decides "ready" and "retrying"

    @property
    def ready(self) -> int:
        return sum(1 for item in self.waiting if item.todo.ready_at <= self.read_at)


_ITEM_COLUMNS = ("created_by_kind", "created_by", "seconds_left", "ttl")


async def inbox(db, name: str) -> Inbox:
    rows = await SQL.inbox.fetch(db, name=name, limit=SHOWN)
    holding, waiting = [], []
    for row in rows:
        values = dict(row)
        extra = {k: values.pop(k) for k in _ITEM_COLUMNS}
        item = Item(todo=Todo.from_record(values), **extra)
        (holding if item.todo.state == "claimed" else waiting).append(item)
    holding.sort(key=lambda i: i.todo.lease_expires_at)
    waiting.sort(key=lambda i: (-i.todo.priority, i.todo.ready_at))
    read_at = rows[0]["read_at"] if rows else datetime.now(UTC)  # nothing to compare it with
    return Inbox(holding=holding, waiting=waiting, read_at=read_at)


async def waiting_count(db, name: str) -> int:
    """Todos ready for `name` now, up to BADGE_LIMIT."""
    return await SQL.waiting_count.fetchval(db, name=name, limit=BADGE_LIMIT)
