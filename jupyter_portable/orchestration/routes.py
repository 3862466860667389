"""Offers across providers as routes to this workspace's next verified state, ranked by
whole cost, and acquiring a machine down that ranking.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.registry import enabled_providers
from jupyter_portable.core.errors import ConflictError, NoCapacity, PortableError, UsageError
from jupyter_portable.core.offers import Checks, Offer, Requirements
from jupyter_portable.core.routing import (
    INCIDENT_WINDOW_S,
    BootSample,
    Caps,
    Incident,
    Route,
    Signals,
    WorkspaceFacts,
    learn_boots,
    rank_routes,
)
from jupyter_portable.core.times import parse_iso_or_none, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.budget import SpendFigure, budget_report
from jupyter_portable.orchestration.settings import load_settings


def list_offers(providers: dict[str, Provider], requirements: Requirements | None = None,
                gpu: str | None = None) -> tuple[list[Offer], dict[str, str]]:
    """Every listed offer, and for each provider that failed, why (one line)."""
    offers: list[Offer] = []
    errors: dict[str, str] = {}
    for name, provider in providers.items():
        try:
            got = provider.offers(requirements)
        except PortableError as exc:
            errors[name] = exc.one_line()
            continue
        offers += [o for o in got if not gpu or gpu.lower() in o.gpu.lower()]
    offers.sort(key=lambda o: (o.gpu, o.price_per_hour, o.key))
    return offers, errors


def workspace_facts(ws: Workspace, providers: dict[str, Provider], *, now: datetime | None = None,
                    notice_s: float | None = None) -> WorkspaceFacts:
    """How much this workspace weighs and where its store is, for the cost of moving it; how
    old its last verified checkpoint is at ``now`` and how often one comes, and how long a lost
    machine takes to be seen (``notice_s``: the server's look at it, c.Portable.check_interval_s)."""
    # the head is what a Continue moves: a worker may have published past this copy's version
    head, _ = ws.store.read_head(ws.workspace_id)
    manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    size = manifest.total_bytes if manifest else 0
    checkpoints = manifest.checkpoints if manifest else ()
    every = checkpoint_cadence_s(checkpoints)
    facts = _where(ws, providers, size)
    last = last_verified_at(checkpoints)
    age = None if last is None else max(0.0, ((now or utcnow()) - last).total_seconds())
    return replace(facts, checkpoint_every_s=every, checkpoint_age_s=age,
                   notice_s=facts.notice_s if notice_s is None else notice_s)


def last_verified_at(checkpoints: Any) -> datetime | None:
    """When the newest verified checkpoint was made; None when none is."""
    times = [t for c in checkpoints if isinstance(c, dict) and c.get("status") == "verified"
             and (t := parse_iso_or_none(c.get("created"))) is not None]
    return max(times, default=None)


def checkpoint_cadence_s(checkpoints: Any) -> float | None:
    """The usual gap between the workspace's verified checkpoints (the median), in seconds; None
    with fewer than two: a lost machine then loses the work since it started."""
    times = sorted(t for c in checkpoints if isinstance(c, dict) and c.get("status") == "verified"
                   and (t := parse_iso_or_none(c.get("created"))) is not None)
    gaps = sorted(g for a, b in itertools.pairwise(times) if (g := (b - a).total_seconds()) > 0)
    if not gaps:
        return None
    mid = len(gaps) // 2
    return gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2


def _where(ws: Workspace, providers: dict[str, Provider], size: int) -> WorkspaceFacts:
    url = ws.config.store
    if url.startswith("s3"):
        from jupyter_portable.store.s3 import s3_location  # the store's own reading of botocore's configuration

        region, provider = s3_location()
        return WorkspaceFacts(bytes_to_move=size, store_region=region, store_provider=provider,
                              store_egress_per_gb=0.09, workspace_bytes=size)
    catalog = getattr(providers.get("local"), "catalog", None)
    if catalog is not None:
        # The local market's catalog says where a local store sits and what leaving it costs,
        # so a far region of the demo market pays for the move like a far cloud would.
        return WorkspaceFacts(bytes_to_move=size, store_region=catalog.store_region, store_provider="local",
                              store_egress_per_gb=catalog.store_egress_per_gb, workspace_bytes=size)
    return WorkspaceFacts(bytes_to_move=size, store_region=None, store_provider=None, store_egress_per_gb=0.0,
                          workspace_bytes=size)


def incident_of(record: dict[str, Any]) -> str | None:
    """What an allocation record says happened to its offer: "preempted" (lost), "refused"
    (admission, e.g. a wrong driver), "launch failed", or None (it ended as planned)."""
    state = record.get("state")
    reason = str(record.get("stop_reason") or "").lower()
    if state == "lost":
        return "preempted"
    if state == "refused" or "driver" in reason:
        return "refused"
    if state == "failed":
        return "launch failed"
    return None


def history_records(manifest: Any) -> list[dict[str, Any]]:
    """Each allocation's newest record, in the order they were first recorded."""
    latest: dict[str, dict[str, Any]] = {}
    for a in manifest.allocations if manifest else ():
        if isinstance(a, dict) and a.get("allocation_id"):
            latest[a["allocation_id"]] = a
    return list(latest.values())


def boot_sample(record: dict[str, Any], estimate: dict[str, Any] | None = None, *,
                now: datetime) -> BootSample | None:
    """The measured boot an allocation record (or, while it runs, its READY ``estimate``) holds,
    aged as of ``now``; None when it was never measured."""
    est = estimate or record
    measured, predicted = est.get("measured") or {}, est.get("predicted") or record.get("predicted") or {}
    boot, guess = measured.get("boot_s"), predicted.get("catalog_boot_s")
    at = parse_iso_or_none(record.get("stopped")) or parse_iso_or_none(record.get("started"))
    if not isinstance(boot, (int, float)) or not isinstance(guess, (int, float)) or at is None:
        return None
    try:
        return BootSample(f"{record.get('provider')}/{record.get('offer')}", float(boot), float(guess),
                          max(0.0, (now - at).total_seconds()))
    except UsageError:  # a negative or endless figure measures nothing
        return None


def signals_from_history(ws: Workspace, *, now: datetime) -> Signals:
    """What happened to each offer within :data:`INCIDENT_WINDOW_S` of ``now`` (a loss, a
    failed launch, a driver refusal), newest first, and how long its recent Continues took to
    boot (measured, :func:`~jupyter_portable.core.routing.learn_boots`), from the store's
    allocation history and this copy's lifecycle."""
    head, _ = ws.store.read_head(ws.workspace_id)
    # the head, not this copy's version: a loss is recorded there while this copy stays put
    manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    incidents: dict[str, list[Incident]] = {}
    records = history_records(manifest)

    def add(key: str, kind: str, at: datetime) -> None:
        age = max(0.0, (now - at).total_seconds())
        if age < INCIDENT_WINDOW_S:
            incidents.setdefault(key, []).append(Incident(kind, age))

    counted = set()
    for a in records:
        kind = incident_of(a)
        at = parse_iso_or_none(a.get("stopped")) or parse_iso_or_none(a.get("started"))
        if kind is not None and at is not None:
            add(f"{a.get('provider')}/{a.get('offer')}", kind, at)
            counted.add(a.get("allocation_id"))
    # The lifecycle says LOST the moment a loss is seen; the history's record follows it. Routes
    # priced in between (the sidebar prices them on the LOST event) must already know.
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.workdir.lifecycle_file import load

    offers = {a.get("allocation_id"): f"{a.get('provider')}/{a.get('offer')}" for a in records}
    samples = {a["allocation_id"]: s for a in records if (s := boot_sample(a, now=now)) is not None}
    by_id = {a["allocation_id"]: a for a in records}
    with contextlib.suppress(PortableError):
        for ev in load(ws.copy).events:
            at = parse_iso_or_none(ev.at)
            if ev.state == L.LOST and ev.allocation_id in offers and ev.allocation_id not in counted and at:
                add(offers[ev.allocation_id], "preempted", at)
                counted.add(ev.allocation_id)
            # a machine still serving has its measurement only in its READY event until it closes
            estimate = (ev.detail or {}).get("estimate")
            if ev.state == L.READY and ev.allocation_id in by_id and ev.allocation_id not in samples \
                    and isinstance(estimate, dict):
                s = boot_sample(by_id[ev.allocation_id], estimate, now=now)
                if s is not None:
                    samples[ev.allocation_id] = s
    boots, excess = learn_boots(samples.values())
    return Signals(incidents={k: tuple(sorted(v, key=lambda i: i.age_s)) for k, v in incidents.items()},
                   boot_seconds=boots, boot_excess=excess)


def with_forecast_waits(signals: Signals, offers: list[Offer]) -> Signals:
    """``signals`` with the queue wait a scheduler forecasts for an offer (Slurm's ``sbatch --test-only``,
    in ``offer.extra["queue_s"]``) in place of an observed one."""
    forecast = {o.key: float(o.extra["queue_s"]) for o in offers
                if isinstance(o.extra.get("queue_s"), (int, float)) and o.extra["queue_s"] >= 0}
    return replace(signals, queue_seconds={**signals.queue_seconds, **forecast}) if forecast else signals


def compute_routes(ws: Workspace, *, hours: float | None = None, providers: dict[str, Provider] | None = None,
                   gpu: str | None = None, now: datetime | None = None, calendar_now: datetime | None = None,
                   figure: SpendFigure | None = None, notice_s: float | None = None,
                   offers: list[Offer] | None = None) -> tuple[list[Route], dict[str, str]]:
    """Every offer as a route to this workspace's next verified state, ranked by whole cost;
    what recently happened to an offer (as of ``now``) raises its risk. A route over what is left of
    the budget (:func:`.budget.budget_report`'s ``left``: spent and bookings' commitments taken off,
    ``calendar_now`` deciding which bookings still hold money back) is blocked. ``notice_s``: how
    long a lost machine takes to be seen (the server's c.Portable.check_interval_s). ``offers``: these
    only, as given (a job queued ahead: :meth:`Provider.queued_offer`), rather than every provider's listing."""
    from jupyter_portable.core.spend import committed_to

    providers = providers if providers is not None else enabled_providers()
    now = now or utcnow()
    settings = load_settings(ws)
    offers, errors = (list(offers), {}) if offers is not None else list_offers(providers, None, gpu)
    budget = settings.budget
    report = None if budget.total is None else budget_report(
        ws, providers=providers, now=now, calendar_now=calendar_now, figure=figure)
    caps = Caps(max_price_per_hour=budget.max_price_per_hour, budget_left=report["left"] if report else None)
    # a slot the provider sold, in force now: its offer at the slot's price, and what is left of
    # what was paid for it counted for its route (the budget holds that money back already)
    held = held_slots(ws, now=calendar_now or now)
    offers = [reserved_offer(o, held[o.key]) if o.key in held else o for o in offers]
    spent_in = report["by_booking"] if report else {}
    prepaid = {key: committed_to(b, spent_in.get(b.reservation_id, 0.0), calendar_now or now)
               for key, b in held.items()}
    checks = {o.key: Checks(listed=True) for o in offers}
    routes = rank_routes(workspace_facts(ws, providers, now=now, notice_s=notice_s), offers, settings.requirements,
                         hours=hours if hours is not None else settings.hours, caps=caps,
                         signals=with_forecast_waits(signals_from_history(ws, now=now), offers), checks=checks,
                         prepaid=prepaid)
    return routes, errors


def routes_to_try(ws: Workspace, route_id: str | None = None, *, hours: float | None = None,
                  providers: dict[str, Provider] | None = None, now: datetime | None = None,
                  offers: list[Offer] | None = None) -> list[Route]:
    """The open routes in the order to try them: ``route_id`` first when given, then a slot the
    provider sold that is in force at ``now`` (launched into it), then by cost. ``offers``: only
    these are ranked (:func:`compute_routes`).
    UsageError for an unknown or blocked ``route_id``; NoCapacity when every route is blocked."""
    now = now or utcnow()
    routes, _ = compute_routes(ws, hours=hours, providers=providers, now=now, offers=offers)
    usable = into_reserved(ws, [r for r in routes if not r.blocked], now=now)
    if route_id is not None:
        chosen = [r for r in routes if r.id == route_id]
        if not chosen:
            raise UsageError(f"no route {route_id!r}", hint="see `jupyter portable routes`")
        if chosen[0].blocked:
            raise UsageError(f"route {route_id} is blocked: {chosen[0].blocked}")
        usable = chosen + [r for r in usable if r.id != route_id]
    if not usable:
        raise NoCapacity("no route is open: every offer is blocked", hint="see `jupyter portable routes`")
    return usable


def held_slots(ws: Workspace, *, now: datetime) -> dict[str, Any]:
    """The bookings of a slot the provider sold (an AWS Capacity Block) in force at ``now``, by
    offer key; none when the reservations cannot be read."""
    from jupyter_portable.core.calendar import Booking

    try:
        doc = ws.store.read_doc(ws.workspace_id, "reservations")
    except PortableError:
        return {}
    held: dict[str, Booking] = {}
    for entry in doc if isinstance(doc, list) else []:
        with contextlib.suppress(UsageError):
            b = Booking.from_json(entry)
            in_force = b.start <= now < b.start + timedelta(hours=b.hours)
            if b.guarantee == "provider" and b.status != "cancelled" and in_force:
                held[b.offer_key] = b
    return held


def reserved_offer(offer: Offer, booking: Any) -> Offer:
    """``offer`` launched into ``booking``'s slot: priced at the slot's price (what was paid for it
    over its hours, the rate its machines' spend is counted at), not the listed on-demand $/h."""
    rate = round(booking.price / booking.hours, 6) if booking.hours > 0 else 0.0
    return replace(offer, price_per_hour=rate, extra={
        **offer.extra, "capacity_reservation_id": booking.reservation_id, "block_price_per_hour": rate,
        "price_source": "the reservation's price over its hours"})


def into_reserved(ws: Workspace, routes: list[Any], *, now: datetime) -> list[Any]:
    """``routes`` with those of a provider-sold slot in force at ``now`` first, their offers
    naming the reservation (``extra["capacity_reservation_id"]``) so the launch goes into it."""
    held = held_slots(ws, now=now)
    if not held:
        return routes
    first = []
    for r in routes:
        if r.offer.key in held:
            r.offer.extra.update(reserved_offer(r.offer, held[r.offer.key]).extra)
            first.append(r)
    return first + [r for r in routes if r not in first]


def acquire_for(ws: Workspace, *, hours: float | None = None, providers: dict[str, Provider] | None = None,
                route_id: str | None = None, on_event: Any = None, boot_timeout_s: float = 120) -> dict[str, Any]:
    """Launch the best admissible route (or ``route_id``), failing over down the ranking.

    Every route given up is recorded in the workspace's allocation history: an admission
    refusal as an environment fault (the work did not run), anything else as a failure.
    """
    from jupyter_portable.compute.acquire import acquire
    from jupyter_portable.store.repo import now_iso

    providers = providers if providers is not None else enabled_providers()
    usable = routes_to_try(ws, route_id, hours=hours, providers=providers)
    settings = load_settings(ws)
    by_key = {r.offer.key: r for r in usable}

    def new_id() -> str:
        return f"al-{uuid.uuid4().hex[:12]}"

    try:
        allocation, attempts = acquire([r.offer for r in usable], providers, settings.requirements,
                                       allocation_id_factory=new_id, on_event=on_event,
                                       boot_timeout_s=boot_timeout_s)
    except NoCapacity as exc:
        given_up: list[Any] = list(exc.context.get("attempts") or [])  # type: ignore[call-overload]
        for attempt in given_up:
            record_attempt(ws, attempt)
        raise
    for attempt in attempts:
        record_attempt(ws, attempt)
    offer = by_key[f"{allocation.provider}/{allocation.offer_id}"].offer
    ws.record_allocation({"allocation_id": allocation.allocation_id, "provider": allocation.provider,
                          "offer": allocation.offer_id, "gpu": offer.gpu, "region": offer.region,
                          "ref": allocation.ref, "price_per_hour": offer.price_per_hour,
                          "reservation_id": allocation.details.get("capacity_reservation_id"),
                          "started": allocation.started or now_iso(), "state": "active", "spend": 0.0,
                          "currency": "USD", "failures": [a.reason for a in attempts]})
    return {"allocation": allocation.to_json(), "route": by_key[offer.key].id,
            "attempts": [a.to_json() for a in attempts]}


def record_attempt(ws: Workspace, attempt: Any, *, epoch: int | None = None, offer: Offer | None = None) -> None:
    """One route given up, in the allocation history; ``offer`` (the route's) names its GPU and region."""
    from jupyter_portable.store.repo import now_iso

    provider, _, offer_id = attempt.offer_key.partition("/")
    fault = "environment fault: " if attempt.environment_fault else ""
    named = {"gpu": offer.gpu, "region": offer.region} if offer is not None else {}
    ws.record_allocation({
        "allocation_id": attempt.allocation_id or f"attempt-{uuid.uuid4().hex[:12]}",
        "provider": provider, "offer": offer_id, **named,
        "state": "refused" if attempt.environment_fault else "failed",
        "started": now_iso(), "stopped": now_iso(),
        "stop_reason": f"{fault}{attempt.stage}: {attempt.reason}",
        # a machine that was launched is paid for, whatever became of it
        "spend": round(float(getattr(attempt, "spend", None) or 0.0), 6),
        "spend_source": getattr(attempt, "spend_source", None) or "estimate", "currency": "USD",
        "failures": [attempt.reason]}, epoch=epoch)


def open_route(ws: Workspace, route_id: str, *, providers: dict[str, Provider] | None = None) -> Route:
    """The route ``route_id`` as ranked now: UsageError when there is none, ConflictError
    when it is blocked (with the reason)."""
    routes, _ = compute_routes(ws, providers=providers)
    match = [r for r in routes if r.id == route_id]
    if not match:
        raise UsageError(f"no route {route_id}", hint="see `jupyter portable routes`: route ids change with the offers")
    if match[0].blocked:
        raise ConflictError(f"route {route_id} is blocked: {match[0].blocked}")
    return match[0]
