"""Queue control on the dashboard (DESIGN.md "Queue control"), operators only: pause and
resume a queue, cancel, run now and edit a todo, and bulk actions on the queue and
dead-letters pages. Each goes through the Store as the logged-in operator and answers as
actions.py's do: the re-rendered partial for htmx, a redirect with a flash otherwise."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from urllib.parse import urlencode

import msgspec
from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.control import BulkReport, Control
from dashboard.errors import Conflict, InvalidInput, Stale
from dashboard.models import Todo, TodoEdit, edit_problems
from dashboard.reads import Reads
from dashboard.web.actions import actor, budget, parse_payload, utc
from dashboard.web.auth import operators_only
from dashboard.web.pages import (
    dead_context,
    dead_filter,
    queue_context,
    queue_control_context,
    queue_filter,
    takes,
    todo_context,
)
from dashboard.web.responses import after_action, page, redirect
from dashboard.web.templating import none_selected

BULK_MAX = 100_000  # todos one "all matching" action takes at most
BULK_ACTIONS = ("cancel", "retry", "run_now", "priority", "reassign")  # run_bulk's


def _reason(form) -> str | None:
    return (form.get("reason") or "").strip() or None


# -- queues ---------------------------------------------------------------------------------


@post("/queues/{queue:str}/pause", guards=[operators_only])
async def pause_queue(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    await control.pause(queue, actor(request), _reason(await request.form()))
    return await _queue_answer(request, reads, queue, f"queue {queue} paused: claims skip it until resumed")


@post("/queues/{queue:str}/resume", guards=[operators_only])
async def resume_queue(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    resumed = await control.resume(queue, actor(request), _reason(await request.form()))
    message = f"queue {queue} resumed" if resumed else f"queue {queue} was not paused"
    return await _queue_answer(request, reads, queue, message)


async def _queue_answer(request: Request, reads: Reads, queue: str, message: str) -> Template | Redirect:
    return await after_action(
        request,
        message,
        url=f"/queues/{queue}",
        partial="partials/queue_control.html",
        context=lambda: queue_control_context(reads, queue),
    )


# -- one todo -----------------------------------------------------------------------------------


@post("/todos/{todo_id:str}/cancel", guards=[operators_only])
async def cancel_todo(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.cancel(todo_id, actor(request), _reason(await request.form()))
    return await _todo_answer(request, reads, todo_id, f"{todo.id} cancelled")


@post("/todos/{todo_id:str}/run-now", guards=[operators_only])
async def run_todo_now(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], todo_id: FromPath[str]
) -> Template | Redirect:
    todo = await control.run_now(todo_id, actor(request))
    return await _todo_answer(request, reads, todo_id, f"{todo.id} is ready now")


async def _todo_answer(request: Request, reads: Reads, todo_id: str, message: str) -> Template | Redirect:
    return await after_action(
        request,
        message,
        url=f"/todos/{todo_id}",
        partial="partials/todo.html",
        context=lambda: todo_context(reads, todo_id),
    )


EDIT_FIELDS = (
    *("title", "kind", "assignee", "assignee_until", "max_attempts", "priority", "run_at", "payload"),
    "version",
)


def local_utc(at: datetime | None) -> str:
    """A time as a datetime-local input's value, in UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if at else ""


@get("/todos/{todo_id:str}/edit", **takes("retry"))
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


@post("/todos/{todo_id:str}/edit", guards=[operators_only])
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


# -- bulk ---------------------------------------------------------------------------------------


async def run_bulk(control: Control, request: Request, form, ids: list[str], action: str) -> BulkReport:
    """The bulk `action` over `ids`, its values (reason, priority, assignee) from the form."""
    who = actor(request)
    if action == "cancel":
        return await control.cancel_many(ids, who, _reason(form))
    if action == "retry":
        return await control.retry_many(ids, who, one_more=budget(form))
    if action == "run_now":
        return await control.run_now_many(ids, who)
    if action == "priority":
        try:
            priority = int(form.get("priority", ""))
        except ValueError:
            raise InvalidInput(
                "priority", "must be a whole number from -10 to 10 (higher runs first)"
            ) from None
        return await control.set_many(ids, who, priority=priority)
    if action == "reassign":
        return await control.set_many(ids, who, assignee=(form.get("assignee") or "").strip() or None)
    raise InvalidInput("action", f"must be one of {', '.join(BULK_ACTIONS)}")


def _selected(form) -> list[str]:
    return form.getall("ids") if "ids" in form else []


@post("/queues/{queue:str}/bulk", guards=[operators_only])
async def queue_bulk(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads], queue: FromPath[str]
) -> Template | Redirect:
    """The filter comes with the form and is applied again now, in the database: todos that
    changed since the page was drawn are skipped and counted."""
    form = await request.form()
    filters = queue_filter(queue, form)
    query = {k: v for k in ("state", "assignee", "owner", "kind", "q") if (v := form.get(k))}
    answer = partial(
        after_action,
        request,
        url=f"/queues/{queue}" + (f"?{urlencode(query)}" if query else ""),
        partial="partials/todos.html",
        context=lambda: queue_context(request, reads, queue, form),
    )
    if form.get("scope") == "all":
        ids = await reads.matching_ids(filters, limit=BULK_MAX)
        refusal = "No todo matches the filter any more."
    else:
        ids, refusal = _selected(form), none_selected("todo")
    if not ids:
        return await answer(refusal, kind="error")
    report = await run_bulk(control, request, form, ids, form.get("action", ""))
    return await answer(report.summary(), kind="error" if report.skipped and not report.changed else "ok")


@post(["/dead/retry", "/dead/bulk"], guards=[operators_only])
async def dead_bulk(
    request: Request, control: NamedDependency[Control], reads: NamedDependency[Reads]
) -> Template | Redirect:
    """Retry one, the selected, or all dead-letters that match (/dead/retry), or set their
    priority or assignee (/dead/bulk, the form's bulk_action and bulk_scope)."""
    form = await request.form()
    queue, cancelled = dead_filter(form)
    bulk = request.url.path.endswith("/bulk")
    action, scope = (
        (form.get("bulk_action", ""), form.get("bulk_scope")) if bulk else ("retry", form.get("scope"))
    )
    query = {k: v for k in ("queue", "cancelled") if (v := form.get(k))}
    answer = partial(
        after_action,
        request,
        url="/dead" + (f"?{urlencode(query)}" if query else ""),
        partial="partials/dead.html",
        context=lambda: dead_context(reads, queue, cancelled),
    )
    if form.get("one"):
        ids, refusal = [form["one"]], ""
    elif scope == "all":
        ids = await reads.dead_letter_ids(queue, cancelled=cancelled)
        refusal = "No dead-letter matches the filter any more."
    else:
        ids, refusal = _selected(form), none_selected("dead-letter")
    if not ids:
        return await answer(refusal, kind="error")
    report = await run_bulk(control, request, form, ids, action)
    return await answer(report.summary(), kind="error" if report.skipped else "ok")


ROUTES = [pause_queue, resume_queue, cancel_todo, run_todo_now, edit_page, edit_todo, queue_bulk, dead_bulk]
