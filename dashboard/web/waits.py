"""Waiting for a result: GET /api/v1/todos/{id}?wait=S and the MCP tool `wait_for` both
call `wait_for_todo`, the one code path.

A waiter subscribes to its todo's hints (Hub.watch), marks the todo watched (Store.watch)
and reads it: from then on, either the statement that finishes the todo sees the mark and
the store hints the todo by id after its commit, or the read sees it finished. The hint
goes through PostgreSQL, so the completer may be any process. Without one (the LISTEN
connection was lost, or the todo was finished by plain SQL) the waiter finds out by
reading again every WAIT_POLL seconds or so.

Finished means done or failed: dead-lettered or cancelled. A failed attempt that will be
retried is pending again, and the wait goes on.
"""

from __future__ import annotations

import asyncio
import random

from litestar.exceptions import NotAuthorizedException

from dashboard.backoff import spread_wait
from dashboard.models import FINISHED, Scope, check_id, check_wait
from dashboard.reads import TodoDetail
from dashboard.web.live import POLL_JITTER, token_check
from dashboard.web.presence import Presence
from dashboard.web.services import Services

# Seconds between reads when no hint comes (± POLL_JITTER of it): a missed hint costs
# about this much. Shorter than the long-poll claim's 5 s, since a person may be watching
# the agent that waits, and cheaper: one todo read by key, not a claim. Its history is read
# once, for the answer: its owner can make it long.
WAIT_POLL = 1.5


async def wait_for_todo(
    services: Services, todo_id: str, wait: float, scope: Scope | None, *, presence: Presence
) -> TodoDetail:
    """The todo with its history as soon as it is finished, or after `wait` seconds (0 to
    MAX_WAIT) as it is then. A todo outside `scope` is NotFound, as for a plain read. A
    process that is stopping answers at once with what it has; a token revoked meanwhile
    gets 401; a client that went (`presence`) ends the wait: nobody reads the answer."""
    wait, todo_id = check_wait(wait), check_id(todo_id)
    if wait == 0:
        return await services.reads.todo_detail(todo_id, scope=scope)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spread_wait(wait)  # waiters that began together do not end together
    still_allowed = token_check(services.accounts)
    with services.hub.watch(todo_id, token=scope.token_id if scope else None) as sub:
        presence.wakes(sub)
        await services.store.watch(todo_id, scope=scope)
        while True:
            todo, _ = await services.reads.todo(todo_id, scope=scope)
            remaining = deadline - loop.time()
            if todo.state in FINISHED or remaining <= 0 or sub.ended or presence.gone:
                return await services.reads.todo_detail(todo_id, scope=scope)
            await sub.wait(min(remaining, WAIT_POLL * random.uniform(1 - POLL_JITTER, 1 + POLL_JITTER)))
            if scope is not None and (sub.revoked or sub.resync) and not await still_allowed(sub):
                raise NotAuthorizedException("the token was revoked")
            sub.take()
