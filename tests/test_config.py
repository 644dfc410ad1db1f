"""The settings (dashboard/config.py): what docs/configuration.md lists is what is declared,
defaults included, and a value that cannot be used stops a command with a usage error
naming the variable (exit status 2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dashboard.cli import main
from dashboard.config import BadSetting, Settings, declared
from tests.conftest import ROOT

TABLE_ROW = re.compile(r"^\| `([A-Z_]+)` \| ([^|]*) \|", re.M)
# Read by other means: the --host and --port defaults (argparse), and where running servers
# record themselves (the XDG base directory convention, dashboard/instances.py).
NOT_SETTINGS = {"HOST", "PORT", "XDG_STATE_HOME"}


def documented() -> dict[str, str]:
    """Each variable of the configuration table → its default column."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    return {name: default.strip() for name, default in TABLE_ROW.findall(text)}


def shown(default: object) -> str:
    if isinstance(default, tuple):
        return ",".join(default)
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def test_the_configuration_table_lists_every_setting_and_nothing_else():
    assert set(documented()) - NOT_SETTINGS == set(declared())


@pytest.mark.parametrize("name", sorted(declared()))
def test_the_table_gives_each_settings_default(name):
    default, column = declared()[name], documented()[name]
    if default is None:
        assert column.startswith("unset"), column
    else:
        assert column == f"`{shown(default)}`"


def test_with_nothing_set_every_default_parses():
    assert Settings.from_environ({}) == Settings()
    assert Settings.from_environ({}).given == frozenset()


def test_what_is_set_is_used_and_remembered_as_given():
    settings = Settings.from_environ(
        {"SWITCHBOARD_RETENTION_DAYS": " 2.5 ", "SWITCHBOARD_LOG_FORMAT": "JSON", "SWITCHBOARD_METRICS": ""}
    )
    assert (settings.retention_days, settings.log_format, settings.metrics) == (2.5, "json", None)
    assert settings.given == {"SWITCHBOARD_RETENTION_DAYS", "SWITCHBOARD_LOG_FORMAT"}


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SWITCHBOARD_RETENTION_DAYS", "a week", "'a week' is not a number of days"),  # malformed
        ("SWITCHBOARD_RETENTION_DAYS", "-1", "'-1': must be above 0"),  # would prune every finished todo
        ("SWITCHBOARD_RETENTION_DAYS", "0", "'0': must be above 0"),
        ("SWITCHBOARD_RETENTION_DAYS", "inf", "'inf': must be above 0"),
        ("SWITCHBOARD_INBOX_LEASE", "86400", "'86400': must be from 1 to 43200"),  # out of range
        ("SWITCHBOARD_MAX_WAITS_PER_TOKEN", "1.5", "'1.5' is not a whole number"),
        ("SWITCHBOARD_LOG_FORMAT", "yaml", "'yaml' is not one of text, json"),  # not a word allowed
        ("SWITCHBOARD_METRICS", "opne", "'opne' is not one of open"),
        (
            "SWITCHBOARD_PUBLIC_URL",
            "queue.example.com",
            "'queue.example.com': must start with https:// or http://",
        ),
        (
            "SWITCHBOARD_SECRET_KEY",
            "short",
            "must be at least 32 characters, not 5",
        ),  # a secret is not repeated
        ("SWITCHBOARD_TRUSTED_PROXIES", "*", "'*' would let any client choose its own address"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_the_value_and_what_is_allowed(name, value, says):
    with pytest.raises(BadSetting) as refused:
        Settings.from_environ({name: value})
    assert str(refused.value).startswith(f"{name}: {says}")


def test_every_command_stops_with_status_2_on_a_bad_setting(monkeypatch, capsys):
    """Before it opens a database or parses anything else: `migrate` here has none to open."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("SWITCHBOARD_RETENTION_DAYS", "-7")
    for argv in (
        ["migrate"],
        ["reap", "--once"],
        ["token", "list"],
        ["worker", "--queue", "q", "--exec", "true"],
    ):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == "switchboard: SWITCHBOARD_RETENTION_DAYS: '-7': must be above 0\n"


@pytest.mark.parametrize("command", [["reap"], ["up"], ["serve"]])
def test_the_real_command_exits_2_naming_a_malformed_retention(command):
    done = subprocess.run(
        [sys.executable, "-m", "dashboard.cli", *command],
        env={**os.environ, "SWITCHBOARD_RETENTION_DAYS": "seven"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == "switchboard: SWITCHBOARD_RETENTION_DAYS: 'seven' is not a number of days\n"
