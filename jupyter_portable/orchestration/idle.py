"""Idle autostop on the user's side: the monitor's check of the active machine's use, "Keep
running", the stop itself (sealed and released with the reason "idle"), and what the sidebar
and a kernel start say afterwards.

The decision is ``core.idle``'s; this module feeds it the worker's report and the workspace's
``idle_minutes``, with ``now`` passed in (the server's tick passes the clock's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ConflictError
from jupyter_portable.core.idle import (
    STOP,
    STOP_REASON,
    WARN_MINUTES,
    WARNING,
    IdleDecision,
    activity_from_status,
    idle_decision,
    idle_stop_message,
)
from jupyter_portable.core.times import to_iso, utcnow
from jupyter_portable.engine.workspace import Workspace
from jupyter_portable.orchestration.orchestrator import Orchestrator

SETTINGS_TTL = timedelta(seconds=30)  # idle_minutes is read from the store at most this often
Notice = Callable[[str, str], None]


def idle_release(lc: L.Lifecycle) -> dict[str, Any] | None:
    """How the last allocation ended, when it was an idle stop: the DRAINING event's reason and
    detail (minutes, price, when idle began), the time and the route; None otherwise."""
    if lc.state != L.RELEASED:
        return None
    drain = next((e for e in reversed(lc.events) if e.state == L.DRAINING), None)
    if drain is None or drain.allocation_id != lc.allocation_id:
        return None
    detail = dict(drain.detail or {})
    by_machine = detail.get("by") == "machine"  # the machine released itself while this side was away
    if drain.reason != STOP_REASON and not by_machine:
        return None
    released = next((e for e in reversed(lc.events) if e.state == L.RELEASED), None)
    minutes = float(detail.get("idle_minutes") or 0)
    price = detail.get("price_per_hour")
    price = float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) else None
    return {"allocation_id": lc.allocation_id, "route": lc.route, "minutes": minutes,
            "at": released.at if released else drain.at, "idle_since": detail.get("idle_since"),
            "saved_per_hour": price, "message": str(detail["message"]) if by_machine and detail.get("message") else
            idle_stop_message(minutes, price)}


def no_machine_hint(lc: L.Lifecycle) -> tuple[str, str] | None:
    """For a kernel start on a workspace released as idle: why there is no machine, and how to
    continue (on the same route); None for any other state."""
    rel = idle_release(lc)
    if rel is None:
        return None
    # the server shows a failed kernel start's message alone, so the way on is in it too
    if rel["route"]:
        how = (f"press Continue in the portable sidebar to continue on the same route {rel['route']} (if it is "
               f"still open), or run `jupyter portable continue --route {rel['route']}`")
    else:
        how = "press Continue in the portable sidebar, or run `jupyter portable continue`"
    return f"{rel['allocation_id']} was sealed and released after {rel['minutes']:g} min idle; {how}", how


@dataclass(frozen=True)
class Seen:
    allocation_id: str
    decision: IdleDecision
    at: datetime


class IdleWatch:
    """One per server: the last decision (for the sidebar) and the stop when it says so."""

    def __init__(self, ws: Workspace, orchestrator: Callable[[], Orchestrator], *, notice: Notice | None = None,
                 clock: Callable[[], datetime] = utcnow, restarted: Callable[[], None] | None = None) -> None:
        self.ws = ws
        self.orchestrator = orchestrator
        self.notice = notice
        self.clock = clock
        self.restarted = restarted  # told when a new idle_minutes started the countdown again
        self.seen: Seen | None = None
        self._minutes: tuple[float, datetime] | None = None
        # (allocation, idle_minutes) the countdown runs on, and when a change of the setting restarted it
        self._counting: tuple[str, float] | None = None
        self._restart_at: datetime | None = None
        self._lock = threading.Lock()

    def settings_changed(self) -> None:
        self._minutes = None

    def minutes(self, now: datetime) -> float:
        from jupyter_portable.orchestration.settings import load_settings

        if self._minutes is None or not (self._minutes[1] <= now < self._minutes[1] + SETTINGS_TTL):
            self._minutes = (load_settings(self.ws).idle_minutes, now)
        return self._minutes[0]

    def check(self, now: datetime | None = None) -> IdleDecision | None:
        """Look at the active machine's use at ``now``; seal and release it (reason "idle") when
        it has been idle for the workspace's idle_minutes. The decision, or None without a machine
        or a report."""
        now = now or self.clock()
        with self._lock:
            orch = self.orchestrator()
            lc = orch.lifecycle()
            if lc.state != L.ACTIVE or not lc.allocation_id:
                self.seen = None
                return None
            aid = lc.allocation_id
            minutes = self.minutes(now)
            restarted = self._count_on(aid, minutes, now)
            activity = activity_from_status(orch.client(aid).status(timeout=5))
            if activity is None:
                self.seen = None
                return None
            # a change of idle_minutes counts from when it was seen, as "Keep running" would: a
            # lower setting never stops a machine already idle that long without a countdown
            since = max(activity.last_activity, self._restart_at) if self._restart_at else activity.last_activity
            d = idle_decision(since, activity.gpu_samples, now, minutes, kernel_busy=activity.kernel_busy)
            before = self.seen.decision.state if self.seen and self.seen.allocation_id == aid else None
            self.seen = Seen(aid, d, now)
        if restarted and self.restarted is not None:
            self.restarted()
        if d.state == WARNING and before != WARNING and self.notice is not None:
            left = int(d.remaining_s or 0)
            self.notice("idle", f"No cell has run and the GPU has been idle: {aid} will be sealed and released in "
                                f"{left // 60}:{left % 60:02d} unless you press Keep running")
        if d.state == STOP:
            self._stop(orch, aid, d)
        return d

    def _stop(self, orch: Orchestrator, aid: str, d: IdleDecision) -> None:
        from jupyter_portable.orchestration.state_view import head_manifest

        m = head_manifest(self.ws)
        history = list(m.allocations) if m else []
        rec: dict[str, Any] = next((a for a in reversed(history) if a.get("allocation_id") == aid), {})
        price = rec.get("price_per_hour")
        detail = {"idle_minutes": d.minutes, "idle_since": to_iso(d.idle_since) if d.idle_since else None,
                  "price_per_hour": float(price) if isinstance(price, (int, float)) else None}
        try:
            orch.stop(STOP_REASON, detail=detail, allocation_id=aid)
        except ConflictError:
            return  # a Continue, a Stop or another server got there first
        if self.notice is not None:
            rel = idle_release(orch.lifecycle())
            if rel is not None:
                self.notice("idle", rel["message"])

    def _count_on(self, aid: str, minutes: float, now: datetime) -> bool:
        """Note the idle_minutes the countdown of ``aid`` runs on; True when the setting changed
        while this machine ran (the countdown starts again at ``now``)."""
        before = self._counting
        self._counting = (aid, minutes)
        if before is None or before[0] != aid:
            self._restart_at = None  # a new machine counts from its own activity
            return False
        if before[1] != minutes:
            self._restart_at = now
            return True
        return False

    def keep_running(self) -> dict[str, Any]:
        """"Keep running": the idle clock of the active machine starts again now."""
        orch = self.orchestrator()
        lc = orch.lifecycle()
        if lc.state != L.ACTIVE or not lc.allocation_id:
            raise ConflictError(f"no machine is running (the workspace is {lc.state})",
                                hint="press Continue to start one")
        kept = orch.client(lc.allocation_id).keep_running()
        self.check()
        return {"kept_at": kept.get("kept_at"), "idle": self.view(lc)}

    def view(self, lc: L.Lifecycle, now: datetime | None = None) -> dict[str, Any] | None:
        """The state's ``idle``: the countdown while a machine is active, or what an idle stop did."""
        now = now or self.clock()
        rel = idle_release(lc)
        if rel is not None:
            return {"state": "released", "minutes": rel["minutes"], "idle_since": rel["idle_since"], "stop_at": None,
                    "remaining_s": None, "warn_s": WARN_MINUTES * 60, "released": rel}
        seen = self.seen
        if lc.state != L.ACTIVE or seen is None or seen.allocation_id != lc.allocation_id:
            return None
        out = {**seen.decision.to_json(), "warn_s": WARN_MINUTES * 60, "released": None}
        if seen.decision.stop_at is not None:
            out["remaining_s"] = round(max(0.0, (seen.decision.stop_at - now).total_seconds()), 1)
        return out


__all__ = ["IdleWatch", "idle_release", "no_machine_hint"]
