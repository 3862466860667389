"""The Continue, Stop and Loss protocols, driving the persisted state machine.

``core.lifecycle`` says which moves are legal; this module makes them happen, in order,
on real machines, and records each one (``lifecycle_store``) before acting on it, so a
process killed at any point leaves a record that :meth:`Orchestrator.resume` can finish
or roll back. The CLI (``jupyter portable continue/stop``) and the server extension both
drive an :class:`Orchestrator`; the server adds a ``reconnect`` hook that restarts the
notebook's kernels on the new worker.

Who publishes what: the worker publishes the workspace's files (snapshots, checkpoints,
the seal) from its own copy. The orchestrator publishes only allocation records, with the
epoch it claimed for that allocation (``Workspace.record_allocation``): the failed attempts
and the new allocation before the worker materializes, a loss (after claiming a fresh
epoch, which fences the lost worker for good), and a release after the seal.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.envconfig import (
    BOOT_TIMEOUT_ENV,
    DEFAULT_CLOUD_BOOT_TIMEOUT_S,
    ENVIRONMENT_MODES,
    boot_timeouts,
)
from jupyter_portable.core.errors import ConflictError, PortableError
from jupyter_portable.core.times import now_iso
from jupyter_portable.orchestration.continuing import ContinueProtocol
from jupyter_portable.orchestration.protocol_base import Cancelled, ProgressSink, Reconnect, StateSink
from jupyter_portable.workdir import lifecycle_file as lifecycle_store
from jupyter_portable.worker.client import (
    AgentRecord,
    load_allocation,
    save_allocation,
)

# c.Portable.environment's modes, c.Portable.boot_timeout's parser: defined with their settings
# in core.envconfig.PortableRun, named here for the code that imports them from the orchestrator
ENVIRONMENT_ENV = "JUPYTER_PORTABLE_ENVIRONMENT"


class Orchestrator(ContinueProtocol):
    """Continue, stop and loss for one workspace copy (the user's side, never the worker)."""

    def continue_(self, route_id: str | None = None, *, hours: float | None = None,
                  queued: Any = None) -> dict[str, Any]:
        """Take the workspace to ACTIVE on a fresh, verified machine (the first one too). ``queued``:
        the offer of a machine queued ahead to take over (:meth:`Provider.queued_offer`), the route
        ``route_id`` goes onto: only it is ranked and its capacity is not asked again."""
        self._cancel.clear()
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state == L.ACTIVE:
                self.check()
                lc = self.lifecycle()
                if lc.state == L.ACTIVE:
                    raise ConflictError(f"allocation {lc.allocation_id} is active and answering",
                                        hint="`jupyter portable stop` seals and releases it first")
            if lc.state not in L.CONTINUE_FROM:
                lc = self._resume_locked(lc)
                if lc.state == L.ACTIVE:
                    return self.summary(lc)
            if lc.state != L.ROUTING:
                self._move(L.ROUTING)
            self._queued = queued  # taken by this run's ranking only
            return self._run(route_id, hours)

    # -- after a restart --------------------------------------------------------------------------

    def resume(self) -> dict[str, Any]:
        """What a restarted server does first: finish or roll back whatever was in flight."""
        with self._exclusive():
            lc = self._resume_locked(self.lifecycle())
            return self.summary(lc)

    def _resume_locked(self, lc: L.Lifecycle) -> L.Lifecycle:
        if lc.state in L.CONTINUE_FROM or lc.state == L.ACTIVE:
            return lc
        if lc.state in (L.DRAINING, L.SEALED):
            self._stop_locked(lc, "resumed after a restart")
            return self.lifecycle()
        new, _action = L.recover(lc, at=now_iso())
        if new is not lc:
            lc = lifecycle_store.update(self.ws.copy, lambda cur: L.recover(cur, at=now_iso())[0])
            if self.on_state is not None:
                self.on_state({"workspace_id": lc.workspace_id, **lc.events[-1].to_json()})
        if lc.state == L.ROUTING:
            orphan = (lc.events[-1].detail or {}).get("orphan")
            if orphan:
                self._terminate_orphan(str(orphan["allocation_id"]))
            return lc
        rec = self.record(lc.allocation_id)
        if lc.state == L.MATERIALIZING:
            allocation = rec.allocation if rec is not None else load_allocation(self.ws.copy, str(lc.allocation_id))
            if allocation is None:
                self._move(L.FAILED, reason="the server restarted before the machine was recorded; Continue again")
                self._terminate_orphan(str(lc.allocation_id))
                return self.lifecycle()
            try:
                if rec is not None and self._answers(rec):
                    self._await_ready(rec)
                else:  # the agent never started, or died with the server's restart: start it again
                    if rec is not None:
                        self._drop_client(rec.allocation_id)
                        save_allocation(self.ws.copy, allocation)
                    self._start_worker(allocation, lc.version, lc.epoch)
            except Exception as exc:
                self._fail_with_release(allocation, exc)
            return self.lifecycle()
        if lc.state == L.READY and rec is not None:
            try:
                self._activate(rec)
            except PortableError:
                pass
            return self.lifecycle()
        return lc

    def abandon(self, exc: BaseException) -> dict[str, Any]:
        """After a restart's resume failed: leave no Continue half-way that nothing drives.

        The machine the record names, if any, is released and the workspace goes to FAILED with
        the reason, so the sidebar offers Continue again. Another process holding the lock is
        finishing the Continue itself (a ConflictError): it is left alone."""
        with self._exclusive():
            lc = self.lifecycle()
            if lc.state not in L.CONTINUE_STATES:
                return self.summary(lc)
            allocation = load_allocation(self.ws.copy, lc.allocation_id) if lc.allocation_id else None
            if allocation is not None:
                self._fail_with_release(allocation, exc)
            else:
                if lc.allocation_id:  # killed before the launch answered: find it by its name
                    self._terminate_orphan(str(lc.allocation_id))
                reason = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
                self._move(L.FAILED, reason=f"resuming after a restart failed: {reason}")
            return self.summary()

    def _answers(self, rec: AgentRecord) -> bool:
        try:
            self.client(rec.allocation_id).status(timeout=5)
            return True
        except PortableError:
            return False

    def _terminate_orphan(self, allocation_id: str) -> None:
        rec = self.record(allocation_id)
        allocation = rec.allocation if rec is not None else load_allocation(self.ws.copy, allocation_id)
        if allocation is None:
            local = self.providers.get("local")
            finder = getattr(local, "allocation", None)
            if finder is not None:
                with contextlib.suppress(PortableError):
                    allocation = finder(allocation_id)
        if allocation is None:  # killed before the launch answered: find it by its name (compute.base)
            from jupyter_portable.orchestration.machines import find_allocation

            allocation = find_allocation(self.providers, allocation_id)
        if allocation is not None:
            with contextlib.suppress(PortableError):
                self.provider_of(allocation).terminate(allocation)
            self._drop_client(allocation_id)


__all__ = ["BOOT_TIMEOUT_ENV", "DEFAULT_CLOUD_BOOT_TIMEOUT_S", "ENVIRONMENT_ENV", "ENVIRONMENT_MODES", "Cancelled",
           "Orchestrator", "ProgressSink", "Reconnect", "StateSink", "boot_timeouts"]
