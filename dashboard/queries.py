"""Named SQL statements from sql/queries/*.sql.

`-- name: x` starts statement x. Parameters are written `:name` in the SQL and become
`$1…$n` in order of first appearance, so callers pass keywords and a reader of the .sql
file sees what every value is: `await SQL.claim_batch.fetch(db, owner=…, queues=…)`.
`::type` casts, string literals and comments are left alone.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from dashboard.db import connection

QUERIES_DIR = files("dashboard") / "sql" / "queries"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# Literals, quoted names, comments and casts are matched first so that only a bare
# `:name` is taken for a parameter.
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|--[^\n]*|::|:([a-z_][a-z0-9_]*)")


class Statement:
    """One named statement: its text with `$n` placeholders and the names they stand for."""

    __slots__ = ("name", "params", "sql")

    def __init__(self, name: str, text: str):
        params: list[str] = []

        def placeholder(match: re.Match) -> str:
            param = match.group(1)
            if param is None:
                return match.group(0)
            if param not in params:
                params.append(param)
            return f"${params.index(param) + 1}"

        self.name = name
        self.sql = _TOKEN.sub(placeholder, text)
        self.params = tuple(params)

    def args(self, values: dict[str, Any]) -> list[Any]:
        """The positional arguments for `values`, which must name every parameter, and only those."""
        if len(values) != len(self.params) or not all(p in values for p in self.params):
            missing = sorted(set(self.params) - set(values))
            unknown = sorted(set(values) - set(self.params))
            raise TypeError(f"{self.name}: missing {missing}, unknown {unknown}")
        return [values[p] for p in self.params]

    async def fetch(self, db, **values) -> list:
        return await self._run(db, "fetch", values)

    async def fetchrow(self, db, **values):
        return await self._run(db, "fetchrow", values)

    async def fetchval(self, db, **values):
        return await self._run(db, "fetchval", values)

    async def execute(self, db, **values) -> str:
        return await self._run(db, "execute", values)

    async def executemany(self, db, rows: list[dict[str, Any]]) -> None:
        """The statement once per row of values, pipelined in one round trip."""
        async with connection(db) as conn:
            await conn.executemany(self.sql, [self.args(row) for row in rows])

    async def _run(self, db, method: str, values: dict[str, Any]):
        """On a connection from db.connection(): a lost, starting or read-only server
        becomes DatabaseUnavailable, and the connection it broke is not reused."""
        args = self.args(values)
        async with connection(db) as conn:
            return await getattr(conn, method)(self.sql, *args)

    def __repr__(self) -> str:
        return f"<Statement {self.name}({', '.join(self.params)})>"


class Queries:
    """The statements of one .sql file, as attributes."""

    def __init__(self, filename: str):
        text = (QUERIES_DIR / filename).read_text()
        parts = _NAME.split(text)
        self._statements = {
            name: Statement(name, body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)
        }
        self.__dict__.update(self._statements)

    def __iter__(self):
        return iter(self._statements.values())

    def __getitem__(self, name: str) -> Statement:
        return self._statements[name]


TRANSITIONS = Queries("transitions.sql")
READS = Queries("reads.sql")
ACCOUNTS = Queries("accounts.sql")
HINTS = Queries("hints.sql")
MIGRATIONS = Queries("migrations.sql")
INBOX = Queries("inbox.sql")
