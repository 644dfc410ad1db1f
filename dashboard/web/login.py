"""Logging in and out of the dashboard (the session itself is checked in auth.py).

A login starts a server-side session (dashboard/web/sessions.py) with a new CSRF token
bound to it; logins are limited per address, per name at an address, and in how many
wait for the password hash (dashboard/web/limits.py).
Neither page may be kept by a cache: they carry the token.
"""

from __future__ import annotations

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from dashboard.accounts import Accounts
from dashboard.web.csrf import new_session_token
from dashboard.web.services import services
from dashboard.web.sessions import CSRF, SESSION, SESSION_MAX_AGE, cookie, session_id

NO_STORE = {"Cache-Control": "no-store"}
FORM_LIMIT = 64 * 1024  # a name and a password; the dashboard's forms are as small


def safe_target(target: str | None) -> str:
    """Where to go after logging in: a path on this site, never another origin."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


@get("/login", include_in_schema=False)
async def login_page(request: Request) -> Template:
    context = {"next": safe_target(request.query_params.get("next")), "error": None}
    return Template("login.html", context=context, headers=NO_STORE)


@post("/login", include_in_schema=False, request_max_body_size=FORM_LIMIT)
async def login(request: Request, accounts: NamedDependency[Accounts]) -> Template | Redirect:
    form = await request.form()
    name, password = str(form.get("name", "")), str(form.get("password", ""))
    target = safe_target(form.get("next"))
    address = request.client.host if request.client else ""
    # Counted as failed before the hash, so concurrent guesses meet the limits too.
    with services(request).limits.login_attempt(address) as attempt:
        credentials = await accounts.credentials(name)
        attempt.check_name(name, credentials.generation)
        operator = await accounts.login(credentials, password)
        if operator is not None:
            attempt.succeeded()
    if operator is None:
        return Template(
            "login.html",
            status_code=401,
            headers=NO_STORE,
            context={
                "next": target,
                "error": "That name and password do not match an operator.",
                "name": name,
            },
        )
    old = session_id(request)
    if old:
        await accounts.end_session(old)
    sid = await accounts.start_session(operator.name, SESSION_MAX_AGE)
    scope = request.scope
    return Redirect(
        target,
        status_code=303,
        cookies=[
            cookie(scope, SESSION, sid, max_age=SESSION_MAX_AGE),
            cookie(scope, CSRF, new_session_token(request, sid)),
        ],
    )


@post("/logout", include_in_schema=False, request_max_body_size=FORM_LIMIT)
async def logout(request: Request, accounts: NamedDependency[Accounts]) -> Redirect:
    """Ends the session on the server: the cookie, if kept somewhere, opens nothing."""
    sid = session_id(request)
    if sid:
        await accounts.end_session(sid)
    scope = request.scope
    return Redirect(
        "/login",
        status_code=303,
        cookies=[
            cookie(scope, SESSION, "", max_age=0),
            cookie(scope, CSRF, new_session_token(request, None)),
        ],
    )


ROUTES = [login_page, login, logout]
