"""Dashboard form actions (POST, operators only). Each goes through the same Store the
agents use, recorded as the logged-in operator (`Actor("operator", name)`), and answers
with `after_action`: the re-rendered partial for htmx, a redirect with a flash message
for a plain form."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.accounts import Accounts
from dashboard.control import Control
from dashboard.errors import Conflict, InvalidInput
from dashboard.models import DEFAULT_MAX_ATTEMPTS, MAX_JSON_BYTES, Actor, NewTodo, new_todo_problems
from dashboard.reads import Reads
from dashboard.store import Store
from dashboard.web.auth import operators_only
from dashboard.web.pages import leases_context, todo_context, tokens_view
from dashboard.web.responses import after_action, redirect, render
from dashboard.web.templating import isolated

# A payload may be MAX_JSON_BYTES of JSON, and URL-encoding can triple it; other forms
# keep the dashboard's 64 KiB (app.py).
CREATE_FORM_LIMIT = 3 * MAX_JSON_BYTES + 64 * 1024
CREATE_FIELDS = (
    "queue",
    "title",
    "kind",
    "payload",
    "assignee",
    "assignee_until",
    "idempotency_key",
    "max_attempts",
    "priority",
    "run_at",
    "delay",
)


def utc(text: str) -> str:
    """A time from a form: the browser's datetime-local has no zone, and the forms say UTC."""
    if text and len(text) <= 19 and "+" not in text and not text.endswith("Z"):
        return text + "+00:00"
    return text


def actor(request: Request) -> Actor:
    return Actor("operator", request.scope["operator"].name)


def signed(request: Request) -> str:
    """The operator as api_tokens' created_by / revoked_by text records it."""
    return f"operator:{request.scope['operator'].name}"


def budget(form) -> bool:
    """The retry budget choice: True for one more attempt, False for a fresh budget."""
    choice = form.get("budget", "fresh")
    if choice not in ("fresh", "one_more"):
        raise InvalidInput("budget", "must be fresh or one_more")
    return choice == "one_more"


@post("/todos/{todo_id:str}/retry", guards=[operators_only])
async def retry_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.retry(todo_id, actor(request), one_more=budget(await request.form()))
    return await after_action(
        request,
        f"{todo.id} retried: pending again",
        url=f"/todos/{todo_id}",
        partial="partials/todo.html",
        context=lambda: todo_context(reads, todo_id),
    )


@post("/todos/{todo_id:str}/release", guards=[operators_only])
async def release_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    form = await request.form()
    from_leases, owner = form.get("back") == "leases", form.get("owner") or None  # the page's filter
    todo = await control.force_release(todo_id, actor(request))
    message = f"lease on {todo.id} released: pending again"
    if from_leases:
        return await after_action(
            request,
            message,
            url="/leases" + (f"?{urlencode({'owner': owner})}" if owner else ""),
            partial="partials/leases.html",
            context=lambda: leases_context(reads, owner),
        )
    return await after_action(
        request,
        message,
        url=f"/todos/{todo_id}",
        partial="partials/todo.html",
        context=lambda: todo_context(reads, todo_id),
    )


def parse_payload(text: str) -> tuple[dict | None, str | None]:
    """A form's payload text: (the JSON value, None), or (None, what is wrong with it)."""
    try:
        return json.loads(text or "{}"), None
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "is nested too deeply (JSON arrays and objects inside each other)"


@post("/create", guards=[operators_only], request_max_body_size=CREATE_FORM_LIMIT)
async def create_todo(request: Request, store: NamedDependency[Store]) -> Template | Redirect:
    """Every field's problem is shown at once, beside the field, with what was typed kept."""
    form = await request.form()
    values = {f: form.get(f, "").strip() if f != "payload" else form.get(f, "") for f in CREATE_FIELDS}
    payload, payload_error = parse_payload(values["payload"])
    errors = {"payload": payload_error} if payload_error else {}
    numbers = {}
    for name, default, parse, hint in (
        ("max_attempts", DEFAULT_MAX_ATTEMPTS, int, "a whole number from 1 to 100"),
        ("priority", 0, int, "a whole number from -10 to 10"),
        ("delay", None, float, "a number of seconds"),
    ):
        try:
            numbers[name] = parse(values[name]) if values[name] else default
        except ValueError:
            numbers[name], errors[name] = default, f"must be {hint}"
    item = NewTodo(
        queue=values["queue"],
        title=values["title"],
        kind=values["kind"] or None,
        payload={} if payload_error else payload,
        assignee=values["assignee"] or None,
        assignee_until=utc(values["assignee_until"]) or None,
        idempotency_key=values["idempotency_key"] or None,
        run_at=utc(values["run_at"]) or None,
        **numbers,
    )
    errors = {**new_todo_problems(item), **errors}  # a field that could not be read says so
    if not errors:
        try:
            created = await store.create(item, actor=actor(request))
        except InvalidInput as exc:
            errors = exc.fields
        else:
            todo = created.todo
            if not created.created:
                return redirect(
                    request,
                    f"/todos/{todo.id}",
                    f"A live todo already holds key {todo.idempotency_key!r} in {todo.queue}: "
                    "this is it (the duplicate was counted, nothing new was created).",
                    "info",
                )
            return redirect(request, f"/queues/{todo.queue}", f"created {todo.id}: {isolated(todo.title)}")
    return render(request, "create.html", status=422, values=values, errors=errors, flash=None)


@post("/tokens", guards=[operators_only])
async def add_token(
    request: Request, accounts: NamedDependency[Accounts], reads: NamedDependency[Reads]
) -> Template:
    """On a refusal the form keeps what was typed and marks every bad field. A queue no
    todo has been in yet is allowed (agents may be set up first) but named, in case of a typo."""
    form = await request.form()
    values = {f: form.get(f, "").strip() for f in ("agent", "queues")}
    queues = [q.strip() for q in values["queues"].split(",") if q.strip()]
    try:
        _, secret = await accounts.add_token(values["agent"], queues, actor=signed(request))
    except InvalidInput as exc:
        return await tokens_view(request, accounts, values=values, errors=exc.fields, status=422)
    except Conflict as exc:  # the name is an operator's
        errors = {"agent": f"is taken: {exc}"}
        return await tokens_view(request, accounts, values=values, errors=errors, status=409)
    return await tokens_view(request, accounts, new_secret=secret, unknown=await reads.unknown_queues(queues))


@post("/tokens/{token_id:str}/revoke", guards=[operators_only])
async def revoke_token(
    request: Request, accounts: NamedDependency[Accounts], token_id: FromPath[str]
) -> Redirect:
    await accounts.revoke_token(token_id, actor=signed(request))
    return redirect(request, "/tokens", f"token {token_id} revoked")


ROUTES = [retry_todo, release_todo, create_todo, add_token, revoke_token]
