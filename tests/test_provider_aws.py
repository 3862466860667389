"""The AWS provider against a real boto3 EC2 client under botocore's Stubber.

The Stubber checks every request against EC2's service model and every canned response
against the model's output shapes, so these fixtures are the API's contract, not guesses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import ANY, Stubber

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.aws import DLAMI_IMAGE, AwsProvider, block_hours
from jupyter_portable.compute.base import Allocation, Reservation
from jupyter_portable.core.errors import (
    AuthError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    ProviderUnavailable,
    QuotaExceeded,
    UsageError,
)
from jupyter_portable.core.offers import Offer, Requirements

# A fixed clock: the provider judges an instance's age against it, never the wall clock.
NOW = datetime(2026, 11, 3, 10, 0, tzinfo=timezone.utc)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests worker@test"


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def provider(client: Any, **kw: Any) -> AwsProvider:
    return AwsProvider(client=client, clock=lambda: NOW, **kw)


def offer(offer_id: str = "g5.xlarge@us-east-1a", **kw: Any) -> Offer:
    return Offer(provider="aws", id=offer_id, gpu="A10G", gpu_count=1, gpu_memory_gb=24, price_per_hour=1.006,
                 region="us-east-1", spot=offer_id.endswith(":spot"), **kw)


def allocation(ref: str = "i-0123456789abcdef0", started: datetime | None = None) -> Allocation:
    started = started or NOW - timedelta(hours=1)
    return Allocation(allocation_id="alloc-1", provider="aws", offer_id="g5.xlarge@us-east-1a", ref=ref,
                      started=started.isoformat())


def client_error(stub: Stubber, method: str, code: str, message: str, status: int = 400,
                 expected: dict[str, Any] | None = None) -> None:
    stub.add_client_error(method, service_error_code=code, service_message=message, http_status_code=status,
                          expected_params=expected)


def gpu_type(name: str, gpu: str, count: int, mib: int) -> dict[str, Any]:
    return {"InstanceType": name, "GpuInfo": {"Gpus": [{"Name": gpu, "Manufacturer": "NVIDIA", "Count": count,
                                                        "MemoryInfo": {"SizeInMiB": mib}}],
                                              "TotalGpuMemoryInMiB": count * mib}}


def instance(state: str, code: int, **fields: Any) -> dict[str, Any]:
    return {"Reservations": [{"ReservationId": "r-1", "OwnerId": "123456789012", "Instances": [
        {"InstanceId": "i-0123456789abcdef0", "InstanceType": "g5.xlarge", "State": {"Code": code, "Name": state},
         "LaunchTime": NOW - timedelta(minutes=3), **fields}]}]}


def dry_run_params(instance_type: str = "g5.xlarge", zone: str = "us-east-1a") -> dict[str, Any]:
    return {"DryRun": True, "ImageId": DLAMI_IMAGE, "InstanceType": instance_type, "MinCount": 1, "MaxCount": 1,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "Placement": {"AvailabilityZone": zone},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                {"Key": "jupyter-portable:allocation", "Value": "dry-run"},
                {"Key": "Name", "Value": "jupyter-portable dry-run"}]}]}


# -- listed ---------------------------------------------------------------------------

def test_offers_join_zones_gpus_and_spot_prices(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": [
        {"InstanceType": "g5.xlarge", "LocationType": "availability-zone", "Location": "us-east-1a"},
        {"InstanceType": "g5.xlarge", "LocationType": "availability-zone", "Location": "us-east-1b"},
        {"InstanceType": "p5.48xlarge", "LocationType": "availability-zone", "Location": "us-east-1a"},
    ]}, {"LocationType": "availability-zone",
         "Filters": [{"Name": "instance-type", "Values": list(gpu_catalog.AWS)}]})
    stub.add_response("describe_instance_types", {"InstanceTypes": [
        gpu_type("g5.xlarge", "A10G", 1, 24576), gpu_type("p5.48xlarge", "H100", 8, 81920)]},
        {"InstanceTypes": ["g5.xlarge", "p5.48xlarge"]})
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.5012", "Timestamp": NOW - timedelta(hours=5)},
        {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.4123", "Timestamp": NOW - timedelta(minutes=20)},
    ]}, {"InstanceTypes": ["g5.xlarge", "p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY})

    offers = {o.id: o for o in provider(client).offers()}

    assert sorted(offers) == ["g5.xlarge@us-east-1a", "g5.xlarge@us-east-1a:spot", "g5.xlarge@us-east-1b",
                              "p5.48xlarge@us-east-1a"]
    h100 = offers["p5.48xlarge@us-east-1a"]
    assert (h100.gpu, h100.gpu_count, h100.gpu_memory_gb) == ("H100", 8, 80.0)
    assert h100.region == "us-east-1" and h100.reservable and not h100.spot
    assert h100.price_per_hour == gpu_catalog.AWS["p5.48xlarge"].price_per_hour
    assert h100.capacity is None  # an offering is not capacity
    spot = offers["g5.xlarge@us-east-1a:spot"]
    assert spot.spot and spot.price_per_hour == pytest.approx(0.4123)  # the latest price, not the first
    assert spot.reliability < 1.0
    assert offers["g5.xlarge@us-east-1b"].extra["availability_zone"] == "us-east-1b"


def test_offers_ask_only_about_types_that_could_meet_the_requirements(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": []},
                      {"LocationType": "availability-zone",
                       "Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}]})
    assert provider(client).offers(Requirements(gpus=("H100",))) == []
    assert provider(client).offers(Requirements(regions=("eu-west-1",), gpus=("H100",))) == []


# -- permitted ------------------------------------------------------------------------

def test_a_permitted_dry_run_passes(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    client_error(stub, "run_instances", "DryRunOperation",
                 "Request would have succeeded, but DryRun flag is set.", 412, dry_run_params())
    assert provider(client).check_permission(offer()) is None


def test_an_unauthorized_dry_run_is_an_auth_error(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    client_error(stub, "run_instances", "UnauthorizedOperation",
                 "You are not authorized to perform this operation.", 403, dry_run_params())
    with pytest.raises(AuthError) as err:
        provider(client).check_permission(offer())
    assert err.value.provider == "aws" and "UnauthorizedOperation" in str(err.value)
    assert "ec2:RunInstances" in (err.value.hint or "")


def test_a_vcpu_limit_is_quota_with_the_quota_code_to_raise(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    client_error(stub, "run_instances", "VcpuLimitExceeded",
                 "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance "
                 "bucket that the specified instance type belongs to.", 400,
                 dry_run_params("p5.48xlarge"))
    with pytest.raises(QuotaExceeded) as err:
        provider(client).check_permission(offer("p5.48xlarge@us-east-1a"))
    assert "L-417A185B" in (err.value.hint or "")  # On-Demand P instances


def test_capacity_cannot_be_known_without_launching(ec2: tuple[Any, Stubber]) -> None:
    client, _ = ec2
    assert provider(client).check_capacity(offer()) is None


# -- launched -------------------------------------------------------------------------

def launched(state: str = "pending") -> dict[str, Any]:
    return {"ReservationId": "r-1", "OwnerId": "123456789012", "Groups": [], "Instances": [
        {"InstanceId": "i-0123456789abcdef0", "InstanceType": "g5.xlarge", "State": {"Code": 0, "Name": state},
         "LaunchTime": NOW, "Placement": {"AvailabilityZone": "us-east-1a"}}]}


def test_launch_tags_the_allocation_and_hands_over_the_key(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    sent: list[dict[str, Any]] = []
    client.meta.events.register("provide-client-params.ec2.RunInstances",
                                lambda params, **_: sent.append(dict(params)))
    stub.add_response("run_instances", launched(), {
        "ImageId": "ami-0abc", "InstanceType": "g5.xlarge", "MinCount": 1, "MaxCount": 1, "ClientToken": "alloc-7",
        "InstanceInitiatedShutdownBehavior": "terminate",
        "Placement": {"AvailabilityZone": "us-east-1a"}, "KeyName": "mine", "SecurityGroupIds": ["sg-1"],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [
            {"Key": "jupyter-portable:allocation", "Value": "alloc-7"},
            {"Key": "Name", "Value": "jupyter-portable alloc-7"}]}],
        "UserData": ANY,
        "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}})

    alloc = provider(client, key_name="mine", security_group_ids=["sg-1"]).launch(
        offer("g5.xlarge@us-east-1a:spot"), allocation_id="alloc-7", image="ami-0abc", ssh_public_key=KEY,
        env={"HF_TOKEN": "hf_secret value"})

    assert (alloc.ref, alloc.provider, alloc.allocation_id) == ("i-0123456789abcdef0", "aws", "alloc-7")
    assert alloc.details["market"] == "spot" and alloc.details["availability_zone"] == "us-east-1a"
    assert "hf_secret" not in json.dumps(alloc.to_json())
    user_data = sent[0]["UserData"]
    assert user_data.startswith("#cloud-config\n")
    config = json.loads(user_data.split("\n", 1)[1])
    assert config["ssh_authorized_keys"] == [KEY]
    [env_file] = config["write_files"]
    assert env_file["permissions"] == "0600" and env_file["content"] == "export HF_TOKEN='hf_secret value'\n"


def test_launch_into_a_capacity_block(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("run_instances", launched(), {
        "ImageId": DLAMI_IMAGE, "InstanceType": "p5.48xlarge", "MinCount": 1, "MaxCount": 1,
        "InstanceInitiatedShutdownBehavior": "terminate",
        "ClientToken": "alloc-8", "Placement": {"AvailabilityZone": "us-east-1a"}, "TagSpecifications": ANY,
        "InstanceMarketOptions": {"MarketType": "capacity-block"},
        "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": "cr-0abc"}}})
    block = offer("p5.48xlarge@us-east-1a", extra={"capacity_reservation_id": "cr-0abc"})
    assert provider(client).launch(block, allocation_id="alloc-8").ref == "i-0123456789abcdef0"


@pytest.mark.parametrize(("code", "message", "raised"), [
    ("InsufficientInstanceCapacity", "We currently do not have sufficient g5.xlarge capacity in the Availability "
     "Zone you requested (us-east-1a). Our system will be working on provisioning additional capacity. You can "
     "currently get g5.xlarge capacity by not specifying an Availability Zone in your request or choosing "
     "us-east-1b, us-east-1c.", NoCapacity),
    ("Unsupported", "Your requested instance type (g5.xlarge) is not supported in your requested Availability "
     "Zone (us-east-1e). Please retry your request by not specifying an Availability Zone.", NoCapacity),
    ("SpotMaxPriceTooLow", "Your Spot request price of 0.1 is lower than the minimum required Spot request "
     "fulfillment price of 0.4123.", NoCapacity),
    ("InstanceLimitExceeded", "You have requested more instances (2) than your current instance limit of 1 "
     "allows for the specified instance type.", QuotaExceeded),
    ("AuthFailure", "AWS was not able to validate the provided access credentials", AuthError),
    ("InvalidAMIID.NotFound", "The image id '[ami-0abc]' does not exist", LaunchFailed),
    ("RequestLimitExceeded", "Request limit exceeded.", ProviderUnavailable),
])
def test_launch_errors_map_to_the_tree(ec2: tuple[Any, Stubber], code: str, message: str, raised: type) -> None:
    client, stub = ec2
    client_error(stub, "run_instances", code, message)
    with pytest.raises(raised) as err:
        provider(client).launch(offer(), allocation_id="alloc-9")
    assert code in str(err.value) and err.value.offer == "g5.xlarge@us-east-1a"
    assert isinstance(err.value.__cause__, Exception)  # translated with `from`, never swallowed


def test_insufficient_capacity_says_which_zones_aws_suggests(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    client_error(stub, "run_instances", "InsufficientInstanceCapacity",
                 "We currently do not have sufficient g5.xlarge capacity in the Availability Zone you requested "
                 "(us-east-1a). You can currently get g5.xlarge capacity by choosing us-east-1b.")
    with pytest.raises(NoCapacity) as err:
        provider(client).launch(offer(), allocation_id="alloc-9")
    assert "us-east-1b" in str(err.value) and err.value.hint


# -- afterwards -----------------------------------------------------------------------

def test_status_follows_pending_running_reachable(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    expected = {"InstanceIds": ["i-0123456789abcdef0"]}
    stub.add_response("describe_instances", instance("pending", 0), expected)
    stub.add_response("describe_instances", instance("running", 16), expected)
    stub.add_response("describe_instances", instance("running", 16, PublicIpAddress="3.80.12.34"), expected)
    aws = provider(client)

    assert aws.status(allocation()).state == "pending"
    running = aws.status(allocation())
    assert running.state == "running" and running.ssh is None
    reachable = aws.status(allocation())
    assert reachable.state == "reachable"
    assert reachable.ssh is not None and reachable.ssh.to_json() == {"host": "3.80.12.34", "port": 22,
                                                                     "user": "ubuntu"}


def test_a_spot_interruption_is_lost_with_the_reason(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_instances", instance(
        "terminated", 48, InstanceLifecycle="spot",
        StateReason={"Code": "Server.SpotInstanceTermination",
                     "Message": "Server.SpotInstanceTermination: A Spot Instance was terminated due to an "
                                "interruption."}))
    status = provider(client).status(allocation())
    assert status.state == "lost" and "interruption" in (status.reason or "")


def test_a_user_termination_is_terminated_not_lost(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_instances", instance(
        "terminated", 48, StateReason={"Code": "Client.UserInitiatedShutdown",
                                       "Message": "Client.UserInitiatedShutdown: User initiated shutdown"}))
    assert provider(client).status(allocation()).state == "terminated"


def test_a_fresh_instance_missing_from_ec2_is_still_pending(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    for _ in range(2):
        client_error(stub, "describe_instances", "InvalidInstanceID.NotFound",
                     "The instance ID 'i-0123456789abcdef0' does not exist")
    aws = provider(client)
    assert aws.status(allocation(started=NOW)).state == "pending"  # eventual consistency
    assert aws.status(allocation(started=NOW - timedelta(days=1))).state == "terminated"


def test_terminate_and_terminate_again(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    expected = {"InstanceIds": ["i-0123456789abcdef0"]}
    stub.add_response("terminate_instances", {"TerminatingInstances": [
        {"InstanceId": "i-0123456789abcdef0", "CurrentState": {"Code": 32, "Name": "shutting-down"},
         "PreviousState": {"Code": 16, "Name": "running"}}]}, expected)
    client_error(stub, "terminate_instances", "InvalidInstanceID.NotFound",
                 "The instance ID 'i-0123456789abcdef0' does not exist", expected=expected)
    aws = provider(client)
    aws.terminate(allocation())
    aws.terminate(allocation())  # already gone: not an error


# -- reservations ---------------------------------------------------------------------

START = datetime(2026, 12, 1, 11, 30, tzinfo=timezone.utc)


def block_offering(offering_id: str, zone: str, fee: str, start: datetime = START) -> dict[str, Any]:
    return {"CapacityBlockOfferingId": offering_id, "InstanceType": "p5.48xlarge", "AvailabilityZone": zone,
            "InstanceCount": 1, "StartDate": start, "EndDate": start + timedelta(hours=48),
            "CapacityBlockDurationHours": 48, "UpfrontFee": fee, "CurrencyCode": "USD", "Tenancy": "default"}


def test_reserve_buys_a_capacity_block_in_the_offers_zone(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        block_offering("cb-0other", "us-east-1b", "2100.00"),
        block_offering("cb-0mine", "us-east-1a", "2400.00"),
    ]}, {"InstanceType": "p5.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 48,
         "StartDateRange": START, "EndDateRange": START + timedelta(hours=72)})
    stub.add_response("purchase_capacity_block", {"CapacityReservation": {
        "CapacityReservationId": "cr-0abc", "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1a",
        "State": "scheduled", "StartDate": START, "EndDate": START + timedelta(hours=48)}},
        {"CapacityBlockOfferingId": "cb-0mine", "InstancePlatform": "Linux/UNIX"})

    booked = provider(client).reserve(offer("p5.48xlarge@us-east-1a"), start=START.isoformat(), hours=30)

    assert isinstance(booked, Reservation)
    assert (booked.reservation_id, booked.guarantee, booked.price, booked.hours) == ("cr-0abc", "provider",
                                                                                      2400.0, 48.0)
    assert booked.offer_id == "p5.48xlarge@us-east-1a" and booked.start == START.isoformat()
    assert booked.details["capacity_reservation_id"] == "cr-0abc"


def test_no_capacity_block_on_offer_is_no_capacity(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []},
                      {"InstanceType": "p5.48xlarge", "InstanceCount": 1, "CapacityDurationHours": 24,
                       "StartDateRange": START, "EndDateRange": START + timedelta(hours=48)})
    with pytest.raises(NoCapacity) as err:
        provider(client).reserve(offer("p5.48xlarge@us-east-1a"), start=START.isoformat(), hours=8)
    assert "Capacity Block" in str(err.value)


def test_capacity_blocks_cannot_be_cancelled_or_bought_for_spot(ec2: tuple[Any, Stubber]) -> None:
    client, _ = ec2
    aws = provider(client)
    booked = Reservation("cr-0abc", "aws", "p5.48xlarge@us-east-1a", START.isoformat(), 48, "provider", 2400.0)
    with pytest.raises(NotSupported, match="cannot be cancelled"):
        aws.cancel_reservation(booked)
    with pytest.raises(NotSupported):
        aws.reserve(offer("p5.48xlarge@us-east-1a:spot"), start=START.isoformat(), hours=24)


@pytest.mark.parametrize(("hours", "booked"), [(1, 24), (24, 24), (25, 48), (14 * 24, 14 * 24),
                                               (15 * 24, 21 * 24), (182 * 24, 182 * 24)])
def test_block_durations_are_ones_ec2_sells(hours: float, booked: int) -> None:
    assert block_hours(hours) == booked


def test_a_block_longer_than_ec2_sells_is_refused() -> None:
    with pytest.raises(NotSupported):
        block_hours(183 * 24)


# -- the boundary ---------------------------------------------------------------------

def test_an_unreachable_endpoint_is_provider_unavailable() -> None:
    client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing", endpoint_url="http://127.0.0.1:9",
                          config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2))
    with pytest.raises(ProviderUnavailable) as err:
        provider(client, terminate_attempts=1).terminate(allocation())
    assert err.value.context["may_be_running"] is True and "may still be running" in str(err.value)


def test_missing_credentials_are_an_auth_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AuthError) as err:
        AwsProvider(region="us-east-1").terminate(allocation())
    assert err.value.hint and "AWS_PROFILE" in err.value.hint


# -- an answer that is not EC2's ------------------------------------------------------

# a captive portal's page, as such pages are: HTML, not XML (an unclosed <meta>, a <br>)
HTML = (b'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Sign in</title></head>'
        b"<body>Proxy login required<br>session-token-Zq81canary</body></html>")


@pytest.fixture
def not_ec2() -> Iterator[tuple[str, list[int]]]:
    """A real HTTP server on loopback that answers every request with an HTML page; the
    status it sends is the list's first item (tests change it)."""
    import http.server
    import threading

    status = [200]

    class Page(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # EC2's query API is all POSTs
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status[0])
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(HTML)))
            self.end_headers()
            self.wfile.write(HTML)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", status
    finally:
        server.shutdown()
        server.server_close()


def html_client(url: str) -> Any:
    return boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", endpoint_url=url,
                        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=5,
                                      read_timeout=30))


@pytest.mark.parametrize("status", [200, 502])
def test_an_answer_that_is_not_ec2_xml_is_provider_unavailable_without_the_page(
        not_ec2: tuple[str, list[int]], status: int) -> None:
    url, sends = not_ec2
    sends[0] = status
    subject = provider(html_client(url), terminate_attempts=1)
    for call in (subject.offers, lambda: subject.check_permission(offer()), lambda: subject.status(allocation()),
                 lambda: subject.terminate(allocation())):
        with pytest.raises(ProviderUnavailable) as err:
            call()
        assert err.value.provider == "aws"
        for text in (str(err.value), err.value.one_line(), repr(err.value.context)):
            assert "canary" not in text and "<html" not in text  # the raw answer is never shown


def test_aws_answering_html_leaves_the_other_providers_listing(not_ec2: tuple[str, list[int]], tmp_path: Any) -> None:
    from jupyter_portable.demo.catalog import default_catalog_path
    from jupyter_portable.demo.market import LocalMarket
    from jupyter_portable.orchestration.routes import list_offers

    url, _ = not_ec2
    market = LocalMarket(default_catalog_path(), tmp_path / "market")
    offers, errors = list_offers({"aws": provider(html_client(url)), "local": market})
    assert set(errors) == {"aws"} and "could not be read" in errors["aws"] and "canary" not in errors["aws"]
    assert offers and {o.provider for o in offers} == {"local"}


# -- SSH access: where port 22 opens ------------------------------------------------------

def test_a_bad_ssh_cidr_is_a_usage_error_before_anything_launches(ec2: tuple[Any, Stubber]) -> None:
    client, stub = ec2
    stub.add_response("describe_key_pairs", {"KeyPairs": [{"KeyName": "jupyter-portable-x"}]}, {"KeyNames": ANY})
    with pytest.raises(UsageError) as err:
        provider(client, ssh_cidr="my laptop").launch(offer(), allocation_id="alloc-1", ssh_public_key=KEY)
    assert "JUPYTER_PORTABLE_SSH_CIDR" in (err.value.hint or "")  # and run_instances was never called


def test_an_unknown_caller_address_is_unavailable_with_the_setting_to_use(ec2: tuple[Any, Stubber],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    client, stub = ec2
    monkeypatch.delenv("JUPYTER_PORTABLE_SSH_CIDR", raising=False)
    stub.add_response("describe_key_pairs", {"KeyPairs": [{"KeyName": "jupyter-portable-x"}]}, {"KeyNames": ANY})

    def offline() -> str:
        raise OSError("no route to checkip.amazonaws.com")

    with pytest.raises(ProviderUnavailable) as err:
        provider(client, caller_address=offline).launch(offer(), allocation_id="alloc-1", ssh_public_key=KEY)
    assert "checkip.amazonaws.com" in str(err.value) and "JUPYTER_PORTABLE_SSH_CIDR" in (err.value.hint or "")
