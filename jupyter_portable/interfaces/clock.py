"""The clock the CLI and the server pass to the logic as ``now=``.

It is the wall clock, unless ``c.Portable.now`` (environment: ``JUPYTER_PORTABLE_NOW``) names an
instant: then time starts there when the process starts and runs on at the wall's rate. A test
or a recorded demo books, lists and starts reservations at dates it chose, and never reads the
wall clock to place them. Only what the calendar decides (a booking's start within a year, a
reservation starting) goes by it; heartbeats, timeouts and stamps on records keep the real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from jupyter_portable.core.times import parse_iso, utcnow


class Clock:
    """``clock()`` is now: the wall's, or ``start`` plus the time since this clock was made."""

    def __init__(self, start: datetime | None = None, *, wall: Callable[[], datetime] = utcnow,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.start = start
        self._wall = wall
        self._monotonic = monotonic
        self._made = monotonic()

    def __call__(self) -> datetime:
        if self.start is None:
            return self._wall()
        return self.start + timedelta(seconds=self._monotonic() - self._made)

    @property
    def set(self) -> bool:
        """Whether a start was given (the calendar is not the wall's)."""
        return self.start is not None


def clock_from(text: str | None) -> Clock:
    """The clock a setting names: empty or None is the wall's; else an ISO 8601 instant with its zone."""
    if not text:
        return Clock()
    return Clock(parse_iso(text.strip(), "the clock's start (c.Portable.now, JUPYTER_PORTABLE_NOW)"))


__all__ = ["Clock", "clock_from"]
