"""The agent API under /api/v1 (DESIGN.md, "Agent API"). The bearer token decides the
agent's name — the owner of every claim, heartbeat and ack — and the queues it may use."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.di import Provide
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example
from litestar.params import Parameter, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from dashboard.accounts import Agent
from dashboard.errors import InvalidInput
from dashboard.models import MAX_LEASE, Created, NewTodo, Todo, check_queues, check_ttl
from dashboard.reads import LIST_STATES, MAX_PAGE, Reads, TodoFilter
from dashboard.store import Store
from dashboard.web.auth import may_use, require_agent
from dashboard.web.errors import PROBLEM

MAX_WAIT = 60.0
POLL_FALLBACK = 5.0  # a waiting claim re-checks this often even when no hint arrives
CHANNEL_KEEPALIVE = 15.0


Lease = Annotated[int, msgspec.Meta(ge=0, le=MAX_LEASE, description="the lease token the claim returned")]


class Problem(msgspec.Struct):
    """RFC 9457 problem details; `field` names the offending input when there is one."""

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None


def _problem(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=Problem, media_type=PROBLEM, description=description)


_BAD_INPUT = {
    400: _problem("Malformed JSON or a value of the wrong type"),
    401: _problem("No valid bearer token (missing, unknown or revoked)"),
    403: _problem("The token does not cover the queue"),
    413: _problem("The body, a payload or a result is over its size limit"),
    422: _problem("A value out of bounds (ttl, max_attempts, queue name, wait…)"),
}
ON_TODO = {**_BAD_INPUT, 404: _problem("No todo with that id"),
           409: _problem("The todo's state, owner or lease does not allow it (says which)")}


class TodoOut(Todo, kw_only=True):
    """A todo; `lease` is the token to present while it is claimed (null otherwise)."""

    lease: int | None = None


def out(todo: Todo | None) -> TodoOut | None:
    if todo is None:
        return None
    fields = msgspec.structs.asdict(todo)
    return TodoOut(**fields, lease=todo.lease_token if todo.state == "claimed" else None)


class CreatedOut(msgspec.Struct):
    todo: TodoOut
    created: bool


def created_out(c: Created) -> CreatedOut:
    return CreatedOut(todo=out(c.todo), created=c.created)


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    todos: list[NewTodo]


class BatchOut(msgspec.Struct):
    results: list[CreatedOut]


class ClaimIn(msgspec.Struct, forbid_unknown_fields=True):
    queues: list[str]
    ttl: float = 30
    wait: float = 0


class ClaimByIdIn(msgspec.Struct, forbid_unknown_fields=True):
    ttl: float = 30


class HeartbeatIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    ttl: float = 30


class ReleaseIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease


class NextIn(msgspec.Struct, forbid_unknown_fields=True):
    queues: list[str]
    ttl: float = 30


class CompleteIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    result: dict[str, Any] | None = None
    next: NextIn | None = None


class CompleteOut(msgspec.Struct):
    todo: TodoOut
    next: TodoOut | None = None


class FailIn(msgspec.Struct, forbid_unknown_fields=True):
    lease: Lease
    error: str


class FailOut(msgspec.Struct):
    todo: TodoOut
    will_retry: bool
    retry_at: datetime | None
    dead_lettered: bool


class HistoryEntry(msgspec.Struct):
    at: datetime
    from_state: str | None
    to_state: str
    actor: str
    attempt: int
    note: str | None


class TodoDetailOut(msgspec.Struct):
    todo: TodoOut
    history: list[HistoryEntry]
    event: dict[str, Any] | None


class TodoPage(msgspec.Struct):
    items: list[TodoOut]
    next: str | None


# -- long-poll -----------------------------------------------------------------------

async def claim_waiting(
    store: Store, hub, queues: list[str], owner: str, ttl: float, wait: float
) -> Todo | None:
    """Claim now, or wait up to `wait` seconds for a hint (re-checking every few seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    with hub.subscribe(queues) as sub:  # subscribed before the first try: no lost wake-up
        while True:
            todo = await store.claim_next(queues, owner, ttl)
            remaining = deadline - loop.time()
            if todo is not None or remaining <= 0:
                return todo
            await sub.wait(min(remaining, POLL_FALLBACK))
            sub.take()


# -- routes --------------------------------------------------------------------------

@post("/todos", status_code=HTTP_201_CREATED, summary="Create a todo",
      description="201 with the new todo; 200 with the live todo that already holds the "
                  "idempotency key (the duplicate is counted in its dedupe_hits).",
      responses={200: ResponseSpec(data_container=CreatedOut, description="The live todo that holds the key"),
                 **_BAD_INPUT})
async def create_todo(data: NewTodo, agent: Agent, store: Store) -> Response[CreatedOut]:
    may_use(agent, [data.queue])
    created = await store.create(data, actor=f"agent:{agent.name}")
    return Response(created_out(created), status_code=HTTP_201_CREATED if created.created else HTTP_200_OK)


@post("/todos/batch", status_code=HTTP_200_OK, summary="Create many todos in one request",
      responses=_BAD_INPUT)
async def create_batch(data: BatchIn, agent: Agent, store: Store) -> BatchOut:
    may_use(agent, {t.queue for t in data.todos})
    results = await store.create_many(data.todos, actor=f"agent:{agent.name}")
    return BatchOut(results=[created_out(c) for c in results])


@post("/claims", status_code=HTTP_200_OK, summary="Claim the next todo from a set of queues",
      description="With `wait` (seconds, up to 60) the request blocks until work arrives; "
                  "204 when none came in time.",
      responses={204: ResponseSpec(data_container=None, description="No todo came within `wait`"),
                 **_BAD_INPUT})
async def claim_next(request: Request, data: ClaimIn, agent: Agent, store: Store) -> Response[TodoOut | None]:
    queues = check_queues(data.queues)
    may_use(agent, queues)
    ttl = check_ttl(data.ttl)
    if not 0 <= data.wait <= MAX_WAIT:
        raise InvalidInput("wait", f"must be from 0 to {MAX_WAIT:.0f} seconds")
    todo = await claim_waiting(store, request.app.state.hub, queues, agent.name, ttl, data.wait)
    if todo is None:
        return Response(None, status_code=HTTP_204_NO_CONTENT)
    return Response(out(todo), status_code=HTTP_200_OK)


async def _todo_in_scope(reads: Reads, agent: Agent, todo_id: str) -> Todo:
    todo = await reads.todo(todo_id)
    may_use(agent, [todo.queue])
    return todo


@post("/todos/{todo_id:str}/claim", status_code=HTTP_200_OK, summary="Claim one todo by id",
      responses=ON_TODO)
async def claim(todo_id: str, data: ClaimByIdIn, agent: Agent, store: Store, reads: Reads) -> TodoOut:
    await _todo_in_scope(reads, agent, todo_id)
    return out(await store.claim(todo_id, agent.name, data.ttl))


@post("/todos/{todo_id:str}/heartbeat", status_code=HTTP_200_OK, summary="Extend the lease",
      responses=ON_TODO)
async def heartbeat(todo_id: str, data: HeartbeatIn, agent: Agent, store: Store) -> TodoOut:
    return out(await store.heartbeat(todo_id, agent.name, data.lease, data.ttl, scope=agent.queues))


@post("/todos/{todo_id:str}/release", status_code=HTTP_200_OK, summary="Give the todo back",
      responses=ON_TODO)
async def release(todo_id: str, data: ReleaseIn, agent: Agent, store: Store) -> TodoOut:
    return out(await store.release(todo_id, agent.name, data.lease, scope=agent.queues))


@post("/todos/{todo_id:str}/complete", status_code=HTTP_200_OK,
      summary="Complete the todo (and, with `next`, claim the next one in the same commit)",
      responses=ON_TODO)
async def complete(todo_id: str, data: CompleteIn, agent: Agent, store: Store) -> CompleteOut:
    if data.next is None:
        done = await store.complete(todo_id, agent.name, data.lease, data.result, scope=agent.queues)
        return CompleteOut(todo=out(done))
    queues = check_queues(data.next.queues)
    may_use(agent, queues)
    done, nxt = await store.complete_and_claim_next(
        todo_id, agent.name, data.lease, data.result, queues, data.next.ttl, scope=agent.queues)
    return CompleteOut(todo=out(done), next=out(nxt))


@post("/todos/{todo_id:str}/fail", status_code=HTTP_200_OK,
      summary="Fail this attempt: retried later below max_attempts, dead-lettered at the cap",
      responses=ON_TODO)
async def fail(todo_id: str, data: FailIn, agent: Agent, store: Store) -> FailOut:
    todo = await store.fail(todo_id, agent.name, data.lease, data.error, scope=agent.queues)
    return FailOut(todo=out(todo), will_retry=todo.state == "pending", retry_at=todo.next_retry_at,
                   dead_lettered=todo.state == "failed")


@get("/todos/{todo_id:str}", summary="One todo with its history", responses=ON_TODO)
async def get_todo(todo_id: str, agent: Agent, reads: Reads) -> TodoDetailOut:
    await _todo_in_scope(reads, agent, todo_id)
    detail = await reads.todo_detail(todo_id)
    return TodoDetailOut(
        todo=out(detail.todo),
        history=[HistoryEntry(**{k: h[k] for k in HistoryEntry.__struct_fields__}) for h in detail.history],
        event=detail.event,
    )


@get("/todos", summary="List todos, newest first (keyset-paginated with `after`)", responses=_BAD_INPUT)
async def list_todos(
    agent: Agent, reads: Reads,
    queue: str | None = None,
    state_filter: Annotated[
        str | None, QueryParameter(name="state", description=f"one of {', '.join(LIST_STATES)}")
    ] = None,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[str | None, Parameter(description="the `next` of the previous page")] = None,
) -> TodoPage:
    if queue:
        may_use(agent, [queue])
    filters = TodoFilter(queue=queue, queues=None if queue else agent.queues, state=state_filter)
    result = await reads.list_todos(filters, limit=limit, after=after)
    return TodoPage(items=[out(t) for t in result.items], next=result.next_cursor)


@get("/channels", summary="Server-Sent Events: a hint whenever work may be claimable",
     description="Events: `hint` (data: {\"queue\": …}), `resync` (hints may have been lost: "
                 "try to claim), and keepalive comments every 15 s.",
     responses=_BAD_INPUT)
async def channels(
    request: Request, agent: Agent,
    queues: Annotated[str | None, Parameter(description="comma-separated queue names (required)",
                                            examples=[Example(value="emails,reports")])] = None,
) -> ServerSentEvent:
    names = check_queues([q.strip() for q in (queues or "").split(",") if q.strip()])
    may_use(agent, names)
    hub = request.app.state.hub

    async def stream():
        with hub.subscribe(names) as sub:
            yield ServerSentEventMessage(event="resync", data="{}")  # start by claiming
            while True:
                if not await sub.wait(CHANNEL_KEEPALIVE):
                    yield ServerSentEventMessage(comment="keepalive")
                    continue
                hinted, resync = sub.take()
                if resync:
                    yield ServerSentEventMessage(event="resync", data="{}")
                for queue in sorted(hinted):
                    yield ServerSentEventMessage(event="hint", data=msgspec.json.encode({"queue": queue}))

    return ServerSentEvent(stream())


router = Router(
    "/api/v1",
    route_handlers=[create_todo, create_batch, claim_next, claim, heartbeat, release, complete,
                    fail, get_todo, list_todos, channels],
    dependencies={"agent": Provide(require_agent)},
    tags=["agents"],
)
