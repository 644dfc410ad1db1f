"""An agent's use-cases that are more than one store call, for every face agents use: the
Agent API (dashboard/web/api.py) and the MCP tools (dashboard/web/mcp.py) call these, so
that each rule lives here once. The plain verbs (create, claim by id, heartbeat, ack) are
one Store call each, made by the faces directly.

Claiming with a wait (long-poll): subscribed to the queues' hints before the first try,
so no wake-up is lost; without a hint (the LISTEN connection was lost) the claim re-checks
every POLL_FALLBACK seconds or so.

Waiting for a result: a waiter subscribes to its todo's hints (Hub.watch), marks the todo
watched (Store.watch) and reads it: from then on, either the statement that finishes the
todo sees the mark and the store hints the todo by id after its commit, or the read sees it
finished. The hint goes through PostgreSQL, so the completer may be any process. Without
one (the LISTEN connection was lost, or the todo was finished by plain SQL) the waiter
finds out by reading again every WAIT_POLL seconds or so.

A wait ends early when the process stops, when the token is revoked meanwhile (Revoked:
401), or when the client goes (`Presence`): nobody would read the answer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import msgspec

from dashboard.accounts import Accounts, Agent
from dashboard.backoff import spread_wait
from dashboard.errors import Revoked
from dashboard.models import FINISHED, Todo, check_id, check_wait
from dashboard.notify import Hub, Subscription
from dashboard.reads import Page, Reads, TodoDetail, TodoFilter
from dashboard.store import Store

POLL_FALLBACK = 5.0  # a waiting claim re-checks this often even when no hint arrives
# ± this share of a poll interval at random: claims (and waits) that began together (a
# fleet of agents started at once) do not all re-check in the same instant.
POLL_JITTER = 0.2
# Seconds between reads of a waited-for todo when no hint comes (± POLL_JITTER of it): a
# missed hint costs about this much. Shorter than the claim's POLL_FALLBACK, since a person
# may be watching the agent that waits, and cheaper: one todo read by key, not a claim. Its
# history is read once, for the answer: its owner can make it long.
WAIT_POLL = 1.5

StillAllowed = Callable[[Subscription], Awaitable[bool]]


def finished(todo: Todo) -> bool:
    """Done, or failed: dead-lettered or cancelled. A failed attempt that will be retried is
    pending again, and a wait for it goes on."""
    return todo.state in FINISHED


def token_check(accounts: Accounts) -> StillAllowed:
    """Whether a subscription's token is still good: the hub's revocation hint is taken at
    its word; otherwise (a resync, when hints may have been lost) the database is asked."""

    async def still_allowed(sub: Subscription) -> bool:
        return not sub.revoked and await accounts.token_active(sub.token)

    return still_allowed


class Presence:
    """Whether the client of a waiting call is still there, as its face finds out
    (dashboard/web/presence.py, web/mcp_requests.py): its going ends the waits of the
    subscriptions handed to `wakes`."""

    def __init__(self) -> None:
        self.gone = False
        self._waits: list[Subscription] = []

    def wakes(self, sub: Subscription) -> None:
        """End `sub`'s waits when the client goes."""
        self._waits.append(sub)

    def left(self) -> None:
        self.gone = True
        for sub in self._waits:
            sub.wake()


class Searches(Protocol):
    """The bound on searches at once per caller (dashboard/web/searches.py)."""

    def slot(self, caller: str, filters: TodoFilter) -> AbstractContextManager[None]: ...


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(1 - POLL_JITTER, 1 + POLL_JITTER)


@dataclass(frozen=True, slots=True)
class Agents:
    """The use-cases, over one process's store, reads, accounts and hub, each for `agent`:
    the owner of its claims, and its token's scope, which the store checks on every call."""

    store: Store
    reads: Reads
    accounts: Accounts
    hub: Hub
    searches: Searches

    async def claim_waiting(
        self,
        agent: Agent,
        queues: Sequence[str],
        ttl: float,
        wait: float,
        n: int = 1,
        *,
        presence: Presence,
    ) -> list[Todo]:
        """Claim up to n todos now, or wait up to `wait` seconds for a hint (re-checking
        every few seconds) and claim then. A process that is stopping claims nothing more:
        the wait ends with none. A token revoked meanwhile claims nothing either: Revoked,
        checked before every try after the first (the call itself was authorised just
        before it). A client that went ends the wait, and a claim that raced its going is
        given back: nobody would hold it until its lease ran out, spending an attempt."""
        store, owner, scope = self.store, agent.name, agent.scope
        wait = check_wait(wait)
        if wait == 0:  # the busy agent's claim: no subscription to make and drop
            return [] if self.hub.stopping else await store.claim_batch(queues, owner, ttl, n, scope=scope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spread_wait(wait)  # a fleet that began together does not end together
        still_allowed = token_check(self.accounts)
        first = True
        with self.hub.subscribe(queues, token=scope.token_id) as sub:  # before the first try: no lost wake-up
            presence.wakes(sub)
            while True:
                if sub.ended or presence.gone:
                    return []
                if not first and not await still_allowed(sub):
                    raise Revoked("the token was revoked")
                first = False
                todos = await store.claim_batch(queues, owner, ttl, n, scope=scope)
                if todos and presence.gone:
                    await store.give_back(todos, owner)
                    return []
                remaining = deadline - loop.time()
                if todos or remaining <= 0:
                    return todos
                await sub.wait(min(remaining, _jittered(POLL_FALLBACK)))
                sub.take()

    async def wait_for(self, agent: Agent, todo_id: str, wait: float, *, presence: Presence) -> TodoDetail:
        """The todo with its history as soon as it is `finished`, or after `wait` seconds (0
        to MAX_WAIT) as it is then. A todo outside the agent's scope is NotFound, as for a
        plain read. A process that is stopping answers at once with what it has; a token
        revoked meanwhile gets Revoked; a client that went ends the wait."""
        reads, scope = self.reads, agent.scope
        wait, todo_id = check_wait(wait), check_id(todo_id)
        if wait == 0:
            return await reads.todo_detail(todo_id, scope=scope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spread_wait(wait)  # waiters that began together do not end together
        still_allowed = token_check(self.accounts)
        with self.hub.watch(todo_id, token=scope.token_id) as sub:
            presence.wakes(sub)
            await self.store.watch(todo_id, scope=scope)
            while True:
                todo, _ = await reads.todo(todo_id, scope=scope)
                remaining = deadline - loop.time()
                if finished(todo) or remaining <= 0 or sub.ended or presence.gone:
                    return await reads.todo_detail(todo_id, scope=scope)
                await sub.wait(min(remaining, _jittered(WAIT_POLL)))
                if (sub.revoked or sub.resync) and not await still_allowed(sub):
                    raise Revoked("the token was revoked")
                sub.take()

    async def list_todos(self, agent: Agent, filters: TodoFilter, *, limit: int, after: str | None) -> Page:
        """The todos `filters` match, newest first, within the agent's queues: a `queue`
        outside them is OutOfScope. A search takes one of the agent's search slots."""
        if filters.queue:
            agent.scope.check([filters.queue])
        scoped = msgspec.structs.replace(filters, queues=None if filters.queue else agent.scope.queues)
        with self.searches.slot(f"agent:{agent.name}", scoped):
            return await self.reads.list_todos(scoped, limit=limit, after=after)
