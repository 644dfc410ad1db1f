from dashboard.models import NewTodo


async def test_create_and_claim(store):
    created = await store.create(NewTodo(queue="a", title="t"))
    todo = await store.claim_next(["a"], "w", 30)
    assert todo.id == created.todo.id
