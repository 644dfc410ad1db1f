"""Errors become responses here, in one place: problem details (RFC 9457) for the API and
JSON callers, a page (or an htmx fragment) for browsers. Never a stack trace."""

from __future__ import annotations

import json
import logging
import re

import asyncpg
from litestar import MediaType, Request, Response
from litestar.exceptions import ClientException, HTTPException, NotAuthorizedException, SerializationException
from litestar.exceptions import ValidationException as LitestarValidation
from litestar.response import Template
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from litestar.types import Empty
from litestar.utils.scope.state import ScopeState

from dashboard.errors import (
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    NotAllowed,
    NotFound,
    OutOfScope,
    Revoked,
    SwitchboardError,
    TooLarge,
)
from dashboard.models import SURROGATE_MESSAGE, surrogate_path
from dashboard.web.auth import LoginRequired, to_login

log = logging.getLogger("switchboard.web")
PROBLEM = "application/problem+json"
RETRY_AFTER = 2  # seconds, on a 503 for a database that is away or read-only

_STATUS = [
    (NotFound, 404),
    (Revoked, 401),
    (OutOfScope, 403),
    (NotAllowed, 403),
    (Conflict, 409),
    (TooLarge, 413),
    (InvalidInput, 422),
    # PostgreSQL refused a value (class 22, "data exception"): the caller's input.
    (asyncpg.DataError, 422),
    (DatabaseUnavailable, 503),
    (RecursionError, 400),
]  # JSON nested deeper than the decoder goes
_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Content too large",
    422: "Invalid input",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


def status_of(exc: Exception) -> int:
    if isinstance(exc, LitestarValidation) and _unknown_field(exc):
        return 422  # well-formed JSON naming a field we do not take: invalid input, as out of bounds
    if _undecodable(exc):
        return 400
    if isinstance(exc, HTTPException):
        return exc.status_code
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return HTTP_500_INTERNAL_SERVER_ERROR


def detail_of(exc: Exception, status: int) -> tuple[str, dict]:
    """The human sentence, and extra members (the offending field, the todo's state)."""
    if status >= 500 and not isinstance(exc, SwitchboardError):
        return "the server failed to handle this request; it has been logged", {}
    if isinstance(exc, InvalidInput):
        return str(exc), {"field": exc.field}
    if isinstance(exc, DatabaseUnavailable):
        return exc.public, {}
    if isinstance(exc, Conflict):
        return str(exc), {**{k: v for k, v in exc.current.items() if v is not None}, **problem_type(exc)}
    if isinstance(exc, LitestarValidation):
        extra = [e for e in (exc.extra if isinstance(exc.extra, list) else []) if isinstance(e, dict)]
        keys = [None if e.get("key") == "data" else e.get("key") for e in extra]  # "data": the whole body
        fields = [k for k in keys if k]
        messages = [f"{k or 'body'}: {e.get('message')}" for k, e in zip(keys, extra, strict=True)]
        return ("; ".join(messages) or exc.detail), ({"field": fields[0]} if fields else {})
    if isinstance(exc, HTTPException):
        return exc.detail, {}
    if isinstance(exc, RecursionError):
        return "the JSON is nested too deeply (arrays and objects inside each other)", {}
    if _undecodable(exc):
        return "a part of this form is not text in the character set it names (send UTF-8)", {}
    if isinstance(exc, asyncpg.DataError):  # the input checks should have caught it first
        return f"a value in this request cannot be stored or searched for ({exc})", {}
    return str(exc), {}


def _undecodable(exc: Exception) -> bool:
    """A multipart form part that is not text in its charset, or names no charset Python
    knows (the codec lookup's own LookupError, not a KeyError)."""
    return isinstance(exc, UnicodeDecodeError) or (type(exc) is LookupError and "encoding" in str(exc))


def _unknown_field(exc: LitestarValidation) -> bool:
    extra = exc.extra if isinstance(exc.extra, list) else []
    return any("unknown field" in str(e.get("message")) for e in extra if isinstance(e, dict))


def wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return request.url.path.startswith(("/api/", "/mcp")) or ("json" in accept and "html" not in accept)


def problem_body(status: int, detail: str, **extra) -> dict:
    """RFC 9457 problem details: of a response, or of one item of a batch (POST /acks)."""
    body = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status, "detail": detail}
    return {**body, **extra}


def problem_of(exc: Exception) -> dict:
    status = status_of(exc)
    detail, extra = detail_of(exc, status)
    return problem_body(status, detail, **extra)


def problem_type(exc: Exception) -> dict:
    """A `type` member for errors that have their own (a cancelled todo's Conflict)."""
    kind = getattr(exc, "problem_type", None)
    return {"type": kind} if kind else {}


def problem(status: int, detail: str, headers: dict | None = None, **extra) -> Response:
    """An RFC 9457 problem details response."""
    body = problem_body(status, detail, **extra)
    return Response(body, status_code=status, media_type=PROBLEM, headers=headers)


_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")  # its escape, or its UTF-8 bytes


def located(request: Request, exc: Exception) -> Exception:
    """A JSON body msgspec could not decode because it holds a lone surrogate ("\\ud800",
    which msgspec reports as "Input data was truncated", or a bad pair): the field that
    holds it, found by Python's decoder, which takes one."""
    if not isinstance(exc, ClientException) or not isinstance(exc.__cause__, SerializationException):
        return exc
    body = ScopeState.from_scope(request.scope).body
    if body is Empty or not _SURROGATE_BYTES.search(body):
        return exc  # decode again only a body that may hold one
    try:
        path = surrogate_path(json.loads(body))
    except (ValueError, RecursionError):
        return exc
    return exc if path is None else InvalidInput(path, SURROGATE_MESSAGE)


def handle(request: Request, exc: Exception) -> Response:
    if isinstance(exc, LoginRequired) and not wants_json(request):
        return to_login(request)
    exc = located(request, exc)
    status = status_of(exc)
    if isinstance(exc, DatabaseUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    elif status >= 500:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    detail, extra = detail_of(exc, status)
    headers = {"Cache-Control": "no-store"}  # it may repeat what was sent (a payload, a name)
    if isinstance(exc, HTTPException) and exc.headers:
        headers.update(exc.headers)
    if isinstance(exc, DatabaseUnavailable):
        headers["Retry-After"] = str(RETRY_AFTER)
    if isinstance(exc, NotAuthorizedException | Revoked) and request.url.path.startswith("/api/"):
        headers["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    if wants_json(request):
        return problem(status, detail, headers, **extra)
    template = "error.html"
    if request.headers.get("hx-request"):  # show it in the page's message area
        template = "partials/error.html"
        headers.update({"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"})
    return Template(
        template,
        context={
            "status": status,
            "title": _TITLES.get(status, "Error"),
            "detail": detail,
            "operator": request.scope.get("operator"),  # the page's menu is the operator's own
        },
        status_code=status,
        media_type=MediaType.HTML,
        headers=headers,
    )


EXCEPTION_HANDLERS = {Exception: handle, HTTPException: handle}
