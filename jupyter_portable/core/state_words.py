"""What each lifecycle state means to the user, in one table (issue 30, item 5).

The toolbar, the sidebar's badges, a cell's error on the placeholder kernel and ``jupyter
portable status`` all say a state in these words; the server sends the table with every state
answer (``states`` in ``state.json``), so the frontend holds no copy of it. Pure data: no I/O.

Each entry: ``label`` (the toolbar's words), ``meaning`` (one line: what is true now),
``machine`` (a machine is held, and billed, in this state), ``action`` (what the user can do)
and ``ask`` (a cell run asks "Start a machine?" before renting one, as for the first machine).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.units import human_bytes


@dataclass(frozen=True)
class StateWords:
    """The user's words for one lifecycle state."""

    label: str
    meaning: str
    machine: bool
    action: str
    ask: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_START = "run a cell and press Start, or press Continue in the portable sidebar, to rent one"
_WAIT = "wait, or press Cancel in the portable sidebar"
_MOVING = "Moving to a new machine"

WORDS: Mapping[str, StateWords] = MappingProxyType({
    L.IDLE: StateWords("No machine yet", "no machine has served this workspace yet; nothing is rented",
                       False, _START, ask=True),
    L.ACTIVE: StateWords("On a machine", "the kernel runs on a rented, verified machine, billed while it runs",
                         True, "press Stop to seal the workspace and release the machine"),
    L.DRAINING: StateWords("Stopping (DRAINING)", "a stop began: no new writes; the machine still runs",
                           True, "wait: the final version is being published"),
    L.SEALED: StateWords("Stopping (SEALED)", "the final version was published and read back; the machine "
                         "still runs until it is released", True, "wait: the machine is being released"),
    L.RELEASED: StateWords("No machine (RELEASED)", "the workspace was sealed and its machine released; "
                           "nothing is rented", False, _START, ask=True),
    L.LOST: StateWords("No machine (LOST)", "the machine went away before a seal; the workspace stands on its "
                       "last published version; nothing is rented", False,
                       "press Continue in the portable sidebar to rent a new one"),
    L.ROUTING: StateWords(f"{_MOVING} (ROUTING)", "a Continue is choosing a route; nothing is rented yet",
                          False, _WAIT),
    L.ACQUIRING: StateWords(f"{_MOVING} (ACQUIRING)", "a Continue is launching a machine, billed from its launch",
                            True, _WAIT),
    L.PROBING: StateWords(f"{_MOVING} (PROBING)", "the new machine's GPU, driver and image are being checked",
                          True, _WAIT),
    L.MATERIALIZING: StateWords(f"{_MOVING} (MATERIALIZING)", "the workspace is being written onto the new "
                                "machine", True, _WAIT),
    L.VERIFYING: StateWords(f"{_MOVING} (VERIFYING)", "the new machine reads the workspace back and compares",
                            True, _WAIT),
    L.READY: StateWords(f"{_MOVING} (READY)", "the read-back matched; the kernel starts on the new machine",
                        True, "wait: the notebook reconnects by itself"),
    L.FAILED: StateWords("No machine (FAILED)", "the Continue did not get a machine; the workspace stays at its "
                         "last published version; nothing is rented", False,
                         "press Continue in the portable sidebar to choose a route (each blocked one says why)"),
})


# Not a lifecycle state: a machine ACTIVE (or READY) that no path reaches now (core/reachability.py).
# Its lifecycle stays where it is, and nothing is released, until the machine answers or is lost on
# evidence; every view says it in these words, with the time: "unreachable since 14:02Z".
UNREACHABLE = "UNREACHABLE"
UNREACHABLE_WORDS = StateWords("Unreachable", "the machine has not answered since the time shown (the network, "
                               "or the laptop's); nothing is released while its provider may still run it, and "
                               "the session resumes with nothing lost when it answers", True,
                               "wait for it to answer; it is declared lost only on the provider's word or after "
                               "c.Portable.unreachable_grace seconds while the provider cannot say it runs")


def unreachable_line(state: str, version: int | None, since: str) -> str:
    """The state line of an unreachable machine: "ACTIVE at version 9, unreachable since 14:02Z: ..."."""
    at = f" at version {version}" if version else ""
    return f"{state}{at}, unreachable since {since}: {UNREACHABLE_WORDS.meaning}"


def words(state: str) -> StateWords:
    """The words for ``state``; KeyError names the states there are."""
    try:
        return WORDS[state]
    except KeyError:
        raise KeyError(f"{state!r} is not a lifecycle state (one of {', '.join(L.STATES)})") from None


# The words of a move, the same in the sidebar's progress line and the CLI: the first machine of a
# workspace is a start; after any machine served it (ACTIVE, lost, released), every one is a Continue.
MOVE_WORDS: Mapping[bool, str] = MappingProxyType({True: "Starting the first machine", False: "Continuing"})
SERVED = (L.ACTIVE, L.DRAINING, L.SEALED, L.RELEASED, L.LOST)  # states only a workspace a machine served reaches


def first_start(states: Iterable[str], machines: Iterable[Mapping[str, Any]] = (), current: str | None = None) -> bool:
    """Whether no machine has served the workspace yet: none of its lifecycle's ``states`` is one
    of :data:`SERVED`, and no machine of its history but ``current`` got further than a failed
    launch."""
    if any(s in SERVED for s in states):
        return False
    return not any(m.get("allocation_id") != current and m.get("state") not in ("failed", "refused")
                   for m in machines)


def safe_version(lifecycle_version: int | None, head_version: int | None) -> int | None:
    """The version the workspace is safe at: the newest published one (a machine may have published
    past the version the lifecycle last recorded), the same in `jupyter portable state` and the sidebar."""
    known = [v for v in (lifecycle_version, head_version) if v]
    return max(known) if known else None


def state_line(state: str, version: int | None = None) -> str:
    """One line for a state, the same in the CLI and a cell's error:
    "RELEASED at version 9: the workspace was sealed and its machine released; nothing is rented"."""
    w = words(state)
    at = f" at version {version}" if version else ""
    return f"{state}{at}: {w.meaning}"


# A checkpoint on its way to "verified" (issue 44): the ``state`` of its record in
# engine/checkpoint/background.py, in the words `%workspace checkpoints`, `jupyter portable status`,
# the panel and the sidebar all say ("step 1200: uploading 63%, 1.1 GB/s"). The server sends each
# checkpoint's line and phase word with the state (``checkpoints_in_flight``): the sidebar holds no copy.
CHECKPOINT_PHASES: Mapping[str, str] = MappingProxyType({
    "queued": "queued", "uploading": "uploading", "verifying": "reading back", "publishing": "sealing",
    "verified": "verified", "rejected": "rejected", "skipped": "skipped", "failed": "failed"})
CHECKPOINT_MOVING = ("uploading", "verifying")  # the phases that move bytes: a percent and a rate
CHECKPOINT_ENDED = ("verified", "rejected", "skipped", "failed")


def checkpoint_percent(state: str, done_bytes: int, total_bytes: int) -> int | None:
    """How far a moving phase is, 0-100 (bytes done of its total, rounded down); None otherwise."""
    if state not in CHECKPOINT_MOVING or total_bytes <= 0:
        return None
    return max(0, min(100, (100 * done_bytes) // total_bytes))


def checkpoint_rate(done_bytes: int, since: datetime | None, now: datetime) -> float | None:
    """Bytes a second of a phase that began at ``since``: its bytes done over the time passed to
    ``now`` (a stalled upload's rate falls as it waits); None when the start is not known."""
    if since is None:
        return None
    spent = (now - since).total_seconds()
    return done_bytes / spent if spent > 0.05 else 0.0


def checkpoint_line(rec: Mapping[str, Any], *, latest: bool = False) -> str:
    """One checkpoint on its way, or how it ended, from its record's fields (``path``, ``step``,
    ``state``, ``done_bytes``, ``total_bytes``, ``rate`` in bytes a second, ``reason``, ``version``):
    "step 1200: uploading 63%, 1.1 GB/s", "step 1200: verified, latest (version 7)",
    "step 1200: failed: the store did not answer". ``latest``: it is the latest verified checkpoint."""
    step, state = rec.get("step"), str(rec.get("state") or "queued")
    who = f"step {step}" if step is not None else str(rec.get("path"))
    word = CHECKPOINT_PHASES.get(state, state)
    pct = checkpoint_percent(state, int(rec.get("done_bytes") or 0), int(rec.get("total_bytes") or 0))
    if pct is not None:
        rate = float(rec.get("rate") or 0.0)
        return f"{who}: {word} {pct}%" + (f", {human_bytes(rate)}/s" if rate > 0 else "")
    if state == "verified":
        version = rec.get("version")
        return f"{who}: verified" + (", latest" if latest else "") + (f" (version {version})" if version else "")
    reason = rec.get("reason")
    return f"{who}: {word}" + (f": {reason}" if reason and state in CHECKPOINT_ENDED else "")


def table() -> dict[str, dict[str, Any]]:
    """The whole table as JSON, as the state answer carries it."""
    return {state: WORDS[state].to_json() for state in L.STATES}


__all__ = ["CHECKPOINT_ENDED", "CHECKPOINT_MOVING", "CHECKPOINT_PHASES", "MOVE_WORDS", "SERVED", "UNREACHABLE",
           "UNREACHABLE_WORDS", "WORDS", "StateWords", "checkpoint_line", "checkpoint_percent", "checkpoint_rate",
           "first_start", "safe_version", "state_line", "table", "unreachable_line", "words"]
