"""Helpers for the agent HTTP API's tests (/api/v1, DESIGN.md "Agent API"), in process.

The app and the tokens are conftest's fixtures `api_client`, `bot` (queues work and other)
and `rival` (queue work), for modules that say `pytestmark = ONE_DATABASE_PER_MODULE`.
"""

from __future__ import annotations

from datetime import datetime

API = "/api/v1"
PROBLEM = "application/problem+json"


def problem(response, status: int, *, field: str | None = None) -> dict:
    """Assert an RFC 9457 problem detail with this status (naming `field` if given)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert body["status"] == status
    assert isinstance(body["type"], str) and body["type"]
    assert isinstance(body["title"], str) and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    if field is not None:
        assert body.get("field") == field or field in body["detail"], body
    return body


async def create(client, headers, queue: str = "work", title: str = "t", **body) -> dict:
    response = await client.post(
        f"{API}/todos", json={"queue": queue, "title": title, **body}, headers=headers
    )
    assert response.status_code == 201, response.text
    return response.json()["todo"]


async def claim(client, headers, queues=("work",), ttl: float = 30) -> dict:
    response = await client.post(f"{API}/claims", json={"queues": list(queues), "ttl": ttl}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def batch(client, headers, todos: list[dict]):
    """POST todos/batch with these items; the response."""
    return await client.post(f"{API}/todos/batch", headers=headers, json={"todos": todos})


async def act(client, headers, held: dict, action: str, **body):
    """POST todos/{id}/{action} (heartbeat, release, complete, fail) with the held lease."""
    return await client.post(
        f"{API}/todos/{held['id']}/{action}", headers=headers, json={"lease": held["lease"], **body}
    )


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))
