"""The relative times the pages show."""

from __future__ import annotations

import pytest

from dashboard.durations import duration


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0.4, "<1s"), (59.6, "1m 0s"), (599.97, "10m"), (599.4, "9m 59s"), (3599.7, "1h 0m"), (90061, "1d")],
)
def test_durations_are_rounded_to_whole_seconds_before_they_are_split(seconds, shown):
    assert duration(seconds) == shown
