"""Each cloud provider's status() says what the machine has cost so far, and whether that is the
provider's own figure (measured) or a listed price x time (estimated): AWS from the Pricing API in
the allocation's region or the spot price history (boto3 under botocore's Stubber), Vast and RunPod
from their twins' instance records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from jupyter_portable.compute.aws import AwsProvider
from jupyter_portable.compute.base import Allocation

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def clients() -> Iterator[tuple[Any, Stubber, Any, Stubber]]:
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    ec2 = boto3.client("ec2", region_name="us-west-2", **creds)
    pricing = boto3.client("pricing", region_name="us-east-1", **creds)
    with Stubber(ec2) as ec2_stub, Stubber(pricing) as pricing_stub:
        yield ec2, ec2_stub, pricing, pricing_stub
        ec2_stub.assert_no_pending_responses()
        pricing_stub.assert_no_pending_responses()


def described(**fields: Any) -> dict[str, Any]:
    return {"Reservations": [{"ReservationId": "r-1", "OwnerId": "123456789012", "Instances": [
        {"InstanceId": "i-0abc", "InstanceType": "g5.xlarge", "State": {"Code": 16, "Name": "running"},
         "PublicIpAddress": "198.51.100.7", "LaunchTime": NOW - timedelta(hours=2),
         "Placement": {"AvailabilityZone": "us-west-2b"}, **fields}]}]}


def product(usd: str) -> str:
    """One PriceList entry as the Pricing API sends it: a JSON document in a string."""
    return json.dumps({"product": {"attributes": {"instanceType": "g5.xlarge", "regionCode": "us-west-2"}},
                       "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {
                           "unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}}})


def allocation() -> Allocation:
    return Allocation("al-1", "aws", "g5.xlarge@us-west-2b", "i-0abc", (NOW - timedelta(hours=2)).isoformat())


def test_aws_on_demand_spend_is_the_pricing_apis_price_in_the_region_times_the_launch_time(clients: Any) -> None:
    ec2, ec2_stub, pricing, pricing_stub = clients
    ec2_stub.add_response("describe_instances", described(), {"InstanceIds": ["i-0abc"]})
    pricing_stub.add_response("get_products", {"PriceList": [product("1.2120000000")], "FormatVersion": "aws_v1"}, {
        "ServiceCode": "AmazonEC2", "MaxResults": 10, "Filters": [
            {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "g5.xlarge"},
            {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-west-2"},
            {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
            {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
            {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
            {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"}]})
    aws = AwsProvider(client=ec2, pricing_client=pricing, clock=lambda: NOW)
    status = aws.status(allocation())
    assert status.state == "reachable"
    assert status.spend == pytest.approx(2 * 1.212) and status.spend_source == "provider-rate"
    # asked once per type and region: the next status reads the same price without a call
    ec2_stub.add_response("describe_instances", described(), {"InstanceIds": ["i-0abc"]})
    assert aws.status(allocation()).spend == pytest.approx(2 * 1.212)


def test_aws_spot_spend_follows_the_spot_price_history(clients: Any) -> None:
    ec2, ec2_stub, pricing, _ = clients
    ec2_stub.add_response("describe_instances", described(InstanceLifecycle="spot"), {"InstanceIds": ["i-0abc"]})
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        # in force before the launch, then a change an hour in
        {"InstanceType": "g5.xlarge", "AvailabilityZone": "us-west-2b", "SpotPrice": "0.40",
         "Timestamp": NOW - timedelta(hours=5), "ProductDescription": "Linux/UNIX"},
        {"InstanceType": "g5.xlarge", "AvailabilityZone": "us-west-2b", "SpotPrice": "0.50",
         "Timestamp": NOW - timedelta(hours=1), "ProductDescription": "Linux/UNIX"}]},
        {"InstanceTypes": ["g5.xlarge"], "AvailabilityZone": "us-west-2b", "ProductDescriptions": ["Linux/UNIX"],
         "StartTime": NOW - timedelta(hours=2), "EndTime": NOW})
    status = AwsProvider(client=ec2, pricing_client=pricing, clock=lambda: NOW).status(allocation())
    assert status.spend == pytest.approx(0.40 + 0.50) and status.spend_source == "provider-rate"


def test_aws_without_the_pricing_api_estimates_from_the_table(clients: Any) -> None:
    ec2, ec2_stub, pricing, pricing_stub = clients
    ec2_stub.add_response("describe_instances", described(), {"InstanceIds": ["i-0abc"]})
    pricing_stub.add_client_error("get_products", service_error_code="AccessDeniedException",
                                  service_message="not allowed", http_status_code=403)
    aws = AwsProvider(client=ec2, pricing_client=pricing, clock=lambda: NOW)
    status = aws.status(allocation())
    assert status.spend_source == "estimate"
    assert status.spend == pytest.approx(2 * aws.shapes["g5.xlarge"].price_per_hour)


@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_runpod_and_vast_spend_is_their_own_price_from_their_own_start(provider: str, tmp_path: Path) -> None:
    from twins.machines import unavailable

    if unavailable():
        pytest.skip(unavailable())
    offer = {"price": 36.0, "stock": 1}
    created: list[datetime] = []
    if provider == "runpod":
        from twins.runpod import RunPodTwin as TwinClass

        from jupyter_portable.compute.runpod import RunPodProvider

        make: Any = RunPodProvider
    else:
        from twins.vastai import VastTwin as TwinClass

        from jupyter_portable.compute.vastai import VastProvider

        make = VastProvider
    # the provider's calendar and ours, both passed in: rented at 09:00, asked ten minutes later
    rented = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)
    later = rented + timedelta(minutes=10)
    with TwinClass(tmp_path, offers=[offer], boot_delay_s=0.2, wall=lambda: rented) as twin:
        p = make(**twin.provider_kwargs(), now=lambda: later)
        allocation = p.launch(p.offers()[0], allocation_id="al-spend00001")
        created.append(twin.rentals[allocation.ref].created_at)
        assert created == [rented]
        status = p.status(allocation)
        expected = 36.0 * (later - created[0]).total_seconds() / 3600
        assert status.spend_source == "provider-rate" and status.spend == pytest.approx(expected, abs=0.01)
        [listed] = p.list_machines()
        assert listed.spend == pytest.approx(expected, abs=0.01) and listed.uptime_s == pytest.approx(
            (later - created[0]).total_seconds(), abs=1)
        p.terminate(allocation)
