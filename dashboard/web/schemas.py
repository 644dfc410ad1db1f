"""The agent API's request and response bodies (OpenAPI is generated from these).

Bounds are documented here so they appear in the schema; they are enforced once, by the
store's checks (dashboard/models.py), which answer 422 naming the field. Only the lease
is also checked by the decoder: it must fit PostgreSQL's bigint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec

from dashboard.models import (
    MAX_HTTP_BATCH,
    MAX_LEASE,
    MAX_REASON,
    MAX_WAIT,
    QUEUE_NAME,
    TTL_MAX,
    TTL_MIN,
    Created,
    NewTodo,
    Todo,
)
from dashboard.reads import Event, HistoryEntry, Page, TodoDetail
from dashboard.web.errors import PROBLEM


def _documented(description: str, **schema: Any) -> msgspec.Meta:
    """A description and bounds for the OpenAPI schema, without a second check of them."""
    return msgspec.Meta(extra_json_schema={"description": description, "extra": schema})


Lease = Annotated[int, msgspec.Meta(ge=0, le=MAX_LEASE, description="the lease token the claim returned")]
Ttl = Annotated[float, _documented("lease length in seconds", minimum=TTL_MIN, maximum=TTL_MAX)]
Wait = Annotated[float, _documented("seconds to wait for work (long-poll)", minimum=0, maximum=MAX_WAIT)]
QueueNames = Annotated[
    list[str],
    _documented("queue names", min_items=1, items={"type": "string", "pattern": f"^{QUEUE_NAME.pattern}$"}),
]


class Problem(msgspec.Struct):
    """RFC 9457 problem details; `field` names the offending input when there is one."""

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None


def _problem(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=Problem, media_type=PROBLEM, description=description)


BAD_INPUT = {
    400: _problem("Malformed JSON or a value of the wrong type"),
    401: _problem("No valid bearer token (missing, unknown or revoked)"),
    403: _problem("The token does not cover the queue"),
    413: _problem("The body, a payload or a result is over its size limit"),
    422: _problem("A value out of bounds (ttl, max_attempts, queue name, wait…)"),
}
ON_TODO = {
    **BAD_INPUT,
    404: _problem("No todo with that id"),
    409: _problem("The todo's state, owner or lease does not allow it (says which)"),
}
ON_EDIT = {
    **ON_TODO,
    409: _problem(
        "The todo is claimed or finished, or changed since the version If-Match names "
        "(`changed_since` says how, `version` is the todo's now)"
    ),
    422: _problem("A value out of bounds, or an If-Match that is not one ETag of this API"),
}
ON_QUEUE = {
    **BAD_INPUT,
    403: _problem("The token does not cover the queue named in the path"),
    422: _problem("Not a queue name, or a reason over its length limit"),
}


class TodoOut(Todo, kw_only=True):
    """A todo; `lease` is the token to present while it is claimed (null otherwise)."""

    lease: int | None = None

    @classmethod
    def of(cls, todo: Todo | None) -> TodoOut | None:
        if todo is None:
            return None
        fields = msgspec.structs.asdict(todo)
        return cls(**fields, lease=todo.lease_token if todo.state == "claimed" else None)


class CreatedOut(msgspec.Struct):
    todo: TodoOut
    created: bool

    @classmethod
    def of(cls, created: Created) -> CreatedOut:
        return cls(todo=TodoOut.of(created.todo), created=created.created)


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    todos: list[NewTodo]


class BatchOut(msgspec.Struct):
    results: list[CreatedOut]


BatchSize = Annotated[int, _documented("how many todos to claim at most", minimum=1, maximum=MAX_HTTP_BATCH)]


class ClaimIn(msgspec.Struct, forbid_unknown_fields=True):
    queues: QueueNames
    ttl: Ttl = 30
    wait: Wait = 0
    max: BatchSize | None = None


class ClaimedOut(msgspec.Struct):
    """The answer to a claim with `max`: up to `max` todos in claim order: highest priority, then
    longest ready, first (none: `[]`)."""

    todos: list[TodoOut]


class ClaimByIdIn(msgspec.Struct, forbid_unknown_fields=True):
    ttl: Ttl = 30


class HeartbeatIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    ttl: Ttl = 30


class ReleaseIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease


class NextIn(msgspec.Struct, forbid_unknown_fields=True):
    queues: QueueNames
    ttl: Ttl = 30


class CompleteIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    result: dict[str, Any] | None = None
    next: NextIn | None = None


class CompleteOut(msgspec.Struct):
    todo: TodoOut
    next: TodoOut | None = None


class FailIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    error: str


class CompleteAck(msgspec.Struct, forbid_unknown_fields=True):
    result: dict[str, Any] | None = None


class FailAck(msgspec.Struct, forbid_unknown_fields=True):
    error: str


class AckIn(msgspec.Struct, forbid_unknown_fields=True):
    """Complete or fail one held todo: exactly one of `complete` and `fail`."""

    id: str
    lease: Lease
    complete: CompleteAck | None = None
    fail: FailAck | None = None


class AcksIn(msgspec.Struct, forbid_unknown_fields=True):
    acks: Annotated[list[AckIn], _documented(f"1 to {MAX_HTTP_BATCH} acks", min_items=1)]


class AckOut(msgspec.Struct, omit_defaults=True):
    """One ack's answer: `status` 200 with the todo, or the status and problem details
    that the single-todo call would have answered (409 for a stale lease, 404…)."""

    id: str
    status: int
    todo: TodoOut | None = None
    problem: dict[str, Any] | None = None


class AcksOut(msgspec.Struct):
    results: list[AckOut]


class FailOut(msgspec.Struct):
    todo: TodoOut
    will_retry: bool
    retry_at: datetime | None
    dead_lettered: bool

    @classmethod
    def of(cls, todo: Todo) -> FailOut:
        return cls(
            todo=TodoOut.of(todo),
            will_retry=todo.state == "pending",
            retry_at=todo.next_retry_at,
            dead_lettered=todo.state == "failed",
        )


class TodoDetailOut(msgspec.Struct):
    todo: TodoOut
    history: list[HistoryEntry]  # the newest HISTORY_SHOWN steps, oldest first
    event: Event | None
    older_history: bool  # there are earlier steps: GET /api/v1/todos/{id}/history?before=

    @classmethod
    def of(cls, detail: TodoDetail) -> TodoDetailOut:
        return cls(TodoOut.of(detail.todo), detail.history, detail.event, detail.older_history)


class TodoPage(msgspec.Struct):
    items: list[TodoOut]
    next: str | None

    @classmethod
    def of(cls, page: Page) -> TodoPage:
        return cls(items=[TodoOut.of(t) for t in page.items], next=page.next_cursor)


Reason = Annotated[
    str | None, _documented("why, in a few words (recorded in the history)", max_length=MAX_REASON)
]


class ReasonIn(msgspec.Struct, forbid_unknown_fields=True):
    """A body with an optional `reason`; the body itself may be left out."""

    reason: Reason = None


class EmptyIn(msgspec.Struct, forbid_unknown_fields=True):
    """No fields: send `{}` or no body at all."""


class ResumedOut(msgspec.Struct):
    """`resumed` is false when the queue was not paused (nothing changed)."""

    queue: str
    resumed: bool
