"""The agent API under /api/v1 (DESIGN.md, "Agent API"). The bearer token decides the
agent's name — the owner of every claim, heartbeat and ack — and its `Scope`, the queues
it may use, which the store checks on every call. The router's before_request hook
(auth.py's `authenticate`) finds the `Caller` — the agent and the services — before the body
is read, and each handler takes it from the request with `caller_of`: a dict lookup, where
Litestar's dependency injection cost more per request than the rest of the handler."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from litestar import Request, Response, Router, get, patch, post
from litestar.datastructures import ResponseHeader
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Example
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody, Parameter, QueryParameter
from litestar.response import ServerSentEvent
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from dashboard.errors import InvalidInput
from dashboard.models import (
    MAX_HTTP_BATCH,
    MAX_WAIT,
    Ack,
    Actor,
    NewTodo,
    QueuePause,
    Todo,
    TodoEdit,
    check_queues,
)
from dashboard.payload_search import check_payload
from dashboard.reads import (
    CHANGES_BYTES_SHOWN,
    HISTORY_PAGE_MAX,
    HISTORY_SHOWN,
    LIST_STATES,
    MAX_PAGE,
    HistoryPage,
    TodoFilter,
)
from dashboard.web.auth import Caller, authenticate, caller_of
from dashboard.web.errors import problem_of
from dashboard.web.live import channel_stream
from dashboard.web.long_requests import long_requests, of_token, release_held
from dashboard.web.presence import Presence, watching
from dashboard.web.schemas import (
    BAD_INPUT,
    ON_EDIT,
    ON_QUEUE,
    ON_TODO,
    AckOut,
    AcksIn,
    AcksOut,
    BatchIn,
    BatchOut,
    ClaimByIdIn,
    ClaimedOut,
    ClaimIn,
    CompleteIn,
    CompleteOut,
    CreatedOut,
    EmptyIn,
    FailIn,
    FailOut,
    HeartbeatIn,
    ReasonIn,
    ReleaseIn,
    ResumedOut,
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
async def create_todo(data: JSONBody[NewTodo], request: Request) -> Response[CreatedOut]:
    caller = caller_of(request)
    created = await caller.store.create(data, actor=Actor("agent", caller.name), scope=caller.scope)
    return Response(CreatedOut.of(created), status_code=HTTP_201_CREATED if created.created else HTTP_200_OK)


@post(
    "/todos/batch", status_code=HTTP_200_OK, summary="Create many todos in one request", responses=BAD_INPUT
)
async def create_batch(data: JSONBody[BatchIn], request: Request) -> BatchOut:
    caller = caller_of(request)
    actor = Actor("agent", caller.name)
    results = await caller.store.create_many(data.todos, actor=actor, scope=caller.scope)
    return BatchOut(results=[CreatedOut.of(c) for c in results])


@post(
    "/claims",
    status_code=HTTP_200_OK,
    summary="Claim the next todo (or, with `max`, up to `max` todos) from a set of queues",
    description="Claim order: the highest priority first, the longest ready first within it; paused "
    "queues are skipped. With `wait` (seconds, up to 60) the request blocks until work arrives. Without "
    '`max`: the todo, or 204 when none came in time. With `max` (1 to 100): `{"todos": [...]}`, in claim '
    "order, up to `max` of them, and `[]` when none came in time. A claim that waits is one of the "
    "token's long requests (waits, channels, MCP streams), at most SWITCHBOARD_MAX_WAITS_PER_TOKEN "
    "(100) open at once per server process: one more is a 429.",
    responses={
        204: ResponseSpec(data_container=None, description="No todo came within `wait` (without `max`)"),
        **BAD_INPUT,
    },
)
async def claim_next(data: JSONBody[ClaimIn], request: Request) -> Response[TodoOut | ClaimedOut | None]:
    caller = caller_of(request)
    n = 1 if data.max is None else data.max
    if isinstance(n, bool) or not 1 <= n <= MAX_HTTP_BATCH:
        raise InvalidInput("max", f"must be a whole number from 1 to {MAX_HTTP_BATCH}")
    agents = caller.services.agents
    if data.wait == 0:  # the busy agent's hot path: takes no slot, and nobody is watched (_long)
        todos = await agents.claim_waiting(
            caller.agent, data.queues, data.ttl, data.wait, n, presence=Presence()
        )
    else:
        async with _long(request, caller, waits=True) as presence:
            todos = await agents.claim_waiting(
                caller.agent, data.queues, data.ttl, data.wait, n, presence=presence
            )
    if data.max is not None:
        return Response(ClaimedOut(todos=[TodoOut.of(t) for t in todos]), status_code=HTTP_200_OK)
    if not todos:
        return Response(None, status_code=HTTP_204_NO_CONTENT)
    return Response(TodoOut.of(todos[0]), status_code=HTTP_200_OK)


@asynccontextmanager
async def _long(request: Request, caller: Caller, *, waits: bool) -> AsyncIterator[Presence]:
    """Around a request that may wait: one of the token's long requests (429 past the bound,
    long_requests.py) while it `waits`, and whether its client is still there."""
    with long_requests(request.scope).slot(of_token(caller.scope.token_id), waits=waits):
        async with watching(request.receive, waits=waits) as presence:
            yield presence


@post(
    "/acks",
    status_code=HTTP_200_OK,
    summary="Complete or fail many held todos in one request",
    description="Each ack is `{id, lease, complete: {result}}` or `{id, lease, fail: {error}}`. The "
    "answer has one result per ack, in order: `status` 200 with the todo, or the status and problem "
    "details the single-todo call would answer (409 for a stale lease, 404 for an unknown todo); one "
    "refused ack does not stop the others. Malformed input refuses the whole request (422), "
    "changing nothing.",
    responses=BAD_INPUT,
)
async def acks(data: JSONBody[AcksIn], request: Request) -> AcksOut:
    caller = caller_of(request)
    if not 1 <= len(data.acks) <= MAX_HTTP_BATCH:
        raise InvalidInput("acks", f"give 1 to {MAX_HTTP_BATCH} acks")
    items = []
    for i, ack in enumerate(data.acks):
        if (ack.complete is None) == (ack.fail is None):
            raise InvalidInput(f"acks[{i}]", "give exactly one of complete and fail")
        if ack.fail is not None:
            items.append(Ack(ack.id, ack.lease, error=ack.fail.error))
        else:
            items.append(Ack(ack.id, ack.lease, result=ack.complete.result))
    answers = await caller.store.ack_many(caller.name, items, scope=caller.scope)
    results = []
    for item, answer in zip(items, answers, strict=True):
        if isinstance(answer, Exception):
            body = problem_of(answer)
            results.append(AckOut(id=item.id, status=body["status"], problem=body))
        else:
            results.append(AckOut(id=item.id, status=HTTP_200_OK, todo=TodoOut.of(answer)))
    return AcksOut(results=results)


def _on_todo(action: str, **options: Any) -> Callable:
    """POST /todos/{todo_id}/<action>: a transition of one todo, answering it (200) or a problem."""
    return post(f"/todos/{{todo_id:str}}/{action}", status_code=HTTP_200_OK, responses=ON_TODO, **options)


@_on_todo("claim", summary="Claim one todo by id")
async def claim(todo_id: FromPath[str], data: JSONBody[ClaimByIdIn], request: Request) -> TodoOut:
    caller = caller_of(request)
    return TodoOut.of(await caller.store.claim(todo_id, caller.name, data.ttl, scope=caller.scope))


@_on_todo("heartbeat", summary="Extend the lease")
async def heartbeat(todo_id: FromPath[str], data: JSONBody[HeartbeatIn], request: Request) -> TodoOut:
    caller = caller_of(request)
    todo = await caller.store.heartbeat(todo_id, caller.name, data.lease, data.ttl, scope=caller.scope)
    return TodoOut.of(todo)


@_on_todo("release", summary="Give the todo back")
async def release(todo_id: FromPath[str], data: JSONBody[ReleaseIn], request: Request) -> TodoOut:
    caller = caller_of(request)
    return TodoOut.of(await caller.store.release(todo_id, caller.name, data.lease, scope=caller.scope))


@_on_todo("complete", summary="Complete the todo (and, with `next`, claim the next one in the same commit)")
async def complete(todo_id: FromPath[str], data: JSONBody[CompleteIn], request: Request) -> CompleteOut:
    caller = caller_of(request)
    if data.next is None:
        done = await caller.store.complete(todo_id, caller.name, data.lease, data.result, scope=caller.scope)
        return CompleteOut(todo=TodoOut.of(done))
    done, nxt = await caller.store.complete_and_claim_next(
        todo_id, caller.name, data.lease, data.result, data.next.queues, data.next.ttl, scope=caller.scope
    )
    return CompleteOut(todo=TodoOut.of(done), next=TodoOut.of(nxt))


@_on_todo("fail", summary="Fail this attempt: retried later below max_attempts, dead-lettered at the cap")
async def fail(todo_id: FromPath[str], data: JSONBody[FailIn], request: Request) -> FailOut:
    caller = caller_of(request)
    todo = await caller.store.fail(todo_id, caller.name, data.lease, data.error, scope=caller.scope)
    return FailOut.of(todo)


ETAG = ResponseHeader(
    name="ETag",
    documentation_only=True,
    value='"1764921600123456"',  # documents its type (a string); _tagged sets it
    description='The todo\'s version, a strong ETag ("1764921600123456"): send it in `If-Match` '
    "with an edit, so that it applies only to the todo as read.",
)


def _tagged(body, todo: Todo) -> Response:
    """`body`, with the todo's version as its ETag."""
    return Response(body, headers={"ETag": f'"{todo.version}"'})


@get(
    "/todos/{todo_id:str}",
    summary="One todo with its history (with `wait`: once it is finished)",
    description=f"With `wait` (seconds, up to {MAX_WAIT:.0f}) the request blocks until the todo is "
    "finished — `done` with its `result`, or `failed` (dead-lettered or cancelled) with its "
    "`last_error` — and answers it at once then, or after `wait` seconds as it is by then (look at "
    "`state`). A failed attempt that will be retried is pending again: the wait goes on. The "
    "`ETag` is the version of the todo answered: an edit sends it back in `If-Match`. A wait is one "
    "of the token's long requests (429 past the bound: see POST /claims).",
    responses=ON_TODO,
    response_headers=[ETAG],
)
async def get_todo(
    todo_id: FromPath[str],
    request: Request,
    wait: Annotated[
        str,
        QueryParameter(
            description="seconds to wait for the todo to finish (long-poll)",
            schema_extra={"type": "number", "minimum": 0, "maximum": MAX_WAIT, "default": 0},
        ),
    ] = "0",
) -> Response[TodoDetailOut]:
    caller = caller_of(request)
    seconds = _seconds(wait)
    async with _long(request, caller, waits=seconds != 0) as presence:
        detail = await caller.services.agents.wait_for(caller.agent, todo_id, seconds, presence=presence)
    return _tagged(TodoDetailOut.of(detail), detail.todo)


@get(
    "/todos/{todo_id:str}/history",
    summary="A todo's history, a page at a time (newest page first, steps oldest first in it)",
    description=f"A todo read shows its newest {HISTORY_SHOWN} steps; this pages back through the "
    "rest: pass `before`, the `id` of the oldest step you have. `older` says whether there are "
    f"steps before this page. An edit's `changes` over {CHANGES_BYTES_SHOWN // 1024} KiB of JSON "
    "are left out and `changes_bytes` gives their size.",
    responses=ON_TODO,
)
async def todo_history(
    todo_id: FromPath[str],
    request: Request,
    before: Annotated[int | None, Parameter(description="the `id` of a step: only steps before it")] = None,
    limit: Annotated[int, Parameter(ge=1, le=HISTORY_PAGE_MAX)] = HISTORY_SHOWN,
) -> HistoryPage:
    caller = caller_of(request)
    return await caller.services.reads.history(todo_id, before=before, limit=limit, scope=caller.scope)


def _seconds(text: str) -> float | str:
    """The query's `wait` as a number when it reads as one, else as given: taken as text, so
    that anything malformed is refused by the same check as a number out of bounds (422)."""
    try:
        return float(text)
    except ValueError:
        return text


@get(
    "/todos",
    summary="List todos, newest first (keyset-paginated with `after`)",
    description="Every filter given must match. `payload` is a JSON object the todo's payload "
    'contains (`{"customer": {"id": 42}}`); `search` is an id, an idempotency key or words of the '
    "title, or `key.path=value` terms that the payload must all match (`customer.id=42 "
    "order.status=paid`; a bare number also matches it as a string). A malformed one is a 422 "
    "naming it.",
    responses=BAD_INPUT,
)
async def list_todos(
    request: Request,
    queue: FromQuery[str | None] = None,
    state_filter: Annotated[
        str | None, QueryParameter(name="state", description=f"one of {', '.join(LIST_STATES)}")
    ] = None,
    assignee: FromQuery[str | None] = None,
    owner: FromQuery[str | None] = None,
    kind: FromQuery[str | None] = None,
    search: FromQuery[str | None] = None,
    payload: Annotated[
        str | None,
        Parameter(
            description="a JSON object the payload contains",
            examples=[Example(value='{"customer": {"id": 42}}')],
        ),
    ] = None,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = 50,
    after: Annotated[str | None, Parameter(description="the `next` of the previous page")] = None,
) -> TodoPage:
    caller = caller_of(request)
    filters = TodoFilter(
        queue=queue,
        state=state_filter,
        assignee=assignee,
        owner=owner,
        kind=kind,
        search=search,
        payload=None if payload is None else check_payload(payload),
    )
    page = await caller.services.agents.list_todos(caller.agent, filters, limit=limit, after=after)
    return TodoPage.of(page)


@get(
    "/channels",
    middleware=[release_held],
    summary="Server-Sent Events: a hint whenever work may be claimable",
    description='Events: `hint` (data: {"queue": …}), `resync` (hints may have been lost: '
    "try to claim), and keepalive comments every 15 s. The stream ends when the token is revoked. "
    "It is one of the token's long requests (429 past the bound: see POST /claims).",
    responses=BAD_INPUT,
)
async def channels(
    request: Request,
    queues: Annotated[
        str | None,
        Parameter(
            description="comma-separated queue names (required)", examples=[Example(value="emails,reports")]
        ),
    ] = None,
) -> ServerSentEvent:
    caller = caller_of(request)
    names = check_queues([q.strip() for q in (queues or "").split(",") if q.strip()])
    caller.scope.check(names)
    long_requests(request.scope).hold(request.scope, of_token(caller.scope.token_id))
    known = caller.services
    return ServerSentEvent(channel_stream(known.hub, known.accounts, names, caller.scope))


# -- queue control (DESIGN.md "Queue control"): within the token's queues, recorded as the agent


def _agent(caller: Caller) -> Actor:
    return Actor("agent", caller.name)


@post(
    "/queues/{queue:str}/pause",
    status_code=HTTP_200_OK,
    summary="Pause a queue: claims skip it until it is resumed",
    description="Claims from the queue (by id too: 409) stop until it is resumed; enqueue, "
    "heartbeats and acks go on, and todos already claimed stay claimed. Answers the pause: who "
    "paused it, when and why. Pausing a paused queue changes nothing and answers the first pause. "
    "The body (`reason`) may be left out.",
    responses=ON_QUEUE,
)
async def pause_queue(
    queue: FromPath[str], request: Request, data: JSONBody[ReasonIn | None] = None
) -> QueuePause:
    caller = caller_of(request)
    reason = data.reason if data else None
    return await caller.control.pause(queue, _agent(caller), reason, scope=caller.scope)


@post(
    "/queues/{queue:str}/resume",
    status_code=HTTP_200_OK,
    summary="Resume a paused queue: claims take from it again",
    description="Claimers waiting on the queue (long-poll claims, channels) are woken at once. "
    "`resumed` is false when the queue was not paused (nothing changed). The body (`reason`) "
    "may be left out.",
    responses=ON_QUEUE,
)
async def resume_queue(
    queue: FromPath[str], request: Request, data: JSONBody[ReasonIn | None] = None
) -> ResumedOut:
    caller = caller_of(request)
    reason = data.reason if data else None
    resumed = await caller.control.resume(queue, _agent(caller), reason, scope=caller.scope)
    return ResumedOut(queue=queue, resumed=resumed)


@_on_todo(
    "cancel",
    summary="Cancel a pending or claimed todo",
    description="The todo is dead-lettered (`failed`) as cancelled: `cancelled_at`, `cancelled_by` "
    "and `cancel_reason` say who, when and why. A claimed todo's holder gets a 409 with problem "
    "type `/problems/cancelled` at its next heartbeat, complete, fail or release, and nothing it "
    "sends is stored. A done or failed todo answers 409. It can be retried like any dead-letter. "
    "The body (`reason`) may be left out.",
)
async def cancel(todo_id: FromPath[str], request: Request, data: JSONBody[ReasonIn | None] = None) -> TodoOut:
    caller = caller_of(request)
    reason = data.reason if data else None
    return TodoOut.of(await caller.control.cancel(todo_id, _agent(caller), reason, scope=caller.scope))


@_on_todo(
    "run-now",
    summary="Make a scheduled or retrying todo claimable now",
    description="A pending todo waiting for its `run_at` or for its next retry becomes ready at "
    "once (its claimers are woken). A todo that is already ready, or not pending, answers 409. "
    "The body may be left out (or `{}`).",
)
async def run_now(todo_id: FromPath[str], request: Request, data: JSONBody[EmptyIn | None] = None) -> TodoOut:
    caller = caller_of(request)
    return TodoOut.of(await caller.control.run_now(todo_id, _agent(caller), scope=caller.scope))


IF_MATCH = re.compile(r'^(?:"([0-9]{1,18})"|\*)$')


def _if_match(header: str | None) -> str | None:
    """The version an If-Match names; None without one, or for `*` (any version)."""
    if header is None:
        return None
    match = IF_MATCH.match(header.strip())
    if match is None:
        raise InvalidInput(
            "If-Match",
            f"{header!r} is not an ETag of this API: send the one a GET or an edit of the todo "
            'answered, quotes included ("1764921600123456"), and only one',
        )
    return match[1]


@patch(
    "/todos/{todo_id:str}",
    status_code=HTTP_200_OK,
    summary="Edit a pending or dead todo (with `retry=true`: edit a dead todo and retry it)",
    description="Sets the fields given, leaving the others as they are: title, kind, payload "
    "(replaced whole), assignee, assignee_until, max_attempts, priority, and run_at (reschedules "
    "a pending todo). `kind`, `assignee` and `assignee_until` may be null to clear them. The "
    "idempotency key cannot be edited (400). A claimed or finished todo answers 409 (cancel or "
    "release it first). The history entry of the edit lists its `changes` (field: [old, new]; the "
    "payload as added, removed and changed keys). With `retry=true` a dead todo is retried with a "
    "fresh attempt budget and edited in one step: both or neither.\n\n"
    "`If-Match` with the `ETag` of a GET (or of an earlier edit) applies the edit only if the todo "
    "has not changed since: else 409 (as every refused guard, not 412), whose `changed_since` "
    "lists what changed it (who, when, what, newest last) and `version` is the todo's now. "
    "Without `If-Match` the fields given are written over the todo as it is: a client that shows "
    "a todo to a person and edits it later must send it.",
    responses=ON_EDIT,
    response_headers=[ETAG],
)
async def edit_todo(
    todo_id: FromPath[str],
    data: JSONBody[TodoEdit],
    request: Request,
    retry: Annotated[
        bool, QueryParameter(description="also retry the (dead) todo, in the same transaction")
    ] = False,
    if_match: Annotated[
        str | None,
        HeaderParameter(
            name="If-Match",
            required=False,
            description='the ETag the todo was read with ("1764921600123456"): refused with 409 if it '
            "changed since",
            schema_extra={"pattern": IF_MATCH.pattern},
        ),
    ] = None,
) -> Response[TodoOut]:
    caller = caller_of(request)
    version = _if_match(if_match)
    todo = await caller.control.edit(
        todo_id, _agent(caller), data, retry=retry, version=version, scope=caller.scope
    )
    return _tagged(TodoOut.of(todo), todo)


router = Router(
    "/api/v1",
    route_handlers=[
        create_todo,
        create_batch,
        claim_next,
        acks,
        claim,
        heartbeat,
        release,
        complete,
        fail,
        pause_queue,
        resume_queue,
        cancel,
        run_now,
        edit_todo,
        get_todo,
        todo_history,
        list_todos,
        channels,
    ],
    before_request=authenticate,
    security=[{"bearer": []}],  # the docs page's "Authorize" takes an agent token
    tags=["agents"],
)
