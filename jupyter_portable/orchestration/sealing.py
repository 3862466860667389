"""The Stop protocol (seal): stop new writes, publish the final manifest, read it back, and only
then release the allocation (invariant 6), recording its stop reason and spend."""

from __future__ import annotations

import contextlib
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ConflictError, PortableError, ProviderUnavailable, UsageError
from jupyter_portable.orchestration.loss import LossWatch
from jupyter_portable.orchestration.walltime import release_next
from jupyter_portable.worker.client import AgentRecord


class StopProtocol(LossWatch):
    """Seal, read back, release; and a snapshot from wherever the newest files are."""

    def stop(self, reason: str = "stopped by the user", *, detail: dict[str, Any] | None = None,
             allocation_id: str | None = None) -> dict[str, Any]:
        """Seal, read back, release: the allocation ends with nothing unpublished. ``detail`` goes
        with the DRAINING event; ``allocation_id``, when given, must be the one still serving."""
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state not in (L.ACTIVE, L.DRAINING, L.SEALED):
                raise UsageError(f"nothing to stop: the workspace is {lc.state}")
            if allocation_id is not None and lc.allocation_id != allocation_id:
                raise ConflictError(f"{allocation_id} no longer serves the workspace ({lc.allocation_id} does)")
            return self._stop_locked(lc, reason, detail)

    def _seal_words(self, rec: AgentRecord | None) -> str:
        """What the seal does first, said before it starts: the worker lets the kernel's checkpoints
        in flight finish before the kernel stops (minutes, for a large one), so the user is told
        which, from the worker's status now (or as the loss check last heard it)."""
        said: Any = None
        if rec is not None:
            with contextlib.suppress(PortableError):
                said = self.client(rec.allocation_id).status(timeout=5)
            if not isinstance(said, dict):
                said = self.heard.get(rec.allocation_id)
        report = said.get("checkpoints") if isinstance(said, dict) else None
        flying = report.get("in_flight") if isinstance(report, dict) else None
        lines = [str(c.get("line") or c.get("path")) for c in flying if isinstance(c, dict)] \
            if isinstance(flying, list) else []
        if not lines:
            return "no new writes; publishing the final version"
        return (f"no new writes; waiting for {len(lines)} checkpoint(s) in flight before the kernel stops "
                f"({'; '.join(lines)}), then publishing the final version")

    def _stop_locked(self, lc: L.Lifecycle, reason: str, detail: dict[str, Any] | None = None) -> dict[str, Any]:
        rec = self.record(lc.allocation_id)
        if lc.state == L.ACTIVE:
            lc = self._move(L.DRAINING, reason=reason, detail=detail)
        if lc.state == L.DRAINING:
            self._progress("seal", self._seal_words(rec))
            try:
                if rec is None:
                    raise PortableError(f"no record of how to reach the worker of {lc.allocation_id}")
                sealed = self.client(rec.allocation_id).seal(f"sealed: {reason}")
            except ProviderUnavailable as exc:
                # the worker did not answer: lost only on evidence (core.reachability), that is when
                # its provider says the machine is gone; else it is unreachable, and nothing is released
                if rec is not None and self._provider_says_gone(rec):
                    self._lost(lc, f"lost while sealing: {exc}")
                    raise
                stale = self._clients.pop(lc.allocation_id or "", None)  # the next try connects afresh
                if stale is not None:
                    stale.close()
                self._move(L.ACTIVE, reason=f"the seal failed, the machine does not answer (nothing was "
                                            f"released; stop again when it answers): {exc.one_line()}")
                raise
            except PortableError as exc:
                self._move(L.ACTIVE, reason=f"the seal failed, writes are open again: {exc.one_line()}")
                raise
            if sealed.get("checkpoints_waited"):  # the worker let its checkpoints in flight finish first
                self._progress("seal", "waited for checkpoints in flight: "
                               + "; ".join(str(x) for x in sealed["checkpoints_waited"])
                               + (f" ({len(sealed.get('checkpoints_abandoned') or [])} given up)"
                                  if sealed.get("checkpoints_abandoned") else ""))
            lc = self._move(L.SEALED, version=int(sealed["version"]))
        spend = 0.0
        if rec is not None:
            provider = self.provider_of(rec.allocation)
            seen = self.observed.get(rec.allocation_id)  # the provider's last figure, should it not answer now
            spend = float(seen.spend or 0.0) if seen is not None else 0.0
            with contextlib.suppress(PortableError):
                spend = float(provider.status(rec.allocation).spend or spend)
            with contextlib.suppress(PortableError):
                self.client(rec.allocation_id).shutdown()  # the agent goes first, then its machine
            provider.terminate(rec.allocation)  # only after SEALED (invariant 6)
            release_next(provider, rec.allocation)  # a machine queued ahead to take over: nothing does now
        lc = self._move(L.RELEASED)
        if rec is not None:
            self._close_record(rec, state="released", reason=reason, spend=spend, epoch=lc.epoch)
            self._drop_client(rec.allocation_id)
        self._adopt_head()
        return {**self.summary(lc), "sealed_version": lc.version}

    def _released_by_machine(self, lc: L.Lifecycle, rec: AgentRecord) -> dict[str, Any] | None:
        """The machine sealed and released itself while this side was away (worker/guardian): its record
        is read back from the head, and the workspace goes DRAINING -> SEALED (at the version it sealed)
        -> RELEASED as if this side had stopped it; whatever the provider still holds (a stopped pod, a
        stopped instance: their disks bill) is terminated now, and a machine queued ahead to take over (a
        Slurm job's successor) is cancelled, as Stop does. None when the machine recorded no release."""
        from jupyter_portable.orchestration.guardian import machine_release

        try:
            released = machine_release(self.ws, lc.allocation_id)
        except PortableError:
            return None
        if released is None:
            return None
        try:
            return self._take_release(lc, rec, released)
        except ConflictError:
            return None  # a Continue or Stop holds the workspace: the next look takes it in

    def _take_release(self, lc: L.Lifecycle, rec: AgentRecord, released: dict[str, Any]) -> dict[str, Any] | None:
        with self._exclusive():
            if self.lifecycle().state != L.ACTIVE or self.lifecycle().allocation_id != lc.allocation_id:
                return None
            detail = {"by": "machine", "message": released["message"], "at": released["at"],
                      "idle_minutes": released.get("idle_minutes"), "idle_since": released.get("idle_since"),
                      "price_per_hour": None}
            self._move(L.DRAINING, reason=str(released["reason"]), detail=detail)
            self._move(L.SEALED, version=int(released["version"]))
            seen = self.observed.get(rec.allocation_id)
            spend = float(seen.spend or 0.0) if seen is not None else 0.0
            with contextlib.suppress(PortableError):
                self.client(rec.allocation_id).shutdown()  # a sealed worker its provider's means did not stop
            with contextlib.suppress(PortableError):
                self.provider_of(rec.allocation).terminate(rec.allocation)
            with contextlib.suppress(PortableError):  # a job queued ahead to take over: nothing does now (as Stop)
                release_next(self.provider_of(rec.allocation), rec.allocation)
            lc = self._move(L.RELEASED)
            self._close_record(rec, state="released", reason=f"released by the machine ({released['reason']})",
                               spend=spend, epoch=lc.epoch)
            self._drop_client(rec.allocation_id)
            self._adopt_head()
        return released

    def _adopt_head(self) -> None:
        """The file browser pulled the machine's files into this copy while it ran (orchestration/follow):
        when the copy now holds exactly the head's files, it is on the head, so `verify` and the next
        snapshot start from there. A copy with edits of its own stays on its version."""
        with contextlib.suppress(PortableError):
            head, _ = self.ws.store.read_head(self.ws.workspace_id)
            cfg = self.ws.copy.read_config()
            if head.version > cfg.version and self.ws.verify(version=head.version).ok:
                cfg.version = head.version
                self.ws.copy.write_config(cfg)

    def snapshot(self, message: str) -> dict[str, Any]:
        """Publish a version: from the worker while one is active (it holds the newest files),
        else from this copy."""
        if self.lifecycle().state == L.ACTIVE:
            return self.client().snapshot(message)
        res = self.ws.snapshot(message, progress=None)
        return {"version": res.version, "changed": res.changed, "skipped": list(res.to_json().get("skipped") or [])}
