"""Reservations as plain data: bookings, when they are charged, the calendar grid, cancel rules.

A reservation is a slot on a calendar for an offer type. Its ``guarantee`` says what the
user holds: "provider" (the provider sold it, e.g. AWS Capacity Blocks), "capacity-checked"
(a market with a fixed count per slot held one), or "best-effort" (the system starts
acquiring ahead of the slot, nothing more). It is charged at booking ("now") or
automatically 2 h before the start ("before"). Persistence and providers live elsewhere;
nothing here reads a clock: every function takes ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.times import parse_iso, to_iso
from jupyter_portable.core.validate import short_repr

BOOKING_SCHEMA = 1
CHARGE_POLICIES = ("now", "before")  # "before": charged automatically CHARGE_LEAD before the start
GUARANTEES = ("provider", "capacity-checked", "best-effort")
# What each guarantee means to the user, one sentence each: the calendar's promise and the
# booking's record say it in these words (the server sends them; the sidebar holds no copy).
GUARANTEE_TEXT: Mapping[str, str] = MappingProxyType({
    "provider": "Provider-backed: the provider sold this capacity; it cannot be cancelled once bought.",
    "capacity-checked": "Capacity-checked: the market holds one machine of this offer for the slot.",
    "best-effort": "Best effort: acquiring starts ahead of the slot; no capacity is held.",
})


def promised_guarantee(provider: str, reservable: bool, capacity: int | None) -> str:
    """The guarantee a booking of an offer would record, so the calendar promises only that: a
    reservable offer of the local market holds capacity; elsewhere the provider sells the slot; an
    offer that is not reservable is booked best effort."""
    if not reservable:
        return "best-effort"
    if provider == "local":
        return "capacity-checked" if capacity else "best-effort"
    return "provider"
STATUSES = ("booked", "cancelled", "charged")
CANCEL_RULES = ("free-until-start", "free-until-charge", "no-cancel")
CHARGE_LEAD = timedelta(hours=2)
MAX_HOURS = 24 * 14  # the longest slot booked in one go (AWS Capacity Blocks: 14 days in day steps)
MAX_DAYS = 120  # the farthest the grid looks ahead (GCP DWS calendar mode shows 120 days)
MAX_AHEAD = timedelta(days=365)  # the farthest ahead a slot may start (AWS Capacity Blocks: 8 weeks)
MAX_ID = 200  # reservation ids and offer keys are names, not documents
HOUR = timedelta(hours=1)
_ACTIVE = ("booked", "charged")  # statuses that hold capacity
_FIELDS = ("reservation_id", "offer_key", "start", "hours", "charge", "guarantee", "price", "status", "created",
           "charge_at", "refund")


def _aware(value: datetime, name: str) -> datetime:
    """``value`` in UTC; a naive datetime is refused, since its zone is a guess."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise UsageError(f"{name} must be a timezone-aware datetime, not {value!r}")
    return value.astimezone(timezone.utc)


def _iso(value: datetime) -> str:
    return to_iso(value, "auto")


def parse_time(value: object, name: str) -> datetime:
    """An ISO 8601 time with a zone, in UTC; UsageError when it is not one or lies past year 1..9999."""
    try:
        return parse_iso(value, name)
    except OverflowError:  # an offset that moves year 1 or 9999 out of range
        raise UsageError(f"{name} {short_repr(value)} is out of range: give a time between now and a year "
                         "from now, such as 2026-12-01T09:00Z") from None


_parse_time = parse_time


def start_problem(start: datetime, now: datetime) -> str | None:
    """Why a new slot cannot start at ``start``: in the past, or more than a year after ``now``."""
    start, now = _aware(start, "start"), _aware(now, "now")
    if start < now:
        return f"{_iso(start)} is in the past"
    if start - now > MAX_AHEAD:
        return f"{_iso(start)} is more than {MAX_AHEAD.days} days ahead; book a start within a year of now"
    return None


def charge_time(start: datetime, charge: str, created: datetime) -> datetime:
    """When the booking is charged: at ``created`` for "now"; for "before", ``CHARGE_LEAD``
    before ``start`` but never before it was made."""
    start, created = _aware(start, "start"), _aware(created, "created")
    if charge == "now":
        return created
    if charge == "before":
        return max(start - CHARGE_LEAD, created)
    raise UsageError(f"charge must be one of {', '.join(CHARGE_POLICIES)}, not {charge!r}")


MIN_BOOKING_HOURS = 1 / 3600


@dataclass(frozen=True)
class Booking:
    """One reservation. ``price`` is the whole slot's price in dollars; ``refund`` is set on a
    cancelled booking: None when nothing had been charged, else the dollars given back."""

    reservation_id: str
    offer_key: str
    start: datetime
    hours: float
    charge: str
    guarantee: str
    price: float
    status: str
    created: datetime
    charge_at: datetime
    refund: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("reservation_id", "offer_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > MAX_ID or not value.isprintable():
                problems.append(f"{name} must be a name of 1 to {MAX_ID} printable characters")
        if isinstance(self.hours, bool) or not isinstance(self.hours, (int, float)) \
                or not (MIN_BOOKING_HOURS <= self.hours <= MAX_HOURS):
            # at least a second: a tinier positive number would end the booking where it starts
            problems.append(f"hours must be at least one second ({MIN_BOOKING_HOURS:.6f}) and <= {MAX_HOURS}, "
                            f"not {self.hours!r}")
        if self.charge not in CHARGE_POLICIES:
            problems.append(f"charge must be one of {', '.join(CHARGE_POLICIES)}, not {self.charge!r}")
        if self.guarantee not in GUARANTEES:
            problems.append(f"guarantee must be one of {', '.join(GUARANTEES)}, not {self.guarantee!r}")
        if self.status not in STATUSES:
            problems.append(f"status must be one of {', '.join(STATUSES)}, not {self.status!r}")
        if isinstance(self.price, bool) or not isinstance(self.price, (int, float)) \
                or not (0 <= self.price < math.inf):
            problems.append(f"price must be a non-negative number, not {self.price!r}")
        if self.refund is not None and (self.status != "cancelled" or not isinstance(self.refund, (int, float))
                                        or not (0 <= self.refund <= self.price)):
            problems.append("refund is only for a cancelled booking, between 0 and its price")
        if problems:
            raise UsageError(f"booking {short_repr(self.reservation_id)}: " + "; ".join(problems))
        # Stored in UTC so equal instants compare and serialise equal.
        for name in ("start", "created", "charge_at"):
            try:
                object.__setattr__(self, name, _aware(getattr(self, name), name))
            except OverflowError:
                raise UsageError(f"booking {self.reservation_id!r}: {name} is out of range") from None
        try:  # the end and the charge time must exist, or every listing and cancel would fail on it
            _ = (self.start + timedelta(hours=self.hours), self.start - CHARGE_LEAD)
        except OverflowError:
            raise UsageError(f"booking {self.reservation_id!r}: start {_iso(self.start)} is out of range") from None
        if self.charge_at != charge_time(self.start, self.charge, self.created):
            raise UsageError(f"booking {self.reservation_id!r}: charge_at {_iso(self.charge_at)} does not follow "
                             f"the {self.charge!r} policy")

    @classmethod
    def new(cls, reservation_id: str, offer_key: str, start: datetime, hours: float, *, charge: str,
            guarantee: str, price: float, created: datetime) -> "Booking":
        """A fresh booking with its charge time computed from the policy."""
        return cls(reservation_id=reservation_id, offer_key=offer_key, start=start, hours=hours, charge=charge,
                   guarantee=guarantee, price=price, status="booked", created=created,
                   charge_at=charge_time(start, charge, created))

    @property
    def end(self) -> datetime:
        return self.start + timedelta(hours=self.hours)

    def to_json(self) -> dict[str, Any]:
        return {"schema": BOOKING_SCHEMA, "reservation_id": self.reservation_id, "offer_key": self.offer_key,
                "start": _iso(self.start), "hours": self.hours, "charge": self.charge, "guarantee": self.guarantee,
                "price": self.price, "status": self.status, "created": _iso(self.created),
                "charge_at": _iso(self.charge_at), "refund": self.refund}

    @classmethod
    def from_json(cls, obj: object) -> "Booking":
        """Validate and read a booking written by :meth:`to_json`; anything else is a UsageError."""
        if not isinstance(obj, dict):
            raise UsageError("a booking must be a JSON object")
        if obj.get("schema", BOOKING_SCHEMA) != BOOKING_SCHEMA:
            raise UsageError(f"booking schema {obj.get('schema')!r} is not {BOOKING_SCHEMA}")
        extra = set(obj) - set(_FIELDS) - {"schema"}
        missing = set(_FIELDS) - {"refund"} - set(obj)
        if extra or missing:
            raise UsageError("booking: " + "; ".join(
                part for part in (f"unknown field(s) {', '.join(sorted(extra))}" if extra else "",
                                  f"missing field(s) {', '.join(sorted(missing))}" if missing else "") if part))
        return cls(reservation_id=obj["reservation_id"], offer_key=obj["offer_key"],
                   start=_parse_time(obj["start"], "start"), hours=obj["hours"], charge=obj["charge"],
                   guarantee=obj["guarantee"], price=obj["price"], status=obj["status"],
                   created=_parse_time(obj["created"], "created"),
                   charge_at=_parse_time(obj["charge_at"], "charge_at"), refund=obj.get("refund"))


def _hour_span(start: datetime, end: datetime, origin: datetime) -> range:
    """Indexes of the whole hours after ``origin`` that [start, end) touches."""
    first = math.floor((start - origin) / HOUR)
    last = math.ceil((end - origin) / HOUR)
    return range(first, last)


def _taken_by_hour(bookings: Iterable[Booking], offer_key: str, origin: datetime) -> dict[int, list[str]]:
    taken: dict[int, list[str]] = {}
    for b in bookings:
        if b.offer_key == offer_key and b.status in _ACTIVE:
            for i in _hour_span(b.start, b.end, origin):
                taken.setdefault(i, []).append(b.reservation_id)
    return taken


def slots(day_start: datetime, days: int, bookings: list[Booking], capacity: Mapping[str, int | None],
          offer_keys: list[str], slot_hours: int = 1, guarantees: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The calendar grid from ``day_start`` for ``days`` days, one row of slots per offer key.
    ``guarantees``: what a booking of each offer would record (:func:`promised_guarantee`);
    where not given, capacity-checked where the capacity is known, else best effort.

    Returns ``{"start", "days", "slot_hours", "offers": {key: {"capacity", "guarantee", "guarantee_text", "slots":
    [{"start", "free", "taken", "mine"}]}}}``. ``taken`` is the most bookings held at once in the
    slot; ``free`` is capacity minus that (None where capacity is unknown: best-effort);
    ``mine`` lists the reservation ids in the slot. Cancelled bookings hold nothing.
    """
    origin = _aware(day_start, "day_start")
    if origin.minute or origin.second or origin.microsecond:
        raise UsageError(f"day_start must be on a whole hour, not {_iso(origin)}")
    if isinstance(days, bool) or not isinstance(days, int) or not (1 <= days <= MAX_DAYS):
        raise UsageError(f"days must be a whole number from 1 to {MAX_DAYS}, not {days!r}")
    if isinstance(slot_hours, bool) or not isinstance(slot_hours, int) or slot_hours < 1 or 24 % slot_hours:
        raise UsageError(f"slot_hours must divide a day (1, 2, 3, 4, 6, 8, 12 or 24), not {slot_hours!r}")
    offers: dict[str, Any] = {}
    for key in offer_keys:
        cap = capacity.get(key)
        by_hour = _taken_by_hour(bookings, key, origin)
        row = []
        for first in range(0, days * 24, slot_hours):
            hours = range(first, first + slot_hours)
            taken = max(len(by_hour.get(i, ())) for i in hours)
            mine = list(dict.fromkeys(rid for i in hours for rid in by_hour.get(i, ())))
            row.append({"start": _iso(origin + first * HOUR), "free": None if cap is None else max(cap - taken, 0),
                        "taken": taken, "mine": mine})
        guarantee = (guarantees or {}).get(key) or ("best-effort" if cap is None else "capacity-checked")
        offers[key] = {"capacity": cap, "guarantee": guarantee, "guarantee_text": GUARANTEE_TEXT[guarantee],
                       "slots": row}
    return {"start": _iso(origin), "days": days, "slot_hours": slot_hours, "offers": offers}


def can_book(offer_key: str, start: datetime, hours: float, bookings: Iterable[Booking],
             capacity: Mapping[str, int | None], *, now: datetime) -> str | None:
    """The reason ``offer_key`` cannot be booked from ``start`` for ``hours``, or None when it can.

    Starts in the past, more than a year ahead, and off whole hours are refused. An offer with a known capacity has that
    many per hour, and overlapping active bookings use it up; unknown capacity (None, or an
    offer not in ``capacity``) is best-effort and always bookable.
    """
    start, now = _aware(start, "start"), _aware(now, "now")
    problem = start_problem(start, now)
    if problem:
        return problem
    if start.minute or start.second or start.microsecond:
        return f"slots start on whole hours; {_iso(start)} does not"
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not (0 < hours <= MAX_HOURS) \
            or hours != int(hours):
        return f"hours must be a whole number from 1 to {MAX_HOURS}, not {hours!r}"
    cap = capacity.get(offer_key)
    if cap is None:
        return None
    if cap <= 0:
        return f"{offer_key} has no capacity to book"
    by_hour = _taken_by_hour(bookings, offer_key, start)
    for i in range(int(hours)):
        if len(by_hour.get(i, ())) >= cap:
            return f"no capacity left for {offer_key} at {_iso(start + i * HOUR)}: all {cap} booked"
    return None


def cancel(booking: Booking, now: datetime, rules: str = "free-until-start") -> Booking | str:
    """The cancelled booking, or the reason it cannot be cancelled.

    "free-until-start": before the start, whatever was charged is refunded in full;
    "free-until-charge": free before the charge time; past the free deadline a booking is
    still cancelled, with refund 0; "no-cancel" (AWS Capacity Blocks): never. A booking
    whose slot has ended cannot be cancelled.
    """
    if rules not in CANCEL_RULES:
        raise UsageError(f"cancel rules must be one of {', '.join(CANCEL_RULES)}, not {rules!r}")
    now = _aware(now, "now")
    if booking.status == "cancelled":
        return f"{booking.reservation_id} is already cancelled"
    if rules == "no-cancel":
        return f"{booking.reservation_id} cannot be cancelled: the provider's reservations are final once bought"
    if now >= booking.end:
        return f"{booking.reservation_id} is over; there is nothing left to cancel"
    charged = booking.status == "charged" or now >= booking.charge_at
    deadline = booking.start if rules == "free-until-start" else booking.charge_at
    if now < deadline:
        refund = float(booking.price) if charged else None
    else:
        refund = 0.0
    return replace(booking, status="cancelled", refund=refund)


__all__ = [
    "BOOKING_SCHEMA",
    "CANCEL_RULES",
    "CHARGE_LEAD",
    "CHARGE_POLICIES",
    "GUARANTEES",
    "STATUSES",
    "Booking",
    "can_book",
    "cancel",
    "charge_time",
    "parse_time",
    "slots",
    "start_problem",
]
