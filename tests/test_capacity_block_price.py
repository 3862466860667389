"""AWS Capacity Blocks at what AWS charges (issue 27, items 2 and 5), against the AWS twin, which
serves Capacity Block offerings as EC2 does (whole days from 1 to 14, then whole weeks; an
upfront fee per offering): a booking is checked against the budget at the offering's upfront fee
for the whole days sold, not the listed $/h x the hours asked; that price is shown before the block
is bought, and only a booking that confirms it buys one; an instance launched into the block is
priced at the block's price, not on-demand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from twins.aws import AwsTwin

from jupyter_portable import Workspace
from jupyter_portable.compute.aws import AwsProvider
from jupyter_portable.core.errors import UsageError
from jupyter_portable.orchestration import reservations
from jupyter_portable.orchestration.routes import into_reserved
from jupyter_portable.orchestration.settings import update_settings

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
START = "2026-12-02T11:00:00Z"
KEY = "aws/p5.48xlarge@us-east-1a"
DAY_FEE = 700.0  # the twin's fee for a p5.48xlarge day; its on-demand price in the table is far more per hour


@pytest.fixture
def twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsTwin]:
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, capacity_blocks={"p5.48xlarge": DAY_FEE}) as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        yield twin
        assert twin.errors == []


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace.init(root, f"file://{tmp_path / 'store'}")


def aws(clock: datetime = NOW) -> dict[str, AwsProvider]:
    return {"aws": AwsProvider(clock=lambda: clock, spot=False, caller_address=lambda: "198.51.100.7")}


def test_a_block_is_quoted_at_the_offerings_upfront_fee_for_whole_days(twin: AwsTwin, ws: Workspace) -> None:
    shown = reservations.quote(ws, KEY, START, 5, providers=aws(), now=NOW)
    # five hours are sold as one whole day, at the offering's fee; nothing is bought by asking
    assert (shown["hours"], shown["requested_hours"], shown["price"]) == (24.0, 5, DAY_FEE)
    assert shown["start"].startswith("2026-12-02T11:30") and shown["guarantee"] == "provider"
    assert "UpfrontFee" in shown["price_source"]
    longer = reservations.quote(ws, KEY, START, 10 * 24 + 3, providers=aws(), now=NOW)
    assert (longer["hours"], longer["price"]) == (11 * 24.0, 11 * DAY_FEE)  # 10 days and 3 hours: 11 days
    assert twin.purchases == []


def test_a_block_is_checked_against_the_budget_at_its_fee_and_bought_only_at_a_confirmed_price(
        twin: AwsTwin, ws: Workspace) -> None:
    provider = aws()
    listed = next(o for o in provider["aws"].offers() if o.key == KEY)
    assert listed.price_per_hour * 5 < 600 < DAY_FEE  # the listed $/h x 5 h would fit; the day sold does not
    update_settings(ws, budget_total=600)
    with pytest.raises(UsageError, match="over the .* left of the budget") as over:
        reservations.reserve(ws, KEY, START, 5, providers=provider, now=NOW, max_price=DAY_FEE)
    assert "$700.00 total for 24 h" in str(over.value)
    assert twin.purchases == []

    update_settings(ws, budget_total=2000)
    with pytest.raises(UsageError, match="before its price is confirmed") as unconfirmed:
        reservations.reserve(ws, KEY, START, 5, providers=provider, now=NOW)
    text = str(unconfirmed.value)
    assert "USD 700.00" in text and "1 whole day (24 h for the 5 h asked)" in text and "upfront fee" in text
    assert "--max-price 700.00" in (unconfirmed.value.hint or "")
    with pytest.raises(UsageError, match="more than the 699.00 confirmed"):
        reservations.reserve(ws, KEY, START, 5, providers=provider, now=NOW, max_price=699)
    assert twin.purchases == []

    booking = reservations.reserve(ws, KEY, START, 5, providers=provider, now=NOW, max_price=DAY_FEE)
    assert (booking.guarantee, booking.price, booking.hours) == ("provider", DAY_FEE, 24.0)
    [bought] = twin.purchases
    assert bought["CapacityReservationId"] == booking.reservation_id and bought["UpfrontFee"] == "700.00"
    # the block now counts against what is left ($1300): two more days ($1400) do not fit
    with pytest.raises(UsageError, match=r"\$1400.00 total for 48 h is over the \$1300.00 left"):
        reservations.reserve(ws, KEY, "2026-12-04T11:00:00Z", 48, providers=provider, now=NOW, max_price=2 * DAY_FEE)
    assert len(twin.purchases) == 1


def test_an_instance_in_the_block_is_priced_at_the_blocks_price(twin: AwsTwin, ws: Workspace) -> None:
    from types import SimpleNamespace

    update_settings(ws, budget_total=2000)
    booking = reservations.reserve(ws, KEY, START, 24, providers=aws(), now=NOW, max_price=DAY_FEE)
    start = datetime(2026, 12, 2, 11, 0, tzinfo=timezone.utc)
    provider = aws()["aws"]
    offer = next(o for o in provider.offers() if o.key == KEY)
    [route] = into_reserved(ws, [SimpleNamespace(offer=offer)], now=start + timedelta(hours=1))
    assert route.offer.extra["capacity_reservation_id"] == booking.reservation_id
    assert route.offer.extra["block_price_per_hour"] == pytest.approx(DAY_FEE / 24)
    allocation = provider.launch(route.offer, allocation_id="al-block01")
    assert allocation.details["capacity_reservation_id"] == booking.reservation_id
    import boto3

    [described] = boto3.client("ec2").describe_instances(InstanceIds=[allocation.ref])["Reservations"]
    two_hours_on = described["Instances"][0]["LaunchTime"] + timedelta(hours=2)
    later = AwsProvider(clock=lambda: two_hours_on, spot=False)
    status = later.status(allocation)
    # two hours of the block: its fee over its hours, the rate AWS charged; not the on-demand price
    assert status.spend == pytest.approx(2 * DAY_FEE / 24, rel=1e-3) and status.spend_source == "provider-rate"
    assert abs(status.spend - 2 * offer.price_per_hour) > 1
    # `machines` prices it the same way: at the block's rate, not on-demand
    [listed] = [m for m in later.list_machines() if m.ref == allocation.ref]
    assert listed.price_per_hour == pytest.approx(DAY_FEE / 24) and listed.spend == pytest.approx(status.spend)
    assert listed.spend_source == "provider-rate"
    # the budget rebuilds the allocation from its record, without the launch's details: priced at
    # the block's rate all the same (from the instance's tag), with or without the booking named
    from jupyter_portable.orchestration.budget import provider_figure

    record = {"allocation_id": "al-block01", "provider": "aws", "offer": route.offer.id, "ref": allocation.ref,
              "started": allocation.started, "reservation_id": booking.reservation_id,
              "price_per_hour": route.offer.price_per_hour}
    for rebuilt in (record, {k: v for k, v in record.items() if k not in ("reservation_id", "price_per_hour")}):
        spend, source = provider_figure({"aws": later})(rebuilt)  # type: ignore[misc]
        assert spend == pytest.approx(status.spend, rel=1e-3) and source == "provider-rate", (rebuilt, spend)
    later.terminate(allocation)


def test_the_cli_shows_the_blocks_price_before_it_buys_it(twin: AwsTwin, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import os
    import subprocess
    import sys

    from jupyter_e2e import make_workspace

    root = tmp_path / "cli-ws"
    make_workspace(root, tmp_path / "cli-store")
    # the CLI's calendar starts at the test's NOW (c.Portable.now): the block is booked from it
    env = {**os.environ, "JUPYTER_PORTABLE_PROVIDERS": "aws", "JUPYTER_PORTABLE_NOW": NOW.isoformat(),
           "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market")}
    jp = str(Path(sys.executable).parent / "jupyter-portable")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([jp, "reserve", KEY, "--start", START, "--hours",
                               "5", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)

    quoted = cli("--quote", "--json")
    assert quoted.returncode == 0, quoted.stderr
    shown = json.loads(quoted.stdout)
    assert (shown["price"], shown["hours"], shown["requested_hours"]) == (DAY_FEE, 24.0, 5.0)
    refused = cli("--json")
    assert refused.returncode != 0 and "700.00" in refused.stderr and "1 whole day" in refused.stderr
    assert twin.purchases == []
    bought = cli("--max-price", "700", "--json")
    assert bought.returncode == 0, bought.stderr
    assert json.loads(bought.stdout)["price"] == DAY_FEE and len(twin.purchases) == 1


def test_a_route_into_a_block_in_force_shows_the_blocks_price_and_its_paid_money(twin: AwsTwin, ws: Workspace) -> None:
    from jupyter_portable.orchestration.routes import compute_routes

    provider = aws()
    listed = next(o for o in provider["aws"].offers() if o.key == KEY)
    update_settings(ws, budget_total=DAY_FEE + 50, hours=8)
    reservations.reserve(ws, KEY, START, 24, providers=provider, now=NOW, max_price=DAY_FEE)
    before, _ = compute_routes(ws, providers=provider, now=NOW)  # the block has not begun: on-demand
    [route] = [r for r in before if r.offer.key == KEY]
    assert route.offer.price_per_hour == listed.price_per_hour and route.blocked  # 8 h of it are over $50 left
    in_force = datetime(2026, 12, 2, 13, 0, tzinfo=timezone.utc)
    during, _ = compute_routes(ws, providers=aws(in_force), now=in_force)
    [route] = [r for r in during if r.offer.key == KEY]
    # the block's price over its hours, what its machines' spend counts; paid already, so the $50
    # left of the budget does not block it, and it is the first route
    assert route.offer.price_per_hour == pytest.approx(DAY_FEE / 24)
    assert route.cost.gpu == pytest.approx(8 * DAY_FEE / 24, rel=1e-3) and route.blocked is None
    assert route.rank == 1 and route.offer.extra["capacity_reservation_id"]
    others = [r for r in during if r.offer.key != KEY and r.cost.total > 50]
    assert others and all(r.blocked for r in others)  # the rest still hold to what is left
