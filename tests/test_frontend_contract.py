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


def test_the_charge_lead_in_the_schema_is_the_cores() -> None:
    # the sidebar's CHARGE_LEAD_HOURS ("charge 2 h before start") is generated from it
    assert timedelta(hours=_definitions("reservation.json")["ChargeLeadHours"]["const"]) == CHARGE_LEAD


def test_the_progress_steps_in_the_event_schema_are_the_ones_emitted() -> None:
    # every step the orchestration says progress of is one progress/v1 names, and no other
    schema = yaml.safe_load((SERVEREXT / "events" / "progress.yaml").read_text())
    named = set(schema["properties"]["step"]["enum"])
    code = "\n".join(p.read_text() for p in ORCHESTRATION.rglob("*.py"))
    emitted = set(re.findall(r'_progress\("(\w+)"', code)) | set(re.findall(r'"step": "(\w+)"', code))
    assert emitted == named


def test_the_values_the_sidebar_is_generated_with_are_the_cores() -> None:
    # each x-constant of the schemas (generated into types.ts by `jlpm gen:types`; the vitest suite
    # checks types.ts is what the schemas generate) is the value core/ decides
    from jupyter_portable.core import idle, routing

    state = _definitions("state.json")
    assert state["ContinueStep"]["enum"] == list(L.CONTINUE_STEPS)
    assert state["StateStep"]["const"] == dict(L.STATE_STEP)
    assert set(L.STATE_STEP) <= set(L.CONTINUE_STATES) and set(L.STATE_STEP.values()) == set(L.CONTINUE_STEPS)
    assert _definitions("routes.json")["ReasonCategory"]["const"] == dict(routing.REASON_CATEGORY)
    assert _definitions("settings.json")["DefaultIdleMinutes"]["const"] == idle.DEFAULT_IDLE_MINUTES
    from jupyter_portable.core.offers import Checks
    from jupyter_portable.interfaces.kernel import placeholder, resume

    assert _definitions("routes.json")["CheckName"]["enum"] == list(Checks().to_json())
    assert state["ResumeTag"]["const"] == resume.RESUME_TAG and state["ResumeTagMime"]["const"] == resume.TAG_MIME
    assert state["FirstMachineMessage"]["const"] == placeholder.FIRST_MACHINE_MSG
    from jupyter_portable.compute import registry

    # every provider the registry makes has its name in the sidebar's words, and no other
    assert _definitions("routes.json")["ProviderName"]["const"] == registry.PROVIDER_NAME
    assert set(registry.PROVIDER_NAME) == set(registry.PROVIDERS)
    # the Continue steps are steps progress/v1 names
    steps = yaml.safe_load((SERVEREXT / "events" / "progress.yaml").read_text())["properties"]["step"]["enum"]
    assert set(L.CONTINUE_STEPS) <= set(steps)


def test_every_reason_a_route_can_be_blocked_for_has_a_category() -> None:
    # the keys core/routing.py and core/offers.py unmet() write into a route's reasons
    from jupyter_portable.core import routing

    core = SERVEREXT.parents[1] / "core"
    written = set(re.findall(r'reasons\["(\w+)"\]', (core / "routing.py").read_text()))
    offers = (core / "offers.py").read_text()
    unmet = offers[offers.index("def unmet("):]
    written |= set(re.findall(r'out\["(\w+)"\]', unmet[:unmet.find("\ndef ", 1)]))
    assert written and written == set(routing.REASON_CATEGORY)


def _server_rules() -> tuple[set[str], list[tuple[str, frozenset[str]]]]:
    """The names of the package's module constants, and every set of values a server rule
    enumerates: each enum of the REST and event schemas, and the keys of each object constant."""
    names: set[str] = set()
    package = SERVEREXT.parents[1]
    for path in package.rglob("*.py"):
        names |= set(re.findall(r"(?m)^([A-Z][A-Z0-9_]{2,})\s*(?::[^=\n]+)?=", path.read_text()))
    sets: list[tuple[str, frozenset[str]]] = []

    def walk(where: str, node: Any) -> None:
        if isinstance(node, dict):
            values = node.get("enum")
            if isinstance(values, list) and len(values) > 1 and all(isinstance(v, str) for v in values):
                sets.append((where, frozenset(values)))
            if isinstance(node.get("const"), dict):
                sets.append((where, frozenset(node["const"])))
            for key, value in node.items():
                walk(f"{where}/{key}", value)
        elif isinstance(node, list):
            for item in node:
                walk(where, item)

    for path in sorted((SERVEREXT / "schemas").glob("*.json")):
        walk(path.name, json.loads(path.read_text()))
    for path in sorted((SERVEREXT / "events").glob("*.yaml")):
        walk(path.name, yaml.safe_load(path.read_text()))
    return names, sets


_TS_CONST = re.compile(r"(?m)^\s*(?:export\s+)?const\s+(\w+)\s*(?::\s*([^=\n]+?))?\s*=\s*(?=[\[{'\"0-9])")
_TS_STRING = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
_TS_KEY = re.compile(r"(?:^|[{,])\s*(?:'([^']+)'|\"([^\"]+)\"|([A-Za-z_$][\w$]*))\s*:", re.M)


def _literal(text: str, start: int) -> str:
    """The literal that starts at ``start``: a bracketed array or object, or up to the line's end."""
    if text[start] not in "[{":
        return text[start:text.find("\n", start)]
    depth, quote, i = 0, "", start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"`":
            quote = c
        elif c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    return text[start:]


def ts_constant_copies(sources: dict[str, str]) -> list[str]:
    """Each constant of the sidebar's own sources (not the generated types.ts) whose literal value
    copies a server rule: named as a constant of the package, an array of values that one schema
    enum names, or an object keyed by such values (unless its type maps over a generated type,
    ``{ [K in Guarantee]: ... }``: then the compiler ties its keys to the schema)."""
    names, sets = _server_rules()
    found = []
    for where, text in sources.items():
        for match in _TS_CONST.finditer(text):
            name, annotation = match.group(1), match.group(2) or ""
            literal = _literal(text, match.end())
            if name in names:
                found.append(f"{where}: {name} has the name of a server constant")
                continue
            if literal.startswith("["):
                values = {a or b for a, b in _TS_STRING.findall(literal)}
            elif literal.startswith("{") and "[K in " not in annotation:
                values = {a or b or c for a, b, c in _TS_KEY.findall(literal[1:-1])}
            else:
                continue
            for rule, allowed in sets:
                if len(values) > 1 and values <= allowed:
                    found.append(f"{where}: {name} copies {rule} ({sorted(values)})")
                    break
    return found


def test_no_typescript_constant_copies_a_server_rule() -> None:
    sources = {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.ts*"))
               if "__tests__" not in p.parts and p.name != "types.ts"}
    assert len(sources) > 10
    assert ts_constant_copies(sources) == []


def test_the_copy_finder_finds_the_copies_it_is_for() -> None:
    # the kinds of copy the sidebar once held (issue 46): each is found
    copies = {
        "notebook.ts": "const MOVING = ['ROUTING', 'ACQUIRING', 'PROBING', 'MATERIALIZING', 'VERIFYING', 'READY'];\n",
        "settings.ts": "export const DEFAULT_IDLE_MINUTES = 30;\n",
        "routes.ts": "const CATEGORY: { [key: string]: string } = {\n  price_cap: 'cap',\n  gpu: 'admission'\n};\n",
        "progress.ts": "export const STEPS = [\n  'acquire',\n  'probe'\n] as const;\n",
        "calendar.ts": "export const GUARANTEE_TEXT: { [K in Guarantee]: string } = {\n  provider: 'x'\n};\n",
    }
    found = ts_constant_copies(copies)
    assert [line.split(":", 1)[0] for line in found] == list(copies)
    # and what is the sidebar's own is not: labels keyed by a generated type, its own words
    own = {"a.ts": "export const STEP_LABEL: { [K in ContinueStep]: string } = {\n  acquire: 'A',\n  probe: 'P'\n};\n"
                   "const MONTHS = ['Jan', 'Feb'];\nconst HOUR_MS = 3600;\n"}
    assert ts_constant_copies(own) == []


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
