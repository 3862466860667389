"""What the sidebar shows, built in one place: the workspace, its lifecycle, the machine
and what it has cost (one spend figure, and every machine the workspace had), the last
published version, checkpoints, the budget, and the facts the sidebar acts on
(``can_continue``, ``can_cancel``).

Building it never calls a provider: an active machine's spend is the provider's figure as
the loss check last saw it (``Orchestrator.observed``), else price x time from
:func:`~jupyter_portable.core.spend.spend_of`, the same rule the budget uses. The answer is
kept until something it depends on changes (the lifecycle, the store's head, conflicts, a
Continue starting or ending) or ``refresh_s`` has passed, so a cell that ends and makes the
sidebar ask again costs two small reads.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core import state_words
from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.core.spend import spend_line, spend_of, spend_source
from jupyter_portable.core.times import parse_iso_or_none, utcnow
from jupyter_portable.engine.checkpoint.registry import records
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.budget import budget_report
from jupyter_portable.orchestration.orchestrator import Orchestrator
from jupyter_portable.orchestration.routes import history_records

_WITH_MACHINE = (L.ACTIVE, L.READY, L.DRAINING, L.SEALED, *L.CONTINUE_STATES)


def checkpoint_view(r: Any) -> dict[str, Any]:
    """One checkpoint record as the API shows it."""
    return {"path": r.path, "step": r.step, "note": r.note, "hash": r.hash, "size": r.size, "format": r.format,
            "verified": r.verified, "status": r.status, "reason": r.reason, "version": r.version,
            "created": r.created}


def head_manifest(ws: Workspace) -> Manifest | None:
    """The manifest the store's head names (None before the first version)."""
    head, _ = ws.store.read_head(ws.workspace_id)
    return ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None


def checkpoints_view(ws: Workspace) -> dict[str, Any]:
    """The checkpoints of the head's version, and the latest verified one."""
    from jupyter_portable.engine.checkpoint.registry import latest

    m = head_manifest(ws)
    best = latest(m)
    return {"checkpoints": [checkpoint_view(r) for r in records(m)],
            "latest": checkpoint_view(best) if best else None}


ENDED_SHOWN_S = 600.0  # how long after a checkpoint ended the sidebar still says how (verified, or why not)


def _inflight_row(rec: Any, machine: str | None, now: datetime) -> dict[str, Any] | None:
    """One checkpoint record (this copy's, or a machine's: checked, never trusted) as the state shows
    it at ``now`` (the rate: its bytes done over the time since its phase began), without its line;
    None for a record that is not one."""
    from jupyter_portable.core.state_words import CHECKPOINT_PHASES, checkpoint_percent, checkpoint_rate

    if not isinstance(rec, dict):
        return None

    def count(name: str) -> int:
        v = rec.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 else 0

    def text(name: str, limit: int) -> str | None:
        v = rec.get(name)
        return v[:limit] if isinstance(v, str) else None

    step, version, rate = rec.get("step"), rec.get("version"), rec.get("rate")
    state, key, path = text("state", 20), text("key", 200), text("path", 1000)
    if state is None or state not in CHECKPOINT_PHASES or not key or not path:
        return None
    done, total = count("done_bytes"), count("total_bytes")
    since = text("since", 40)
    measured = checkpoint_rate(done, parse_iso_or_none(since), now) if since else None
    if measured is not None:
        rate = measured
    return {"key": key, "path": path,
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "state": state, "phase": CHECKPOINT_PHASES[state], "percent": checkpoint_percent(state, done, total),
            "done_bytes": done, "total_bytes": total, "size": count("size"),
            "rate": float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool)
            and 0 <= rate < 1e15 else 0.0,
            "reason": text("reason", 500), "ended": text("ended", 40), "since": since,
            "version": version if isinstance(version, int) and not isinstance(version, bool) else None,
            "latest": False, "machine": machine}


def _lost_in_flight(heard: dict[str, dict[str, Any]], lost: L.Event, checkpoints: list[dict[str, Any]],
                    now: datetime) -> tuple[str | None, datetime, Any, Any]:
    """What the lost machine's worker last said was in flight, as ended with the loss: failed, unless
    the store's head has it verified (it ended between that report and the loss)."""
    report = (heard.get(lost.allocation_id or "") or {}).get("checkpoints")
    flying = report.get("in_flight") if isinstance(report, dict) else None
    ended_rows = []
    for rec in flying if isinstance(flying, list) else []:
        if not isinstance(rec, dict):
            continue
        kept = next((c for c in checkpoints if c.get("path") == rec.get("path") and c.get("step") == rec.get("step")
                     and c.get("verified")), None)
        ended_rows.append({**rec, "ended": lost.at, **(
            {"state": "verified", "version": kept.get("version"), "reason": None} if kept is not None else
            {"state": "failed", "reason": f"the machine was lost before it was verified ({lost.reason or 'lost'}); "
                                         "latest stays on the last verified checkpoint"})})
    return lost.allocation_id, now, [], ended_rows  # the loss was recorded on this side's clock


def checkpoints_in_flight_view(ws: Workspace, heard: dict[str, dict[str, Any]], lc: L.Lifecycle, now: datetime,
                               checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoints on their way to verified, each with its phase, percent, rate and line (the
    words of core/state_words, as the CLI says them), then those that ended in the last
    :data:`ENDED_SHOWN_S` seconds: verified (``latest`` when it is the head's latest verified one)
    or why not. From this copy (a kernel run here) and from the machine serving the workspace
    (``heard``: its worker's status as the loss check last heard it; ``machine`` names it).
    ``checkpoints``: the head's, as the state shows them."""
    from jupyter_portable.core.state_words import CHECKPOINT_ENDED, checkpoint_line
    from jupyter_portable.engine.checkpoint.background import ended, inflight

    sources: list[tuple[str | None, datetime, Any, Any]] = []
    try:
        sources.append((None, now, inflight(ws.copy), ended(ws.copy)))
    except (OSError, PortableError):
        pass
    if lc.allocation_id and lc.state in (L.ACTIVE, L.READY, L.DRAINING):
        said = heard.get(lc.allocation_id) or {}
        report = said.get("checkpoints")
        # its phases were timed on the machine's clock: their rates go to the time of its answer
        at = said.get("heartbeat")
        there = datetime.fromtimestamp(at, timezone.utc) if isinstance(at, (int, float)) and 0 < at < 1e11 else now
        if isinstance(report, dict):
            sources.append((lc.allocation_id, there, report.get("in_flight"), report.get("ended")))
    elif lc.state == L.LOST and lc.events:
        sources.append(_lost_in_flight(heard, lc.events[-1], checkpoints, now))
    best = next((c for c in reversed(checkpoints) if c.get("verified")), None)
    flying: list[dict[str, Any]] = []
    done: list[dict[str, Any]] = []
    for machine, at, moving, finished in sources:
        for rec in moving if isinstance(moving, list) else []:
            row = _inflight_row(rec, machine, at)
            if row is not None and row["state"] not in CHECKPOINT_ENDED:
                flying.append(row)
        for rec in (finished if isinstance(finished, list) else [])[:20]:
            row = _inflight_row(rec, machine, at)
            end = parse_iso_or_none(row["ended"]) if row is not None else None
            if row is None or end is None or not 0 <= (at - end).total_seconds() <= ENDED_SHOWN_S:
                continue
            row["latest"] = bool(row["state"] == "verified" and best is not None and best.get("path") == row["path"]
                                 and best.get("version") == row["version"])
            done.append(row)
    done.sort(key=lambda r: str(r["ended"]), reverse=True)
    return [{**r, "line": checkpoint_line(r, latest=r["latest"])} for r in flying + done]


def files_view(ws: Workspace, orch: Orchestrator, conflicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The head's files, and while a worker is active, what it still has to fetch."""
    head, _ = ws.store.read_head(ws.workspace_id)
    m = ws.store.read_manifest(ws.workspace_id, head.version) if head.version else None
    out: dict[str, Any] = {"version": head.version, "conflicts": list(conflicts),
                           "files": [{"path": e.path, "size": e.size, "hash": e.hash} for e in (m.files if m else ())],
                           "pending": [], "worker": None}
    if orch.lifecycle().state == L.ACTIVE:
        try:
            w = orch.client().files()
            out["pending"], out["worker"] = w.get("pending", []), w
        except PortableError as exc:
            out["worker"] = {"error": exc.one_line()}
    return out


def machines_view(manifest: Manifest | None, *, current: str | None, current_spend: float | None,
                  now: datetime, current_source: str = "estimate") -> list[dict[str, Any]]:
    """Every allocation of the workspace (each one's newest record), newest first: the GPU,
    where, when it started and stopped, why it stopped and what it cost, and where that figure
    comes from (``cost_source``: bill, provider-rate or estimate). An active machine's cost is
    ``current_spend`` (from ``current_source``) when it is the current one, else price x time to ``now``."""
    from jupyter_portable.orchestration.budget import closed_source

    out = []
    for a in history_records(manifest):
        price = float(a.get("price_per_hour") or 0.0)
        cost = float(a.get("spend") or 0.0)
        source = closed_source(a)
        if a.get("state") == "active":
            source = "estimate"
            if a.get("allocation_id") == current and current_spend is not None:
                cost, source = current_spend, current_source
            else:
                t0 = parse_iso_or_none(a.get("started"))
                cost = spend_of(price, t0, None, now) if t0 else cost
        out.append({"allocation_id": a.get("allocation_id"), "provider": a.get("provider"), "offer": a.get("offer"),
                    "gpu": a.get("gpu"), "region": a.get("region"), "price_per_hour": price or None,
                    "state": a.get("state") or "unknown", "started": a.get("started"), "stopped": a.get("stopped"),
                    "reason": a.get("stop_reason"), "cost": round(cost, 4), "cost_source": source,
                    "current": a.get("allocation_id") == current})
    out.sort(key=lambda m: (parse_iso_or_none(m["started"]) or now, m["stopped"] or "~"), reverse=True)
    return out


def environment_view(lc: L.Lifecycle, record: dict[str, Any]) -> dict[str, Any] | None:
    """The machine's environment as READY reported it (else as its record keeps it): its Python and
    each difference from the lockfile."""
    from jupyter_portable.core.envplan import check_record
    from jupyter_portable.core.envplan import record as env_record

    for ev in reversed(lc.events):
        env = (ev.detail or {}).get("environment")
        if ev.state == L.READY and ev.allocation_id == record.get("allocation_id") and isinstance(env, dict):
            try:
                return check_record(env_record(env), str(record.get("allocation_id")))
            except PortableError:
                return None
    kept = record.get("environment")
    return kept if isinstance(kept, dict) else None


def estimate_view(lc: L.Lifecycle, record: dict[str, Any]) -> dict[str, Any] | None:
    """What the allocation's route predicted and, once it was Ready, what was measured: from its
    READY event (where the orchestrator keeps it until the record closes), else its record."""
    predicted, measured = record.get("predicted"), record.get("measured")
    for ev in reversed(lc.events):
        estimate = (ev.detail or {}).get("estimate")
        if ev.state == L.READY and ev.allocation_id == record.get("allocation_id") and isinstance(estimate, dict):
            predicted = estimate.get("predicted") or predicted
            measured = measured or estimate.get("measured")
            break
    if not isinstance(predicted, dict):
        return None
    return {"predicted": predicted, "measured": measured if isinstance(measured, dict) else None}


class StateView:
    """The sidebar's state for one workspace, rebuilt only when it changed."""

    def __init__(self, ws: Workspace, orchestrator: Callable[[], Orchestrator], *, refresh_s: float = 15.0,
                 clock: Callable[[], datetime] = utcnow, calendar: Callable[[], datetime] | None = None) -> None:
        self.ws = ws
        self.orchestrator = orchestrator
        self.refresh_s = refresh_s
        self.clock = clock
        self.calendar = calendar or clock  # the calendar's clock (c.Portable.now): which bookings hold money
        self.generation = 0  # bumped by invalidate(): the settings or the bookings changed
        self.builds = 0  # how many times the state was built (not served from the cache)
        # the server's orphan sweep (orchestration.machines.OrphanSweep.view), None where none runs
        self.orphans: Callable[[], dict[str, Any] | None] | None = None
        self._cached: tuple[tuple[Any, ...], datetime, dict[str, Any]] | None = None

    def invalidate(self) -> None:
        """Build the state again at the next ask: the workspace's settings or bookings changed."""
        self.generation += 1

    def state(self, *, continuing: bool, conflicts: list[dict[str, Any]]) -> dict[str, Any]:
        """The state (docs/api.md, "State"), from the cache while nothing it shows has changed."""
        now = self.clock()
        orch = self.orchestrator()
        lc = orch.lifecycle()
        head, _ = self.ws.store.read_head(self.ws.workspace_id)
        key = (lc.state, lc.updated, lc.allocation_id, lc.version, lc.verified, lc.epoch, len(lc.events),
               head.version, head.manifest, head.epoch, continuing, len(conflicts),
               tuple(sorted((k, v.spend) for k, v in orch.observed.items())), self.generation,
               json_key(orch.unreachable()))
        orphans = self.orphans() if self.orphans is not None else None
        if self._cached is not None:
            old_key, built_at, answer = self._cached
            if old_key == key and (now - built_at).total_seconds() < self.refresh_s:
                return {**answer, "orphans": orphans, "checkpoints_in_flight": self._in_flight(orch, lc, now, answer)}
        answer = self._build(orch, lc, now, continuing=continuing, conflicts=conflicts)
        self._cached = (key, now, answer)
        self.builds += 1
        return {**answer, "orphans": orphans, "checkpoints_in_flight": self._in_flight(orch, lc, now, answer)}

    def _in_flight(self, orch: Orchestrator, lc: L.Lifecycle, now: datetime,
                   answer: dict[str, Any] | None) -> list[dict[str, Any]]:
        # never from the cache: each ask reads the records (a few small files) and what the worker said
        checkpoints = answer["checkpoints"] if answer is not None else \
            [checkpoint_view(r) for r in records(head_manifest(self.ws))]
        return checkpoints_in_flight_view(self.ws, orch.heard, lc, now, checkpoints)

    def checkpoints_in_flight(self) -> list[dict[str, Any]]:
        """The state's ``checkpoints_in_flight`` now (the server's check tells the sidebar when they move)."""
        orch = self.orchestrator()
        return self._in_flight(orch, orch.lifecycle(), self.clock(),
                               self._cached[2] if self._cached is not None else None)

    def spend_cents(self, orch: Orchestrator, allocation_id: str | None) -> int | None:
        """The running machine's spend now, in cents, by the rule the state's budget prices it with
        (:func:`~jupyter_portable.core.spend.spend_of`: the provider's last figure, else price x time),
        from the last state built; None before one was built for that machine."""
        machine = self._cached[2].get("allocation") if self._cached is not None else None
        if not machine or machine.get("allocation_id") != allocation_id or machine.get("price_per_hour") is None:
            return None
        now = self.clock()
        seen = orch.observed.get(allocation_id or "")
        started = parse_iso_or_none(machine.get("started")) or now
        return round(100 * spend_of(float(machine["price_per_hour"]), started, None, now,
                                    seen.spend if seen else None))

    def _build(self, orch: Orchestrator, lc: L.Lifecycle, now: datetime, *, continuing: bool,
               conflicts: list[dict[str, Any]]) -> dict[str, Any]:
        ws = self.ws
        manifest = head_manifest(ws)
        observed = orch.observed
        allocation = None
        history = list(manifest.allocations) if manifest else []
        if lc.allocation_id and lc.state in _WITH_MACHINE:
            rec = next((a for a in reversed(history) if a.get("allocation_id") == lc.allocation_id), None)
            if rec is not None:
                started = rec.get("started")
                t0 = parse_iso_or_none(started)
                uptime = max(0.0, (now - t0).total_seconds()) if t0 else None
                price = float(rec.get("price_per_hour") or 0.0)
                seen = observed.get(lc.allocation_id)
                spend = spend_of(price, t0 or now, None, now, seen.spend if seen else None)
                allocation = {"allocation_id": lc.allocation_id, "provider": rec.get("provider"),
                              "offer": rec.get("offer"), "gpu": rec.get("gpu"), "region": rec.get("region"),
                              "driver": rec.get("driver"), "price_per_hour": price, "spend": round(spend, 4),
                              "started": started, "uptime_s": uptime, "estimate": estimate_view(lc, rec),
                              "environment": environment_view(lc, rec), **job_end_view(ws, lc.allocation_id)}
        if allocation is None and lc.allocation_id and lc.state in L.CONTINUE_STATES:
            # the machine being launched: what is known of it so far
            from jupyter_portable.worker.client import load_allocation

            launched = load_allocation(ws.copy, lc.allocation_id)
            allocation = {"allocation_id": lc.allocation_id, "launching": True,
                          "provider": launched.provider if launched else None,
                          "offer": launched.offer_id if launched else None, "gpu": None, "region": None,
                          "driver": None, "price_per_hour": None, "spend": None, "started": None, "uptime_s": None}
        lost = None
        if lc.state == L.LOST:
            ev = lc.events[-1]
            lost = {"reason": ev.reason, "at": ev.at, "allocation_id": ev.allocation_id}
        estimated = 0.0  # the part of the spend that is an estimate (the spend line says so)
        try:
            budget = budget_report(ws, now=now, manifest=manifest, calendar_now=self.calendar(),
                                   figure=observed_figure(orch))
            budget_view = {"spent": budget.get("spent"), "committed": budget.get("committed"),
                           "cap": budget.get("total"), "left": budget.get("left"),
                           "state": budget.get("state"), "message": budget.get("message")}
            estimated = float(budget.get("estimated") or 0.0)
        except PortableError as exc:
            budget_view = {"state": "unknown", "message": exc.one_line()}
        current_spend = allocation.get("spend") if allocation and lc.state in _WITH_MACHINE else None
        seen = observed.get(lc.allocation_id or "")
        machines = machines_view(manifest, current=lc.allocation_id if current_spend is not None else None,
                                 current_spend=current_spend, now=now,
                                 current_source=spend_source(seen.spend_source) if seen and seen.spend is not None
                                 else "estimate")
        total = budget_view.get("spent")
        if not isinstance(total, (int, float)):
            total = sum(m["cost"] for m in machines)
        spend_view: dict[str, Any] = {"total": round(float(total), 4), "current": current_spend,
                 "before": round(max(0.0, float(total) - (current_spend or 0.0)), 4),
                 "text": spend_line(float(total), current_spend, estimated)}
        return {
            "workspace": {"id": ws.workspace_id, "name": ws.root.name, "store": ws.config.store,
                          "path": str(ws.root)},
            "lifecycle": {"state": lc.state, "allocation_id": lc.allocation_id, "route": lc.route,
                          "version": lc.version, "verified": lc.verified, "epoch": lc.epoch, "updated": lc.updated,
                          "attempts": list(lc.attempts), "events": [e.to_json() for e in lc.events[-50:]],
                          # the words `jupyter portable state` says, from the same table (core/state_words.py)
                          **lifecycle_words(lc, manifest.version if manifest is not None else None, machines)},
            "allocation": allocation, "lost": lost, "continuing": continuing,
            # the machine no path reaches now (core/reachability.py): shown, nothing released
            "unreachable": orch.unreachable() if lc.state in (L.ACTIVE, L.READY) else None,
            "can_continue": not continuing and lc.state in L.CONTINUE_FROM,
            "can_cancel": continuing,
            "snapshot": None if manifest is None else {"version": manifest.version, "created": manifest.created,
                                                       "files": len(manifest.files), "bytes": manifest.total_bytes,
                                                       "message": manifest.message},
            "checkpoints": [checkpoint_view(r) for r in records(manifest)], "budget": budget_view,
            "conflicts": list(conflicts), "machines": machines, "spend": spend_view,
            "states": state_words.table(),
        }


def lifecycle_words(lc: L.Lifecycle, head_version: int | None, machines: list[dict[str, Any]]) -> dict[str, Any]:
    """The state's line, the version the workspace is safe at and the words of a move, as the CLI
    says them: ``{"line", "safe_version", "move"}``."""
    version = state_words.safe_version(lc.version, head_version)
    first = state_words.first_start((e.state for e in lc.events), machines, lc.allocation_id)
    return {"line": state_words.state_line(lc.state, version), "safe_version": version,
            "move": state_words.MOVE_WORDS[first]}


def job_end_view(ws: Workspace, allocation_id: str) -> dict[str, Any]:
    """When the machine ends by itself (a Slurm job's walltime: the sidebar counts down to it) and the
    provider's id of the one queued ahead to take over; empty for a machine that does not end by itself."""
    from jupyter_portable.worker.client import load_allocation

    allocation = load_allocation(ws.copy, allocation_id)
    ends_at = allocation.details.get("ends_at") if allocation is not None else None
    if not isinstance(ends_at, str):
        return {}
    nxt = allocation.details.get("next") if allocation is not None else None
    return {"ends_at": ends_at, "next_job": nxt.get("ref") if isinstance(nxt, dict) else None}


def json_key(value: Any) -> Any:
    """A hashable stand-in for a small JSON value (a cache key's part)."""
    return None if value is None else tuple(sorted(value.items()))


def _observed(status: Any) -> tuple[float | None, str | None] | None:
    """The spend the loss check last saw, with where it came from (measured or estimated)."""
    return None if status is None else (status.spend, status.spend_source)


def observed_figure(orch: Orchestrator) -> Callable[[dict[str, Any]], tuple[float | None, str | None] | None]:
    """An active allocation's spend as the loss check last saw it: what the state and the routes
    both price the budget with, so they show the same figure without asking a provider."""
    observed = orch.observed
    return lambda a: _observed(observed.get(a.get("allocation_id", "")))


__all__ = ["ENDED_SHOWN_S", "StateView", "checkpoint_view", "checkpoints_in_flight_view", "checkpoints_view",
           "environment_view", "estimate_view", "files_view", "head_manifest", "machines_view", "observed_figure"]
