"""The reference model of the queue, plain Python: what DESIGN.md's state-machine table
says each operation does to a todo, the queues' pauses, and the claim order.

tests/model_machine.py and its rules drive the real store with the same operations and
compare every outcome, returned todo and the whole table with this model.

Claim order (DESIGN "Queue control", README "Claim order"): the highest priority first,
then the longest ready. The model numbers each moment a todo becomes claimable (created,
released, force-released, retried, its retry made due, run now, rescheduled into the past),
as ready_at orders them in the table. The store's claim cursors may let a todo behind
a claimer's place wait until that claimer next scans from the oldest; they run on a clock
the machine moves itself, so the model knows when that scan must have come (Model.start).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dashboard.models import PRODUCER, Actor

# The world the machine draws from: two queues, three agents, two keys, two operators.
QUEUES = ("a", "b")
OWNERS = ("alice", "bob", "carol")
KEYS = ("k1", "k2")
OPERATOR = Actor("operator", "oscar")
OPERATORS = (OPERATOR, Actor("operator", "olga"))
REAPER = Actor("system", "reaper")
TTL = 300  # seconds; leases lapse only when a rule says so
MISSING = "td_00000000-0000-0000-0000-000000000000"


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
