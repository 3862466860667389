"""Whole-route cost: a pure function over a workspace's facts, offers and signals.

A route is an offer plus everything it takes to get this workspace there. Its cost is a
breakdown, never one opaque number (all in dollars, for the planned ``hours``)::

    gpu     = price_per_hour * hours
    egress  = bytes_to_move / 1e9 * egress $/GB (store side, tiered where the provider tiers,
              plus the offer's own per-GB ingress price)
    storage = workspace_bytes / 1e9 * storage_per_gb_month * hours / 730
    queue   = queue_s / 3600 * (value_of_time_per_hour, or price_per_hour * QUEUE_PRICE_FACTOR)
    risk    = the expected hours a failure costs the researcher x (price_per_hour + value_of_time),
              plus egress paid again (core.risk: a failed launch wastes the boot and the transfer;
              a machine lost within the planned hours costs the time to notice, to Continue
              again and to redo the work since the last verified checkpoint)
    total   = gpu + egress + storage + queue + risk

The chances grow with what recently happened to the offer (:class:`Incident`: a preemption,
a failed launch, a driver refusal), at once and fading over :data:`INCIDENT_WINDOW_S`. The
routes are ranked by total, except that an offer preempted repeatedly within the last hour is
not put first while another open route costs at most :data:`BEST_MARGIN` more; the route says
why (``Route.demoted``).
Time to Ready is ``queue + boot + transfer``; the boot is the catalog's guess until Continues
were measured (:class:`BootSample`, :func:`learn_boots`): the offer's own recent boots replace
it, else its provider's recent excess over the catalog is added to it. The
budget is held against ``total``, the figure the sidebar's Total column shows, and its
message quotes that figure (:func:`money`, the sidebar's rounding).

Queue time is not billed by anyone; it is priced because a wait delays the work. Routes
that fail a requirement, a cap, the budget or a check are kept, blocked, with their
reasons, after every unblocked route. Nothing here reads a clock, a file or the network.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.guardian import no_self_stop_words
from jupyter_portable.core.offers import Checks, Offer, Requirements, unmet
from jupyter_portable.core.risk import (
    BEST_MARGIN,
    INCIDENT_P,
    INCIDENT_WINDOW_S,
    NOTICE_S,
    REPEAT_WINDOW_S,
    REPEATED_PREEMPTIONS,
    Incident,
    Risk,
    hours_words,
    preemptions_within,
    price_risk,
)
from jupyter_portable.core.risk import duration as _duration
from jupyter_portable.core.spend import money

LOCAL_PROVIDER = "local"  # the local market: workers are processes on this machine
# What kind of thing each reason key of a blocked route is: a cap the user set, a requirement the
# offer does not meet (offers.unmet), or the offer not available now (the four checks). The
# sidebar groups and orders a route's reasons by it (routes.json ReasonCategory, generated).
REASON_CATEGORY: Mapping[str, str] = MappingProxyType({
    "price_cap": "cap", "price": "cap", "budget": "cap",
    "gpu": "admission", "gpu_count": "admission", "gpu_memory": "admission", "driver": "admission",
    "cuda": "admission", "image": "admission", "region": "admission",
    "listed": "capacity", "permitted": "capacity", "capacity": "capacity", "launched": "capacity",
})
HOURS_PER_MONTH = 730.0  # storage is priced per GB-month; 8760 h / 12
DEFAULT_QUEUE_S = 300.0  # expected wait when the provider does not say whether it has capacity
QUEUE_PRICE_FACTOR = 1.0  # an hour waited is an hour of planned work not done, at the GPU's own rate
UNKNOWN_STORE_EGRESS_PER_GB = 0.09  # a store the table does not know: assume the dearest common rate
BOOT_WINDOW_S = 7 * 86400.0  # a measured boot older than this says nothing about the offer today
BOOT_SAMPLES = 5  # the newest this many measured boots of an offer (twice as many of a provider) count


@dataclass(frozen=True)
class EgressPrices:
    """What a store provider charges to move data out, in $/GB.

    ``internet`` is a tier table ``((up_to_gb, price), ...)`` applied cumulatively per
    transfer (the last tier's bound is infinite); ``inter_region`` is the flat price to the
    same provider's other regions. Within one region moving data is free.
    """

    internet: tuple[tuple[float, float], ...]
    inter_region: float


# Public list prices, Nov 2026, approximate (aws.amazon.com/s3/pricing, cloud.google.com
# /vpc/network-pricing premium tier, azure.microsoft.com bandwidth pricing, RunPod and Lambda
# billing docs). GB are decimal (1e9 bytes). AWS's and Azure's first 100 GB/month free are
# account-wide, and we cannot know the account's month, so they are left out (pessimistic).
STORE_EGRESS: dict[str, EgressPrices] = {
    "aws": EgressPrices(internet=((10_000, 0.09), (50_000, 0.085), (150_000, 0.07), (math.inf, 0.05)),
                        inter_region=0.02),
    "gcp": EgressPrices(internet=((1_000, 0.12), (10_000, 0.11), (math.inf, 0.08)), inter_region=0.02),
    "azure": EgressPrices(internet=((10_000, 0.087), (50_000, 0.083), (150_000, 0.07), (math.inf, 0.05)),
                          inter_region=0.02),
    "runpod": EgressPrices(internet=((math.inf, 0.0),), inter_region=0.0),  # "no fees for ingress or egress"
    "lambda": EgressPrices(internet=((math.inf, 0.0),), inter_region=0.0),  # "not charged for ingress or egress"
}

_AZ = re.compile(r"^(.*\d)(?:[a-z]|-[a-z])$")  # us-east-1a (AWS zone), us-central1-a (GCP zone)


@dataclass(frozen=True)
class WorkspaceFacts:
    """What routing needs to know about the workspace and its store.

    ``store_provider`` is the cloud the store lives in ("aws" for S3 on AWS; None for a local
    ``file://`` store). For providers in :data:`STORE_EGRESS` the table's prices apply;
    ``store_egress_per_gb`` is the flat price used for any other provider (an S3-compatible
    store the table does not know).
    """

    bytes_to_move: int
    store_region: str | None
    store_provider: str | None
    store_egress_per_gb: float
    storage_per_gb_month: float = 0.023
    workspace_bytes: int = 0
    checkpoint_every_s: float | None = None  # the usual gap between verified checkpoints; None: no cadence yet
    checkpoint_age_s: float | None = None  # how old the last verified checkpoint is now; None: there is none
    notice_s: float = NOTICE_S  # how long a lost machine takes to be seen (the server's look at it)

    def __post_init__(self) -> None:
        if self.bytes_to_move < 0 or self.workspace_bytes < 0:
            raise UsageError("bytes_to_move and workspace_bytes must not be negative")
        if self.checkpoint_every_s is not None and not (0 < self.checkpoint_every_s < math.inf):
            raise UsageError("checkpoint_every_s must be a positive number of seconds,"
                             f" not {self.checkpoint_every_s!r}")
        for name in ("checkpoint_age_s", "notice_s"):
            value = getattr(self, name)
            if value is not None and not (0 <= value < math.inf):
                raise UsageError(f"{name} must be a non-negative number of seconds, not {value!r}")
        if not (self.store_egress_per_gb >= 0) or not (self.storage_per_gb_month >= 0):
            raise UsageError("store_egress_per_gb and storage_per_gb_month must not be negative")


@dataclass(frozen=True)
class BootSample:
    """One measured Continue on ``offer_key``, ``age_s`` seconds ago: ``boot_s`` is launch to
    Ready less the transfer (machine boot, probe, worker start, environment, read-back), where
    the catalog had guessed ``catalog_boot_s``."""

    offer_key: str
    boot_s: float
    catalog_boot_s: float
    age_s: float

    def __post_init__(self) -> None:
        for name in ("boot_s", "catalog_boot_s", "age_s"):
            value = getattr(self, name)
            if not (0 <= value < math.inf):
                raise UsageError(f"boot sample {name} must be a non-negative number of seconds, not {value!r}")

    @property
    def provider(self) -> str:
        return self.offer_key.partition("/")[0]


def learn_boots(samples: Iterable[BootSample]) -> tuple[dict[str, float], dict[str, float]]:
    """From measured Continues: each offer's boot (median of its newest :data:`BOOT_SAMPLES`), and
    each provider's excess over the catalog's guess (median of its newest 2 x BOOT_SAMPLES), for
    offers of it never measured. Samples older than :data:`BOOT_WINDOW_S` are left out."""
    recent = sorted((s for s in samples if s.age_s < BOOT_WINDOW_S), key=lambda s: s.age_s)
    by_offer: dict[str, list[float]] = {}
    by_provider: dict[str, list[float]] = {}
    for s in recent:
        if len(by_offer.setdefault(s.offer_key, [])) < BOOT_SAMPLES:
            by_offer[s.offer_key].append(s.boot_s)
        if len(by_provider.setdefault(s.provider, [])) < 2 * BOOT_SAMPLES:
            by_provider[s.provider].append(s.boot_s - s.catalog_boot_s)
    return ({k: _median(v) for k, v in by_offer.items()}, {k: _median(v) for k, v in by_provider.items()})


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


@dataclass(frozen=True)
class Signals:
    """What recent history says about each offer, keyed by ``Offer.key``."""

    recent_launch_failures: dict[str, int] = field(default_factory=dict)
    driver_mismatches: dict[str, int] = field(default_factory=dict)  # exact-driver admission refusals
    queue_seconds: dict[str, float] = field(default_factory=dict)  # observed wait before a launch started
    incidents: dict[str, tuple[Incident, ...]] = field(default_factory=dict)  # newest first
    boot_seconds: dict[str, float] = field(default_factory=dict)  # measured recently, by offer key
    boot_excess: dict[str, float] = field(default_factory=dict)  # by provider: seconds beyond the catalog's boot

    def __post_init__(self) -> None:
        if any(not (-math.inf < v < math.inf) for v in self.boot_excess.values()):
            raise UsageError("signals.boot_excess must hold finite numbers of seconds")
        for name in ("recent_launch_failures", "driver_mismatches", "queue_seconds", "boot_seconds"):
            if any(not (v >= 0) for v in getattr(self, name).values()):
                raise UsageError(f"signals.{name} must not hold negative counts or times")


@dataclass(frozen=True)
class Caps:
    """Spending limits: a $/h ceiling and what is left of the budget. ``budget_left`` is held
    against the route's total, the one figure the user sees for it."""

    max_price_per_hour: float | None = None
    budget_left: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_price_per_hour", "budget_left"):
            value = getattr(self, name)
            if value is not None and not (value >= 0):
                raise UsageError(f"caps.{name} must not be negative")


@dataclass(frozen=True)
class Cost:
    """A route's cost in dollars, term by term."""

    gpu: float
    egress: float
    storage: float
    queue: float
    risk: float
    total: float

    @property
    def billed(self) -> float:
        """What providers will charge if all goes well (queue and risk are not invoices)."""
        return self.gpu + self.egress + self.storage

    def to_json(self) -> dict[str, float]:
        return {"gpu": round(self.gpu, 4), "egress": round(self.egress, 4), "storage": round(self.storage, 4),
                "queue": round(self.queue, 4), "risk": round(self.risk, 4), "total": round(self.total, 4)}


@dataclass(frozen=True)
class Route:
    """An offer priced for this workspace. ``blocked`` is None or the joined ``reasons``."""

    id: str
    offer: Offer
    cost: Cost
    time_to_ready_s: float
    transfer_s: float
    queue_s: float
    boot_s: float
    blocked: str | None
    checks: Checks
    reasons: dict[str, str]
    breakdown: tuple[str, ...] = ()
    p_fail: float = 0.0
    history: tuple[str, ...] = ()  # what recently happened to the offer, in words ("preempted 4 min ago")
    words: dict[str, str] = field(default_factory=dict)  # each cost term's one-line definition
    boot_basis: str = "catalog"  # "measured" (this offer's recent boots), "provider" (catalog + its excess)
    hours: float = 0.0  # the planned hours the cost is for
    bytes_to_move: int = 0
    risk: Risk | None = None  # what the risk term is made of
    rank: int = 0  # 1 for the best open route, in the order to try them; blocked routes follow
    demoted: str | None = None  # why this cheaper route is not first (preempted repeatedly), in words

    def predicted(self) -> dict[str, Any]:
        """What this route predicts, as an allocation record's ``predicted`` (core.records)."""
        return {"time_to_ready_s": round(self.time_to_ready_s, 3), "boot_s": round(self.boot_s, 3),
                "catalog_boot_s": round(self.offer.boot_seconds, 3), "boot_basis": self.boot_basis,
                "transfer_s": round(self.transfer_s, 3), "queue_s": round(self.queue_s, 3), "bytes": self.bytes_to_move,
                "cost": round(self.cost.billed, 6), "total": round(self.cost.total, 6), "hours": self.hours}

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "provider": self.offer.provider, "offer": self.offer.id, "gpu": self.offer.gpu,
                "gpu_count": self.offer.gpu_count, "region": self.offer.region,
                "price_per_hour": self.offer.price_per_hour, "cost": self.cost.to_json(),
                "time_to_ready_s": round(self.time_to_ready_s, 1), "checks": self.checks.to_json(),
                "blocked": self.blocked, "reasons": dict(self.reasons), "breakdown": list(self.breakdown),
                "p_fail": round(self.p_fail, 4), "history": list(self.history), "words": dict(self.words),
                "risk": self.risk.to_json() if self.risk is not None else None, "rank": self.rank,
                "demoted": self.demoted}


def budget_reason(total: float, hours: float, left: float) -> str | None:
    """Why ``total`` for ``hours`` does not fit the ``left`` of the budget, or None when it does;
    the same words for a route and for a reservation."""
    if round(total, 4) <= round(left, 4):
        return None
    return f"{money(total)} total for {hours:g} h is over the {money(left)} left of the budget"


def route_id(offer: Offer) -> str:
    """Stable id of the route to ``offer``: the same offer key gives the same id in every run."""
    return "r-" + hashlib.sha1(offer.key.encode(), usedforsecurity=False).hexdigest()[:10]


def _region(region: str | None) -> str | None:
    # An offer may name a zone where the store names its region; a zone lies in its region.
    if region is None:
        return None
    m = _AZ.match(region)
    return m.group(1) if m else region


def _tiered(tiers: tuple[tuple[float, float], ...], gb: float) -> float:
    """Dollars to move ``gb`` through cumulative tiers."""
    cost, floor = 0.0, 0.0
    for bound, price in tiers:
        if gb <= floor:
            break
        cost += (min(gb, bound) - floor) * price
        floor = bound
    return cost


def egress_price_per_gb(store_provider: str | None, store_region: str | None, offer: Offer, *,
                        gb: float = 0.0, fallback_per_gb: float = UNKNOWN_STORE_EGRESS_PER_GB) -> float:
    """$/GB to move data from the store to ``offer``: the store's egress plus the offer's ingress.

    Free within one provider's region (and from a local store to the local market). For a
    tiered provider it is the average over ``gb`` gigabytes (the first tier when ``gb`` is 0).
    A local ``file://`` store pays only upload bandwidth ($0); the offer's own
    ``egress_per_gb`` (Vast hosts bill both directions) is added whenever data crosses in.
    """
    if store_provider is None:
        return 0.0 if offer.provider == LOCAL_PROVIDER else offer.egress_per_gb
    if store_provider == offer.provider and _region(store_region) == _region(offer.region):
        return 0.0
    prices = STORE_EGRESS.get(store_provider)
    if prices is None:
        store_side = fallback_per_gb
    elif store_provider == offer.provider:
        store_side = prices.inter_region
    elif gb > 0:
        store_side = _tiered(prices.internet, gb) / gb
    else:
        store_side = prices.internet[0][1]
    return store_side + offer.egress_per_gb


def _money(x: float) -> str:
    return f"${x:,.2f}"


def percent(p: float) -> str:
    """"8%", "<1%": a chance as the sidebar rounds the route's ``p_fail`` (4 places, then half up)."""
    q = round(p, 4)
    return "<1%" if 0 < q < 0.005 else f"{math.floor(q * 100 + 0.5)}%"


def risk_words(risk: Risk, hours: float, history: Iterable[str] = ()) -> str:
    """The risk term in words: the chance, the hours and dollars it is expected to cost, what
    happened to the offer, and what one lost machine costs."""
    happened = list(history)
    return (f"Risk: {percent(risk.p_fail)} chance of a failed launch or a lost machine in the {hours:g} planned h:"
            f" {hours_words(risk.hours)} lost, {money(risk.dollars)} expected"
            + (f" ({', '.join(happened)})" if happened else "")
            + f". A lost machine costs {_duration(risk.notice_s)} to notice, {_duration(risk.again_s)} to Continue"
            f" again and {_duration(risk.work_s)} of work since the last verified checkpoint, on average"
            f" ({checkpoint_words(risk.checkpoint_age_s, risk.checkpoint_every_s)})")


def checkpoint_words(age_s: float | None, every_s: float | None) -> str:
    """"the last is 4 min old, one every ~10 min", "the last is 4 min old", "none verified yet"."""
    if age_s is None:
        return "no verified checkpoint yet"
    return f"the last is {_duration(age_s)} old" + (f", one every ~{_duration(every_s)}" if every_s else "")


def _price_route(facts: WorkspaceFacts, offer: Offer, req: Requirements, hours: float, caps: Caps,
                 signals: Signals, given: Checks | None, value_of_time: float, prepaid: float | None = None) -> Route:
    key = offer.key
    price = offer.price_per_hour
    reasons: dict[str, str] = dict(unmet(offer, req))
    if prepaid is not None and caps.budget_left is not None:
        caps = replace(caps, budget_left=caps.budget_left + max(0.0, prepaid))
    if caps.max_price_per_hour is not None and price > caps.max_price_per_hour and prepaid is None:
        reasons["price_cap"] = f"${price:.2f}/h is over the cap of ${caps.max_price_per_hour:.2f}/h"
    checks = replace(given, notes=dict(given.notes)) if given is not None else Checks()
    if not checks.listed:
        reasons["listed"] = checks.notes.get("listed", "no longer listed")
    if checks.permitted is False:
        reasons["permitted"] = checks.notes.get("permitted", "not permitted (credentials or quota)")
    if checks.launched is False:
        reasons["launched"] = checks.notes.get("launched", "a launch of it failed")

    # Queue: a capacity check beats the listing's signal; an observed wait beats both defaults.
    capacity_known = checks.capacity if checks.capacity is not None else (
        None if offer.capacity is None else offer.capacity > 0)
    observed = signals.queue_seconds.get(key)
    if capacity_known is False:
        reasons["capacity"] = checks.notes.get("capacity", "no capacity now")
        queue_s, queue_why = (observed if observed is not None else DEFAULT_QUEUE_S), "none free now"
    elif observed is not None:
        queue_s, queue_why = observed, "observed wait"
    elif capacity_known:
        queue_s, queue_why = 0.0, "capacity now"
    else:
        queue_s, queue_why = DEFAULT_QUEUE_S, "capacity unknown, default wait"

    gb = facts.bytes_to_move / 1e9
    per_gb = egress_price_per_gb(facts.store_provider, facts.store_region, offer, gb=gb,
                                 fallback_per_gb=facts.store_egress_per_gb)
    transfer_s = facts.bytes_to_move * 8 / (offer.bandwidth_mbps * 1e6)
    # Measured beats guessed: this offer's recent boots, else the catalog's guess plus what its
    # provider's machines recently took beyond their own guesses.
    if key in signals.boot_seconds:
        boot_s, boot_basis, boot_why = signals.boot_seconds[key], "measured", "measured recently"
    elif offer.provider in signals.boot_excess:
        boot_s = max(0.0, offer.boot_seconds + signals.boot_excess[offer.provider])
        boot_basis, boot_why = "provider", f"catalog, corrected by {offer.provider}'s recent boots"
    else:
        boot_s, boot_basis, boot_why = offer.boot_seconds, "catalog", "catalog"
    wait_rate = value_of_time if value_of_time > 0 else price * QUEUE_PRICE_FACTOR

    gpu = price * hours
    egress = gb * per_gb
    storage = facts.workspace_bytes / 1e9 * facts.storage_per_gb_month * hours / HOURS_PER_MONTH
    queue = queue_s / 3600 * wait_rate
    failures = signals.recent_launch_failures.get(key, 0)
    mismatches = signals.driver_mismatches.get(key, 0)
    incidents = tuple(i for i in signals.incidents.get(key, ()) if i.weight > 0)
    ready_s = queue_s + boot_s + transfer_s
    r = price_risk(reliability=offer.reliability, launch_failure_rate=offer.launch_failure_rate, failures=failures,
                   mismatches=mismatches, incidents=incidents, hours=hours, boot_s=boot_s, transfer_s=transfer_s,
                   ready_s=ready_s, checkpoint_every_s=facts.checkpoint_every_s, rate=price + value_of_time,
                   egress=egress, checkpoint_age_s=facts.checkpoint_age_s, notice_s=facts.notice_s)
    p_fail, risk = r.p_fail, r.dollars
    cost = Cost(gpu=gpu, egress=egress, storage=storage, queue=queue, risk=risk,
                total=gpu + egress + storage + queue + risk)
    over = budget_reason(cost.total, hours, caps.budget_left) if caps.budget_left is not None else None
    if over:
        reasons["budget"] = over

    history = [i.words() for i in incidents]
    if failures:
        history.append(f"{failures} recent launch failure(s)")
    if mismatches:
        history.append(f"{mismatches} driver mismatch(es)")
    words = {
        "gpu": f"GPU: {money(price)}/h for the {hours:g} planned h",
        "egress": (f"Transfer: moving {gb:,.1f} GB of the workspace there at ${per_gb:.3f}/GB"
                   if egress > 0 else f"Transfer: moving {gb:,.1f} GB of the workspace there, free on this route"),
        "storage": f"Storage: keeping {facts.workspace_bytes / 1e9:,.1f} GB in the store for {hours:g} h",
        "queue": (f"Queue: about {_duration(queue_s)} of waiting ({queue_why}), priced at this GPU's rate"
                  if queue_s > 0 else "Queue: no wait, capacity is free now"),
        "risk": risk_words(r, hours, history),
        "total": "Total: the whole cost of getting to the next verified state, the figure caps are held to",
    }
    unattended = no_self_stop_words(offer.provider, price)
    if unattended:  # said before renting: nothing on such a machine ends its billing (core/guardian)
        words["unattended"] = unattended[0].upper() + unattended[1:]
    breakdown = (
        f"GPU: ${price:.2f}/h x {hours:g} h = {_money(gpu)}",
        f"egress: {gb:,.1f} GB x ${per_gb:.3f}/GB = {_money(egress)}",
        f"storage: {facts.workspace_bytes / 1e9:,.1f} GB x ${facts.storage_per_gb_month:.3f}/GB-month"
        f" for {hours:g} h = {_money(storage)}",
        f"queue: ~{_duration(queue_s)} ({queue_why}) x ${wait_rate:.2f}/h = {_money(queue)}",
        f"risk: {r.p_launch:.0%} launch fails x {_duration(r.launch_s)} wasted + {r.p_lost:.0%} machine lost"
        f" x ({_duration(r.notice_s)} to notice + {_duration(r.again_s)} to Continue again"
        f" + {_duration(r.work_s)} of work since the last verified checkpoint on average)"
        + (f" ({', '.join(history)})" if history else "")
        + f" = {hours_words(r.hours)} x ${r.rate:.2f}/h" + (" + egress again" if egress > 0 else "")
        + f" = {_money(risk)}",
        f"ready in ~{_duration(ready_s)}: queue {_duration(queue_s)} + boot {_duration(boot_s)} ({boot_why})"
        f" + transfer {_duration(transfer_s)}",
    )
    return Route(id=route_id(offer), offer=offer, cost=cost, time_to_ready_s=ready_s, transfer_s=transfer_s,
                 queue_s=queue_s, boot_s=boot_s, blocked="; ".join(reasons.values()) or None, checks=checks,
                 reasons=reasons, breakdown=breakdown, p_fail=p_fail, history=tuple(history), words=words,
                 boot_basis=boot_basis, hours=hours, bytes_to_move=facts.bytes_to_move, risk=r)


def rank_routes(facts: WorkspaceFacts, offers: Iterable[Offer], requirements: Requirements | None = None, *,
                hours: float, caps: Caps = Caps(), signals: Signals = Signals(),
                checks: Mapping[str, Checks] | None = None, value_of_time_per_hour: float = 0.0,
                prepaid: Mapping[str, float] | None = None) -> list[Route]:
    """Every offer as a priced route: unblocked by total cost (ties: sooner ready), then blocked ones.

    ``checks`` maps ``Offer.key`` to the checks done so far. ``prepaid`` maps an offer's key to
    the dollars a slot the provider sold (paid, in force) still holds for it: the budget already
    holds that money back, so its route is held against what is left plus that, and not against
    the $/h ceiling (the slot is bought), and it is ranked before the others. Raises UsageError
    for ``hours`` or ``value_of_time_per_hour`` that are not positive numbers.
    """
    if not (isinstance(hours, (int, float)) and 0 < hours < math.inf):
        raise UsageError(f"hours must be a positive number, not {hours!r}")
    if not (0 <= value_of_time_per_hour < math.inf):
        raise UsageError(f"value_of_time_per_hour must not be negative, not {value_of_time_per_hour!r}")
    req = requirements or Requirements()
    done = checks or {}
    paid = prepaid or {}
    routes = [_price_route(facts, o, req, float(hours), caps, signals, done.get(o.key), value_of_time_per_hour,
                           paid.get(o.key)) for o in offers]
    # a slot already paid for goes first: Continue launches into it (its money is spent either way)
    routes.sort(key=lambda r: (r.blocked is not None, r.offer.key not in paid, r.cost.total, r.time_to_ready_s, r.id))
    routes = _put_repeatedly_preempted_back(routes, signals)
    return [replace(r, rank=i) for i, r in enumerate(routes, 1)]


def best_route(routes: Iterable[Route]) -> Route | None:
    """The route marked best: the first open one of :func:`rank_routes`' order; None when all are blocked."""
    return next((r for r in routes if not r.blocked), None)


def _put_repeatedly_preempted_back(routes: list[Route], signals: Signals) -> list[Route]:
    # An offer the market took back again and again is no bargain whatever its price says: while
    # another open route costs at most BEST_MARGIN more, that one goes first and the cheaper says why.
    # Only a route with nothing against it in the window (no loss, failed launch or refusal) is put
    # first so: one that failed lately is never preferred over a cheaper total.
    open_ = [r for r in routes if not r.blocked]
    lost = {r.id: preemptions_within(signals.incidents.get(r.offer.key, ())) for r in open_}
    if not open_ or lost[open_[0].id] < REPEATED_PREEMPTIONS:
        return routes
    limit = open_[0].cost.total * (1 + BEST_MARGIN)
    alt = next((r for r in open_ if not _recent_trouble(r, signals) and round(r.cost.total, 4) <= round(limit, 4)),
               None)
    if alt is None:
        return routes
    ahead = open_[:open_.index(alt)]  # cheaper than alt, and each with something against it lately
    window = "hour" if REPEAT_WINDOW_S == 3600 else _duration(REPEAT_WINDOW_S)
    why = {r.id: (f"Not marked best: {_trouble_words(r, signals)} in the last {window}, and {_name(alt)} at"
                  f" {money(alt.cost.total)} costs at most {BEST_MARGIN:.0%} more than its {money(r.cost.total)}")
           for r in ahead}
    demoted = [replace(r, demoted=why[r.id]) for r in ahead]
    rest = [r for r in routes if r.id not in why and r.id != alt.id]
    return [alt, *demoted, *rest]


def _recent_trouble(route: Route, signals: Signals) -> bool:
    """Whether anything happened to the route's offer within the last REPEAT_WINDOW_S."""
    key = route.offer.key
    return (any(i.age_s < REPEAT_WINDOW_S for i in signals.incidents.get(key, ()))
            or signals.recent_launch_failures.get(key, 0) > 0 or signals.driver_mismatches.get(key, 0) > 0)


def _trouble_words(route: Route, signals: Signals) -> str:
    """"preempted 3 times", "preempted once and 1 failed launch"."""
    recent = [i for i in signals.incidents.get(route.offer.key, ()) if i.age_s < REPEAT_WINDOW_S]
    lost = sum(1 for i in recent if i.kind == "preempted")
    failed = (sum(1 for i in recent if i.kind != "preempted") + signals.recent_launch_failures.get(route.offer.key, 0)
              + signals.driver_mismatches.get(route.offer.key, 0))
    parts = ([f"preempted {lost} times" if lost > 1 else "preempted once"] if lost else []) + (
        [f"{failed} failed launch{'es' if failed > 1 else ''}"] if failed else [])
    return " and ".join(parts)


def _name(route: Route) -> str:
    o = route.offer
    gpu = f"{o.gpu} x{o.gpu_count}" if o.gpu_count > 1 else o.gpu
    return f"{gpu} ({o.provider}, {o.region})"


__all__ = [
    "REASON_CATEGORY",
    "BOOT_SAMPLES",
    "BEST_MARGIN",
    "BOOT_WINDOW_S",
    "BootSample",
    "Caps",
    "Cost",
    "EgressPrices",
    "INCIDENT_P",
    "INCIDENT_WINDOW_S",
    "Incident",
    "Route",
    "STORE_EGRESS",
    "Signals",
    "WorkspaceFacts",
    "best_route",
    "budget_reason",
    "checkpoint_words",
    "egress_price_per_gb",
    "learn_boots",
    "money",
    "percent",
    "rank_routes",
    "risk_words",
    "route_id",
]
