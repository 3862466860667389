"""A machine that ends by itself at a time known in advance (a Slurm job's walltime): the Loss
protocol's known loss (DESIGN.md, "Loss").

- Its end, ``ends_at``, comes from the provider's status; the loss check keeps it with the allocation,
  and the state shows it, so the sidebar counts down to it.
- The machine warns the worker ahead of the end, and the worker publishes a version and reads it back
  (worker/warning.py), with or without this side.
- Where the provider queues the next machine ahead (:meth:`Provider.queue_next`: ``c.PortableSlurm.queue_next``),
  this side queues it once the workspace is ACTIVE, and when the machine ends (its walltime, or any other
  end) Continue goes onto it by itself, on the route of the same offer: the notebook, its kernel id and
  the checkpoint go on there, with no click.
- Without one, the user is asked in time: a notice once, ``ASK_AHEAD_S`` before the warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from jupyter_portable.compute.base import Allocation, Provider
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.times import now_iso, parse_iso_or_none
from jupyter_portable.worker.client import load_record, save_allocation, save_record

log = logging.getLogger("jupyter_portable.orchestration")

ASK_AHEAD_S = 600.0  # the user is asked this long before the warning (so, before the last publish)
# once a machine's known end has come, the loss check looks this often for this long (Slurm ends a
# job on a tick of its own, up to 30 s after its walltime): the take-over starts within a second
END_CHECK_S = 0.5
END_WINDOW_S = 60.0


def ask_now(ends_at: datetime, lead_s: float, now: datetime) -> bool:
    """Whether a machine that ends at ``ends_at`` (warned ``lead_s`` before) must be brought up now."""
    return now >= ends_at - timedelta(seconds=lead_s + ASK_AHEAD_S)


def next_of(allocation: Allocation | None) -> dict[str, Any] | None:
    """The machine queued ahead to take over from ``allocation`` (``{"ref", "allocation_id", "queued_at"}``)."""
    nxt = allocation.details.get("next") if allocation is not None else None
    return nxt if isinstance(nxt, dict) and isinstance(nxt.get("ref"), str) else None


def release_next(provider: Provider, allocation: Allocation) -> None:
    """Cancel the machine queued ahead of ``allocation`` (a Stop: nothing takes over)."""
    nxt = next_of(allocation)
    if nxt is not None:
        with contextlib.suppress(PortableError):
            provider.terminate(Allocation(allocation_id=str(nxt.get("allocation_id") or "next"),
                                          provider=allocation.provider, offer_id=allocation.offer_id,
                                          ref=nxt["ref"], started=str(nxt.get("queued_at") or now_iso("seconds"))))


class JobEnd:
    """The server's side of a known end, one look per loss check (the monitor's tick)."""

    def __init__(self, notice: Callable[[str, str], None]) -> None:
        self.notice = notice
        self.asked: set[str] = set()  # allocations the user was asked about
        self.queued: set[str] = set()  # allocations whose next machine was asked for
        # allocation -> (its offer's key, its provider's id, the next machine's id) while it is active
        self.ahead: dict[str, tuple[str, str, str]] = {}
        self.offers: dict[str, Any] = {}  # allocation, then route id -> the next machine's offer (queued_offer)
        self.ends_at: datetime | None = None  # the active machine's known end, as last looked at

    def look(self, orch: Any, now: datetime) -> str | None:
        """After the loss check: queue the next machine, or ask the user in time, while ACTIVE; once the
        machine is lost, the route to Continue on by itself (the next machine's), else None."""
        lc = orch.lifecycle()
        self.ends_at = None
        if lc.state == L.ACTIVE and lc.allocation_id:
            self._active(orch, lc.allocation_id, now)
        elif lc.state == L.LOST and lc.allocation_id in self.ahead:
            # the lost machine's records are gone with it (forgotten at the loss): what was queued is kept here
            key, ref, nxt = self.ahead.pop(lc.allocation_id)
            offer = self.offers.pop(lc.allocation_id, None)
            self.notice("walltime", f"Job {ref} ended ({lc.events[-1].reason}); the workspace goes on by itself "
                                    f"on job {nxt}, queued ahead")
            from jupyter_portable.core.routing import route_id

            route = route_id(cast(Any, SimpleNamespace(key=key)))
            if offer is not None:
                self.offers[route] = offer
            return route
        return None

    def due(self, now: datetime) -> bool:
        """Whether the active machine's known end has come, within ``END_WINDOW_S`` of it: the loss
        check then looks every ``END_CHECK_S`` rather than at its interval. A look only: what decides
        the loss is still the provider's word (core/reachability.py)."""
        ends = self.ends_at
        return ends is not None and ends <= now <= ends + timedelta(seconds=END_WINDOW_S)

    def offer_for(self, route: str) -> Any:
        """The offer of the machine queued ahead that :meth:`look`'s ``route`` goes onto (for
        ``Orchestrator.continue_(route, queued=...)``: that one route ranked, its capacity not asked
        again), or None where its provider gives none (the Continue then ranks every route)."""
        return self.offers.pop(route, None)

    def _active(self, orch: Any, allocation_id: str, now: datetime) -> None:
        rec = load_record(orch.ws.copy, allocation_id)
        if rec is None:
            return
        allocation = rec.allocation
        ends = parse_iso_or_none(allocation.details.get("ends_at"))
        if ends is None:
            return  # a machine that does not end by itself, or one whose end is not known yet
        self.ends_at = ends
        if next_of(allocation) is None and allocation_id not in self.queued:
            self.queued.add(allocation_id)  # asked once: a provider that queues nothing ahead says so each time
            try:
                ref = orch.provider_of(allocation).queue_next(allocation)
            except PortableError as exc:
                ref = None
                log.warning("jupyter-portable: the next job could not be queued: %s", exc.one_line())
                self.notice("walltime", f"The job to take over from job {allocation.ref} could not be queued: "
                                      f"{exc.one_line()}")
            if ref is not None:
                allocation.details["next"] = {"ref": ref, "allocation_id": f"next-{allocation_id}",
                                              "queued_at": now_iso("seconds")}
                save_record(orch.ws.copy, rec)
                save_allocation(orch.ws.copy, allocation)
                self.notice("walltime", f"Job {ref} is queued to take over when job {allocation.ref} ends "
                                       f"({allocation.details['ends_at']}): the workspace goes on there by itself")
        queued = next_of(allocation)
        if queued is not None:
            self.ahead[allocation_id] = (f"{allocation.provider}/{allocation.offer_id}", allocation.ref, queued["ref"])
            if allocation_id not in self.offers:  # built from the allocation's record: nothing is asked
                offer = orch.provider_of(allocation).queued_offer(allocation, queued["ref"])
                if offer is not None:
                    self.offers[allocation_id] = offer
        if next_of(allocation) is None and allocation_id not in self.asked:
            lead = float(allocation.details.get("signal_lead_s") or 0)
            if ask_now(ends, lead, now):
                self.asked.add(allocation_id)
                left = max(0, int((ends - now).total_seconds()))
                self.notice("walltime", f"Job {allocation.ref} ends in {left // 60} min "
                                        f"({allocation.details['ends_at']}, its walltime): a version is published "
                                        f"at its warning; Stop, or Continue on another route when it ends")


__all__ = ["ASK_AHEAD_S", "END_CHECK_S", "END_WINDOW_S", "JobEnd", "ask_now", "next_of", "release_next"]
