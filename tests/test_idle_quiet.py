"""Idle autostop without a dialog (issue 30, item 4): a change of idle_minutes starts a fresh
countdown (never a stop within seconds for a machine already idle longer than the new value), and a
kernel whose machine is being sealed and released is no kernel death for jupyter_server's restarter
(which would show JupyterLab's "Kernel Restarting ... appears to have died")."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.idle import IDLE, STOP, WARNING
from jupyter_portable.core.times import to_iso
from jupyter_portable.orchestration.idle import IdleWatch

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
M = timedelta(minutes=1)


class _Machine:
    """An orchestrator with one active machine whose worker last saw a cell end at ``T0``."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def lifecycle(self) -> Any:
        return SimpleNamespace(state=L.ACTIVE, allocation_id="al-1", events=[])

    def client(self, aid: str) -> Any:
        activity = {"ready_at": to_iso(T0 - 5 * M), "last_execution": to_iso(T0), "kept_at": None,
                    "kernel_busy": False, "gpu": {"samples": [], "last_busy": None}}
        return SimpleNamespace(status=lambda timeout=None: {"activity": activity})

    def stop(self, reason: str, **_: Any) -> None:
        self.stopped.append(reason)


def _watch(minutes: list[float]) -> tuple[IdleWatch, _Machine, list[str]]:
    machine = _Machine()
    told: list[str] = []
    watch = IdleWatch(None, lambda: machine, restarted=lambda: told.append("restarted"))  # type: ignore[arg-type]
    watch.minutes = lambda now: minutes[0]  # type: ignore[method-assign]  # the workspace's setting
    watch._stop = lambda orch, aid, d: machine.stop("idle")  # type: ignore[method-assign]
    return watch, machine, told


def test_lowering_idle_minutes_below_the_time_already_idle_starts_a_fresh_countdown() -> None:
    minutes = [30.0]
    watch, machine, told = _watch(minutes)
    d = watch.check(now=T0 + 20 * M)
    assert d is not None and d.state == IDLE and d.remaining_s == 600
    # the user lowers it to 5 minutes, after 20 idle ones: a countdown of 5 minutes from now, not a stop
    minutes[0] = 5.0
    seen = T0 + 20 * M + timedelta(seconds=2)
    d = watch.check(now=seen)
    assert d is not None and d.state == WARNING and d.stop_at == seen + 5 * M and d.remaining_s == 300
    assert machine.stopped == [] and told == ["restarted"]
    # the countdown runs on from there; Keep running is offered all along (WARNING), and then it stops
    d = watch.check(now=seen + 4 * M)
    assert d is not None and d.state == WARNING and d.remaining_s == 60 and told == ["restarted"]
    assert watch.check(now=seen + 5 * M).state == STOP and machine.stopped == ["idle"]


def test_raising_it_counts_from_the_change_and_an_unchanged_setting_changes_nothing() -> None:
    minutes = [10.0]
    watch, machine, told = _watch(minutes)
    assert watch.check(now=T0 + 8 * M).state == WARNING
    assert watch.check(now=T0 + 9 * M).stop_at == T0 + 10 * M  # same setting: the same countdown
    minutes[0] = 60.0
    d = watch.check(now=T0 + 9 * M)
    assert d.state == IDLE and d.stop_at == T0 + 69 * M and told == ["restarted"] and machine.stopped == []


class _Kernel:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def kernel(self) -> dict[str, Any]:
        return self.answer


@pytest.mark.parametrize(("state", "serving", "dead"), [
    (L.ACTIVE, "al-1", True),  # a real death while the machine serves: the restarter's (and its dialog)
    (L.DRAINING, "al-1", False),  # sealing: the agent stops its kernel on the way out
    (L.SEALED, "al-1", False),
    (L.RELEASED, "al-1", False),
    (L.LOST, "al-1", False),
    (L.ACTIVE, "al-2", False),  # another machine serves the workspace now
])
def test_a_kernel_ending_with_its_machine_is_no_death(monkeypatch: pytest.MonkeyPatch, state: str, serving: str,
                                                       dead: bool) -> None:
    from jupyter_portable.orchestration import provisioner
    from jupyter_portable.workdir import lifecycle_file

    monkeypatch.setattr(lifecycle_file, "load", lambda copy: SimpleNamespace(state=state, allocation_id=serving))
    monkeypatch.setattr(provisioner, "_workspace_for", lambda root: SimpleNamespace(copy=None))
    prov = provisioner.PortableProvisioner(kernel_id="k-1", kernel_spec=None)
    prov._workspace_root = "/w"
    prov._record = SimpleNamespace(allocation_id="al-1")
    prov._alive = True
    prov._client = _Kernel({"alive": False, "returncode": 0, "started": True, "machine_gone": False})
    rc = asyncio.run(prov.poll())
    assert rc == (0 if dead else None)


def test_a_continue_that_moved_the_kernels_says_so_once() -> None:
    """Issue 30, item 5: "Now on ..." (the kernels moved) and "Ready on ..." were two toasts for one
    event; after the move's notice, ACTIVE sends none."""
    from jupyter_portable.orchestration.monitor import PortableService

    service = PortableService(SimpleNamespace(), None)
    told: list[tuple[str, str]] = []
    service.notice = lambda kind, message: told.append((kind, message))  # type: ignore[method-assign]
    service.emit = lambda schema, data: None  # type: ignore[method-assign]
    active = {"workspace_id": "ws-1", "seq": 9, "state": L.ACTIVE, "previous": L.READY, "allocation_id": "al-2",
              "version": 4}
    service.on_state(active)
    assert [k for k, _ in told] == ["ready"], "without a move, ACTIVE is the news"
    told.clear()
    service._told_moved = "al-2"  # reconnect() said "Now on ..." for al-2
    service.on_state({**active, "seq": 10})
    assert told == []
    service.on_state({**active, "seq": 11, "allocation_id": "al-3"})
    assert [k for k, _ in told] == ["ready"]
    # an event already told (this server's own, then seen again in the lifecycle file) is told once
    service.on_state({**active, "seq": 11, "allocation_id": "al-3"})
    assert [k for k, _ in told] == ["ready"]
    service.pool.shutdown(wait=False)
