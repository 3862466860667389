"""Times as the project writes and reads them: ISO 8601 in UTC with a trailing ``Z``.

``now_iso`` and ``utcnow`` are the wall-clock reads of the edges that stamp a record, and the
default of a ``now=`` or ``clock=``; logic takes ``now`` as an argument and never calls them.
Parsing is strict where a naive time would be a guess (``parse_iso``) and lenient where a
record written elsewhere may lack a zone (``parse_iso_or_none`` reads it as UTC).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from jupyter_portable.core.errors import UsageError


def utcnow() -> datetime:
    """The current time in UTC: the default of every ``clock=`` and ``now=``."""
    return datetime.now(timezone.utc)


def to_iso(when: datetime, timespec: str = "milliseconds") -> str:
    """``when`` in UTC as ISO 8601 with a ``Z``; a naive ``when`` is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


def now_iso(timespec: str = "milliseconds") -> str:
    """Now, as :func:`to_iso` writes it."""
    return to_iso(utcnow(), timespec)


def from_timestamp_iso(ts: float, timespec: str = "seconds") -> str:
    """Seconds since the epoch as :func:`to_iso` writes them."""
    return to_iso(datetime.fromtimestamp(ts, timezone.utc), timespec)


def _fromiso(text: str) -> datetime:
    # Python 3.10 does not read a trailing "Z"
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


# A time read from input keeps a year's margin from datetime's ends, so that any arithmetic on it
# (a charge 2 h before, a slot 14 days long, a year ahead) stays in range instead of an OverflowError.
MARGIN = timedelta(days=366 * 2)
EARLIEST = datetime.min.replace(tzinfo=timezone.utc) + MARGIN
LATEST = datetime.max.replace(tzinfo=timezone.utc) - MARGIN


def parse_iso(value: object, what: str = "time", *, error: type[Exception] = UsageError) -> datetime:
    """``value`` (an ISO 8601 string with a zone) in UTC; ``error`` with a one-line reason otherwise,
    a time within two years of year 1 or year 9999 among them (date arithmetic on it would overflow)."""
    if not isinstance(value, str) or len(value) > 64:
        raise error(f"{what} must be an ISO 8601 time, got {value!r}")
    try:
        when = _fromiso(value)
    except ValueError as exc:
        raise error(f"{what} {value!r} is not an ISO 8601 time like 2026-12-01T09:00Z") from exc
    if when.tzinfo is None or when.utcoffset() is None:
        raise error(f"{what} {value!r} has no time zone: it must be timezone-aware (a trailing Z for UTC)")
    try:
        when = when.astimezone(timezone.utc)
    except OverflowError:  # an offset that moves year 1 or 9999 out of range
        when = EARLIEST - MARGIN if when.year < 5000 else LATEST + MARGIN
    if not EARLIEST <= when <= LATEST:
        raise error(f"{what} {value!r} is out of range: give a time between the years {EARLIEST.year + 1} and "
                    f"{LATEST.year - 1}, such as 2026-12-01T09:00Z")
    return when


def parse_iso_or_none(value: object) -> datetime | None:
    """A recorded time, read leniently: None when missing or unreadable, UTC when it has no zone."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        when = _fromiso(value)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


__all__ = ["from_timestamp_iso", "now_iso", "parse_iso", "parse_iso_or_none", "to_iso", "utcnow"]
