"""One budget in the server (issue 30, item 2): a budget or a booking changed through the REST API
shows in the very next state, and one changed outside the server (a terminal's `jupyter portable
settings` or `reserve`, written straight to the store) is told to the sidebar as a changed/v1 event
by the server's check, with the state built again."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import EventStream, env, jp_root_dir, make_workspace, portable_env, release_all  # noqa: F401 - fixtures

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(120)
CALENDAR_NOW = datetime(2027, 3, 1, 9, 20, tzinfo=timezone.utc)
CHANGED = "https://events.jupyter-portable.org/changed/v1"


async def _budget(jp_fetch: Any) -> dict[str, Any]:
    return json.loads((await jp_fetch("portable", "api", "state")).body)["budget"]  # type: ignore[no-any-return]


async def test_the_state_says_a_budget_and_a_booking_at_once_wherever_they_were_made(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.reservations import reserve
    from jupyter_portable.orchestration.settings import update_settings

    service = jp_serverapp.web_app.settings["portable_service"]
    service.pause_monitor()  # the test's own looks at the store, not the timer's
    service.watch_docs()  # the first look remembers what the store holds
    assert (await _budget(jp_fetch))["cap"] is None  # the state is built, and kept until it changes
    # through the REST API: the next state says it, with nothing waited for
    await jp_fetch("portable", "api", "settings", method="PUT", body='{"budget_total": 10}')
    assert (await _budget(jp_fetch))["cap"] == 10
    booked = json.loads((await jp_fetch("portable", "api", "reservations", method="POST", body=json.dumps(
        {"offer": "local/a100", "start": "2027-03-02T09:00Z", "hours": 2, "charge": "before"}))).body)
    assert booked["price"] == 3.0
    budget = await _budget(jp_fetch)
    assert (budget["committed"], budget["left"]) == (3.0, 7.0)
    assert budget["message"].startswith("$7.00 left of the $10.00 budget: $0.00 spent, $3.00 committed")

    # outside the server, as a terminal does: the check sees both documents change and says so
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    service.watch_docs()  # what the server itself wrote is known
    ws = Workspace.find(jp_root_dir)
    update_settings(ws, budget_total=20)
    reserve(ws, "local/a100", "2027-03-03T09:00Z", 1, now=CALENDAR_NOW)
    assert sorted(service.watch_docs()) == ["reservations", "settings"]
    what = set()
    while what != {"settings", "reservations"}:
        ev = await events.wait_for(lambda e: e.get("schema_id") == CHANGED, timeout=30, after=len(events.seen))
        assert ev["workspace_id"] == ws.workspace_id
        what.add(ev["what"])
    budget = await _budget(jp_fetch)
    assert (budget["cap"], budget["committed"], budget["left"]) == (20, 4.5, 15.5)
    assert service.watch_docs() == [], "nothing changed since"


async def test_a_change_through_the_rest_api_is_told_at_once_even_when_undone_before_the_next_look(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path) -> None:
    """A budget set and cleared between two of the check's looks is one change to the watch, after which
    the state reads as before: a sidebar whose dry run answered "over the budget" would keep that
    answer. The server tells each change it makes itself, at once, with no look at the store."""
    service = jp_serverapp.web_app.settings["portable_service"]
    service.pause_monitor()  # no look at the store at all: only what the REST calls tell
    service.watch_docs()
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    await jp_fetch("portable", "api", "settings", method="PUT", body='{"budget_total": 1}')
    await jp_fetch("portable", "api", "settings", method="PUT", body='{"budget_total": ""}')
    told = [await events.wait_for(lambda e: e.get("schema_id") == CHANGED, timeout=30, after=len(events.seen))
            for _ in range(2)]
    assert [e["what"] for e in told] == ["settings", "settings"], told
    await jp_fetch("portable", "api", "reservations", method="POST", body=json.dumps(
        {"offer": "local/a100", "start": "2027-03-02T09:00Z", "hours": 1, "charge": "before"}))
    ev = await events.wait_for(lambda e: e.get("schema_id") == CHANGED, timeout=30, after=len(events.seen))
    assert ev["what"] == "reservations", ev
