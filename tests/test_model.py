"""A model-based test of the queue: random operation sequences against the real store.

A hypothesis state machine drives create / claim / heartbeat / release / complete / fail /
reap / operator retry / force-release (and the time travel that makes leases lapse and
retries come due), and queue control — pause / resume, priorities, schedules (run_at or
delay on create), run now, cancel, edit and bulk set — against a fresh database per
example, and against a small pure-Python model of DESIGN.md's state-machine table written
below. After every operation the outcome (success, NotFound, Conflict, Cancelled,
InvalidInput) and the returned todo must match the model; after every step the whole
todos table, its history and the paused queues must match too.

Time is moved by SQL, never waited for: leases are long (TTL) and lapse only when a rule
sets lease_expires_at into the past; a retry time is checked to be backoff(attempt) ahead
and then pushed an hour further, so it comes due only when a rule makes it due. A
schedule is either no schedule at all (delay 0, a run_at already past) or an hour ahead,
so a scheduled todo comes due only by run now (or an edit of its run_at), never by the
wall clock.

Claim order (DESIGN "Queue control", README "Claim order"): the highest priority first,
then the longest ready. The model numbers each moment a todo becomes claimable (created,
released, force-released, retried, its retry made due, run now, rescheduled into the past),
as ready_at orders them in the table. The store's claim cursors may let a todo behind
a claimer's place wait until that claimer next scans from the oldest; they run on a clock
this machine moves itself, so the model knows when that scan must have come (Model.start).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import ClassVar

import asyncpg
import pytest
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dashboard import db as dbmod
from dashboard.claim_cursor import MAX_FULL_SCAN_EVERY, ClaimCursors
from dashboard.control import Control
from dashboard.errors import Cancelled, Conflict, InvalidInput, NotFound
from dashboard.models import MAX_REASON, PRODUCER, Actor, NewTodo, Todo, TodoEdit
from dashboard.store import Store
from tests import factories
from tests.conftest import drop_database, make_database

QUEUES = ("a", "b")
OWNERS = ("alice", "bob", "carol")
KEYS = ("k1", "k2")
OPERATOR = Actor("operator", "oscar")
OPERATORS = (OPERATOR, Actor("operator", "olga"))
REAPER = Actor("system", "reaper")
TTL = 300  # seconds; leases lapse only when a rule says so
MISSING = "td_00000000-0000-0000-0000-000000000000"
PRIORITIES = (0, 0, 0, 1, -1, 10, -10)
# A todo's schedule on create: none; due at once (delay 0, a run_at already past); or an
# hour ahead (a delay, a run_at in UTC or in another zone). Never close to now.
SCHEDULES = (None, None, None, "delay 0", "run_at past", "delay 1h", "run_at 1h", "run_at 1h +02:00")
AHEAD = ("delay 1h", "run_at 1h", "run_at 1h +02:00")


OK, NOT_FOUND, CONFLICT, CANCELLED, INVALID = "ok", "NotFound", "Conflict", "Cancelled", "InvalidInput"
DRAWN = -1  # a claim's lease token: the store draws it at random (DESIGN "Fencing")


def adopt_token(t, token: int) -> None:
    """The model takes the token a claim drew, once: any in [1, 2^53 - 1] that the todo has
    not held before (a promoted replica must not repeat one, so none is predictable)."""
    if t.lease_token == DRAWN:
        assert 1 <= token < 2**53 and token not in t.tokens, (t.id, token, t.tokens)
        t.lease_token = token


LIVE = ("pending", "claimed")
EDITABLE = ("pending", "failed")


def new_todos(max_size: int):
    """(queue, idempotency key, assignee, max_attempts, priority, schedule) of todos to create."""
    return st.lists(
        st.tuples(
            st.sampled_from(QUEUES),
            st.sampled_from([None, None, *KEYS]),
            st.sampled_from([None, None, *OWNERS]),
            st.sampled_from([1, 1, 2, 3]),  # max_attempts: small, so todos reach the cap
            st.sampled_from(PRIORITIES),
            st.sampled_from(SCHEDULES),
        ),
        min_size=1,
        max_size=max_size,
    )


def schedule(kind: str | None) -> dict:
    """NewTodo's run_at or delay for one of SCHEDULES."""
    now = datetime.now(UTC)
    hour = now + timedelta(hours=1)
    return {
        None: {},
        "delay 0": {"delay": 0},
        "run_at past": {"run_at": (now - timedelta(days=1)).isoformat()},
        "delay 1h": {"delay": 3600},
        "run_at 1h": {"run_at": hour.isoformat().replace("+00:00", "Z")},
        "run_at 1h +02:00": {"run_at": hour.astimezone(timezone(timedelta(hours=2))).isoformat()},
    }[kind]


# What an edit sets, each field's values mostly valid: title " ", max_attempts 0,
# priority 11 and a run_at without its zone are refused.
EDITS = {
    "title": st.sampled_from(["t", "t2", "t2", "t3", " "]),
    "kind": st.sampled_from([None, "k", "k", " "]),
    "payload": st.sampled_from([{}, {"x": 1}, {"x": 2, "y": [1]}]),
    "assignee": st.sampled_from([None, None, "", *OWNERS]),
    "max_attempts": st.sampled_from([1, 2, 3, 5, 5, 0]),
    "priority": st.sampled_from([0, 1, -1, 10, 10, 11]),
    "run_at": st.sampled_from(["1h", "1h", "past", "past", "no zone"]),
}


def edit_run_at(kind: str) -> str:
    now = datetime.now(UTC)
    return {
        "1h": (now + timedelta(hours=1)).isoformat(),
        "past": (now - timedelta(days=1)).isoformat(),
        "no zone": "2030-01-01T00:00:00",
    }[kind]


def reason_recorded(reason: str | None) -> str | None:
    """A pause's or a cancellation's reason as the store keeps it: blank is none."""
    return reason.strip() or None if reason is not None else None


def payload_changes(old: dict, new: dict) -> dict:
    """An edit's `changes` for a payload: top-level keys added, removed and changed."""
    return {
        "added": {k: v for k, v in new.items() if k not in old},
        "removed": {k: v for k, v in old.items() if k not in new},
        "changed": {k: [old[k], new[k]] for k in old.keys() & new.keys() if old[k] != new[k]},
    }


def backoff(attempt: int) -> float:
    """The longest retry delay after the n-th failed attempt (todo_backoff, 0003: the delay
    is drawn from [0, this])."""
    return float(min(2**attempt, 3600))


def cancellation(cancelled_at, kind, by, reason) -> tuple | None:
    """A todo's cancellation columns as the model keeps them: None when all are clear."""
    if cancelled_at is None and kind is None and by is None and reason is None:
        return None
    return (cancelled_at is not None, kind, by, reason)


# -- the model -------------------------------------------------------------------------


@dataclass
class M:
    """What the model believes about one todo."""

    id: str
    n: int  # creation order, which is also created_at order
    queue: str
    key: str | None
    assignee: str | None
    max_attempts: int
    priority: int = 0
    title: str = "t"
    kind: str | None = None
    payload: dict = field(default_factory=dict)
    state: str = "pending"
    owner: str | None = None
    attempt: int = 0
    lease_token: int = 0  # DRAWN right after a claim, until the store says which token it drew
    tokens: list[int] = field(default_factory=list)  # every token it held before this one
    lease: str | None = None  # None, "live" or "lapsed" (expired, not yet reaped)
    retry: str | None = None  # next_retry_at: None, "future" or "due"
    scheduled: bool = False  # pending with its ready_at (a run_at or delay) still ahead
    cancelled: tuple | None = None  # (True, actor kind, actor name, reason) once cancelled
    dedupe_hits: int = 0
    ready: int | None = None  # when it last became claimable, a sequence number (ready_at's order)
    history: int = 1  # rows in todo_history
    last: tuple = (None, PRODUCER)  # the newest history row's from_state and Actor

    @property
    def waiting(self) -> bool:
        """Pending but not claimable yet: retrying, or scheduled."""
        return self.state == "pending" and (self.retry == "future" or self.scheduled)

    def place(self) -> tuple[int, int | None]:
        """Its place in claim order: the rank (-priority), then ready_at."""
        return -self.priority, self.ready

    def row(self) -> dict:
        return {
            "state": self.state,
            "owner": self.owner,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "lease_token": self.lease_token,
            "dedupe_hits": self.dedupe_hits,
            "queue": self.queue,
            "idempotency_key": self.key,
            "assignee": self.assignee,
            "priority": self.priority,
            "title": self.title,
            "kind": self.kind,
            "payload": self.payload,
            "cancelled": self.cancelled,
            "lease": self.lease,
            "retry": self.retry,
            "waiting": self.waiting if self.state == "pending" else None,
        }


@dataclass
class Model:
    todos: dict[str, M] = field(default_factory=dict)
    created: int = 0
    readied: int = 0
    paused: dict[str, tuple[Actor, str | None]] = field(default_factory=dict)  # queue: who, why
    queue_log: list[tuple] = field(default_factory=list)  # queue_history: (queue, action, actor, reason)
    places: dict[tuple, tuple] = field(default_factory=dict)  # claimer: place of its last claim
    scanned: dict[tuple, int] = field(default_factory=dict)  # claimer: epoch of its last full scan
    epoch: int = 0  # the claim cursors' clock, in steps of MAX_FULL_SCAN_EVERY

    def became_ready(self, t: M) -> None:
        t.ready = self.readied
        self.readied += 1

    def get(self, todo_id: str) -> M | None:
        return self.todos.get(todo_id)

    def live_with_key(self, queue: str, key: str | None, besides: str | None = None) -> M | None:
        if key is None:
            return None
        for t in self.todos.values():
            if t.queue == queue and t.key == key and t.state in LIVE and t.id != besides:
                return t
        return None

    def claimable(self, t: M, owner: str) -> bool:
        return (
            t.state == "pending"
            and not t.waiting
            and t.assignee in (None, owner)
            and t.queue not in self.paused
        )

    @staticmethod
    def claimer(queues, owner: str) -> tuple:
        return owner, tuple(sorted(set(queues)))  # ClaimCursors.key

    def start(self, queues, owner: str) -> tuple | None:
        """Where a claim of `owner` on `queues` may start: None when it surely scans from
        the oldest, else the place (rank, ready) of that claimer's last claimed todo.

        DESIGN says a claim takes the highest priority, oldest first within it. The store's
        claim cursors (README "Claim order", dashboard/claim_cursor.py) start a claim where
        the claimer's last one ended, and scan from the oldest only now and then (at most
        MAX_FULL_SCAN_EVERY apart). So a todo behind that place in its own priority level
        — one that became claimable without becoming ready anew: its queue resumed, its
        priority or assignee changed while the claimer walked past it — may wait for the
        claimer's next scan from the oldest. That is all the model lets claims differ by
        (`claim_options`), and only until then: the machine runs the cursors on its own
        clock, which stands still except in `claimers_rescan`, where it moves
        MAX_FULL_SCAN_EVERY. A claimer surely scans from the oldest while it has claimed
        nothing, and at its first claim after the clock moved. (The store may scan from
        the oldest more often, e.g. it forgets a claimer's place when an edit or a resume
        may have put todos behind it: then claims keep strict order, which is allowed too.)"""
        key = self.claimer(queues, owner)
        place = self.places.get(key)
        if place is None or self.scanned.get(key) != self.epoch:
            self.scanned[key] = self.epoch
            return None
        return place

    def claim_options(self, queues, owner: str, n: int) -> list[list[M]]:
        """What claim_next / claim_batch may take: the first n claimable todos in `queues`
        in claim order, or, when the claim may start at the claimer's place (`start`), the
        first n of those not behind it in its level."""
        begin = self.start(queues, owner)
        ready = sorted(
            (t for t in self.todos.values() if t.queue in queues and self.claimable(t, owner)),
            key=M.place,
        )
        options = [ready[:n]]
        if begin is not None:
            rank, after = begin
            later = [t for t in ready if -t.priority != rank or t.ready >= after][:n]
            if later != options[0]:
                options.append(later)
        return options

    def took(self, queues, owner: str, claimed: list[M]) -> None:
        """The claimer's next claim may start at the last todo this one took."""
        if claimed:
            self.places[self.claimer(queues, owner)] = claimed[-1].place()

    @staticmethod
    def claim(t: M, owner: str) -> None:
        t.state, t.owner, t.lease, t.retry = "claimed", owner, "live", None
        t.attempt += 1
        t.tokens.append(t.lease_token)
        t.lease_token = DRAWN
        t.history += 1
        t.last = ("pending", Actor("agent", owner))

    @staticmethod
    def holds(t: M | None, owner: str, lease: int) -> str:
        """The guard of heartbeat, release, complete and fail."""
        if t is None:
            return NOT_FOUND
        if t.state == "claimed" and t.owner == owner and t.lease_token == lease:
            return OK
        if t.cancelled and t.owner == owner and t.lease_token == lease:
            # DESIGN: cancelled while held; its holder is told so at its next heartbeat or ack.
            return CANCELLED
        return CONFLICT

    @staticmethod
    def fail(t: M, actor: Actor) -> None:
        """fail, and reap: below the cap back to pending with a retry time; at it, dead."""
        t.lease = None
        if t.attempt < t.max_attempts:
            t.state, t.owner, t.retry = "pending", None, "future"
        else:
            t.state = "failed"  # the last owner stays, as for done (0001_queue.sql)
        t.history += 1
        t.last = ("claimed", actor)

    def retried(self, t: M, actor: Actor, one_more: bool) -> None:
        """An operator's retry of a dead todo (also of a cancelled one: it clears that)."""
        t.state, t.owner, t.retry, t.scheduled, t.cancelled = "pending", None, None, False, None
        self.became_ready(t)
        if one_more:
            # DESIGN.md says "one more attempt (max_attempts raised by one)"; the store
            # sets max_attempts = attempt + 1. The two agree when the todo died at the
            # cap and differ when it died past it (released at the cap, claimed again):
            # max 1 -> 3, not 2. Both allow exactly one more attempt; this model follows
            # the store (DESIGN's wording is the side to settle).
            t.max_attempts = t.attempt + 1
        else:
            t.attempt = 0  # a fresh budget; the lease token is never reset
        Model.transition(t, actor, "failed")

    @staticmethod
    def transition(t: M, actor: Actor, from_state: str) -> None:
        t.history += 1
        t.last = (from_state, actor)


# -- the machine -----------------------------------------------------------------------


class QueueMachine(RuleBasedStateMachine):
    server_dsn: str = ""
    template_db: str = ""
    databases: ClassVar[list[str]] = []  # every database an example made, to check they are gone

    def __init__(self):
        super().__init__()
        self.model = Model()
        self.loop = asyncio.new_event_loop()
        self.conn = None
        self.db_name = None
        try:
            self.db_name, dsn = make_database(self.server_dsn, self.template_db)
            self.databases.append(self.db_name)
            self.conn = self.run(dbmod.connect(dsn))
        except BaseException:
            self.teardown()
            raise
        # The claim cursors' clock is the machine's (Model.start): it moves only in
        # claimers_rescan. The agents' and the operators' writers share them, as in the app.
        self.clock = 0.0
        cursors = ClaimCursors(clock=lambda: self.clock)
        self.store = Store(self.conn, cursors=cursors)
        self.control = Control(self.conn, cursors=cursors)

    def teardown(self):
        try:
            if self.conn is not None:
                self.run(self.conn.close())
        finally:
            try:
                if self.db_name is not None:
                    self.run(drop_database(self.server_dsn, self.db_name))  # FORCE: even if close failed
            finally:
                self.loop.close()

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def call(self, coro):
        """(outcome, value or exception) of one store call."""
        try:
            return OK, self.run(coro)
        except NotFound as exc:
            return NOT_FOUND, exc
        except Cancelled as exc:
            return CANCELLED, exc
        except Conflict as exc:
            return CONFLICT, exc
        except InvalidInput as exc:
            return INVALID, exc

    # -- helpers -----------------------------------------------------------------------

    def ids(self, *states: str) -> list[str]:
        return [t.id for t in self.model.todos.values() if not states or t.state in states]

    def cancelled_held(self) -> list[str]:
        """Todos cancelled while claimed: their holder still has a lease to present."""
        return [t.id for t in self.model.todos.values() if t.cancelled and t.owner]

    def holdable(self) -> bool:
        return bool(self.ids("claimed") or self.cancelled_held())

    def draw_id(self, data, preferred: list[str], tricky: list[str] | None = None) -> str:
        """Mostly one of `preferred`, else one of `tricky`, any todo, or one that is not there."""
        buckets = {
            "preferred": (preferred, 4),
            "tricky": (tricky or [], 2),
            "any": (self.ids(), 2),
            "missing": ([MISSING], 1),
        }
        kinds = [k for k, (ids, weight) in buckets.items() if ids for _ in range(weight)]
        kind = data.draw(st.sampled_from(kinds), label="pick")
        return data.draw(st.sampled_from(buckets[kind][0]), label="todo")

    def draw_owner_and_lease(self, data, todo_id: str) -> tuple[str, int]:
        """The holder and its lease, mostly; else another agent, or a stale or unseen lease."""
        t = self.model.get(todo_id)
        owners = [t.owner] * 8 + list(OWNERS) if t and t.owner else list(OWNERS)
        owner = data.draw(st.sampled_from(owners), label="owner")
        current = t.lease_token if t else 1
        # The current lease, mostly; else the one from the claim before (a late agent whose
        # lease lapsed), or any other: older ones, 0 (never issued) and small numbers (as
        # the tokens before random ones were).
        before = t.tokens[-1:] if t else []
        leases = [current] * 8 + before * 3 + (t.tokens if t else []) + [0, 1, 2]
        lease = data.draw(st.sampled_from(leases), label="lease")
        return owner, lease

    def holder_action(self, data, action: str, call, extra: str = ""):
        """A call only the lease holder may make, `call(todo_id, owner, lease)`, on a drawn
        claimed todo (mostly; else often one cancelled while held) with a drawn owner and
        lease; its outcome must be the model's. Returns (outcome, value, the model's todo,
        owner)."""
        todo_id = self.draw_id(data, self.ids("claimed"), tricky=self.cancelled_held())
        owner, lease = self.draw_owner_and_lease(data, todo_id)
        note(f"{action}({todo_id}, {owner}, lease={lease}{extra})")
        t = self.model.get(todo_id)
        expected = Model.holds(t, owner, lease)
        outcome, got = self.call(call(todo_id, owner, lease))
        self.expect(action, outcome, got, expected, t)
        return outcome, got, t, owner

    def expect(self, action: str, outcome, value, expected: str, t: M | None = None) -> None:
        event(f"{action}: {outcome}")
        note(f"  -> {outcome}")
        assert outcome == expected, (
            f"{action}: the store says {outcome} ({value!r}), the model expects {expected}"
        )
        if outcome == CANCELLED:
            # DESIGN "Queue control": the holder is told it was cancelled (who, why).
            _, kind, by, reason = t.cancelled
            want = {"state": "failed", "cancelled_by_kind": kind, "cancelled_by": by, "reason": reason}
            assert value.current == want, (action, value.current, t)
            assert "cancelled" in str(value), (action, str(value))
        elif outcome == CONFLICT and t is not None and "state" in value.current:
            # DESIGN.md: a Conflict says the todo's state, owner and assignee.
            assert value.current["state"] == t.state, (action, value.current, t)
            assert value.current.get("owner") == t.owner, (action, value.current, t)
            assert value.current.get("assignee") == t.assignee, (action, value.current, t)

    def check(self, action: str, got: Todo, t: M) -> None:
        """A todo the store handed back matches the model's (already updated) todo."""
        assert got.id == t.id, (action, got.id, t.id)
        adopt_token(t, got.lease_token)
        seen = {
            "state": got.state,
            "owner": got.owner,
            "attempt": got.attempt,
            "max_attempts": got.max_attempts,
            "lease_token": got.lease_token,
            "dedupe_hits": got.dedupe_hits,
            "queue": got.queue,
            "idempotency_key": got.idempotency_key,
            "assignee": got.assignee,
            "priority": got.priority,
            "title": got.title,
            "kind": got.kind,
            "payload": got.payload,
            "cancelled": cancellation(
                got.cancelled_at, got.cancelled_by_kind, got.cancelled_by, got.cancel_reason
            ),
        }
        want = {k: v for k, v in t.row().items() if k in seen}
        assert seen == want, f"{action}: store returned {seen}, model has {want}"
        assert (got.lease_expires_at is not None) == (t.state == "claimed"), (action, got)
        if action.startswith(("claim", "heartbeat", "complete_and_claim_next (claimed)")):
            # A lease was just written: it ends ttl seconds after the write.
            left = (got.lease_expires_at - got.updated_at).total_seconds()
            assert abs(left - TTL) < 1, f"{action}: lease of {left} s, asked for {TTL} s"

    def check_claims(self, action: str, queues, owner: str, n: int, claimed: list[Todo]) -> None:
        """What claim_next / claim_batch (alone or after a complete) claimed is one of the
        model's options (Model.claim_options); the model then claims it too."""
        options = self.model.claim_options(queues, owner, n)
        ids = [g.id for g in claimed]
        matching = [i for i, option in enumerate(options) if ids == [t.id for t in option]]
        assert matching, f"{action}: store claimed {ids}, model expects " + " or ".join(
            str([t.id for t in option]) for option in options
        )
        if len(options) > 1:
            event(f"claim: a todo behind the claimer's place {'waits' if matching[0] else 'is taken'}")
        option = options[matching[0]]
        self.model.took(queues, owner, option)
        for g, t in zip(claimed, option, strict=True):
            Model.claim(t, owner)
            self.check(action, g, t)

    def settle_retry(self, got: Todo) -> None:
        """A fresh retry time is at most backoff(attempt) ahead; push it an hour on, out of reach."""
        if got.state != "pending" or got.next_retry_at is None:
            return
        ahead = (got.next_retry_at - got.updated_at).total_seconds()
        assert -0.5 < ahead <= backoff(got.attempt) + 0.5, (
            f"retry of {got.id} after attempt {got.attempt} is {ahead} s ahead, "
            f"expected at most backoff {backoff(got.attempt)} s"
        )
        self.run(
            self.conn.execute(
                "UPDATE todos SET next_retry_at = next_retry_at + interval '1 hour',"
                " ready_at = next_retry_at + interval '1 hour' WHERE id = $1",
                got.id,
            )
        )

    def last_changes(self, todo_id: str):
        """The `changes` of the todo's newest history row."""
        return self.run(
            self.conn.fetchval(
                "SELECT changes FROM todo_history WHERE todo_id = $1 ORDER BY id DESC LIMIT 1", todo_id
            )
        )

    # -- producers ---------------------------------------------------------------------

    @initialize(items=new_todos(max_size=4))
    def start(self, items):
        self.create(items)

    @rule(items=new_todos(max_size=3))
    def create(self, items):
        """One to three creates, one after the other (each its own store.create)."""
        for item in items:
            self.create_one(*item)

    def create_one(self, queue, key, assignee, max_attempts, priority, when):
        item = NewTodo(
            queue=queue,
            title="t",
            idempotency_key=key,
            assignee=assignee,
            max_attempts=max_attempts,
            priority=priority,
            **schedule(when),
        )
        note(
            f"create(queue={queue}, key={key}, assignee={assignee}, max={max_attempts},"
            f" priority={priority}, {when})"
        )
        live = self.model.live_with_key(queue, key)
        outcome, got = self.call(self.store.create(item))
        self.expect("create", outcome, got, OK)
        if live is not None:
            # The live todo is returned as it is: the duplicate's priority and schedule
            # change nothing.
            assert not got.created, "a live todo holds the key: the create must collapse"
            live.dedupe_hits += 1
            Model.transition(live, PRODUCER, live.state)
            self.check("create (collapsed)", got.todo, live)
            return
        assert got.created, f"no live todo holds ({queue}, {key}), yet created=False"
        assert got.todo.id not in self.model.todos
        n = self.model.created
        self.model.created += 1
        t = M(
            id=got.todo.id,
            n=n,
            queue=queue,
            key=key,
            assignee=assignee,
            max_attempts=max_attempts,
            priority=priority,
        )
        self.model.todos[t.id] = t
        if when in AHEAD:
            t.scheduled = True
            if item.run_at is not None:
                assert got.todo.ready_at == datetime.fromisoformat(item.run_at), (got.todo, item.run_at)
            else:
                ahead = (got.todo.ready_at - got.todo.created_at).total_seconds()
                assert abs(ahead - item.delay) < 1, f"delay {item.delay} s, ready {ahead} s after creation"
        else:
            self.model.became_ready(t)
        self.check("create", got.todo, t)
        self.run(
            self.conn.execute(
                "UPDATE todos SET created_at = '2000-01-01Z'::timestamptz"
                " + $2::int * interval '1 millisecond' WHERE id = $1",
                t.id,
                n,
            )
        )

    # -- agents ------------------------------------------------------------------------

    @rule(
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True),
        owner=st.sampled_from(OWNERS),
    )
    def claim_next(self, queues, owner):
        note(f"claim_next({queues}, {owner})")
        outcome, got = self.call(self.store.claim_next(queues, owner, TTL))
        self.expect("claim_next", outcome, got, OK)
        self.check_claims("claim_next", queues, owner, 1, [got] if got else [])

    @rule(
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True),
        owner=st.sampled_from(OWNERS),
        n=st.integers(1, 3),
    )
    def claim_batch(self, queues, owner, n):
        note(f"claim_batch({queues}, {owner}, {n})")
        outcome, got = self.call(self.store.claim_batch(queues, owner, TTL, n))
        self.expect("claim_batch", outcome, got, OK)
        self.check_claims("claim_batch", queues, owner, n, got)

    @precondition(lambda self: bool(self.ids()))
    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def claim(self, data, owner):
        waiting = [t.id for t in self.model.todos.values() if t.waiting]
        todo_id = self.draw_id(data, self.ids("pending"), tricky=waiting)
        note(f"claim({todo_id}, {owner})")
        t = self.model.get(todo_id)
        expected = NOT_FOUND if t is None else OK if self.model.claimable(t, owner) else CONFLICT
        outcome, got = self.call(self.store.claim(todo_id, owner, TTL))
        self.expect("claim", outcome, got, expected, t)
        if outcome == OK:
            Model.claim(t, owner)
            self.check("claim", got, t)
        elif outcome == CONFLICT and t.state == "pending":
            # The Conflict says why a pending todo is not claimable (DESIGN "Queue control":
            # a paused queue's claim by id "is a Conflict saying so").
            if t.queue in self.model.paused:
                assert f"queue {t.queue} is paused" in str(got), str(got)
            if t.scheduled:
                assert "scheduled for" in str(got), str(got)
            if t.retry == "future":
                assert "retrying at" in str(got), str(got)

    @precondition(lambda self: self.holdable())
    @rule(data=st.data())
    def heartbeat(self, data):
        outcome, got, t, owner = self.holder_action(
            data, "heartbeat", lambda i, o, lease: self.store.heartbeat(i, o, lease, TTL)
        )
        if outcome == OK:
            t.lease = "live"  # also on a lapsed lease the reaper has not taken yet
            Model.transition(t, Actor("agent", owner), "claimed")
            self.check("heartbeat", got, t)

    @precondition(lambda self: self.holdable())
    @rule(data=st.data())
    def release(self, data):
        outcome, got, t, owner = self.holder_action(
            data, "release", lambda i, o, lease: self.store.release(i, o, lease)
        )
        if outcome == OK:
            t.state, t.owner, t.lease = "pending", None, None  # the attempt stays counted
            self.model.became_ready(t)
            Model.transition(t, Actor("agent", owner), "claimed")
            self.check("release", got, t)

    @precondition(lambda self: self.holdable())
    @rule(data=st.data())
    def complete(self, data):
        outcome, got, t, owner = self.holder_action(
            data, "complete", lambda i, o, lease: self.store.complete(i, o, lease, {"ok": True})
        )
        if outcome == OK:
            t.state, t.lease = "done", None  # the last owner stays
            Model.transition(t, Actor("agent", owner), "claimed")
            self.check("complete", got, t)
            assert got.result == {"ok": True}

    @precondition(lambda self: self.holdable())
    @rule(data=st.data())
    def fail(self, data):
        outcome, got, t, owner = self.holder_action(
            data, "fail", lambda i, o, lease: self.store.fail(i, o, lease, "boom")
        )
        if outcome == OK:
            Model.fail(t, Actor("agent", owner))
            self.check("fail", got, t)
            assert got.last_error == "boom"
            self.settle_retry(got)

    @precondition(lambda self: self.holdable())
    @rule(
        data=st.data(),
        queues=st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True),
    )
    def complete_and_claim_next(self, data, queues):
        def call(todo_id, owner, lease):
            return self.store.complete_and_claim_next(todo_id, owner, lease, None, queues, TTL)

        outcome, got, t, owner = self.holder_action(data, "complete_and_claim_next", call, f", {queues}")
        if outcome != OK:
            # Nothing completed, nothing claimed (the invariant checks it); the claim part
            # ran all the same, from where the claimer starts.
            self.model.start(queues, owner)
            return
        done, claimed = got
        t.state, t.lease = "done", None
        Model.transition(t, Actor("agent", owner), "claimed")
        self.check("complete_and_claim_next (done)", done, t)
        self.check_claims("complete_and_claim_next (claimed)", queues, owner, 1, [claimed] if claimed else [])

    # -- time, the reaper and retry promotion ------------------------------------------

    @rule()
    def claimers_rescan(self):
        """Time passes for the claim cursors: every claimer's next claim scans from the oldest."""
        note("claimers rescan")
        self.clock += MAX_FULL_SCAN_EVERY
        self.model.epoch += 1

    @precondition(
        lambda self: any(t.state == "claimed" and t.lease == "live" for t in self.model.todos.values())
    )
    @rule(data=st.data())
    def expire_lease(self, data):
        todo_id = data.draw(
            st.sampled_from(
                [t.id for t in self.model.todos.values() if t.state == "claimed" and t.lease == "live"]
            ),
            label="todo",
        )
        note(f"expire lease of {todo_id}")
        self.run(factories.expire_lease(self.conn, todo_id))
        self.model.todos[todo_id].lease = "lapsed"

    @precondition(lambda self: bool(self.ids("claimed")))
    @rule()
    def reap(self):
        note("reap()")
        want = {t.id: t for t in self.model.todos.values() if t.state == "claimed" and t.lease == "lapsed"}
        outcome, got = self.call(self.store.reap())
        self.expect("reap", outcome, got, OK)
        assert sorted(g.id for g in got) == sorted(want), (
            f"reap: store reaped {sorted(g.id for g in got)}, model expects {sorted(want)}"
        )
        for g in got:
            t = want[g.id]
            prior_owner = t.owner
            Model.fail(t, REAPER)
            self.check("reap", g, t)
            assert g.last_error == f"lease expired (owner {prior_owner})", g.last_error
            self.settle_retry(g)

    @precondition(lambda self: any(t.retry == "future" for t in self.model.todos.values()))
    @rule(data=st.data())
    def make_retry_due(self, data):
        todo_id = data.draw(
            st.sampled_from([t.id for t in self.model.todos.values() if t.retry == "future"]), label="todo"
        )
        note(f"make retry of {todo_id} due")
        self.run(factories.make_retry_due(self.conn, todo_id))
        self.model.todos[todo_id].retry = "due"
        self.model.became_ready(self.model.todos[todo_id])

    @precondition(lambda self: any(t.retry for t in self.model.todos.values()))
    @rule()
    def promote_due_retries(self):
        note("promote_due_retries()")
        due = [t for t in self.model.todos.values() if t.retry == "due"]
        outcome, got = self.call(self.store.promote_due_retries())
        self.expect("promote_due_retries", outcome, got, OK)
        assert got == len(due), f"promoted {got}, model expects {len(due)}"
        for t in due:
            t.retry = None
            Model.transition(t, REAPER, "pending")

    # -- operators ---------------------------------------------------------------------

    def retry_refused(self, t: M | None) -> tuple[str | None, M | None]:
        """Why an operator's retry of `t` is refused (None: it is not), and the live todo
        that holds its key, if that is why."""
        if t is None:
            return NOT_FOUND, None
        if t.state != "failed":
            return CONFLICT, None
        holder = self.model.live_with_key(t.queue, t.key, besides=t.id)
        return (CONFLICT if holder else None), holder

    @precondition(lambda self: bool(self.ids("failed")))
    @rule(data=st.data(), one_more=st.booleans())
    def retry(self, data, one_more):
        todo_id = self.draw_id(data, self.ids("failed"))
        note(f"retry({todo_id}, one_more={one_more})")
        t = self.model.get(todo_id)
        refused, holder = self.retry_refused(t)
        outcome, got = self.call(self.control.retry(todo_id, OPERATOR, one_more=one_more))
        self.expect("retry", outcome, got, refused or OK, t)
        if holder is not None:
            assert holder.id in str(got), f"the Conflict must name the live todo: {got}"
        if outcome == OK:
            self.model.retried(t, OPERATOR, one_more)
            self.check("retry", got, t)
            recorded = self.run(
                self.conn.fetchval(
                    "SELECT note FROM todo_history WHERE todo_id = $1 ORDER BY id DESC LIMIT 1",
                    todo_id,
                )
            )
            choice = "one more attempt" if one_more else "fresh budget"
            assert choice in recorded, f"retry: the choice is not recorded: {recorded!r}"

    @precondition(lambda self: bool(self.ids("claimed")))
    @rule(data=st.data())
    def force_release(self, data):
        todo_id = self.draw_id(data, self.ids("claimed"))
        note(f"force_release({todo_id})")
        t = self.model.get(todo_id)
        expected = NOT_FOUND if t is None else OK if t.state == "claimed" else CONFLICT
        outcome, got = self.call(self.control.force_release(todo_id, OPERATOR))
        self.expect("force_release", outcome, got, expected, t)
        if outcome == OK:
            t.state, t.owner, t.lease = "pending", None, None
            self.model.became_ready(t)
            Model.transition(t, OPERATOR, "claimed")
            self.check("force_release", got, t)

    # -- queue control (DESIGN "Queue control") ----------------------------------------

    @rule(
        queue=st.sampled_from(QUEUES),
        pause=st.booleans(),
        actor=st.sampled_from(OPERATORS),
        reason=st.sampled_from([None, "deploy", " "]),
    )
    def pause_or_resume(self, queue, pause, actor, reason):
        """Pause a queue, or resume it (both: also one that is not paused, or already is)."""
        note(f"{'pause' if pause else 'resume'}({queue}, {actor.name}, {reason!r})")
        why = reason_recorded(reason)
        if pause:
            outcome, got = self.call(self.control.pause(queue, actor, reason))
            self.expect("pause", outcome, got, OK)
            if queue not in self.model.paused:
                self.model.paused[queue] = (actor, why)
                self.model.queue_log.append((queue, "paused", actor, why))
            # Pausing a paused queue keeps the first pause: who, and why.
            first, first_why = self.model.paused[queue]
            assert (got.queue, Actor(got.actor_kind, got.actor), got.reason) == (queue, first, first_why), got
        else:
            outcome, got = self.call(self.control.resume(queue, actor, reason))
            self.expect("resume", outcome, got, OK)
            paused = queue in self.model.paused
            assert got is paused, f"resume({queue}) says {got}, the queue was paused: {paused}"
            if paused:
                del self.model.paused[queue]
                self.model.queue_log.append((queue, "resumed", actor, why))

    @precondition(lambda self: bool(self.ids()))
    @rule(
        data=st.data(),
        actor=st.sampled_from(OPERATORS),
        reason=st.sampled_from([None, "obsolete", "  "]),
        then=st.sampled_from([None, "heartbeat", "release", "complete", "fail", "complete_and_claim_next"]),
    )
    def cancel(self, data, actor, reason, then):
        """Cancel a todo; `then`, when it was claimed, its holder's next call at once."""
        todo_id = self.draw_id(data, self.ids(*LIVE))
        note(f"cancel({todo_id}, {actor.name}, {reason!r})")
        t = self.model.get(todo_id)
        expected = NOT_FOUND if t is None else OK if t.state in LIVE else CONFLICT
        outcome, got = self.call(self.control.cancel(todo_id, actor, reason))
        self.expect("cancel", outcome, got, expected, t)
        if outcome == OK:
            # Dead-lettered with the cancellation; a holder keeps its name and lease token,
            # so it can be told at its next call (Model.holds).
            was = t.state
            t.state, t.lease, t.retry, t.scheduled = "failed", None, None, False
            t.cancelled = (True, actor.kind, actor.name, reason_recorded(reason))
            Model.transition(t, actor, was)
            self.check("cancel", got, t)
            assert got.completed_at is not None, got
        if outcome == OK and was == "claimed" and then is not None:
            # DESIGN: the holder's next heartbeat or ack is told it was cancelled.
            s, owner, lease = self.store, t.owner, t.lease_token
            note(f"{then}({todo_id}, {owner}, lease={lease}) by the holder")
            call = {
                "heartbeat": lambda: s.heartbeat(todo_id, owner, lease, TTL),
                "release": lambda: s.release(todo_id, owner, lease),
                "complete": lambda: s.complete(todo_id, owner, lease, {"ok": True}),
                "fail": lambda: s.fail(todo_id, owner, lease, "boom"),
                "complete_and_claim_next": lambda: s.complete_and_claim_next(
                    todo_id, owner, lease, None, list(QUEUES), TTL
                ),
            }[then]
            outcome, got = self.call(call())
            self.expect(then, outcome, got, CANCELLED, t)
            if then == "complete_and_claim_next":
                self.model.start(QUEUES, owner)  # its claim part ran, and claimed nothing

    @precondition(lambda self: bool(self.ids()))
    @rule(data=st.data(), actor=st.sampled_from(OPERATORS))
    def run_now(self, data, actor):
        waiting = [t.id for t in self.model.todos.values() if t.waiting]
        todo_id = self.draw_id(data, waiting, tricky=self.ids("pending", "claimed"))
        note(f"run_now({todo_id}, {actor.name})")
        t = self.model.get(todo_id)
        expected = NOT_FOUND if t is None else OK if t.waiting else CONFLICT
        outcome, got = self.call(self.control.run_now(todo_id, actor))
        self.expect("run_now", outcome, got, expected, t)
        if outcome == OK:
            # Due now: at the back of its priority level.
            t.retry, t.scheduled = None, False
            self.model.became_ready(t)
            Model.transition(t, actor, "pending")
            self.check("run_now", got, t)
            assert got.next_retry_at is None, got

    @precondition(lambda self: bool(self.ids()))
    @rule(
        data=st.data(),
        fields=st.fixed_dictionaries({}, optional=EDITS),
        actor=st.sampled_from(OPERATORS),
        with_retry=st.sampled_from([False, False, False, True]),
    )
    def edit(self, data, fields, actor, with_retry):
        """An edit of a pending or dead todo; with_retry, a dead todo retried (a fresh
        budget) and edited in one transaction: both or neither."""
        todo_id = self.draw_id(data, self.ids(*EDITABLE), tricky=self.ids("claimed"))
        given = dict(fields)
        if "run_at" in given:
            given["run_at"] = edit_run_at(given["run_at"])
        note(f"edit({todo_id}, {given}, retry={with_retry})")
        t = self.model.get(todo_id)
        holder = None
        # An empty edit is refused before the todo is looked up (after the retry, with
        # one); then NotFound, then a todo in the wrong state, then bad values.
        if with_retry:
            expected, holder = self.retry_refused(t)
        elif not given:
            expected = INVALID
        elif t is None:
            expected = NOT_FOUND
        elif t.state not in EDITABLE:
            expected = CONFLICT
        else:
            expected = None
        if expected is None:
            state, attempt = ("pending", 0) if with_retry else (t.state, t.attempt)
            refused = (
                not given
                or not given.get("title", "t").strip()
                or not 1 <= given.get("max_attempts", 1) <= 100
                or not -10 <= given.get("priority", 0) <= 10
                or fields.get("run_at") == "no zone"
                or ("run_at" in given and state != "pending")  # a dead todo is not scheduled
                # A pending todo's budget cannot go below the attempts it has used.
                or (state == "pending" and given.get("max_attempts", attempt) < attempt)
            )
            expected = INVALID if refused else OK
        outcome, got = self.call(self.control.edit(todo_id, actor, TodoEdit(**given), retry=with_retry))
        self.expect("edit", outcome, got, expected, t)
        if holder is not None:
            assert holder.id in str(got), f"the Conflict must name the live todo: {got}"
        if outcome != OK:
            return  # with a retry, neither happened: the invariant checks it
        if with_retry:
            self.model.retried(t, actor, one_more=False)
        new = {f: given[f] for f in ("title", "payload", "max_attempts", "priority") if f in given}
        for f in ("kind", "assignee"):
            if f in given:
                new[f] = given[f] if given[f] and given[f].strip() else None  # blank is none
        changes = {f: [getattr(t, f), v] for f, v in new.items() if getattr(t, f) != v}
        if "payload" in changes:
            changes["payload"] = payload_changes(t.payload, new["payload"])
        if "run_at" in given:
            changes["run_at"] = [None, datetime.fromisoformat(given["run_at"]).isoformat()]
        if changes:  # an edit that changes nothing writes nothing
            for f, v in new.items():
                setattr(t, f, v)
            if "run_at" in given:
                t.retry = None
                t.scheduled = fields["run_at"] == "1h"
                if not t.scheduled:  # a time past is now
                    self.model.became_ready(t)
            Model.transition(t, actor, t.state)
            recorded = self.last_changes(todo_id)
            if "run_at" in changes and "run_at" in recorded:  # the old value (ready_at) is not modelled
                recorded["run_at"][0] = None
            assert recorded == changes, f"edit: history records {recorded}, model {changes}"
        self.check("edit", got, t)

    @precondition(lambda self: bool(self.ids()))
    @rule(
        data=st.data(),
        what=st.sampled_from(["priority", "priority", "assignee", "both"]),
        priority=st.sampled_from([0, 1, -1, 10]),
        assignee=st.sampled_from([None, *OWNERS]),
        actor=st.sampled_from(OPERATORS),
    )
    def set_many(self, data, what, priority, assignee, actor):
        ids = data.draw(
            st.lists(st.sampled_from([*self.ids(), MISSING]), min_size=1, max_size=3), label="ids"
        )
        sets = {}
        if what in ("priority", "both"):
            sets["priority"] = priority
        if what in ("assignee", "both"):
            sets["assignee"] = assignee
        note(f"set_many({ids}, {actor.name}, {sets})")
        changed, skipped = [], Counter()
        for todo_id in dict.fromkeys(ids):
            t = self.model.get(todo_id)
            if t is None:
                skipped["gone"] += 1
            elif t.state in EDITABLE and any(getattr(t, f) != v for f, v in sets.items()):
                changed.append(t)
            else:
                skipped[t.state] += 1  # claimed, finished, or already so
        outcome, got = self.call(self.control.set_many(ids, actor, **sets))
        self.expect("set_many", outcome, got, OK)
        assert sorted(g.id for g in got.changed) == sorted(t.id for t in changed), (
            f"set_many: store changed {sorted(g.id for g in got.changed)}, "
            f"model expects {sorted(t.id for t in changed)}"
        )
        assert got.skipped == dict(skipped), f"set_many: store skipped {got.skipped}, model {dict(skipped)}"
        by_id = {g.id: g for g in got.changed}
        for t in changed:
            changes = {f: [getattr(t, f), v] for f, v in sets.items() if getattr(t, f) != v}
            for f, v in sets.items():
                setattr(t, f, v)
            Model.transition(t, actor, t.state)
            self.check("set_many", by_id[t.id], t)
            recorded = self.last_changes(t.id)
            assert recorded == changes, f"set_many: history records {recorded}, model {changes}"

    # -- bounds: refused before anything is looked up or changed -----------------------

    @rule(
        data=st.data(),
        which=st.sampled_from(
            [
                "create max_attempts",
                "create queue",
                "create priority",
                "create run_at",
                "create delay",
                "create run_at and delay",
                "claim_next queues",
                "claim_next ttl",
                "claim_batch n",
                "claim ttl",
                "heartbeat ttl",
                "fail error",
                "complete_and_claim_next queues",
                "complete_and_claim_next ttl",
                "edit nothing",
                "set_many priority",
                "set_many nothing",
                "set_many no ids",
                "pause queue",
                "pause reason",
                "resume queue",
                "cancel reason",
            ]
        ),
    )
    def invalid_input(self, data, which):
        todo_id = self.draw_id(data, self.ids("claimed", "pending"))
        owner, lease = self.draw_owner_and_lease(data, todo_id)
        bad_ttl = data.draw(st.sampled_from([0, 0.5, 12 * 3600 + 1]), label="ttl")
        bad_queues = data.draw(st.sampled_from([[], ["Bad!"], ["a", ""]]), label="queues")
        note(f"invalid {which}: {todo_id}, {owner}, lease={lease}, ttl={bad_ttl}, {bad_queues}")
        s, c = self.store, self.control
        too_long = "x" * (MAX_REASON + 1)
        past_a_year = (datetime.now(UTC) + timedelta(days=400)).isoformat()

        def create(**fields):
            return s.create(NewTodo(queue=fields.pop("queue", "a"), title="t", **fields))

        call = {
            "create max_attempts": lambda: create(max_attempts=data.draw(st.sampled_from([0, 101]))),
            "create queue": lambda: create(queue="Bad!"),
            "create priority": lambda: create(priority=data.draw(st.sampled_from([-11, 11]))),
            "create run_at": lambda: create(
                run_at=data.draw(st.sampled_from(["soon", "2030-01-01T00:00:00", past_a_year]))
            ),
            "create delay": lambda: create(delay=data.draw(st.sampled_from([-1, 400 * 24 * 3600]))),
            "create run_at and delay": lambda: create(run_at=edit_run_at("1h"), delay=0),
            "claim_next queues": lambda: s.claim_next(bad_queues, owner, TTL),
            "claim_next ttl": lambda: s.claim_next(["a", "b"], owner, bad_ttl),
            "claim_batch n": lambda: s.claim_batch(["a"], owner, TTL, data.draw(st.sampled_from([-1, 1001]))),
            "claim ttl": lambda: s.claim(todo_id, owner, bad_ttl),
            "heartbeat ttl": lambda: s.heartbeat(todo_id, owner, lease, bad_ttl),
            "fail error": lambda: s.fail(todo_id, owner, lease, ""),
            "complete_and_claim_next queues": lambda: s.complete_and_claim_next(
                todo_id, owner, lease, None, bad_queues, TTL
            ),
            "complete_and_claim_next ttl": lambda: s.complete_and_claim_next(
                todo_id, owner, lease, None, ["a"], bad_ttl
            ),
            "edit nothing": lambda: c.edit(todo_id, OPERATOR, TodoEdit()),
            "set_many priority": lambda: c.set_many(
                [todo_id], OPERATOR, priority=data.draw(st.sampled_from([-11, 11]))
            ),
            "set_many nothing": lambda: c.set_many([todo_id], OPERATOR),
            "set_many no ids": lambda: c.set_many([], OPERATOR, priority=1),
            "pause queue": lambda: c.pause("Bad!", OPERATOR),
            "pause reason": lambda: c.pause("a", OPERATOR, too_long),
            "resume queue": lambda: c.resume("", OPERATOR),
            "cancel reason": lambda: c.cancel(todo_id, OPERATOR, too_long),
        }[which]
        outcome, got = self.call(call())
        self.expect(which, outcome, got, INVALID)

    # -- the whole table, after every step ---------------------------------------------

    @invariant()
    def table_matches_model(self):
        rows = self.run(
            self.conn.fetch("""
            SELECT t.id, t.state::text, t.owner, t.attempt, t.max_attempts, t.lease_token,
                   t.dedupe_hits, t.queue, t.idempotency_key, t.assignee, t.priority,
                   t.title, t.kind, t.payload, t.ready_at, t.cancelled_at,
                   t.cancelled_by_kind, t.cancelled_by, t.cancel_reason,
                   CASE WHEN t.lease_expires_at IS NULL THEN NULL
                        WHEN t.lease_expires_at > now() THEN 'live' ELSE 'lapsed' END AS lease,
                   CASE WHEN t.next_retry_at IS NULL THEN NULL
                        WHEN t.next_retry_at > now() THEN 'future' ELSE 'due' END AS retry,
                   CASE WHEN t.state = 'pending' THEN t.ready_at > now() END AS waiting,
                   h.count AS history, h.from_state::text AS last_from,
                   h.to_state::text AS last_to, h.attempt AS last_attempt,
                   h.actor_kind AS last_actor_kind, h.actor AS last_actor
            FROM todos t
            LEFT JOIN LATERAL (
                SELECT count(*) OVER () AS count, from_state, to_state, attempt, actor_kind, actor
                FROM todo_history WHERE todo_id = t.id ORDER BY id DESC LIMIT 1
            ) h ON true
        """)
        )
        table = {r["id"]: r for r in rows}
        assert set(table) == set(self.model.todos), (
            f"todos in the table {sorted(table)} != in the model {sorted(self.model.todos)}"
        )
        for todo_id, t in self.model.todos.items():
            r = table[todo_id]
            adopt_token(t, r["lease_token"])
            got = dict(r) | {
                "cancelled": cancellation(
                    r["cancelled_at"], r["cancelled_by_kind"], r["cancelled_by"], r["cancel_reason"]
                )
            }
            got = {k: got[k] for k in t.row()}
            assert got == t.row(), f"{todo_id}: table has {got}, model has {t.row()}"
            # Every transition appends exactly one history row; the newest one describes
            # the todo as it is now.
            assert r["history"] == t.history, (
                f"{todo_id}: {r['history']} history rows, model expects {t.history}"
            )
            last = (
                r["last_from"],
                r["last_to"],
                r["last_attempt"],
                Actor(r["last_actor_kind"], r["last_actor"]),
            )
            want = (t.last[0], t.state, t.attempt, t.last[1])
            assert last == want, f"{todo_id}: newest history row {last}, model {want}"
        # The claimable (pending, not waiting) todos are in the model's ready order.
        ready = sorted(
            (r for r in rows if r["state"] == "pending" and not r["waiting"]), key=lambda r: r["ready_at"]
        )
        want_ready = sorted(
            (t for t in self.model.todos.values() if t.state == "pending" and not t.waiting),
            key=lambda t: t.ready,
        )
        assert [r["id"] for r in ready] == [t.id for t in want_ready], (
            "ready_at order differs from the model's"
        )
        # DESIGN.md: one live todo per (queue, idempotency_key).
        live = [
            (r["queue"], r["idempotency_key"]) for r in rows if r["idempotency_key"] and r["state"] in LIVE
        ]
        assert len(live) == len(set(live)), f"two live todos share a key: {sorted(live)}"
        # The paused queues (who paused them, why), and every pause and resume recorded.
        queues = self.run(
            self.conn.fetch("""
            SELECT queue, 'paused' AS action, actor_kind, actor, reason, 0 AS part, 0::bigint AS id
            FROM queue_pauses
            UNION ALL
            SELECT queue, action, actor_kind, actor, reason, 1, id FROM queue_history
            ORDER BY part, id, queue
        """)
        )
        paused = {
            r["queue"]: (Actor(r["actor_kind"], r["actor"]), r["reason"]) for r in queues if r["part"] == 0
        }
        assert paused == self.model.paused, f"paused queues {paused}, model {self.model.paused}"
        log = [
            (r["queue"], r["action"], Actor(r["actor_kind"], r["actor"]), r["reason"])
            for r in queues
            if r["part"] == 1
        ]
        assert log == self.model.queue_log, f"queue history {log}, model {self.model.queue_log}"


def test_queue_matches_model(server_dsn, template_db):
    QueueMachine.server_dsn = server_dsn
    QueueMachine.template_db = template_db
    QueueMachine.databases = made = []
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=80,  # steps are cheap next to cloning a database per example
            deadline=None,
            database=None,  # no .hypothesis folder in the tree
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
    # Every example's database was dropped again (teardown closes its connection first).
    assert made
    assert not asyncio.run(_existing(server_dsn, made))


async def _existing(server_dsn: str, names: list[str]) -> list[str]:
    conn = await asyncpg.connect(server_dsn)
    try:
        rows = await conn.fetch("SELECT datname FROM pg_database WHERE datname = ANY ($1::text[])", names)
        return [r["datname"] for r in rows]
    finally:
        await conn.close()


# -- two cases the model found ----------------------------------------------------------


async def test_an_edit_conflict_says_the_assignee(store, control):
    """DESIGN: a refused transition's Conflict says the todo's state, owner and assignee."""
    todo = await factories.claimed(store, "q", assignee="w1", owner="w1")
    with pytest.raises(Conflict) as refused:
        await control.edit(todo.id, OPERATOR, TodoEdit(title="new"))
    assert refused.value.current == {"state": "claimed", "owner": "w1", "assignee": "w1"}


async def test_an_edit_that_keeps_max_attempts_is_not_refused_for_it(store, control):
    """DESIGN: a pending todo's title (priority, …) can be edited. One released at its cap
    and claimed again has used more attempts than max_attempts; an edit that does not
    lower max_attempts has nothing to refuse."""
    todo = await factories.claimed(store, "q", max_attempts=1)
    await store.release(todo.id, "w1", todo.lease_token)
    todo = await store.claim(todo.id, "w1", TTL)
    todo = await store.release(todo.id, "w1", todo.lease_token)
    assert (todo.state, todo.attempt, todo.max_attempts) == ("pending", 2, 1)
    edited = await control.edit(todo.id, OPERATOR, TodoEdit(title="new"))
    assert edited.title == "new"
