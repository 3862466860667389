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

SpendFigure = Callable[[dict[str, Any]], "float | None"]


def provider_figure(providers: dict[str, Provider]) -> SpendFigure:
    """Ask each active allocation's provider for its own spend figure (one API call each)."""
    from jupyter_portable.compute.base import Allocation

    def figure(a: dict[str, Any]) -> float | None:
        provider = providers.get(a.get("provider", ""))
        if provider is None or not a.get("ref"):
            return None
        try:
            return provider.status(Allocation(a["allocation_id"], a["provider"], a.get("offer", ""), a["ref"],
                                              a.get("started", ""))).spend
        except PortableError:
            return None

    return figure


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
    for a in manifest.allocations if manifest else ():
        if a.get("state") != "active":
            spent += float(a.get("spend") or 0)
            continue
        started = parse_iso_or_none(a.get("started")) or now
        cost = spend_of(float(a.get("price_per_hour") or 0), started, None, now, figure(a))
        spent += cost
        price += float(a.get("price_per_hour") or 0)
        active.append({**a, "spend": round(cost, 4)})
    state = budget_state(spent, load_settings(ws).budget, price)
    return {**state, "active": active}


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
        record = {k: v for k, v in a.items() if k != "spend"}
        record.update(state="released", stopped=now_iso(), spend=a["spend"],
                      stop_reason="budget exhausted: sealed, then released")
        ws.record_allocation(record)
        released.append(a["allocation_id"])
    return {**report, "released": released}
