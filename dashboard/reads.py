"""Read queries for the dashboard and the API's GET routes, without any HTTP in them."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from dashboard.errors import InvalidInput, NotFound
from dashboard.models import STATES, Todo, check_queue
from dashboard.queries import READS as SQL
from dashboard.store import check_id

# A list filter's state: the four states, plus the two faces of pending.
LIST_STATES = ("ready", "retrying", *STATES)
RECENT_SECONDS = 3600  # "done (recent)" on the overview
THROUGHPUT_MINUTES = 15
MAX_PAGE = 500

_STATE_CLAUSES = {
    "pending": "state = 'pending'",
    "ready": "state = 'pending' AND (next_retry_at IS NULL OR next_retry_at <= now())",
    "retrying": "state = 'pending' AND next_retry_at > now()",
    "claimed": "state = 'claimed'",
    "done": "state = 'done'",
    "failed": "state = 'failed'",
}


@dataclass
class QueueStats:
    queue: str
    ready: int
    retrying: int
    claimed: int
    lapsed: int
    done_recent: int
    dead: int
    oldest_ready_at: datetime | None
    oldest_ready_age: float | None
    throughput: list[int] = field(default_factory=list)  # completions per minute, oldest first

    @property
    def needs_attention(self) -> bool:
        return self.dead > 0 or self.lapsed > 0


@dataclass
class TodoFilter:
    queue: str | None = None
    queues: tuple[str, ...] | None = None  # any of these (an agent's token's queues)
    state: str | None = None
    assignee: str | None = None
    owner: str | None = None
    kind: str | None = None
    search: str | None = None


@dataclass
class Page:
    items: list[Todo]
    next_cursor: str | None


@dataclass
class TodoDetail:
    todo: Todo
    history: list[dict[str, Any]]
    event: dict[str, Any] | None


def encode_cursor(todo: Todo, key: str = "created_at") -> str:
    raw = f"{getattr(todo, key).isoformat()}|{todo.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, todo_id = raw.split("|", 1)
        return datetime.fromisoformat(at), todo_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("after", "is not a cursor this server gave out") from None


class Reads:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    async def queue_stats(self) -> list[QueueStats]:
        counts = await self.db.fetch(SQL["queue_counts"], float(RECENT_SECONDS))
        per_minute = await self.db.fetch(SQL["throughput"], THROUGHPUT_MINUTES)
        now = await self.db.fetchval("SELECT date_trunc('minute', now())")
        buckets: dict[str, list[int]] = {}
        for row in per_minute:
            slot = THROUGHPUT_MINUTES - 1 - int((now - row["minute"]).total_seconds() // 60)
            if 0 <= slot < THROUGHPUT_MINUTES:
                buckets.setdefault(row["queue"], [0] * THROUGHPUT_MINUTES)[slot] = row["done"]
        return [
            QueueStats(**dict(r), throughput=buckets.get(r["queue"], [0] * THROUGHPUT_MINUTES))
            for r in counts
        ]

    async def list_todos(
        self, filters: TodoFilter, *, limit: int = 50, after: str | None = None,
        newest_by: str = "created_at",
    ) -> Page:
        """Newest first by `newest_by` (created_at, or completed_at for finished todos),
        keyset-paginated by (that column, id)."""
        if newest_by not in ("created_at", "completed_at"):
            raise ValueError(newest_by)
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidInput("limit", f"must be from 1 to {MAX_PAGE}")
        clauses, args = [], []

        def bind(value) -> str:
            args.append(value)
            return f"${len(args)}"

        if filters.queue:
            clauses.append(f"queue = {bind(check_queue(filters.queue))}")
        if filters.queues is not None:
            clauses.append(f"queue = ANY({bind(list(filters.queues))}::text[])")
        if filters.state:
            if filters.state not in _STATE_CLAUSES:
                raise InvalidInput("state", f"must be one of {', '.join(LIST_STATES)}")
            clauses.append(_STATE_CLAUSES[filters.state])
        for name in ("assignee", "owner", "kind"):
            if value := getattr(filters, name):
                clauses.append(f"{name} = {bind(value)}")
        if filters.search:
            term = filters.search.strip()
            exact = bind(term)
            like = bind("%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
            clauses.append(f"(id = {exact} OR idempotency_key = {exact} OR title ILIKE {like})")
        if after:
            at, todo_id = decode_cursor(after)
            clauses.append(f"({newest_by}, id) < ({bind(at)}, {bind(todo_id)})")
        where = " AND ".join(clauses) or "true"
        rows = await self.db.fetch(
            f"SELECT * FROM todos WHERE {where} ORDER BY {newest_by} DESC, id DESC "
            f"LIMIT {bind(limit + 1)}",
            *args,
        )
        items = [Todo.from_record(r) for r in rows[:limit]]
        return Page(items, encode_cursor(items[-1], newest_by) if len(rows) > limit else None)

    async def leases(self, queue: str | None = None, limit: int = MAX_PAGE) -> list[dict]:
        return [dict(r) for r in await self.db.fetch(SQL["leases"], queue, limit)]

    async def lease_count(self) -> int:
        return await self.db.fetchval(SQL["lease_count"])

    async def dead_letters(
        self, queue: str | None = None, *, limit: int = 50, after: str | None = None
    ) -> Page:
        """Newest death first."""
        return await self.list_todos(TodoFilter(queue=queue, state="failed"), limit=limit, after=after,
                                     newest_by="completed_at")

    async def dead_letter_queues(self) -> list[str]:
        return [r["queue"] for r in await self.db.fetch(SQL["dead_letter_queues"])]

    async def dead_letter_ids(self, queue: str | None = None) -> list[str]:
        return [r["id"] for r in await self.db.fetch(SQL["dead_letter_ids"], queue)]

    async def todo(self, todo_id: str) -> Todo:
        row = await self.db.fetchrow(SQL["todo"], check_id(todo_id))
        if row is None:
            raise NotFound(f"no todo {todo_id}")
        return Todo.from_record(row)

    async def todo_detail(self, todo_id: str) -> TodoDetail:
        todo = await self.todo(todo_id)
        history = [dict(r) for r in await self.db.fetch(SQL["history"], todo_id)]
        event = None
        if todo.event_id:
            row = await self.db.fetchrow(SQL["event"], todo.event_id)
            event = dict(row) if row else None
        return TodoDetail(todo, history, event)
