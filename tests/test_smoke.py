from dashboard.models import NewTodo
from tests.factories import agent_token, login


async def test_create_and_claim(store):
    created = await store.create(NewTodo(queue="a", title="t"))
    todo = await store.claim_next(["a"], "w", 30)
    assert todo.id == created.todo.id


async def test_logged_in_operator_sees_the_overview(client, pool):
    await login(client, pool)
    response = await client.get("/")
    assert response.status_code == 200
    assert "Queues" in response.text


async def test_agent_claims_over_http(client, pool, store):
    headers = await agent_token(pool, queues=["work"])
    await store.create(NewTodo(queue="work", title="t"))
    response = await client.post("/api/v1/claims", json={"queues": ["work"], "ttl": 30}, headers=headers)
    assert response.status_code == 200
    assert response.json()["owner"] == "bot"
