"""Spend so far and the budget: where it stands, and sealing then releasing at the cap.

Every figure carries its source (:data:`~jupyter_portable.core.spend.SPEND_SOURCES`): ``bill`` (the
provider's billing or charges records: RunPod's ``/v2/billing/pods``, Vast's ``/api/v0/charges``),
``provider-rate`` (the provider's own rate x its own start time: RunPod's pod ``cost``, Vast's
``dph_total``, AWS's Pricing API or spot price history) or ``estimate`` (a listed price x time:
Lambda, GCP, and whatever a provider could not say). A closed record keeps the source it was
closed with (:func:`settle`); the report adds each source up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jupyter_portable.compute.base import Allocation, Provider
from jupyter_portable.compute.registry import enabled_providers
from jupyter_portable.core.calendar import Booking
from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.core.spend import SPEND_SOURCES, settled_spend, spend_source
from jupyter_portable.core.times import parse_iso_or_none, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.settings import load_settings

# An allocation's spend so far as its provider reports it: dollars, or (dollars, source) where
# source is one of SPEND_SOURCES; None: unknown.
SpendFigure = Callable[[dict[str, Any]], "float | tuple[float | None, str | None] | None"]
# A closed record written before records kept their source: these providers' figures were their
# own rate x time (compute/*.py status); Lambda's and GCP's were estimates.
MEASURED_BY = frozenset({"runpod", "vastai", "aws"})


def _allocation(a: dict[str, Any]) -> Allocation:
    """The allocation an allocation record describes, for its provider to price or release. One
    launched into a booking the provider sold (an AWS Capacity Block) names that booking; its
    provider prices it at what was paid, from the machine's own record of the rate (AWS: the
    instance's block-price tag), not on-demand (issue 42)."""
    details: dict[str, Any] = {}
    if a.get("reservation_id"):
        details["capacity_reservation_id"] = a["reservation_id"]
    return Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"], a.get("started", ""),
                      details=details)


def provider_figure(providers: dict[str, Provider]) -> SpendFigure:
    """Ask each active allocation's provider what it has cost (:meth:`~.base.Provider.spend`: the
    bill where the provider has one; one or two API calls each)."""

    def figure(a: dict[str, Any]) -> tuple[float | None, str | None] | None:
        provider = providers.get(a.get("provider", ""))
        if provider is None or not a.get("ref"):
            return None
        try:
            return provider.spend(_allocation(a))
        except PortableError:
            return None

    return figure


def _figure(value: float | tuple[float | None, str | None] | None) -> tuple[float | None, str]:
    """``(dollars or None, source)`` from what a :data:`SpendFigure` gave (a bare number is the provider's)."""
    if isinstance(value, tuple):
        amount, source = value
        return amount, spend_source(source) if amount is not None else "estimate"
    return value, "provider-rate" if value is not None else "estimate"


def closed_source(record: dict[str, Any]) -> str:
    """Where a closed record's spend came from: as it says, else as records before sources were kept."""
    if record.get("spend_source"):
        return spend_source(record["spend_source"])
    return "provider-rate" if record.get("provider") in MEASURED_BY else "estimate"


def settle(provider: Provider | None, allocation: Allocation, *, until: datetime, price_per_hour: float | None,
           started: str | None, seen: tuple[float | None, str | None] | None = None) -> tuple[float, str]:
    """What an allocation that ended (released, lost, failed) cost, and the figure's source: its
    provider's (the bill, asked now) when above zero, else ``seen`` (the last figure seen while it
    ran), else ``price_per_hour`` x the time from ``started`` to ``until``, an estimate. A lost
    machine's spend is never $0."""
    billed = None
    if provider is not None:
        try:
            billed = provider.spend(allocation)
        except PortableError:
            billed = None
    t0 = parse_iso_or_none(started)
    if t0 is not None and t0.tzinfo is None:
        t0 = t0.replace(tzinfo=until.tzinfo)
    held = (until - t0).total_seconds() if t0 is not None else None
    return settled_spend(billed, seen, price_per_hour, held)


def bookings_of(ws: Workspace) -> list[Booking]:
    """The workspace's bookings that can be read (one that cannot holds nothing back: the
    reservations list names it)."""
    doc = ws.store.read_doc(ws.workspace_id, "reservations")
    out = []
    for entry in doc if isinstance(doc, list) else []:
        with contextlib.suppress(UsageError):
            out.append(Booking.from_json(entry))
    return out


def budget_report(ws: Workspace, *, providers: dict[str, Provider] | None = None,
                  now: datetime | None = None, figure: SpendFigure | None = None,
                  manifest: Manifest | None = None, calendar_now: datetime | None = None,
                  bookings: list[Booking] | None = None) -> dict[str, Any]:
    """Spend so far (closed allocations as recorded, active ones from the provider's figure
    or price x time), what bookings hold back (:func:`~jupyter_portable.core.spend.committed_of`,
    at ``calendar_now``, the calendar's clock; default ``now``) and where the budget stands:
    ok, warn, or exhausted, with ``left`` = total - spent - committed. Every view of the budget
    (the sidebar, routes, reservations, `jupyter portable spend`) shows this report's figures.

    ``figure`` gives an active allocation's spend as its provider last reported it; by
    default each provider is asked now. ``manifest``: the head's, when the caller has it."""
    from jupyter_portable.core.spend import budget_state, committed_of, spend_of

    now = now or utcnow()
    if figure is None:
        figure = provider_figure(providers if providers is not None else enabled_providers())
    if manifest is None:
        head, _ = ws.store.read_head(ws.workspace_id)
        # the head, not this copy's version: machines record their fate there while this copy stays put
        manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    spent, price, active = 0.0, 0.0, []
    by_source = dict.fromkeys(SPEND_SOURCES, 0.0)
    by_booking: dict[str, float] = {}  # what machines launched into a booking spent, by reservation id
    latest: dict[str, dict[str, Any]] = {}  # an allocation's newest record is the one that counts
    for a in manifest.allocations if manifest else ():
        if isinstance(a, dict) and a.get("allocation_id"):
            latest.pop(a["allocation_id"], None)
            latest[a["allocation_id"]] = a
    for a in latest.values():
        if a.get("state") != "active":
            cost = float(a.get("spend") or 0)
            source = closed_source(a)
        else:
            started = parse_iso_or_none(a.get("started")) or now
            amount, source = _figure(figure(a))
            cost = spend_of(float(a.get("price_per_hour") or 0), started, None, now, amount)
            price += float(a.get("price_per_hour") or 0)
            active.append({**a, "spend": round(cost, 4), "spend_source": source})
        spent += cost
        by_source[source] += cost
        if isinstance(a.get("reservation_id"), str):
            by_booking[a["reservation_id"]] = by_booking.get(a["reservation_id"], 0.0) + cost
    books = bookings if bookings is not None else bookings_of(ws)
    committed = committed_of(books, by_booking, calendar_now or now)
    state = budget_state(spent, load_settings(ws).budget, price, committed=committed)
    # measured: the providers' own figures (their bills and rates); estimated: listed price x time
    return {**state, "active": active, "by_source": {k: round(v, 4) for k, v in by_source.items()},
            "measured": round(by_source["bill"] + by_source["provider-rate"], 4),
            "estimated": round(by_source["estimate"], 4),
            "by_booking": {k: round(v, 4) for k, v in by_booking.items()}}


def enforce_budget(ws: Workspace, *, providers: dict[str, Provider] | None = None, seal: Any = None,
                   now: datetime | None = None, calendar_now: datetime | None = None) -> dict[str, Any]:
    """At the budget, seal then release every active allocation; never kill work unsaved.

    ``seal(ws)`` publishes the final state and reads it back; the default snapshots this
    copy and verifies the published version. (The worker's own seal replaces it once
    workers publish from the machine.)
    """
    from jupyter_portable.store.repo import now_iso

    providers = providers if providers is not None else enabled_providers()
    report = budget_report(ws, providers=providers, now=now, calendar_now=calendar_now)
    if report["state"] != "exhausted":
        return report

    def default_seal(w: Workspace) -> None:
        w.snapshot("sealed: budget exhausted", progress=None)
        result = w.verify()
        if not result.ok:
            raise PortableError("the sealed version did not read back: " +
                                "; ".join(f"{m['path']}: {m['reason']}" for m in result.mismatches[:3]))

    (seal or default_seal)(ws)  # a failed seal raises: the machine is NOT released unsaved
    released = []
    for a in report["active"]:
        provider = providers.get(a["provider"])
        amount, source = a["spend"], a["spend_source"]
        if provider is not None and a.get("ref"):
            provider.terminate(_allocation(a))
            amount, source = settle(provider, _allocation(a), until=now or utcnow(),
                                    price_per_hour=a.get("price_per_hour"), started=a.get("started"),
                                    seen=(a["spend"], a["spend_source"]))
        record = {k: v for k, v in a.items() if k not in ("spend", "spend_source")}
        record.update(state="released", stopped=now_iso(), spend=round(amount, 6), spend_source=source,
                      stop_reason="budget exhausted: sealed, then released")
        ws.record_allocation(record)
        released.append(a["allocation_id"])
    return {**report, "released": released}
