"""Closing an allocation's record in the store: what it cost (the provider's bill, the last
figure seen, or an estimate), what READY measured against what its route predicted, and the
environment it ran."""

from __future__ import annotations

import contextlib
from typing import Any

from jupyter_portable.compute.base import Allocation
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.times import now_iso, parse_iso_or_none, utcnow
from jupyter_portable.orchestration.protocol_base import ProtocolBase
from jupyter_portable.worker.client import (
    AgentRecord,
)


class AllocationClosing(ProtocolBase):
    """The allocation history's last word on a machine: spend, measurement, environment."""

    def _close_record(self, rec: AgentRecord, *, state: str, reason: str, spend: float, epoch: int,
                      failures: list[str] | None = None) -> None:
        a = rec.allocation
        mine = [x for x in self._history() if x.get("allocation_id") == a.allocation_id]
        prior: dict[str, Any] = mine[-1] if mine else {}
        # the bill where the provider has one, else the last figure seen (``spend``), else an estimate
        seen = self.observed.get(a.allocation_id)
        spend, source = self._settle(a, price_per_hour=prior.get("price_per_hour"),
                                     started=prior.get("started") or a.started,
                                     seen=(spend, seen.spend_source if seen is not None else None))
        record = {**prior, "allocation_id": a.allocation_id, "provider": a.provider, "offer": a.offer_id,
                  "ref": a.ref, "started": prior.get("started") or a.started or now_iso(), "stopped": now_iso(),
                  "state": state, "stop_reason": reason[:500], "spend": round(spend, 6), "spend_source": source,
                  "currency": "USD", "failures": list(prior.get("failures") or []) + list(failures or [])}
        measured = self._measured_at_close(a.allocation_id, record, spend)  # estimates
        if measured:
            record["measured"] = measured
        environment = self._environment_at_ready(a.allocation_id)
        if environment is not None:
            record["environment"] = environment
        with contextlib.suppress(PortableError):
            self.ws.record_allocation(record, epoch=epoch)

    def _settle(self, allocation: Allocation, *, price_per_hour: Any, started: str | None,
                seen: tuple[float | None, str | None] | None = None) -> tuple[float, str]:
        """What the allocation cost, with the figure's source (see :func:`.budget.settle`)."""
        from jupyter_portable.orchestration.budget import settle

        provider = None
        with contextlib.suppress(PortableError):
            provider = self.provider_of(allocation)
        price = price_per_hour if isinstance(price_per_hour, (int, float)) else allocation.details.get("price_per_hour")
        return settle(provider, allocation, until=utcnow(), started=started, seen=seen,
                      price_per_hour=float(price) if isinstance(price, (int, float)) else None)

    def _environment_at_ready(self, allocation_id: str) -> dict[str, Any] | None:
        """The environment READY reported for this allocation, as the machine history keeps it."""
        from jupyter_portable.core.envplan import check_record, record

        for ev in reversed(self.lifecycle().events):
            env = (ev.detail or {}).get("environment") if ev.state == L.READY else None
            if ev.allocation_id == allocation_id and isinstance(env, dict):
                with contextlib.suppress(PortableError):
                    return check_record(record(env), allocation_id)
        return None

    def _measured_at_close(self, allocation_id: str, record: dict[str, Any], spend: float) -> dict[str, Any]:
        """READY's measurement of this allocation (from the lifecycle, which outlives a restart),
        with what it cost: spend, hours held, and that rate for the planned hours."""
        measured: dict[str, Any] = dict(record.get("measured") or {})
        for ev in self.lifecycle().events:
            estimate = (ev.detail or {}).get("estimate") if ev.state == L.READY else None
            if ev.allocation_id == allocation_id and isinstance(estimate, dict):
                measured.update(estimate.get("measured") or {})
        if not measured:
            return {}
        t0, t1 = parse_iso_or_none(record.get("started")), parse_iso_or_none(record.get("stopped"))
        hours = max(0.0, (t1 - t0).total_seconds() / 3600) if t0 and t1 else 0.0
        planned = (record.get("predicted") or {}).get("hours")
        measured.update(spend=round(spend, 6), hours=round(hours, 6))
        if hours > 0 and isinstance(planned, (int, float)):
            measured["cost"] = round(spend / hours * planned, 6)
        return measured

    def _history(self) -> list[dict[str, Any]]:
        head, _ = self.ws.store.read_head(self.ws.workspace_id)
        if not head.version:
            return []
        return list(self.ws.store.read_manifest(self.ws.workspace_id, head.version).allocations)
