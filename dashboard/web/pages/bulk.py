"""The bulk actions of the queue and dead-letters pages: one action over many todos, its
values (reason, priority, assignee) from the form."""

from __future__ import annotations

from litestar import Request

from dashboard.control import BulkReport, Control
from dashboard.errors import InvalidInput
from dashboard.web.pages.common import actor, budget, reason

BULK_MAX = 100_000  # todos one "all matching" action takes at most
BULK_ACTIONS = ("cancel", "retry", "run_now", "priority", "reassign")  # run_bulk's


async def run_bulk(control: Control, request: Request, form, ids: list[str], action: str) -> BulkReport:
    """The bulk `action` over `ids`, its values (reason, priority, assignee) from the form."""
    who = actor(request)
    if action == "cancel":
        return await control.cancel_many(ids, who, reason(form))
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


def selected(form) -> list[str]:
    """The ids of the rows ticked on the page."""
    return form.getall("ids") if "ids" in form else []
