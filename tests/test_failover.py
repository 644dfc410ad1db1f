"""A failover with an unreplicated tail: the primary stopped hard while its replica lagged,
the replica promoted, and the app carrying on against it without a restart.

Lease tokens are drawn at random, so a promoted replica does not hand out again a token
the lost primary handed out: the holder of a lease the new primary never saw is refused,
even when its todo went back to an agent of the same name. What the lost primary
acknowledged within the lag is gone (asynchronous replication: README "Replication and
failover"). The app is built on a DSN that lists both servers with
target_session_attrs=read-write, and finds the new primary by itself.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dashboard import db as dbmod
from dashboard.config import Settings
from dashboard.errors import Conflict, DatabaseUnavailable
from dashboard.migrate import apply_migrations, open_database
from dashboard.store import Store
from tests.conftest import build_app, connected, in_process
from tests.factories import assert_new_token, enqueue, expire_lease, make_retry_due, todo_row
from tests.processes import eventually
from tests.replication import Cluster

RECONNECT_WITHIN = 30.0


async def migrate(dsn: str) -> None:
    async with connected(dsn) as conn:
        await apply_migrations(conn)


async def reachable(call):
    """`call()` once the pool reaches a server that takes writes: dead and read-only
    connections fail (DatabaseUnavailable) and are dropped, then new ones find the new
    primary."""
    deadline = asyncio.get_running_loop().time() + RECONNECT_WITHIN
    while True:
        try:
            return await call()
        except DatabaseUnavailable:
            assert asyncio.get_running_loop().time() < deadline, "the pool never reached the new primary"
            await asyncio.sleep(0.1)


async def refused(pool, stale: dict, todo_id: str) -> None:
    """Each of the stale holder's calls is a Conflict that leaves the todo as it was."""
    before = await todo_row(pool, todo_id)
    for action, call in stale.items():
        with pytest.raises(Conflict, match="cannot"):
            await call()
        assert await todo_row(pool, todo_id) == before, action


@contextlib.asynccontextmanager
async def replicated(monkeypatch, primary_settings: dict[str, str] | None = None):
    """A primary and its streaming replica, and the app's database opened as `serve` opens
    it, on a DATABASE_URL that lists both; everything stopped on exit."""
    cluster = Cluster(primary_settings)
    try:
        await cluster.start(migrate)
        monkeypatch.setenv("DATABASE_URL", cluster.dsn())
        db = await open_database(Settings.from_environ(), max_size=4)
        try:
            yield cluster, db
        finally:
            await db.close()
    finally:
        cluster.close()


def test_a_database_url_may_list_several_hosts_each_port_checked():
    dbmod.check_url("postgresql://app@db1:5432,db2:5433/app?target_session_attrs=read-write")
    with pytest.raises(
        DatabaseUnavailable, match="malformed: Port could not be cast to integer value as 'x'"
    ):
        dbmod.check_url("postgresql://app@db1:5432,db2:x/app")


@pytest.mark.slow
async def test_after_a_failover_the_lost_primarys_leases_are_refused_and_the_app_reconnects(monkeypatch):
    async with replicated(monkeypatch) as (cluster, db):
        await _fail_over_under_the_app(cluster, db.pool)


async def _fail_over_under_the_app(cluster: Cluster, pool) -> None:
    store = Store(pool)
    app = await build_app(dbmod.resolve_dsn(Settings.from_environ())[0], pool, reaper=False)
    async with in_process(app) as client:
        assert (await client.get("/readyz")).status_code == 200
        same, other, late = [await enqueue(store, title=t) for t in ("same", "other", "late")]
        late = await store.claim(late.id, "agent-a", 300)  # replicated; its completion will not be
        await cluster.caught_up()

        cluster.replica.stop("fast")  # from here on nothing reaches the replica: the lost tail
        lost = await enqueue(store, title="created within the lag")
        held = {}
        for todo in (same, other):
            held[todo.id] = await store.claim(todo.id, "agent-a", 300)
            await store.heartbeat(todo.id, "agent-a", held[todo.id].lease_token, 300)
        assert (await store.complete(late.id, "agent-a", late.lease_token, {"by": "a"})).state == "done"

        await cluster.fail_over()

        # The same agent name claims `same` again; another agent claims `other`.
        again = await reachable(lambda: store.claim(same.id, "agent-a", 300))
        taken = await store.claim(other.id, "agent-b", 300)
        await eventually(lambda: client.get("/readyz"), lambda r: r.status_code == 200, RECONNECT_WITHIN)

        for todo, current in ((same, again), (other, taken)):
            old = held[todo.id].lease_token
            await refused(
                pool,
                {
                    "heartbeat": lambda t=todo, o=old: store.heartbeat(t.id, "agent-a", o, 300),
                    "complete": lambda t=todo, o=old: store.complete(t.id, "agent-a", o, {"by": "stale"}),
                    "fail": lambda t=todo, o=old: store.fail(t.id, "agent-a", o, "stale gave up"),
                },
                todo.id,
            )
            assert_new_token(current.lease_token, old)
        await store.heartbeat(same.id, "agent-a", again.lease_token, 300)
        assert (await store.complete(same.id, "agent-a", again.lease_token, {"by": "new"})).result == {
            "by": "new"
        }
        await store.heartbeat(other.id, "agent-b", taken.lease_token, 300)
        assert (
            await store.fail(other.id, "agent-b", taken.lease_token, "new gave up")
        ).last_error == "new gave up"

        # The claim of `late` replicated, its completion did not: the new primary has it
        # claimed under the old lease until that lapses; claimed again, the old lease is refused.
        assert (await todo_row(pool, late.id)).state == "claimed"
        await expire_lease(pool, late.id)
        await store.reap()
        await make_retry_due(pool, late.id)
        redone = await store.claim(late.id, "agent-b", 300)
        assert_new_token(redone.lease_token, late.lease_token)
        await refused(
            pool,
            {"complete": lambda: store.complete(late.id, "agent-a", late.lease_token, {"by": "a"})},
            late.id,
        )
        assert (await store.complete(late.id, "agent-b", redone.lease_token, {"by": "b"})).result == {
            "by": "b"
        }

        # An acknowledged create within the lag is gone (asynchronous replication).
        assert await pool.fetchval("SELECT count(*) FROM todos WHERE id = $1", lost.id) == 0


@pytest.mark.slow
@pytest.mark.parametrize("commit", ["on", "remote_apply"])
async def test_with_synchronous_replication_nothing_acknowledged_is_lost(monkeypatch, commit):
    """A commit is answered only once the standby has it: with the standby away, a
    completion and a create wait, unanswered, until the primary goes; after the promotion
    everything that was answered is there, and the holder's retried ack is accepted."""
    settings = {"synchronous_standby_names": "*", "synchronous_commit": commit}
    async with replicated(monkeypatch, settings) as (cluster, db):
        store = Store(db.pool)
        kept = await enqueue(store, title="acknowledged")
        held = await store.claim(kept.id, "agent-a", 300)
        cluster.replica.stop("fast")
        waiting = [
            asyncio.create_task(store.complete(kept.id, "agent-a", held.lease_token, {"by": "a"})),
            asyncio.create_task(enqueue(store, title="never answered")),
        ]
        await eventually(
            lambda: cluster.primary.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            ),
            lambda n: n == len(waiting),
            RECONNECT_WITHIN,
        )
        await cluster.fail_over()
        for task in waiting:
            with pytest.raises(DatabaseUnavailable):
                await task

        row = await reachable(lambda: todo_row(db.pool, kept.id))
        assert (row.state, row.owner, row.lease_token) == ("claimed", "agent-a", held.lease_token)
        done = await store.complete(kept.id, "agent-a", held.lease_token, {"by": "a"})
        assert done.result == {"by": "a"}
