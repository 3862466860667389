"""Spend so far and the budget: where it stands, and sealing then releasing at the cap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.registry import enabled_providers
from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.core.times import parse_iso_or_none, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.settings import load_settings

# An allocation's spend so far as its provider reports it: dollars, or (dollars, source) where
# source is "provider" (measured: the provider's own figures) or "estimate"; None: unknown.
SpendFigure = Callable[[dict[str, Any]], "float | tuple[float | None, str | None] | None"]
# Providers whose recorded spend at release comes from their own figures (compute/*.py status):
# RunPod's pod cost x createdAt, Vast's dph_total x start_date, AWS's Pricing API or spot price
# history x LaunchTime. Lambda and GCP records are price x time, estimates.
MEASURED_BY = frozenset({"runpod", "vastai", "aws"})


def provider_figure(providers: dict[str, Provider]) -> SpendFigure:
    """Ask each active allocation's provider for its own spend figure (one API call each)."""
    from jupyter_portable.compute.base import Allocation

    def figure(a: dict[str, Any]) -> tuple[float | None, str | None] | None:
        provider = providers.get(a.get("provider", ""))
        if provider is None or not a.get("ref"):
            return None
        try:
            st = provider.status(Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"],
                                            a.get("started", "")))
        except PortableError:
            return None
        return st.spend, st.spend_source

    return figure


def _figure(value: float | tuple[float | None, str | None] | None) -> tuple[float | None, str]:
    """``(dollars or None, "provider" | "estimate")`` from what a :data:`SpendFigure` gave."""
    if isinstance(value, tuple):
        amount, source = value
        return amount, source if amount is not None and source == "provider" else "estimate"
    return value, "provider" if value is not None else "estimate"


def budget_report(ws: Workspace, *, providers: dict[str, Provider] | None = None,
                  now: datetime | None = None, figure: SpendFigure | None = None,
                  manifest: Manifest | None = None) -> dict[str, Any]:
    """Spend so far (closed allocations as recorded, active ones from the provider's figure
    or price x time) and where the budget stands: ok, warn, or exhausted.

    ``figure`` gives an active allocation's spend as its provider last reported it; by
    default each provider is asked now. ``manifest``: the head's, when the caller has it."""
    from jupyter_portable.core.spend import budget_state, spend_of

    now = now or utcnow()
    if figure is None:
        figure = provider_figure(providers if providers is not None else enabled_providers())
    if manifest is None:
        head, _ = ws.store.read_head(ws.workspace_id)
        # the head, not this copy's version: machines record their fate there while this copy stays put
        manifest = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    spent, price, active = 0.0, 0.0, []
    by_source = {"provider": 0.0, "estimate": 0.0}
    latest: dict[str, dict[str, Any]] = {}  # an allocation's newest record is the one that counts
    for a in manifest.allocations if manifest else ():
        if isinstance(a, dict) and a.get("allocation_id"):
            latest.pop(a["allocation_id"], None)
            latest[a["allocation_id"]] = a
    for a in latest.values():
        if a.get("state") != "active":
            cost = float(a.get("spend") or 0)
            source = "provider" if a.get("provider") in MEASURED_BY else "estimate"
        else:
            started = parse_iso_or_none(a.get("started")) or now
            amount, source = _figure(figure(a))
            cost = spend_of(float(a.get("price_per_hour") or 0), started, None, now, amount)
            price += float(a.get("price_per_hour") or 0)
            active.append({**a, "spend": round(cost, 4), "spend_source": source})
        spent += cost
        by_source[source] += cost
    state = budget_state(spent, load_settings(ws).budget, price)
    # measured: the providers' own figures; estimated: listed price x time (see MEASURED_BY)
    return {**state, "active": active, "measured": round(by_source["provider"], 4),
            "estimated": round(by_source["estimate"], 4)}


def enforce_budget(ws: Workspace, *, providers: dict[str, Provider] | None = None, seal: Any = None,
                   now: datetime | None = None) -> dict[str, Any]:
    """At the budget, seal then release every active allocation; never kill work unsaved.

    ``seal(ws)`` publishes the final state and reads it back; the default snapshots this
    copy and verifies the published version. (The worker's own seal replaces it once
    workers publish from the machine.)
    """
    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.store.repo import now_iso

    providers = providers if providers is not None else enabled_providers()
    report = budget_report(ws, providers=providers, now=now)
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
        if provider is not None and a.get("ref"):
            provider.terminate(Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"],
                                          a.get("started", "")))
        record = {k: v for k, v in a.items() if k not in ("spend", "spend_source")}
        record.update(state="released", stopped=now_iso(), spend=a["spend"],
                      stop_reason="budget exhausted: sealed, then released")
        ws.record_allocation(record)
        released.append(a["allocation_id"])
    return {**report, "released": released}
