"""Read queries for the dashboard and the API's GET routes, without any HTTP in them.

Every input a page or the API passes is checked here, once (queue names, list states,
cursors, page sizes), so the web layer only parses and renders.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from dashboard.db import transaction
from dashboard.errors import InvalidInput, NotFound, StatementCancelled
from dashboard.models import (
    STATES,
    ActorKind,
    QueuePause,
    Scope,
    Todo,
    check_id,
    check_queue,
    check_text,
)
from dashboard.payload_search import check_search_object, containments, parse_terms
from dashboard.queries import READS as SQL

# A list filter's state: the four states, plus the three faces of pending.
LIST_STATES = ("ready", "scheduled", "retrying", *STATES)
RECENT_SECONDS = 3600  # "done (recent)" on the overview
THROUGHPUT_MINUTES = 15
# Queue counts are exact up to this many todos (per queue and count); above it they show
# the rollup job's last backlog sample (at most SAMPLE_AGE old), marked approximate.
# A todo read shows its newest HISTORY_SHOWN steps, and an edit's changes up to
# CHANGES_BYTES_SHOWN bytes: its owner can grow both (every release and claim is a step; an edit
# holds two payloads), and every read, wait and open page must stay cheap all the same.
HISTORY_SHOWN, HISTORY_PAGE_MAX = 100, 1000
CHANGES_BYTES_SHOWN = 16 * 1024
EXACT_COUNT_LIMIT = 500
LEASE_COUNT_LIMIT = 2000  # leases counted, over all queues
SAMPLED = {"dead": "dead_letters", "claimed": "held"}  # a count's name in the samples
SAMPLE_AGE = 120.0
MAX_PAGE = 500
# A list or search stops after READ_TIMEOUT seconds (TooSlow, a 503): no caller's filter holds
# a database connection and a core for longer. A search without '=' (an id, an idempotency
# key, words of a title) is at most MAX_WORDS_SEARCH characters; one shorter than
# SHORT_SEARCH matches titles that begin with it, since a trigram index finds words inside a
# title only from three characters on.
READ_TIMEOUT = 5.0
MAX_WORDS_SEARCH = 200
SHORT_SEARCH = 3
# A lease is short (highlighted on the leases and agents pages) when its time left is under
# this share of its ttl, or under this many seconds: its agent should have beaten by now.
SHORT_LEASE_SHARE = 0.2
SHORT_LEASE_SECONDS = 10.0
AGENTS_RECENT_SECONDS = 86400  # the agents page lists agents seen this recently (or with a token)
AGENTS_HOUR_SECONDS = 3600  # its done, failed and refused acks count this far back

# A list state as list_todos' (state, face) parameters.
_STATE_FILTERS: dict[str | None, tuple[str | None, str | None]] = {
    None: (None, None),
    **{face: ("pending", face) for face in ("ready", "scheduled", "retrying")},
    **{state: (state, None) for state in STATES},
}


class TooSlow(StatementCancelled):
    """A list or search ran past READ_TIMEOUT and was stopped: a 503, as for a busy database."""


class QueueStats(msgspec.Struct, kw_only=True):
    queue: str
    ready: int
    scheduled: int  # pending with a run_at still ahead
    retrying: int
    claimed: int
    lapsed: int
    done_recent: int
    dead: int
    oldest_ready_at: datetime | None
    oldest_ready_age: float | None
    paused_at: datetime | None = None  # claims skip the queue while it is paused
    paused_by: str | None = None
    paused_reason: str | None = None
    throughput: list[int] = msgspec.field(default_factory=list)  # completions per minute, oldest first
    # The counts above EXACT_COUNT_LIMIT: their figure is the last sample (or the limit).
    approximate: frozenset[str] = frozenset()

    @property
    def needs_attention(self) -> bool:
        return self.dead > 0 or self.lapsed > 0


class TodoFilter(msgspec.Struct, kw_only=True):
    queue: str | None = None
    queues: tuple[str, ...] | None = None  # any of these (an agent's token's queues)
    state: str | None = None
    assignee: str | None = None
    owner: str | None = None
    kind: str | None = None
    search: str | None = None  # an id, a key, words of a title, or key.path=value terms
    payload: dict[str, Any] | None = None  # an object the payload contains (the API's)

    def checked(self) -> TodoFilter:
        """The filter with every field checked, or InvalidInput naming the bad one."""
        if self.queue is not None:
            check_queue(self.queue)
        if self.state not in _STATE_FILTERS:
            raise InvalidInput("state", f"must be one of {', '.join(LIST_STATES)}")
        for name in ("assignee", "owner", "kind", "search"):
            check_text(getattr(self, name), name)
        if self.payload is not None:
            check_search_object(self.payload)
        return self

    @property
    def searches(self) -> bool:
        """Whether it searches (text or payload): the reads that may cost a scan."""
        return bool(self.search and self.search.strip()) or self.payload is not None


class Page(msgspec.Struct):
    items: list[Todo]
    next_cursor: str | None
    read_at: datetime | None = None  # the database's clock when read (None: no items)


class HistoryEntry(msgspec.Struct, kw_only=True):
    id: int  # the step's place in all history: a page of older steps starts before it
    at: datetime
    from_state: str | None
    to_state: str
    actor_kind: ActorKind  # what kind of party `actor` names
    actor: str
    attempt: int
    note: str | None
    changes: dict[str, Any] | None = None  # an edit's: field → [old, new]; payload → a diff
    changes_bytes: int | None = None  # instead of `changes`, when they are over CHANGES_BYTES_SHOWN


class QueueAction(msgspec.Struct, kw_only=True):
    """A pause or resume of a queue."""

    at: datetime
    action: str  # paused, resumed
    actor_kind: ActorKind
    actor: str
    reason: str | None


class Event(msgspec.Struct, kw_only=True):
    id: str
    source: str
    kind: str
    payload: dict[str, Any]
    received_at: datetime


class TodoDetail(msgspec.Struct):
    todo: Todo
    history: list[HistoryEntry]  # the newest HISTORY_SHOWN steps, oldest first
    event: Event | None
    read_at: datetime
    older_history: bool = False  # there are steps before history[0]


class HistoryPage(msgspec.Struct):
    items: list[HistoryEntry]  # oldest first
    older: bool  # there are steps before items[0]


class Lease(msgspec.Struct, kw_only=True):
    """A claimed todo as the leases page shows it, timed on the database's clock."""

    id: str
    queue: str
    title: str
    kind: str | None
    owner: str
    attempt: int
    max_attempts: int
    lease_token: int
    claimed_at: datetime
    heartbeat_at: datetime | None
    lease_expires_at: datetime
    lapsed: bool
    seconds_left: float
    ttl: float  # from its last claim or heartbeat to its expiry
    heartbeat_age: float | None
    server_now: datetime

    @property
    def short(self) -> bool:
        return not self.lapsed and short_lease(self.seconds_left, self.ttl)


def short_lease(seconds_left: float, ttl: float) -> bool:
    """The short-lease rule (SHORT_LEASE_*); the agents statement applies the same one in SQL."""
    return seconds_left < SHORT_LEASE_SECONDS or seconds_left < SHORT_LEASE_SHARE * ttl


class AgentSummary(msgspec.Struct, kw_only=True):
    """An agent as the agents page shows it. done, failed and the last claim and ack come
    from the rollups (a few seconds behind); leases, the last heartbeat (of the leases it
    holds) and stale_acks are live."""

    agent: str
    leases: int  # held now
    short: int  # of those, how many are short (and not lapsed)
    lapsed: int
    soonest_left: float | None  # seconds until the soonest lease expires (negative: lapsed)
    last_claim_at: datetime | None
    last_heartbeat_at: datetime | None
    last_ack_at: datetime | None
    done: int  # in the last AGENTS_HOUR_SECONDS
    failed: int
    stale_acks: int  # acks refused by fencing, in the last AGENTS_HOUR_SECONDS
    token_id: str | None  # its newest active token, else its newest revoked one
    token_queues: list[str] | None
    token_created_at: datetime | None
    token_revoked_at: datetime | None
    active_tokens: int


# A list state as the queue counts that add up to it (Reads.estimate_matching).
ESTIMATED = {
    "ready": ("ready",),
    "scheduled": ("scheduled",),
    "retrying": ("retrying",),
    "pending": ("ready", "scheduled", "retrying"),
    "claimed": ("claimed",),
    "failed": ("dead",),
}


def encode_cursor(at: datetime, todo_id: str) -> str:
    raw = f"{at.isoformat()}|{todo_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime | None, str | None]:
    """(at, id) of the last todo of the previous page; (None, None) for the first page."""
    if not cursor:
        return None, None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, todo_id = raw.split("|", 1)
        if "\x00" in todo_id:  # no id has one, and PostgreSQL text cannot hold it
            raise ValueError(todo_id)
        return datetime.fromisoformat(at), todo_id
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("after", "is not a cursor this server gave out") from None


def check_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput("limit", f"must be from 1 to {MAX_PAGE}")
    return limit


def _like(term: str) -> str:
    """The ILIKE pattern of a title search: the term anywhere, or at the start when short."""
    escaped = term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%" if len(term) < SHORT_SEARCH else "%" + escaped + "%"


def _filter_values(filters: TodoFilter) -> dict[str, Any]:
    """The filter as list_todos' and matching_ids' parameters, checked."""
    filters.checked()
    state, face = _STATE_FILTERS[filters.state]
    search = filters.search.strip() if filters.search else None
    terms = parse_terms(search)
    if terms is not None:  # a payload search, not an id, a key or a title
        search = None
    elif search and len(search) > MAX_WORDS_SEARCH:
        raise InvalidInput(
            "search", f"is longer than {MAX_WORDS_SEARCH} characters (an id, a key or words of a title)"
        )
    return {
        "queue": filters.queue,
        "queues": None if filters.queues is None else list(filters.queues),
        "state": state,
        "face": face,
        "assignee": filters.assignee,
        "owner": filters.owner,
        "kind": filters.kind,
        "search": search,
        "search_like": _like(search) if search else None,
        "payload_has": filters.payload,
        "payload_any": containments(terms),
    }


def _of(shape: type[msgspec.Struct], rows: Sequence) -> list:
    return [shape(**dict(r)) for r in rows]


class Reads:
    def __init__(self, db: asyncpg.Pool | asyncpg.Connection):
        self.db = db

    async def queue_stats(self) -> list[QueueStats]:
        """Every queue's counts, exact up to EXACT_COUNT_LIMIT; a count that reaches it
        shows the queue's last backlog sample instead (never less than the limit), and
        is named in `approximate`."""
        limit = EXACT_COUNT_LIMIT
        counts = await SQL.queue_counts.fetch(
            self.db, recent_seconds=float(RECENT_SECONDS), limit=limit, lease_limit=LEASE_COUNT_LIMIT
        )
        per_minute = await SQL.throughput.fetch(self.db, minutes=THROUGHPUT_MINUTES)
        buckets: dict[str, list[int]] = {}
        for row in per_minute:
            slot = THROUGHPUT_MINUTES - 1 - row["minutes_ago"]
            if 0 <= slot < THROUGHPUT_MINUTES:
                buckets.setdefault(row["queue"], [0] * THROUGHPUT_MINUTES)[slot] = row["done"]
        leases_over = sum(r["claimed"] for r in counts) >= LEASE_COUNT_LIMIT
        over = leases_over or any(
            r["ready"] >= limit or r["waiting"] >= limit or r["dead"] >= limit for r in counts
        )
        samples = (
            {r["queue"]: r for r in await SQL.last_samples.fetch(self.db, seconds=SAMPLE_AGE)} if over else {}
        )
        stats = []
        for r in counts:
            row, sample, approximate = dict(r), samples.get(r["queue"]), set()
            waiting, tail_done = row.pop("waiting"), row.pop("tail_done")
            for name, reached in (
                ("ready", row["ready"] >= limit),
                ("retrying", waiting >= limit),
                ("scheduled", waiting >= limit),
                ("dead", row["dead"] >= limit),
                ("claimed", leases_over),
            ):
                if reached:
                    sampled = sample[SAMPLED.get(name, name)] if sample else None
                    row[name] = max(sampled or 0, row[name])
                    approximate.add(name)
            if tail_done is not None and tail_done >= limit:
                approximate.add("done_recent")
            stats.append(
                QueueStats(
                    **row,
                    throughput=buckets.get(r["queue"], [0] * THROUGHPUT_MINUTES),
                    approximate=frozenset(approximate),
                )
            )
        return stats

    async def estimate_matching(self, filters: TodoFilter) -> int | None:
        """How many todos a filter of one queue and a live state matches, as the overview
        counts them (exact up to EXACT_COUNT_LIMIT, the last sample above); None for any
        other filter (done todos and text filters are not counted ahead)."""
        others = (filters.queues, filters.assignee, filters.owner, filters.kind, filters.search)
        fields = ESTIMATED.get(filters.state)
        if filters.queue is None or fields is None or any(f is not None for f in others):
            return None
        for s in await self.queue_stats():
            if s.queue == filters.queue:
                return sum(getattr(s, f) for f in fields)
        return 0

    async def list_todos(self, filters: TodoFilter, *, limit: int = 50, after: str | None = None) -> Page:
        """Newest first by created_at, keyset-paginated by (created_at, id)."""
        before_at, before_id = decode_cursor(after)
        rows = await self._custom_plan(
            SQL.list_todos,
            **_filter_values(filters),
            before_at=before_at,
            before_id=before_id,
            limit=check_limit(limit) + 1,
        )
        return self._page(rows, limit, "created_at")

    async def matching_ids(self, filters: TodoFilter, *, limit: int) -> list[str]:
        """The ids of up to `limit` todos the filter matches now, oldest first (a bulk
        action's "all matching": the filter is applied again when the action runs)."""
        rows = await self._custom_plan(SQL.matching_ids, **_filter_values(filters), limit=limit)
        return [r["id"] for r in rows]

    async def dead_letters(
        self,
        queue: str | None = None,
        *,
        cancelled: bool | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Newest death first; `cancelled` True or False shows only those cancelled or not."""
        before_at, before_id = decode_cursor(after)
        rows = await SQL.list_dead_letters.fetch(
            self.db,
            queue=None if queue is None else check_queue(queue),
            cancelled=cancelled,
            before_at=before_at,
            before_id=before_id,
            limit=check_limit(limit) + 1,
        )
        return self._page(rows, limit, "completed_at")

    async def leases(
        self, queue: str | None = None, limit: int = MAX_PAGE, *, owner: str | None = None
    ) -> list[Lease]:
        owner = check_text(owner, "owner")
        return _of(Lease, await SQL.leases.fetch(self.db, queue=queue, owner=owner, limit=limit))

    async def lease_count(self, owner: str | None = None) -> int:
        return await SQL.lease_count.fetchval(self.db, owner=check_text(owner, "owner"))

    async def agents(self) -> list[AgentSummary]:
        """Every agent with an active token, a lease now, or steps in the last day."""
        rows = await SQL.agents.fetch(
            self.db,
            recent_seconds=float(AGENTS_RECENT_SECONDS),
            hour_seconds=float(AGENTS_HOUR_SECONDS),
            short_seconds=SHORT_LEASE_SECONDS,
            short_share=SHORT_LEASE_SHARE,
        )
        return _of(AgentSummary, rows)

    async def dead_letter_queues(self) -> list[str]:
        return [r["queue"] for r in await SQL.dead_letter_queues.fetch(self.db)]

    async def dead_letter_ids(self, queue: str | None = None, *, cancelled: bool | None = None) -> list[str]:
        queue = None if queue is None else check_queue(queue)
        rows = await SQL.dead_letter_ids.fetch(self.db, queue=queue, cancelled=cancelled)
        return [r["id"] for r in rows]

    async def todo(self, todo_id: str, *, scope: Scope | None = None) -> tuple[Todo, datetime]:
        """The todo alone, and the database's clock as it was read; a todo outside `scope`
        is NotFound."""
        row = await SQL.todo.fetchrow(self.db, id=check_id(todo_id))
        if row is None:
            raise NotFound(f"no todo {todo_id}")
        if scope is not None:
            scope.check_todo(todo_id, row["queue"])
        return Todo.from_record(row), row["read_at"]

    async def todo_detail(self, todo_id: str, *, scope: Scope | None = None) -> TodoDetail:
        todo, read_at = await self.todo(todo_id, scope=scope)
        history = await self._history(todo.id, None, HISTORY_SHOWN)
        event = None
        if todo.event_id:
            event_row = await SQL.event.fetchrow(self.db, id=todo.event_id)
            event = Event(**dict(event_row)) if event_row else None
        return TodoDetail(todo, history.items, event, read_at, history.older)

    async def history(
        self,
        todo_id: str,
        *,
        before: int | None = None,
        limit: int = HISTORY_SHOWN,
        scope: Scope | None = None,
    ) -> HistoryPage:
        """A todo's steps before step `before` (the newest when None), at most `limit`."""
        if not 1 <= limit <= HISTORY_PAGE_MAX:
            raise InvalidInput("limit", f"must be 1 to {HISTORY_PAGE_MAX}")
        if before is not None and before < 1:
            raise InvalidInput("before", "must be a step's id, a positive whole number")
        todo, _ = await self.todo(todo_id, scope=scope)
        return await self._history(todo.id, before, limit)

    async def _history(self, todo_id: str, before: int | None, limit: int) -> HistoryPage:
        rows = await SQL.history.fetch(
            self.db, id=todo_id, before=before, limit=limit + 1, changes_max=CHANGES_BYTES_SHOWN
        )
        return HistoryPage(_of(HistoryEntry, rows[-limit:]), older=len(rows) > limit)

    async def paused_queues(self) -> list[QueuePause]:
        return _of(QueuePause, await SQL.queue_pauses.fetch(self.db))

    async def queue_history(self, queue: str, limit: int = 20) -> list[QueueAction]:
        return _of(QueueAction, await SQL.queue_history.fetch(self.db, queue=check_queue(queue), limit=limit))

    async def unknown_queues(self, queues: Sequence[str]) -> list[str]:
        """Those of `queues` no todo is in: never used, or a typo."""
        rows = await SQL.unknown_queues.fetch(self.db, queues=[check_queue(q) for q in queues])
        return [r["queue"] for r in rows]

    async def readiness(self) -> tuple[int | None, bool]:
        """(the newest migration applied, whether the server is read-only)."""
        row = await SQL.readiness.fetchrow(self.db)
        return row["migrated_to"], row["read_only"]

    # -- internals -------------------------------------------------------------------

    async def _custom_plan(self, statement, **values) -> list:
        """Run `statement` planned for these values, stopped after READ_TIMEOUT. Pool
        connections force generic plans (dashboard/db.py, for the claim path); a statement
        whose optional filters decide which index fits needs its values at planning time."""
        async with transaction(self.db) as conn:
            await SQL.plan_for_values.execute(conn, timeout=f"{READ_TIMEOUT * 1000:.0f}")
            try:
                return await statement.fetch(conn, **values)
            except StatementCancelled as exc:
                raise TooSlow(
                    f"the list took over {READ_TIMEOUT:g} s and was stopped: narrow it (a queue, a "
                    "state, longer search words) or try again later"
                ) from exc

    @staticmethod
    def _page(rows: list, limit: int, newest_by: str) -> Page:
        items = [Todo.from_record(r) for r in rows[:limit]]
        last = items[-1] if len(rows) > limit else None
        return Page(
            items,
            encode_cursor(getattr(last, newest_by), last.id) if last else None,
            rows[0]["read_at"] if rows else None,
        )
