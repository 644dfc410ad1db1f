"""Named SQL statements loaded from sql/queries/*.sql (`-- name: x` starts statement x)."""

from __future__ import annotations

import re
from pathlib import Path

QUERIES_DIR = Path(__file__).resolve().parent.parent / "sql" / "queries"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(filename: str) -> dict[str, str]:
    text = (QUERIES_DIR / filename).read_text()
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


TRANSITIONS = load("transitions.sql")
READS = load("reads.sql")
