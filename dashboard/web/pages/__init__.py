"""The dashboard's pages, one module per resource, each holding its page, its htmx
partials (one context builder shared by both) and its form actions.

Who may do what is said here once, by the guards of two routers. Anyone logged in may
look (GET), and each page refuses query parameters it does not take (common.known_query);
only an operator may act (POST, auth.operators_only: a viewer gets 403). Guards run before
the dashboard's require_login (app.py): a caller with no session is sent to log in either
way. The tokens page alone is for operators only, by a check of its own (tokens.py)."""

from __future__ import annotations

from litestar import Router

from dashboard.web.auth import operators_only
from dashboard.web.pages import agents, create, dead, inbox, leases, overview, patterns, queues, todos, tokens
from dashboard.web.pages.common import known_query

HANDLERS = [
    handler
    for module in (overview, queues, todos, create, leases, agents, dead, inbox, tokens, patterns)
    for handler in module.ROUTES
]

ROUTES = [
    Router("/", route_handlers=[h for h in HANDLERS if "POST" not in h.http_methods], guards=[known_query]),
    Router("/", route_handlers=[h for h in HANDLERS if "POST" in h.http_methods], guards=[operators_only]),
]
