"""Queue control from the command line: `switchboard queue pause|resume|paused`,
`switchboard todo cancel|run-now|edit` and `switchboard enqueue`'s scheduling options.

The CLI runs in process (dashboard.cli.main, as the `switchboard` script does) on a real
database through DATABASE_URL; what it printed is read back as JSON, and the database is
checked directly. A refused command prints one `switchboard: …` line, exits 2 and
changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from dashboard.cli import main
from dashboard.errors import Cancelled
from dashboard.store import Store
from tests.conftest import connected, run
from tests.factories import (
    claimed,
    db_now,
    dead_letter,
    empty_tables,
    enqueue,
    history,
    last_step,
    snapshot,
    todo_row,
)


@pytest.fixture
def cli_dsn(module_dsn, monkeypatch):
    """The module's database, emptied, as the CLI's DATABASE_URL."""
    with_db(module_dsn, lambda _store, conn: empty_tables(conn))
    monkeypatch.setenv("DATABASE_URL", module_dsn)
    return module_dsn


def with_db(dsn: str, fn: Callable[[Store, Any], Awaitable[Any]]) -> Any:
    """`fn(store, connection)` on the database, from the test's sync code; its result."""

    async def go():
        async with connected(dsn) as conn:
            return await fn(Store(conn), conn)

    return run(go())


def switchboard(capsys, *argv: str) -> tuple[int, str, str]:
    """`switchboard ARGV…` in process: (exit status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def ok(capsys, *argv: str) -> Any:
    """A command that must succeed; the JSON it printed."""
    status, out, err = switchboard(capsys, *argv)
    assert status == 0, (argv, err)
    return json.loads(out)


def refused(capsys, *argv: str) -> str:
    """A command that must be refused: exit 2, nothing on stdout, one clear line on stderr."""
    status, out, err = switchboard(capsys, *argv)
    assert status == 2, (argv, status, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("switchboard: ")]
    assert len(lines) == 1, err
    return lines[0]


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


# -- enqueue -----------------------------------------------------------------------------


def test_enqueue_with_priority_and_delay(cli_dsn, capsys):
    before = with_db(cli_dsn, lambda _s, conn: db_now(conn))
    made = ok(capsys, "enqueue", "mail", "send it", "--priority", "5", "--delay", "600")
    todo = made["todo"]
    assert made["created"] is True and todo["priority"] == 5
    stored = with_db(cli_dsn, lambda _s, conn: todo_row(conn, todo["id"]))
    assert stored.priority == 5
    assert before + timedelta(seconds=600) <= stored.ready_at <= before + timedelta(seconds=660)
    # scheduled: not claimable yet
    assert with_db(cli_dsn, lambda store, _c: store.claim_batch(["mail"], "w1", 30, 1)) == []


def test_enqueue_with_run_at_and_an_assignee_until(cli_dsn, capsys):
    now = with_db(cli_dsn, lambda _s, conn: db_now(conn)).replace(microsecond=0)
    run_at, until = now + timedelta(hours=2), now + timedelta(hours=3)
    todo = ok(
        capsys,
        *("enqueue", "mail", "later", "--run-at", run_at.isoformat()),
        *("--assignee", "olga", "--assignee-until", until.isoformat()),
    )["todo"]
    stored = with_db(cli_dsn, lambda _s, conn: todo_row(conn, todo["id"]))
    assert (stored.ready_at, stored.assignee, stored.assignee_until) == (run_at, "olga", until)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--priority", "11"), "priority: must be a whole number from -10 to 10"),
        (("--priority", "high"), "priority: must be a whole number from -10 to 10"),
        (("--delay", "-1"), "delay: must be a number of seconds"),
        (("--delay", "soon"), "delay: must be a number of seconds"),
        (("--run-at", "tomorrow"), "run_at: 'tomorrow' is not a time"),
        (("--run-at", "2026-12-24T18:00:00"), "run_at: must say its time zone"),
        (("--run-at", "2026-12-24T18:00:00Z", "--delay", "5"), "run_at: give run_at or delay, not both"),
        (("--assignee-until", "2026-12-24T18:00:00Z"), "assignee_until: needs an assignee"),
    ],
)
def test_enqueue_with_a_bad_value_exits_2_saying_what_is_wrong(cli_dsn, capsys, argv, says):
    message = refused(capsys, "enqueue", "mail", "t", *argv)
    assert message.startswith(f"switchboard: {says}"), message
    assert with_db(cli_dsn, lambda _s, conn: conn.fetchval("SELECT count(*) FROM todos")) == 0


# -- queue pause, resume, paused ----------------------------------------------------------


def test_queue_pause_paused_and_resume(cli_dsn, capsys):
    paused = ok(capsys, "queue", "pause", "mail", "--reason", "smtp is down", "--as", "olga")
    assert (paused["queue"], paused["actor_kind"], paused["actor"], paused["reason"]) == (
        "mail",
        "operator",
        "olga",
        "smtp is down",
    )
    assert ok(capsys, "queue", "paused") == [paused]
    with_db(cli_dsn, lambda store, _c: enqueue(store, "mail"))
    assert with_db(cli_dsn, lambda store, _c: store.claim_batch(["mail"], "w1", 30, 1)) == []

    assert ok(capsys, "queue", "resume", "mail") == {"queue": "mail", "resumed": True}
    assert ok(capsys, "queue", "paused") == []
    assert ok(capsys, "queue", "resume", "mail") == {"queue": "mail", "resumed": False}
    assert len(with_db(cli_dsn, lambda store, _c: store.claim_batch(["mail"], "w1", 30, 1))) == 1
    rows = with_db(
        cli_dsn, lambda _s, conn: conn.fetch("SELECT action, actor_kind, actor, reason FROM queue_history")
    )
    assert sorted(tuple(r) for r in rows) == [
        ("paused", "operator", "olga", "smtp is down"),
        ("resumed", "operator", "cli", None),
    ]


def test_queue_pause_of_a_bad_name_exits_2(cli_dsn, capsys):
    assert "is not a queue name" in refused(capsys, "queue", "pause", "Not A Queue")
    assert "actor: is required" in refused(capsys, "queue", "pause", "mail", "--as", " ")
    assert ok(capsys, "queue", "paused") == []


# -- todo cancel, run-now, edit -----------------------------------------------------------


def test_todo_cancel_of_a_claimed_todo_stops_its_holder(cli_dsn, capsys):
    held = with_db(cli_dsn, lambda store, _c: claimed(store, "mail", owner="w1"))
    todo = ok(capsys, "todo", "cancel", held.id, "--reason", "sent by hand", "--as", "olga")
    assert (todo["state"], todo["cancelled_by_kind"], todo["cancelled_by"], todo["cancel_reason"]) == (
        "failed",
        "operator",
        "olga",
        "sent by hand",
    )
    assert with_db(cli_dsn, lambda _s, conn: last_step(conn, held.id)) == (
        "claimed",
        "failed",
        "operator",
        "olga",
        1,
        "cancelled: sent by hand",
    )
    with pytest.raises(Cancelled):
        with_db(cli_dsn, lambda store, _c: store.complete(held.id, "w1", held.lease_token, {"late": 1}))
    assert with_db(cli_dsn, lambda _s, conn: todo_row(conn, held.id)).result is None


def test_todo_cancel_of_a_done_or_unknown_todo_exits_2(cli_dsn, capsys):
    held = with_db(cli_dsn, lambda store, _c: claimed(store, "mail"))
    with_db(cli_dsn, lambda store, _c: store.complete(held.id, "w1", held.lease_token, None))
    before = with_db(cli_dsn, lambda _s, conn: snapshot(conn))
    assert "it is done" in refused(capsys, "todo", "cancel", held.id)
    assert refused(capsys, "todo", "cancel", "td_nope") == "switchboard: no todo td_nope"
    assert with_db(cli_dsn, lambda _s, conn: snapshot(conn)) == before


def test_todo_run_now_makes_a_scheduled_todo_claimable(cli_dsn, capsys):
    made = ok(capsys, "enqueue", "mail", "later", "--delay", "3600")["todo"]
    todo = ok(capsys, "todo", "run-now", made["id"])
    assert parse(todo["ready_at"]) <= with_db(cli_dsn, lambda _s, conn: db_now(conn))
    assert with_db(cli_dsn, lambda _s, conn: last_step(conn, made["id"]))[2:] == (
        "operator",
        "cli",
        0,
        "run now",
    )
    taken = with_db(cli_dsn, lambda store, _c: store.claim_batch(["mail"], "w1", 30, 1))
    assert [t.id for t in taken] == [made["id"]]
    assert "cannot run todo" in refused(capsys, "todo", "run-now", made["id"])  # claimed now


def test_todo_edit_changes_the_fields_given_and_records_them(cli_dsn, capsys):
    made = ok(capsys, "enqueue", "mail", "old", "--assignee", "olga", "--payload", '{"to": "a@b"}')["todo"]
    todo = ok(
        capsys,
        *("todo", "edit", made["id"], "--title", "new", "--priority", "3"),
        *("--payload", '{"to": "c@d"}', "--assignee", "", "--max-attempts", "7", "--as", "olga"),
    )
    assert (todo["title"], todo["priority"], todo["payload"], todo["assignee"], todo["max_attempts"]) == (
        "new",
        3,
        {"to": "c@d"},
        None,
        7,
    )
    changes = with_db(
        cli_dsn,
        lambda _s, conn: conn.fetchval(
            "SELECT changes FROM todo_history WHERE todo_id = $1 ORDER BY id DESC LIMIT 1", made["id"]
        ),
    )
    assert changes["title"] == ["old", "new"] and changes["priority"] == [0, 3]
    assert changes["assignee"] == ["olga", None] and changes["max_attempts"] == [5, 7]
    assert changes["payload"]["changed"] == {"to": ["a@b", "c@d"]}
    assert with_db(cli_dsn, lambda _s, conn: last_step(conn, made["id"])).actor == "olga"


def test_todo_edit_reschedules_with_run_at(cli_dsn, capsys):
    made = ok(capsys, "enqueue", "mail", "t")["todo"]
    when = (with_db(cli_dsn, lambda _s, conn: db_now(conn)) + timedelta(hours=1)).replace(microsecond=0)
    todo = ok(capsys, "todo", "edit", made["id"], "--run-at", when.isoformat())
    assert parse(todo["ready_at"]) == when


def test_todo_edit_with_retry_revives_a_dead_todo(cli_dsn, capsys):
    gone = with_db(cli_dsn, lambda store, conn: dead_letter(store, conn, "mail"))
    todo = ok(
        capsys, "todo", "edit", gone.id, "--payload", '{"fixed": true}', "--max-attempts", "3", "--retry"
    )
    assert (todo["state"], todo["attempt"], todo["max_attempts"], todo["payload"]) == (
        "pending",
        0,
        3,
        {"fixed": True},
    )
    steps = with_db(cli_dsn, lambda _s, conn: history(conn, gone.id))
    assert [(s.from_state, s.to_state, s.actor_kind) for s in steps[-2:]] == [
        ("failed", "pending", "operator"),
        ("pending", "pending", "operator"),
    ]


def test_refused_edits_exit_2_and_change_nothing(cli_dsn, capsys):
    held = with_db(cli_dsn, lambda store, _c: claimed(store, "mail", owner="w1"))
    pending = ok(capsys, "enqueue", "mail", "t")["todo"]
    before = with_db(cli_dsn, lambda _s, conn: snapshot(conn))
    assert "claimed by w1" in refused(capsys, "todo", "edit", held.id, "--title", "x")
    assert "priority: must be a whole number" in refused(
        capsys, "todo", "edit", pending["id"], "--priority", "x"
    )
    assert "payload: is not JSON" in refused(capsys, "todo", "edit", pending["id"], "--payload", "{nope")
    assert "payload: must be a JSON object" in refused(
        capsys, "todo", "edit", pending["id"], "--payload", "[1]"
    )
    assert "give at least one field" in refused(capsys, "todo", "edit", pending["id"])
    assert "cannot retry" in refused(capsys, "todo", "edit", pending["id"], "--title", "x", "--retry")
    assert with_db(cli_dsn, lambda _s, conn: snapshot(conn)) == before
