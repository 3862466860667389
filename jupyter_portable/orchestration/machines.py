"""Every machine the enabled providers hold for us, and which of them are orphans.

Each rented machine carries its allocation id and workspace id in the provider's name, labels
or tags (:func:`~jupyter_portable.compute.base.machine_name`), so ``Provider.list_machines``
finds them all whatever this copy remembers.

An **orphan** is a machine that is not the current allocation of a known workspace:

- a workspace is *known* when it is in the store of one of the copies given (every workspace
  of that store), or is one of those copies;
- its *current* allocation is, for a copy given here, what the copy's lifecycle names while it
  holds a machine (MATERIALIZING to SEALED), or in ACQUIRING/PROBING while a Continue still runs
  (holds the copy's lock); with no copy here, the store's newest record of an allocation saying
  ``active``;
- a machine of a known workspace that is not current is an orphan (a failed attempt whose
  release was not confirmed, a Continue killed mid-launch, a released machine still running);
- a machine of a workspace not known here is not judged (``orphan`` None): it may be another
  store's. Nor is a young one (under ``grace_s``) of a workspace with no copy here, which a
  Continue elsewhere may not have recorded yet.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyter_portable.compute.base import Allocation, MachineInfo, Provider
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ComputeError, ConflictError, NotSupported, PortableError, UsageError
from jupyter_portable.core.times import to_iso, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.workdir import lifecycle_file

HOLDING = (L.MATERIALIZING, L.VERIFYING, L.READY, L.ACTIVE, L.DRAINING, L.SEALED)
LAUNCHING = (L.ACQUIRING, L.PROBING)
GRACE_S = 900.0


@dataclass
class Known:
    """Workspaces known here, and the allocations current for each (see the module docstring)."""

    current: dict[str, set[str]] = field(default_factory=dict)
    local: set[str] = field(default_factory=set)  # workspaces with a copy given here


def continue_running(ws: Workspace) -> bool:
    """Whether a Continue or Stop of ``ws`` holds its copy's lock now (its process is alive)."""
    try:
        with ws.copy.continue_lock():
            return False
    except ConflictError:
        return True


def _store_current(ws: Workspace, workspace_id: str) -> set[str]:
    head, _ = ws.store.read_head(workspace_id)
    if not head.version:
        return set()
    latest: dict[str, str] = {}
    for record in ws.store.read_manifest(workspace_id, head.version).allocations:
        if isinstance(record, dict) and isinstance(record.get("allocation_id"), str):
            latest[record["allocation_id"]] = str(record.get("state"))
    return {aid for aid, state in latest.items() if state == "active"}


def known_workspaces(copies: Iterable[Workspace]) -> Known:
    """What the ``copies`` (and every workspace of their stores) say is current."""
    known = Known()
    stores: dict[str, Workspace] = {}
    copies = list(copies)
    for ws in copies:
        stores.setdefault(ws.config.store, ws)
    for ws in stores.values():
        with contextlib.suppress(PortableError):
            for wsid in ws.store.workspaces():
                with contextlib.suppress(PortableError):
                    known.current[wsid] = _store_current(ws, wsid)
    for ws in copies:
        wsid = ws.workspace_id
        known.local.add(wsid)
        lc = lifecycle_file.load(ws.copy)
        holds = lc.allocation_id and (lc.state in HOLDING or (lc.state in LAUNCHING and continue_running(ws)))
        known.current[wsid] = {lc.allocation_id} if holds and lc.allocation_id else set()
    return known


def judge(machine: MachineInfo, known: Known, *, grace_s: float = GRACE_S) -> tuple[bool | None, str]:
    """Whether ``machine`` is an orphan (None: not judged here) and why."""
    wsid, aid = machine.workspace_id, machine.allocation_id
    if machine.state in ("terminated",):
        return False, "terminated"
    if wsid is None:
        return True, "it names no workspace"
    if wsid not in known.current:
        return None, f"workspace {wsid} is not in this store; not judged here"
    if aid in known.current[wsid]:
        return False, f"the current allocation of {wsid}"
    if aid and aid.startswith("next-") and aid[5:] in known.current[wsid]:
        return False, f"queued ahead to take over from {aid[5:]}, the current allocation of {wsid}"
    if wsid not in known.local and machine.uptime_s is not None and machine.uptime_s < grace_s:
        return None, f"started {machine.uptime_s:.0f}s ago; a Continue of {wsid} elsewhere may not have recorded it"
    return True, f"not the current allocation of {wsid}"


def list_machines(providers: dict[str, Provider]) -> tuple[list[MachineInfo], list[str]]:
    """Every machine each provider lists with our labels, and one line per provider that could not say."""
    found: list[MachineInfo] = []
    problems: list[str] = []
    for name, provider in sorted(providers.items()):
        try:
            found.extend(provider.list_machines())
        except NotSupported:
            continue
        except PortableError as exc:
            problems.append(f"{name}: {exc.one_line()}")
    return found, problems


def machines_report(providers: dict[str, Provider], copies: Iterable[Workspace], *,
                    now: datetime | None = None, grace_s: float = GRACE_S) -> dict[str, Any]:
    """``{"machines": [...each with orphan and why], "orphans": [...], "problems": [...], "checked_at"}``."""
    listed, problems = list_machines(providers)
    unlisted = sorted(name for name, p in providers.items() if not _can_list(p))
    known = known_workspaces(copies)
    rows = []
    for m in listed:
        orphan, why = judge(m, known, grace_s=grace_s)
        rows.append({**m.to_json(), "orphan": orphan, "why": why})
    return {"machines": rows, "orphans": [r for r in rows if r["orphan"] is True], "problems": problems,
            "unlisted": unlisted, "checked_at": to_iso(now or utcnow())}


def _can_list(provider: Provider) -> bool:
    """Whether ``provider`` lists its machines (it overrides Provider.list_machines)."""
    return type(provider).list_machines is not Provider.list_machines


def find_allocation(providers: dict[str, Provider], allocation_id: str) -> Allocation | None:
    """The machine of ``allocation_id`` as its provider lists it, else None (a provider that
    cannot answer is skipped: this is a best effort after a crash)."""
    for provider in providers.values():
        try:
            found = [m for m in provider.find_machines(allocation_id=allocation_id) if m.state != "terminated"]
        except PortableError:
            continue
        if found:
            return found[0].allocation()
    return None


def terminate(providers: dict[str, Provider], target: str, *,
              listed: list[MachineInfo] | None = None) -> dict[str, Any]:
    """Terminate the machine whose provider ref or allocation id is ``target``, then ask its
    provider again: ``{"ref", "provider", "allocation_id", "state"}`` with the state it reports."""
    if listed is None:
        listed, _ = list_machines(providers)
    matches = [m for m in listed if target in (m.ref, m.allocation_id, f"{m.provider}/{m.ref}")]
    if not matches:
        raise UsageError(f"no machine {target!r} is listed by the enabled providers",
                         hint="see `jupyter portable machines`")
    if len({(m.provider, m.ref) for m in matches}) > 1:
        raise UsageError(f"{target!r} names more than one machine", hint="give provider/ref")
    machine = matches[0]
    provider = providers[machine.provider]
    allocation = machine.allocation()
    provider.terminate(allocation)
    state = "terminated"
    with contextlib.suppress(ComputeError):
        state = provider.status(allocation).state  # confirmed by the provider, not assumed
    return {"provider": machine.provider, "ref": machine.ref, "allocation_id": machine.allocation_id,
            "workspace_id": machine.workspace_id, "state": state}


def terminate_orphans(providers: dict[str, Provider], copies: Iterable[Workspace], *,
                      now: datetime | None = None, grace_s: float = GRACE_S) -> dict[str, Any]:
    """Terminate every orphan (see the module docstring); the report, with ``terminated`` and
    one line in ``problems`` for each that could not be."""
    report = machines_report(providers, copies, now=now, grace_s=grace_s)
    listed, _ = list_machines(providers)
    done, problems = [], list(report["problems"])
    for row in report["orphans"]:
        try:
            done.append(terminate(providers, f"{row['provider']}/{row['ref']}", listed=listed))
        except PortableError as exc:
            problems.append(f"{row['provider']}/{row['ref']}: {exc.one_line()}")
    return {**report, "terminated": done, "problems": problems}


class OrphanSweep:
    """The server's view of orphans: swept once in the background when it starts, again after a
    terminate. :meth:`view` is what the state shows (None until the first sweep finished)."""

    def __init__(self, providers: Callable[[], dict[str, Provider]], copies: Callable[[], list[Workspace]], *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.providers = providers
        self.copies = copies
        self.clock = clock
        self._lock = threading.Lock()
        self._result: dict[str, Any] | None = None
        self._sweeping = False
        self.sweeps = 0

    def sweep(self) -> dict[str, Any]:
        """List every machine now and judge it; never raises (a failure is a problem line)."""
        with self._lock:
            self._sweeping = True
        try:
            report = machines_report(self.providers(), self.copies(), now=self.clock())
        except Exception as exc:  # noqa: BLE001 - shown in the sidebar, the server goes on
            reason = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
            report = {"machines": [], "orphans": [], "problems": [reason], "checked_at": to_iso(self.clock())}
        with self._lock:
            self._result, self._sweeping = report, False
            self.sweeps += 1
        return report

    def view(self) -> dict[str, Any] | None:
        """``{"checked_at", "sweeping", "machines": [orphans], "problems"}``, or None before any sweep."""
        with self._lock:
            if self._result is None:
                return None
            return {"checked_at": self._result["checked_at"], "sweeping": self._sweeping,
                    "machines": list(self._result["orphans"]), "problems": list(self._result["problems"])}

    def terminate(self, target: str) -> dict[str, Any]:
        """Terminate one listed orphan (``provider/ref``), confirmed by its provider, then sweep again."""
        with self._lock:
            orphans = list(self._result["orphans"]) if self._result else []
        if not any(target in (f"{o['provider']}/{o['ref']}", o["ref"], o["allocation_id"]) for o in orphans):
            raise UsageError(f"{target!r} is not a listed orphan", hint="only an orphan the sidebar lists is "
                             "terminated from here; `jupyter portable machines` shows every machine")
        done = terminate(self.providers(), target)
        self.sweep()
        return {**done, "orphans": self.view()}


__all__ = ["GRACE_S", "Known", "OrphanSweep", "find_allocation", "judge", "known_workspaces", "list_machines",
           "machines_report", "terminate", "terminate_orphans"]
