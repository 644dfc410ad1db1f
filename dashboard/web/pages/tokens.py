"""The tokens page (/tokens), operators only, viewing too: it names every agent and its
queues. Adding a token shows its secret once; revoking one ends it everywhere."""

from __future__ import annotations

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.exceptions import PermissionDeniedException
from litestar.params import FromPath
from litestar.response import Redirect, Template

from dashboard.accounts import Accounts
from dashboard.errors import Conflict, InvalidInput
from dashboard.reads import Reads
from dashboard.web.responses import page, redirect


def signed(request: Request) -> str:
    """The operator as api_tokens' created_by / revoked_by text records it."""
    return f"operator:{request.scope['operator'].name}"


async def tokens_view(
    request: Request,
    accounts: Accounts,
    *,
    new_secret: str | None = None,
    unknown: list[str] | None = None,
    values: dict | None = None,
    errors: dict | None = None,
    status: int = 200,
) -> Template:
    """The tokens page: right after `add` it shows the new secret (no cache keeps it: no
    dashboard page is kept, app.py), and the `unknown` queues it names (no todo there
    yet). A refused form comes back with its `values` and `errors`."""
    return page(
        request,
        "tokens.html",
        status=status,
        tokens=await accounts.list_tokens(),
        new_secret=new_secret,
        unknown=unknown or [],
        values=values or {},
        errors=errors or {},
    )


@get("/tokens")
async def tokens_page(request: Request, accounts: NamedDependency[Accounts]) -> Template:
    # Not a guard: guards run before require_login, which answers first when there is no
    # operator account at all.
    if not request.scope["operator"].can_change:
        raise PermissionDeniedException("the tokens page is for operators")
    return await tokens_view(request, accounts)


@post("/tokens")
async def add_token(
    request: Request, accounts: NamedDependency[Accounts], reads: NamedDependency[Reads]
) -> Template:
    """On a refusal the form keeps what was typed and marks every bad field. A queue no
    todo has been in yet is allowed (agents may be set up first) but named, in case of a typo."""
    form = await request.form()
    values = {f: form.get(f, "").strip() for f in ("agent", "queues")}
    queues = [q.strip() for q in values["queues"].split(",") if q.strip()]
    try:
        _, secret = await accounts.add_token(values["agent"], queues, actor=signed(request))
    except InvalidInput as exc:
        return await tokens_view(request, accounts, values=values, errors=exc.fields, status=422)
    except Conflict as exc:  # the name is an operator's
        errors = {"agent": f"is taken: {exc}"}
        return await tokens_view(request, accounts, values=values, errors=errors, status=409)
    return await tokens_view(request, accounts, new_secret=secret, unknown=await reads.unknown_queues(queues))


@post("/tokens/{token_id:str}/revoke")
async def revoke_token(
    request: Request, accounts: NamedDependency[Accounts], token_id: FromPath[str]
) -> Redirect:
    await accounts.revoke_token(token_id, actor=signed(request))
    return redirect(request, "/tokens", f"token {token_id} revoked")


ROUTES = [tokens_page, add_token, revoke_token]
