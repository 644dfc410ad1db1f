"""A todo's page (/todos/x): its fields, payload and history; and what an operator does to
it there: retry, release its lease, cancel, run now and edit."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.control import Control
from dashboard.errors import Conflict, InvalidInput, Stale
from dashboard.models import Todo, TodoEdit, edit_problems
from dashboard.reads import Reads
from dashboard.web.pages.common import Fragment, actor, budget, parse_payload, reason, takes, utc
from dashboard.web.pages.leases import leases_list
from dashboard.web.responses import page, redirect, render

EDIT_FIELDS = (
    *("title", "kind", "assignee", "assignee_until", "max_attempts", "priority", "run_at", "payload"),
    "version",
)


async def todo_context(reads: Reads, todo_id: str) -> dict:
    detail = await reads.todo_detail(todo_id)
    return {"detail": detail, "todo": detail.todo}


@get("/todos/{todo_id:str}")
async def todo_page(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return page(request, "todo.html", **await todo_context(reads, todo_id))


@get("/partials/todos/{todo_id:str}")
async def todo_partial(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    return render(request, "partials/todo.html", **await todo_context(reads, todo_id))


def _todo(reads: Reads, todo_id: str) -> Fragment:
    """The todo's details, which its actions change."""
    return Fragment(f"/todos/{todo_id}", "partials/todo.html", lambda: todo_context(reads, todo_id))


@post("/todos/{todo_id:str}/retry")
async def retry_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.retry(todo_id, actor(request), one_more=budget(await request.form()))
    return await _todo(reads, todo_id).answer(request, f"{todo.id} retried: pending again")


@post("/todos/{todo_id:str}/release")
async def release_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    """From the todo's page, or from the leases page (`back`), which comes back as it was
    filtered (`owner`)."""
    form = await request.form()
    from_leases, owner = form.get("back") == "leases", form.get("owner") or None  # the page's filter
    todo = await control.force_release(todo_id, actor(request))
    changed = leases_list(reads, owner) if from_leases else _todo(reads, todo_id)
    return await changed.answer(request, f"lease on {todo.id} released: pending again")


@post("/todos/{todo_id:str}/cancel")
async def cancel_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.cancel(todo_id, actor(request), reason(await request.form()))
    return await _todo(reads, todo_id).answer(request, f"{todo.id} cancelled")


@post("/todos/{todo_id:str}/run-now")
async def run_todo_now(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.run_now(todo_id, actor(request))
    return await _todo(reads, todo_id).answer(request, f"{todo.id} is ready now")


# -- edit ---------------------------------------------------------------------------------------


def local_utc(at: datetime | None) -> str:
    """A time as a datetime-local input's value, in UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if at else ""


@get("/todos/{todo_id:str}/edit", opt=takes("retry"))
async def edit_page(request: Request, reads: NamedDependency[Reads], todo_id: FromPath[str]) -> Template:
    todo, read_at = await reads.todo(todo_id)
    values = {
        "title": todo.title,
        "kind": todo.kind or "",
        "assignee": todo.assignee or "",
        # datetime-local takes no zone (the form says UTC): an offset would make the browser
        # drop the value, and saving would clear it
        "assignee_until": local_utc(todo.assignee_until),
        "max_attempts": str(todo.max_attempts),
        "priority": str(todo.priority),
        "run_at": "",
        "payload": json.dumps(todo.payload, indent=2, ensure_ascii=False),
        "version": todo.version,  # what the form was drawn from: a save checks it is still so
    }
    retry = request.query_params.get("retry") == "1" and todo.state == "failed"
    return page(request, "edit.html", todo=todo, read_at=read_at, values=values, errors={}, retry=retry)


def _number(text: str) -> int | str:
    """A form's whole number, or the text as typed: the edit's check refuses it, saying
    what the field takes."""
    try:
        return int(text)
    except ValueError:
        return text


def _as_retried(todo: Todo, retry: bool) -> Todo:
    """The todo an edit with `retry` applies to: a dead one pending again, a fresh budget."""
    return (
        msgspec.structs.replace(todo, state="pending", attempt=0)
        if retry and todo.state == "failed"
        else todo
    )


@post("/todos/{todo_id:str}/edit")
async def edit_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    """Every field's problem is shown at once, beside the field, with what was typed kept
    (as on the create form). A todo changed since the form was drawn (its `version`) is
    not overwritten: the form comes back (409) with the values typed, what changed and by
    whom, and the version now, so that saving again applies them over it."""
    form = await request.form()
    values = {f: form.get(f, "") if f == "payload" else form.get(f, "").strip() for f in EDIT_FIELDS}
    retry = form.get("retry") == "1"
    fields: dict = {"title": values["title"], "kind": values["kind"] or None}
    fields["assignee"] = values["assignee"] or None
    fields["assignee_until"] = utc(values["assignee_until"]) or None
    if values["run_at"]:
        fields["run_at"] = utc(values["run_at"])
    fields["max_attempts"], fields["priority"] = _number(values["max_attempts"]), _number(values["priority"])
    payload, payload_error = parse_payload(values["payload"])
    if not payload_error:
        fields["payload"] = payload
    edit = TodoEdit(**fields)
    current, read_at = await reads.todo(todo_id)
    errors = edit_problems(_as_retried(current, retry), edit)
    if payload_error:
        errors["payload"] = payload_error
    status, conflict = 422, None
    if not errors:
        try:
            todo = await control.edit(
                todo_id, actor(request), edit, retry=retry, version=values["version"] or None
            )
        except InvalidInput as exc:
            errors = exc.fields
        except Stale as exc:
            status, conflict, errors = 409, exc.current, {"edit": str(exc)}
            values["version"] = exc.current["version"]
        except Conflict as exc:
            errors["edit"] = str(exc)
        else:
            message = f"{todo.id} edited" + (" and retried: pending again" if retry else "")
            return redirect(request, f"/todos/{todo_id}", message)
    return page(
        request,
        "edit.html",
        status=status,
        todo=current,
        read_at=read_at,
        values=values,
        errors=errors,
        conflict=conflict,
        retry=retry,
    )


ROUTES = [
    todo_page,
    todo_partial,
    retry_todo,
    release_todo,
    cancel_todo,
    run_todo_now,
    edit_page,
    edit_todo,
]
