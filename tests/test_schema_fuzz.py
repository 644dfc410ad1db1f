"""Schemathesis fuzzes the live server's agent API from the OpenAPI schema it serves.

One bounded run (module fixture) sends generated requests — valid ones and, per
operation, deliberately invalid ones — to every operation with a valid bearer token,
and runs each check on every response separately, so each test below judges one
property of the whole run:

- no request makes the server fail (not_a_server_error);
- every response body matches the schema documented for its status (response_schema_conformance);
- every status code answered is documented (status_code_conformance);
- every content type answered is documented (content_type_conformance).

Generation is derandomized, so a run sends the same requests every time: a failing
check fails every run. Valid requests get the token's queue names (generated names
would all be refused with 403 and the deeper code would never run), a `wait` of at most
half a second (so a claim cannot block for a minute), and a third pass per todo-id
operation aims at todos that exist. The SSE channel is left out: its 200 never ends.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from dashboard import db as dbmod
from dashboard.accounts import Accounts
from dashboard.models import ACTOR_KINDS
from dashboard.store import Store
from tests.conftest import run
from tests.factories import enqueue

SCHEMA_PATH = "/api/v1/docs/openapi.json"
QUEUES = ["fuzz", "fuzz.b"]
MAX_EXAMPLES = 25
KNOWN_ID_EXAMPLES = 10
CHECKS = (not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance)


@dataclass
class FuzzRun:
    requests: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    failures: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    operations: set[str] = field(default_factory=set)

    def report(self, check: str, limit: int = 6) -> str:
        seen, lines = set(), []
        for text in self.failures[check]:
            key = text.split("\n", 1)[0]
            if key not in seen:
                seen.add(key)
                lines.append(text)
        return f"{len(self.failures[check])} failing responses; distinct:\n\n" + "\n\n".join(lines[:limit])


# -- the schema, the token, some todos -----------------------------------------------------


def served_schema(base: str, headers: dict) -> httpx.Response:
    return httpx.get(base + SCHEMA_PATH, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def fuzz_setup(live_server):
    """A token on the live server for QUEUES, and todos there: (headers, pending id, claimed id)."""
    _, dsn = live_server

    async def setup():
        conn = await dbmod.connect(dsn)
        try:
            _, secret = await Accounts(conn).add_token("fuzzer", QUEUES)
            store = Store(conn)
            await enqueue(store, "fuzz", "to claim")
            claimed = await store.claim_next(["fuzz"], "fuzzer", 3600)
            pending = await enqueue(store, "fuzz", "to claim by id")
            return {"Authorization": f"Bearer {secret}"}, pending.id, claimed.id
        finally:
            await conn.close()

    return run(setup())


def aim_at_token_queues(body):
    """Point a valid body's queue names at the token's queues; cap `wait`."""
    if isinstance(body, dict):
        if isinstance(body.get("queue"), str):
            body["queue"] = QUEUES[0]
        if isinstance(body.get("queues"), list):
            body["queues"] = QUEUES[: max(1, min(len(body["queues"]), 2))]
        wait = body.get("wait")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.5:
            body["wait"] = 0.5 if wait <= 60 else wait
        for value in body.values():
            aim_at_token_queues(value)
    elif isinstance(body, list):
        for value in body:
            aim_at_token_queues(value)


@pytest.fixture(scope="module")
def fuzz_run(live_server, fuzz_setup) -> FuzzRun:
    base, _ = live_server
    headers, pending_id, claimed_id = fuzz_setup
    result = FuzzRun()
    schema = schemathesis.openapi.from_url(base + SCHEMA_PATH, headers=headers, timeout=30)

    def exercise(operation, mode: GenerationMode, examples: int, **fixed) -> None:
        @given(case=operation.as_strategy(generation_mode=mode, **fixed))
        @settings(
            max_examples=examples,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        def send(case):
            if mode is GenerationMode.POSITIVE:
                aim_at_token_queues(case.body)
                if case.query and isinstance(case.query.get("wait"), int | float):  # GET /todos/{id}
                    case.query["wait"] = min(case.query["wait"], 0.5)
            response = case.call(base_url=base, headers=headers, timeout=15)
            result.requests += 1
            result.statuses[(operation.label, response.status_code)] += 1
            for check in CHECKS:
                try:
                    case.validate_response(response, checks=[check], headers=headers)
                except* Exception as group:
                    detail = "; ".join(str(e).strip() for e in group.exceptions)
                    body = response.text[:300] if response.text else ""
                    result.failures[check.__name__].append(
                        f"{operation.label} -> {response.status_code} "
                        f"{response.headers.get('content-type')}\n    {detail[:500]}\n    body: {body}\n"
                        f"    request: {case.body!r:.300} path={case.path_parameters} "
                        f"query={case.query}"
                    )

        try:
            send()
        except Unsatisfiable:  # e.g. no invalid string exists for a plain string path id
            return
        result.operations.add(operation.label)

    for found in schema.get_all_operations():
        operation = found.ok()
        if operation.path.endswith("/channels"):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            exercise(operation, mode, MAX_EXAMPLES)
        if "{todo_id}" in operation.path:  # a todo that exists: claimable, or held by the fuzzer
            todo_id = pending_id if operation.path.endswith("/claim") else claimed_id
            exercise(
                operation, GenerationMode.POSITIVE, KNOWN_ID_EXAMPLES, path_parameters={"todo_id": todo_id}
            )
    return result


# -- the tests ---------------------------------------------------------------------------


def test_the_openapi_schema_is_served(live_server, fuzz_setup):
    base, _ = live_server
    response = served_schema(base, fuzz_setup[0])
    assert response.status_code == 200, response.text
    paths = response.json()["paths"]
    assert {"/api/v1/claims", "/api/v1/todos", "/api/v1/todos/{todo_id}/complete"} <= set(paths)
    entry = response.json()["components"]["schemas"]["HistoryEntry"]
    assert {"actor_kind", "actor"} <= set(entry["required"])
    assert entry["properties"]["actor_kind"]["enum"] == list(ACTOR_KINDS)


def test_the_fuzz_run_reached_every_operation_and_got_past_validation(fuzz_run):
    assert len(fuzz_run.operations) >= 10, fuzz_run.operations
    assert fuzz_run.requests >= 400
    successes = {label for (label, status), n in fuzz_run.statuses.items() if status in (200, 201)}
    assert {
        "POST /api/v1/todos",
        "POST /api/v1/claims",
        "GET /api/v1/todos",
        "GET /api/v1/todos/{todo_id}",
    } <= successes, sorted(fuzz_run.statuses.items())


def test_no_request_makes_the_server_fail(fuzz_run):
    assert not fuzz_run.failures["not_a_server_error"], fuzz_run.report("not_a_server_error")
    assert not [k for k in fuzz_run.statuses if k[1] >= 500], fuzz_run.statuses


def test_every_response_body_matches_the_schema_documented_for_its_status(fuzz_run):
    check = "response_schema_conformance"
    assert not fuzz_run.failures[check], fuzz_run.report(check)


def test_every_status_code_answered_is_documented(fuzz_run):
    check = "status_code_conformance"
    assert not fuzz_run.failures[check], fuzz_run.report(check)


def test_every_content_type_answered_is_documented(fuzz_run):
    check = "content_type_conformance"
    assert not fuzz_run.failures[check], fuzz_run.report(check)
