"""The Continue state machine: allowed and refused moves, the invariants on the way, strict
records, recovery after a restart, and a lifecycle file two processes update at once."""

from __future__ import annotations

import copy as copy_module
import fcntl
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_portable.core.errors import ConflictError, ManifestError
from jupyter_portable.core.lifecycle import (
    ACQUIRING,
    ACTIVE,
    DRAINING,
    FAILED,
    IDLE,
    LOST,
    MATERIALIZING,
    PROBING,
    QUIET,
    READ_BACK_CHECKS,
    READY,
    RELEASED,
    ROUTING,
    SEALED,
    STATES,
    TRANSITIONS,
    VERIFYING,
    IllegalTransition,
    Lifecycle,
    recover,
    transition,
)
from jupyter_portable.workdir import lifecycle_file as lifecycle_store
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

WS = "ws-lifecycle"
T0 = "2026-05-01T10:00:00Z"
MATCHED = {"matched": list(READ_BACK_CHECKS)}


def at(n: int) -> str:
    return f"2026-05-01T10:{n // 60:02d}:{n % 60:02d}Z"


def step(lc: Lifecycle, to: str, **kw: Any) -> Lifecycle:
    return transition(lc, to, at=at(lc.last_seq + 1), **kw)


def reach(state: str, version: int = 3) -> Lifecycle:
    """A lifecycle in ``state`` by the shortest ordinary path (head epoch 2; sealed at version + 1)."""
    lc = Lifecycle.new(WS, at=T0, version=version, epoch=2)
    if state == IDLE:
        return lc
    lc = step(lc, ROUTING)
    if state == ROUTING:
        return lc
    if state == FAILED:
        return step(lc, FAILED, reason="no route is open")
    lc = step(lc, ACQUIRING, route="r-1")
    lc = step(lc, ACQUIRING, allocation_id="al-1", epoch=3)  # the write-ahead, before launching
    if state == ACQUIRING:
        return lc
    path: list[tuple[str, dict[str, Any]]] = [(ACQUIRING, {}), (PROBING, {}), (MATERIALIZING, {}), (VERIFYING, {}),
            (READY, {"verified": True, "detail": MATCHED}), (ACTIVE, {}),
            (DRAINING, {"reason": "stopped by the user"}), (SEALED, {"version": version + 1}), (RELEASED, {})]
    for name, kw in path[1:]:
        if state == LOST and name == DRAINING:
            return step(lc, LOST, reason="heartbeats failed", version=version + 1)
        lc = step(lc, name, **kw)
        if name == state:
            return lc
    assert lc.state == state
    return lc


def legal_kwargs(lc: Lifecycle, to: str) -> dict[str, Any]:
    """What an allowed move from ``lc`` to ``to`` must carry."""
    kw: dict[str, Any] = {}
    if (lc.state, to) not in QUIET:
        kw["reason"] = f"because ({lc.state} -> {to})"
    if to == ACQUIRING:
        kw["route"] = "r-2" if lc.state in (ACQUIRING, PROBING) else "r-1"
    if to == READY:
        kw.update(verified=True, detail=MATCHED)
    if to == SEALED:
        kw["version"] = lc.version + 1
    return kw


ALLOWED = sorted((a, b) for a, targets in TRANSITIONS.items() for b in targets)
REFUSED = sorted((a, b) for a in STATES for b in STATES if b not in TRANSITIONS[a])


# -- the table ----------------------------------------------------------------------------------

def test_the_table_names_every_state_and_only_states() -> None:
    assert set(TRANSITIONS) == set(STATES)
    assert all(targets <= set(STATES) for targets in TRANSITIONS.values())
    # every continue-side state can fail, and a failed Continue can only be continued again
    assert all(FAILED in TRANSITIONS[s] for s in (ROUTING, ACQUIRING, PROBING, MATERIALIZING, VERIFYING, READY))
    assert TRANSITIONS[FAILED] == {ROUTING} and TRANSITIONS[LOST] == {ROUTING}
    assert {a for a, b in ALLOWED if b == RELEASED} == {SEALED}
    assert {a for a, b in ALLOWED if b == READY} == {VERIFYING}


@pytest.mark.parametrize(("a", "b"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_every_allowed_transition_is_taken(a: str, b: str) -> None:
    lc = reach(a)
    after = step(lc, b, **legal_kwargs(lc, b))
    ev = after.events[-1]
    assert (after.state, ev.state, ev.previous, ev.seq) == (b, b, a, lc.last_seq + 1)
    assert after.events[:-1] == lc.events and after.updated == ev.at
    assert Lifecycle.from_json(json.loads(json.dumps(after.to_json()))) == after


@pytest.mark.parametrize(("a", "b"), REFUSED, ids=[f"{a}->{b}" for a, b in REFUSED])
def test_every_other_transition_is_refused_naming_both_states(a: str, b: str) -> None:
    lc = reach(a)
    with pytest.raises(IllegalTransition) as err:
        step(lc, b, **legal_kwargs(lc, b))
    allowed = ", ".join(sorted(TRANSITIONS[a]))
    assert str(err.value) == f"cannot go from {a} to {b}: from {a} the allowed targets are {allowed}"


def test_a_refusal_reads_well_on_one_line() -> None:
    with pytest.raises(IllegalTransition) as err:
        step(reach(LOST), ACTIVE)
    assert err.value.one_line() == ("cannot go from LOST to ACTIVE: from LOST the allowed targets are ROUTING "
                                    "(to fix: see TRANSITIONS in jupyter_portable/core/lifecycle.py)")
    assert isinstance(err.value, ManifestError)
    with pytest.raises(IllegalTransition, match="'PAUSED' is not a state"):
        step(reach(ACTIVE), "PAUSED")


def test_moves_off_the_forward_path_must_say_why() -> None:
    for a, b in [(ACTIVE, LOST), (PROBING, ACQUIRING), (ROUTING, FAILED), (ACTIVE, DRAINING), (DRAINING, ACTIVE)]:
        lc = reach(a)
        kw = legal_kwargs(lc, b)
        kw.pop("reason")
        with pytest.raises(IllegalTransition, match=f"{a} -> {b} needs a reason"):
            step(lc, b, **kw)
    with pytest.raises(ManifestError, match="reason must be a non-empty string"):
        step(reach(ACTIVE), LOST, reason="  ")


# -- the invariants on the way ------------------------------------------------------------------

def test_ready_is_refused_until_the_read_back_matched() -> None:
    lc = reach(VERIFYING)
    assert not lc.verified
    with pytest.raises(IllegalTransition, match="READY needs verified=True"):
        step(lc, READY, detail=MATCHED)
    with pytest.raises(IllegalTransition, match="READY cannot be entered with verified=False"):
        step(lc, READY, verified=False, detail=MATCHED)
    with pytest.raises(IllegalTransition, match="read-back to have matched runtime, path"):
        step(lc, READY, verified=True, detail={"matched": ["version", "checkpoints"]})
    with pytest.raises(IllegalTransition, match="cannot be entered with verified=True"):
        step(lc, MATERIALIZING, verified=True, reason="retry")
    ready = step(lc, READY, verified=True, detail=MATCHED)
    assert ready.verified and step(ready, ACTIVE).verified


def test_released_is_refused_unless_the_final_manifest_was_sealed() -> None:
    with pytest.raises(IllegalTransition, match="cannot go from ACTIVE to RELEASED"):
        step(reach(ACTIVE), RELEASED)
    with pytest.raises(IllegalTransition, match="cannot go from DRAINING to RELEASED"):
        step(reach(DRAINING), RELEASED)
    with pytest.raises(IllegalTransition, match="SEALED needs the version of the final manifest"):
        step(reach(DRAINING), SEALED)
    sealed = reach(SEALED)
    with pytest.raises(IllegalTransition, match="RELEASED must name the sealed version 4, not 5"):
        step(sealed, RELEASED, version=5)
    released = step(sealed, RELEASED)
    assert (released.version, released.allocation_id, released.verified) == (4, "al-1", False)


def test_a_failed_seal_reopens_writes_instead_of_releasing() -> None:
    lc = step(reach(DRAINING), ACTIVE, reason="publishing the final manifest failed: store unreachable")
    assert lc.state == ACTIVE and lc.allocation_id == "al-1" and lc.verified


def test_a_new_allocation_needs_a_greater_epoch() -> None:
    lc = step(reach(ROUTING), ACQUIRING, route="r-1")
    for epoch in (1, 2):  # the head is at epoch 2
        with pytest.raises(IllegalTransition, match=f"needs an epoch greater than 2, got {epoch}"):
            step(lc, ACQUIRING, allocation_id="al-1", epoch=epoch)
    with pytest.raises(IllegalTransition, match="epoch went back from 2 to 1"):
        step(lc, ACQUIRING, epoch=1, reason="x")
    assert step(lc, ACQUIRING, allocation_id="al-1", epoch=3).epoch == 3


def test_an_allocation_keeps_its_epoch_and_a_lost_one_never_returns() -> None:
    active = reach(ACTIVE)
    with pytest.raises(IllegalTransition, match="epoch changed from 3 to 9 without a new allocation"):
        step(active, DRAINING, reason="stop", epoch=9)
    with pytest.raises(IllegalTransition, match="cannot change the allocation"):
        step(active, LOST, reason="gone", allocation_id="al-2", epoch=4)
    again = step(step(step(active, LOST, reason="heartbeats failed"), ROUTING), ACQUIRING, route="r-1")
    assert again.allocation_id is None and again.epoch == 3
    with pytest.raises(IllegalTransition, match="al-1 was used before"):
        step(again, ACQUIRING, allocation_id="al-1", epoch=4)
    with pytest.raises(IllegalTransition, match="greater than 3"):
        step(again, ACQUIRING, allocation_id="al-2", epoch=3)
    assert step(again, ACQUIRING, allocation_id="al-2", epoch=4).allocation_id == "al-2"


def test_failing_over_releases_the_refused_machine_and_records_why() -> None:
    probing = reach(PROBING)
    refusal = {"offer": "local/a100", "stage": "admission", "error": "AdmissionRefused",
               "reason": "driver 535.54 is not the pinned 550.54", "environment_fault": True,
               "allocation_id": "al-1"}
    with pytest.raises(IllegalTransition, match="al-1 was refused; failing over cannot keep it"):
        step(probing, ACQUIRING, route="r-1", reason="admission refused", allocation_id="al-1")
    nxt = step(probing, ACQUIRING, route="r-2", reason=refusal["reason"], attempts=(refusal,))
    assert (nxt.route, nxt.allocation_id, nxt.attempts) == ("r-2", None, (refusal,))
    with pytest.raises(IllegalTransition, match="attempts may only grow"):
        step(nxt, ACQUIRING, allocation_id="al-2", epoch=4, attempts=())
    with pytest.raises(IllegalTransition, match="cannot move to route r-3"):
        step(step(nxt, ACQUIRING, allocation_id="al-2", epoch=4), PROBING, route="r-3")
    with pytest.raises(ManifestError, match="attempt 2 reason must be"):
        step(nxt, FAILED, reason="x", attempts=(refusal, {"stage": "launch"}))
    launching = step(nxt, ACQUIRING, allocation_id="al-2", epoch=4)  # the write-ahead needs no reason
    with pytest.raises(IllegalTransition, match="ACQUIRING -> ACQUIRING needs a reason"):
        step(launching, ACQUIRING, allocation_id="al-3", epoch=5)  # a relaunch on the same route does
    failed = step(nxt, FAILED, reason="every route failed")
    assert failed.attempts == (refusal,)  # kept, to be shown
    assert step(failed, ROUTING).attempts == ()  # a new Continue starts with none


def test_routing_holds_no_machine_and_version_never_goes_back() -> None:
    with pytest.raises(IllegalTransition, match="ROUTING holds no allocation and no route"):
        step(reach(LOST), ROUTING, route="r-1")
    with pytest.raises(IllegalTransition, match="version went back from 4 to 3"):
        step(reach(LOST), ROUTING, version=3)
    with pytest.raises(IllegalTransition, match="PROBING needs the allocation"):
        step(step(reach(ROUTING), ACQUIRING, route="r-1"), PROBING)
    with pytest.raises(TypeError, match="unknown change"):
        step(reach(ROUTING), ACQUIRING, route="r-1", state=ACTIVE)


# -- the record ---------------------------------------------------------------------------------

def full_record() -> dict[str, Any]:
    lc = reach(ACTIVE)
    lc = step(lc, LOST, reason="heartbeats failed", version=4, detail={"spend": 1.25, "failures": ["timeout"]})
    return json.loads(json.dumps(lc.to_json()))


def test_a_lifecycle_round_trips_through_json() -> None:
    obj = full_record()
    lc = Lifecycle.from_json(obj)
    assert lc.to_json() == obj and Lifecycle.from_json(lc.to_json()) == lc
    assert obj["format"] == "jupyter-portable.lifecycle" and obj["schema"] == 1
    assert [e["state"] for e in obj["events"]] == [ROUTING, ACQUIRING, ACQUIRING, PROBING, MATERIALIZING,
                                                  VERIFYING, READY, ACTIVE, LOST]
    assert Lifecycle.from_json(reach(IDLE).to_json()) == reach(IDLE)


def _set(path: str, value: Any) -> Any:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = obj
        for p in parents:
            target = target[int(p)] if p.lstrip("-").isdigit() else target[p]
        target[int(last) if last.lstrip("-").isdigit() else last] = value
    return mutate


def _drop(key: str) -> Any:
    return lambda obj: obj.pop(key)


def _deep(obj: dict[str, Any]) -> None:
    nest: Any = "x"
    for _ in range(40):
        nest = {"n": nest}
    obj["events"][-1]["detail"] = nest


def _skip_probing(obj: dict[str, Any]) -> None:
    del obj["events"][3]
    for i, ev in enumerate(obj["events"]):
        ev["seq"] = i + 1
    obj["events"][3]["previous"] = ACQUIRING


def _swap_events(obj: dict[str, Any]) -> None:
    obj["events"][3], obj["events"][4] = obj["events"][4], obj["events"][3]


MUTATIONS: list[tuple[str, Any, str]] = [
    ("unknown field", _set("owner", "mallory"), "unknown field(s) owner"),
    ("missing field", _drop("epoch"), "lacks epoch"),
    ("schema 2", _set("schema", 2), "schema 2 is not supported"),
    ("schema true", _set("schema", True), "schema True is not supported"),
    ("format", _set("format", "jupyter-portable.manifest"), "format must be"),
    ("bad workspace", _set("workspace_id", "../etc"), "workspace id '../etc' is not valid"),
    ("unknown state", _set("state", "PAUSED"), "'PAUSED' is not a state"),
    ("negative epoch", _set("epoch", -1), "epoch must be >= 0"),
    ("bool epoch", _set("epoch", True), "epoch must be an integer"),
    ("string version", _set("version", "4"), "version must be an integer"),
    ("verified string", _set("verified", "yes"), "verified must be true or false"),
    ("verified while lost", _set("verified", True), "verified=True cannot hold in LOST"),
    ("state not the last event's", _set("state", ACTIVE), "state is 'ACTIVE' but its last event says 'LOST'"),
    ("version not the last event's", _set("version", 9), "version is 9 but its last event says 4"),
    ("updated", _set("updated", "2030-01-01T00:00:00Z"), "updated is not the time of its last event"),
    ("allocation escapes", _set("allocation_id", "../../x"), "allocation id '../../x' is not a valid id"),
    ("allocation with space", _set("events.-1.allocation_id", "al 1"), "allocation id 'al 1' is not a valid id"),
    ("attempts not a list", _set("attempts", {}), "attempts must be a list"),
    ("attempt without reason", _set("attempts", [{"stage": "launch"}]), "attempt 1 reason must be"),
    ("event unknown field", _set("events.0.by", "x"), "lifecycle event has unknown field(s) by"),
    ("event seq gap", _set("events.2.seq", 7), "event 3 has seq 7"),
    ("event seq zero", _set("events.0.seq", 0), "seq must be a positive integer"),
    ("naive time", _set("events.0.at", "2026-05-01T10:00:00"), "has no time zone"),
    ("not a time", _set("events.0.at", "yesterday"), "'yesterday' is not an ISO 8601 time"),
    ("non-finite detail", _set("events.-1.detail", {"spend": float("nan")}), "non-finite number"),
    ("deep detail", _deep, "nested too deeply"),
    ("detail not object", _set("events.-1.detail", [1]), "detail must be a JSON object"),
    ("events out of order", _swap_events, "event 4 has seq 5"),
    ("previous lies", _set("events.1.previous", IDLE), "the event says it left IDLE, but the state was ROUTING"),
    ("previous skips", _set("events.4.previous", ACQUIRING), "it left ACQUIRING, but the state was PROBING"),
    ("skips PROBING", _skip_probing, "event 4 (ACQUIRING -> MATERIALIZING): cannot go from ACQUIRING"),
    ("READY without read-back", _set("events.6.detail", {}), "READY needs the read-back to have matched"),
    ("epoch reused", _set("events.2.epoch", 2), "needs an epoch greater than 2, got 2"),
    ("reason dropped", _set("events.-1.reason", None), "ACTIVE -> LOST needs a reason"),
]


@pytest.mark.parametrize(("mutate", "message"), [(m, msg) for _, m, msg in MUTATIONS],
                         ids=[name for name, _, _ in MUTATIONS])
def test_a_mutated_record_is_refused_with_a_clear_message(mutate: Any, message: str) -> None:
    obj = copy_module.deepcopy(full_record())
    mutate(obj)
    with pytest.raises(ManifestError) as err:
        Lifecycle.from_json(obj)
    assert message in str(err.value)


def test_a_forged_history_is_refused() -> None:
    # a record that jumps from ROUTING straight to ACTIVE, as a hostile file might
    obj = full_record()
    obj["events"] = obj["events"][:1] + [dict(obj["events"][7], seq=2, previous=ROUTING)]
    obj.update(state=ACTIVE, verified=True, version=3, updated=obj["events"][-1]["at"])
    with pytest.raises(ManifestError, match=r"event 2 \(ROUTING -> ACTIVE\): cannot go from ROUTING to ACTIVE"):
        Lifecycle.from_json(obj)
    # and a released allocation whose seal names no published version
    released = json.loads(json.dumps(reach(RELEASED, version=0).to_json()))
    for ev in released["events"][-2:]:
        ev["version"] = 0
    released["version"] = 0
    with pytest.raises(ManifestError, match=r"event 10 \(DRAINING -> SEALED\): SEALED needs the version"):
        Lifecycle.from_json(released)


# -- recovery -----------------------------------------------------------------------------------

RECOVERY = {
    IDLE: (IDLE, "nothing to resume"),
    ROUTING: (ROUTING, "resume: route again"),
    ACQUIRING: (ROUTING, "roll back to ROUTING: route again; check for an orphan allocation al-1 of epoch 3"),
    PROBING: (ROUTING, "roll back to ROUTING: route again; check for an orphan allocation al-1 of epoch 3"),
    MATERIALIZING: (MATERIALIZING, "resume: materialize version 3 again on allocation al-1"),
    VERIFYING: (MATERIALIZING, "roll back to MATERIALIZING"),
    READY: (READY, "resume: restart the kernel on allocation al-1"),
    ACTIVE: (ACTIVE, "nothing to resume: allocation al-1 (epoch 3) is active"),
    DRAINING: (DRAINING, "resume: finish sealing allocation al-1"),
    SEALED: (SEALED, "resume: release allocation al-1, sealed at version 4"),
    RELEASED: (RELEASED, "nothing to resume"),
    LOST: (LOST, "nothing to resume: allocation al-1 was lost; version 4 is the truth"),
    FAILED: (FAILED, "nothing to resume"),
}


@pytest.mark.parametrize("state", STATES)
def test_recover_resumes_or_rolls_back_from_each_state(state: str) -> None:
    lc = reach(state)
    after, action = recover(lc, at=at(59))
    expected_state, expected_action = RECOVERY[state]
    assert after.state == expected_state
    assert action.startswith(expected_action)
    if state in (ROUTING, ACQUIRING, PROBING, MATERIALIZING, VERIFYING):
        ev = after.events[-1]
        assert (ev.previous, ev.reason, after.last_seq) == (state, "resumed after a restart", lc.last_seq + 1)
        assert ev.detail["action"] == ("resume" if action.startswith("resume") else "roll back")
    else:
        assert after is lc  # nothing happened, so nothing is recorded and nothing is invented
    assert Lifecycle.from_json(after.to_json()) == after


def test_a_machine_launched_before_the_restart_is_recorded_as_an_orphan_and_fenced() -> None:
    after, _ = recover(reach(ACQUIRING), at=at(59))
    assert after.allocation_id is None and after.epoch == 3
    assert after.events[-1].detail["orphan"] == {"allocation_id": "al-1", "epoch": 3, "route": "r-1"}
    assert after.attempts[-1]["allocation_id"] == "al-1" and after.attempts[-1]["orphan"] is True
    nxt = step(after, ACQUIRING, route="r-1")
    with pytest.raises(IllegalTransition, match="greater than 3"):
        step(nxt, ACQUIRING, allocation_id="al-2", epoch=3)
    # before the write-ahead nothing was launched, and recovery says so
    bare, action = recover(step(reach(ROUTING), ACQUIRING, route="r-1"), at=at(59))
    assert bare.state == ROUTING and "none was launched" in action and bare.attempts == ()


# -- the store ----------------------------------------------------------------------------------

@pytest.fixture
def ws(tmp_path: Path) -> WorkspaceCopy:
    copy = WorkspaceCopy(tmp_path / "work")
    copy.write_config(CopyConfig(WS, "file:///nowhere", version=3, epoch=2))
    return copy


def test_a_fresh_copy_is_idle_at_its_version_and_updates_persist(ws: WorkspaceCopy) -> None:
    fresh = lifecycle_store.load(ws)
    assert (fresh.state, fresh.version, fresh.epoch, fresh.events) == (IDLE, 3, 2, ())
    assert not lifecycle_store.lifecycle_path(ws).exists()
    lc = lifecycle_store.update(ws, lambda lc: step(lc, ROUTING))
    lc = lifecycle_store.update(ws, lambda lc: step(lc, ACQUIRING, route="r-1"))
    assert lifecycle_store.load(ws) == lc
    assert [e.state for e in lifecycle_store.events_since(ws, 0)] == [ROUTING, ACQUIRING]
    assert [e.seq for e in lifecycle_store.events_since(ws, 1)] == [2]
    assert lifecycle_store.events_since(ws, 2) == []
    assert lifecycle_store.update(ws, lambda lc: lc) == lc  # nothing changed, nothing written


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "is not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "is not valid JSON"),
    (b'{"format": "jupyter-portable.lifecycle", "schema": 1}', "lacks"),
    (b"", "is not valid JSON"),
])
def test_a_corrupt_file_is_refused_and_left_alone(ws: WorkspaceCopy, body: bytes, message: str) -> None:
    path = lifecycle_store.lifecycle_path(ws)
    path.write_bytes(body)
    for call in (lambda: lifecycle_store.load(ws), lambda: lifecycle_store.update(ws, lambda lc: step(lc, ROUTING)),
                 lambda: lifecycle_store.events_since(ws, 0)):
        with pytest.raises(ManifestError, match=message) as err:
            call()
        assert str(path) in str(err.value) and "move it aside" in (err.value.hint or "")
    assert path.read_bytes() == body


def test_another_workspaces_record_and_rewritten_history_are_refused(ws: WorkspaceCopy) -> None:
    other = Lifecycle.new("ws-other", at=T0)
    lifecycle_store.lifecycle_path(ws).write_text(json.dumps(step(other, ROUTING).to_json()))
    with pytest.raises(ManifestError, match="belongs to workspace ws-other, this copy is ws-lifecycle"):
        lifecycle_store.load(ws)
    lifecycle_store.lifecycle_path(ws).unlink()
    lifecycle_store.update(ws, lambda lc: step(step(lc, ROUTING), FAILED, reason="no route"))
    before = lifecycle_store.lifecycle_path(ws).read_bytes()
    with pytest.raises(ManifestError, match="may only add events"):
        lifecycle_store.update(ws, lambda lc: step(Lifecycle.new(WS, at=T0, version=3, epoch=2), ROUTING))

    def boom(lc: Lifecycle) -> Lifecycle:
        raise IllegalTransition("refused")
    with pytest.raises(IllegalTransition):
        lifecycle_store.update(ws, boom)
    assert lifecycle_store.lifecycle_path(ws).read_bytes() == before


def test_a_held_lock_times_out_with_a_clear_error(ws: WorkspaceCopy) -> None:
    (ws.root / ".portable").mkdir(parents=True, exist_ok=True)
    fd = os.open(ws.root / ".portable" / "lifecycle.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(ConflictError, match="another process has held"):
            lifecycle_store.update(ws, lambda lc: step(lc, ROUTING), timeout_s=0.05)
    finally:
        os.close(fd)
    assert lifecycle_store.update(ws, lambda lc: step(lc, ROUTING)).state == ROUTING


ROUNDS = 40


def _racer(root: str, name: str, start: Any) -> None:
    import time

    copy = WorkspaceCopy(Path(root))
    start.wait()

    def reroute(lc: Lifecycle) -> Lifecycle:
        time.sleep(0.001)  # widen the read-modify-write window: without the lock, updates get lost
        return transition(lc, ROUTING, at=T0, reason=f"{name} {lc.last_seq}")

    for _ in range(ROUNDS):
        lifecycle_store.update(copy, reroute)


def test_two_processes_updating_at_once_lose_no_event(ws: WorkspaceCopy) -> None:
    lifecycle_store.update(ws, lambda lc: step(lc, ROUTING))
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_racer, args=(str(ws.root), name, start)) for name in ("cli", "server")]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    events = lifecycle_store.load(ws).events
    assert len(events) == 1 + 2 * ROUNDS
    assert [e.seq for e in events] == list(range(1, 2 + 2 * ROUNDS))
    reasons = [e.reason for e in events[1:]]
    for name in ("cli", "server"):
        assert sum(1 for r in reasons if r and r.startswith(name + " ")) == ROUNDS
    # each writer saw the other's events: the seq it read is the one before its own
    assert all(r == f"{(r or '').split()[0]} {e.seq - 1}" for r, e in zip(reasons, events[1:], strict=True))
