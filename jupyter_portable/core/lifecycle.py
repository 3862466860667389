"""The Continue state machine: its states, the moves between them, and the record of both.

Pure: no I/O, no clock, no Jupyter. ``lifecycle_store`` keeps one :class:`Lifecycle` per
workspace copy; the orchestration drives it, and the sidebar shows its events.

What must be true in each state (``version`` is the manifest version it stands on;
``epoch`` is the fencing epoch of ``allocation_id``, or where there is none the highest
epoch issued so far: it never decreases)::

    IDLE           no allocation has served the workspace yet; allocation_id and route are null
    -- the allocation side --
    ACTIVE         the notebook's kernel runs on allocation_id, which holds the lease at epoch
                   and was verified on the way in (it passed READY)
    DRAINING       a stop began: no new writes; writes in flight finish or are rejected.
                   The allocation still runs
    SEALED         the final manifest, ``version``, was published and read back.
                   The allocation still runs
    RELEASED       the allocation was released, only after SEALED (invariant 6);
                   ``version`` is the sealed one
    LOST           the allocation went away unsealed (heartbeats, the provider's status).
                   ``version`` is the last published one, and it is the truth: nothing is
                   invented. A lost allocation never returns; its epoch is fenced (invariant 1)
    -- the continue side --
    ROUTING        a Continue began: offers are ranked into routes. Nothing of this Continue
                   is launched; allocation_id and route are null
    ACQUIRING      launching on ``route``. allocation_id, once set, names the machine being
                   launched and is recorded *before* the launch call, so that a restarted
                   server knows which machine to look for; its epoch is greater than every
                   epoch before it (fencing)
    PROBING        the machine runs; image, GPU and driver are checked against the
                   requirements. No work has run on it
    MATERIALIZING  the machine was admitted; the workspace at ``version`` is being written
                   onto it. Each file is hashed before it is renamed into place (invariant
                   4), so this step may be redone safely
    VERIFYING      the worker reads the durable record back and compares; not yet verified
    READY          the read-back matched: manifest version, checkpoint hashes, runtime and
                   workspace path (invariant 5). Only a transition that says verified=True
                   and names those four checks enters READY
    FAILED         the Continue could not reach READY (every route failed, materializing or
                   the read-back failed, the kernel would not start). The workspace stays at
                   its last published version; the orchestration releases this Continue's
                   machines before entering it

``verified`` follows from the state: true in READY, ACTIVE, DRAINING and SEALED, false
elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.validate import (
    check_at,
    check_int,
    check_keys,
    check_text,
    check_token,
    check_workspace_id,
    dumps_strict,
    loads_strict,
    plain_json,
    plain_json_object,
)

LIFECYCLE_FORMAT = "jupyter-portable.lifecycle"
SCHEMA = 1

IDLE, ACTIVE, DRAINING, SEALED, RELEASED, LOST = "IDLE", "ACTIVE", "DRAINING", "SEALED", "RELEASED", "LOST"
ROUTING, ACQUIRING, PROBING = "ROUTING", "ACQUIRING", "PROBING"
MATERIALIZING, VERIFYING, READY, FAILED = "MATERIALIZING", "VERIFYING", "READY", "FAILED"

ALLOCATION_STATES = (ACTIVE, DRAINING, SEALED, RELEASED, LOST)
CONTINUE_STATES = (ROUTING, ACQUIRING, PROBING, MATERIALIZING, VERIFYING, READY)
STATES = (IDLE, *ALLOCATION_STATES, *CONTINUE_STATES, FAILED)

# Every allowed move; what is not here is refused. Every continue-side state may go to FAILED.
TRANSITIONS: Mapping[str, frozenset[str]] = MappingProxyType({
    IDLE: frozenset({ROUTING}),  # `continue` starts the first allocation too
    # ROUTING -> ROUTING: a server restarted while routing routes again (offers may have moved)
    ROUTING: frozenset({ROUTING, ACQUIRING, FAILED}),
    # ACQUIRING -> ACQUIRING: the launch failed, try the next route; or, on the same route,
    # record the allocation id just before launching it (the write-ahead).
    # ACQUIRING -> ROUTING: a restart rolls back; the launch's outcome was never recorded.
    ACQUIRING: frozenset({ACQUIRING, PROBING, ROUTING, FAILED}),
    # PROBING -> ACQUIRING: admission refused the machine, fail over to the next route.
    # PROBING -> ROUTING: a restart rolls back; the machine was never admitted.
    PROBING: frozenset({MATERIALIZING, ACQUIRING, ROUTING, FAILED}),
    # MATERIALIZING -> MATERIALIZING: a restart resumes it (files already in place are kept)
    MATERIALIZING: frozenset({MATERIALIZING, VERIFYING, FAILED}),
    # VERIFYING -> MATERIALIZING: the read-back found a difference (or a restart lost its
    # result); materialize again rather than trust a half-checked copy
    VERIFYING: frozenset({READY, MATERIALIZING, FAILED}),
    # READY -> FAILED: the kernel would not start on the verified machine
    READY: frozenset({ACTIVE, FAILED}),
    # No ACTIVE -> ROUTING: moving is a seal, a release, then a Continue. Holding the old and
    # the new machine at once would take two allocations in one record.
    ACTIVE: frozenset({DRAINING, LOST}),
    # DRAINING -> ACTIVE: the final manifest could not be published; reopen writes rather
    # than release a machine that holds unpublished work (invariant 6).
    # DRAINING -> LOST: the machine died mid-seal; the last published version is the truth.
    DRAINING: frozenset({SEALED, ACTIVE, LOST}),
    # No SEALED -> LOST: nothing can be lost after the seal; releasing a machine that is
    # already gone is still a release (terminate is idempotent).
    SEALED: frozenset({RELEASED}),
    RELEASED: frozenset({ROUTING}),
    # No LOST -> ACTIVE: a lost worker that comes back is fenced; only a Continue resumes.
    LOST: frozenset({ROUTING}),
    FAILED: frozenset({ROUTING}),
})
# The forward path, which needs no reason. Every other move must say why (the sidebar shows it).
QUIET = frozenset({(IDLE, ROUTING), (LOST, ROUTING), (RELEASED, ROUTING), (FAILED, ROUTING),
                   (ROUTING, ACQUIRING), (ACQUIRING, PROBING), (PROBING, MATERIALIZING),
                   (MATERIALIZING, VERIFYING), (VERIFYING, READY), (READY, ACTIVE),
                   (DRAINING, SEALED), (SEALED, RELEASED)})
# The steps of a Continue as the sidebar shows them, and the state each runs in (state.json
# ContinueStep and StateStep, generated for the sidebar; progress/v1 events name the same steps).
CONTINUE_STEPS = ("acquire", "probe", "materialize", "verify", "reconnect")
STATE_STEP: Mapping[str, str] = MappingProxyType({ACQUIRING: "acquire", PROBING: "probe", MATERIALIZING: "materialize",
                                                  VERIFYING: "verify", READY: "reconnect"})
# A Continue begins from these; entering ROUTING from them clears the last Continue's attempts.
CONTINUE_FROM = frozenset({IDLE, LOST, RELEASED, FAILED})
VERIFIED_STATES = frozenset({READY, ACTIVE, DRAINING, SEALED})
_NO_ALLOCATION = frozenset({IDLE, ROUTING})
_NEEDS_ALLOCATION = frozenset({PROBING, MATERIALIZING, VERIFYING, READY, ACTIVE, DRAINING, SEALED, RELEASED, LOST})
_NEEDS_ROUTE = frozenset({ACQUIRING, PROBING, MATERIALIZING, VERIFYING, READY, ACTIVE, DRAINING, SEALED})
# What the read-back compared before READY (invariant 5): all four must be named.
READ_BACK_CHECKS = ("version", "checkpoints", "runtime", "path")
RESTART_REASON = "resumed after a restart"

_CHANGES = frozenset({"allocation_id", "epoch", "route", "version", "verified", "attempts"})
_MAX_DEPTH = 16
_MAX_TEXT = 4000


class IllegalTransition(ManifestError):
    """A move the state machine does not allow, or one that breaks an invariant on the way."""

    hint = "see TRANSITIONS in jupyter_portable/core/lifecycle.py"


def allowed_targets(state: str) -> tuple[str, ...]:
    """The states ``state`` may move to, sorted."""
    return tuple(sorted(TRANSITIONS.get(state, ())))


# -- the record's own rules (the checks themselves are core.validate's) ---------------------------

def _int(value: object, what: str) -> int:
    return check_int(value, what)


def _text(value: object, what: str, *, optional: bool = True) -> str | None:
    return check_text(value, what, max_len=_MAX_TEXT, optional=optional)


def _attempt(value: object, what: str) -> dict[str, Any]:
    """One route given up on; shaped by the compute layer (``Attempt.to_json``), it must say why."""
    attempt = plain_json_object(value, what, max_depth=_MAX_DEPTH)
    _text(attempt.get("reason"), f"{what} reason", optional=False)
    return attempt


def _state(value: object, what: str) -> str:
    if value not in STATES:
        raise ManifestError(f"{what} {value!r} is not a state (one of {', '.join(STATES)})")
    return str(value)


# -- records ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """One state change: what the state became, from what, why, and on which allocation."""

    seq: int
    at: str
    state: str
    previous: str
    reason: str | None
    route: str | None
    allocation_id: str | None
    epoch: int
    version: int  # the manifest version the workspace stands on after this change
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "state": self.state, "previous": self.previous,
                "reason": self.reason, "route": self.route, "allocation_id": self.allocation_id,
                "epoch": self.epoch, "version": self.version, "detail": plain_json(self.detail, "detail")}

    @classmethod
    def from_json(cls, obj: object) -> "Event":
        what = "lifecycle event"
        obj = check_keys(obj, what, cls.__dataclass_fields__)
        seq = obj["seq"]
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise ManifestError(f"{what}: seq must be a positive integer, got {seq!r}")
        what = f"lifecycle event {seq}"
        return cls(seq=seq, at=check_at(obj["at"], f"{what} time"), state=_state(obj["state"], f"{what} state"),
                   previous=_state(obj["previous"], f"{what} previous state"),
                   reason=_text(obj["reason"], f"{what} reason"),
                   route=check_token(obj["route"], f"{what} route"),
                   allocation_id=check_token(obj["allocation_id"], f"{what} allocation id"),
                   epoch=_int(obj["epoch"], f"{what} epoch"), version=_int(obj["version"], f"{what} version"),
                   detail=plain_json_object(obj["detail"], f"{what} detail"))


@dataclass(frozen=True)
class Lifecycle:
    """Where one workspace stands in the state machine, and every event that brought it there."""

    workspace_id: str
    state: str
    epoch: int
    allocation_id: str | None
    route: str | None
    attempts: tuple[dict[str, Any], ...]  # routes given up on in this Continue, each with its reason
    events: tuple[Event, ...]
    version: int
    verified: bool
    updated: str

    @classmethod
    def new(cls, workspace_id: str, *, at: str, version: int = 0, epoch: int = 0) -> "Lifecycle":
        """A workspace no allocation has served yet, standing on ``version`` (the head's epoch: ``epoch``)."""
        return cls(workspace_id=check_workspace_id(workspace_id), state=IDLE, epoch=_int(epoch, "epoch"),
                   allocation_id=None, route=None, attempts=(), events=(), version=_int(version, "version"),
                   verified=False, updated=check_at(at, "updated"))

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    def to_json(self) -> dict[str, Any]:
        return {"format": LIFECYCLE_FORMAT, "schema": SCHEMA, "workspace_id": self.workspace_id,
                "state": self.state, "epoch": self.epoch, "allocation_id": self.allocation_id,
                "route": self.route, "version": self.version, "verified": self.verified,
                "attempts": [plain_json(a, "attempt") for a in self.attempts],
                "events": [e.to_json() for e in self.events], "updated": self.updated}

    def to_bytes(self) -> bytes:
        """The record as its file holds it: strict JSON (no NaN), one field a line."""
        return dumps_strict(self.to_json(), "lifecycle record", indent=1).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> "Lifecycle":
        """:meth:`from_json` over strict JSON: a key twice, NaN or hostile nesting is refused."""
        return cls.from_json(loads_strict(data, "lifecycle record"))

    @classmethod
    def from_json(cls, obj: object) -> "Lifecycle":
        """Validate a stored lifecycle strictly: the events must replay by the rules, and the
        record must agree with its last event."""
        names = {f for f in cls.__dataclass_fields__} | {"format", "schema"}
        obj = check_keys(obj, "lifecycle record", names)
        if obj["format"] != LIFECYCLE_FORMAT:
            raise ManifestError(f"lifecycle record: format must be {LIFECYCLE_FORMAT!r}, got {obj['format']!r}")
        if obj["schema"] != SCHEMA or isinstance(obj["schema"], bool):
            raise ManifestError(f"lifecycle record: schema {obj['schema']!r} is not supported (only {SCHEMA})")
        if not isinstance(obj["verified"], bool):
            raise ManifestError("lifecycle record: verified must be true or false")
        for key in ("attempts", "events"):
            if not isinstance(obj[key], list):
                raise ManifestError(f"lifecycle record: {key} must be a list")
        lc = cls(workspace_id=check_workspace_id(obj["workspace_id"]), state=_state(obj["state"], "lifecycle state"),
                 epoch=_int(obj["epoch"], "lifecycle epoch"),
                 allocation_id=check_token(obj["allocation_id"], "lifecycle allocation id"),
                 route=check_token(obj["route"], "lifecycle route"),
                 attempts=tuple(_attempt(a, f"attempt {i + 1}") for i, a in enumerate(obj["attempts"])),
                 events=tuple(Event.from_json(e) for e in obj["events"]),
                 version=_int(obj["version"], "lifecycle version"), verified=obj["verified"],
                 updated=check_at(obj["updated"], "lifecycle updated"))
        _check_record(lc)
        return lc


# -- the rules --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Point:
    """The fields an event fixes; the state before the first event is IDLE with nothing held."""

    state: str
    route: str | None
    allocation_id: str | None
    epoch: int
    version: int


def _point(ev: Event) -> _Point:
    return _Point(ev.state, ev.route, ev.allocation_id, ev.epoch, ev.version)


def _check_step(before: _Point, ev: Event, seen: set[str]) -> None:
    """Raise IllegalTransition unless ``ev`` is an allowed move from ``before``.

    ``seen``: every allocation id of earlier events (an id is never reused)."""
    a, b = before.state, ev.state
    if b not in TRANSITIONS.get(a, ()):
        raise IllegalTransition(f"cannot go from {a} to {b}: from {a} the allowed targets are "
                                f"{', '.join(allowed_targets(a))}", from_state=a, to_state=b)
    if ev.previous != a:
        raise IllegalTransition(f"the event says it left {ev.previous}, but the state was {a}")
    # ACQUIRING -> ACQUIRING is quiet only as the write-ahead: the same route, naming its machine
    write_ahead = (a == b == ACQUIRING and ev.route == before.route and before.allocation_id is None
                   and ev.allocation_id is not None)
    if (a, b) not in QUIET and not write_ahead and ev.reason is None:
        raise IllegalTransition(f"{a} -> {b} needs a reason: every move off the forward path says why")
    if b in _NO_ALLOCATION and (ev.allocation_id is not None or ev.route is not None):
        raise IllegalTransition(f"{b} holds no allocation and no route, but "
                                f"{ev.allocation_id or ev.route} was given")
    if b in _NEEDS_ALLOCATION and ev.allocation_id is None:
        raise IllegalTransition(f"{b} needs the allocation it concerns")
    if b in _NEEDS_ROUTE and ev.route is None:
        raise IllegalTransition(f"{b} needs the route it concerns")
    if ev.version < before.version:
        raise IllegalTransition(f"version went back from {before.version} to {ev.version}: history is linear")
    if ev.allocation_id != before.allocation_id and b not in (ACQUIRING, ROUTING):
        # only a launch brings an allocation, and only a new route leaves one behind
        raise IllegalTransition(f"{a} -> {b} cannot change the allocation "
                                f"({before.allocation_id} to {ev.allocation_id}); only ACQUIRING takes a new one")
    if ev.allocation_id is not None and ev.allocation_id != before.allocation_id:
        if ev.allocation_id in seen:
            raise IllegalTransition(f"allocation {ev.allocation_id} was used before; a new allocation needs a new id")
        if ev.epoch <= before.epoch:
            raise IllegalTransition(f"new allocation {ev.allocation_id} needs an epoch greater than "
                                    f"{before.epoch}, got {ev.epoch} (fencing, invariant 1)")
    elif ev.epoch < before.epoch:
        raise IllegalTransition(f"epoch went back from {before.epoch} to {ev.epoch} (fencing, invariant 1)")
    elif ev.epoch != before.epoch:
        raise IllegalTransition(f"the epoch changed from {before.epoch} to {ev.epoch} without a new allocation")
    if a == PROBING and b == ACQUIRING and ev.allocation_id == before.allocation_id:
        raise IllegalTransition(f"allocation {ev.allocation_id} was refused; failing over cannot keep it")
    if ev.allocation_id is not None and ev.allocation_id == before.allocation_id and ev.route != before.route:
        raise IllegalTransition(f"allocation {ev.allocation_id} was launched on route {before.route}, "
                                f"it cannot move to route {ev.route}")
    if b == READY:
        matched = ev.detail.get("matched")
        missing = [c for c in READ_BACK_CHECKS if not isinstance(matched, list) or c not in matched]
        if missing:
            raise IllegalTransition(f"READY needs the read-back to have matched {', '.join(missing)} "
                                    "(invariant 5)")
    if b == SEALED and ev.version < 1:
        raise IllegalTransition("SEALED needs the version of the final manifest, published and read back")
    if b == RELEASED and ev.version != before.version:
        # before is the SEALED event (the table allows RELEASED only from SEALED)
        raise IllegalTransition(f"RELEASED must name the sealed version {before.version}, not {ev.version} "
                                "(invariant 6)")


def _check_record(lc: Lifecycle) -> None:
    """The events replay by the rules, and the record's fields are those of the last event."""
    if not lc.events:
        if lc.state != IDLE or lc.allocation_id or lc.route or lc.attempts or lc.verified:
            raise ManifestError(f"lifecycle record: a lifecycle without events must be a bare IDLE, not {lc.state}")
        return
    first = lc.events[0]
    before = _Point(IDLE, None, None, first.epoch, first.version)
    seen: set[str] = set()
    for i, ev in enumerate(lc.events):
        if ev.seq != i + 1:
            raise ManifestError(f"lifecycle record: event {i + 1} has seq {ev.seq}; events are numbered 1, 2, ...")
        try:
            _check_step(before, ev, seen)
        except IllegalTransition as exc:
            raise ManifestError(f"lifecycle record: event {ev.seq} ({before.state} -> {ev.state}): {exc}") from exc
        if ev.allocation_id is not None:
            seen.add(ev.allocation_id)
        before = _point(ev)
    last = lc.events[-1]
    for name in ("state", "route", "allocation_id", "epoch", "version"):
        if getattr(lc, name) != getattr(last, name):
            raise ManifestError(f"lifecycle record: {name} is {getattr(lc, name)!r} but its last event says "
                                f"{getattr(last, name)!r}")
    if lc.updated != last.at:
        raise ManifestError("lifecycle record: updated is not the time of its last event")
    if lc.verified != (lc.state in VERIFIED_STATES):
        raise ManifestError(f"lifecycle record: verified={lc.verified} cannot hold in {lc.state}")


def transition(lc: Lifecycle, to: str, *, at: str, reason: str | None = None,
               detail: dict[str, Any] | None = None, **changes: Any) -> Lifecycle:
    """A new Lifecycle in state ``to``, with its event appended; IllegalTransition if not allowed.

    ``changes`` may set allocation_id, epoch, route, version, verified and attempts (which
    may only grow). Entering ROUTING clears allocation, route and verified, and a new
    Continue clears attempts; failing over (a new route, or off a refused machine) clears the
    allocation unless a new one is given. READY needs ``verified=True`` and
    ``detail={"matched": [...READ_BACK_CHECKS]}``; SEALED needs ``version``.
    """
    unknown = set(changes) - _CHANGES
    if unknown:
        raise TypeError(f"transition() got unknown change(s) {', '.join(sorted(unknown))}")
    if to not in STATES:
        raise IllegalTransition(f"{to!r} is not a state (one of {', '.join(STATES)})")
    a = lc.state
    if to not in TRANSITIONS[a]:
        raise IllegalTransition(f"cannot go from {a} to {to}: from {a} the allowed targets are "
                                f"{', '.join(allowed_targets(a))}", from_state=a, to_state=to)
    route = changes.get("route", lc.route)
    allocation_id = lc.allocation_id
    attempts = lc.attempts
    if to == ROUTING:
        route = changes.get("route")  # anything given here is refused below: ROUTING has no route yet
        allocation_id = None
        if a in CONTINUE_FROM:
            attempts = ()
    elif to == ACQUIRING and (a == PROBING or route != lc.route):
        allocation_id = None  # the machine of the route given up on was released
    allocation_id = changes.get("allocation_id", allocation_id)
    if "attempts" in changes:
        given = tuple(_attempt(x, f"attempt {i + 1}") for i, x in enumerate(changes["attempts"]))
        if given[:len(attempts)] != attempts:
            raise IllegalTransition("attempts may only grow: an attempt once recorded stays recorded")
        attempts = given
    verified = to in VERIFIED_STATES
    if "verified" in changes and changes["verified"] is not verified:
        raise IllegalTransition(f"{to} cannot be entered with verified={changes['verified']!r}")
    if to == READY and changes.get("verified") is not True:
        raise IllegalTransition("READY needs verified=True: nothing says Ready until the read-back matched "
                                "(invariant 5)")
    if to == SEALED and "version" not in changes:
        raise IllegalTransition("SEALED needs the version of the final manifest, published and read back "
                                "(invariant 6)")
    ev = Event(seq=lc.last_seq + 1, at=check_at(at, "transition time"), state=to, previous=a,
               reason=_text(reason, "reason"), route=check_token(route, "route"),
               allocation_id=check_token(allocation_id, "allocation id"),
               epoch=_int(changes.get("epoch", lc.epoch), "epoch"),
               version=_int(changes.get("version", lc.version), "version"),
               detail=plain_json_object(detail if detail is not None else {}, "detail"))
    before = _Point(a, lc.route, lc.allocation_id, lc.epoch, lc.version)
    seen = {e.allocation_id for e in lc.events if e.allocation_id is not None}
    _check_step(before, ev, seen)
    return replace(lc, state=to, epoch=ev.epoch, allocation_id=ev.allocation_id, route=ev.route,
                   attempts=attempts, events=(*lc.events, ev), version=ev.version, verified=verified, updated=at)


# -- recovery -----------------------------------------------------------------------------------

def recover(lc: Lifecycle, *, at: str) -> tuple[Lifecycle, str]:
    """What a server restarted mid-Continue does: the lifecycle to go on from, and the action,
    which starts with "resume" or "roll back" (or "nothing to resume"). Never invents state."""
    s, alloc, ep, v = lc.state, lc.allocation_id, lc.epoch, lc.version
    if s == ROUTING:
        return (transition(lc, ROUTING, at=at, reason=RESTART_REASON, detail={"action": "resume"}),
                "resume: route again")
    if s in (ACQUIRING, PROBING):
        # Nothing says whether the launch went through (ACQUIRING) or the machine passed
        # admission (PROBING): the machine cannot be trusted, and must not be left running.
        attempts = lc.attempts
        detail: dict[str, Any] = {"action": "roll back"}
        if alloc is not None:
            # shaped like compute.acquire.Attempt.to_json, so the sidebar shows it with the others
            orphan: dict[str, Any] = {
                "offer": lc.route, "stage": "launch" if s == ACQUIRING else "probe", "error": "Restart",
                "reason": f"the server restarted in {s}; allocation {alloc} (epoch {ep}) may still run",
                "checks": {}, "environment_fault": False, "allocation_id": alloc, "orphan": True}
            attempts = (*attempts, orphan)
            detail["orphan"] = {"allocation_id": alloc, "epoch": ep, "route": lc.route}
        back = transition(lc, ROUTING, at=at, reason=RESTART_REASON, detail=detail, attempts=attempts)
        if alloc is None:
            return back, f"roll back to ROUTING: route again; no allocation was recorded on route {lc.route}, " \
                         "so none was launched"
        return back, (f"roll back to ROUTING: route again; check for an orphan allocation {alloc} of epoch {ep} "
                      f"on route {lc.route} and terminate it (a newer epoch fences it off anyway)")
    if s == MATERIALIZING:
        return (transition(lc, MATERIALIZING, at=at, reason=RESTART_REASON, detail={"action": "resume"}),
                f"resume: materialize version {v} again on allocation {alloc} (files already in place with "
                "matching hashes are kept); if it no longer answers, fail the Continue")
    if s == VERIFYING:
        # the read-back's result was never recorded, so it does not count
        return (transition(lc, MATERIALIZING, at=at, reason=RESTART_REASON, detail={"action": "roll back"}),
                f"roll back to MATERIALIZING: materialize version {v} on allocation {alloc} again, then verify")
    if s == READY:
        return lc, f"resume: restart the kernel on allocation {alloc}, verified at version {v}"
    if s == DRAINING:
        return lc, (f"resume: finish sealing allocation {alloc}: reject writes in flight, publish the final "
                    "manifest, read it back, then release")
    if s == SEALED:
        return lc, f"resume: release allocation {alloc}, sealed at version {v}"
    if s == ACTIVE:
        return lc, f"nothing to resume: allocation {alloc} (epoch {ep}) is active; check its heartbeat"
    if s == LOST:
        return lc, f"nothing to resume: allocation {alloc} was lost; version {v} is the truth; Continue to go on"
    return lc, f"nothing to resume: the workspace is {s} at version {v}"


__all__ = [
    "ACQUIRING", "ACTIVE", "ALLOCATION_STATES", "CONTINUE_STATES", "CONTINUE_STEPS", "DRAINING", "FAILED", "IDLE",
    "LOST",
    "MATERIALIZING", "PROBING", "READ_BACK_CHECKS", "READY", "RELEASED", "ROUTING", "SEALED", "STATES", "STATE_STEP",
    "TRANSITIONS", "VERIFYING", "Event", "IllegalTransition", "Lifecycle", "allowed_targets",
    "recover", "transition",
]
