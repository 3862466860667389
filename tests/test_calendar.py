"""Reservations as data: booking fills capacity, charge policies, cancel rules, the grid, JSON."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jupyter_portable.core.calendar import Booking, can_book, cancel, charge_time, slots
from jupyter_portable.core.errors import UsageError

NOW = datetime(2026, 11, 3, 10, 0, tzinfo=timezone.utc)
DAY = datetime(2026, 11, 4, 0, 0, tzinfo=timezone.utc)  # tomorrow, midnight UTC
KEY = "local/fake-a100"


def booking(rid: str, start: datetime, hours: float = 2, charge: str = "before", price: float = 10.0,
            guarantee: str = "capacity-checked", key: str = KEY) -> Booking:
    return Booking.new(rid, key, start, hours, charge=charge, guarantee=guarantee, price=price, created=NOW)


# -- capacity ---------------------------------------------------------------------------------

def test_bookings_fill_a_slots_capacity() -> None:
    cap = {KEY: 2}
    ten = DAY + timedelta(hours=10)
    held = [booking("res-1", ten)]
    assert can_book(KEY, ten, 2, held, cap, now=NOW) is None
    held.append(booking("res-2", ten + timedelta(hours=1), hours=1))
    # 11:00 now holds res-1 and res-2: both of the two are taken
    assert can_book(KEY, ten + timedelta(hours=1), 1, held, cap, now=NOW) == \
        "no capacity left for local/fake-a100 at 2026-11-04T11:00:00Z: all 2 booked"
    # a 10:00-12:00 request runs into the same full hour
    assert "11:00" in (can_book(KEY, ten, 2, held, cap, now=NOW) or "")
    # 12:00 is free again (res-1 ends at 12:00)
    assert can_book(KEY, ten + timedelta(hours=2), 1, held, cap, now=NOW) is None
    # another offer's capacity is its own
    assert can_book("local/fake-h100", ten + timedelta(hours=1), 1, held, {"local/fake-h100": 1}, now=NOW) is None


def test_a_slot_with_no_capacity_cannot_be_booked_and_unknown_capacity_is_best_effort() -> None:
    start = DAY + timedelta(hours=9)
    assert can_book(KEY, start, 1, [], {KEY: 0}, now=NOW) == "local/fake-a100 has no capacity to book"
    assert can_book(KEY, start, 1, [], {KEY: None}, now=NOW) is None
    assert can_book(KEY, start, 1, [booking(f"r{i}", start) for i in range(50)], {}, now=NOW) is None


def test_past_starts_odd_hours_and_bad_lengths_are_refused() -> None:
    cap = {KEY: 1}
    assert "in the past" in (can_book(KEY, NOW - timedelta(hours=1), 1, [], cap, now=NOW) or "")
    assert "whole hours" in (can_book(KEY, DAY + timedelta(minutes=30), 1, [], cap, now=NOW) or "")
    for hours in (0, 1.5, 24 * 14 + 1, -2):
        assert "hours must be" in (can_book(KEY, DAY, hours, [], cap, now=NOW) or "")
    assert can_book(KEY, DAY, 24 * 14, [], cap, now=NOW) is None
    with pytest.raises(UsageError, match="timezone-aware"):
        can_book(KEY, datetime(2026, 11, 4, 9), 1, [], cap, now=NOW)


def test_a_cancelled_booking_gives_its_capacity_back() -> None:
    start = DAY + timedelta(hours=9)
    held = booking("res-1", start)
    assert can_book(KEY, start, 1, [held], {KEY: 1}, now=NOW) is not None
    gone = cancel(held, NOW)
    assert isinstance(gone, Booking)
    assert can_book(KEY, start, 1, [gone], {KEY: 1}, now=NOW) is None


# -- charging -----------------------------------------------------------------------------------

def test_charge_policy_is_recorded_and_charge_at_computed() -> None:
    start = DAY + timedelta(hours=9)  # 2026-11-04 09:00
    before = booking("res-1", start, charge="before")
    assert before.charge == "before" and before.status == "booked"
    assert before.charge_at == datetime(2026, 11, 4, 7, 0, tzinfo=timezone.utc)  # 2 h before the start
    now_ = booking("res-2", start, charge="now")
    assert now_.charge_at == NOW  # charged at booking
    # a slot starting within 2 h is charged at booking, never in the past
    soon = NOW + timedelta(hours=1)
    assert charge_time(soon, "before", NOW) == NOW
    with pytest.raises(UsageError, match="charge must be one of"):
        charge_time(start, "later", NOW)


# -- cancelling ---------------------------------------------------------------------------------

def test_cancel_free_until_start() -> None:
    b = booking("res-1", DAY + timedelta(hours=9), hours=2, price=40.0)  # charged 07:00, runs 09:00-11:00
    early = cancel(b, NOW)  # nothing charged yet
    assert isinstance(early, Booking) and (early.status, early.refund) == ("cancelled", None)
    charged = cancel(b, DAY + timedelta(hours=8))  # charged at 07:00, before the start: full refund
    assert isinstance(charged, Booking) and charged.refund == 40.0
    started = cancel(b, DAY + timedelta(hours=10))  # running: cancelled, no refund
    assert isinstance(started, Booking) and started.refund == 0.0
    assert cancel(b, DAY + timedelta(hours=11)) == "res-1 is over; there is nothing left to cancel"
    assert cancel(early, NOW) == "res-1 is already cancelled"


def test_cancel_free_until_charge_and_no_cancel() -> None:
    b = booking("res-1", DAY + timedelta(hours=9), price=40.0)
    free = cancel(b, DAY + timedelta(hours=6, minutes=59), rules="free-until-charge")
    assert isinstance(free, Booking) and (free.status, free.refund) == ("cancelled", None)
    late = cancel(b, DAY + timedelta(hours=7), rules="free-until-charge")  # at the charge time
    assert isinstance(late, Booking) and (late.status, late.refund) == ("cancelled", 0.0)
    aws = booking("cb-1", DAY + timedelta(hours=11, minutes=30), hours=24, charge="now", guarantee="provider")
    assert cancel(aws, NOW, rules="no-cancel") == \
        "cb-1 cannot be cancelled: the provider's reservations are final once bought"
    with pytest.raises(UsageError):
        cancel(aws, NOW, rules="whenever")


# -- the grid -------------------------------------------------------------------------------------

def test_slots_show_free_taken_and_mine() -> None:
    gone = cancel(booking("res-3", DAY + timedelta(hours=1)), NOW)
    assert isinstance(gone, Booking)
    held = [booking("res-1", DAY + timedelta(hours=1)), booking("res-2", DAY + timedelta(hours=2), hours=1), gone]
    grid = slots(DAY, 1, held, {KEY: 2, "gcp/a2": None}, [KEY, "gcp/a2"])
    assert (grid["start"], grid["days"], grid["slot_hours"]) == ("2026-11-04T00:00:00Z", 1, 1)
    row = grid["offers"][KEY]
    assert (row["capacity"], row["guarantee"], len(row["slots"])) == (2, "capacity-checked", 24)
    assert [(s["taken"], s["free"], s["mine"]) for s in row["slots"][:4]] == [
        (0, 2, []), (1, 1, ["res-1"]), (2, 0, ["res-1", "res-2"]), (0, 2, [])]
    assert row["slots"][2]["start"] == "2026-11-04T02:00:00Z"
    unknown = grid["offers"]["gcp/a2"]
    assert unknown["guarantee"] == "best-effort" and unknown["slots"][0]["free"] is None


def test_wider_slots_count_the_most_held_at_once() -> None:
    held = [booking("res-1", DAY + timedelta(hours=9), hours=1), booking("res-2", DAY + timedelta(hours=10), hours=1)]
    grid = slots(DAY, 2, held, {KEY: 3}, [KEY], slot_hours=4)
    row = grid["offers"][KEY]["slots"]
    assert len(row) == 12
    # 08:00-12:00 holds two bookings, never at the same time
    assert (row[2]["start"], row[2]["taken"], row[2]["free"], row[2]["mine"]) == (
        "2026-11-04T08:00:00Z", 1, 2, ["res-1", "res-2"])


def test_bad_grid_arguments_are_refused() -> None:
    for days, slot_hours in ((0, 1), (121, 1), (1, 5), (1, 0)):
        with pytest.raises(UsageError):
            slots(DAY, days, [], {}, [KEY], slot_hours=slot_hours)
    with pytest.raises(UsageError, match="whole hour"):
        slots(DAY + timedelta(minutes=15), 1, [], {}, [KEY])


# -- JSON -------------------------------------------------------------------------------------------

def test_json_round_trip() -> None:
    b = booking("res-1", DAY + timedelta(hours=9))
    out = b.to_json()
    assert out == {"schema": 1, "reservation_id": "res-1", "offer_key": KEY, "start": "2026-11-04T09:00:00Z",
                   "hours": 2, "charge": "before", "guarantee": "capacity-checked", "price": 10.0,
                   "status": "booked", "created": "2026-11-03T10:00:00Z", "charge_at": "2026-11-04T07:00:00Z",
                   "refund": None}
    assert Booking.from_json(out) == b
    gone = cancel(b, DAY + timedelta(hours=8))
    assert isinstance(gone, Booking) and Booking.from_json(gone.to_json()) == gone
    # another zone's offset reads as the same instant
    assert Booking.from_json({**out, "start": "2026-11-04T10:00:00+01:00"}).start == b.start


@pytest.mark.parametrize("change, message", [
    ({"start": "2026-11-04T09:00:00"}, "timezone-aware"),
    ({"start": "tomorrow"}, "not an ISO 8601 time"),
    ({"hours": 0}, "hours must be"),
    ({"hours": 24 * 14 + 1}, "hours must be"),
    ({"hours": "2"}, "hours must be"),
    ({"charge": "later"}, "charge must be one of"),
    ({"guarantee": "promise"}, "guarantee must be one of"),
    ({"status": "pending"}, "status must be one of"),
    ({"price": -1}, "price must be"),
    ({"refund": 5.0}, "refund is only for a cancelled booking"),
    ({"charge_at": "2026-11-04T08:00:00Z"}, "does not follow"),
    ({"schema": 2}, "schema"),
    ({"owner": "me"}, "unknown field"),
])
def test_bad_json_is_refused(change: dict[str, Any], message: str) -> None:
    out = booking("res-1", DAY + timedelta(hours=9)).to_json()
    with pytest.raises(UsageError, match=message):
        Booking.from_json({**out, **change})


def test_missing_fields_and_non_objects_are_refused() -> None:
    out = booking("res-1", DAY + timedelta(hours=9)).to_json()
    del out["charge_at"]
    with pytest.raises(UsageError, match="missing field"):
        Booking.from_json(out)
    with pytest.raises(UsageError, match="JSON object"):
        Booking.from_json([])
