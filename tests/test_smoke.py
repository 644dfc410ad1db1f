"""The fastest check that the stack stands: the store, the dashboard and the agent API."""

from tests.factories import agent_token, enqueue, login
from tests.web_helpers import get_page


async def test_create_and_claim(store):
    created = await enqueue(store, "a")
    todo = await store.claim_next(["a"], "w", 30)
    assert todo.id == created.id


async def test_logged_in_operator_sees_the_overview(client, pool):
    await login(client, pool)
    assert "Queues" in (await get_page(client, "/")).text


async def test_agent_claims_over_http(client, pool, store):
    headers = await agent_token(pool, queues=["work"])
    await enqueue(store, "work")
    response = await client.post("/api/v1/claims", json={"queues": ["work"], "ttl": 30}, headers=headers)
    assert response.status_code == 200
    assert response.json()["owner"] == "bot"


def test_the_app_builds_with_deprecation_warnings_as_errors():
    """Every dependency, path and query parameter and body is explicit (Litestar 3 makes the
    inferred forms errors)."""
    import warnings

    from dashboard.web.app import WebConfig, create_app

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        app = create_app("postgresql://localhost/unused", WebConfig(csrf_keys=(b"0" * 32,)))
        assert app.openapi_schema.paths  # the schema builds too
