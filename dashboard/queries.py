"""Named SQL statements from sql/queries/*.sql.

`-- name: x` starts statement x. Parameters are written `:name` in the SQL and become
`$1…$n` in order of first appearance, so callers pass keywords and a reader of the .sql
file sees what every value is: `await SQL.claim_batch.fetch(db, owner=…, queues=…)`.
`::type` casts, string literals and comments are left alone.

SQL that several statements share is written once, in sql/queries/fragments.sql, under
`-- fragment: x` (fragments are pieces, never statements). A line `-- include: x` in a
statement (or in another fragment) is replaced by fragment x, indented as that line,
when the files are loaded at import; its parameters are numbered with the statement's.
A name that no fragment has stops the import, naming it.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

from dashboard.db import connection, run

QUERIES_DIR = files("dashboard") / "sql" / "queries"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_FRAGMENT = re.compile(r"^-- fragment: (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^([ \t]*)--[ \t]*include:(.*)$")
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
        if len(values) == len(self.params):
            try:  # as many names as parameters, each one found: exactly the parameters
                return [values[p] for p in self.params]
            except KeyError:
                pass
        missing = sorted(set(self.params) - set(values))
        unknown = sorted(set(values) - set(self.params))
        raise TypeError(f"{self.name}: missing {missing}, unknown {unknown}")

    # Each runs on a connection as db.connection() gives it (db.run): a lost, starting or
    # read-only server becomes DatabaseUnavailable, and the connection it broke is not
    # reused. asyncpg prepares a text once per connection and reuses the prepared
    # statement (its statement cache, keyed by the text, which never varies here).

    async def fetch(self, db, **values) -> list:
        return await run(db, "fetch", self.sql, self.args(values))

    async def fetchrow(self, db, **values):
        return await run(db, "fetchrow", self.sql, self.args(values))

    async def fetchval(self, db, **values):
        return await run(db, "fetchval", self.sql, self.args(values))

    async def execute(self, db, **values) -> str:
        return await run(db, "execute", self.sql, self.args(values))

    async def executemany(self, db, rows: list[dict[str, Any]]) -> None:
        """The statement once per row of values, pipelined in one round trip."""
        async with connection(db) as conn:
            await conn.executemany(self.sql, [self.args(row) for row in rows])

    def __repr__(self) -> str:
        return f"<Statement {self.name}({', '.join(self.params)})>"


def read_fragments(text: str, source: str = "fragments.sql") -> dict[str, str]:
    """The fragments of `text`, by name, each with its own includes expanded. A fragment's
    leading comment (what it is, for the reader of the file) stays out of its text."""
    if _NAME.search(text):
        raise ValueError(f"{source}: a fragment may not be a statement (found `-- name:`)")
    written = {name: _without_leading_comments(body) for name, body in _sections(_FRAGMENT, text)}
    return {
        name: expand(body, written, f"{source}, fragment {name}", (name,)) for name, body in written.items()
    }


def read_statements(text: str, fragments: dict[str, str], source: str) -> dict[str, Statement]:
    """The statements of `text` by name, their includes replaced by `fragments`."""
    if _FRAGMENT.search(text):
        raise ValueError(f"{source}: fragments belong in fragments.sql (found `-- fragment:`)")
    return {
        name: Statement(name, expand(body, fragments, f"{source}, {name}").strip())
        for name, body in _sections(_NAME, text)
    }


def expand(text: str, fragments: dict[str, str], where: str, within: tuple[str, ...] = ()) -> str:
    """`text` with each `-- include: x` line replaced by fragment x (`within`: the
    fragments being expanded around it, which may not include themselves)."""
    lines = []
    for line in text.splitlines():
        match = _INCLUDE.match(line)
        if match is None:
            lines.append(line)
            continue
        indent, name = match.group(1), match.group(2).strip()
        if not name.isidentifier():
            raise ValueError(
                f"{where}: an include names one fragment, on a line of its own: {line.strip()!r}"
            )
        if name not in fragments:
            raise ValueError(f"{where}: no fragment named {name!r} in fragments.sql")
        if name in within:
            raise ValueError(f"{where}: fragment {name!r} includes itself")
        body = expand(fragments[name], fragments, where, (*within, name))
        lines.extend(indent + part if part else part for part in body.splitlines())
    return "\n".join(lines)


def _sections(header: re.Pattern, text: str) -> list[tuple[str, str]]:
    """(name, body) for each `header` line of `text` and what follows it up to the next."""
    parts = header.split(text)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _without_leading_comments(body: str) -> str:
    lines = body.strip().splitlines()
    while lines and lines[0].lstrip().startswith("--") and not _INCLUDE.match(lines[0]):
        lines.pop(0)
    return "\n".join(lines)


FRAGMENTS = read_fragments((QUERIES_DIR / "fragments.sql").read_text())


class Queries:
    """The statements of one .sql file, as attributes."""

    def __init__(self, filename: str):
        text = (QUERIES_DIR / filename).read_text()
        self._statements = read_statements(text, FRAGMENTS, filename)
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
