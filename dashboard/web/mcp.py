"""The MCP server (DESIGN.md, "MCP"): the agent's verbs as MCP tools, for agents driven by a
language model.

Each tool makes the call the Agent API's handler makes (dashboard/web/api.py): the same
store call, or the same use-case (dashboard/agents.py), as the bearer token's agent within
its queues: the rules live there, once.
Inputs and outputs are msgspec structs, their JSON schemas derived by msgspec as the API's
OpenAPI is (the outputs are the API's own response bodies, web/schemas.py); a refused call
is a tool error (isError) carrying the API's problem details.

Served at /mcp by the web app (streamable HTTP, stateless, JSON answers: any web process
answers any call, like the API); `switchboard mcp` relays a local stdio client to it
(dashboard/mcp_proxy.py). MCP has no server-to-client push, so claiming is pull-only.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar import Request
from litestar.exceptions import NotAuthorizedException
from litestar.handlers import asgi
from litestar.types import Receive, Scope, Send
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    TextContent,
    Tool,
    ToolAnnotations,
)

from dashboard.agents import Presence, finished, token_check
from dashboard.errors import Cancelled, Conflict, DatabaseUnavailable, InvalidInput
from dashboard.mcp_proxy import PATH
from dashboard.models import MAX_WAIT, TTL_MAX, TTL_MIN, Actor, NewTodo
from dashboard.reads import LIST_STATES, MAX_PAGE, TodoFilter
from dashboard.web.auth import Caller, require_agent
from dashboard.web.errors import problem_of
from dashboard.web.long_requests import LongRequests, long_requests, of_token
from dashboard.web.mcp_requests import McpRequest
from dashboard.web.schemas import (
    CreatedOut,
    FailOut,
    Lease,
    TodoDetailOut,
    TodoOut,
    TodoPage,
)

log = logging.getLogger("switchboard.mcp")

CALLER = "switchboard.caller"  # the ASGI scope key the endpoint leaves the authenticated caller under

INSTRUCTIONS = """\
switchboard is a durable work queue: work items ("todos") wait in named queues until an \
agent claims one, does it and reports the outcome.

How to work a queue: call `claim` with your queues; do the work the todo describes; then \
`complete` it with a result, or `fail` it with an error (it is retried later, or \
dead-lettered after its last attempt), or `release` it to give it back untouched.

A claim gives you a lease: a time-limited hold on the todo (its `ttl`, in seconds), shown \
as `lease` (a number) and `lease_expires_at`. While the lease lasts no one else gets the \
todo. Pass the lease number to every call about that todo. Call `heartbeat` well before the \
lease runs out (every ttl/3 is good) for as long as you work; if it runs out, the todo goes \
back to the queue and another agent may take it.

Work is delivered at least once: a todo whose lease ran out is done again, by you or \
another agent, so make your work idempotent (doing it twice must be harmless; use the todo \
id as the key of anything you create).

A Conflict error on heartbeat, release, complete or fail means you no longer hold the todo: \
your lease ran out and a newer claim superseded it (fencing), or it was cancelled. Stop \
working on it and do not retry the call (nothing you send for it is stored); call `claim` \
for more work.

Nothing is pushed to you: when `claim` returns no todo, call it again later (pass `wait`, \
up to 60 s, to wait for work to arrive). `create_for` hands work to a person or another \
agent; `wait_for` waits for a todo to finish and returns its result."""

LEASE_LOST = (
    "You no longer hold this todo: your lease ran out and a newer claim superseded it (fencing), "
    "or its state changed. Stop working on it and do not retry this call: nothing you send for it "
    "is stored. Another attempt will do (or did) the work, which is why work must be idempotent. "
    "Call claim to get work again."
)
CANCELLED = "The todo was cancelled: stop working on it and do not retry; call claim for other work."


# -- inputs --------------------------------------------------------------------------------

TodoId = Annotated[str, msgspec.Meta(description="the todo's id (td_…)")]
Ttl = Annotated[
    float,
    msgspec.Meta(
        description=f"lease length in seconds ({TTL_MIN} to {TTL_MAX}); heartbeat before it runs out",
        extra_json_schema={"minimum": TTL_MIN, "maximum": TTL_MAX},
    ),
]
Seconds = Annotated[
    float,
    msgspec.Meta(
        description=f"seconds to wait at most (0 to {MAX_WAIT:.0f})",
        extra_json_schema={"minimum": 0, "maximum": MAX_WAIT},
    ),
]
DEFAULT_TTL = 300.0  # an agent that thinks between calls needs longer than the API's 30 s
Text = str | None


class Args(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A tool's arguments (unknown ones are refused, naming them)."""


class ListArgs(Args):
    queue: Annotated[Text, msgspec.Meta(description="only this queue; default: all your queues")] = None
    state: Annotated[Text, msgspec.Meta(description=f"one of {', '.join(LIST_STATES)}")] = None
    assignee: Annotated[Text, msgspec.Meta(description="the person or agent it is assigned to")] = None
    owner: Annotated[Text, msgspec.Meta(description="the agent holding (or that last held) it")] = None
    kind: Text = None
    search: Annotated[
        Text,
        msgspec.Meta(
            description="an id, an idempotency key, words of the title, or key.path=value terms the "
            "payload must all match (customer.id=42 order.status=paid)"
        ),
    ] = None
    payload: Annotated[
        dict[str, Any] | None,
        msgspec.Meta(description='an object the payload contains: {"customer": {"id": 42}}'),
    ] = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE, description="todos per page")] = 50
    cursor: Annotated[Text, msgspec.Meta(description="the `next` of the previous page")] = None


class ClaimArgs(Args):
    queues: Annotated[
        list[str] | None, msgspec.Meta(description="claim the next todo from these queues (or give id)")
    ] = None
    id: Annotated[Text, msgspec.Meta(description="claim this todo (instead of queues)")] = None
    ttl: Ttl = DEFAULT_TTL
    wait: Seconds = 0


class HeldArgs(Args):
    id: TodoId
    lease: Lease


class HeartbeatArgs(HeldArgs):
    ttl: Ttl = DEFAULT_TTL


class CompleteArgs(HeldArgs):
    result: Annotated[
        dict[str, Any] | None, msgspec.Meta(description="the outcome, a JSON object (up to 256 KiB)")
    ] = None


class FailArgs(HeldArgs):
    error: Annotated[str, msgspec.Meta(description="what went wrong, for the next attempt and the operators")]


class TodoArgs(Args):
    id: TodoId


class WaitArgs(TodoArgs):
    wait: Seconds = MAX_WAIT


class CreateArgs(NewTodo):
    """A todo to create, as POST /api/v1/todos takes it; a misspelt field is refused, not
    dropped (an `asignee` would leave the todo to anyone): NewTodo forbids unknown fields."""


# -- outputs (beside the API's own bodies) ---------------------------------------------------


class ClaimOut(msgspec.Struct):
    """The claimed todo with its `lease`, or null when no todo came within `wait`."""

    todo: TodoOut | None


class WaitOut(msgspec.Struct):
    """The todo now: `finished` is true when it is done (see `result`) or failed (see
    `last_error`), false when the wait ended first."""

    finished: bool
    todo: TodoOut


# -- the tools -------------------------------------------------------------------------------


@dataclass(slots=True)
class McpCaller(Caller):
    """An /mcp request's agent, with its request (mcp_requests.py) and the app's bound on
    long requests, for the tools that wait."""

    request: McpRequest
    long_requests: LongRequests

    @contextlib.contextmanager
    def waiting(self, *, waits: bool) -> Iterator[Presence]:
        """Around a call that may wait: one of the token's long requests while it `waits` (a
        tool error past the bound), and whether its client is still there."""
        with self.long_requests.slot(of_token(self.scope.token_id), waits=waits):
            yield self.request.watch_client() if waits else Presence()


async def list_todos(caller: Caller, a: ListArgs) -> TodoPage:
    filters = TodoFilter(
        queue=a.queue,
        state=a.state,
        assignee=a.assignee,
        owner=a.owner,
        kind=a.kind,
        search=a.search,
        payload=a.payload,
    )
    page = await caller.services.agents.list_todos(caller.agent, filters, limit=a.limit, after=a.cursor)
    return TodoPage.of(page)


async def claim(caller: McpCaller, a: ClaimArgs) -> ClaimOut:
    if (a.queues is None) == (a.id is None):
        raise InvalidInput("queues", "give either queues (claim the next todo) or id (claim that todo)")
    if a.id is not None:
        return ClaimOut(
            todo=TodoOut.of(await caller.store.claim(a.id, caller.name, a.ttl, scope=caller.scope))
        )
    with caller.waiting(waits=a.wait != 0) as presence:
        todos = await caller.services.agents.claim_waiting(
            caller.agent, a.queues, a.ttl, a.wait, presence=presence
        )
    return ClaimOut(todo=TodoOut.of(todos[0]) if todos else None)


async def heartbeat(caller: Caller, a: HeartbeatArgs) -> TodoOut:
    return TodoOut.of(await caller.store.heartbeat(a.id, caller.name, a.lease, a.ttl, scope=caller.scope))


async def release(caller: Caller, a: HeldArgs) -> TodoOut:
    return TodoOut.of(await caller.store.release(a.id, caller.name, a.lease, scope=caller.scope))


async def complete(caller: Caller, a: CompleteArgs) -> TodoOut:
    return TodoOut.of(await caller.store.complete(a.id, caller.name, a.lease, a.result, scope=caller.scope))


async def fail(caller: Caller, a: FailArgs) -> FailOut:
    return FailOut.of(await caller.store.fail(a.id, caller.name, a.lease, a.error, scope=caller.scope))


async def create_for(caller: Caller, a: CreateArgs) -> CreatedOut:
    created = await caller.store.create(a, actor=Actor("agent", caller.name), scope=caller.scope)
    return CreatedOut.of(created)


async def get_todo(caller: Caller, a: TodoArgs) -> TodoDetailOut:
    detail = await caller.services.reads.todo_detail(a.id, scope=caller.scope)
    return TodoDetailOut.of(detail)


async def wait_for(caller: McpCaller, a: WaitArgs) -> WaitOut:
    with caller.waiting(waits=a.wait != 0) as presence:
        detail = await caller.services.agents.wait_for(caller.agent, a.id, a.wait, presence=presence)
    return WaitOut(finished=finished(detail.todo), todo=TodoOut.of(detail.todo))


# -- what the model reads besides the JSON ----------------------------------------------------


def _claimed(out: ClaimOut) -> str | None:
    if out.todo is None:
        return "No todo came within the wait: nothing is claimed. Call claim again later."
    return (
        f"Claimed {out.todo.id} with lease {out.todo.lease} until {out.todo.lease_expires_at.isoformat()}: "
        "heartbeat before then, and pass the lease to heartbeat, complete, fail or release."
    )


def _created(out: CreatedOut) -> str | None:
    if out.created:
        return None
    return (
        f"Nothing new was created: the live todo {out.todo.id} already holds idempotency key "
        f"{out.todo.idempotency_key!r} (created=false); this is that todo."
    )


def _failed(out: FailOut) -> str:
    if out.dead_lettered:
        return "That was its last attempt: the todo is dead-lettered (failed) for an operator to look at."
    return f"It will be retried at {out.retry_at.isoformat()} (attempt {out.todo.attempt} failed)."


def _waited(out: WaitOut) -> str:
    if out.finished:
        return f"The todo is {out.todo.state}."
    return f"The todo is still {out.todo.state}: call wait_for again to keep waiting."


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type
    output: type
    run: Callable[[Caller, Any], Awaitable[Any]]
    annotations: ToolAnnotations
    holds_lease: bool = False  # a Conflict means the caller's lease is gone
    say: Callable[[Any], str | None] = lambda _: None


READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

SPECS = (
    ToolSpec(
        "list_todos",
        "List todos in your queues, newest first, filtered (every filter given must match). "
        "Returns a page of todos and `next`: pass it as `cursor` for the next page (null: no more). "
        "Listing does not claim anything.",
        ListArgs,
        TodoPage,
        list_todos,
        READS,
    ),
    ToolSpec(
        "claim",
        "Take a todo to work on, under a lease: the next one from `queues` (highest priority first, "
        "then longest waiting), or the todo `id`. The todo comes back with `lease` (pass it to "
        "heartbeat, complete, fail and release) and `lease_expires_at`: heartbeat before then or "
        "the todo goes back to the queue for another agent. Work is delivered at least once, so "
        "doing a todo twice must be harmless. Returns todo null when no work came within `wait` "
        "seconds (0 to 60): nothing is pushed to you, so call claim again later.",
        ClaimArgs,
        ClaimOut,
        claim,
        CHANGES,
        say=_claimed,
    ),
    ToolSpec(
        "heartbeat",
        "Extend the lease on a todo you hold to `ttl` seconds from now. Call it every ttl/3 or so "
        "while you work: a lease that runs out gives the todo to another agent. A Conflict means "
        "you no longer hold it (superseded or cancelled): stop working on it and claim again.",
        HeartbeatArgs,
        TodoOut,
        heartbeat,
        ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
        holds_lease=True,
    ),
    ToolSpec(
        "release",
        "Give a todo you hold back to its queue untouched, for someone else (the attempt still "
        "counts). Use it when you cannot do the work. A Conflict means you no longer held it.",
        HeldArgs,
        TodoOut,
        release,
        CHANGES,
        holds_lease=True,
    ),
    ToolSpec(
        "complete",
        "Finish a todo you hold, with its `result` (a JSON object the todo's creator reads). A "
        "Conflict means your lease was superseded (it ran out and the todo was claimed again, or "
        "it was cancelled): your result was not stored; do not retry, claim again.",
        CompleteArgs,
        TodoOut,
        complete,
        CHANGES,
        holds_lease=True,
    ),
    ToolSpec(
        "fail",
        "Report that this attempt at a todo you hold failed, with `error`. Below its max_attempts "
        "it is retried later (after a backoff), at the cap it is dead-lettered for an operator; the "
        "answer says which. A Conflict means you no longer held it.",
        FailArgs,
        FailOut,
        fail,
        CHANGES,
        holds_lease=True,
        say=_failed,
    ),
    ToolSpec(
        "create_for",
        "Create a todo in one of your queues: `queue` and `title`, with optional `payload` (a JSON "
        "object with the facts), `assignee` (the person or agent who must do it; only they may "
        "claim it), `priority` (-10 to 10, higher first), `kind`, `max_attempts`, `run_at` or "
        "`delay`, and `idempotency_key`. With a key that a live (not yet finished) todo already "
        "holds, nothing new is created: that todo is returned with created=false, so retrying a "
        "create is safe. Then use wait_for to wait for its result.",
        CreateArgs,
        CreatedOut,
        create_for,
        CHANGES,
        say=_created,
    ),
    ToolSpec(
        "get_todo",
        "One todo with its whole history: every step, when, by whom (agent or person), at which "
        "attempt, with notes such as errors.",
        TodoArgs,
        TodoDetailOut,
        get_todo,
        READS,
    ),
    ToolSpec(
        "wait_for",
        "Wait up to `wait` seconds (0 to 60) for a todo to finish. Returns as soon as it is done "
        "(its `result`) or failed (its `last_error`), with finished=true; or, when the time is up, "
        "the todo as it is then, with finished=false: call again to wait longer.",
        WaitArgs,
        WaitOut,
        wait_for,
        READS,
        say=_waited,
    ),
)
SPECS_BY_NAME = {spec.name: spec for spec in SPECS}


def json_schema(kind: type) -> dict[str, Any]:
    """`kind`'s JSON schema, self-contained: an object schema at the top (MCP's rule)."""
    (ref,), defs = msgspec.json.schema_components([kind])
    return _inlined(ref, defs)


def _inlined(node: Any, defs: dict[str, Any]) -> Any:
    """Each $ref replaced by what it names (no shape here contains itself), and a nullable
    value as one `type` list rather than anyOf: fewer tokens in the model's context, and
    quicker for a client to check each result against."""
    if isinstance(node, list):
        return [_inlined(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inlined(defs[node["$ref"].rsplit("/", 1)[1]], defs)
    node = {key: _inlined(value, defs) for key, value in node.items()}
    options = node.get("anyOf", [])
    if len(options) == 2 and NULL in options:
        (other,) = (option for option in options if option != NULL)
        if isinstance(other.get("type"), str):
            rest = {key: value for key, value in node.items() if key != "anyOf"}
            return {**rest, **other, "type": [other["type"], "null"]}
    return node


NULL = {"type": "null"}

TOOLS = ListToolsResult(
    tools=[
        Tool(
            name=spec.name,
            description=spec.description,
            input_schema=json_schema(spec.args),
            output_schema=json_schema(spec.output),
            annotations=spec.annotations,
        )
        for spec in SPECS
    ]
)
INPUT_SCHEMAS = {tool.name: tool.input_schema for tool in TOOLS.tools}


# -- the MCP handlers ---------------------------------------------------------------------------

_AT = re.compile(r" - at `\$\.?([^`]*)`$")


def _invalid(exc: msgspec.ValidationError) -> InvalidInput:
    """msgspec's "Expected `int`, got `str` - at `$.lease`" as the store's InvalidInput."""
    match = _AT.search(str(exc))
    field = match.group(1) if match and match.group(1) else "arguments"
    return InvalidInput(field, _AT.sub("", str(exc)))


def refused(exc: Exception, tool: str, holds_lease: bool = False) -> CallToolResult:
    """A tool error: the problem details the API would answer, and what to do next."""
    problem = problem_of(exc)
    if isinstance(exc, DatabaseUnavailable):
        log.warning("tool %s: %s", tool, exc)
    elif problem["status"] >= 500:
        log.error("tool %s failed", tool, exc_info=exc)
    text = f"{problem['title']} ({problem['status']}): {problem['detail']}"
    if isinstance(exc, Cancelled):
        text += "\n" + CANCELLED
    elif isinstance(exc, Conflict) and holds_lease:
        text += "\n" + LEASE_LOST
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=problem, is_error=True
    )


async def _list_tools(ctx: ServerRequestContext, params: object) -> ListToolsResult:
    return TOOLS


async def _call_tool(ctx: ServerRequestContext, params: CallToolRequestParams) -> CallToolResult:
    spec = SPECS_BY_NAME.get(params.name)
    if spec is None:
        known = ", ".join(SPECS_BY_NAME)
        return refused(InvalidInput("name", f"no tool {params.name!r}; the tools are {known}"), params.name)
    try:
        try:
            args = msgspec.convert(params.arguments or {}, spec.args)
        except msgspec.ValidationError as exc:
            raise _invalid(exc) from None
        out = await spec.run(ctx.request.scope[CALLER], args)
    except Exception as exc:
        return refused(exc, spec.name, spec.holds_lease)
    structured = msgspec.to_builtins(out)
    text = msgspec.json.encode(structured).decode()
    said = spec.say(out)
    return CallToolResult(
        content=[TextContent(type="text", text=f"{said}\n{text}" if said else text)],
        structured_content=structured,
    )


SERVER = Server(
    "switchboard",
    instructions=INSTRUCTIONS,
    get_tool_input_schema=INPUT_SCHEMAS.get,
    on_list_tools=_list_tools,
    on_call_tool=_call_tool,
)


# -- /mcp in the web app -------------------------------------------------------------------------


class McpEndpoint:
    """/mcp for one app: the SDK's streamable HTTP transport, stateless (no session to keep,
    so any web process answers any call) with JSON answers, behind the Agent API's bearer
    tokens. The app runs `lifespan` and routes `route`."""

    def __init__(self) -> None:
        self.sessions: StreamableHTTPSessionManager | None = None
        self.route = asgi(PATH, opt={"exclude_from_csrf": True}, copy_scope=False)(self._serve)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object) -> AsyncIterator[None]:
        """A session manager per run of the app (the SDK's runs once; tests start an app
        more than once)."""
        self.sessions = StreamableHTTPSessionManager(SERVER, json_response=True, stateless=True)
        async with self.sessions.run():
            yield

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The token's agent, as the API resolves it (401 without one), for the tools to act
        as; a GET (an event stream) is one of its long requests. The request lasts no longer
        than its token, and its waiting tools no longer than its client (mcp_requests.py)."""
        try:
            found = await require_agent(Request(scope, receive))
        except NotAuthorizedException as exc:
            exc.headers = {**(exc.headers or {}), "WWW-Authenticate": 'Bearer realm="switchboard"'}
            raise
        known, token = found.services, found.scope.token_id
        bound = long_requests(scope)
        with (
            bound.slot(of_token(token), waits=scope["method"] == "GET"),
            known.hub.subscribe((), token=token) as sub,
        ):
            request = McpRequest(receive, send, sub, token_check(known.accounts))
            scope[CALLER] = McpCaller(found.agent, known, request, bound)
            await request.run(self.sessions.handle_request, scope)
