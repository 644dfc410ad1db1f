"""One copy of every helper the tests use to build queue state and to read it back.

Builders go through the public Store and Accounts, as producers, agents and operators do;
readers look at the tables directly. Time is moved by SQL (a lease or a retry set into
the past), never waited for. `db` is anything with asyncpg's fetch/execute: a pool or a
connection.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from dashboard.accounts import Accounts
from dashboard.models import NewTodo, Todo
from dashboard.store import Store

# Every table a test may write to, and so every table a snapshot compares and empty_tables
# empties. Operators and app secrets stay: a module-scoped app keeps using its secrets.
TABLES = (
    "todos",
    "todo_history",
    "events",
    "api_tokens",
    "queue_pauses",
    "queue_history",
    "queue_rollups",
    "agent_rollups",
    "stale_acks",
)

# -- names ------------------------------------------------------------------------------


MAX_LEASE_TOKEN = 2**53 - 1  # tokens stay exact integers in JSON (migration 0013)


def assert_new_token(token: int, *earlier: int) -> None:
    """A claim's lease token: in [1, 2^53 - 1] and none of the todo's `earlier` tokens."""
    assert 1 <= token <= MAX_LEASE_TOKEN and token not in earlier, (token, earlier)


def unique(prefix: str) -> str:
    """A queue (or agent) name no other test uses, for tests sharing one live server."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- building todos ---------------------------------------------------------------------


def new_todo(queue: str = "q", title: str = "t", **fields) -> NewTodo:
    """What a producer sends: a todo to create (not created yet)."""
    return NewTodo(queue=queue, title=title, **fields)


async def enqueue(store: Store, queue: str = "q", title: str = "t", **fields) -> Todo:
    """A created todo (or, with a live key, the live todo that holds it)."""
    return (await store.create(new_todo(queue, title, **fields))).todo


async def claimed(
    store: Store, queue: str = "q", title: str = "t", *, owner: str = "w1", ttl: float = 300, **fields
) -> Todo:
    """A new todo, claimed by id by `owner`."""
    todo = await enqueue(store, queue, title, **fields)
    return await store.claim(todo.id, owner, ttl)


async def dead_letter(
    store: Store,
    db,
    queue: str = "q",
    title: str = "t",
    *,
    owner: str = "w1",
    error: str = "boom",
    **fields,
) -> Todo:
    """A todo failed at its cap (max_attempts=1 unless given): claimed and failed each attempt,
    every retry made due by SQL in between."""
    fields.setdefault("max_attempts", 1)
    todo = await claimed(store, queue, title, owner=owner, **fields)
    for _ in range(todo.max_attempts - 1):
        todo = await store.fail(todo.id, owner, todo.lease_token, error)
        await make_retry_due(db, todo.id)
        todo = await store.claim(todo.id, owner, 30)
    todo = await store.fail(todo.id, owner, todo.lease_token, error)
    assert todo.state == "failed"
    return todo


async def retrying(store: Store, db, queue: str = "q", title: str = "t") -> Todo:
    """A pending todo whose next retry is an hour away (failed once, its retry time set by SQL)."""
    todo = await claimed(store, queue, title, max_attempts=3)
    await store.fail(todo.id, todo.owner, todo.lease_token, "try later")
    await db.execute(
        "UPDATE todos SET next_retry_at = now() + interval '1 hour', ready_at = now() + interval '1 hour'"
        " WHERE id = $1",
        todo.id,
    )
    return await todo_row(db, todo.id)


# -- moving time by SQL -----------------------------------------------------------------


async def expire_lease(db, todo_id: str) -> None:
    """The todo's lease lapsed a second ago (the reaper has not seen it yet)."""
    await db.execute("UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id = $1", todo_id)


async def fenced_out(store: Store, db, queue: str, owner: str, next_owner: str) -> Todo:
    """`owner`'s claim of a new todo in `queue`, after which its lease lapsed, the reaper took
    it and `next_owner` claimed it again: an ack under the returned claim's lease is refused."""
    todo = await enqueue(store, queue)
    first = await store.claim(todo.id, owner, 300)
    await expire_lease(db, todo.id)
    await store.reap()
    await db.execute("UPDATE todos SET ready_at = now(), next_retry_at = NULL WHERE id = $1", todo.id)
    await store.claim(todo.id, next_owner, 300)
    return first


async def make_retry_due(db, todo_id: str) -> None:
    """The todo's retry time is now (not earlier: a todo becomes ready at its ready_at,
    which claims expect to be no older than their last claim, DESIGN "Claim order")."""
    await db.execute("UPDATE todos SET next_retry_at = now(), ready_at = now() WHERE id = $1", todo_id)


async def set_age(db, todo_id: str, seconds: float) -> None:
    """The todo was created, and became ready, `seconds` ago (claims take the longest ready
    first). Behind where a Store's claims stand, it waits for their next full scan: set it
    before claiming with a fresh Store (module_store is one per test)."""
    await db.execute(
        "UPDATE todos SET created_at = now() - make_interval(secs => $2),"
        " ready_at = now() - make_interval(secs => $2) WHERE id = $1",
        todo_id,
        float(seconds),
    )


async def db_now(db) -> datetime:
    """The database's clock, now (not the transaction's start)."""
    return await db.fetchval("SELECT clock_timestamp()")


# -- reading state back -----------------------------------------------------------------


class Step(NamedTuple):
    """One row of a todo's history; equal to the plain tuple
    (from, to, actor kind, actor, attempt, note)."""

    from_state: str | None
    to_state: str
    actor_kind: str
    actor: str
    attempt: int
    note: str | None


async def history(db, todo_id: str) -> list[Step]:
    """The todo's history, oldest first."""
    rows = await db.fetch(
        "SELECT from_state::text, to_state::text, actor_kind, actor, attempt, note FROM todo_history "
        "WHERE todo_id = $1 ORDER BY id",
        todo_id,
    )
    return [Step(*r) for r in rows]


async def last_step(db, todo_id: str) -> Step:
    """The newest row of the todo's history."""
    return (await history(db, todo_id))[-1]


async def todo_row(db, todo_id: str) -> Todo:
    """The todo as stored, in the shape the Store hands out."""
    return Todo.from_record(await db.fetchrow("SELECT * FROM todos WHERE id = $1", todo_id))


async def snapshot(db) -> dict[str, list[dict[str, Any]]]:
    """Every row a refused call must leave untouched: all of TABLES, whole rows (but
    stale_acks, where an ack refused by fencing is recorded for the agents page)."""
    return {
        table: [dict(r) for r in await db.fetch(f"SELECT * FROM {table} ORDER BY 1")]
        for table in TABLES
        if table != "stale_acks"
    }


async def empty_tables(db) -> None:
    """Empty TABLES, for tests that share one database (each still starts from nothing)."""
    await db.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY")


# -- people and agents ------------------------------------------------------------------


async def login(client, db, name: str = "olga", role: str = "operator") -> str:
    """Create an operator and log the client in; returns the CSRF token for later posts."""
    password = await Accounts(db).add_operator(name, role)
    await client.get("/login")
    token = client.cookies.get("csrftoken")
    response = await client.post(
        "/login",
        data={"name": name, "password": password, "_csrf_token": token},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    return client.cookies.get("csrftoken")  # a new one, bound to the session the login started


async def agent_token(db, agent: str = "bot", queues=("work",)) -> dict:
    """Authorization headers for a new API token."""
    _, secret = await Accounts(db).add_token(agent, list(queues))
    return {"Authorization": f"Bearer {secret}"}
