"""The rules the sidebar still needs before it asks the server are the server's rules.

The browser no longer decides whether a Continue may start or a booking may be cancelled
(the state and the reservations listing carry ``can_continue``, ``can_cancel``). What it
keeps, to read a stream of events and to preview a booking's charge time, is checked here
against ``core``, so the two can never drift apart."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.calendar import CHARGE_LEAD, Booking
from jupyter_portable.orchestration.reservations import booking_view

SRC = Path(__file__).resolve().parents[1] / "labextension" / "src"


def _ts_set(text: str, name: str) -> set[str]:
    body = re.search(rf"export const {name}\b[^=]*= new Set<\w+>\(\[(.*?)\]\)", text, re.S)
    assert body, f"{name} not found"
    return set(re.findall(r"'([A-Z_]+)'", body.group(1)))


def test_the_states_a_continue_begins_from_are_the_cores() -> None:
    progress = (SRC / "progress.ts").read_text()
    assert _ts_set(progress, "CONTINUE_FROM") == set(L.CONTINUE_FROM)
    assert _ts_set(progress, "CONTINUE_STATES") == set(L.CONTINUE_STATES)


def test_the_charge_lead_is_the_cores() -> None:
    calendar = (SRC / "calendar.ts").read_text()
    lead = re.search(r"export const CHARGE_LEAD_MS = (\d+) \* HOUR_MS;", calendar)
    assert lead and timedelta(hours=int(lead.group(1))) == CHARGE_LEAD


def test_the_browser_no_longer_decides_continue_or_cancel() -> None:
    sources = "\n".join(p.read_text() for p in SRC.rglob("*.ts*") if "__tests__" not in p.parts)
    assert "canCancel(" not in sources
    assert "CONTINUE_FROM.has(s.lifecycle" not in sources and "can_continue" in sources and "can_cancel" in sources


NOW = datetime(2026, 12, 1, 10, 20, tzinfo=timezone.utc)


def booking(**over: object) -> Booking:
    fields: dict[str, object] = dict(reservation_id="res-1", offer_key="local/a100-80",
                                     start=datetime(2026, 12, 1, 12, tzinfo=timezone.utc), hours=2, charge="before",
                                     guarantee="capacity-checked", price=3.78, created=datetime(2026, 12, 1, 9,
                                                                                                 tzinfo=timezone.utc))
    fields.update(over)
    return Booking.new(**fields)  # type: ignore[arg-type]


def test_a_booking_can_be_cancelled_until_its_slot_ends_except_a_providers() -> None:
    assert booking_view(booking(), NOW)["can_cancel"] is True
    assert booking_view(booking(), datetime(2026, 12, 1, 13, 59, tzinfo=timezone.utc))["can_cancel"] is True
    over = booking_view(booking(), datetime(2026, 12, 1, 14, 0, tzinfo=timezone.utc))
    assert over["can_cancel"] is False and "is over" in over["cancel_refused"]
    final = booking_view(booking(guarantee="provider"), NOW)
    assert final["can_cancel"] is False and "final once bought" in final["cancel_refused"]
    from jupyter_portable.core.calendar import cancel

    gone = cancel(booking(), NOW)
    assert isinstance(gone, Booking)
    assert booking_view(gone, NOW)["can_cancel"] is False
