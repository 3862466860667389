"""When a machine that stopped answering is lost: one rule for every provider (invariant 12).

A machine is LOST only on evidence: its provider says it is gone (terminated, stopped,
preempted, restarted without its GPUs), or no path has reached it (neither the worker's
heartbeat nor SSH) for longer than the grace period *and* the provider cannot say it runs.
Until then it is UNREACHABLE since the first silent check: shown, never released, and a
heartbeat that comes back resumes it with nothing lost. A blip on the laptop's network, an SSH
error in one status call, Vast's ``unknown`` ("no recent heartbeat from the host") are not
evidence.

Pure: the provider's answer, whether a path reached the machine, when the silence began and
``now`` are passed in; ``Orchestrator.check`` gathers them and acts on the :class:`Decision`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

# What the provider answered, in three words (``provider_answer`` maps a status to one)
RUNNING = "running"      # it says the machine runs (pending, running, reachable)
GONE = "gone"            # it says the machine is gone: terminated, stopped, preempted, restarted without GPUs
CANNOT_SAY = "cannot-say"  # no answer (an error, a timeout), or one that says nothing (Vast unknown/offline)
ANSWERS = (RUNNING, GONE, CANNOT_SAY)

# The decision
ALIVE, UNREACHABLE, LOST = "alive", "unreachable", "lost"

DEFAULT_GRACE_S = 300.0  # c.Portable.unreachable_grace's default: a laptop's Wi-Fi, a router restart

_STATUS_ANSWER = {"pending": RUNNING, "running": RUNNING, "reachable": RUNNING,
                  "stopped": GONE, "lost": GONE, "terminated": GONE, "unknown": CANNOT_SAY}


def provider_answer(state: str | None) -> str:
    """A provider status state (``compute.base.STATES``; None: the provider did not answer) as one
    of ANSWERS. A state this module does not know says nothing."""
    return _STATUS_ANSWER.get(state or "", CANNOT_SAY)


@dataclass(frozen=True)
class Decision:
    """What a check concludes. ``since``: when the silence began (UNREACHABLE, and LOST by silence);
    ``reason``: why it is LOST, or what was last heard while UNREACHABLE."""

    verdict: str
    since: datetime | None = None
    reason: str | None = None

    def line(self) -> str:
        """The words every view uses: "unreachable since 14:02" (UTC, as the events' times are)."""
        if self.verdict == UNREACHABLE and self.since is not None:
            return f"unreachable since {since_text(self.since)}"
        return self.verdict


def since_text(since: datetime) -> str:
    """``HH:MM`` of ``since`` in UTC, with "Z" so that nobody reads it as their own time."""
    return since.strftime("%H:%MZ")


def decide(answer: str, *, reached: bool, since: datetime | None, now: datetime, grace_s: float,
           said: str | None = None) -> Decision:
    """The rule. ``answer``: the provider's (one of ANSWERS); ``reached``: a path (the heartbeat or
    SSH) reached the machine now; ``since``: when the silence began (None: it answered last time);
    ``said``: the provider's own words, kept as the reason."""
    if answer not in ANSWERS:
        raise ValueError(f"answer must be one of {ANSWERS}, got {answer!r}")
    if answer == GONE:
        return Decision(LOST, since, said or "the provider says the machine is gone")
    if reached:
        return Decision(ALIVE)
    began = since or now
    silent = max(0.0, (now - began).total_seconds())
    if silent > grace_s and answer == CANNOT_SAY:
        return Decision(LOST, began, f"no path reached the machine for {_duration(silent)} (since "
                                     f"{since_text(began)}, grace {_duration(grace_s)}) and the provider cannot "
                                     f"say it runs" + (f": {said}" if said else ""))
    return Decision(UNREACHABLE, began, said)


def _duration(seconds: float) -> str:
    td = timedelta(seconds=round(seconds))
    minutes, secs = divmod(int(td.total_seconds()), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


__all__ = ["ALIVE", "ANSWERS", "CANNOT_SAY", "DEFAULT_GRACE_S", "GONE", "LOST", "RUNNING", "UNREACHABLE", "Decision",
           "decide", "provider_answer", "since_text"]
