"""The calendar's clock of the CLI and the server (interfaces/clock, c.Portable.now)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jupyter_portable.core.errors import UsageError
from jupyter_portable.interfaces.clock import Clock, clock_from

START = datetime(2027, 3, 1, 9, 20, tzinfo=timezone.utc)


def test_a_set_clock_starts_at_its_instant_and_runs_at_the_walls_rate() -> None:
    ticks = [100.0]
    clock = Clock(START, monotonic=lambda: ticks[0], wall=lambda: datetime(1999, 1, 1, tzinfo=timezone.utc))
    assert clock() == START and clock.set
    ticks[0] += 90.5
    assert clock() == START + timedelta(seconds=90.5)


def test_no_setting_is_the_wall_clock() -> None:
    wall = datetime(2026, 12, 3, 5, 0, tzinfo=timezone.utc)
    clock = Clock(wall=lambda: wall)
    assert clock() == wall and not clock.set
    assert not clock_from("").set and not clock_from(None).set


@pytest.mark.parametrize("text", ["tomorrow", "2027-03-01T09:20", "2027-13-01T00:00Z", "x" * 100])
def test_a_start_that_is_not_an_instant_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(UsageError, match="c.Portable.now"):
        clock_from(text)


def test_the_setting_is_checked_when_read_and_its_environment_variable_sets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.interfaces.config import Portable

    monkeypatch.setenv("JUPYTER_PORTABLE_NOW", "2027-03-01T09:20:00Z")
    assert Portable().clock()().replace(microsecond=0) >= START
    monkeypatch.setenv("JUPYTER_PORTABLE_NOW", "next tuesday")
    with pytest.raises(UsageError, match="not an ISO 8601 time"):
        Portable()
