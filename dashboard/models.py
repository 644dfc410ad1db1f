"""The shapes the store hands out and takes in, shared by the dashboard and the API, and
the checks every input goes through (in the store, once, whoever calls it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple, TypeVar, get_args

import msgspec

from dashboard.errors import InvalidInput, NotFound, OutOfScope, TooLarge

STATES = ("pending", "claimed", "done", "failed")
FINISHED = frozenset({"done", "failed"})  # what a waiter waits for: nothing moves it on
ActorKind = Literal["agent", "operator", "producer", "system"]  # 0004_actor_kind.sql's CHECK
ACTOR_KINDS: tuple[str, ...] = get_args(ActorKind)
QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")  # always fullmatch
TTL_MIN, TTL_MAX = 1, 12 * 3600
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 100
MAX_JSON_BYTES = 256 * 1024  # payload and result, as encoded JSON (SQS's message limit)
MAX_TEXT = 1000  # title, kind, source, assignee, owner, idempotency key
MAX_ERROR = 8000
DEFAULT_MAX_ATTEMPTS = 5
MAX_LEASE = 2**63 - 1  # lease tokens are bigint
MAX_WAIT = 60.0  # seconds a long-poll claim may wait
MAX_HTTP_BATCH = 100  # todos per claim with `max`, acks per POST /acks (and `worker --batch`)
PRIORITY_MIN, PRIORITY_MAX = -10, 10  # 0008_queue_control.sql's CHECK
MAX_DELAY = 366 * 24 * 3600.0  # seconds ahead a todo may be scheduled (run_at or delay)
MAX_REASON = 1000  # a pause's or a cancellation's reason
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # an unescaped \u0000 in JSON text


class Todo(msgspec.Struct, kw_only=True):
    id: str
    queue: str
    title: str
    state: str
    source: str | None = None
    kind: str | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    event_id: str | None = None
    idempotency_key: str | None = None
    assignee: str | None = None
    owner: str | None = None
    lease_expires_at: datetime | None = None
    lease_token: int = 0
    heartbeat_at: datetime | None = None
    attempt: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    result: dict[str, Any] | None = None
    next_retry_at: datetime | None = None
    # When it became (or, retrying, becomes) claimable: the claim order (DESIGN.md "Claim
    # order"); None on todos finished before migration 0007.
    ready_at: datetime | None = None
    last_error: str | None = None
    dedupe_hits: int = 0
    priority: int = 0
    assignee_until: datetime | None = None  # then any agent of the queue may claim it
    cancelled_at: datetime | None = None  # a cancelled todo is failed, with who and why
    cancelled_by_kind: ActorKind | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = None
    created_at: datetime
    updated_at: datetime
    claimed_at: datetime | None = None
    completed_at: datetime | None = None

    @classmethod
    def from_record(cls, record) -> Todo:
        """From a `SELECT *` row of todos (the statements' extra columns — `part`,
        `read_at`, `was`, `changes` — are dropped, and `watched`, a waiter's mark for the
        store: 0011_waits.sql)."""
        try:  # every field's column there, the usual case: the others are not looked at
            return cls(**dict(zip(_TODO_FIELDS, map(record.__getitem__, _TODO_FIELDS), strict=True)))
        except KeyError:  # a field left to its default
            row = dict(record)
            for extra in _EXTRA_COLUMNS:
                row.pop(extra, None)
            return cls(**row)

    @property
    def cancelled(self) -> bool:
        return self.cancelled_at is not None

    @property
    def version(self) -> str:
        """What an edit names as the todo it read (ETag, If-Match, the edit form): its
        updated_at, which every transition sets."""
        return version_of(self.updated_at)

    def scheduled(self, now: datetime) -> bool:
        """Pending, not retrying, and not claimable before its ready_at (a run_at)."""
        return (
            self.state == "pending"
            and self.next_retry_at is None
            and self.ready_at is not None
            and self.ready_at > now
        )


_EXTRA_COLUMNS = ("part", "read_at", "was", "changes", "watched")
_TODO_FIELDS = Todo.__struct_fields__  # every column of todos but `watched` (tests/test_queries.py)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_VERSION = re.compile(r"[0-9]{1,18}")  # always fullmatch; 18 digits reach the year 33658


def version_of(at: datetime) -> str:
    """A todo's version: its updated_at as microseconds since the epoch (exact: PostgreSQL
    keeps microseconds, and timedelta divides without a float)."""
    return str((at - _EPOCH) // _MICROSECOND)


def check_version(version: Any) -> datetime:
    """The updated_at a version names; anything no todo could have had is refused."""
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise InvalidInput("version", f"{version!r} is not a todo's version")
    try:
        return _EPOCH + int(version) * _MICROSECOND
    except OverflowError:
        raise InvalidInput("version", f"{version!r} is not a todo's version (past the year 9999)") from None


class TodoEdit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The fields an edit sets; a field left out stays as it is. `kind`, `assignee` and
    `assignee_until` may be null (cleared). `run_at` reschedules a pending todo (ISO 8601
    with its zone; a past time: now). The idempotency key is not editable."""

    title: str | msgspec.UnsetType = msgspec.UNSET
    kind: str | msgspec.UnsetType | None = msgspec.UNSET
    payload: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    assignee: str | msgspec.UnsetType | None = msgspec.UNSET
    assignee_until: str | msgspec.UnsetType | None = msgspec.UNSET
    max_attempts: int | msgspec.UnsetType = msgspec.UNSET
    priority: int | msgspec.UnsetType = msgspec.UNSET
    run_at: str | msgspec.UnsetType = msgspec.UNSET

    def given(self) -> dict[str, Any]:
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not msgspec.UNSET}


class QueuePause(msgspec.Struct, kw_only=True):
    """A paused queue: who paused it, when and why."""

    queue: str
    paused_at: datetime
    actor_kind: ActorKind
    actor: str
    reason: str | None


class Actor(msgspec.Struct, frozen=True):
    """Who moved a todo, as its history row records it: a kind (one of ACTOR_KINDS) and a
    name within that kind. The two are stored apart, so no name can pass for another
    kind's: an agent called "operator:admin" is still an agent (DESIGN.md, "Actors")."""

    kind: ActorKind
    name: str


PRODUCER = Actor("producer", "producer")  # Store.create's default: code that enqueues directly


class NewEvent(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    source: str
    kind: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


class NewTodo(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A todo to create. `run_at` (a time with its zone: ISO 8601 text, or a datetime) or
    `delay` (seconds) schedules it: not claimable before then. `assignee_until`: after
    that time any agent may claim it, not only its assignee. An unknown field is refused:
    a misspelt `idempotency_key` would otherwise make a second todo where one was meant."""

    queue: str
    title: str
    kind: str | None = None
    source: str | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    assignee: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    priority: int = 0
    run_at: str | None = None
    delay: float | None = None
    assignee_until: str | None = None
    event: NewEvent | None = None


class Ack(msgspec.Struct, frozen=True):
    """One acknowledgement in Store.ack_many: complete todo `id` with `result`, or, when
    `error` is given, fail it with that error."""

    id: str
    lease: int
    result: dict | None = None
    error: str | None = None


class Created(msgspec.Struct, kw_only=True):
    todo: Todo
    created: bool


class Scope(msgspec.Struct, frozen=True):
    """The queues an API token covers: the one rule for what an agent may touch.

    The store applies it to every agent call: queues named in a request are checked
    before any work; a todo named by id is checked in the guard of the statement that
    moves it (and, when that matched nothing, by `check_todo` on what the miss found)."""

    token_id: str
    queues: tuple[str, ...]

    def check(self, queues: Iterable[str]) -> None:
        outside = [q for q in queues if q not in self.queues]
        if outside:
            raise OutOfScope(
                f"token {self.token_id} may not use queue {', '.join(outside)} "
                f"(it covers {', '.join(self.queues)})"
            )

    def check_todo(self, todo_id: str, queue: str) -> None:
        """A todo outside the token's queues does not exist for it: 404, its queue unsaid."""
        if queue not in self.queues:
            raise NotFound(f"no todo {todo_id}")


def check_id(todo_id: Any) -> str:
    """A todo id PostgreSQL can look up; anything else cannot name a todo."""
    if not isinstance(todo_id, str) or len(todo_id) > 100 or "\x00" in todo_id:
        raise NotFound(f"no todo {todo_id!r}")
    return todo_id


def check_queue(name: Any, field: str = "queue") -> str:
    if name is None or name == "":
        raise InvalidInput(field, "is required")
    if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
        raise InvalidInput(
            field,
            f"{name!r} is not a queue name: queue names use lowercase letters, digits, '.', '_' "
            "and '-', up to 63 characters, starting with a letter or digit",
        )
    return name


def check_queues(names: Any) -> list[str]:
    if isinstance(names, str) or not names:
        raise InvalidInput("queues", "give a non-empty list of queue names")
    return [check_queue(n, "queues") for n in names]


def check_ttl(ttl: Any) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not (TTL_MIN <= ttl <= TTL_MAX):
        raise InvalidInput("ttl", f"must be a number of seconds from {TTL_MIN} to {TTL_MAX}")
    return float(ttl)


def check_max_attempts(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (MAX_ATTEMPTS_MIN <= value <= MAX_ATTEMPTS_MAX)
    ):
        raise InvalidInput(
            "max_attempts", f"must be a whole number from {MAX_ATTEMPTS_MIN} to {MAX_ATTEMPTS_MAX}"
        )
    return value


SURROGATES = re.compile("[\ud800-\udfff]")
SURROGATE_MESSAGE = (
    "must not contain a lone UTF-16 surrogate (\\ud800 to \\udfff, half of a character): "
    "UTF-8 text cannot hold one"
)


def check_unicode(text: str, field: str) -> str:
    """Text UTF-8 can hold (so PostgreSQL, and every page and JSON answer): Python's JSON
    decoder makes a lone surrogate of "\\ud800", and a form's charset can too."""
    if SURROGATES.search(text):
        raise InvalidInput(field, SURROGATE_MESSAGE)
    return text


def surrogate_path(value: Any) -> str | None:
    """Where in decoded JSON a lone surrogate is (a key or a string), as `todos[0].title`;
    None when there is none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str) and SURROGATES.search(node):
            return path or "body"
        if isinstance(node, dict):
            for key, item in node.items():
                shown = key.encode("utf-8", "backslashreplace").decode()  # a surrogate shown as \ud800
                where = f"{path}.{shown}" if path else shown
                if shown != key:
                    return where
                stack.append((where, item))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(node))
    return None


def check_json_object(value: Any, field: str) -> str:
    """The object as the JSON text PostgreSQL will store (encoded once, here), if it may."""
    if not isinstance(value, dict):
        raise InvalidInput(field, "must be a JSON object")
    try:
        encoded = json_encode(value)
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidInput(field, f"must hold only JSON values ({exc})") from None
    try:
        size = len(encoded.encode())
    except UnicodeEncodeError:  # UTF-8 refuses only surrogates
        raise InvalidInput(field, SURROGATE_MESSAGE) from None
    if size > MAX_JSON_BYTES:
        raise TooLarge(field, f"is {size} bytes as JSON; the limit is {MAX_JSON_BYTES}")
    if _JSON_NUL.search(encoded):  # PostgreSQL's jsonb cannot hold it
        raise InvalidInput(field, "must not contain the NUL character (\\u0000)")
    return encoded


# Made once: json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def json_encode(value: Any) -> str:
    """JSON for PostgreSQL: strict (NaN and infinities refused), as jsonb's codec sends it."""
    return _ENCODER.encode(value)


_DECODER = msgspec.json.Decoder()


def json_decode(text: str) -> Any:
    """jsonb's text as Python values, as json.loads reads it, about five times faster (the
    codec decodes every payload the store hands out). msgspec refuses only a number with a
    fraction beyond a float's range, which jsonb's numeric holds: json.loads reads that, as
    infinity (tests/test_queries.py)."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def check_text(value: Any, field: str, *, required: bool = False, limit: int = MAX_TEXT):
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidInput(field, "is required" if required else "must be text")
    if len(value) > limit:
        raise InvalidInput(field, f"is longer than {limit} characters")
    if "\x00" in value:
        raise InvalidInput(field, "must not contain a NUL character (a zero byte)")
    return check_unicode(value, field)


def check_lease(lease: Any) -> int:
    if isinstance(lease, bool) or not isinstance(lease, int) or not 0 <= lease <= MAX_LEASE:
        raise InvalidInput("lease", "must be the whole number the claim returned")
    return lease


def check_actor(actor: Any) -> Actor:
    if not isinstance(actor, Actor) or actor.kind not in ACTOR_KINDS:
        raise InvalidInput("actor", f"must be an Actor of kind {', '.join(ACTOR_KINDS)}")
    check_text(actor.name, "actor", required=True)
    return actor


def check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidInput(
            "priority", f"must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX} (higher runs first)"
        )
    return value


_ISO_EXAMPLE = "ISO 8601 with a zone, e.g. 2026-12-24T18:00:00Z"


def check_time(value: Any, field: str) -> datetime | None:
    """A point in time with its zone: a datetime, or ISO 8601 text ("2026-12-24T18:00:00Z")."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InvalidInput(
                field, f"{value!r} is not a time (ISO 8601, e.g. 2026-12-24T18:00:00Z)"
            ) from None
    if not isinstance(value, datetime):
        raise InvalidInput(field, f"must be a time ({_ISO_EXAMPLE})")
    if value.tzinfo is None:
        raise InvalidInput(
            field, "must say its time zone (end it with Z for UTC, or an offset such as +01:00)"
        )
    if abs((value - datetime.now(value.tzinfo)).total_seconds()) > MAX_DELAY:
        raise InvalidInput(field, "must be within a year of now")
    return value


def check_delay(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DELAY:
        raise InvalidInput("delay", f"must be a number of seconds from 0 to {MAX_DELAY:.0f} (a year)")
    return float(value)


def check_schedule(run_at: Any, delay: Any) -> tuple[datetime | None, float | None]:
    """(run_at, delay), at most one of them given."""
    if run_at is not None and delay is not None:
        raise InvalidInput("run_at", "give run_at or delay, not both")
    return check_time(run_at, "run_at"), check_delay(delay)


def check_assignee_until(until: Any, assignee: Any) -> datetime | None:
    until = check_time(until, "assignee_until")
    if until is not None and assignee is None:
        raise InvalidInput("assignee_until", "needs an assignee (it says until when only they may claim it)")
    return until


class CheckedTodo(NamedTuple):
    """A NewTodo's values as the store writes them."""

    payload: str  # JSON text
    event_payload: str | None  # JSON text
    run_at: datetime | None
    delay: float | None
    assignee_until: datetime | None


T = TypeVar("T")


class Problems:
    """Input checks run one after another, each field's first problem kept: a form shows
    every error at once. `raise_first` raises the first, carrying them all in `fields`."""

    def __init__(self) -> None:
        self.first: InvalidInput | None = None
        self.fields: dict[str, str] = {}

    def check(self, check: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        try:
            return check(*args, **kwargs)
        except InvalidInput as exc:
            self.first = self.first or exc
            self.fields.setdefault(exc.field, exc.message)
            return None

    def add(self, field: str, message: str) -> None:
        self.check(_refuse, field, message)

    def raise_first(self) -> None:
        if self.first is not None:
            self.first.fields = self.fields
            raise self.first


def _refuse(field: str, message: str) -> None:
    raise InvalidInput(field, message)


def check_new_todo(item: NewTodo) -> CheckedTodo:
    """Check every field; returns the values as the store writes them."""
    problems = Problems()
    checked = _checked_new_todo(item, problems)
    problems.raise_first()
    return checked


def new_todo_problems(item: NewTodo) -> dict[str, str]:
    """Every field's problem (field: message), for the create form; {} when it may be created."""
    problems = Problems()
    _checked_new_todo(item, problems)
    return problems.fields


def _check_key(key: Any) -> None:
    check_text(key, "idempotency_key")
    if key is not None and not key.strip():
        raise InvalidInput("idempotency_key", "must not be empty (leave it out for no key)")


def _checked_new_todo(item: NewTodo, problems: Problems) -> CheckedTodo:
    check = problems.check
    check(check_queue, item.queue)
    check(check_text, item.title, "title", required=True)
    for field in ("kind", "source", "assignee"):
        check(check_text, getattr(item, field), field)
    check(_check_key, item.idempotency_key)
    payload = check(check_json_object, item.payload, "payload")
    check(check_max_attempts, item.max_attempts)
    check(check_priority, item.priority)
    run_at, delay = check(check_schedule, item.run_at, item.delay) or (None, None)
    until = check(check_assignee_until, item.assignee_until, item.assignee)
    event_payload = None
    if item.event is not None:
        check(check_text, item.event.source, "event.source", required=True)
        check(check_text, item.event.kind, "event.kind", required=True)
        event_payload = check(check_json_object, item.event.payload, "event.payload")
    return CheckedTodo(payload, event_payload, run_at, delay, until)


EDITABLE = ("title", "kind", "payload", "assignee", "assignee_until", "max_attempts", "priority")


class CheckedEdit(NamedTuple):
    """A TodoEdit applied to the todo it edits, as the store writes it."""

    values: dict[str, Any]  # every EDITABLE field: the new value, or the todo's
    run_at: datetime | None


def check_edit(todo: Todo, edit: TodoEdit) -> CheckedEdit:
    """Check every field of `edit` against `todo`; the todo's values after it."""
    problems = Problems()
    checked = _checked_edit(todo, edit, problems)
    problems.raise_first()
    return checked


def edit_problems(todo: Todo, edit: TodoEdit) -> dict[str, str]:
    """Every field's problem (field: message), for the edit form; {} when it may be saved."""
    problems = Problems()
    _checked_edit(todo, edit, problems)
    return problems.fields


def _checked_edit(todo: Todo, edit: TodoEdit, problems: Problems) -> CheckedEdit:
    """A field that fails its check keeps the todo's value, so the checks after it judge
    the rest against what would be written."""
    given = edit.given()
    new = {f: getattr(todo, f) for f in EDITABLE}

    def check(field: str, check_field: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if field in given:
            value = problems.check(check_field, given[field], *args, **kwargs)
            if field not in problems.fields:
                new[field] = value

    check("title", check_text, "title", required=True)
    for field in ("kind", "assignee"):
        check(field, check_text, field)
        if field in given and not (new[field] or "").strip():
            new[field] = None  # empty or blank: cleared
    if "payload" in given and problems.check(check_json_object, given["payload"], "payload"):
        new["payload"] = given["payload"]
    check("max_attempts", check_max_attempts)
    check("priority", check_priority)
    check("assignee_until", check_time, "assignee_until")
    if new["assignee"] is None:
        new["assignee_until"] = None
    problems.check(check_assignee_until, new["assignee_until"], new["assignee"])
    run_at = problems.check(check_time, given.get("run_at"), "run_at")
    if run_at is not None and todo.state != "pending":
        problems.add("run_at", "only a pending todo can be scheduled (retry the dead one with it)")
    if "max_attempts" in given and new["max_attempts"] < todo.attempt and todo.state == "pending":
        problems.add(
            "max_attempts", f"must be at least the attempts already made ({todo.attempt}) while it is pending"
        )
    return CheckedEdit(new, run_at)


def check_wait(wait: Any) -> float:
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= MAX_WAIT:
        raise InvalidInput("wait", f"must be from 0 to {MAX_WAIT:.0f} seconds")
    return float(wait)
