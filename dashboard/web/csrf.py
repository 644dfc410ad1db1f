"""CSRF protection for the dashboard, bound to the session.

A logged-in browser's token is an HMAC of its session id, so it changes at every login
and a token from one session (an attacker's own) is refused with another's cookie. Before
login (the login form) the token is a signed random value kept in a cookie and echoed in
the form (double submit). Either way the `csrftoken` cookie holds the current token,
for scripts and tests that post without reading a page.

The key comes from SWITCHBOARD_SECRET_KEY or the database (dashboard/web/app.py); tokens
made with the previous key (SWITCHBOARD_SECRET_KEY_OLD) are still accepted, so rotating
the key does not break forms already open. Browsers' own `Sec-Fetch-Site` header refuses
cross-site and sibling-subdomain posts before any token is compared.

It is mounted on the dashboard's routes only (the login page and the pages' router,
app.py): the agent API, /mcp (bearer tokens, no cookies), the probes, /metrics and the
static files never pass through it, so their requests pay nothing for it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from litestar import Request
from litestar.enums import RequestEncodingType, ScopeType
from litestar.exceptions import PermissionDeniedException
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from litestar.utils.scope.state import ScopeState

from dashboard.web.sessions import CSRF, SESSION, cookie, cookie_name

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
HEADER = "x-csrftoken"
FIELD = "_csrf_token"


def _mac(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()


def session_token(key: bytes, sid: str) -> str:
    return _mac(key, "session:" + sid)


def _anonymous_token(key: bytes) -> str:
    nonce = secrets.token_hex(16)
    return nonce + _mac(key, "anonymous:" + nonce)


def _valid_anonymous(keys: tuple[bytes, ...], token: str | None) -> bool:
    if not token or len(token) != 96:
        return False
    nonce, mac = token[:32], token[32:]
    return any(hmac.compare_digest(mac, _mac(key, "anonymous:" + nonce)) for key in keys)


class CSRFMiddleware(ASGIMiddleware):
    scopes = (ScopeType.HTTP,)
    exclude_opt_key = "exclude_from_csrf"

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        keys: tuple[bytes, ...] = scope["app"].state.csrf_keys
        request: Request = Request(scope, receive)
        sid = request.cookies.get(cookie_name(scope, SESSION))
        held = request.cookies.get(cookie_name(scope, CSRF))
        if request.method not in SAFE:
            await _check(request, keys, sid, held)
        if sid:
            token = session_token(keys[0], sid)
        else:
            token = held if _valid_anonymous(keys[:1], held) else _anonymous_token(keys[0])
        ScopeState.from_scope(scope).csrf_token = token
        if token == held:
            await next_app(scope, receive, send)
            return

        async def send_with_cookie(message: Message) -> None:
            # A handler that logs in or out sets the cookie itself (login.py).
            if message["type"] == "http.response.start" and "csrf_cookie_set" not in scope:
                message.setdefault("headers", [])
                message["headers"].append(
                    (b"set-cookie", cookie(scope, CSRF, token).to_header(header="").encode())
                )
            await send(message)

        await next_app(scope, receive, send_with_cookie)


async def _check(request: Request, keys: tuple[bytes, ...], sid: str | None, held: str | None) -> None:
    if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        raise PermissionDeniedException("CSRF check failed: the form came from another site")
    sent = request.headers.get(HEADER)
    if not sent and request.content_type[0] in (
        RequestEncodingType.URL_ENCODED,
        RequestEncodingType.MULTI_PART,
    ):
        sent = (await request.form()).get(FIELD)
    if not isinstance(sent, str) or not sent.isascii() or not sent:
        raise PermissionDeniedException("CSRF token missing: reload the page and try again")
    if sid:
        ok = any(hmac.compare_digest(sent, session_token(key, sid)) for key in keys)
    else:
        ok = held is not None and hmac.compare_digest(sent, held) and _valid_anonymous(keys, sent)
    if not ok:
        raise PermissionDeniedException("CSRF token verification failed: reload the page and try again")


def new_session_token(request: Request, sid: str | None) -> str:
    """The token for the session a login just started (or, with None, a fresh anonymous one
    after logout), for login.py to put in the cookie it sets."""
    keys: tuple[bytes, ...] = request.app.state.csrf_keys
    request.scope["csrf_cookie_set"] = True
    return session_token(keys[0], sid) if sid else _anonymous_token(keys[0])
