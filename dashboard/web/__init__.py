"""The Litestar app: operator dashboard (HTML + htmx) and the agent API (/api/v1)."""
