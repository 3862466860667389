"""RunPod as it really answers (issue 27, items 6 and 7), through the real provider and its twin: a
``PUBLIC_KEY`` in the launch replaces the account's SSH keys (RunPod's document says so), so
only the key the launch sent logs in; an interruptible pod bids a set fraction of the on-demand
price (not the minimum), costs its bid, and a lower bid is the first stopped when the market
rises, which the offer's risk says before anything is rented. A community pod is deployed over
GraphQL on a host with a public IP (issue 42, item 4), as RunPod's own client asks for one."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from sshd import keygen, unavailable
from test_twins import BOOT_S, H100, FakeClock, ssh, wait_reachable
from twins.runpod import RunPodTwin
from twins.server import TwinOffer

from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.gpu_catalog import SPOT_RELIABILITY
from jupyter_portable.compute.runpod import (
    DEFAULT_SPOT_BID,
    DEPLOY_ON_DEMAND,
    MIN_BID_RELIABILITY,
    RENT_SPOT,
    RunPodProvider,
)
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.routing import WorkspaceFacts, rank_routes

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


def test_the_launch_key_replaces_the_accounts_keys(tmp_path: Path) -> None:
    clock = FakeClock()
    launch_key, account_key = keygen(tmp_path / "launch"), keygen(tmp_path / "account")
    with RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**vars(H100))], clock=clock, boot_delay_s=BOOT_S,
                    account_keys=[account_key.with_suffix(".pub").read_text().strip()]) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        allocation = p.launch(p.offers()[0], allocation_id="al-keys000001",
                              ssh_public_key=launch_key.with_suffix(".pub").read_text())
        endpoint = wait_reachable(p, allocation, clock)[-1].ssh
        assert endpoint is not None
        assert ssh(endpoint, launch_key, "true").returncode == 0
        assert ssh(endpoint, account_key, "true").returncode != 0  # startSsh's account keys gave way
        p.terminate(allocation)
        assert twin.violations == []


# -- interruptible pods: the bid is a setting, and the route's risk follows it (issue 27, item 6) ----

ON_DEMAND = H100.price  # per GPU: the H100 offer has one
MINIMUM = round(ON_DEMAND / 2, 4)  # the twin's minimum bid


def _spot_twin(tmp_path: Path, clock: FakeClock, stock: int = 1) -> RunPodTwin:
    return RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": stock})], clock=clock,
                      boot_delay_s=BOOT_S)


def _rent_spot(twin: RunPodTwin, bid: float) -> httpx.Response:
    spec = {"name": "x", "imageName": "runpod/base:1", "gpuTypeId": H100.gpu, "gpuCount": 1, "bidPerGpu": bid,
            "cloudType": "SECURE", "containerDiskInGb": 20, "volumeInGb": 0, "ports": "22/tcp", "startSsh": True,
            "env": []}
    return httpx.post(f"{twin.url}/graphql", headers={"Authorization": f"Bearer {twin.api_key}"},
                      json={"query": RENT_SPOT, "variables": {"input": spec}})


def test_a_spot_pod_asked_without_a_public_ip_has_no_direct_ssh(tmp_path: Path) -> None:
    """What the twin does without supportPublicIp (the provider's launch asks for it, below): the
    pod runs with RunPod's proxy SSH only, no direct TCP endpoint for 22."""
    clock = FakeClock()
    with _spot_twin(tmp_path, clock) as twin:
        pod = _rent_spot(twin, 2.0).json()["data"]["podRentInterruptable"]
        assert twin.rentals[pod["id"]].extra["public_ip"] is False
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        shim = Allocation("al-nopublic", "runpod", "x", pod["id"], "2026-12-06T00:00:00Z")
        for _ in range(200):  # its machine (a real sshd) is up: an upper bound for that to happen
            if twin.rentals[pod["id"]].machine is not None:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        clock.sleep(BOOT_S + 1)
        st = p.status(shim)
        assert twin.rentals[pod["id"]].machine is not None and st.state == "running" and st.ssh is None, st
        assert twin.violations == []


def test_the_twin_refuses_a_bid_under_the_minimum_and_a_spot_pod_costs_its_bid(tmp_path: Path) -> None:
    clock = FakeClock()
    with _spot_twin(tmp_path, clock, stock=2) as twin:
        low = _rent_spot(twin, MINIMUM - 0.01).json()
        assert low["data"] is None and "minimum bid" in low["errors"][0]["message"]
        assert twin.running() == []
        pod = _rent_spot(twin, 2.0).json()["data"]["podRentInterruptable"]
        assert pod["costPerHr"] == 2.0
        got = httpx.get(f"{twin.url}/v2/pods/{pod['id']}", headers={"Authorization": f"Bearer {twin.api_key}"})
        assert got.json()["cost"] == 2.0  # the bid, not the on-demand price
        assert twin.violations == []


def test_runpod_spot_bids_a_fraction_of_on_demand_not_the_minimum(tmp_path: Path) -> None:
    clock = FakeClock()
    with _spot_twin(tmp_path, clock) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), include_spot=True, sleep=clock.sleep, clock=clock)
        [spot] = [o for o in p.offers() if o.spot]
        bid = round(DEFAULT_SPOT_BID * ON_DEMAND, 4)
        assert spot.price_per_hour == bid and bid > MINIMUM
        assert spot.extra["bid_per_gpu"] == bid and spot.extra["minimum_bid_per_gpu"] == MINIMUM
        allocation = p.launch(spot, allocation_id="al-spot0000bid")
        [rent] = [r for r in twin.requests if r["op"] == "graphql.podRentInterruptable"]
        assert rent["status"] == 200
        assert twin.rentals[allocation.ref].extra["bid_per_gpu"] == bid  # what RunPod was sent
        assert allocation.details["cost_per_hour"] == bid  # and what it charges
        # on a host with a public IP (supportPublicIp): its SSH is reachable directly once it is up
        assert twin.rentals[allocation.ref].extra["public_ip"] is True
        assert wait_reachable(p, allocation, clock)[-1].ssh is not None
        p.terminate(allocation)
        assert twin.violations == []


def test_the_spot_offers_risk_follows_the_bid(tmp_path: Path) -> None:
    clock = FakeClock()
    with _spot_twin(tmp_path, clock) as twin:
        def spot_offer(fraction: float) -> list[Offer]:
            p = RunPodProvider(**twin.provider_kwargs(), include_spot=True, spot_bid=fraction, sleep=clock.sleep,
                               clock=clock)
            return [o for o in p.offers() if o.spot]

        [at_minimum], [default], [high], [full] = (spot_offer(f) for f in (0.5, DEFAULT_SPOT_BID, 0.9, 1.0))
        assert at_minimum.reliability == MIN_BID_RELIABILITY
        assert at_minimum.reliability < default.reliability < high.reliability < full.reliability
        assert full.reliability == SPOT_RELIABILITY  # bidding on-demand: as safe as spot gets, never 1.0
        assert [o.price_per_hour for o in (at_minimum, default, high, full)] == [
            round(f * ON_DEMAND, 4) for f in (0.5, DEFAULT_SPOT_BID, 0.9, 1.0)]
        assert spot_offer(0.4) == []  # under RunPod's minimum: nothing to rent at that bid
        # what routing makes of it: the chance of losing the machine falls as the bid rises
        facts = WorkspaceFacts(bytes_to_move=0, store_region=None, store_provider=None, store_egress_per_gb=0.0)
        routes = {r.offer.price_per_hour: r for r in rank_routes(facts, [at_minimum, default, full], hours=8)}
        chances = [routes[o.price_per_hour].p_fail for o in (at_minimum, default, full)]
        assert chances == sorted(chances, reverse=True) and len(set(chances)) == 3
        assert twin.violations == []


def test_a_higher_bid_outlasts_a_lower_one_when_the_market_rises(tmp_path: Path) -> None:
    clock = FakeClock()
    with _spot_twin(tmp_path, clock, stock=2) as twin:
        pods = {}
        for fraction in (0.6, 0.9):
            p = RunPodProvider(**twin.provider_kwargs(), include_spot=True, spot_bid=fraction, sleep=clock.sleep,
                               clock=clock)
            [offer] = [o for o in p.offers() if o.spot]
            pods[fraction] = (p, p.launch(offer, allocation_id=f"al-spot{int(fraction * 10):07d}"))
        assert twin.outbid(0.75 * ON_DEMAND) == [pods[0.6][1].ref]
        low, high = (p.status(a) for p, a in pods.values())
        assert low.state == "lost" and "outbid" in (low.reason or "")
        assert high.state in ("pending", "running", "reachable")
        for p, a in pods.values():
            p.terminate(a)
        assert twin.violations == []


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "cheap", "nan"])
def test_a_bid_setting_out_of_range_is_refused_naming_runpod(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_SPOT_BID", value)
    with pytest.raises(UsageError) as info:
        RunPodProvider(api_key="k")
    assert str(info.value).startswith("runpod: RUNPOD_SPOT_BID must be a fraction of the on-demand price")
    assert "RunPod" in (info.value.hint or "")
    with pytest.raises(UsageError, match="runpod: spot_bid must be"):
        RunPodProvider(api_key="k", spot_bid=0)


def test_spot_and_its_bid_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNPOD_SPOT", raising=False)
    monkeypatch.delenv("RUNPOD_SPOT_BID", raising=False)
    plain = RunPodProvider(api_key="k")
    assert (plain.include_spot, plain.spot_bid) == (False, DEFAULT_SPOT_BID)
    monkeypatch.setenv("RUNPOD_SPOT", "1")
    monkeypatch.setenv("RUNPOD_SPOT_BID", "0.8")
    configured = RunPodProvider(api_key="k")
    assert (configured.include_spot, configured.spot_bid) == (True, 0.8)


# -- community pods: GraphQL podFindAndDeployOnDemand with supportPublicIp (issue 42, item 4) ----------


def _community_twin(tmp_path: Path, clock: FakeClock, **kwargs: Any) -> RunPodTwin:
    return RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 2})], clock=clock,
                      boot_delay_s=BOOT_S, **kwargs)


def _graphql(twin: RunPodTwin, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{twin.url}/graphql", headers={"Authorization": f"Bearer {twin.api_key}"},
                        json={"query": query, "variables": variables})
    assert answer.status_code == 200
    return dict(answer.json())


def test_a_community_pod_is_deployed_over_graphql_on_a_host_with_a_public_ip(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    key = keygen(tmp_path / "launch")
    with _community_twin(tmp_path, clock) as twin:
        # what REST v2 gives a community pod (it has no supportPublicIp): no direct SSH, ever
        rest = httpx.post(f"{twin.url}/v2/pods", headers={"Authorization": f"Bearer {twin.api_key}"},
                          json={"name": "x", "image": "runpod/base:1", "gpu": {"id": H100.gpu, "count": 1},
                                "cloud": "COMMUNITY", "ports": ["22/tcp"], "startSsh": True})
        assert rest.status_code == 201 and twin.rentals[rest.json()["id"]].extra["public_ip"] is False
        monkeypatch.setenv("RUNPOD_CLOUD", "community")  # the user's setting (c.PortableRunPod.cloud)
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        assert p.cloud == "COMMUNITY"
        [offer] = p.offers(Requirements(min_cuda="12"))
        allocation = p.launch(offer, allocation_id="al-community01", ssh_public_key=key.with_suffix(".pub").read_text())
        [deploy] = [r for r in twin.requests if r["op"] == "graphql.podFindAndDeployOnDemand"]
        assert deploy["status"] == 200 and len([r for r in twin.requests if r["op"] == "createPod"]) == 1  # ours
        rental = twin.rentals[allocation.ref]
        assert rental.extra["public_ip"] is True and rental.extra["cloud"] == "COMMUNITY"
        assert allocation.details["cost_per_hour"] == H100.price
        endpoint = wait_reachable(p, allocation, clock)[-1].ssh
        assert endpoint is not None and ssh(endpoint, key, "true").returncode == 0
        p.terminate(allocation)
        assert allocation.ref not in twin.running()
        assert twin.violations == []


def test_the_cloud_is_a_setting_and_a_bad_one_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from traitlets.config import Config, Configurable

    from jupyter_portable.compute.config import provider_kwargs

    assert RunPodProvider(api_key="k").cloud == "SECURE"  # the default
    # a config file's c.PortableRunPod.cloud, as the server and the CLI build their providers
    kwargs = provider_kwargs("runpod", parent=Configurable(config=Config({"PortableRunPod": {"cloud": "community"}})))
    assert kwargs["cloud"] == "COMMUNITY" and RunPodProvider(api_key="k", **kwargs).cloud == "COMMUNITY"
    assert RunPodProvider(api_key="k", cloud="secure").cloud == "SECURE"  # given outright
    monkeypatch.setenv("RUNPOD_CLOUD", "cheapest")
    with pytest.raises(UsageError, match="RUNPOD_CLOUD.*must be SECURE or COMMUNITY.*cheapest"):
        RunPodProvider(api_key="k")


def test_a_secure_pod_is_still_created_over_rest(tmp_path: Path) -> None:
    clock = FakeClock()
    with _community_twin(tmp_path, clock) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        allocation = p.launch(p.offers()[0], allocation_id="al-secure0001")
        assert [r["op"] for r in twin.requests if r["op"] in twin.launch_ops] == ["createPod"]
        assert twin.rentals[allocation.ref].extra["public_ip"] is True  # secure hosts have public IPs
        p.terminate(allocation)
        assert twin.violations == []


GOOD_INPUT = {"name": "x", "imageName": "runpod/base:1", "gpuTypeId": H100.gpu, "gpuCount": 1,
              "cloudType": "COMMUNITY", "supportPublicIp": True, "startSsh": True, "ports": "22/tcp",
              "dataCenterId": None, "env": [{"key": "A", "value": "1"}]}


SPOILED_INPUTS = [
    (lambda i: i.update(supportPublicIP=True), "supportPublicIP"),  # misspelt: the client never sends it
    (lambda i: i.update(bidPerGpu=1.0), "bidPerGpu"),  # the spot mutation's field, not this one's
    (lambda i: i.pop("gpuTypeId"), "gpuTypeId"),  # without it the client deploys a CPU pod instead
    (lambda i: i.pop("cloudType"), "cloudType"),
    (lambda i: i.update(gpuCount="1"), "gpuCount"),
    (lambda i: i.update(cloudType="PUBLIC"), "PUBLIC"),
    (lambda i: i.update(env={"A": "1"}), "env"),  # a list of {key, value}, not a map
]


def test_the_twin_refuses_a_deploy_input_runpods_client_would_not_send(tmp_path: Path) -> None:
    clock = FakeClock()
    with _community_twin(tmp_path, clock) as twin:
        for spoil, words in SPOILED_INPUTS:
            spoiled = copy.deepcopy(GOOD_INPUT)
            spoil(spoiled)
            refused = _graphql(twin, DEPLOY_ON_DEMAND, {"input": spoiled})
            assert refused["data"] is None and words in refused["errors"][0]["message"], (words, refused)
            assert twin.running() == [] and len(twin.violations) == 1 and words in twin.violations[0], words
            twin.violations.clear()  # expected here: the twin refused what it had to
        deployed = _graphql(twin, DEPLOY_ON_DEMAND, {"input": GOOD_INPUT})  # and takes the client's shape
        assert twin.running() == [deployed["data"]["podFindAndDeployOnDemand"]["id"]]
        assert twin.violations == []


def test_a_community_launch_answered_500_is_looked_up_until_listed_and_used(tmp_path: Path) -> None:
    # issue 42 item 3 on the GraphQL path: RunPod made the pod, answered 500, and lists it 40 s later
    clock = FakeClock()
    with _community_twin(tmp_path, clock, gateway_errors=1, gateway_status=500, listing_lag_s=40.0) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), cloud="COMMUNITY", sleep=clock.sleep, clock=clock)
        started = clock()
        allocation = p.launch(p.offers()[0], allocation_id="al-community500",
                              env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-lost"})
        launches = [r for r in twin.requests if r["op"] in twin.launch_ops]
        assert [(r["op"], r["status"]) for r in launches] == [("graphql.podFindAndDeployOnDemand", 500)]
        assert twin.running() == [allocation.ref] and allocation.details["found_by_name"] is True
        assert clock() - started >= 40.0  # it waited for the listing rather than rent another
        p.terminate(allocation)
        assert twin.running() == [] and twin.violations == []
