"""Idle autostop: when a machine whose kernel has run nothing and whose GPUs did no work for
N minutes is to be sealed and released, and what the sidebar says about it.

Pure: the worker reports what it saw (its kernel's last execution, whether a cell is running,
the last "Keep running", the GPUs' utilization samples, all as ISO times on its clock) and the
monitor passes them in with ``now``. Machines keep NTP time, so the worker's times are taken
as they are; a time ahead of ``now`` counts as ``now``.

States of a decision::

    off       the workspace's idle_minutes is 0 (or unset where there is no default)
    busy      a cell is running: never idle while the kernel works
    idle      idle since ``idle_since``; sealed and released at ``stop_at``
    warning   as idle, within the last WARN_MINUTES: the sidebar counts down, with "Keep running"
    stop      ``stop_at`` has passed: seal and release now
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jupyter_portable.core.times import parse_iso_or_none, to_iso

DEFAULT_IDLE_MINUTES = 30.0
WARN_MINUTES = 5.0
# nvidia-smi's utilization.gpu: the percent of the last sample period a kernel ran on the GPU.
# A few percent is what a display, a monitoring agent or an idle CUDA context shows.
GPU_BUSY_PERCENT = 5.0
STOP_REASON = "idle"

OFF, BUSY, IDLE, WARNING, STOP = "off", "busy", "idle", "warning", "stop"


def gpu_busy(utilization: float) -> bool:
    """Whether one utilization sample (percent, the busiest GPU's) means the GPU was working."""
    return not math.isnan(utilization) and utilization >= GPU_BUSY_PERCENT


@dataclass(frozen=True)
class IdleDecision:
    """What to do about one machine at ``now``."""

    state: str
    minutes: float
    idle_since: datetime | None = None
    stop_at: datetime | None = None
    remaining_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "minutes": self.minutes,
                "idle_since": to_iso(self.idle_since) if self.idle_since else None,
                "stop_at": to_iso(self.stop_at) if self.stop_at else None,
                "remaining_s": None if self.remaining_s is None else round(self.remaining_s, 1)}


def idle_decision(last_activity: datetime, gpu_samples: Iterable[tuple[datetime, float]], now: datetime,
                  minutes: float | None, *, kernel_busy: bool = False,
                  warn_minutes: float = WARN_MINUTES) -> IdleDecision:
    """The decision at ``now`` for a machine last used at ``last_activity`` (a cell ran or ended,
    the worker became ready, or "Keep running"), with the GPUs' ``(time, utilization %)`` samples.

    The idle clock starts at the later of ``last_activity`` and the last busy GPU sample; the
    machine is stopped ``minutes`` after that (0 or None: never)."""
    if not minutes or minutes <= 0:
        return IdleDecision(OFF, 0.0)
    if kernel_busy:
        return IdleDecision(BUSY, minutes, idle_since=None)
    since = last_activity
    for at, utilization in gpu_samples:
        if gpu_busy(utilization) and at > since:
            since = at
    since = min(since, now)
    stop_at = since + timedelta(minutes=minutes)
    remaining = (stop_at - now).total_seconds()
    if remaining <= 0:
        state = STOP
    elif remaining <= warn_minutes * 60:
        state = WARNING
    else:
        state = IDLE
    return IdleDecision(state, minutes, idle_since=since, stop_at=stop_at, remaining_s=max(0.0, remaining))


@dataclass(frozen=True)
class Activity:
    """What a worker reports of its use (``/status``'s ``activity``), read into times."""

    last_activity: datetime
    kernel_busy: bool
    gpu_samples: tuple[tuple[datetime, float], ...]


def activity_from_status(status: Mapping[str, Any]) -> Activity | None:
    """The activity in a worker's status; None when it reports none (an older worker, or a
    report that does not read), which is never taken for idleness."""
    act = status.get("activity")
    if not isinstance(act, Mapping):
        return None
    times = [parse_iso_or_none(act.get(k)) for k in ("ready_at", "last_execution", "kept_at")]
    known = [t for t in times if t is not None]
    if not known:
        return None
    samples: list[tuple[datetime, float]] = []
    gpu = act.get("gpu")
    raw = list(gpu.get("samples") or []) if isinstance(gpu, Mapping) else []
    if isinstance(gpu, Mapping) and gpu.get("last_busy"):
        raw.append(gpu["last_busy"])
    for item in raw[:256]:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            continue
        at = parse_iso_or_none(item[0])
        value = item[1]
        if at is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        samples.append((at, float(value)))
    return Activity(last_activity=max(known), kernel_busy=act.get("kernel_busy") is True,
                    gpu_samples=tuple(samples))


def idle_stop_message(minutes: float, price_per_hour: float | None) -> str:
    """What the sidebar says after an idle stop: what happened, and what it saves from then on."""
    said = f"Released after {minutes:g} min idle"
    if price_per_hour and price_per_hour > 0:
        return f"{said}; saves about ${price_per_hour:,.2f}/h from now on (the machine's price, no longer billed)"
    return f"{said}; nothing more is billed for it"


__all__ = ["BUSY", "DEFAULT_IDLE_MINUTES", "GPU_BUSY_PERCENT", "IDLE", "OFF", "STOP", "STOP_REASON", "WARNING",
           "WARN_MINUTES", "Activity", "IdleDecision", "activity_from_status", "gpu_busy", "idle_decision",
           "idle_stop_message"]
