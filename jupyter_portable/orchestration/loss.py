"""The Loss protocol: look at the active machine (its provider's status, the worker's heartbeat),
decide by ``core.reachability``'s one rule, and declare a loss only on evidence (invariant 12)."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ComputeError, PortableError
from jupyter_portable.orchestration.allocation_close import AllocationClosing
from jupyter_portable.worker.client import (
    AgentRecord,
    save_allocation,
    save_record,
)

log = logging.getLogger("jupyter_portable.orchestration")


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class LossWatch(AllocationClosing):
    """Heartbeat and provider checks of the active machine, and the loss they may declare."""

    def check(self, now: datetime | float | None = None) -> dict[str, Any]:
        """Look at the active machine once: its provider's status and the agent's heartbeat, and
        decide by :func:`jupyter_portable.core.reachability.decide` (one rule for every provider):
        LOST (recorded, with the reason) only when the provider says the machine is gone, or no path
        has reached it for ``unreachable_grace_s`` while the provider cannot say it runs; until then
        it is unreachable (``"unreachable_since"`` in the answer), shown and left alone. ``now``: the
        time of this look (a datetime, or seconds since the epoch); None reads ``wall``."""
        from jupyter_portable.core import reachability as R

        if now is None:
            at = self.wall()
        elif isinstance(now, datetime):
            at = now
        else:
            at = datetime.fromtimestamp(float(now), timezone.utc)
        lc = self.lifecycle()
        if lc.state not in (L.ACTIVE, L.READY):
            self._unreachable = None
            return {**self.summary(lc), "alive": None, "unreachable_since": None}
        rec = self.record(lc.allocation_id)
        if rec is None:
            self._lost(lc, "no record of how to reach the worker is left on this machine")
            return {**self.summary(), "alive": False, "unreachable_since": None}
        status = None
        asked: str | None = None
        try:
            status = self.provider_of(rec.allocation).status(rec.allocation)
        except PortableError as exc:
            asked = exc.one_line()  # the provider did not answer: it cannot say
        if status is not None:
            self.observed[rec.allocation_id] = status
            if status.ends_at is not None and status.ends_at != rec.allocation.details.get("ends_saved"):
                # a machine that ends by itself (a Slurm job's walltime): kept for the countdown (walltime.py)
                rec.allocation.details.update(ends_at=status.ends_at, ends_saved=status.ends_at)
                save_record(self.ws.copy, rec)
                save_allocation(self.ws.copy, rec.allocation)
        if status is not None and status.state == "reachable":
            # a host-side restart may map SSH elsewhere (Vast): follow it, held to the pinned host key
            from jupyter_portable.compute.acquire import follow_endpoint

            try:
                if follow_endpoint(rec.allocation, status):
                    save_record(self.ws.copy, rec)
                    save_allocation(self.ws.copy, rec.allocation)
                    stale = self._clients.pop(rec.allocation_id, None)  # the next call connects there
                    if stale is not None:
                        stale.close()
            except ComputeError as exc:
                self._lost(lc, str(exc), spend=status.spend or 0.0)
                return {**self.summary(), "alive": False, "unreachable_since": None}
        answer = R.provider_answer(status.state if status is not None else None)
        said = (status.reason or (f"the provider says the machine is {status.state}" if answer == R.GONE else None)
                ) if status is not None else asked
        reached = sealed_here = False
        if answer != R.GONE:
            try:
                try:
                    heard = self.client(rec.allocation_id).status(timeout=5)
                except PortableError:
                    # the user's address may have changed (another network): where the provider's firewall
                    # admits addresses, the new one is let in first, and the worker asked again
                    if not self._admit_caller(rec):
                        raise
                    heard = self.client(rec.allocation_id).status(timeout=5)
                reached = True
                if isinstance(heard, dict):
                    self.heard[rec.allocation_id] = heard
                # sealed by its guardian, whose provider's means did not stop it: the release is taken in too
                sealed_here = heard.get("phase") == "sealed"
            except PortableError as exc:
                said = f"{said}; heartbeat: {exc.one_line()}" if said else f"heartbeat: {exc.one_line()}"
                stale = self._clients.pop(rec.allocation_id, None)  # the next look connects afresh
                if stale is not None:
                    stale.close()
        if (not reached or sealed_here) and lc.state == L.ACTIVE and self._released_by_machine(lc, rec) is not None:
            # the machine looked after itself while this side was away: a release, not a loss (core/guardian)
            self._unreachable = None
            return {**self.summary(), "alive": False, "unreachable_since": None}
        since = self._unreachable[1] if self._unreachable and self._unreachable[0] == rec.allocation_id else None
        decision = R.decide(answer, reached=reached, since=since, now=at, grace_s=self.unreachable_grace_s,
                            said=said)
        if decision.verdict == R.LOST:
            self._unreachable = None
            self._lost(lc, decision.reason or "lost", spend=(status.spend or 0.0) if status else 0.0)
            return {**self.summary(), "alive": False, "unreachable_since": None}
        if decision.verdict == R.UNREACHABLE:
            if since is None:
                log.warning("%s: %s (%s); nothing is released while the provider may still run it",
                            rec.allocation_id, decision.line(), decision.reason)
            self._unreachable = (rec.allocation_id, decision.since or at, decision.reason)
            return {**self.summary(lc), "alive": False, "unreachable_since": _iso(decision.since),
                    "unreachable": decision.line(), "unreachable_reason": decision.reason}
        if since is not None:
            log.warning("%s answers again (%s); nothing was lost", rec.allocation_id,
                        R.Decision(R.UNREACHABLE, since).line())
        self._unreachable = None
        return {**self.summary(lc), "alive": True, "unreachable_since": None}

    def _released_by_machine(self, lc: L.Lifecycle, rec: AgentRecord) -> dict[str, Any] | None:
        """What the machine recorded when it released itself, once this side has taken it in (the Stop
        protocol does: ``sealing``); None when it did not."""
        return None

    def unreachable(self) -> dict[str, Any] | None:
        """The active machine that no path reaches, as the last check saw it (state.json ``unreachable``):
        ``{"allocation_id", "since", "line": "unreachable since 14:02Z", "reason"}``; None while it answers."""
        from jupyter_portable.core.reachability import UNREACHABLE, Decision

        held = self._unreachable
        lc = self.lifecycle()
        if held is None or held[0] != lc.allocation_id or lc.state not in (L.ACTIVE, L.READY):
            return None
        return {"allocation_id": held[0], "since": _iso(held[1]), "line": Decision(UNREACHABLE, held[1]).line(),
                "reason": (held[2] or "")[:1000] or None}

    def _provider_says_gone(self, rec: AgentRecord) -> bool:
        """Whether the allocation's provider says its machine is gone (a provider that does not answer
        cannot say so)."""
        from jupyter_portable.core import reachability as R

        try:
            status = self.provider_of(rec.allocation).status(rec.allocation)
        except PortableError:
            return False
        return R.provider_answer(status.state) == R.GONE

    def _admit_caller(self, rec: AgentRecord) -> bool:
        """Whether the provider had to let SSH in from this computer's address (then the worker's
        client connects afresh); a provider that cannot say is taken as no."""
        try:
            admitted = self.provider_of(rec.allocation).admit_caller(rec.allocation)
        except PortableError:
            return False
        if admitted:
            stale = self._clients.pop(rec.allocation_id, None)
            if stale is not None:
                stale.close()
        return admitted

    def _lost(self, lc: L.Lifecycle, reason: str, *, spend: float = 0.0) -> None:
        current = self.lifecycle()
        if current.state not in (L.ACTIVE, L.READY, L.DRAINING) or current.allocation_id != lc.allocation_id:
            return
        if current.state == L.READY:
            # never ACTIVE: the Continue that reached READY fails, its machine is gone
            self._move(L.FAILED, reason=f"lost before the kernel moved: {reason}")
        else:
            self._move(L.LOST, reason=reason)
        rec = self.record(lc.allocation_id)
        # a fresh epoch: the lost worker can never publish again, even if it comes back
        with contextlib.suppress(PortableError):
            epoch = self.ws.store.claim_epoch(self.ws.workspace_id)
            if rec is not None:
                self._close_record(rec, state="lost", reason=reason, spend=spend, epoch=epoch, failures=[reason])
        if rec is not None:
            with contextlib.suppress(PortableError):
                self.provider_of(rec.allocation).terminate(rec.allocation)
            self._drop_client(rec.allocation_id)
