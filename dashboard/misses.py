"""Why a guarded transition matched nothing, in words an agent or an operator can act on.

Every transition is one guarded statement: when its guard matches no row, the caller
learns the todo's state, owner and assignee from one read (`classify`): NotFound, a
Conflict, or Cancelled for the holder of a cancelled todo. A call with a lease that a
later claim superseded is a stale ack: `record_stale_ack` counts it for the agents page
(DESIGN.md "Fencing"); the writer that refused it calls both, one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboard import metrics
from dashboard.errors import Cancelled, Conflict, NotFound
from dashboard.models import Scope
from dashboard.queries import TRANSITIONS as SQL


@dataclass
class Miss:
    """A refused transition: the error for its caller, and the facts a stale ack records."""

    error: Exception
    queue: str | None = None
    stale: bool = False  # the caller's lease is not the todo's: a later claim superseded it


async def classify(
    db, todo_id: str, action: str, actor: str, lease: int | None = None, scope: Scope | None = None
) -> Miss:
    """Why `action` by `actor` (holding `lease`, if any) matched nothing. A todo outside
    `scope` raises NotFound right here: to its token, it does not exist."""
    row = await SQL.classify_miss.fetchrow(db, id=todo_id)
    if row is None:
        return Miss(NotFound(f"no todo {todo_id}"))
    if scope is not None:
        scope.check_todo(todo_id, row["queue"])
    state, owner, assignee = row["state"], row["owner"], row["assignee"]
    stale = lease is not None and lease != row["lease_token"]
    if row["cancelled_at"] is not None:
        by = f"{row['cancelled_by_kind']} {row['cancelled_by']}"
        why = f": {row['cancel_reason']}" if row["cancel_reason"] else ""
        facts = f"it was cancelled by {by} at {row['cancelled_at'].isoformat()}{why}"
        if lease is not None and owner == actor and lease == row["lease_token"]:
            # Its holder: stop the work, nobody wants it any more.
            return Miss(
                Cancelled(
                    f"cannot {action} todo {todo_id}: {facts}; stop working on it",
                    current={
                        "state": state,
                        "cancelled_by_kind": row["cancelled_by_kind"],
                        "cancelled_by": row["cancelled_by"],
                        "reason": row["cancel_reason"],
                    },
                ),
                row["queue"],
            )
    else:
        facts = f"it is {state}"
    if state == "claimed":
        facts += f" by {owner}"
    elif owner and row["cancelled_at"] is None:
        facts += f" (last owner {owner})"
    if state == "pending" and row["ready_at"] > row["now"]:
        if row["next_retry_at"]:
            facts += f", retrying at {row['next_retry_at'].isoformat()}"
        else:
            facts += f", scheduled for {row['ready_at'].isoformat()}"
    if assignee:
        facts += f", assigned to {assignee}"
        if row["assignee_until"]:
            facts += f" until {row['assignee_until'].isoformat()}"
    if row["paused_at"] is not None and state == "pending":
        facts += f"; queue {row['queue']} is paused"
        if row["paused_reason"]:
            facts += f" ({row['paused_reason']})"
    if stale and state == "claimed" and owner == actor:
        facts += f"; lease {lease} is stale (the current lease is {row['lease_token']})"
    current = {"state": state, "owner": owner, "assignee": assignee}
    return Miss(Conflict(f"cannot {action} todo {todo_id}: {facts}", current=current), row["queue"], stale)


async def record_stale_ack(db, todo_id: str, action: str, agent: str, lease: int, queue: str) -> None:
    """Count a call made with a superseded lease, against the agent that made it."""
    metrics.fenced(queue, action)
    await SQL.record_stale_ack.execute(db, agent=agent, id=todo_id, queue=queue, action=action, lease=lease)


def key_conflict(todo_id: str, row) -> Conflict:
    """Why dead todo `todo_id` cannot be retried: `row` (live_todo_with_key) names the live
    todo that holds its key."""
    holder = f"{row['live_id']} ({row['live_state']})" if row["live_id"] else "another todo"
    return Conflict(
        f"cannot retry todo {todo_id}: a live todo already holds key "
        f"{row['idempotency_key']!r} in queue {row['queue']}: {holder}",
        current={"live_todo": row["live_id"]},
    )


async def key_taken(db, todo_id: str) -> Conflict:
    return key_conflict(todo_id, await SQL.live_todo_with_key.fetchrow(db, id=todo_id))
