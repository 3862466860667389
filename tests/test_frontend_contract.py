"""The rules the sidebar still needs before it asks the server are the server's rules.

The browser no longer decides whether a Continue may start or a booking may be cancelled
(the state and the reservations listing carry ``can_continue``, ``can_cancel``), nor whether a
booking may be made or when it would be charged (it asks ``reservations/check``). What it keeps,
to read a stream of events, is checked here against ``core``, so the two can never drift apart."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.calendar import CHARGE_LEAD, Booking
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.settings import FIELDS, check_setting
from jupyter_portable.orchestration.reservations import booking_view

SRC = Path(__file__).resolve().parents[1] / "labextension" / "src"


SERVEREXT = Path(__file__).resolve().parents[1] / "jupyter_portable" / "interfaces" / "serverext"
ORCHESTRATION = SERVEREXT.parents[1] / "orchestration"


def _definitions(schema: str) -> dict[str, Any]:
    return json.loads((SERVEREXT / "schemas" / schema).read_text())["definitions"]  # type: ignore[no-any-return]


def test_the_lifecycle_states_in_the_schema_are_the_cores() -> None:
    # the sidebar's LifecycleState, CONTINUE_FROM and CONTINUE_STATES are generated from these
    # (jlpm gen:types); core/lifecycle.py is where they are decided
    defs = _definitions("state.json")
    assert defs["LifecycleState"]["enum"] == list(L.STATES)
    assert set(defs["ContinueFromState"]["enum"]) == set(L.CONTINUE_FROM)
    assert defs["ContinueState"]["enum"] == list(L.CONTINUE_STATES)
    types = (SRC / "types.ts").read_text()
    assert "export const CONTINUE_FROM = ['IDLE', 'LOST', 'RELEASED', 'FAILED'] as const;" in types


def test_the_charge_lead_in_the_schema_is_the_cores() -> None:
    # the sidebar's CHARGE_LEAD_HOURS ("charge 2 h before start") is generated from it
    assert timedelta(hours=_definitions("reservation.json")["ChargeLeadHours"]["const"]) == CHARGE_LEAD
    assert "export const CHARGE_LEAD_HOURS = 2;" in (SRC / "types.ts").read_text()


def test_the_progress_steps_in_the_event_schema_are_the_ones_emitted() -> None:
    # every step the orchestration says progress of is one progress/v1 names, and no other
    schema = yaml.safe_load((SERVEREXT / "events" / "progress.yaml").read_text())
    named = set(schema["properties"]["step"]["enum"])
    code = "\n".join(p.read_text() for p in ORCHESTRATION.rglob("*.py"))
    emitted = set(re.findall(r'_progress\("(\w+)"', code)) | set(re.findall(r'"step": "(\w+)"', code))
    assert emitted == named


def test_the_sidebar_holds_no_copy_of_the_event_enums() -> None:
    # step names, notice kinds, what changed and the schema ids come from the generated types
    events = (SRC / "events.ts").read_text()
    assert "'acquire'" not in events and "'lost'" not in events and "https://" not in events
    assert "new Set<LifecycleState>([" not in (SRC / "progress.ts").read_text()


def test_the_browser_asks_the_server_whether_a_booking_can_be_made() -> None:
    # why a selection cannot be booked and when it would be charged come from POST
    # reservations/check (core.calendar can_book and charge_time, the budget), not from a copy
    sources = "\n".join(p.read_text() for p in SRC.rglob("*.ts*") if "__tests__" not in p.parts)
    for copy in ("selectionProblem", "CHARGE_LEAD_MS", "MAX_HOURS", "function chargeAt", "is in the past",
                 "no capacity left for"):
        assert copy not in sources, copy
    assert "'reservations/check'" in (SRC / "api.ts").read_text()
    assert "onCheck={model.checkBooking}" in (SRC / "components" / "Sidebar.tsx").read_text()


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


# The Settings Editor's fields kept with the workspace, and the server's settings they are sent as
# (labextension/src/workspaceSettings.ts toBody).
EDITOR_FIELDS = {"budgetCap": "budget_total", "maxPricePerHour": "budget_max_price_per_hour",
                 "plannedHours": "hours", "autoSnapshotMinutes": "autosnapshot_minutes",
                 "idleMinutes": "idle_minutes"}


def test_the_settings_editor_refuses_what_the_server_refuses() -> None:
    schema = json.loads((SRC.parent / "schema" / "plugin.json").read_text())
    by_name = {f.name: f for f in FIELDS}
    for prop, name in EDITOR_FIELDS.items():
        assert schema["properties"][prop]["maximum"] == by_name[name].maximum, prop
        # 1e400 reads as infinity in the browser's JSON and in Python's: both refuse it, and the
        # server's largest value is one both accept
        huge = json.loads(f'{{"{prop}": 1e400}}')
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(huge, schema)
        with pytest.raises(UsageError, match=name):
            check_setting(name, huge[prop])
        top = by_name[name].maximum
        jsonschema.validate({prop: int(top) if prop == "autoSnapshotMinutes" else top}, schema)
        check_setting(name, top)
