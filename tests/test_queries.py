"""The loader of sql/queries: statements, named parameters, and fragments included."""

from __future__ import annotations

import re

import pytest

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
