"""The Inbox page (DESIGN.md "Inbox"): the todos assigned to the operator who is logged in,
live, and the menu's count of those waiting.

Claim, extend, complete, fail and release are the Store's own transitions, the ones an
agent makes, fenced by the lease token each form carries, in the operator's name (owner
and history: operator <name>). Reassign is an edit of the assignee (after a release, for
a todo the operator holds). A refusal (someone else claimed it, the lease lapsed) is shown
beside the todo with what was typed kept, and the list holds still until the next action.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.accounts import NAME, Accounts
from dashboard.control import Control
from dashboard.durations import ago, duration
from dashboard.errors import Conflict, InvalidInput, NotFound
from dashboard.inbox import inbox, waiting_count
from dashboard.models import Todo, TodoEdit
from dashboard.reads import Reads
from dashboard.store import Store
from dashboard.web.errors import status_of
from dashboard.web.pages.common import PAYLOAD_FORM_LIMIT, Fragment, actor
from dashboard.web.responses import page, render
from dashboard.web.templating import field_error, isolated

KEPT = ("result", "reason", "assignee")  # what a person typed, kept when an action is refused
FIELDS = {"error": "reason"}  # a Store field as the form names it


def _me(request: Request) -> str:
    return request.scope["operator"].name


def _lease_length(request: Request) -> float:
    """How long a claim from the inbox lasts (SWITCHBOARD_INBOX_LEASE); Extend renews it for
    as long again."""
    return request.app.state.settings.inbox_lease


async def inbox_context(request: Request, reads: Reads, **extra: Any) -> dict:
    return {"inbox": await inbox(reads.db, _me(request)), "errors": {}, "kept": {}, **extra}


@get("/inbox")
async def inbox_page(request: Request, reads: NamedDependency[Reads]) -> Template:
    return page(request, "inbox.html", lease=_lease_length(request), **await inbox_context(request, reads))


@get("/partials/inbox")
async def inbox_partial(request: Request, reads: NamedDependency[Reads]) -> Template:
    return render(request, "partials/inbox.html", badge=True, **await inbox_context(request, reads))


@get("/partials/inbox/count")
async def inbox_count(request: Request, reads: NamedDependency[Reads]) -> Template:
    """The menu's badge: how many todos wait for this operator (one bounded count)."""
    return render(request, "partials/inbox_count.html", waiting=await waiting_count(reads.db, _me(request)))


# -- actions ------------------------------------------------------------------------------


def _lease(form) -> int:
    try:
        return int(form.get("lease", ""))
    except ValueError:
        raise InvalidInput("lease", "is missing from the form: reload the page") from None


def parse_result(text: str) -> dict | None:
    """A person's result: a JSON object is stored as it is, any other text as {"note": text},
    nothing as no result. Text that opens with "{" must be a JSON object: a typo in one
    is refused, not stored as a note by mistake."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                "result",
                f"is not valid JSON, though it starts with {{ ({exc.msg} at line {exc.lineno} "
                f"column {exc.colno}): fix it, or write a note that does not start with {{",
            ) from None
        except RecursionError:
            raise InvalidInput("result", "is nested too deeply") from None
        if isinstance(value, dict):
            return value
    return {"note": text}


def _assignee(form, me: str) -> str:
    name = (form.get("assignee") or "").strip()
    if not NAME.match(name):
        raise InvalidInput(
            "assignee",
            "must be an operator's or an agent's name: letters, digits, '_', '.', '@' and '-', "
            "up to 63 characters, starting with a letter or digit",
        )
    if name == me:
        raise InvalidInput("assignee", "is you: it is yours already")
    return name


async def _act(
    request: Request, reads: Reads, todo_id: str, action: Callable[[Any], Awaitable[str]]
) -> Template | Redirect:
    """`action(form)` and the inbox afresh with its outcome; a refusal is shown beside the
    todo (or above the list, when the todo has left it), with what was typed kept."""
    form = await request.form()
    try:
        message = await action(form)
    except (Conflict, NotFound, InvalidInput) as exc:
        if isinstance(exc, InvalidInput):
            error = field_error(exc.message, FIELDS.get(exc.field, exc.field))
        else:
            error = str(exc)
        status = status_of(exc)
        refused = {"errors": {todo_id: error}, "kept": {todo_id: {k: form.get(k, "") for k in KEPT}}}
        if request.htmx:  # the outcome at the top too, as for any action: the todo may be far down
            context = await inbox_context(request, reads, badge=True, notice=("error", error), **refused)
            return render(request, "partials/inbox.html", status=status, **context)
        context = await inbox_context(request, reads, **refused)
        return page(request, "inbox.html", status=status, lease=_lease_length(request), **context)
    inbox_list = Fragment("/inbox", "partials/inbox.html", lambda: inbox_context(request, reads, badge=True))
    return await inbox_list.answer(request, message)


def _named(todo: Todo) -> str:
    return f"“{isolated(todo.title)}”"  # an agent's title: its bidi controls stay inside


def _whose(todo: Todo, me: str) -> str:
    """Where a todo that went back to pending waits: an inbox, or its queue."""
    if todo.assignee is None:
        return f"queue {todo.queue}"
    return "your inbox" if todo.assignee == me else f"{todo.assignee}'s inbox"


# Each transition, made by the operator `me` from the inbox's form, says what it did; `ttl`
# is the inbox's lease length, which a claim and an extend give.


async def _claim(store: Store, me: str, todo_id: str, _form, ttl: float) -> str:
    todo = await store.claim(todo_id, me, ttl, actor_kind="operator")
    return f"{_named(todo)} is yours for {duration(ttl)}: complete it, fail it or release it"


async def _extend(store: Store, me: str, todo_id: str, form, ttl: float) -> str:
    todo = await store.heartbeat(todo_id, me, _lease(form), ttl)
    return f"{_named(todo)} is yours for {duration(ttl)} from now"


async def _complete(store: Store, me: str, todo_id: str, form, ttl: float) -> str:
    result = parse_result(form.get("result", ""))
    todo = await store.complete(todo_id, me, _lease(form), result, actor_kind="operator")
    return f"{_named(todo)} is done"


async def _fail(store: Store, me: str, todo_id: str, form, ttl: float) -> str:
    reason = (form.get("reason") or "").strip()
    todo = await store.fail(todo_id, me, _lease(form), reason, actor_kind="operator")
    if todo.state == "failed":
        return (
            f"{_named(todo)} is dead-lettered: that was its last attempt "
            f"({todo.attempt} of {todo.max_attempts})"
        )
    return (
        f"{_named(todo)} failed (attempt {todo.attempt} of {todo.max_attempts}): "
        f"it comes back to {_whose(todo, me)} {ago(todo.next_retry_at)}"
    )


async def _release(store: Store, me: str, todo_id: str, form, ttl: float) -> str:
    todo = await store.release(todo_id, me, _lease(form), actor_kind="operator")
    return f"{_named(todo)} released: it waits in {_whose(todo, me)} again"


TRANSITIONS = {"claim": _claim, "extend": _extend, "complete": _complete, "fail": _fail, "release": _release}


def _transition(verb: str, **options: Any) -> HTTPRouteHandler:
    """POST /inbox/{todo_id}/<verb>: TRANSITIONS[verb], answered by _act."""
    change = TRANSITIONS[verb]

    async def handler(
        request: Request, store: NamedDependency[Store], reads: NamedDependency[Reads], todo_id: FromPath[str]
    ) -> Template | Redirect:
        return await _act(
            request, reads, todo_id, partial(change, store, _me(request), todo_id, ttl=_lease_length(request))
        )

    return post(f"/inbox/{{todo_id:str}}/{verb}", **options)(handler)


@post("/inbox/{todo_id:str}/reassign")
async def reassign(
    request: Request,
    store: NamedDependency[Store],
    control: NamedDependency[Control],
    reads: NamedDependency[Reads],
    accounts: NamedDependency[Accounts],
    todo_id: FromPath[str],
) -> Template | Redirect:
    """To another operator or an agent. A todo the operator holds is released first (the
    form then carries its lease): a claimed todo cannot be edited."""

    async def action(form) -> str:
        name = _assignee(form, _me(request))
        if form.get("lease"):
            await store.release(todo_id, _me(request), _lease(form), actor_kind="operator")
        todo = await control.edit(todo_id, actor(request), TodoEdit(assignee=name, assignee_until=None))
        if await accounts.operator(name) is not None:
            return f"{_named(todo)} handed to {name}: it is in their inbox now"
        return f"{_named(todo)} handed to {name} (not an operator: an agent of that name may claim it)"

    return await _act(request, reads, todo_id, action)


ROUTES = [
    inbox_page,
    inbox_partial,
    inbox_count,
    *(_transition(verb) for verb in ("claim", "extend", "fail", "release")),
    _transition("complete", request_max_body_size=PAYLOAD_FORM_LIMIT),  # a result may be a payload's size
    reassign,
]
