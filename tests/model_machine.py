"""The harness of the model-based test: the real store on a fresh database per example,
each call's outcome, and the checks that what the store answers, and the whole table after
every step, match the model (tests/model.py).

The rules live beside it, by who calls them: tests/model_agents.py (producers, agents and
the passing of time) and tests/model_operators.py (operators and queue control).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant

from dashboard import db as dbmod
from dashboard.claim_cursor import ClaimCursors
from dashboard.control import Control
from dashboard.errors import Cancelled, Conflict, InvalidInput, NotFound
from dashboard.models import Actor, Todo
from dashboard.store import Store
from tests.conftest import drop_database, make_database
from tests.model import (
    CANCELLED,
    CONFLICT,
    INVALID,
    LIVE,
    MISSING,
    NOT_FOUND,
    OK,
    OWNERS,
    TTL,
    M,
    Model,
    adopt_token,
    cancellation,
)


class Harness(RuleBasedStateMachine):
    """One example: a database cloned from the template, a store and an operators' writer
    on it, and the model. The rules come from its subclasses."""

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
