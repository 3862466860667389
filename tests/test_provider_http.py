"""The cloud providers (RunPod, Vast.ai, Lambda) against contract fixtures served at their real URLs.

Every fixture under ``tests/contract/fixtures/<provider>/`` is a response body the real
API could send: it is validated against the schema extracted from the provider's own
OpenAPI document (``tests/contract/schemas/<provider>.json``). A fixture's name says
which response it is: ``<operationId>.<HTTP status>[.<case>].json``. The other way round,
every request sent here is checked against the same document's request schema (its query
parameters and body; RunPod's GraphQL has none published), so a renamed field fails.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import respx
from twins import schemas

from jupyter_portable.compute.base import Allocation, SshEndpoint
from jupyter_portable.compute.lambdalabs import LambdaProvider
from jupyter_portable.compute.runpod import RunPodProvider
from jupyter_portable.compute.vastai import VastProvider
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    ProviderUnavailable,
    QuotaExceeded,
)
from jupyter_portable.core.offers import Offer, Requirements

CONTRACT = Path(__file__).parent / "contract"
FIXTURES = CONTRACT / "fixtures"
SCHEMAS = CONTRACT / "schemas"
PROVIDERS = ("runpod", "vastai", "lambda")
KEY = "sk-live-7Q2fX9wLcanary"  # a unique string, so any leak of it is found
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleExampleExampleExampleExampleEx worker"

RUNPOD = "https://api.runpod.io"
VAST = "https://console.vast.ai"
LAMBDA = "https://cloud.lambda.ai"


# -- fixtures, served ----------------------------------------------------------------------


def split_name(name: str) -> tuple[str, str]:
    """``getPod.200.reachable.json`` -> ("getPod", "200"); GraphQL ops keep their prefix."""
    parts = name.removesuffix(".json").split(".")
    if parts[0] == "graphql":
        return f"{parts[0]}.{parts[1]}", parts[2]
    return parts[0], parts[1]


def body(provider: str, name: str) -> Any:
    return json.loads((FIXTURES / provider / name).read_text())


def reply(provider: str, name: str, **headers: str) -> httpx.Response:
    """The fixture as the API sends it: its status (from the name), its JSON body."""
    _, status = split_name(name)
    return httpx.Response(int(status), json=body(provider, name), headers=headers)


def all_fixtures() -> list[tuple[str, str]]:
    return [(p, f.name) for p in PROVIDERS for f in sorted((FIXTURES / p).glob("*.json"))]


def schema_for(provider: str, name: str) -> Any:
    doc = json.loads((SCHEMAS / f"{provider}.json").read_text())
    op, status = split_name(name)
    responses = doc["operations"][op]["responses"]
    return responses[status] if status in responses else responses["default"]


@pytest.fixture
def api():
    """The providers' APIs, mocked at their real URLs; afterwards every request that was sent is
    checked against its operation's published request schema (query and body; not GraphQL)."""
    with respx.mock(assert_all_called=False) as mock:
        yield mock
    for call in mock.calls:
        check_request(call.request)


# -- the contract, the other way: what is sent ------------------------------------------------

BASES = {"api.runpod.io": "runpod", "console.vast.ai": "vastai", "cloud.lambda.ai": "lambda"}


def operation_of(request: httpx.Request) -> tuple[str, str, dict[str, Any]] | None:
    """(provider, operationId, its request schema) for a sent request; None for one the
    documents do not cover (RunPod's GraphQL)."""
    provider = BASES[request.url.host]
    found = schemas.match(provider, request.method, request.url.path)
    if found is None:
        return None
    return provider, found[0], schemas.operations(provider)[found[0]]["request"]


def check_request(request: httpx.Request) -> None:
    """Fail when ``request`` breaks its operation's request schema (tests/twins/schemas.py)."""
    found = operation_of(request)
    if found is None:
        return
    provider, op_id, _ = found
    errors = schemas.request_errors(provider, op_id, request.url.params.multi_items(), request.content)
    if errors:
        raise jsonschema.ValidationError(f"{provider} {op_id}: the published document refuses this request: "
                                         + "; ".join(errors))


def no_sleep(seconds: float) -> None:
    """Retries here wait for nothing (tests/test_provider_retries.py checks the waits)."""


class Ticking:
    """A provider's clock that moves only when it sleeps: its waits (a lost launch looked up for
    base.LOOKUP_BUDGET_S) take no real time, and still end."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def _timed(kw: dict[str, Any]) -> dict[str, Any]:
    clock = Ticking()
    kw.setdefault("sleep", clock.sleep)
    kw.setdefault("clock", clock)
    return kw


def runpod(**kw: Any) -> RunPodProvider:
    return RunPodProvider(api_key=KEY, backoff=0, **_timed(kw))


def vast(**kw: Any) -> VastProvider:
    return VastProvider(api_key=KEY, backoff=0, **_timed(kw))


def lam(**kw: Any) -> LambdaProvider:
    kw.setdefault("ssh_key_names", ["jp-worker"])
    return LambdaProvider(api_key=KEY, backoff=0, **_timed(kw))


def sent(route: respx.Route, i: int = -1) -> httpx.Request:
    return route.calls[i].request


def sent_json(route: respx.Route, i: int = -1) -> Any:
    return json.loads(sent(route, i).content)


def assert_authorized(route: respx.Route) -> None:
    assert route.called
    for call in route.calls:
        assert call.request.headers["Authorization"] == f"Bearer {KEY}"
        assert KEY not in str(call.request.url)  # the key travels in a header, never in the URL


# -- the contract: every fixture is something the real API could send ------------------------


@pytest.mark.parametrize("provider,name", all_fixtures(), ids=lambda v: v)
def test_every_fixture_matches_the_schema_of_its_operation(provider: str, name: str) -> None:
    jsonschema.Draft202012Validator(schema_for(provider, name)).validate(body(provider, name))


def test_every_provider_has_fixtures_for_each_case() -> None:
    names = {p: {f.name for f in (FIXTURES / p).glob("*.json")} for p in PROVIDERS}
    assert {"listGpuTypes.200.json", "createPod.400.no-capacity.json", "createPod.402.json", "createPod.201.json",
            "getPod.200.provisioning.json", "getPod.200.running-no-ssh.json", "getPod.200.reachable.json",
            "deletePod.404.json", "createPod.401.json"} <= names["runpod"]
    assert {"searchOffers.200.json", "createInstance.404.no-such-ask.json", "createInstance.200.json",
            "showInstance.200.loading.json", "showInstance.200.running-no-ssh.json", "showInstance.200.reachable.json",
            "destroyInstance.200.json", "showUser.401.json"} <= names["vastai"]
    assert {"listInstanceTypes.200.json", "launchInstance.400.insufficient-capacity.json",
            "launchInstance.400.quota-exceeded.json", "launchInstance.200.json", "getInstance.200.booting.json",
            "getInstance.200.active-no-ip.json", "getInstance.200.active.json", "terminateInstance.200.json",
            "launchInstance.401.json"} <= names["lambda"]


@pytest.mark.parametrize("provider,name,spoil", [
    ("runpod", "getPod.200.reachable.json", lambda b: b.pop("status")),
    ("runpod", "getPod.200.reachable.json", lambda b: b["ssh"]["direct"].update(port="34446")),
    ("runpod", "listGpuTypes.200.json", lambda b: b["gpus"][0].update(availability="PLENTY")),
    ("vastai", "searchOffers.200.json", lambda b: b["offers"][0].update(dph_total="0.41")),
    ("vastai", "showInstance.200.reachable.json", lambda b: b["instances"].update(ssh_port="34321")),
    ("lambda", "getInstance.200.active.json", lambda b: b.update(extra=1)),
    ("lambda", "launchInstance.400.quota-exceeded.json", lambda b: b["error"].update(code="quota")),
    ("lambda", "listInstanceTypes.200.json", lambda b: b["data"]["gpu_1x_a10"].pop("regions_with_capacity_available")),
])
def test_the_schemas_refuse_a_fixture_the_api_could_not_have_sent(provider: str, name: str, spoil: Any) -> None:
    spoiled = copy.deepcopy(body(provider, name))
    spoil(spoiled)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema_for(provider, name)).validate(spoiled)


@pytest.mark.parametrize("provider,document,version,commit", [
    ("runpod", "runpod-v2.json", "2.0.0", "a900806e"),
    ("vastai", "vastai.yaml", "1.0.0", "c624622"),
    ("lambda", "lambda-cloud.json", "1.10.0", "911506f"),
])
def test_each_schema_file_names_its_source_document(provider: str, document: str, version: str, commit: str) -> None:
    source = json.loads((SCHEMAS / f"{provider}.json").read_text())["source"]
    assert (source["document"], source["version"], source["commit"]) == (document, version, commit)


# -- RunPod ----------------------------------------------------------------------------------


def test_runpod_lists_one_offer_per_gpu_type_and_data_center(api: respx.MockRouter) -> None:
    route = api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    offers = {o.id: o for o in runpod().offers()}
    assert_authorized(route)
    assert dict(sent(route).url.params) == {"include": "AVAILABILITY", "product": "POD", "count": "1",
                                            "cloud": "SECURE"}
    assert set(offers) == {"secure/NVIDIA-GeForce-RTX-4090/x1@US-KS-2", "secure/NVIDIA-GeForce-RTX-4090/x1@EU-RO-1",
                           "secure/NVIDIA-H100-80GB-HBM3/x1@US-TX-3"}  # the 3090 is community-only
    rtx = offers["secure/NVIDIA-GeForce-RTX-4090/x1@US-KS-2"]
    assert (rtx.gpu, rtx.gpu_count, rtx.gpu_memory_gb, rtx.price_per_hour, rtx.region, rtx.cuda, rtx.capacity) == (
        "RTX 4090", 1, 24.0, 0.69, "US-KS-2", "12.8", 1)
    assert rtx.extra["gpu_type_id"] == "NVIDIA GeForce RTX 4090"
    assert offers["secure/NVIDIA-GeForce-RTX-4090/x1@EU-RO-1"].capacity == 0  # listed is not available


def test_runpod_offers_ask_the_catalog_for_the_requirements(api: respx.MockRouter) -> None:
    route = api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    offers = runpod().offers(Requirements(gpu_count=2, min_cuda="12.4"))
    params = dict(sent(route).url.params)
    assert (params["count"], params["minCudaVersion"]) == ("2", "12.4")
    assert {o.price_per_hour for o in offers if o.gpu == "H100 SXM"} == {5.38}
    assert all(o.gpu_count == 2 and o.extra["min_cuda"] == "12.4" for o in offers)


def test_runpod_spot_offers_come_from_graphql_at_the_bid_not_the_minimum(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=httpx.Response(200, json={"gpus": []}))
    gql = api.post(f"{RUNPOD}/graphql").mock(return_value=reply("runpod", "graphql.gpuTypes.200.json"))
    offers = runpod(include_spot=True).offers()
    assert_authorized(gql)
    query = sent_json(gql)["query"]
    assert "gpuTypes" in query and "minimumBidPrice" in query and "gpuCount: 1" in query
    # the default bid, 0.6 x the on-demand price (0.69, 0.25), above the minimum (0.35, 0.12)
    assert [(o.gpu, o.price_per_hour, o.spot, o.capacity) for o in offers] == [
        ("RTX 4090", 0.414, True, 1), ("RTX A4000", 0.15, True, 0)]  # the H100 has no bid market


def test_runpod_full_lifecycle_reachable_only_with_an_ssh_endpoint(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    keys = api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "getSshKeys.200.json"))
    stock = api.get(f"{RUNPOD}/v2/catalog/gpus/NVIDIA GeForce RTX 4090").mock(
        return_value=reply("runpod", "getGpuType.200.high.json"))
    create = api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", "createPod.201.json"))
    poll = api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(side_effect=[
        reply("runpod", "getPod.200.provisioning.json"), reply("runpod", "getPod.200.running-no-ssh.json"),
        reply("runpod", "getPod.200.reachable.json")])
    delete = api.delete(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=httpx.Response(204))

    provider = runpod()
    offer = next(o for o in provider.offers() if o.region == "US-KS-2")
    provider.check_permission(offer)  # returns when permitted, raises otherwise
    assert provider.check_capacity(offer) == 1
    assert dict(sent(stock).url.params)["product"] == "POD"
    alloc = provider.launch(offer, allocation_id="alloc-0001", ssh_public_key=PUBKEY, env={"HF_TOKEN": "hf_x"})
    request = sent_json(create)
    # named (and its env tagged) so that it can be found again: `jupyter portable machines`
    assert request["name"] == "jupyter-portable.alloc-0001" and request["image"].startswith("runpod/pytorch")
    assert request["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1}
    assert (request["cloud"], request["dataCenterIds"], request["ports"], request["startSsh"]) == (
        "SECURE", ["US-KS-2"], ["22/tcp"], True)
    assert request["env"] == {"HF_TOKEN": "hf_x", "PUBLIC_KEY": PUBKEY, "JUPYTER_PORTABLE_ALLOCATION_ID": "alloc-0001"}
    assert (alloc.ref, alloc.provider, alloc.offer_id) == ("7h9k2m4n6p", "runpod", offer.id)

    states = [provider.status(alloc) for _ in range(3)]
    assert [s.state for s in states] == ["pending", "running", "reachable"]
    assert states[1].ssh is None  # RUNNING is not reachable
    assert states[2].ssh == SshEndpoint("195.26.233.3", 34446, "root")
    provider.terminate(alloc)
    for route in (keys, stock, create, poll, delete):
        assert_authorized(route)


def test_runpod_reachable_from_the_runtime_port_list_when_ssh_direct_is_null(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=reply("runpod", "getPod.200.runtime-port.json"))
    status = runpod().status(allocation("runpod", "7h9k2m4n6p"))
    assert (status.state, status.ssh) == ("reachable", SshEndpoint("195.26.233.7", 40022, "root"))


@pytest.mark.parametrize("name,spot,state", [
    ("getPod.200.exited.json", False, "stopped"), ("getPod.200.exited.json", True, "lost"),
    ("getPod.200.error.json", False, "lost"), ("getPod.404.json", False, "lost"),
])
def test_runpod_status_of_a_pod_that_is_not_running(api: respx.MockRouter, name: str, spot: bool, state: str) -> None:
    api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=reply("runpod", name))
    status = runpod().status(allocation("runpod", "7h9k2m4n6p", spot=spot))
    assert status.state == state and status.reason


def test_runpod_no_stock_is_no_capacity_before_any_launch(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    api.get(f"{RUNPOD}/v2/catalog/gpus/NVIDIA GeForce RTX 4090").mock(
        return_value=reply("runpod", "getGpuType.200.none.json"))
    provider = runpod()
    offer = next(o for o in provider.offers() if o.region == "US-KS-2")
    with pytest.raises(NoCapacity) as info:
        provider.check_capacity(offer)
    assert info.value.offer == offer.id and "US-KS-2" in str(info.value)


@pytest.mark.parametrize("name,error", [
    ("createPod.400.no-capacity.json", NoCapacity),
    ("createPod.400.rule.json", LaunchFailed),
    ("createPod.402.json", QuotaExceeded),
    ("createPod.401.json", AuthError),
    ("createPod.403.json", QuotaExceeded),  # a pool not open to the account: skip the route (issue 13)
    ("createPod.422.json", LaunchFailed),
    ("createPod.429.json", ProviderUnavailable),
    ("createPod.503.json", ProviderUnavailable),
])
def test_runpod_launch_errors_are_typed(api: respx.MockRouter, name: str, error: type[ComputeError]) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    create = api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", name, **{"Retry-After": "7"}))
    # a 5xx may have rented something: the launch is looked up by its name first (none here)
    listed = api.get(f"{RUNPOD}/v2/pods").mock(return_value=httpx.Response(200, json={"pods": []}))
    provider = runpod()
    offer = provider.offers()[0]
    with pytest.raises(error) as info:
        provider.launch(offer, allocation_id="alloc-0001")
    assert type(info.value) is error
    # a 503 may have rented something: looked up until known (here: absent for the whole budget)
    assert (listed.call_count > 1) if name == "createPod.503.json" else (listed.call_count == 0)
    assert (info.value.provider, info.value.offer) == ("runpod", offer.id)
    # a launch is tried again only on a 429 (the provider did not act on it): any other
    # answer may mean it rented something
    assert create.call_count == (provider._api.policy.attempts if name == "createPod.429.json" else 1)
    if name == "createPod.400.no-capacity.json":
        assert "no longer any instances" in str(info.value)


def test_runpod_spot_launch_rents_with_a_bid_over_graphql(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=httpx.Response(200, json={"gpus": []}))
    gql = api.post(f"{RUNPOD}/graphql").mock(side_effect=[
        reply("runpod", "graphql.gpuTypes.200.json"), reply("runpod", "graphql.podRentInterruptable.200.json")])
    api.get(f"{RUNPOD}/v2/pods/spot5x8q2w1z").mock(return_value=reply("runpod", "getPod.200.exited.json"))
    provider = runpod(include_spot=True)
    offer = provider.offers()[0]
    alloc = provider.launch(offer, allocation_id="alloc-spot", ssh_public_key=PUBKEY, env={"A": "b"})
    request = sent_json(gql)
    assert "podRentInterruptable" in request["query"]
    spec = request["variables"]["input"]
    assert (spec["gpuTypeId"], spec["gpuCount"], spec["bidPerGpu"], spec["cloudType"], spec["startSsh"]) == (
        "NVIDIA GeForce RTX 4090", 1, 0.414, "SECURE", True)
    assert {"key": "PUBLIC_KEY", "value": PUBKEY} in spec["env"] and {"key": "A", "value": "b"} in spec["env"]
    assert alloc.ref == "spot5x8q2w1z" and alloc.details["spot"] is True
    assert provider.status(alloc).state == "lost"  # a stopped interruptible pod was outbid


def test_runpod_spot_launch_without_instances_is_no_capacity(api: respx.MockRouter) -> None:
    refused = reply("runpod", "graphql.podRentInterruptable.200.no-capacity.json")
    api.post(f"{RUNPOD}/graphql").mock(return_value=refused)
    offer = spot_offer()
    with pytest.raises(NoCapacity) as info:
        runpod(include_spot=True).launch(offer, allocation_id="alloc-spot")
    assert info.value.offer == offer.id


def test_runpod_terminate_of_a_pod_already_gone_is_fine(api: respx.MockRouter) -> None:
    route = api.delete(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=reply("runpod", "deletePod.404.json"))
    runpod().terminate(allocation("runpod", "7h9k2m4n6p"))
    assert route.call_count == 1


def test_runpod_bad_key_on_listing_is_an_auth_error(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.401.json"))
    with pytest.raises(AuthError) as info:
        runpod().offers()
    assert "RUNPOD_API_KEY" in (info.value.hint or "")


def test_runpod_permission_refused_is_an_auth_error(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "getSshKeys.401.json"))
    with pytest.raises(AuthError):
        runpod().check_permission(spot_offer())


# -- Vast.ai ---------------------------------------------------------------------------------


def test_vast_search_sends_the_query_format_and_reads_per_offer_prices(api: respx.MockRouter) -> None:
    route = api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.200.json"))
    offers = vast().offers(Requirements(min_gpu_memory_gb=24, min_cuda="12.4", max_price_per_hour=5))
    assert_authorized(route)
    query = sent_json(route)
    assert query["verified"] == {"eq": True} and query["rentable"] == {"eq": True}
    assert (query["gpu_ram"], query["cuda_max_good"], query["dph_total"], query["num_gpus"]) == (
        {"gte": 24000}, {"gte": 12.4}, {"lte": 5}, {"gte": 1})
    assert query["order"] == [["dph_total", "asc"]] and query["allocated_storage"] == 50
    first = offers[0]
    assert (first.id, first.gpu, first.gpu_count, first.gpu_memory_gb, first.price_per_hour) == (
        "12345678", "RTX 4090", 1, 24.56, 0.41)
    assert (first.region, first.driver, first.cuda, first.reliability) == ("Texas, US", "550.54.15", "12.4", 0.9912)
    assert (first.egress_per_gb, first.extra["upload_per_gb"], first.bandwidth_mbps) == (0.002, 0.003, 900.5)
    assert (offers[1].gpu_count, offers[1].gpu_memory_gb, offers[1].egress_per_gb) == (2, 81.56, 0.0)


def test_vast_full_lifecycle(api: respx.MockRouter) -> None:
    api.post(f"{VAST}/api/v0/bundles/").mock(side_effect=[
        reply("vastai", "searchOffers.200.json"), reply("vastai", "searchOffers.200.one.json")])
    user = api.get(f"{VAST}/api/v0/users/current/").mock(return_value=reply("vastai", "showUser.200.json"))
    create = api.put(f"{VAST}/api/v0/asks/12345678/").mock(return_value=reply("vastai", "createInstance.200.json"))
    attach = api.post(f"{VAST}/api/v0/instances/7654321/ssh/").mock(
        return_value=reply("vastai", "attachSshKey.200.json"))
    poll = api.get(f"{VAST}/api/v0/instances/7654321/").mock(side_effect=[
        reply("vastai", "showInstance.200.loading.json"), reply("vastai", "showInstance.200.running-no-ssh.json"),
        reply("vastai", "showInstance.200.reachable.json")])
    destroy = api.delete(f"{VAST}/api/v0/instances/7654321/").mock(
        return_value=reply("vastai", "destroyInstance.200.json"))

    provider = vast()
    offer = provider.offers()[0]
    provider.check_permission(offer)
    assert provider.check_capacity(offer) == 1
    capacity_query = json.loads(api.calls[-1].request.content)
    assert capacity_query["id"] == {"eq": 12345678} and capacity_query["rentable"] == {"eq": True}
    alloc = provider.launch(offer, allocation_id="alloc-0002", image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
                            ssh_public_key=PUBKEY, env={"HF_TOKEN": "hf x"})
    request = sent_json(create)
    assert (request["image"], request["label"], request["runtype"], request["cancel_unavail"], request["disk"]) == (
        "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime", "jupyter-portable.alloc-0002", "ssh_direct", True, 50)
    # an object, as Vast's guide and official client send it; values exactly as given
    assert request["env"] == {"HF_TOKEN": "hf x", "JUPYTER_PORTABLE_ALLOCATION_ID": "alloc-0002"}
    assert sent_json(attach) == {"ssh_key": PUBKEY}
    assert alloc.ref == "7654321"

    states = [provider.status(alloc) for _ in range(3)]
    assert [s.state for s in states] == ["pending", "running", "reachable"]
    assert states[2].ssh == SshEndpoint("203.0.113.42", 41234, "root")  # the direct port, not the proxy
    provider.terminate(alloc)
    for route in (user, create, attach, poll, destroy):
        assert_authorized(route)


@pytest.mark.parametrize("name,state,ssh", [
    ("showInstance.200.proxy-only.json", "reachable", SshEndpoint("ssh5.vast.ai", 34321, "root")),
    ("showInstance.200.exited.json", "lost", None),
    ("showInstance.200.outbid.json", "lost", None),
    ("showInstance.200.created-error.json", "lost", None),  # the runtime refused it: it never runs
    ("showInstance.200.created.json", "pending", None),
])
def test_vast_status_cases(api: respx.MockRouter, name: str, state: str, ssh: SshEndpoint | None) -> None:
    api.get(f"{VAST}/api/v0/instances/7654321/").mock(return_value=reply("vastai", name))
    status = vast().status(allocation("vastai", "7654321"))
    assert (status.state, status.ssh) == (state, ssh)


@pytest.mark.parametrize("actual", ["unknown", "offline"])
def test_vast_unknown_or_offline_mid_session_is_unknown_not_lost(api: respx.MockRouter, actual: str) -> None:
    # Vast's docs: "unknown" is no recent heartbeat from the host; "offline" is computed from it. Neither is
    # evidence that the instance is gone (issue 42): core.reachability decides, as for every provider
    running = {**body("vastai", "showInstance.200.exited.json")}
    running["instances"] = {**running["instances"], "actual_status": actual, "intended_status": "running"}
    api.get(f"{VAST}/api/v0/instances/7654321/").mock(return_value=httpx.Response(200, json=running))
    status = vast().status(allocation("vastai", "7654321"))
    assert status.state == "unknown" and "no recent heartbeat" in (status.reason or "")


def test_vast_an_ask_gone_from_search_is_no_capacity(api: respx.MockRouter) -> None:
    api.post(f"{VAST}/api/v0/bundles/").mock(side_effect=[
        reply("vastai", "searchOffers.200.json"), reply("vastai", "searchOffers.200.empty.json")])
    provider = vast()
    offer = provider.offers()[0]
    with pytest.raises(NoCapacity):
        provider.check_capacity(offer)


@pytest.mark.parametrize("name,error", [
    ("createInstance.404.no-such-ask.json", NoCapacity),
    ("createInstance.410.json", NoCapacity),
    ("createInstance.400.json", LaunchFailed),
    ("createInstance.401.json", AuthError),
    ("createInstance.429.json", ProviderUnavailable),
])
def test_vast_launch_errors_are_typed(api: respx.MockRouter, name: str, error: type[ComputeError]) -> None:
    api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.200.json"))
    api.put(f"{VAST}/api/v0/asks/12345678/").mock(return_value=reply("vastai", name))
    provider = vast()
    offer = provider.offers()[0]
    with pytest.raises(error) as info:
        provider.launch(offer, allocation_id="alloc-0002")
    assert type(info.value) is error and info.value.offer == "12345678"


def test_vast_search_with_a_bad_key_is_an_auth_error_although_it_is_a_404(api: respx.MockRouter) -> None:
    api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.404.json"))
    with pytest.raises(AuthError) as info:
        vast().offers()
    assert "VAST_API_KEY" in (info.value.hint or "")


def test_vast_permission_with_a_bad_key_is_an_auth_error(api: respx.MockRouter) -> None:
    api.get(f"{VAST}/api/v0/users/current/").mock(return_value=reply("vastai", "showUser.401.json"))
    with pytest.raises(AuthError):
        vast().check_permission(spot_offer())


def test_vast_a_key_that_cannot_be_attached_destroys_the_new_instance(api: respx.MockRouter) -> None:
    api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.200.json"))
    api.put(f"{VAST}/api/v0/asks/12345678/").mock(return_value=reply("vastai", "createInstance.200.json"))
    api.post(f"{VAST}/api/v0/instances/7654321/ssh/").mock(return_value=reply("vastai", "attachSshKey.400.json"))
    destroy = api.delete(f"{VAST}/api/v0/instances/7654321/").mock(
        return_value=reply("vastai", "destroyInstance.200.json"))
    provider = vast()
    with pytest.raises(LaunchFailed) as info:
        provider.launch(provider.offers()[0], allocation_id="alloc-0002", ssh_public_key=PUBKEY)
    assert destroy.called and "was destroyed" in str(info.value)


def test_vast_terminate_of_an_instance_already_gone_is_fine(api: respx.MockRouter) -> None:
    api.delete(f"{VAST}/api/v0/instances/7654321/").mock(return_value=reply("vastai", "destroyInstance.404.json"))
    vast().terminate(allocation("vastai", "7654321"))


# -- Lambda ----------------------------------------------------------------------------------


def test_lambda_lists_capacity_per_region_and_keeps_sold_out_types_listed(api: respx.MockRouter) -> None:
    route = api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
    offers = {o.id: o for o in lam().offers()}
    assert_authorized(route)
    assert set(offers) == {"gpu_1x_h100_pcie@us-west-3", "gpu_1x_h100_pcie@us-east-1",
                           "gpu_8x_a100_80gb_sxm4@any", "gpu_1x_a10@us-east-1"}
    h100 = offers["gpu_1x_h100_pcie@us-west-3"]
    assert (h100.gpu, h100.gpu_count, h100.gpu_memory_gb, h100.price_per_hour, h100.capacity) == (
        "H100 PCIe", 1, 80.0, 2.49, 1)
    a100 = offers["gpu_8x_a100_80gb_sxm4@any"]
    assert (a100.gpu_count, a100.capacity, a100.price_per_hour) == (8, 0, 14.32)


def test_lambda_full_lifecycle(api: respx.MockRouter) -> None:
    types = api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
    keys = api.get(f"{LAMBDA}/api/v1/ssh-keys").mock(return_value=reply("lambda", "listSSHKeys.200.json"))
    launch = api.post(f"{LAMBDA}/api/v1/instance-operations/launch").mock(
        return_value=reply("lambda", "launchInstance.200.json"))
    poll = api.get(f"{LAMBDA}/api/v1/instances/0920582c7ff041399e34823a0be62549").mock(side_effect=[
        reply("lambda", "getInstance.200.booting.json"), reply("lambda", "getInstance.200.active-no-ip.json"),
        reply("lambda", "getInstance.200.active.json")])
    terminate = api.post(f"{LAMBDA}/api/v1/instance-operations/terminate").mock(
        return_value=reply("lambda", "terminateInstance.200.json"))

    provider = lam()
    offer = next(o for o in provider.offers() if o.id == "gpu_1x_h100_pcie@us-west-3")
    provider.check_permission(offer)
    assert provider.check_capacity(offer) == 1
    alloc = provider.launch(offer, allocation_id="alloc-0003", ssh_public_key=PUBKEY, env={"HF_TOKEN": "hf x"})
    request = sent_json(launch)
    assert (request["region_name"], request["instance_type_name"], request["ssh_key_names"], request["name"]) == (
        "us-west-3", "gpu_1x_h100_pcie", ["jp-worker"], "jupyter-portable.alloc-0003")
    assert request["tags"] == [{"key": "jupyter-portable:allocation", "value": "alloc-0003"}]
    assert request["user_data"].startswith("#cloud-config\n")
    config = json.loads(request["user_data"].split("\n", 1)[1])
    assert config["ssh_authorized_keys"] == [PUBKEY]
    assert config["write_files"][0]["content"] == "export HF_TOKEN='hf x'\n"
    assert alloc.ref == "0920582c7ff041399e34823a0be62549"

    states = [provider.status(alloc) for _ in range(3)]
    assert [s.state for s in states] == ["pending", "running", "reachable"]
    assert states[2].ssh == SshEndpoint("198.51.100.2", 22, "ubuntu")
    provider.terminate(alloc)
    assert sent_json(terminate) == {"instance_ids": ["0920582c7ff041399e34823a0be62549"]}
    for route in (types, keys, launch, poll, terminate):
        assert_authorized(route)


def test_lambda_empty_capacity_list_is_no_capacity(api: respx.MockRouter) -> None:
    api.get(f"{LAMBDA}/api/v1/instance-types").mock(side_effect=[
        reply("lambda", "listInstanceTypes.200.json"), reply("lambda", "listInstanceTypes.200.none.json")])
    provider = lam()
    offer = next(o for o in provider.offers() if o.id == "gpu_1x_h100_pcie@us-west-3")
    with pytest.raises(NoCapacity) as info:
        provider.check_capacity(offer)
    assert info.value.offer == offer.id


def test_lambda_sold_out_type_is_refused_before_any_launch_request(api: respx.MockRouter) -> None:
    api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
    launch = api.post(f"{LAMBDA}/api/v1/instance-operations/launch")
    provider = lam()
    offer = next(o for o in provider.offers() if o.capacity == 0)
    with pytest.raises(NoCapacity):
        provider.check_capacity(offer)
    with pytest.raises(NoCapacity):
        provider.launch(offer, allocation_id="alloc-0003")
    assert not launch.called


@pytest.mark.parametrize("name,error,hint", [
    ("launchInstance.400.insufficient-capacity.json", NoCapacity, "more availability"),
    ("launchInstance.400.quota-exceeded.json", QuotaExceeded, "increase your quota"),
    ("launchInstance.401.json", AuthError, "LAMBDA_API_KEY"),
    ("launchInstance.403.json", AuthError, "payment method"),
    ("launchInstance.404.json", LaunchFailed, "SSH key name"),
])
def test_lambda_launch_errors_are_typed_by_code(api: respx.MockRouter, name: str, error: type[ComputeError],
                                                 hint: str) -> None:
    api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
    api.post(f"{LAMBDA}/api/v1/instance-operations/launch").mock(return_value=reply("lambda", name))
    provider = lam()
    offer = next(o for o in provider.offers() if o.id == "gpu_1x_a10@us-east-1")
    with pytest.raises(error) as info:
        provider.launch(offer, allocation_id="alloc-0003")
    assert type(info.value) is error and info.value.offer == offer.id
    assert hint in (info.value.hint or "")
    assert info.value.context["code"] == body("lambda", name)["error"]["code"]


def test_lambda_permission_needs_registered_ssh_key_names(api: respx.MockRouter) -> None:
    api.get(f"{LAMBDA}/api/v1/ssh-keys").mock(return_value=reply("lambda", "listSSHKeys.200.json"))
    offer = spot_offer()
    lam().check_permission(offer)
    with pytest.raises(AuthError) as info:
        lam(ssh_key_names=["laptop"]).check_permission(offer)
    assert "laptop" in str(info.value)
    lam(ssh_key_names=[]).check_permission(offer)  # none configured: the launch registers its own key
    with pytest.raises(AuthError) as info:
        lam(ssh_key_names=[]).launch(offer, allocation_id="alloc-0003")  # ... and without one, nothing to send
    assert "LAMBDA_SSH_KEY_NAMES" in (info.value.hint or "")


def test_lambda_ssh_key_names_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAMBDA_SSH_KEY_NAMES", "a, b ,")
    assert LambdaProvider(api_key=KEY).ssh_key_names == ["a", "b"]


@pytest.mark.parametrize("name,state", [("getInstance.200.preempted.json", "lost"), ("getInstance.404.json", "lost")])
def test_lambda_status_of_an_instance_taken_back(api: respx.MockRouter, name: str, state: str) -> None:
    api.get(f"{LAMBDA}/api/v1/instances/0920582c7ff041399e34823a0be62549").mock(return_value=reply("lambda", name))
    status = lam().status(allocation("lambda", "0920582c7ff041399e34823a0be62549"))
    assert status.state == state and status.reason


def test_lambda_terminate_of_an_instance_already_gone_is_fine(api: respx.MockRouter) -> None:
    api.post(f"{LAMBDA}/api/v1/instance-operations/terminate").mock(
        return_value=reply("lambda", "terminateInstance.404.json"))
    lam().terminate(allocation("lambda", "0920582c7ff041399e34823a0be62549"))


# -- what every provider shares ----------------------------------------------------------------


def make(provider: str, **kw: Any) -> Any:
    return {"runpod": runpod, "vastai": vast, "lambda": lam}[provider](**kw)


LIST_URL = {"runpod": ("GET", f"{RUNPOD}/v2/catalog/gpus"), "vastai": ("POST", f"{VAST}/api/v0/bundles/"),
            "lambda": ("GET", f"{LAMBDA}/api/v1/instance-types")}
ENV = {"runpod": "RUNPOD_API_KEY", "vastai": "VAST_API_KEY", "lambda": "LAMBDA_API_KEY"}
CLASSES = {"runpod": RunPodProvider, "vastai": VastProvider, "lambda": LambdaProvider}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_missing_key_is_an_auth_error_naming_the_variable(api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch,
                                                            provider: str) -> None:
    monkeypatch.delenv(ENV[provider], raising=False)
    method, url = LIST_URL[provider]
    route = api.route(method=method, url=url)
    with pytest.raises(AuthError) as info:
        CLASSES[provider]().offers()
    assert ENV[provider] in str(info.value) and ENV[provider] in (info.value.hint or "")
    assert not route.called  # nothing is sent without a key


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_key_is_read_from_the_environment(api: respx.MockRouter, monkeypatch: pytest.MonkeyPatch,
                                              provider: str) -> None:
    monkeypatch.setenv(ENV[provider], KEY)
    method, url = LIST_URL[provider]
    route = api.route(method=method, url=url).mock(return_value=httpx.Response(200, json={}))
    with pytest.raises(ProviderUnavailable):
        CLASSES[provider](backoff=0).offers()  # {} is not a listing; the request is what is checked
    assert_authorized(route)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("failure,expect", [
    (httpx.ConnectError("connection refused"), "could not reach"),
    (httpx.ReadTimeout("timed out"), "did not answer"),
    (httpx.Response(200, content=b"<html>502 Bad Gateway</html>"), "not JSON"),
    (httpx.Response(200, content=b""), "empty body"),
    (httpx.Response(200, json={"unexpected": True}), "unexpected shape"),
    (httpx.Response(200, json=[1, 2]), "unexpected shape"),
    (httpx.Response(502, content=b"<html>bad gateway</html>"), "HTTP 502"),
])
def test_unmapped_failures_become_provider_unavailable(api: respx.MockRouter, provider: str, failure: Any,
                                                       expect: str) -> None:
    method, url = LIST_URL[provider]
    route = api.route(method=method, url=url)
    if isinstance(failure, Exception):
        route.mock(side_effect=failure)
    else:
        route.mock(return_value=failure)
    with pytest.raises(ProviderUnavailable) as info:
        make(provider).offers()
    assert type(info.value) is ProviderUnavailable and expect in str(info.value)
    assert provider in str(info.value)


@pytest.mark.parametrize("provider,fixture,spoil", [
    ("runpod", "listGpuTypes.200.json", lambda b: b["gpus"][0].pop("memory")),
    ("runpod", "listGpuTypes.200.json", lambda b: b["gpus"][0]["price"].update(secure="0.69")),
    ("vastai", "searchOffers.200.json", lambda b: b["offers"][0].pop("gpu_name")),
    ("lambda", "listInstanceTypes.200.json", lambda b: b["data"]["gpu_1x_a10"]["instance_type"].pop("specs")),
])
def test_a_response_missing_a_field_is_provider_unavailable_not_a_key_error(
        api: respx.MockRouter, provider: str, fixture: str, spoil: Any) -> None:
    spoiled = body(provider, fixture)
    spoil(spoiled)
    method, url = LIST_URL[provider]
    api.route(method=method, url=url).mock(return_value=httpx.Response(200, json=spoiled))
    with pytest.raises(ProviderUnavailable) as info:
        make(provider).offers()
    assert "unexpected shape" in str(info.value) and ("missing field" in str(info.value) or " is " in str(info.value))


def test_a_status_poll_missing_its_status_field_is_provider_unavailable(api: respx.MockRouter) -> None:
    pod = body("runpod", "getPod.200.reachable.json")
    del pod["status"]
    api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=httpx.Response(200, json=pod))
    with pytest.raises(ProviderUnavailable, match="missing field status"):
        runpod().status(allocation("runpod", "7h9k2m4n6p"))


def test_gets_are_retried_and_posts_are_not(api: respx.MockRouter) -> None:
    poll = api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(side_effect=[
        httpx.ConnectError("reset"), reply("runpod", "createPod.503.json"),
        reply("runpod", "getPod.200.reachable.json")])
    assert runpod(retries=2).status(allocation("runpod", "7h9k2m4n6p")).state == "reachable"
    assert poll.call_count == 3
    create = api.post(f"{RUNPOD}/v2/pods").mock(side_effect=httpx.ReadTimeout("timed out"))
    # the lost answer is looked up by the pod's name, never sent again: none found, so it fails
    listing = api.get(f"{RUNPOD}/v2/pods").mock(return_value=httpx.Response(200, json={"pods": []}))
    with pytest.raises(ProviderUnavailable) as info:
        runpod(retries=2).launch(spot_offer(spot=False), allocation_id="alloc-0001")
    assert create.call_count == 1 and listing.call_count > 1  # looked up until confirmed absent
    assert "may have gone through" in (info.value.hint or "")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_reserve_is_not_supported(provider: str) -> None:
    with pytest.raises(NotSupported):
        make(provider).reserve(spot_offer(), start="2026-02-01T00:00:00Z", hours=4)


# -- secrets never leave -----------------------------------------------------------------------


HOSTS = {"runpod": "api.runpod.io", "vastai": "console.vast.ai", "lambda": "cloud.lambda.ai"}


def error_paths() -> list[Any]:
    """Every way a request can fail, per provider: each error fixture, transport errors,
    bodies that are not JSON or not the shape read, and a provider echoing the key back."""
    out = []
    for provider, name in all_fixtures():
        if int(split_name(name)[1]) >= 400:
            out.append(pytest.param(provider, reply(provider, name), id=f"{provider}-{name}"))
    echo = {"detail": f"bad key {KEY}", "msg": f"bad {KEY}", "title": KEY, "status": 400,
            "error": {"code": "global/invalid-parameters", "message": f"bad key {KEY}"}}
    for provider in PROVIDERS:
        out += [pytest.param(provider, httpx.ConnectError(f"refused for Bearer {KEY}"), id=f"{provider}-connect"),
                pytest.param(provider, httpx.ReadTimeout("timed out"), id=f"{provider}-timeout"),
                pytest.param(provider, httpx.Response(200, content=f"<html>{KEY}</html>".encode()),
                             id=f"{provider}-not-json"),
                pytest.param(provider, httpx.Response(200, json={"echo": KEY}), id=f"{provider}-shape"),
                pytest.param(provider, httpx.Response(400, json=echo), id=f"{provider}-echo-400"),
                pytest.param(provider, httpx.Response(404, json=echo), id=f"{provider}-echo-404"),
                pytest.param(provider, httpx.Response(401, text=f"key {KEY} refused"), id=f"{provider}-echo-401")]
    return out


def every_operation(subject: Any, provider: str) -> list[ComputeError]:
    """Call every Provider method once; return the typed errors (anything else propagates)."""
    offer = {"runpod": spot_offer(spot=False), "vastai": vast_offer(), "lambda": lambda_offer()}[provider]
    alloc = allocation(provider, "7654321")
    calls = [subject.offers, lambda: subject.check_permission(offer), lambda: subject.check_capacity(offer),
             lambda: subject.launch(offer, allocation_id="alloc-9", ssh_public_key=PUBKEY, env={"X": "y"}),
             lambda: subject.status(alloc), lambda: subject.terminate(alloc)]
    errors = []
    for call in calls:
        try:
            call()
        except ComputeError as exc:
            errors.append(exc)
    return errors


@pytest.mark.parametrize("provider,failure", error_paths())
def test_every_error_path_is_typed_and_never_shows_the_key(api: respx.MockRouter, caplog: pytest.LogCaptureFixture,
                                                            provider: str, failure: Any) -> None:
    caplog.set_level(logging.DEBUG)
    route = api.route(host=HOSTS[provider])
    if isinstance(failure, Exception):
        route.mock(side_effect=failure)
    else:
        route.mock(return_value=failure)
    subject = make(provider)
    errors = every_operation(subject, provider)
    assert len(errors) >= 4  # offers, permission, capacity and launch can only fail here
    for exc in errors:
        for text in (str(exc), repr(exc), exc.one_line(), exc.hint or "", repr(exc.context)):
            assert KEY not in text
    assert KEY not in repr(subject) and KEY not in str(subject) and KEY not in caplog.text
    assert "Secret(set)" in repr(subject)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_launch_secrets_stay_out_of_the_allocation_errors_and_logs(api: respx.MockRouter,
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   provider: str) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "aws-secret-Zk4vQ9canary"
    env = {"AWS_SECRET_ACCESS_KEY": secret}
    if provider == "runpod":
        api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
        # RunPod returns the pod's env in its responses; and a refusal may quote the request
        pod = body("runpod", "createPod.201.json")
        pod["env"]["AWS_SECRET_ACCESS_KEY"] = secret
        launch = api.post(f"{RUNPOD}/v2/pods")
    elif provider == "vastai":
        api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.200.json"))
        launch = api.put(f"{VAST}/api/v0/asks/12345678/")
        pod = body("vastai", "createInstance.200.json")
    else:
        api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
        launch = api.post(f"{LAMBDA}/api/v1/instance-operations/launch")
        pod = body("lambda", "launchInstance.200.json")
    subject = make(provider)
    offer = next(o for o in subject.offers() if o.capacity)
    launch.mock(return_value=httpx.Response(201 if provider == "runpod" else 200, json=pod))
    alloc = subject.launch(offer, allocation_id="alloc-9", env=env)
    assert secret not in json.dumps(alloc.to_json())
    echo = {"title": "Unprocessable", "status": 422, "detail": f"env {secret}", "msg": f"env {secret}",
            "error": {"code": "global/invalid-parameters", "message": f"bad env {secret}"}}
    launch.mock(return_value=httpx.Response(422, json=echo))
    with pytest.raises(LaunchFailed) as info:
        subject.launch(offer, allocation_id="alloc-9", env=env)
    assert secret not in str(info.value) and secret not in caplog.text and KEY not in caplog.text


# -- helpers -----------------------------------------------------------------------------------


def allocation(provider: str, ref: str, **details: Any) -> Allocation:
    return Allocation(allocation_id="alloc-x", provider=provider, offer_id="o", ref=ref,
                      started="2026-01-15T10:00:00+00:00", details=details)


def spot_offer(spot: bool = True) -> Offer:
    return Offer(provider="runpod", id="spot-secure/NVIDIA-GeForce-RTX-4090/x1", gpu="RTX 4090", gpu_count=1,
                 gpu_memory_gb=24, price_per_hour=0.35, region="any", spot=spot,
                 extra={"gpu_type_id": "NVIDIA GeForce RTX 4090", "bid_per_gpu": 0.35, "data_center_id": None})


def vast_offer() -> Offer:
    return Offer(provider="vastai", id="12345678", gpu="RTX 4090", gpu_count=1, gpu_memory_gb=24.56,
                 price_per_hour=0.41, region="Texas, US", extra={"ask_id": 12345678})


def lambda_offer() -> Offer:
    return Offer(provider="lambda", id="gpu_1x_h100_pcie@us-west-3", gpu="H100 PCIe", gpu_count=1, gpu_memory_gb=80,
                 price_per_hour=2.49, region="us-west-3",
                 extra={"instance_type": "gpu_1x_h100_pcie", "region": "us-west-3"})


# -- issue 13: the day-one defects -------------------------------------------------------------


def vast_row(ask: int, price: float, gpu: str = "H100 SXM") -> dict[str, Any]:
    row = copy.deepcopy(body("vastai", "searchOffers.200.json")["offers"][0])
    row.update(id=ask, ask_contract_id=ask, dph_total=price, gpu_name=gpu)
    return row


def test_vast_search_filters_on_the_gpu_models_count_driver_and_cuda(api: respx.MockRouter) -> None:
    route = api.post(f"{VAST}/api/v0/bundles/").mock(
        return_value=httpx.Response(200, json={"offers": [vast_row(1, 2.1)]}))
    offers = vast().offers(Requirements(gpus=("H100",), gpu_count=2, driver="550.54.15", min_cuda="12"))
    query = sent_json(route)
    assert query["gpu_name"] == {"in": ["H100 NVL", "H100 PCIE", "H100 SXM"]}  # Vast matches names exactly
    # as Vast's client sends them: the driver as its zero-padded number, the CUDA floor's capability
    assert (query["num_gpus"], query["driver_version"], query["cuda_max_good"], query["compute_cap"]) == (
        {"gte": 2}, {"eq": 550054015}, {"gte": 12.0}, {"gte": 500})
    assert (query["direct_port_count"], query["external"]) == ({"gte": 1}, {"eq": False})  # SSH is direct
    assert [o.gpu for o in offers] == ["H100 SXM"]
    check_request(sent(route))  # and the query is one the published document admits


def test_vast_driver_and_cuda_filters_are_the_clients_numbers() -> None:
    from jupyter_portable.compute.vastai import min_compute_cap, numeric_driver

    assert numeric_driver("550.54.15") == {"eq": 550054015}  # vastai's query.numeric_version
    assert numeric_driver("535.104.05") == {"eq": 535104005}
    assert numeric_driver("550.54") == {"gte": 550054000, "lte": 550054999}  # every patch release of it
    assert numeric_driver("550") == {"gte": 550000000, "lte": 550999999}
    assert numeric_driver("r550") is None and numeric_driver("550.1234.1") is None
    assert [min_compute_cap(v) for v in ("10.2", "11.8", "12", "12.4", "13.0", "14.1", "x")] == [
        None, 350, 500, 500, 750, 750, None]


def test_vast_gpu_models_become_the_exact_names_vast_lists() -> None:
    from jupyter_portable.compute.vastai import gpu_names

    assert gpu_names(("rtx_4090", "A100", "4090")) == ["RTX 4090", "A100 PCIE", "A100 SXM4", "A100X"]
    assert gpu_names(("Imaginary  RTX 9999",)) == ["Imaginary RTX 9999"]  # unknown: sent as written
    assert gpu_names(()) == []


def test_vast_search_pages_through_results_past_the_first_page(api: respx.MockRouter) -> None:
    pages = [[vast_row(11, 0.40), vast_row(12, 0.50)],
             [vast_row(13, 0.50), vast_row(14, 0.60)],  # 13 shares the price the last page ended on
             [vast_row(15, 0.70)]]
    route = api.post(f"{VAST}/api/v0/bundles/").mock(
        side_effect=[httpx.Response(200, json={"offers": rows}) for rows in pages])
    offers = vast(limit=2).offers(Requirements(gpus=("H100",), max_price_per_hour=5))
    assert [o.id for o in offers] == ["11", "12", "13", "14", "15"]
    queries = [sent_json(route, i) for i in range(3)]
    assert "id" not in queries[0] and queries[0]["dph_total"] == {"lte": 5}
    assert queries[1]["dph_total"] == {"lte": 5, "gte": 0.5} and queries[1]["id"] == {"notin": [12]}
    assert queries[2]["dph_total"] == {"lte": 5, "gte": 0.6} and queries[2]["id"] == {"notin": [14]}
    assert all(q["gpu_name"] == queries[0]["gpu_name"] and q["limit"] == 2 for q in queries)


def test_vast_paging_stops_at_max_offers_and_on_a_page_with_nothing_new(api: respx.MockRouter) -> None:
    full = [vast_row(21, 0.4), vast_row(22, 0.4)]
    route = api.post(f"{VAST}/api/v0/bundles/").mock(return_value=httpx.Response(200, json={"offers": full}))
    assert [o.id for o in vast(limit=2).offers()] == ["21", "22"]  # the same page again: nothing new, stop
    assert route.call_count == 2
    route.mock(side_effect=[httpx.Response(200, json={"offers": [vast_row(31 + i, 0.1 * (i + 1))
                                                                 for i in range(j, j + 2)]}) for j in (0, 2, 4)])
    assert len(vast(limit=2, max_offers=3).offers()) == 3


@pytest.mark.parametrize("wanted,sent_as", [("12", "12.0"), ("12.4", "12.4"), ("12.4.1", "12.4"), ("11.8", "11.8")])
def test_runpod_cuda_version_is_sent_as_major_minor(api: respx.MockRouter, wanted: str, sent_as: str) -> None:
    catalog = api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    create = api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", "createPod.201.json"))
    provider = runpod()
    offer = provider.offers(Requirements(min_cuda=wanted))[0]
    assert dict(sent(catalog).url.params)["minCudaVersion"] == sent_as
    provider.launch(offer, allocation_id="alloc-0001")
    assert sent_json(create)["gpu"]["minCudaVersion"] == sent_as
    check_request(sent(create))  # a bare "12" is what RunPod refused with 422


def test_runpod_an_offer_listed_with_a_bare_major_still_launches_with_major_minor(api: respx.MockRouter) -> None:
    create = api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", "createPod.201.json"))
    offer = spot_offer(spot=False)
    offer = dataclasses.replace(offer, extra={**offer.extra, "min_cuda": "12"})
    runpod().launch(offer, allocation_id="alloc-0001")
    assert sent_json(create)["gpu"]["minCudaVersion"] == "12.0"


def test_runpod_403_on_create_marks_the_route_not_permitted_and_acquisition_moves_on(
        api: respx.MockRouter) -> None:
    from jupyter_portable.compute.acquire import acquire

    api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
    api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "getSshKeys.200.json"))
    stock = body("runpod", "getGpuType.200.high.json")
    stock["dataCenters"].append({"id": "US-TX-3", "name": "US Texas 3", "availability": "HIGH"})
    api.get(url__regex=rf"{RUNPOD}/v2/catalog/gpus/.+").mock(return_value=httpx.Response(200, json=stock))
    create = api.post(f"{RUNPOD}/v2/pods").mock(side_effect=[
        reply("runpod", "createPod.403.json"), reply("runpod", "createPod.400.no-capacity.json")])
    provider = runpod()
    routes = [o for o in provider.offers() if o.capacity][:2]
    ids = iter(["alloc-a", "alloc-b"])
    with pytest.raises(NoCapacity) as info:
        acquire(routes, {"runpod": provider}, Requirements(), allocation_id_factory=lambda: next(ids))
    first, second = info.value.context["attempts"]
    assert create.call_count == 2  # the refused pool was skipped and the next route tried
    assert (first.offer_key, first.stage, first.error) == (routes[0].key, "launch", "QuotaExceeded")
    assert "not permitted" in first.reason and "not open to your account" in first.reason
    assert first.checks.permitted is True and first.checks.launched is False
    assert (second.offer_key, second.error) == (routes[1].key, "NoCapacity")


def test_runpod_403_elsewhere_is_still_an_auth_error(api: respx.MockRouter) -> None:
    api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "createPod.403.json"))
    with pytest.raises(AuthError):
        runpod().check_permission(spot_offer())


def test_lambda_launch_sends_exactly_one_ssh_key_name(api: respx.MockRouter) -> None:
    api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
    launch = api.post(f"{LAMBDA}/api/v1/instance-operations/launch").mock(
        return_value=reply("lambda", "launchInstance.200.json"))
    provider = lam(ssh_key_names=["jp-worker", "laptop"])
    provider.launch(next(o for o in provider.offers() if o.capacity), allocation_id="alloc-0003")
    assert sent_json(launch)["ssh_key_names"] == ["jp-worker"]
    check_request(sent(launch))


RATE_LIMITED = {"runpod": ("POST", f"{RUNPOD}/v2/pods", "createPod.429.json"),
                "vastai": ("PUT", f"{VAST}/api/v0/asks/12345678/", "createInstance.429.json"),
                "lambda": ("POST", f"{LAMBDA}/api/v1/instance-operations/launch", "launchInstance.429.json")}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_rate_limited_launch_is_never_launch_failed(api: respx.MockRouter, provider: str) -> None:
    method, url, fixture = RATE_LIMITED[provider]
    route = api.route(method=method, url=url).mock(return_value=reply(provider, fixture, **{"Retry-After": "12"}))
    offer = {"runpod": spot_offer(spot=False), "vastai": vast_offer(), "lambda": lambda_offer()}[provider]
    subject = make(provider)
    with pytest.raises(ComputeError) as info:
        subject.launch(offer, allocation_id="alloc-9")
    assert type(info.value) is ProviderUnavailable, f"{type(info.value).__name__}: {info.value}"
    assert info.value.context["rate_limited"] is True and info.value.context["retry_after"] == 12.0
    assert "12" in (info.value.hint or "") and info.value.offer == offer.id
    # a 429 was not acted on, so even a launch is tried again, a bounded number of times
    assert route.call_count == subject._api.policy.attempts == info.value.context["attempts"]


@pytest.mark.parametrize("code", ["global/quota-exceeded", "instance-operations/launch/insufficient-capacity",
                                  "global/invalid-parameters"])
def test_a_lambda_429_is_a_rate_limit_whatever_code_its_body_carries(api: respx.MockRouter, code: str) -> None:
    api.post(f"{LAMBDA}/api/v1/instance-operations/launch").mock(
        return_value=httpx.Response(429, json={"error": {"code": code, "message": "slow down"}}))
    with pytest.raises(ProviderUnavailable) as info:
        lam().launch(lambda_offer(), allocation_id="alloc-9")
    assert type(info.value) is ProviderUnavailable and "rate-limited" in str(info.value)


# -- requests checked against the published request schemas --------------------------------------


def lifecycle_requests(api: respx.MockRouter, provider: str) -> list[httpx.Request]:
    """Every request one provider sends over list, check, launch, poll and terminate."""
    if provider == "runpod":
        api.get(f"{RUNPOD}/v2/catalog/gpus").mock(return_value=reply("runpod", "listGpuTypes.200.json"))
        api.get(f"{RUNPOD}/v2/account/ssh-keys").mock(return_value=reply("runpod", "getSshKeys.200.json"))
        api.get(url__regex=rf"{RUNPOD}/v2/catalog/gpus/.+").mock(
            return_value=reply("runpod", "getGpuType.200.high.json"))
        api.post(f"{RUNPOD}/v2/pods").mock(return_value=reply("runpod", "createPod.201.json"))
        api.get(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=reply("runpod", "getPod.200.reachable.json"))
        api.delete(f"{RUNPOD}/v2/pods/7h9k2m4n6p").mock(return_value=httpx.Response(204))
        subject: Any = runpod()
        req = Requirements(gpu_count=1, min_cuda="12")
    elif provider == "vastai":
        api.post(f"{VAST}/api/v0/bundles/").mock(return_value=reply("vastai", "searchOffers.200.json"))
        api.get(f"{VAST}/api/v0/users/current/").mock(return_value=reply("vastai", "showUser.200.json"))
        api.put(f"{VAST}/api/v0/asks/12345678/").mock(return_value=reply("vastai", "createInstance.200.json"))
        api.post(f"{VAST}/api/v0/instances/7654321/ssh/").mock(return_value=reply("vastai", "attachSshKey.200.json"))
        api.get(f"{VAST}/api/v0/instances/7654321/").mock(
            return_value=reply("vastai", "showInstance.200.reachable.json"))
        api.delete(f"{VAST}/api/v0/instances/7654321/").mock(return_value=reply("vastai", "destroyInstance.200.json"))
        subject = vast()
        req = Requirements(gpus=("4090",), driver="550.54.15", min_cuda="12.4", min_gpu_memory_gb=24,
                           max_price_per_hour=5)
    else:
        api.get(f"{LAMBDA}/api/v1/instance-types").mock(return_value=reply("lambda", "listInstanceTypes.200.json"))
        api.get(f"{LAMBDA}/api/v1/ssh-keys").mock(return_value=reply("lambda", "listSSHKeys.200.json"))
        api.post(f"{LAMBDA}/api/v1/instance-operations/launch").mock(
            return_value=reply("lambda", "launchInstance.200.json"))
        api.get(url__regex=rf"{LAMBDA}/api/v1/instances/.+").mock(
            return_value=reply("lambda", "getInstance.200.active.json"))
        api.post(f"{LAMBDA}/api/v1/instance-operations/terminate").mock(
            return_value=reply("lambda", "terminateInstance.200.json"))
        subject = lam()
        req = Requirements()
    offer = next(o for o in subject.offers(req) if o.capacity)
    subject.check_permission(offer)
    subject.check_capacity(offer)
    alloc = subject.launch(offer, allocation_id="alloc-0001", ssh_public_key=PUBKEY, env={"HF_TOKEN": "hf_x"})
    subject.status(alloc)
    subject.terminate(alloc)
    return [call.request for call in api.calls]


COVERED = {"runpod": {"listGpuTypes", "getSshKeys", "getGpuType", "createPod", "getPod", "deletePod"},
           "vastai": {"searchOffers", "showUser", "createInstance", "attachSshKey", "showInstance",
                      "destroyInstance"},
           "lambda": {"listInstanceTypes", "listSSHKeys", "launchInstance", "getInstance", "terminateInstance"}}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_request_of_a_lifecycle_matches_its_published_request_schema(api: respx.MockRouter,
                                                                           provider: str) -> None:
    requests = lifecycle_requests(api, provider)
    seen = set()
    for request in requests:
        found = operation_of(request)
        assert found is not None, f"no published operation for {request.method} {request.url.path}"
        seen.add(found[1])
        check_request(request)
    assert seen == COVERED[provider]


def _renamed(request: httpx.Request, old: str, new: str) -> httpx.Request:
    """The same request with one body field or query parameter renamed."""
    if request.content:
        sent_body = json.loads(request.content)
        assert old in sent_body, f"{old} is not in the sent body"
        sent_body[new] = sent_body.pop(old)
        return httpx.Request(request.method, request.url, json=sent_body)
    params = [(new if k == old else k, v) for k, v in request.url.params.multi_items()]
    assert any(k == new for k, _ in params), f"{old} is not in the sent query"
    return httpx.Request(request.method, request.url.copy_with(params=params))


@pytest.mark.parametrize("provider,operation,old,new", [
    ("runpod", "listGpuTypes", "minCudaVersion", "minCuda"),
    ("runpod", "createPod", "dataCenterIds", "dataCenterId"),
    ("runpod", "createPod", "startSsh", "start_ssh"),
    ("vastai", "searchOffers", "gpu_name", "gpu_names"),
    ("vastai", "searchOffers", "driver_version", "driver"),
    ("vastai", "createInstance", "label", "labels"),
    ("vastai", "attachSshKey", "ssh_key", "key"),
    ("lambda", "launchInstance", "ssh_key_names", "ssh_keys"),
    ("lambda", "launchInstance", "instance_type_name", "instance_type"),
    ("lambda", "terminateInstance", "instance_ids", "ids"),
])
def test_renaming_a_field_of_a_sent_request_fails_the_contract(api: respx.MockRouter, provider: str, operation: str,
                                                                old: str, new: str) -> None:
    request = next(r for r in lifecycle_requests(api, provider) if (operation_of(r) or ("", ""))[1] == operation)
    check_request(request)
    with pytest.raises(jsonschema.ValidationError):
        check_request(_renamed(request, old, new))
