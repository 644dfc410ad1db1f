"""The agent API under /api/v1 (DESIGN.md, "Agent API"). The bearer token decides the
agent's name — the owner of every claim, heartbeat and ack — and its `Scope`, the queues
it may use, which the store checks on every call."""

from __future__ import annotations

from typing import Annotated

from litestar import Response, Router, get, post
from litestar.di import NamedDependency, Provide
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example
from litestar.params import FromPath, FromQuery, JSONBody, Parameter, QueryParameter
from litestar.response import ServerSentEvent
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from dashboard.accounts import Accounts, Agent
from dashboard.models import Actor, NewTodo, check_queues
from dashboard.notify import Hub
from dashboard.reads import LIST_STATES, MAX_PAGE, Reads, TodoFilter
from dashboard.store import Store
from dashboard.web.auth import require_agent
from dashboard.web.live import channel_stream, claim_waiting
from dashboard.web.schemas import (
    BAD_INPUT,
    ON_TODO,
    BatchIn,
    BatchOut,
    ClaimByIdIn,
    ClaimIn,
    CompleteIn,
    CompleteOut,
    CreatedOut,
    FailIn,
    FailOut,
    HeartbeatIn,
    ReleaseIn,
    TodoDetailOut,
    TodoOut,
    TodoPage,
)


@post(
    "/todos",
    status_code=HTTP_201_CREATED,
    summary="Create a todo",
    description="201 with the new todo; 200 with the live todo that already holds the "
    "idempotency key (the duplicate is counted in its dedupe_hits).",
    responses={
        200: ResponseSpec(data_container=CreatedOut, description="The live todo that holds the key"),
        **BAD_INPUT,
    },
)
async def create_todo(
    data: JSONBody[NewTodo], agent: NamedDependency[Agent], store: NamedDependency[Store]
) -> Response[CreatedOut]:
    created = await store.create(data, actor=Actor("agent", agent.name), scope=agent.scope)
    return Response(CreatedOut.of(created), status_code=HTTP_201_CREATED if created.created else HTTP_200_OK)


@post(
    "/todos/batch", status_code=HTTP_200_OK, summary="Create many todos in one request", responses=BAD_INPUT
)
async def create_batch(
    data: JSONBody[BatchIn], agent: NamedDependency[Agent], store: NamedDependency[Store]
) -> BatchOut:
    results = await store.create_many(data.todos, actor=Actor("agent", agent.name), scope=agent.scope)
    return BatchOut(results=[CreatedOut.of(c) for c in results])


@post(
    "/claims",
    status_code=HTTP_200_OK,
    summary="Claim the next todo from a set of queues",
    description="With `wait` (seconds, up to 60) the request blocks until work arrives; "
    "204 when none came in time.",
    responses={204: ResponseSpec(data_container=None, description="No todo came within `wait`"), **BAD_INPUT},
)
async def claim_next(
    data: JSONBody[ClaimIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
    hub: NamedDependency[Hub],
    accounts: NamedDependency[Accounts],
) -> Response[TodoOut | None]:
    todo = await claim_waiting(
        store, hub, accounts, data.queues, agent.name, data.ttl, data.wait, agent.scope
    )
    if todo is None:
        return Response(None, status_code=HTTP_204_NO_CONTENT)
    return Response(TodoOut.of(todo), status_code=HTTP_200_OK)


@post(
    "/todos/{todo_id:str}/claim", status_code=HTTP_200_OK, summary="Claim one todo by id", responses=ON_TODO
)
async def claim(
    todo_id: FromPath[str],
    data: JSONBody[ClaimByIdIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
) -> TodoOut:
    return TodoOut.of(await store.claim(todo_id, agent.name, data.ttl, scope=agent.scope))


@post(
    "/todos/{todo_id:str}/heartbeat", status_code=HTTP_200_OK, summary="Extend the lease", responses=ON_TODO
)
async def heartbeat(
    todo_id: FromPath[str],
    data: JSONBody[HeartbeatIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
) -> TodoOut:
    return TodoOut.of(await store.heartbeat(todo_id, agent.name, data.lease, data.ttl, scope=agent.scope))


@post(
    "/todos/{todo_id:str}/release", status_code=HTTP_200_OK, summary="Give the todo back", responses=ON_TODO
)
async def release(
    todo_id: FromPath[str],
    data: JSONBody[ReleaseIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
) -> TodoOut:
    return TodoOut.of(await store.release(todo_id, agent.name, data.lease, scope=agent.scope))


@post(
    "/todos/{todo_id:str}/complete",
    status_code=HTTP_200_OK,
    summary="Complete the todo (and, with `next`, claim the next one in the same commit)",
    responses=ON_TODO,
)
async def complete(
    todo_id: FromPath[str],
    data: JSONBody[CompleteIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
) -> CompleteOut:
    if data.next is None:
        done = await store.complete(todo_id, agent.name, data.lease, data.result, scope=agent.scope)
        return CompleteOut(todo=TodoOut.of(done))
    done, nxt = await store.complete_and_claim_next(
        todo_id, agent.name, data.lease, data.result, data.next.queues, data.next.ttl, scope=agent.scope
    )
    return CompleteOut(todo=TodoOut.of(done), next=TodoOut.of(nxt))


@post(
    "/todos/{todo_id:str}/fail",
    status_code=HTTP_200_OK,
    summary="Fail this attempt: retried later below max_attempts, dead-lettered at the cap",
    responses=ON_TODO,
)
async def fail(
    todo_id: FromPath[str],
    data: JSONBody[FailIn],
    agent: NamedDependency[Agent],
    store: NamedDependency[Store],
) -> FailOut:
    return FailOut.of(await store.fail(todo_id, agent.name, data.lease, data.error, scope=agent.scope))


@get("/todos/{todo_id:str}", summary="One todo with its history", responses=ON_TODO)
async def get_todo(
    todo_id: FromPath[str], agent: NamedDependency[Agent], reads: NamedDependency[Reads]
) -> TodoDetailOut:
    detail = await reads.todo_detail(todo_id, scope=agent.scope)
    return TodoDetailOut(todo=TodoOut.of(detail.todo), history=detail.history, event=detail.event)


@get("/todos", summary="List todos, newest first (keyset-paginated with `after`)", responses=BAD_INPUT)
async def list_todos(
    agent: NamedDependency[Agent],
    reads: NamedDependency[Reads],
    queue: FromQuery[str | None] = None,
    state_filter: Annotated[
        str | None, QueryParameter(name="state", description=f"one of {', '.join(LIST_STATES)}")
    ] = None,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[str | None, Parameter(description="the `next` of the previous page")] = None,
) -> TodoPage:
    if queue:
        agent.scope.check([queue])
    filters = TodoFilter(queue=queue, queues=None if queue else agent.scope.queues, state=state_filter)
    result = await reads.list_todos(filters, limit=limit, after=after)
    return TodoPage(items=[TodoOut.of(t) for t in result.items], next=result.next_cursor)


@get(
    "/channels",
    summary="Server-Sent Events: a hint whenever work may be claimable",
    description='Events: `hint` (data: {"queue": …}), `resync` (hints may have been lost: '
    "try to claim), and keepalive comments every 15 s.",
    responses=BAD_INPUT,
)
async def channels(
    agent: NamedDependency[Agent],
    hub: NamedDependency[Hub],
    accounts: NamedDependency[Accounts],
    queues: Annotated[
        str | None,
        Parameter(
            description="comma-separated queue names (required)", examples=[Example(value="emails,reports")]
        ),
    ] = None,
) -> ServerSentEvent:
    names = check_queues([q.strip() for q in (queues or "").split(",") if q.strip()])
    agent.scope.check(names)
    return ServerSentEvent(channel_stream(hub, accounts, names, agent.scope))


router = Router(
    "/api/v1",
    route_handlers=[
        create_todo,
        create_batch,
        claim_next,
        claim,
        heartbeat,
        release,
        complete,
        fail,
        get_todo,
        list_todos,
        channels,
    ],
    dependencies={"agent": Provide(require_agent)},
    security=[{"bearer": []}],  # the docs page's "Authorize" takes an agent token
    tags=["agents"],
)
