"""How dashboard handlers answer: a template with the operator and flash filled in, and
the one htmx-or-redirect choice every form action makes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar.response import Redirect, Template

from dashboard.web.sessions import set_flash


def render(request: Request, template: str, *, status: int = 200, **context: Any) -> Template:
    """`template` with `operator` (set by the login check on every dashboard route)."""
    return Template(
        template, context={"operator": request.scope.get("operator"), **context}, status_code=status
    )


def page(request: Request, template: str, *, status: int = 200, **context: Any) -> Template:
    """A whole page: `render`, plus the flash message a redirect left in the session."""
    return render(request, template, status=status, flash=take_flash(request), **context)


def flash(request: Request, message: str, kind: str = "ok") -> None:
    set_flash(request, (kind, message))


def take_flash(request: Request) -> tuple[str, str] | None:
    message = request.scope.get("flash_in")
    if message:
        set_flash(request, None)
    return message


def redirect(request: Request, url: str, message: str, kind: str = "ok") -> Redirect:
    """Back to a page (303, after a form post), which shows `message` once."""
    flash(request, message, kind)
    return Redirect(url, status_code=303)


async def after_action(
    request: Request,
    message: str,
    *,
    url: str,
    partial: str,
    context: Callable[[], Awaitable[dict]],
    kind: str = "ok",
) -> Template | Redirect:
    """htmx swaps `partial` (its `context()` built afresh) with the outcome as a notice;
    a plain form post is redirected to `url`, which flashes it."""
    if request.htmx:
        return render(request, partial, notice=(kind, message), **await context())
    return redirect(request, url, message, kind)
