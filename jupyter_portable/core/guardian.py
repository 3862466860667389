"""The guardian on the machine (invariant 12): what the worker does about its own machine while the
user side (the Jupyter server on a laptop that may sleep) is away, decided here without I/O.

The worker gets a :class:`GuardianPolicy` when it starts: the workspace's idle minutes, the money
left in its budget, the machine's hourly price, the grace after which a silent user side counts as
absent, and the means its provider gives a machine to end its own billing (:data:`MEANS`). While
the user side is present the guardian does nothing: the user side decides (``orchestration/idle``,
``orchestration/budget``). Once it has been absent past the grace:

    busy      a cell runs or the GPU works: the run goes on, whatever the clock says
    waiting   idle, or out of money, not long enough yet
    stop      idle for the idle window, or the money left is spent at the known price (at the first
              idle moment): publish a final version, read it back, record why, end the billing

The record the worker leaves in the workspace's allocation history (``released_by``) is what the
user side reads when it comes back (:func:`release_words`).

Which providers give a machine the means to stop itself::

    runpod     the pod-scoped key every pod carries (RUNPOD_API_KEY, RUNPOD_POD_ID): stop this pod
    vastai     the instance's own key, where its environment has one (CONTAINER_API_KEY, CONTAINER_ID)
    aws        a shutdown from the machine; launched with InstanceInitiatedShutdownBehavior=terminate
    gcp        a shutdown from the machine: the VM stops, its boot disk still bills
    others     none (Lambda, ssh hosts, Slurm, the local market): nothing on the machine can stop it
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_portable.core.errors import ManifestError, UsageError
from jupyter_portable.core.idle import Activity, gpu_busy, idle_decision
from jupyter_portable.core.times import parse_iso, to_iso
from jupyter_portable.core.validate import check_number

DEFAULT_ABSENT_GRACE_S = 600.0  # ten minutes of silence from the user side: a laptop asleep, not a blip
IDLE_NIGHT_HOURS = 12.0
_FOREVER_MIN = 1e9  # what "one idle night" costs in a route's words

POD_KEY, INSTANCE_KEY, SHUTDOWN_TERMINATE, SHUTDOWN_STOP = "pod-key", "instance-key", "shutdown-terminate", "shutdown"
MEANS: dict[str, str] = {"runpod": POD_KEY, "vastai": INSTANCE_KEY, "aws": SHUTDOWN_TERMINATE, "gcp": SHUTDOWN_STOP}
# what still bills once the machine ended its billing by that means
STILL_BILLS: dict[str, str] = {
    POD_KEY: "the stopped pod's disk, until you come back and it is removed",
    INSTANCE_KEY: "the stopped instance's disk, until you come back and it is destroyed",
    SHUTDOWN_TERMINATE: "nothing (the instance terminates)",
    SHUTDOWN_STOP: "the stopped VM's boot disk, until you come back and it is deleted",
}

ENDS_ANYWAY = ("local", "slurm")
OFF, PRESENT, BUSY, WAITING, STOP = "off", "present", "busy", "waiting", "stop"
REASONS = ("idle", "budget")


def means_for(provider: str) -> str | None:
    """How a machine of ``provider`` ends its own billing, or None where nothing on it can."""
    return MEANS.get(provider)


def no_self_stop_words(provider: str, price_per_hour: float | None) -> str | None:
    """What a route of a provider without self-stop says before it is rented (None where it has one, and
    where something else ends the machine: the local market's machines end with this computer, a Slurm
    job with its walltime)."""
    if means_for(provider) is not None or provider in ENDS_ANYWAY:
        return None
    night = (f": one idle night ({IDLE_NIGHT_HOURS:g} h) costs about ${price_per_hour * IDLE_NIGHT_HOURS:,.2f}"
             if price_per_hour and price_per_hour > 0 else "")
    return f"if this laptop sleeps, nothing can stop this machine{night}"


@dataclass(frozen=True)
class GuardianPolicy:
    """What the worker is told when it starts (``"guardian"`` in its configuration)."""

    provider: str
    means: str | None
    idle_minutes: float
    absent_grace_s: float = DEFAULT_ABSENT_GRACE_S
    budget_left: float | None = None  # money left when the machine started; None: no cap
    price_per_hour: float | None = None
    api_url: str | None = None  # the provider's API, for a key-based means (a proxy, or a twin in tests)
    started: str | None = None  # when the budget's clock started (ISO); None: when the worker started

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "means": self.means, "idle_minutes": self.idle_minutes,
                "absent_grace_s": self.absent_grace_s, "budget_left": self.budget_left,
                "price_per_hour": self.price_per_hour, "api_url": self.api_url, "started": self.started}

    @classmethod
    def from_json(cls, obj: object) -> GuardianPolicy:
        """The policy in a worker's configuration, checked (UsageError naming the field)."""
        if not isinstance(obj, Mapping):
            raise UsageError("guardian must be an object")
        extra = set(obj) - {"provider", "means", "idle_minutes", "absent_grace_s", "budget_left", "price_per_hour",
                            "api_url", "started"}
        if extra:
            raise UsageError(f"guardian has unknown field(s) {', '.join(sorted(extra))}")
        provider = obj.get("provider")
        if not isinstance(provider, str) or not provider:
            raise UsageError("guardian.provider must be a provider's name")
        means = obj.get("means")
        if means is not None and means not in STILL_BILLS:
            raise UsageError(f"guardian.means must be one of {', '.join(sorted(STILL_BILLS))} or null, got {means!r}")

        def number(key: str, *, optional: bool, default: float | None = None) -> float | None:
            value = obj.get(key, default)
            if value is None and optional:
                return None
            return float(check_number(value, f"guardian.{key}", minimum=0.0, error=UsageError))

        api_url = obj.get("api_url")
        if api_url is not None and (not isinstance(api_url, str) or not api_url.startswith(("http://", "https://"))):
            raise UsageError("guardian.api_url must be an http(s) URL")
        started = obj.get("started")
        if started is not None:
            parse_iso(started, "guardian.started")
        return cls(provider=provider, means=means, idle_minutes=number("idle_minutes", optional=False) or 0.0,
                   absent_grace_s=number("absent_grace_s", optional=False, default=DEFAULT_ABSENT_GRACE_S) or 0.0,
                   budget_left=number("budget_left", optional=True), price_per_hour=number("price_per_hour",
                                                                                           optional=True),
                   api_url=api_url, started=started)


@dataclass(frozen=True)
class GuardianDecision:
    state: str
    reason: str | None = None  # for stop: "idle" or "budget"
    absent_since: datetime | None = None
    idle_since: datetime | None = None
    spent: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason,
                "absent_since": to_iso(self.absent_since) if self.absent_since else None,
                "idle_since": to_iso(self.idle_since) if self.idle_since else None,
                "spent": None if self.spent is None else round(self.spent, 6)}


def decide(policy: GuardianPolicy, *, now: datetime, started: datetime, user_seen: datetime | None,
           activity: Activity | None) -> GuardianDecision:
    """What the guardian does at ``now``. ``started``: when the budget's clock started (the policy's
    own ``started`` wins); ``user_seen``: the user side's last request (None: never, which counts
    from ``started``); ``activity``: the worker's record of its use (None: not ready yet)."""
    if policy.means is None:
        return GuardianDecision(OFF)
    last_seen = user_seen or started
    if (now - last_seen).total_seconds() < policy.absent_grace_s:
        return GuardianDecision(PRESENT)
    absent = last_seen
    if activity is None:
        return GuardianDecision(WAITING, absent_since=absent)
    if activity.kernel_busy:
        return GuardianDecision(BUSY, absent_since=absent)
    clock_from = parse_iso(policy.started, "guardian.started") if policy.started else started
    spent = None
    if policy.price_per_hour is not None:
        spent = policy.price_per_hour * max(0.0, (now - clock_from).total_seconds()) / 3600
    # the idle clock starts at the later of the last use and the last busy GPU sample (core.idle's rule)
    idle_since = idle_decision(activity.last_activity, activity.gpu_samples, now, _FOREVER_MIN).idle_since or now
    latest = max(activity.gpu_samples, default=None, key=lambda s: s[0])
    gpu_working = latest is not None and gpu_busy(latest[1])
    if gpu_working:
        return GuardianDecision(BUSY, absent_since=absent, spent=spent)
    if policy.budget_left is not None and spent is not None and spent >= policy.budget_left:
        # out of money: stopped at the first moment the run is not working
        return GuardianDecision(STOP, "budget", absent_since=absent, idle_since=idle_since, spent=spent)
    if policy.idle_minutes > 0 and (now - idle_since).total_seconds() >= policy.idle_minutes * 60:
        return GuardianDecision(STOP, "idle", absent_since=absent, idle_since=idle_since, spent=spent)
    return GuardianDecision(WAITING, absent_since=absent, idle_since=idle_since, spent=spent)


# -- the record the machine leaves ------------------------------------------------------------------

RELEASE_FIELDS = {"by", "reason", "at", "version", "idle_minutes", "idle_since", "absent_since", "means",
                  "still_bills", "spent", "error"}


def release_record(decision: GuardianDecision, policy: GuardianPolicy, *, at: datetime, version: int,
                   error: str | None = None) -> dict[str, Any]:
    """The allocation record's ``released_by`` for a guardian's stop."""
    return check_release({
        "by": "machine", "reason": decision.reason or "idle", "at": to_iso(at), "version": version,
        "idle_minutes": policy.idle_minutes,
        "idle_since": to_iso(decision.idle_since) if decision.idle_since else None,
        "absent_since": to_iso(decision.absent_since) if decision.absent_since else None,
        "means": policy.means, "still_bills": STILL_BILLS.get(policy.means or ""),
        "spent": None if decision.spent is None else round(decision.spent, 6), "error": error})


def check_release(obj: object) -> dict[str, Any]:
    """A ``released_by`` record, checked (ManifestError: it is read from the store)."""
    if not isinstance(obj, dict):
        raise ManifestError("released_by must be an object")
    extra = set(obj) - RELEASE_FIELDS
    if extra:
        raise ManifestError(f"released_by has unknown field(s) {', '.join(sorted(extra))}")
    if obj.get("by") != "machine":
        raise ManifestError("released_by.by must be 'machine'")
    if obj.get("reason") not in REASONS:
        raise ManifestError(f"released_by.reason must be one of {', '.join(REASONS)}")
    parse_iso(obj.get("at"), "released_by.at", error=ManifestError)
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ManifestError("released_by.version must be a version number")
    for key in ("idle_since", "absent_since"):
        if obj.get(key) is not None:
            parse_iso(obj[key], f"released_by.{key}", error=ManifestError)
    for key in ("idle_minutes", "spent"):
        if obj.get(key) is not None:
            check_number(obj[key], f"released_by.{key}", minimum=0.0)
    for key in ("means", "still_bills", "error"):
        if obj.get(key) is not None and (not isinstance(obj[key], str) or len(obj[key]) > 2000):
            raise ManifestError(f"released_by.{key} must be text")
    return obj


def release_words(record: Mapping[str, Any]) -> str:
    """What the user side says when it comes back: "Released at 03:12 after 30 min idle while you were
    away; saved as version 41" (times in UTC, as the state's other lines)."""
    at = parse_iso(record.get("at"), "released_by.at", error=ManifestError)
    when = at.strftime("%H:%M") + "Z"
    if record.get("reason") == "budget":
        why = "when the budget ran out"
    else:
        why = f"after {float(record.get('idle_minutes') or 0):g} min idle"
    said = f"Released at {when} {why} while you were away; saved as version {record.get('version')}"
    if record.get("error"):
        said += f" (the machine could not end its own billing: {record['error']})"
    elif record.get("still_bills") and not str(record["still_bills"]).startswith("nothing"):
        said += f"; still billed: {record['still_bills']}"
    return said


__all__ = ["BUSY", "DEFAULT_ABSENT_GRACE_S", "ENDS_ANYWAY", "IDLE_NIGHT_HOURS", "INSTANCE_KEY", "MEANS", "OFF",
           "POD_KEY", "PRESENT", "REASONS", "SHUTDOWN_STOP", "SHUTDOWN_TERMINATE", "STILL_BILLS", "STOP", "WAITING",
           "GuardianDecision", "GuardianPolicy", "check_release", "decide", "means_for", "no_self_stop_words",
           "release_record", "release_words"]
