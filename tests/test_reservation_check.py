"""The dry-run booking (issue 31, item 5): POST /portable/api/reservations/check answers, through a
real server on its own calendar clock (c.Portable.now), what the booking itself would answer - the
problem in the booking's own words, the charge time and the price - and books nothing. The sidebar
asks it instead of keeping a copy of the server's rules."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jupyter_e2e import env, jp_root_dir  # noqa: F401 - fixtures
from tornado.httpclient import HTTPClientError

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(120)
CALENDAR_NOW = datetime(2027, 3, 1, 9, 20, tzinfo=timezone.utc)
SERVER_ENV = {"JUPYTER_PORTABLE_NOW": CALENDAR_NOW.isoformat()}
SCHEMAS = Path(__file__).resolve().parents[1] / "jupyter_portable" / "interfaces" / "serverext" / "schemas"


def _schema(name: str) -> Any:
    from referencing import Registry, Resource

    registry = Registry().with_resources(  # type: ignore[call-arg]
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json"))
    return json.loads((SCHEMAS / name).read_text()), registry


async def _post(jp_fetch: Any, *path: str, **body: object) -> Any:
    return json.loads((await jp_fetch("portable", "api", *path, method="POST", body=json.dumps(body))).body)


async def _check(jp_fetch: Any, **body: object) -> dict[str, Any]:
    answer = await _post(jp_fetch, "reservations", "check", **body)
    schema, registry = _schema("reservation-check.json")
    jsonschema.validate(answer, schema, registry=registry)
    return answer  # type: ignore[no-any-return]


def _near_now(when: str) -> bool:
    """Whether ``when`` is the server's calendar clock at the time of asking: it starts at
    CALENDAR_NOW and runs on from there."""
    return timedelta(0) <= datetime.fromisoformat(when.replace("Z", "+00:00")) - CALENDAR_NOW < timedelta(minutes=2)


async def _booked(jp_fetch: Any) -> list[str]:
    listing = json.loads((await jp_fetch("portable", "api", "reservations")).body)
    return [b["reservation_id"] for b in listing["reservations"]]


async def test_a_dry_run_answers_what_the_booking_would_and_books_nothing(
        jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    jp_serverapp.web_app.settings["portable_service"].pause_monitor()
    slot = {"offer": "local/a100", "start": "2027-03-02T09:00:00Z", "hours": 2}

    # charged 2 h before the start on the server's clock, or at once; priced at the listed $/h
    before = await _check(jp_fetch, **slot, charge="before")
    assert (before["problem"], before["charge_at"], before["price"]) == (None, "2027-03-02T07:00:00Z", 3.0)
    soon = await _check(jp_fetch, **{**slot, "start": "2027-03-01T10:00:00Z"}, charge="before")
    assert _near_now(soon["charge_at"]), "never before it was made: the server's now"
    now = await _check(jp_fetch, **slot, charge="now")
    assert _near_now(now["charge_at"])
    assert await _booked(jp_fetch) == [], "a dry run books nothing"

    # the server's rules, in the words the booking answers with
    past = await _check(jp_fetch, **{**slot, "start": "2027-03-01T09:00:00Z"})
    assert past["problem"].endswith("2027-03-01T09:00:00Z is in the past") and past["price"] is None
    odd = await _check(jp_fetch, **{**slot, "start": "2027-03-02T09:30:00Z"})
    assert "slots start on whole hours" in odd["problem"]
    unknown = await _check(jp_fetch, **{**slot, "offer": "local/h900"})
    assert "does not list an offer 'h900'" in unknown["problem"] and unknown["hint"]

    # capacity: three a100s an hour; the fourth booking of an hour is refused, as the booking is
    for _ in range(3):
        await _post(jp_fetch, "reservations", **slot)
    full = await _check(jp_fetch, **{**slot, "start": "2027-03-02T10:00:00Z"})
    assert full["problem"].endswith("no capacity left for local/a100 at 2027-03-02T10:00:00Z: all 3 booked")
    with pytest.raises(HTTPClientError) as refused:
        await _post(jp_fetch, "reservations", **{**slot, "start": "2027-03-02T10:00:00Z"})
    assert json.loads(refused.value.response.body)["error"] == full["problem"]
    assert (await _check(jp_fetch, **{**slot, "start": "2027-03-02T11:00:00Z"}))["problem"] is None

    # the budget: what is left of it after the three bookings ($9) does not cover a $30 slot
    await jp_fetch("portable", "api", "settings", method="PUT", body='{"budget_total": 20}')
    dear = await _check(jp_fetch, **{**slot, "start": "2027-03-03T09:00:00Z", "hours": 20})
    assert dear["price"] is None and "budget" in dear["problem"] and dear["hint"]
    assert len(await _booked(jp_fetch)) == 3


async def test_a_dry_run_of_a_body_of_the_wrong_shape_is_a_400(jp_serverapp: Any, jp_fetch: Any,
                                                                jp_root_dir: Path) -> None:
    for body, said in (({"offer": "a100", "start": "2027-03-02T09:00Z", "hours": 1}, "offer must be"),
                       ({"offer": "local/a100", "start": "2027-03-02T09:00Z", "hours": 1, "extra": 1}, "extra"),
                       ({"offer": "local/a100", "start": "2027-03-02T09:00Z", "hours": 10**400}, "hours")):
        with pytest.raises(HTTPClientError) as bad:
            await _post(jp_fetch, "reservations", "check", **body)
        assert bad.value.code == 400 and said in json.loads(bad.value.response.body)["error"]


async def test_a_dry_run_or_a_booking_that_starts_in_year_1_or_past_9999_is_a_400_not_a_500(
        jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    """Issue 40: a start of 0001-01-01T00:00Z made the charge time (2 h before it) overflow: an
    OverflowError in core/calendar.py, a 500. A time that date arithmetic could carry out of range is
    refused where it is read, as the wrong input it is."""
    for start in ("0001-01-01T00:00Z", "0001-01-01T00:30+01:00", "9999-12-31T23:00Z", "9999-12-31T23:00-05:00"):
        for path in (("reservations", "check"), ("reservations",)):
            with pytest.raises(HTTPClientError) as bad:
                await _post(jp_fetch, *path, offer="local/a100", start=start, hours=1, charge="before")
            assert bad.value.code == 400, (start, path)
            assert "out of range" in json.loads(bad.value.response.body)["error"]
    assert await _booked(jp_fetch) == []
