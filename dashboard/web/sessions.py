"""Dashboard sessions: a random id in a cookie, the session itself in the database.

A server-side record (dashboard/accounts.py) is what lets logout, a password change or
removing an operator end a session in every process at once. The flash message a form
post leaves for the next page is kept on the record too.

Cookies are fit for HTTPS when the request came over HTTPS (directly, or from a trusted
proxy: uvicorn's proxy headers, dashboard/web/server.py) or SWITCHBOARD_PUBLIC_URL is an
https:// address: then they are `Secure` and carry the `__Host-` prefix, which a sibling
subdomain cannot set or overwrite.
"""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie
from litestar.types import Message, Scope

SESSION_MAX_AGE = 8 * 3600
SESSION = "session"
CSRF = "csrftoken"


def is_https(scope: Scope) -> bool:
    return scope.get("scheme") == "https" or scope["app"].state.public_https


def cookie_name(scope: Scope, name: str) -> str:
    return "__Host-" + name if is_https(scope) else name


def cookie(scope: Scope, name: str, value: str, max_age: int | None = None) -> Cookie:
    """A cookie for the dashboard: host-only, whole site, never read by page scripts."""
    return Cookie(
        key=cookie_name(scope, name),
        value=value,
        path="/",
        max_age=max_age,
        secure=is_https(scope),
        httponly=True,
        samesite="strict",
    )


def session_id(connection: ASGIConnection) -> str | None:
    return connection.cookies.get(cookie_name(connection.scope, SESSION)) or None


def set_flash(connection: ASGIConnection, flash: tuple[str, str] | None) -> None:
    """Leave `flash` for the next page (None: the one shown now is done); saved by save_flash."""
    connection.scope["flash_out"] = flash


async def save_flash(message: Message, scope: Scope) -> None:
    """before_send: store the flash a handler set or took, before the browser can follow
    the redirect that will show it."""
    if message["type"] != "http.response.start" or "flash_out" not in scope:
        return
    sid = scope.get("session_id")
    if sid:
        await scope["app"].state.services.accounts.set_flash(sid, scope.pop("flash_out"))
