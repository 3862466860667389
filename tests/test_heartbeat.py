"""The loss check measures heartbeat silence on the clock it is given, never on one it reads:
a worker that stops answering is LOST only once ``stale_after_s`` of that clock has passed,
however long the machine under test takes between two looks."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from jupyter_e2e import (
    env,  # noqa: F401 - fixtures
    make_workspace,
)


def test_silence_is_lost_only_after_stale_after_s_of_the_given_clock(env: dict[str, Path], tmp_path: Path) -> None:
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp_path / "ws", env["store"])
    reads: list[float] = []

    def clock() -> float:  # the Continue may time itself on it; check(now=...) must not read it
        reads.append(float(len(reads)))
        return reads[-1]

    orch = Orchestrator(ws, stale_after_s=10.0, clock=clock)
    try:
        assert orch.continue_()["state"] == L.ACTIVE
        rec = orch.record()
        assert rec is not None
        # the agent goes silent; the machine itself still runs (the agent's session goes with it:
        # the kernel it started ahead would outlive the test, with nobody left to stop it)
        os.killpg(rec.pid, signal.SIGKILL)
        before = len(reads)
        first: Any = orch.check(now=1000.0)
        assert first["alive"] is False and first["state"] == L.ACTIVE
        assert orch.check(now=1009.9)["state"] == L.ACTIVE  # 9.9 s of silence: not yet
        lost = orch.check(now=1010.0)
        assert lost["state"] == L.LOST and lost["alive"] is False
        assert "heartbeats stopped" in (orch.lifecycle().events[-1].reason or "")
        assert len(reads) == before, "check() read the clock although it was given now"
    finally:
        orch.close()
