"""Who is asking: operators by session cookie (dashboard), agents by bearer token (API).

The app never runs open: with no operator account every dashboard page says how to make
one; anonymous browsers are sent to /login; viewers may look but not change anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.response import Redirect, Template

from dashboard.accounts import Agent, Operator
from dashboard.control import Control
from dashboard.models import Scope
from dashboard.store import Store
from dashboard.web.services import Services, services
from dashboard.web.sessions import session_id


class LoginRequired(NotAuthorizedException):
    """A browser without a session: sent to the login page."""


async def current_operator(request: ASGIConnection) -> Operator | None:
    """The logged-in operator: the session record, read on every request (so logout, a
    new password or removal ends it everywhere), with the flash message it holds."""
    if "operator" in request.scope:
        return request.scope["operator"]
    sid = session_id(request)
    found = await services(request).accounts.session(sid) if sid else None
    operator, flash = found or (None, None)
    if operator is not None:
        request.scope["session_id"] = sid
        request.scope["flash_in"] = flash
    request.scope["operator"] = operator
    return operator


async def require_login(request: Request) -> Any:
    """before_request for dashboard routes: the login page for anyone not logged in."""
    known = services(request)
    if not known.has_operators:
        known.has_operators = await known.accounts.has_operators()
        if not known.has_operators:
            return Template("no_operators.html", status_code=503)
    if await current_operator(request) is None:
        return to_login(request)
    return None


def to_login(request: ASGIConnection) -> Response:
    """The login page, for a browser (303) or for htmx (HX-Redirect: an XHR would follow a 303
    itself and swap the login page into the fragment)."""
    target = "/login?next=" + quote(request.url.path)
    if request.headers.get("hx-request"):
        return Response(None, status_code=401, headers={"HX-Redirect": target})
    return Redirect(target, status_code=303)


async def operators_only(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Guard for state-changing dashboard routes (guards run before before_request hooks):
    anonymous callers go to the login page, viewers get 403."""
    operator = await current_operator(connection)
    if operator is None:
        raise LoginRequired("log in first")
    if not operator.can_change:
        raise PermissionDeniedException("viewers can look but not change anything")


@dataclass(slots=True)
class Caller:
    """An API request's agent (from its bearer token) and the app's services: found once per
    request by `authenticate`, not injected (Litestar's dependency resolution cost more per
    request than the handler's own work)."""

    agent: Agent
    services: Services

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def scope(self) -> Scope:
        return self.agent.scope

    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def control(self) -> Control:
        return self.services.control


async def require_agent(request: Request) -> Caller:
    """The agent whose bearer token came with the request, with the services its handler
    uses (for the API's `authenticate` and for /mcp)."""
    header = _authorization(request.scope)
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise NotAuthorizedException("send Authorization: Bearer <token>")
    known = services(request)
    agent = await known.tokens.agent_for(secret.strip())
    if agent is None:
        known.limits.token_failed(request.client.host if request.client else "")  # 429 once too many
        raise NotAuthorizedException("the token is unknown or revoked")
    return Caller(agent, known)


def _authorization(scope: Any) -> str:
    """The request's first Authorization header, read from the ASGI scope (whose header names
    are lower case) without building Litestar's Headers for it."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return value.decode("latin-1")
    return ""


CALLER = "switchboard.caller"  # the request scope's key for its Caller


async def authenticate(request: Request) -> None:
    """before_request of the agent API's routes: the request's Caller, kept in its scope
    (401 without a valid token, before the body is read)."""
    request.scope[CALLER] = await require_agent(request)  # type: ignore[literal-required]


def caller_of(request: Request) -> Caller:
    """The Caller `authenticate` found for this request."""
    return request.scope[CALLER]  # type: ignore[literal-required]
