"""The loader of sql/queries: statements, named parameters, and fragments included."""

from __future__ import annotations

import json
import math
import re

import pytest

from dashboard.models import Todo
from dashboard.queries import FRAGMENTS, QUERIES_DIR, READS, TRANSITIONS, read_fragments, read_statements

FRAGMENTS_TEXT = """\
-- fragment: mine
-- Held by the caller (this comment stays in fragments.sql).
AND owner = :owner

-- fragment: held
WHERE state = 'claimed'
  -- include: mine
"""

STATEMENTS_TEXT = """\
-- name: release
UPDATE todos SET owner = NULL
    -- include: held
  AND id = :id
RETURNING id;
"""


def test_an_include_line_becomes_the_fragment_indented_as_the_line_and_numbered_with_the_statement():
    release = read_statements(STATEMENTS_TEXT, read_fragments(FRAGMENTS_TEXT), "test.sql")["release"]
    assert release.sql == (
        "UPDATE todos SET owner = NULL\n"
        "    WHERE state = 'claimed'\n"
        "      AND owner = $1\n"
        "  AND id = $2\n"
        "RETURNING id;"
    )
    assert release.params == ("owner", "id")


def test_an_unknown_fragment_is_refused_at_load_naming_it():
    with pytest.raises(ValueError, match=r"test\.sql, release: no fragment named 'held'"):
        read_statements(STATEMENTS_TEXT, {}, "test.sql")


def test_a_fragment_may_include_an_unknown_one_no_more_than_a_statement():
    with pytest.raises(ValueError, match=r"fragment held: no fragment named 'mine'"):
        read_fragments(FRAGMENTS_TEXT.replace("-- fragment: mine", "-- fragment: other"))


def test_a_fragment_that_includes_itself_is_refused():
    with pytest.raises(ValueError, match="fragment 'held' includes itself"):
        read_fragments(FRAGMENTS_TEXT.replace("-- include: mine", "-- include: held"))


def test_a_fragment_is_not_a_statement_and_a_statement_file_holds_no_fragments():
    with pytest.raises(ValueError, match="a fragment may not be a statement"):
        read_fragments(FRAGMENTS_TEXT + "\n-- name: release\nSELECT 1;\n")
    with pytest.raises(ValueError, match=r"fragments belong in fragments\.sql"):
        read_statements(STATEMENTS_TEXT + FRAGMENTS_TEXT, {}, "test.sql")


def test_an_include_names_one_fragment_on_a_line_of_its_own():
    with pytest.raises(ValueError, match="an include names one fragment"):
        read_statements(STATEMENTS_TEXT.replace("include: held", "include: held AND"), FRAGMENTS, "test.sql")


def _sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in QUERIES_DIR.iterdir() if path.name.endswith(".sql")}


def test_who_may_claim_is_written_once_and_every_claim_includes_it():
    written = {name: text.count("assignee_until <=") for name, text in _sources().items()}
    assert {name: n for name, n in written.items() if n} == {"fragments.sql": 1}
    claimable = FRAGMENTS["claimable"]
    for statement in (TRANSITIONS.claim, TRANSITIONS.claim_batch, TRANSITIONS.complete_and_claim_next):
        expanded = re.sub(r"\$\d+", ":owner", statement.sql)
        assert all(line.strip() in expanded for line in claimable.splitlines()), statement.name


def test_every_fragment_is_included_somewhere():
    included = set(re.findall(r"^\s*-- include: (\w+)\s*$", "\n".join(_sources().values()), re.MULTILINE))
    assert set(FRAGMENTS) == included


def test_list_todos_and_matching_ids_share_the_todo_filter():
    for statement in (READS.list_todos, READS.matching_ids):
        assert "OR payload @> ANY" in statement.sql, statement.name


def test_a_statement_takes_exactly_its_parameters_by_name_in_the_order_numbered():
    release = read_statements(STATEMENTS_TEXT, read_fragments(FRAGMENTS_TEXT), "t.sql")["release"]
    assert release.args({"id": "td_1", "owner": "w"}) == ["w", "td_1"]
    for wrong, said in (
        ({"owner": "w"}, r"missing \['id'\], unknown \[\]"),
        ({"owner": "w", "id": "td_1", "lease": 1}, r"missing \[\], unknown \['lease'\]"),
        ({"owner": "w", "ids": "td_1"}, r"missing \['id'\], unknown \['ids'\]"),
    ):
        with pytest.raises(TypeError, match=said):
            release.args(wrong)


JSONB_EDGES = [
    '{"n": 123456789012345678901234567890, "huge": 1.5e400, "tiny": 1e-400, "f": 0.1, "e": 1E+2}',
    '{"text": "é \\u00e9 \\ud83d\\ude00 \\" \\\\", "list": [null, true, false, {}, []], "neg": -0}',
    '{"a": 1, "a": 2}',
    '"just text"',
    "[1, 2.5]",
]


async def test_the_apps_connections_read_jsonb_as_json_loads_does_even_past_what_a_float_holds(conn):
    """jsonb is decoded by msgspec, falling back to json.loads for what msgspec refuses
    (a number beyond a float's range, which jsonb's numeric keeps): the same values."""
    for text in JSONB_EDGES:
        stored = await conn.fetchval("SELECT $1::text::jsonb::text", text)
        assert await conn.fetchval("SELECT $1::text::jsonb", text) == json.loads(stored), text
    # PostgreSQL writes numbers out in digits: one with a fraction past a float's range,
    # json.loads reads as infinity (msgspec refuses it), an integer as an int.
    huge = f'{{"huge": 1{"0" * 400}.5, "big": 1e400}}'
    assert await conn.fetchval("SELECT $1::text::jsonb", huge) == {"huge": math.inf, "big": 10**400}


async def test_a_todo_holds_every_column_of_todos_but_the_waiters_mark(conn):
    """Todo.from_record reads the Todo's fields from a row and ignores its other columns: a
    column added to todos must be added to Todo too, or it would be dropped unseen."""
    columns = await conn.fetch(
        "SELECT attname FROM pg_attribute"
        " WHERE attrelid = 'todos'::regclass AND attnum > 0 AND NOT attisdropped"
    )
    assert {c["attname"] for c in columns} - {"watched"} == set(Todo.__struct_fields__)
