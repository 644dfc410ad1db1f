"""The agents page (Reads.agents, /agents and its partial) and the short-lease highlight it
shares with the leases page, on a real database: tokens, live leases, rolled-up history and
acks refused by fencing. Time is moved by SQL, so these use the app without its reaper."""

from __future__ import annotations

import re

import pytest

from dashboard.accounts import Accounts
from dashboard.errors import Conflict
from dashboard.reads import Reads
from dashboard.rollups import Rollups
from tests.factories import claimed, enqueue, expire_lease, fenced_out, login
from tests.test_rollups import age_history
from tests.web_helpers import HX, assert_fragment, get_page, ids_in, post, text


def row_of(body: str, agent: str) -> str:
    """The agents page's row of `agent`."""
    match = re.search(rf'<tr[^>]*data-agent="{re.escape(agent)}".*?</tr>', body, re.S)
    assert match, f"no row for {agent}"
    return match.group(0)


def cell(row: str, label: str) -> str:
    """A cell's text (tags stripped), by its data-label."""
    match = re.search(rf'<td[^>]*data-label="{re.escape(label)}"[^>]*>(.*?)</td>', row, re.S)
    assert match, f"no {label} cell in {row}"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).split())


async def one(reads: Reads, agent: str):
    (found,) = [a for a in await reads.agents() if a.agent == agent]
    return found


async def set_lease(db, todo_id: str, *, beat_ago: float, left: float) -> None:
    """The lease was last extended `beat_ago` seconds ago and has `left` seconds to go."""
    await db.execute(
        "UPDATE todos SET heartbeat_at = now() - make_interval(secs => $2),"
        " lease_expires_at = now() + make_interval(secs => $3) WHERE id = $1",
        todo_id,
        beat_ago,
        left,
    )


async def test_an_agent_with_a_token_and_no_work_is_listed_with_its_token(client_without_reaper, pool):
    await login(client_without_reaper, pool)
    token_id, _ = await Accounts(pool).add_token("mailer-1", ["emails", "reports"])

    agent = await one(Reads(pool), "mailer-1")

    assert (agent.leases, agent.done, agent.failed, agent.stale_acks) == (0, 0, 0, 0)
    assert (agent.token_id, agent.token_queues) == (token_id, ["emails", "reports"])
    assert agent.token_revoked_at is None and agent.active_tokens == 1
    assert agent.last_claim_at is None and agent.soonest_left is None
    row = row_of((await get_page(client_without_reaper, "/agents")).text, "mailer-1")
    assert f'href="/tokens#token-{token_id}"' in row
    assert 'href="/queues/emails?owner=mailer-1"' in row and 'href="/queues/reports?owner=mailer-1"' in row
    # and the tokens page has that anchor
    assert f'id="token-{token_id}"' in (await get_page(client_without_reaper, "/tokens")).text


async def test_an_agent_whose_tokens_are_all_revoked_and_idle_is_not_listed(pool):
    accounts = Accounts(pool)
    token_id, _ = await accounts.add_token("gone", ["emails"])
    await accounts.revoke_token(token_id, actor="olga")

    assert [a.agent for a in await Reads(pool).agents()] == []


async def test_leases_held_now_are_counted_and_short_ones_flagged(client_without_reaper, pool, store):
    await login(client_without_reaper, pool)
    fine = await claimed(store, "work", "fine", owner="ann", ttl=300)
    fifth = await claimed(store, "work", "a fifth left", owner="ann", ttl=300)
    await set_lease(pool, fifth.id, beat_ago=85, left=15)  # ttl 100 s, 15 s left: under a fifth
    nearly = await claimed(store, "work", "half left", owner="bob", ttl=300)
    await set_lease(pool, nearly.id, beat_ago=50, left=50)  # ttl 100 s, half left: fine
    brief = await claimed(store, "work", "brief", owner="cid", ttl=8)  # under 10 s from the start

    agents = {a.agent: a for a in await Reads(pool).agents()}
    ann, bob, cid = agents["ann"], agents["bob"], agents["cid"]

    assert (ann.leases, ann.short, ann.lapsed) == (2, 1, 0)
    assert 13 <= ann.soonest_left <= 15
    assert (bob.leases, bob.short) == (1, 0)
    assert (cid.leases, cid.short) == (1, 1)
    assert ann.last_claim_at is not None and ann.last_heartbeat_at is not None
    body = (await get_page(client_without_reaper, "/agents")).text
    assert 'class="short"' in row_of(body, "ann") and 'class="short"' not in row_of(body, "bob")
    assert cell(row_of(body, "ann"), "Leases now") == "2 1 short"
    assert 'href="/leases?owner=ann"' in row_of(body, "ann")
    # the same rule on the leases page: a class on the row, the time left in a title
    leases = (await get_page(client_without_reaper, "/leases")).text
    for todo, short in ((fine, False), (fifth, True), (nearly, False), (brief, True)):
        row = re.search(rf'<tr class="([^"]*)" data-todo="{todo.id}">(.*?)</tr>', leases, re.S)
        assert (row.group(1) == "short") is short, todo.title
        assert re.search(r'title="[^"]+ left of a (1m 40s|5m 0s|8s) lease', row.group(2)), row.group(2)


async def test_a_lapsed_lease_is_counted_apart_from_short_ones(client_without_reaper, pool, store):
    await login(client_without_reaper, pool)
    held = await claimed(store, "work", owner="ann", ttl=300)
    await expire_lease(pool, held.id)

    ann = await one(Reads(pool), "ann")

    assert (ann.leases, ann.short, ann.lapsed) == (1, 0, 1) and ann.soonest_left < 0
    row = row_of((await get_page(client_without_reaper, "/agents")).text, "ann")
    assert 'class="lapsed"' in row and "1 lapsed" in row


async def test_done_and_failed_count_once_the_history_is_rolled_up(conn, store):
    for _ in range(4):
        await enqueue(store, "work")
    held = [await store.claim_next(["work"], "ann", 300) for _ in range(4)]
    await store.complete(held[0].id, "ann", held[0].lease_token)
    await store.complete(held[1].id, "ann", held[1].lease_token)
    await store.fail(held[2].id, "ann", held[2].lease_token, "nope")
    await store.heartbeat(held[3].id, "ann", held[3].lease_token, 300)
    reads = Reads(conn)

    before = await one(reads, "ann")
    assert (before.done, before.failed, before.last_ack_at) == (0, 0, None)  # this minute is not rolled yet
    assert before.leases == 1  # live: the one still held

    await age_history(conn, 3)
    await Rollups(conn).roll()

    after = await one(reads, "ann")
    assert (after.done, after.failed, after.leases) == (2, 1, 1)
    rolled_ack = await conn.fetchval("SELECT max(last_ack_at) FROM agent_rollups WHERE agent = 'ann'")
    assert after.last_ack_at == rolled_ack
    # the last heartbeat is the live lease's (a heartbeat writes no history to roll up)
    live_beat = await conn.fetchval("SELECT heartbeat_at FROM todos WHERE id = $1", held[3].id)
    assert after.last_heartbeat_at == live_beat


async def test_only_the_last_hour_counts_and_only_the_last_day_lists(conn):
    await conn.execute(
        "INSERT INTO agent_rollups (agent, at, completed, failed) VALUES"
        " ('ann', date_trunc('minute', now() - interval '2 minutes'), 3, 1),"
        " ('ann', date_trunc('minute', now() - interval '3 hours'), 50, 50),"
        " ('old', date_trunc('minute', now() - interval '30 hours'), 7, 0)"
    )

    agents = await Reads(conn).agents()

    assert [(a.agent, a.done, a.failed) for a in agents] == [("ann", 3, 1)]


async def test_an_ack_refused_by_fencing_is_counted_for_its_agent(client_without_reaper, pool, store):
    await login(client_without_reaper, pool)
    first = await fenced_out(store, pool, "fenced", "ann", "bob")
    with pytest.raises(Conflict):
        await store.complete(first.id, "ann", first.lease_token)

    ann = await one(Reads(pool), "ann")

    assert (ann.stale_acks, ann.leases) == (1, 0)
    row = row_of((await get_page(client_without_reaper, "/agents")).text, "ann")
    assert cell(row, "Refused acks (1h)") == "1" and "count failed stale-acks" in row


async def test_a_viewer_sees_the_agents_page_without_links_to_tokens(client_without_reaper, pool, store):
    await login(client_without_reaper, pool, "vera", role="viewer")
    token_id, _ = await Accounts(pool).add_token("mailer-1", ["emails"])

    body = (await get_page(client_without_reaper, "/agents")).text

    row = row_of(body, "mailer-1")
    assert token_id in row and "/tokens" not in row  # the tokens page is for operators
    assert 'href="/agents"' in body  # in the menu


async def test_the_agents_page_says_how_to_get_an_agent_when_there_is_none(client_without_reaper, pool):
    await login(client_without_reaper, pool)

    body = text(await get_page(client_without_reaper, "/agents"))

    assert "No agents yet" in body and "switchboard token add AGENT --queues a,b" in body


async def test_the_agents_partial_is_the_table_fragment_alone_and_takes_no_parameters(
    client_without_reaper, pool, store
):
    await login(client_without_reaper, pool)
    await claimed(store, "work", owner="ann")

    fragment = assert_fragment(await client_without_reaper.get("/partials/agents", headers=HX), "agents")

    assert 'data-agent="ann"' in fragment and 'hx-get="/partials/agents"' in fragment
    assert (await client_without_reaper.get("/agents?owner=ann")).status_code == 400


async def test_the_leases_page_filters_by_owner_and_keeps_the_filter_after_a_release(
    client_without_reaper, pool, store
):
    token = await login(client_without_reaper, pool)
    ann = await claimed(store, "work", "ann's", owner="ann")
    mine = await claimed(store, "work", "ann's too", owner="ann")
    await claimed(store, "work", "bob's", owner="bob")  # not shown

    page = (await get_page(client_without_reaper, "/leases?owner=ann")).text
    partial = (await get_page(client_without_reaper, "/partials/leases?owner=ann", headers=HX)).text

    for body in (page, partial):
        assert ids_in(body) == {ann.id, mine.id}
        assert 'hx-get="/partials/leases?owner=ann"' in body
    released = await post(
        client_without_reaper,
        f"/todos/{ann.id}/release",
        token,
        {"back": "leases", "owner": "ann"},
        htmx=True,
    )
    body = assert_fragment(released, "leases")
    assert ids_in(body) == {mine.id}
    assert 'hx-get="/partials/leases?owner=ann"' in body
    nobody = text(await get_page(client_without_reaper, "/leases?owner=zed"))
    assert "<bdi>zed</bdi> holds no lease right now." in nobody


async def test_a_person_working_the_inbox_is_not_listed_as_an_agent(conn, store):
    await Accounts(conn).add_operator("alice", "operator", "a-long-password-1")
    todo = await enqueue(store, "approvals", assignee="alice")
    held = await store.claim(todo.id, "alice", 3600, actor_kind="operator")
    await store.complete(held.id, "alice", held.lease_token, {"approved": True}, actor_kind="operator")
    other = await store.claim(
        (await enqueue(store, "approvals", assignee="alice")).id, "alice", 3600, actor_kind="operator"
    )
    await age_history(conn, 3)
    await Rollups(conn).roll()

    assert other.owner == "alice"
    assert "alice" not in {a.agent for a in await Reads(conn).agents()}
    assert await conn.fetchval("SELECT count(*) FROM agent_rollups WHERE agent = 'alice'") == 0
