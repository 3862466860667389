"""Whole-route cost: egress, queue, storage and risk beside the GPU's $/h, with blocked routes kept.

Every expected number is worked out by hand in a comment next to it.
"""

from __future__ import annotations

import math

import pytest

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Checks, Offer, Requirements
from jupyter_portable.core.routing import (
    BEST_MARGIN,
    DEFAULT_QUEUE_S,
    Caps,
    Incident,
    Signals,
    WorkspaceFacts,
    best_route,
    egress_price_per_gb,
    rank_routes,
    route_id,
)

GB = 10**9


def offer(provider: str, id: str, price: float, region: str, **kw: object) -> Offer:
    kw.setdefault("capacity", 1)  # "can start now": no queue term unless a test wants one
    return Offer(provider=provider, id=id, gpu=str(kw.pop("gpu", "A100")), gpu_count=1, gpu_memory_gb=80,
                 price_per_hour=price, region=region, **kw)  # type: ignore[arg-type]


def s3(gb: float, **kw: object) -> WorkspaceFacts:
    return WorkspaceFacts(bytes_to_move=int(gb * GB), store_region="us-east-1", store_provider="aws",
                          store_egress_per_gb=0.09, **kw)  # type: ignore[arg-type]


FAR = offer("lambda", "gpu_1x_a100", 1.89, "us-west-1")  # cheap GPU in another cloud
NEAR = offer("aws", "p4d-a100", 2.50, "us-east-1")  # dearer GPU next to the data


# -- the acceptance case ---------------------------------------------------------------------

def test_a_cheap_gpu_far_from_a_large_workspace_ranks_below_a_dear_gpu_next_to_the_data() -> None:
    routes = rank_routes(s3(500), [FAR, NEAR], hours=8)
    assert [r.offer.key for r in routes] == ["aws/p4d-a100", "lambda/gpu_1x_a100"]
    near, far = routes
    # NEAR: 2.50 * 8 = 20.00; same provider and region, so egress 0
    assert near.cost.gpu == pytest.approx(20.00)
    assert near.cost.egress == 0
    assert near.cost.total == pytest.approx(20.00)
    # FAR: 1.89 * 8 = 15.12; 500 GB * $0.09 = 45.00; 15.12 + 45.00 = 60.12
    assert far.cost.gpu == pytest.approx(15.12)
    assert far.cost.egress == pytest.approx(45.00)
    assert far.cost.total == pytest.approx(60.12)
    assert near.blocked is None and far.blocked is None


def test_with_a_tiny_workspace_the_cheap_far_gpu_wins() -> None:
    far, near = rank_routes(s3(1), [NEAR, FAR], hours=8)
    # FAR: 15.12 + 1 GB * 0.09 = 15.21 < NEAR: 20.00
    assert far.offer is FAR and far.cost.total == pytest.approx(15.21)
    assert near.offer is NEAR and near.cost.total == pytest.approx(20.00)


# -- egress -----------------------------------------------------------------------------------

def test_aws_egress_is_tiered_over_the_transfer() -> None:
    gcp = offer("gcp", "a2-highgpu-1g", 3.0, "us-central1-a")
    # 20,000 GB: 10,000 * 0.09 + 10,000 * 0.085 = 900 + 850 = 1,750 -> 0.0875 $/GB
    assert egress_price_per_gb("aws", "us-east-1", gcp, gb=20_000) == pytest.approx(0.0875)
    # 200,000 GB: 900 + 40,000 * 0.085 (3,400) + 100,000 * 0.07 (7,000) + 50,000 * 0.05 (2,500) = 13,800
    assert egress_price_per_gb("aws", "us-east-1", gcp, gb=200_000) * 200_000 == pytest.approx(13_800)
    # no volume given: the first tier's price
    assert egress_price_per_gb("aws", "us-east-1", gcp) == 0.09
    route = rank_routes(s3(20_000), [gcp], hours=1)[0]
    assert route.cost.egress == pytest.approx(1_750)


def test_egress_within_a_provider_and_from_a_local_store() -> None:
    # same region, offer named by its zone: free
    assert egress_price_per_gb("aws", "us-east-1", offer("aws", "g5", 1.0, "us-east-1a")) == 0
    assert egress_price_per_gb("gcp", "us-central1", offer("gcp", "a2", 1.0, "us-central1-a")) == 0
    # same provider, another region: AWS inter-region $0.02/GB
    assert egress_price_per_gb("aws", "us-east-1", offer("aws", "g5", 1.0, "us-west-2")) == 0.02
    # GCP premium tier to another cloud: $0.12/GB
    assert egress_price_per_gb("gcp", "us-central1", offer("runpod", "a100", 1.0, "CA-MTL-1")) == 0.12
    # a local store: free to the local market, upload bandwidth only ($0) elsewhere...
    assert egress_price_per_gb(None, None, offer("local", "fake-a100", 0.0, "local")) == 0
    assert egress_price_per_gb(None, None, offer("runpod", "a100", 1.0, "CA-MTL-1")) == 0
    # ...except a host that bills its own ingress (Vast): its $0.02/GB, and 0.09 + 0.02 from S3
    vast = offer("vastai", "123", 1.0, "US", egress_per_gb=0.02)
    assert egress_price_per_gb(None, None, vast) == 0.02
    assert egress_price_per_gb("aws", "us-east-1", vast) == pytest.approx(0.11)


def test_a_store_the_table_does_not_know_uses_the_workspace_facts_price() -> None:
    facts = WorkspaceFacts(bytes_to_move=100 * GB, store_region="eu-central", store_provider="wasabi",
                           store_egress_per_gb=0.04)
    route = rank_routes(facts, [FAR], hours=1)[0]
    assert route.cost.egress == pytest.approx(4.00)  # 100 GB * $0.04


# -- queue, storage, transfer ------------------------------------------------------------------

def test_queue_wait_is_priced_at_the_gpu_rate_or_the_value_of_time() -> None:
    unknown = offer("lambda", "a100", 2.00, "us-west-1", capacity=None)
    r = rank_routes(s3(0), [unknown], hours=1)[0]
    assert r.queue_s == DEFAULT_QUEUE_S == 300
    assert r.cost.queue == pytest.approx(2.00 * 300 / 3600)  # 0.1667
    assert r.checks.capacity is None  # the listing said nothing: no check claimed
    r = rank_routes(s3(0), [unknown], hours=1, value_of_time_per_hour=60)[0]
    assert r.cost.queue == pytest.approx(5.00)  # 300 s = 1/12 h * $60/h
    observed = Signals(queue_seconds={unknown.key: 1800})
    r = rank_routes(s3(0), [unknown], hours=1, signals=observed)[0]
    assert r.queue_s == 1800 and r.cost.queue == pytest.approx(1.00)  # 0.5 h * $2.00/h
    # a passed capacity check means no wait
    r = rank_routes(s3(0), [unknown], hours=1, checks={unknown.key: Checks(capacity=True)})[0]
    assert r.queue_s == 0 and r.cost.queue == 0


def test_storage_transfer_and_time_to_ready() -> None:
    o = offer("lambda", "a100", 2.00, "us-west-1", boot_seconds=90, bandwidth_mbps=500)
    r = rank_routes(s3(10, workspace_bytes=100 * GB), [o], hours=8)[0]
    assert r.cost.storage == pytest.approx(100 * 0.023 * 8 / 730)  # 0.0252
    assert r.transfer_s == pytest.approx(160)  # 10e9 B * 8 / 500e6 b/s
    assert r.time_to_ready_s == pytest.approx(0 + 90 + 160)
    assert r.cost.total == pytest.approx(16.00 + 0.90 + 100 * 0.023 * 8 / 730)


# -- risk ------------------------------------------------------------------------------------

def test_a_driver_mismatch_signal_raises_risk_and_the_rank() -> None:
    a = offer("lambda", "a", 2.00, "us-west-1")
    b = offer("lambda", "b", 2.00, "us-west-1")
    plain = {r.offer.id: r for r in rank_routes(s3(10), [a, b], hours=4)}
    assert plain["a"].cost.risk == 0 and plain["b"].cost.risk == 0
    routes = rank_routes(s3(10), [a, b], hours=4, signals=Signals(driver_mismatches={a.key: 1}))
    assert [r.offer.id for r in routes] == ["b", "a"]
    # retry = (boot 120 s + transfer 80 s) / 3600 * $2.00 + egress 10 GB * 0.09 = 0.1111 + 0.90 = 1.0111
    # one mismatch: p_fail 0.25 -> risk 0.2528
    assert routes[1].cost.risk == pytest.approx(0.25 * (200 / 3600 * 2.00 + 0.90))
    assert "driver mismatch" in " ".join(routes[1].breakdown)
    # five mismatches would be 1.25: capped at 0.95
    capped = rank_routes(s3(10), [a], hours=4, signals=Signals(driver_mismatches={a.key: 5}))[0]
    assert capped.cost.risk == pytest.approx(0.95 * (200 / 3600 * 2.00 + 0.90))


def test_launch_failure_rate_reliability_and_recent_failures_combine() -> None:
    o = offer("vastai", "9", 1.00, "US", launch_failure_rate=0.1, reliability=0.9, boot_seconds=360)
    r = rank_routes(s3(0), [o], hours=1)[0]
    # p_fail = 1 - 0.9 * 0.9 = 0.19. A failed launch (0.1) wastes the 360 s boot; a lost machine
    # (0.1, whichever machine the Continue lands on) costs 2 s to notice + 360 s to Continue again +
    # half the hour of work: (0.1 * 360 + 0.1 * 2162) / 3600 = 0.070056 h at $1/h
    assert r.p_fail == pytest.approx(0.19)
    assert r.risk is not None and r.risk.hours == pytest.approx(0.070056, abs=1e-6)
    assert r.cost.risk == pytest.approx(0.070056, abs=1e-6)
    r = rank_routes(s3(0), [o], hours=1, signals=Signals(recent_launch_failures={o.key: 2}))[0]
    # each recent failure adds 0.10 to the launch's chance: (0.3 * 360 + 0.1 * 2162) / 3600, more, not less
    assert r.cost.risk == pytest.approx((0.3 * 360 + 0.1 * 2162) / 3600)


# -- risk priced as what a failure costs the researcher (issue 30) ----------------------------

SPOT = offer("runpod", "spot-a100", 1.00, "EU", reliability=0.90, boot_seconds=60)  # cheap, taken back often
SAFE = offer("aws", "p4d-a100", 1.40, "us-east-1", reliability=0.99, boot_seconds=60)
THREE_LOSSES = (Incident("preempted", 0), Incident("preempted", 76), Incident("preempted", 840))


def test_a_lost_machine_is_priced_as_the_time_to_notice_continue_and_redo_the_work() -> None:
    spot, safe = rank_routes(s3(0), [SAFE, SPOT], hours=8)
    assert spot.risk is not None and spot.risk.p_launch == 0 and spot.risk.p_lost == pytest.approx(0.10)
    # one loss: 2 s to notice (the server's look) + 60 s to Continue again (boot, nothing to move)
    # + half the 8 h of work (no checkpoint yet) = 14,462 s; 10% of it is 0.4017 h, at $1.00/h
    assert (spot.risk.notice_s, spot.risk.again_s, spot.risk.work_s) == (2, 60, 4 * 3600)
    assert spot.risk.hours == pytest.approx(0.1 * 14_462 / 3600)
    assert spot.cost.risk == pytest.approx(0.1 * 14_462 / 3600)
    assert spot.cost.total == pytest.approx(8 + 0.1 * 14_462 / 3600)
    assert safe.cost.risk == pytest.approx(0.01 * 14_462 / 3600 * 1.40)  # 0.0562
    assert spot.words["risk"] == (
        "Risk: 10% chance of a failed launch or a lost machine in the 8 planned h: 0.4 h lost, $0.40 expected."
        " A lost machine costs 2 s to notice, 60 s to Continue again and 4.0 h of work since the last verified"
        " checkpoint, on average (no verified checkpoint yet)")


def test_three_preemptions_make_the_cheap_offer_dearer_than_a_reliable_one() -> None:
    before = rank_routes(s3(0), [SAFE, SPOT], hours=8)
    assert [r.offer.id for r in before] == ["spot-a100", "p4d-a100"]
    after = rank_routes(s3(0), [SAFE, SPOT], hours=8, signals=Signals(incidents={SPOT.key: THREE_LOSSES}))
    # p_lost = 0.10 + 0.30 + 0.30 * (1 - 76/7200) + 0.30 * (1 - 840/7200) = 0.96: capped at 0.95;
    # 0.95 * 14,462 s = 3.816 h at $1.00/h: 8.00 + 3.816 = 11.816 > the reliable 11.20 + 0.056
    spot = next(r for r in after if r.offer.id == "spot-a100")
    assert spot.p_fail == pytest.approx(0.95) and spot.risk is not None
    assert spot.risk.hours == pytest.approx(0.95 * 14_462 / 3600)
    assert spot.cost.total == pytest.approx(8 + 0.95 * 14_462 / 3600)
    assert [r.offer.id for r in after] == ["p4d-a100", "spot-a100"]
    assert best_route(after) is after[0] and after[0].demoted is None, "priced out, not put back by rule"
    assert spot.words["risk"].startswith(
        "Risk: 95% chance of a failed launch or a lost machine in the 8 planned h: 3.8 h lost, $3.82 expected"
        " (preempted just now, preempted 76 s ago, preempted 14 min ago)")
    # the old price of a failure, a wasted boot, would have left it at 8.00 + 0.95 * 60 s = $8.02, best


def test_an_offer_preempted_repeatedly_in_the_last_hour_is_not_best_while_another_is_within_the_margin() -> None:
    # checkpoints every 10 min: a loss costs only 5 min of work, so even at 95% the spot stays cheaper
    facts = s3(0, checkpoint_every_s=600)
    signals = Signals(incidents={SPOT.key: THREE_LOSSES})
    routes = rank_routes(facts, [SPOT, SAFE], hours=8, signals=signals)
    spot = next(r for r in routes if r.offer.id == "spot-a100")
    safe = next(r for r in routes if r.offer.id == "p4d-a100")
    # spot: 8.00 + 0.95 * (2 + 60 + 300) s = 8.0955; safe: 11.20 + 0.01 * 362 s at $1.40/h = 11.2014
    assert spot.risk is not None and spot.risk.work_s == 300
    assert spot.cost.total == pytest.approx(8 + 0.95 * 362 / 3600)
    assert spot.cost.total < safe.cost.total <= spot.cost.total * (1 + BEST_MARGIN)
    assert [r.offer.id for r in routes] == ["p4d-a100", "spot-a100"] and [r.rank for r in routes] == [1, 2]
    assert best_route(routes) is safe and safe.demoted is None
    assert spot.demoted == ("Not marked best: preempted 3 times in the last hour, and A100 (aws, us-east-1) at"
                            " $11.20 costs at most 50% more than its $8.10")
    assert spot.to_json()["demoted"] == spot.demoted and spot.to_json()["rank"] == 2


@pytest.mark.parametrize(("why", "incidents", "safe_price"), [
    ("once is not repeatedly", (Incident("preempted", 0),), 1.40),
    ("the second loss is over an hour old", (Incident("preempted", 0), Incident("preempted", 3601)), 1.40),
    ("the other route is over 50% dearer", THREE_LOSSES, 1.60),  # 12.80 > 8.10 * 1.5 = 12.14
])
def test_a_cheaper_offer_stays_best(why: str, incidents: tuple[Incident, ...], safe_price: float) -> None:
    safe = offer("aws", "p4d-a100", safe_price, "us-east-1", reliability=0.99, boot_seconds=60)
    routes = rank_routes(s3(0, checkpoint_every_s=600), [safe, SPOT], hours=8,
                         signals=Signals(incidents={SPOT.key: incidents}))
    assert [r.offer.id for r in routes] == ["spot-a100", "p4d-a100"], why
    assert best_route(routes) is routes[0] and routes[0].demoted is None, why


def test_a_blocked_route_is_never_made_best() -> None:
    routes = rank_routes(s3(0, checkpoint_every_s=600), [SPOT, SAFE], hours=8, caps=Caps(max_price_per_hour=1.2),
                         signals=Signals(incidents={SPOT.key: THREE_LOSSES}))
    assert [r.offer.id for r in routes] == ["spot-a100", "p4d-a100"] and routes[1].blocked
    assert best_route(routes) is routes[0] and routes[0].demoted is None
    assert best_route(rank_routes(s3(0), [SAFE], hours=8, caps=Caps(max_price_per_hour=1))) is None


def test_checkpoint_cadence_must_be_a_positive_number_of_seconds() -> None:
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(UsageError, match="checkpoint_every_s"):
            s3(0, checkpoint_every_s=bad)


# -- blocked routes ----------------------------------------------------------------------------

def test_blocked_routes_are_kept_with_their_reasons_after_every_unblocked_one() -> None:
    h100 = offer("lambda", "h100", 3.00, "us-west-1", gpu="H100")
    cheap_a100 = offer("lambda", "a100", 0.50, "us-west-1")
    routes = rank_routes(s3(0), [cheap_a100, h100], Requirements(gpus=("H100",), regions=("us-east-1",)), hours=1)
    # both fail the region; the A100 also fails the GPU model, even though it is cheaper
    assert [r.offer.id for r in routes] == ["a100", "h100"]
    assert all(r.blocked for r in routes)
    a100 = routes[0]
    assert set(a100.reasons) == {"gpu", "region"}
    assert a100.blocked == "; ".join(a100.reasons.values())
    assert "A100 is not one of H100" in a100.blocked
    assert a100.to_json()["reasons"] == a100.reasons
    ok = rank_routes(s3(0), [cheap_a100, h100], Requirements(gpus=("H100",)), hours=1)
    assert [(r.offer.id, r.blocked is None) for r in ok] == [("h100", True), ("a100", False)]


def test_no_capacity_now_blocks_a_route_even_when_it_is_cheapest() -> None:
    empty = offer("lambda", "empty", 0.10, "us-west-1", capacity=0)
    full = offer("lambda", "full", 5.00, "us-west-1", capacity=4)
    refused = offer("lambda", "refused", 0.20, "us-west-1", capacity=None)
    routes = rank_routes(s3(0), [empty, full, refused], hours=1,
                         checks={refused.key: Checks(capacity=False, notes={"capacity": "zone exhausted"})})
    assert [r.offer.id for r in routes] == ["full", "empty", "refused"]
    assert routes[1].blocked == "no capacity now"
    assert routes[2].blocked == "zone exhausted"
    assert routes[2].checks.to_json() == {"listed": True, "permitted": None, "capacity": False, "launched": None}


def test_price_caps_and_budget_block_with_reasons() -> None:
    routes = rank_routes(s3(1), [FAR, NEAR], hours=8, caps=Caps(max_price_per_hour=2.00))
    assert routes[0].offer is FAR and routes[0].blocked is None
    assert routes[1].blocked == "$2.50/h is over the cap of $2.00/h"
    routes = rank_routes(s3(1), [FAR, NEAR], Requirements(max_price_per_hour=2.00), hours=8)
    assert set(routes[1].reasons) == {"price"}
    # budget: NEAR totals $20.00 for 8 h, FAR less; $18 left blocks NEAR only
    routes = rank_routes(s3(1), [FAR, NEAR], hours=8, caps=Caps(budget_left=18))
    assert routes[0].offer is FAR and routes[0].blocked is None
    assert routes[1].blocked == "$20.00 total for 8 h is over the $18.00 left of the budget"


def test_failed_permission_and_launch_checks_block() -> None:
    checks = {FAR.key: Checks(permitted=False), NEAR.key: Checks(permitted=True, launched=False,
                                                                 notes={"launched": "instance terminated at boot"})}
    routes = rank_routes(s3(0), [FAR, NEAR], hours=1, checks=checks)
    assert {r.offer.key: r.blocked for r in routes} == {
        FAR.key: "not permitted (credentials or quota)", NEAR.key: "instance terminated at boot"}
    # the route holds a copy of the checks: a later change to the caller's record does not leak in
    near = next(r for r in routes if r.offer is NEAR)
    checks[NEAR.key].notes["launched"] = "changed later"
    assert near.checks.notes["launched"] == "instance terminated at boot"


# -- order, ids, JSON, validation ----------------------------------------------------------------

def test_ties_go_to_the_route_ready_sooner_whatever_the_input_order() -> None:
    slow = offer("lambda", "slow", 2.00, "us-west-1", boot_seconds=300)
    fast = offer("lambda", "fast", 2.00, "us-west-1", boot_seconds=60)
    for given in ([slow, fast], [fast, slow]):
        routes = rank_routes(s3(0), given, hours=2)
        assert routes[0].cost.total == routes[1].cost.total == pytest.approx(4.00)
        assert [r.offer.id for r in routes] == ["fast", "slow"]


def test_route_ids_are_stable_and_distinct() -> None:
    assert route_id(FAR) == route_id(offer("lambda", "gpu_1x_a100", 9.99, "elsewhere"))
    assert route_id(FAR) != route_id(NEAR)
    assert route_id(FAR).startswith("r-") and len(route_id(FAR)) == 12
    assert rank_routes(s3(0), [FAR], hours=1)[0].id == route_id(FAR)


def test_to_json_has_exactly_the_documented_keys() -> None:
    r = rank_routes(s3(500), [FAR], hours=8)[0]
    out = r.to_json()
    assert set(out) == {"id", "provider", "offer", "gpu", "region", "price_per_hour", "cost", "time_to_ready_s",
                        "checks", "blocked", "gpu_count", "reasons", "breakdown", "p_fail", "history", "words",
                        "risk", "rank", "demoted"}
    assert set(out["cost"]) == {"gpu", "egress", "storage", "queue", "risk", "total"}
    assert set(out["checks"]) == {"listed", "permitted", "capacity", "launched"}
    assert (out["provider"], out["offer"], out["region"]) == ("lambda", "gpu_1x_a100", "us-west-1")
    assert out["cost"]["total"] == pytest.approx(60.12)
    assert out["breakdown"][0] == "GPU: $1.89/h x 8 h = $15.12"
    assert out["breakdown"][1] == "egress: 500.0 GB x $0.090/GB = $45.00"


@pytest.mark.parametrize("hours", [0, -1, math.nan, math.inf])
def test_hours_must_be_positive(hours: float) -> None:
    with pytest.raises(UsageError, match="hours"):
        rank_routes(s3(0), [FAR], hours=hours)


def test_bad_facts_caps_and_signals_are_refused() -> None:
    with pytest.raises(UsageError):
        s3(-1)
    with pytest.raises(UsageError):
        Caps(budget_left=-5)
    with pytest.raises(UsageError):
        Signals(driver_mismatches={"a/b": -1})
    with pytest.raises(UsageError):
        rank_routes(s3(0), [FAR], hours=1, value_of_time_per_hour=-1)
    assert rank_routes(s3(0), [], hours=1) == []
