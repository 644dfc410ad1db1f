"""The create form (/create): a new todo, typed by an operator, through the same Store the
agents' API uses."""

from __future__ import annotations

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from dashboard.errors import InvalidInput
from dashboard.models import DEFAULT_MAX_ATTEMPTS, NewTodo, new_todo_problems
from dashboard.store import Store
from dashboard.web.pages.common import PAYLOAD_FORM_LIMIT, actor, parse_payload, takes, utc
from dashboard.web.responses import page, redirect, render
from dashboard.web.templating import isolated

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


@get("/create", opt=takes("queue"))
async def create_page(request: Request) -> Template:
    values = {
        "payload": "{}",
        "max_attempts": str(DEFAULT_MAX_ATTEMPTS),
        "priority": "0",
        "queue": request.query_params.get("queue", ""),
    }
    return page(request, "create.html", values=values, errors={})


@post("/create", request_max_body_size=PAYLOAD_FORM_LIMIT)
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


ROUTES = [create_page, create_todo]
