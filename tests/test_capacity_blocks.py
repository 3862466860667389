"""AWS Capacity Blocks booked through the workspace (issue 13): the booking is checked before the
block is bought, a bought block is recorded (retried, else kept in the copy until the store takes
it, never lost), and the launch at the slot's start goes into it. A real boto3 EC2 client under
botocore's Stubber: a call nobody stubbed (a purchase that must not happen) fails the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from jupyter_portable import Workspace
from jupyter_portable.compute.aws import AwsProvider
from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.orchestration import reservations
from jupyter_portable.orchestration.routes import into_reserved

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
START = datetime(2026, 12, 2, 11, 0, tzinfo=timezone.utc)
KEY = "aws/p5.48xlarge@us-east-1a"


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace.init(root, f"file://{tmp_path / 'store'}")


def listed(stub: Stubber) -> None:
    """EC2 lists p5.48xlarge in us-east-1a (what finding the offer asks)."""
    stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
        {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": "us-east-1a"}]}, None)
    stub.add_response("describe_instance_types", {"InstanceTypes": [
        {"InstanceType": "p5.48xlarge", "GpuInfo": {"Gpus": [{"Name": "H100", "Manufacturer": "NVIDIA", "Count": 8,
                                                              "MemoryInfo": {"SizeInMiB": 81920}}]}}]}, None)


def sold(stub: Stubber) -> None:
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        {"CapacityBlockOfferingId": "cb-0mine", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
         "InstanceCount": 1, "StartDate": START, "EndDate": START + timedelta(hours=24),
         "CapacityBlockDurationHours": 24, "UpfrontFee": "1200.00", "CurrencyCode": "USD", "Tenancy": "default"}]},
        {"InstanceType": "p5.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 24, "StartDateRange": START,
         "EndDateRange": START + timedelta(hours=48)})
    stub.add_response("purchase_capacity_block", {"CapacityReservation": {
        "CapacityReservationId": "cr-0abc", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
        "State": "scheduled", "StartDate": START, "EndDate": START + timedelta(hours=24)}},
        {"CapacityBlockOfferingId": "cb-0mine", "InstancePlatform": "Linux/UNIX"})


def aws(client: Any) -> dict[str, Any]:
    return {"aws": AwsProvider(client=client, clock=lambda: NOW, spot=False)}


def stored(ws: Workspace) -> list[str]:
    return [e["reservation_id"] for e in ws.store.read_doc(ws.workspace_id, "reservations") or []]


def test_a_refused_booking_buys_nothing(ec2: tuple[Any, Stubber], ws: Workspace) -> None:
    client, stub = ec2
    # the stored reservations cannot be read: the booking cannot be checked, so nothing is bought
    ws.store.update_doc(ws.workspace_id, "reservations", lambda cur: {"not": "a list"})
    listed(stub)  # no purchase is stubbed: buying would fail the Stubber, not raise UsageError
    with pytest.raises(UsageError, match="not a list"):
        reservations.reserve(ws, KEY, START.isoformat(), 24, providers=aws(client), now=NOW)
    # off the hour: refused before the provider is even asked
    with pytest.raises(UsageError, match="whole hours"):
        reservations.reserve(ws, KEY, (START + timedelta(minutes=30)).isoformat(), 24, providers=aws(client),
                             now=NOW)


def test_a_bought_block_is_recorded_and_the_launch_at_its_start_goes_into_it(ec2: tuple[Any, Stubber],
                                                                              ws: Workspace) -> None:
    client, stub = ec2
    listed(stub)
    sold(stub)
    providers = aws(client)
    booking = reservations.reserve(ws, KEY, START.isoformat(), 24, providers=providers, now=NOW, max_price=1200)
    assert (booking.reservation_id, booking.guarantee, booking.price) == ("cr-0abc", "provider", 1200.0)
    assert stored(ws) == ["cr-0abc"]

    block = Offer(provider="aws", id="p5.48xlarge@us-east-1a", gpu="H100", gpu_count=8, gpu_memory_gb=80,
                  price_per_hour=98.32, region="us-east-1")
    cheaper = Offer(provider="aws", id="g5.xlarge@us-east-1a", gpu="A10G", gpu_count=1, gpu_memory_gb=24,
                    price_per_hour=1.0, region="us-east-1")
    routes = [SimpleNamespace(offer=cheaper), SimpleNamespace(offer=block)]
    # before the slot: the ranking stands and nothing names the block
    assert [r.offer for r in into_reserved(ws, routes, now=START - timedelta(hours=1))] == [cheaper, block]
    assert "capacity_reservation_id" not in block.extra
    # at its start: the block's route first, naming the reservation, and the launch goes into it
    first = into_reserved(ws, routes, now=START + timedelta(minutes=5))[0].offer
    assert first is block and block.extra["capacity_reservation_id"] == "cr-0abc"
    stub.add_response("run_instances", {"Instances": [{"InstanceId": "i-0block", "LaunchTime": START}]}, {
        "ImageId": ANY, "InstanceType": "p5.48xlarge", "MinCount": 1, "MaxCount": 1, "ClientToken": "al-block",
        "InstanceInitiatedShutdownBehavior": "terminate",
        "Placement": {"AvailabilityZone": "us-east-1a"}, "TagSpecifications": ANY,
        "InstanceMarketOptions": {"MarketType": "capacity-block"},
        "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": "cr-0abc"}}})
    assert providers["aws"].launch(first, allocation_id="al-block").ref == "i-0block"


def test_a_failed_record_after_a_purchase_is_retried_then_kept_never_lost(ec2: tuple[Any, Stubber], ws: Workspace,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    client, stub = ec2
    listed(stub)
    sold(stub)
    real = ws.store.update_doc
    failures = {"left": 99}

    def flaky(*args: Any, **kw: Any) -> Any:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise PortableError("the store did not answer")
        return real(*args, **kw)

    waits: list[float] = []
    monkeypatch.setattr(ws.store, "update_doc", flaky)
    with pytest.raises(PortableError, match="cr-0abc") as err:
        reservations.reserve(ws, KEY, START.isoformat(), 24, providers=aws(client), now=NOW, sleep=waits.append,
                             max_price=1200)
    assert len(waits) == reservations.RECORD_TRIES - 1  # tried again, with growing waits
    assert waits == sorted(waits) and "do not buy it again" in (err.value.hint or "")
    kept = json.loads((ws.copy.root / ".portable" / "unrecorded-reservations.json").read_text())
    assert [k["reservation_id"] for k in kept] == ["cr-0abc"]
    assert stored(ws) == []
    # the store answers again: the next read records the block, and the copy forgets it
    failures["left"] = 0
    assert [b.reservation_id for b in reservations.reservations(ws)] == ["cr-0abc"]
    assert stored(ws) == ["cr-0abc"] and not (ws.copy.root / ".portable" / "unrecorded-reservations.json").exists()


def test_a_record_that_fails_twice_is_retried_into_the_store(ec2: tuple[Any, Stubber], ws: Workspace,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    client, stub = ec2
    listed(stub)
    sold(stub)
    real = ws.store.update_doc
    calls = {"n": 0}

    def twice_down(*args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise PortableError("the store did not answer")
        return real(*args, **kw)

    monkeypatch.setattr(ws.store, "update_doc", twice_down)
    waits: list[float] = []
    booking = reservations.reserve(ws, KEY, START.isoformat(), 24, providers=aws(client), now=NOW,
                                   sleep=waits.append, max_price=1200)
    assert booking.reservation_id == "cr-0abc" and len(waits) == 2
    assert stored(ws) == ["cr-0abc"]
