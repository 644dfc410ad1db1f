"""The model-based test's rules for operators (DESIGN "Queue control"): retry,
force-release, pause and resume, cancel (and the holder's next call after it), run now,
edit (alone or with a retry) and bulk set; and input every call refuses before it looks
anything up or changes anything.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dashboard.models import MAX_REASON, Actor, NewTodo, TodoEdit
from tests.model import (
    CANCELLED,
    CONFLICT,
    EDITABLE,
    INVALID,
    LIVE,
    MISSING,
    NOT_FOUND,
    OK,
    OPERATOR,
    OPERATORS,
    OWNERS,
    QUEUES,
    TTL,
    M,
    Model,
    payload_changes,
    reason_recorded,
)
from tests.model_machine import Harness

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


class OperatorRules(Harness):
    """Operators' rules, and the bounds every call checks first."""

    def last_changes(self, todo_id: str):
        """The `changes` of the todo's newest history row."""
        return self.run(
            self.conn.fetchval(
                "SELECT changes FROM todo_history WHERE todo_id = $1 ORDER BY id DESC LIMIT 1", todo_id
            )
        )

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
