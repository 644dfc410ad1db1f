"""The model-based test's rules for producers, agents and the passing of time: create,
claim (next, a batch, by id), heartbeat, release, complete, fail, and complete-and-claim;
leases made to lapse, the reaper, retries made due and promoted, claim cursors rescanning.

Time is moved by SQL, never waited for: leases are long (TTL) and lapse only when a rule
sets lease_expires_at into the past; a retry time is checked to be backoff(attempt) ahead
and then pushed an hour further, so it comes due only when a rule makes it due. A
schedule is either no schedule at all (delay 0, a run_at already past) or an hour ahead,
so a scheduled todo comes due only by run now (or an edit of its run_at), never by the
wall clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from dashboard.claim_cursor import MAX_FULL_SCAN_EVERY
from dashboard.models import PRODUCER, Actor, NewTodo, Todo
from tests import factories
from tests.model import CONFLICT, KEYS, NOT_FOUND, OK, OWNERS, QUEUES, REAPER, TTL, M, Model, backoff
from tests.model_machine import Harness

PRIORITIES = (0, 0, 0, 1, -1, 10, -10)
# A todo's schedule on create: none; due at once (delay 0, a run_at already past); or an
# hour ahead (a delay, a run_at in UTC or in another zone). Never close to now.
SCHEDULES = (None, None, None, "delay 0", "run_at past", "delay 1h", "run_at 1h", "run_at 1h +02:00")
AHEAD = ("delay 1h", "run_at 1h", "run_at 1h +02:00")


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


class AgentRules(Harness):
    """Producers', agents' and time's rules, and the checks only they need."""

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
        outcome, got, t, _ = self.holder_action(
            data, "heartbeat", lambda i, o, lease: self.store.heartbeat(i, o, lease, TTL)
        )
        if outcome == OK:
            t.lease = "live"  # also on a lapsed lease the reaper has not taken yet
            self.check("heartbeat", got, t)  # no history row: the row holds it (DESIGN "History")

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
