"""Dashboard pages and their partials. Each view has one context builder shared by the
page (`/x`) and its htmx partial (`/partials/x`); actions post through the same Store
the agents use, with the operator's name as the actor."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from litestar import Request, Router, get, post
from litestar.exceptions import NotFoundException
from litestar.response import Redirect, ServerSentEvent, ServerSentEventMessage, Template
from markupsafe import escape

from dashboard.errors import InvalidInput, NotFound
from dashboard.models import DEFAULT_MAX_ATTEMPTS, NewTodo, check_queue
from dashboard.reads import LIST_STATES, Reads, TodoFilter
from dashboard.store import Store
from dashboard.web.auth import current_operator, operators_only, require_login

HINT_MIN_INTERVAL = 0.5  # a page gets at most two refresh hints a second
SSE_KEEPALIVE = 15.0
PAGE_SIZE = 50
LEASES_SHOWN = 100  # soonest expiry first; the rest are counted


# -- helpers -------------------------------------------------------------------------

def flash(request: Request, message: str, kind: str = "ok") -> None:
    request.set_session({**request.session, "flash": [kind, message]})


def take_flash(request: Request) -> tuple[str, str] | None:
    session = dict(request.session)
    message = session.pop("flash", None)
    if message:
        request.set_session(session)
    return message


async def page(request: Request, template: str, **context: Any) -> Template:
    operator = await current_operator(request)
    return Template(template, context={
        **context, "operator": operator, "flash": take_flash(request),
    })


def partial(template: str, status: int = 200, **context: Any) -> Template:
    return Template(template, context=context, status_code=status)


def actor(request: Request) -> str:
    return f"operator:{request.scope['operator'].name}"


def back_to(request: Request, url: str, message: str, kind: str = "ok") -> Redirect:
    flash(request, message, kind)
    return Redirect(url, status_code=303)


def budget(form) -> bool:
    """The retry budget choice: True for one more attempt, False for a fresh budget."""
    choice = form.get("budget", "fresh")
    if choice not in ("fresh", "one_more"):
        raise InvalidInput("budget", "must be fresh or one_more")
    return choice == "one_more"


# -- context builders -----------------------------------------------------------------

async def overview_context(request: Request) -> dict:
    stats = await request.app.state.stats.get()
    return {"stats": stats, "totals": {
        k: sum(getattr(s, k) for s in stats)
        for k in ("ready", "retrying", "claimed", "lapsed", "done_recent", "dead")
    }}


def todo_filter(request: Request, queue: str | None) -> TodoFilter:
    q = request.query_params
    state = q.get("state") or None
    if state and state not in LIST_STATES:
        raise InvalidInput("state", f"must be one of {', '.join(LIST_STATES)}")
    return TodoFilter(queue=queue, state=state, assignee=q.get("assignee") or None,
                      owner=q.get("owner") or None, kind=q.get("kind") or None,
                      search=q.get("q") or None)


async def queue_context(request: Request, reads: Reads, queue: str) -> dict:
    check_queue(queue)
    filters = todo_filter(request, queue)
    result = await reads.list_todos(filters, limit=PAGE_SIZE, after=request.query_params.get("after"))
    return {"queue": queue, "filters": filters, "page": result, "states": LIST_STATES,
            "query": {k: v for k, v in request.query_params.items() if k != "after" and v}}


async def leases_context(reads: Reads) -> dict:
    leases = await reads.leases(limit=LEASES_SHOWN)
    total = await reads.lease_count() if len(leases) == LEASES_SHOWN else len(leases)
    return {"leases": leases, "total": total}


async def dead_context(request: Request, reads: Reads, queue: str | None = None) -> dict:
    queue = queue or request.query_params.get("queue") or None
    if queue:
        check_queue(queue)
    result = await reads.dead_letters(queue, limit=PAGE_SIZE, after=request.query_params.get("after"))
    return {"page": result, "queue": queue, "queues": await reads.dead_letter_queues()}


async def todo_context(reads: Reads, todo_id: str) -> dict:
    try:
        detail = await reads.todo_detail(todo_id)
    except NotFound:
        raise NotFoundException(f"no todo {todo_id}") from None
    return {"detail": detail, "todo": detail.todo}


# -- login -----------------------------------------------------------------------------

@get("/login", include_in_schema=False)
async def login_page(request: Request) -> Template:
    return Template("login.html", context={"next": request.query_params.get("next", "/"), "error": None})


@post("/login", include_in_schema=False)
async def login(request: Request) -> Template | Redirect:
    form = await request.form()
    name, password = form.get("name", ""), form.get("password", "")
    target = form.get("next") or "/"
    if not target.startswith("/") or target.startswith("//"):
        target = "/"
    operator = await request.app.state.accounts.login(name, password)
    if operator is None:
        return Template("login.html", status_code=401, context={
            "next": target, "error": "That name and password do not match an operator.", "name": name})
    request.set_session({"operator": operator.name, "login_at": datetime.now(UTC).isoformat()})
    return Redirect(target, status_code=303)


@post("/logout", include_in_schema=False)
async def logout(request: Request) -> Redirect:
    request.clear_session()
    return Redirect("/login", status_code=303)


# -- pages and partials ------------------------------------------------------------------

@get("/")
async def overview(request: Request) -> Template:
    return await page(request, "overview.html", **await overview_context(request))


@get("/partials/overview")
async def overview_partial(request: Request) -> Template:
    return partial("partials/overview.html", **await overview_context(request))


@get("/queues/{queue:str}")
async def queue_page(request: Request, reads: Reads, queue: str) -> Template:
    return await page(request, "queue.html", **await queue_context(request, reads, queue))


@get("/partials/queues/{queue:str}")
async def queue_partial(request: Request, reads: Reads, queue: str) -> Template:
    return partial("partials/todos.html", **await queue_context(request, reads, queue))


@get("/leases")
async def leases_page(request: Request, reads: Reads) -> Template:
    return await page(request, "leases.html", **await leases_context(reads))


@get("/partials/leases")
async def leases_partial(request: Request, reads: Reads) -> Template:
    return partial("partials/leases.html", operator=await current_operator(request),
                   **await leases_context(reads))


@get("/dead")
async def dead_page(request: Request, reads: Reads) -> Template:
    return await page(request, "dead.html", **await dead_context(request, reads))


@get("/partials/dead")
async def dead_partial(request: Request, reads: Reads) -> Template:
    return partial("partials/dead.html", operator=await current_operator(request),
                   **await dead_context(request, reads))


@get("/todos/{todo_id:str}")
async def todo_page(request: Request, reads: Reads, todo_id: str) -> Template:
    return await page(request, "todo.html", **await todo_context(reads, todo_id))


@get("/partials/todos/{todo_id:str}")
async def todo_partial(request: Request, reads: Reads, todo_id: str) -> Template:
    return partial("partials/todo.html", operator=await current_operator(request),
                   **await todo_context(reads, todo_id))


# -- actions -----------------------------------------------------------------------------

@post("/todos/{todo_id:str}/retry", guards=[operators_only])
async def retry_todo(request: Request, store: Store, reads: Reads, todo_id: str) -> Template | Redirect:
    form = await request.form()
    todo = await store.retry(todo_id, actor(request), one_more=budget(form))
    message = f"{todo.id} retried: pending again"
    if request.htmx:
        return partial("partials/todo.html", operator=request.scope["operator"], notice=("ok", message),
                       **await todo_context(reads, todo_id))
    return back_to(request, f"/todos/{todo_id}", message)


@post("/todos/{todo_id:str}/release", guards=[operators_only])
async def release_todo(request: Request, store: Store, reads: Reads, todo_id: str) -> Template | Redirect:
    form = await request.form()
    todo = await store.force_release(todo_id, actor(request))
    message = f"lease on {todo.id} released: pending again"
    from_leases = form.get("back") == "leases"
    if request.htmx:
        if from_leases:
            return partial("partials/leases.html", operator=request.scope["operator"],
                           notice=("ok", message), **await leases_context(reads))
        return partial("partials/todo.html", operator=request.scope["operator"], notice=("ok", message),
                       **await todo_context(reads, todo_id))
    return back_to(request, "/leases" if from_leases else f"/todos/{todo_id}", message)


@post("/dead/retry", guards=[operators_only])
async def retry_dead(request: Request, store: Store, reads: Reads) -> Template | Redirect:
    form = await request.form()
    one_more = budget(form)
    queue = form.get("queue") or None
    if form.get("one"):
        ids = [form["one"]]
    elif form.get("scope") == "all":
        ids = await reads.dead_letter_ids(check_queue(queue) if queue else None)
    else:
        ids = form.getall("ids") if "ids" in form else []
        if not ids:
            raise InvalidInput("ids", "select at least one dead-letter to retry")
    report = await store.retry_many(ids, actor(request), one_more=one_more)
    summary = report.summary()
    if request.htmx:
        context = await dead_context(request, reads, queue=queue)
        notice = ("error" if report.refused else "ok", summary)
        return partial("partials/dead.html", operator=request.scope["operator"], notice=notice, **context)
    return back_to(request, "/dead" + (f"?queue={queue}" if queue else ""), summary,
                   "error" if report.refused else "ok")


# -- create ------------------------------------------------------------------------------

CREATE_FIELDS = ("queue", "title", "kind", "payload", "assignee", "idempotency_key", "max_attempts")


@get("/create")
async def create_page(request: Request) -> Template:
    values = {"payload": "{}", "max_attempts": str(DEFAULT_MAX_ATTEMPTS),
              "queue": request.query_params.get("queue", "")}
    return await page(request, "create.html", values=values, errors={})


@post("/create", guards=[operators_only])
async def create_todo(request: Request, store: Store) -> Template | Redirect:
    form = await request.form()
    values = {f: form.get(f, "").strip() if f != "payload" else form.get(f, "") for f in CREATE_FIELDS}
    errors: dict[str, str] = {}
    try:
        payload = json.loads(values["payload"] or "{}")
    except json.JSONDecodeError as exc:
        errors["payload"] = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        payload = None
    try:
        max_attempts = int(values["max_attempts"] or DEFAULT_MAX_ATTEMPTS)
    except ValueError:
        errors["max_attempts"] = "must be a whole number from 1 to 100"
        max_attempts = DEFAULT_MAX_ATTEMPTS
    if not errors:
        item = NewTodo(queue=values["queue"], title=values["title"], kind=values["kind"] or None,
                       payload=payload, assignee=values["assignee"] or None,
                       idempotency_key=values["idempotency_key"] or None, max_attempts=max_attempts)
        try:
            created = await store.create(item, actor=actor(request))
        except InvalidInput as exc:
            errors[exc.field] = exc.message
        else:
            todo = created.todo
            if not created.created:
                return back_to(request, f"/todos/{todo.id}",
                               f"A live todo already holds key {todo.idempotency_key!r} in {todo.queue}: "
                               "this is it (the duplicate was counted, nothing new was created).", "info")
            return back_to(request, f"/queues/{todo.queue}", f"created {todo.id}: {todo.title}")
    return Template("create.html", status_code=422, context={
        "values": values, "errors": errors, "operator": request.scope["operator"], "flash": None})


# -- tokens ------------------------------------------------------------------------------

@get("/tokens")
async def tokens_page(request: Request) -> Template:
    tokens = await request.app.state.accounts.list_tokens()
    return await page(request, "tokens.html", tokens=tokens, new_secret=None)


@post("/tokens", guards=[operators_only])
async def add_token(request: Request) -> Template:
    form = await request.form()
    accounts = request.app.state.accounts
    queues = [q.strip() for q in form.get("queues", "").split(",") if q.strip()]
    error, secret = None, None
    try:
        _, secret = await accounts.add_token(form.get("agent", "").strip(), queues, actor=actor(request))
    except InvalidInput as exc:
        error = str(exc)
    return await page(request, "tokens.html", tokens=await accounts.list_tokens(), new_secret=secret,
                      error=error)


@post("/tokens/{token_id:str}/revoke", guards=[operators_only])
async def revoke_token(request: Request, token_id: str) -> Redirect:
    await request.app.state.accounts.revoke_token(token_id, actor=actor(request))
    return back_to(request, "/tokens", f"token {token_id} revoked")


# -- live hints ----------------------------------------------------------------------------

@get("/events")
async def events(request: Request) -> ServerSentEvent:
    """Hints for open pages: 'refresh' (and 'queue-<name>') to reload partials, 'notice'
    for a short "new work in <queue>" line; 'resync' after the LISTEN connection was lost."""
    hub = request.app.state.hub

    async def stream():
        with hub.subscribe() as sub:
            yield ServerSentEventMessage(comment="connected")
            last = 0.0
            loop = asyncio.get_running_loop()
            while True:
                if not await sub.wait(SSE_KEEPALIVE):
                    yield ServerSentEventMessage(comment="keepalive")
                    continue
                wait = last + HINT_MIN_INTERVAL - loop.time()
                if wait > 0:  # coalesce a burst into one refresh
                    await asyncio.sleep(wait)
                queues, resync = sub.take()
                last = loop.time()
                if resync:
                    yield ServerSentEventMessage(event="resync", data="*")
                if queues:
                    yield ServerSentEventMessage(event="refresh", data=",".join(sorted(queues)))
                    for queue in sorted(queues):
                        yield ServerSentEventMessage(event=f"queue-{queue}", data=queue)
                    names = ", ".join(sorted(queues)[:3]) + (" …" if len(queues) > 3 else "")
                    yield ServerSentEventMessage(
                        event="notice", data=f'<span class="notice">new work in {escape(names)}</span>')

    return ServerSentEvent(stream())


ROUTES = [
    login_page, login, logout,
    Router("/", route_handlers=[
        overview, overview_partial, queue_page, queue_partial, leases_page, leases_partial,
        dead_page, dead_partial, todo_page, todo_partial, retry_todo, release_todo, retry_dead,
        create_page, create_todo, tokens_page, add_token, revoke_token, events,
    ], before_request=require_login, include_in_schema=False),
]
