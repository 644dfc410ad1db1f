"""Logging in and out of the dashboard (the session itself is checked in auth.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.response import Redirect, Template

from dashboard.accounts import Accounts


def safe_target(target: str | None) -> str:
    """Where to go after logging in: a path on this site, never another origin."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


@get("/login", include_in_schema=False)
async def login_page(request: Request) -> Template:
    return Template("login.html", context={"next": request.query_params.get("next", "/"), "error": None})


@post("/login", include_in_schema=False)
async def login(request: Request, accounts: NamedDependency[Accounts]) -> Template | Redirect:
    form = await request.form()
    name, password = form.get("name", ""), form.get("password", "")
    target = safe_target(form.get("next"))
    operator = await accounts.login(name, password)
    if operator is None:
        return Template(
            "login.html",
            status_code=401,
            context={
                "next": target,
                "error": "That name and password do not match an operator.",
                "name": name,
            },
        )
    request.set_session({"operator": operator.name, "login_at": datetime.now(UTC).isoformat()})
    return Redirect(target, status_code=303)


@post("/logout", include_in_schema=False)
async def logout(request: Request) -> Redirect:
    request.clear_session()
    return Redirect("/login", status_code=303)


ROUTES = [login_page, login, logout]
