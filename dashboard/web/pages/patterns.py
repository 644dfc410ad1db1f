"""The patterns page (/patterns): every UI piece on one page, so styling stays consistent
(linked from the README only)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from litestar import Request, get
from litestar.response import Template

from dashboard.models import Problems, check_queue, check_text
from dashboard.web.responses import page


def sample_errors() -> dict[str, str]:
    """The patterns page's form errors, made by the real checks."""
    problems = Problems()
    problems.check(check_queue, "Bad Queue")
    problems.check(check_text, "", "title", required=True)
    return problems.fields


@get("/patterns")
async def patterns_page(request: Request) -> Template:
    now = datetime.now(UTC)
    return page(
        request,
        "patterns.html",
        read_at=now,
        retry_at=now + timedelta(seconds=42),
        values={"queue": "Bad Queue", "title": ""},
        errors=sample_errors(),
    )


ROUTES = [patterns_page]
