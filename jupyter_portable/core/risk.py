"""A route's risk, priced as what a failure costs the researcher: pure code, no clock.

Two things can go wrong on a route, and they cost different amounts:

- the **launch fails** (the market refuses it, the machine never boots, admission refuses
  a wrong driver). It is noticed by the launch itself and the next route is tried: it
  wastes the boot and the transfer.
- the machine is **lost** within the planned hours (preempted, taken back). Then the
  researcher loses the time to notice (the server's own look at the machine,
  ``notice_s``: seconds, not minutes), the time to Continue again (the route's own time to
  Ready) and the work since the last verified checkpoint at the moment of the loss
  (:func:`work_at_risk_s`: from the checkpoint's real age now and the workspace's cadence)::

    p_launch  = launch_failure_rate + what recent failures and refusals add
    p_lost    = (1 - reliability) + what recent preemptions add
    hours     = (p_launch * (boot + transfer) + p_lost * (notice + ready + work)) / 3600
    dollars   = hours * (price_per_hour + value_of_time_per_hour) + p_fail * egress (moved again)

A failed launch does not spare the researcher the next machine's own chance of being lost, so
the two terms add: the risk never falls as either chance rises (``p_fail = 1 - (1 - p_launch)
* (1 - p_lost)``, the chance of either, is what the sidebar shows). What happened to an
offer (:class:`Incident`) adds to its chances at once and fades over
:data:`INCIDENT_WINDOW_S`. An offer preempted :data:`REPEATED_PREEMPTIONS` times or more
within :data:`REPEAT_WINDOW_S` is not the best route while another, with nothing against it in
that window, costs at most :data:`BEST_MARGIN` more (see ``routing.rank_routes``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from jupyter_portable.core.errors import UsageError

RECENT_FAILURE_P = 0.10  # each recent launch failure of this offer adds this to p_launch
DRIVER_MISMATCH_P = 0.25  # each admission refusal (wrong driver) weighs more: it wastes a whole boot
MAX_P_FAIL = 0.95  # never certain: a route that always failed stays a (very dear) route
INCIDENT_WINDOW_S = 2 * 3600.0  # how long what happened to an offer weighs on its risk (fading to nothing)
# What one incident adds at once: a preemption says the market wants the machine back (to
# p_lost); a refused driver wastes a whole boot and will happen again on the same offer (to p_launch).
INCIDENT_P = {"preempted": 0.30, "launch failed": 0.20, "refused": 0.40}
# A loss is seen by the server at its next look at the machine (c.Portable.check_interval_s, 2 s
# by default; the sidebar shows it at once): the time to notice when no one says otherwise.
NOTICE_S = 2.0
STOPPED_CADENCE = 2.0  # a checkpoint older than this many gaps of the cadence: no more are coming
REPEATED_PREEMPTIONS = 2  # preempted this often within REPEAT_WINDOW_S: "preempted repeatedly"
REPEAT_WINDOW_S = 3600.0
BEST_MARGIN = 0.5  # another route at most this much dearer (0.5: 50%) is marked best instead


@dataclass(frozen=True)
class Incident:
    """Something that happened to an offer ``age_s`` seconds ago: ``kind`` is one of
    :data:`INCIDENT_P` ("preempted", "launch failed", "refused")."""

    kind: str
    age_s: float

    def __post_init__(self) -> None:
        if self.kind not in INCIDENT_P:
            raise UsageError(f"incident kind must be one of {', '.join(INCIDENT_P)}, not {self.kind!r}")
        if not (0 <= self.age_s < math.inf):
            raise UsageError(f"incident age_s must be a non-negative number of seconds, not {self.age_s!r}")

    @property
    def weight(self) -> float:
        """What it adds to its chance now: all of it at once, nothing after the window."""
        return INCIDENT_P[self.kind] * max(0.0, 1.0 - self.age_s / INCIDENT_WINDOW_S)

    def words(self) -> str:
        """"preempted 4 min ago"."""
        return f"{self.kind} {duration(self.age_s)} ago" if self.age_s >= 30 else f"{self.kind} just now"


def duration(seconds: float) -> str:
    """"45 s", "12 min", "2.5 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def preemptions_within(incidents: Iterable[Incident], window_s: float = REPEAT_WINDOW_S) -> int:
    """How many of ``incidents`` are preemptions younger than ``window_s``."""
    return sum(1 for i in incidents if i.kind == "preempted" and i.age_s < window_s)


@dataclass(frozen=True)
class Risk:
    """What can go wrong on a route and what it would cost, for the planned hours.

    ``notice_s``, ``again_s`` and ``work_s`` are what one loss of the machine costs: noticing
    it, Continuing again (the route's time to Ready), and redoing the work since the last
    verified checkpoint. ``hours`` is the expected time lost, ``dollars`` its price.
    """

    p_launch: float
    p_lost: float
    launch_s: float
    notice_s: float
    again_s: float
    work_s: float
    hours: float
    dollars: float
    rate: float
    checkpoint_age_s: float | None = None  # the last verified checkpoint's age now; None: there is none
    checkpoint_every_s: float | None = None  # the workspace's usual gap between verified checkpoints

    @property
    def p_fail(self) -> float:
        """The chance of a failed launch or a lost machine within the planned hours."""
        return min(MAX_P_FAIL, 1.0 - (1.0 - self.p_launch) * (1.0 - self.p_lost))

    @property
    def loss_s(self) -> float:
        """What one loss of the machine costs, in seconds of the researcher's time."""
        return self.notice_s + self.again_s + self.work_s

    def to_json(self) -> dict[str, float | None]:
        return {"p_launch": round(self.p_launch, 4), "p_lost": round(self.p_lost, 4),
                "launch_s": round(self.launch_s, 1), "notice_s": round(self.notice_s, 1),
                "again_s": round(self.again_s, 1), "work_s": round(self.work_s, 1),
                "hours": round(self.hours, 4), "rate": round(self.rate, 4),
                "checkpoint_age_s": None if self.checkpoint_age_s is None else round(self.checkpoint_age_s, 1),
                "checkpoint_every_s": None if self.checkpoint_every_s is None else round(self.checkpoint_every_s, 1)}


def work_at_risk_s(planned_s: float, every_s: float | None, age_s: float | None) -> float:
    """The work since the last verified checkpoint that a loss at a random moment of the next
    ``planned_s`` seconds throws away, on average.

    The checkpoint is ``age_s`` old now and grows older until the next one, which comes
    ``every_s`` after it (the workspace's cadence); with no cadence, or a checkpoint older than
    :data:`STOPPED_CADENCE` gaps of it, none is expected and the age grows all along. With no
    verified checkpoint at all, what the machine did since it started: half the planned time.
    """
    if planned_s <= 0:
        return 0.0
    if age_s is None:
        return (planned_s if every_s is None else min(every_s, planned_s)) / 2
    if every_s is None or age_s > STOPPED_CADENCE * every_s:
        return age_s + planned_s / 2
    # the mean over t in [0, planned) of the age at t: a + t until the next checkpoint, then a sawtooth
    first = min(planned_s, max(0.0, every_s - age_s))
    area = age_s * first + first * first / 2
    rest = planned_s - first
    cycles, tail = divmod(rest, every_s)
    area += cycles * every_s * every_s / 2 + tail * tail / 2
    return area / planned_s


def price_risk(*, reliability: float, launch_failure_rate: float, failures: int, mismatches: int,
               incidents: tuple[Incident, ...], hours: float, boot_s: float, transfer_s: float, ready_s: float,
               checkpoint_every_s: float | None, rate: float, egress: float,
               checkpoint_age_s: float | None = None, notice_s: float = NOTICE_S) -> Risk:
    """A route's risk (see the module docstring); ``rate`` is what an hour lost costs ($/h)."""
    launch_incidents = sum(i.weight for i in incidents if i.kind != "preempted")
    lost_incidents = sum(i.weight for i in incidents if i.kind == "preempted")
    p_launch = min(MAX_P_FAIL, launch_failure_rate + RECENT_FAILURE_P * failures
                   + DRIVER_MISMATCH_P * mismatches + launch_incidents)
    p_lost = min(MAX_P_FAIL, (1.0 - reliability) + lost_incidents)
    launch_s = boot_s + transfer_s
    work_s = work_at_risk_s(hours * 3600, checkpoint_every_s, checkpoint_age_s)
    lost_s = p_launch * launch_s + p_lost * (notice_s + ready_s + work_s)
    p_fail = min(MAX_P_FAIL, 1.0 - (1.0 - p_launch) * (1.0 - p_lost))
    dollars = lost_s / 3600 * rate + p_fail * egress
    return Risk(p_launch=p_launch, p_lost=p_lost, launch_s=launch_s, notice_s=notice_s, again_s=ready_s,
                work_s=work_s, hours=lost_s / 3600, dollars=dollars, rate=rate, checkpoint_age_s=checkpoint_age_s,
                checkpoint_every_s=checkpoint_every_s)


def hours_words(hours: float) -> str:
    """"0.4 h", "<0.1 h": time lost, in the sidebar's rounding."""
    return "<0.1 h" if 0 < hours < 0.05 else f"{hours:.1f} h"


__all__ = [
    "BEST_MARGIN",
    "DRIVER_MISMATCH_P",
    "INCIDENT_P",
    "INCIDENT_WINDOW_S",
    "Incident",
    "MAX_P_FAIL",
    "NOTICE_S",
    "RECENT_FAILURE_P",
    "REPEATED_PREEMPTIONS",
    "REPEAT_WINDOW_S",
    "Risk",
    "STOPPED_CADENCE",
    "duration",
    "hours_words",
    "preemptions_within",
    "price_risk",
    "work_at_risk_s",
]
