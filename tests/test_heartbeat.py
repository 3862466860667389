"""The loss check measures heartbeat silence on the time it is given, never on a clock it reads: a
worker that stops answering is unreachable, and LOST only once the grace (``stale_after_s``) has passed
on that time while its provider cannot say the machine runs (issue 42, core/reachability.py)."""

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


def test_silence_is_lost_only_after_the_grace_and_only_while_the_provider_cannot_say(
        env: dict[str, Path], tmp_path: Path) -> None:
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.core.errors import ProviderUnavailable
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp_path / "ws", env["store"])
    reads: list[float] = []

    def clock() -> float:  # the Continue may time itself on it; check(now=...) must not read it
        reads.append(float(len(reads)))
        return reads[-1]

    def wall() -> Any:
        raise AssertionError("check() read the wall clock although it was given now")

    orch = Orchestrator(ws, stale_after_s=10.0, clock=clock, wall=wall)
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
        assert first["unreachable_since"] == "1970-01-01T00:16:40Z"
        assert orch.check(now=1009.9)["state"] == L.ACTIVE  # 9.9 s of silence: not yet
        # past the grace, but the local market says the machine runs: silence alone is no evidence
        kept = orch.check(now=1500.0)
        assert (kept["state"], kept["unreachable_since"]) == (L.ACTIVE, "1970-01-01T00:16:40Z")
        provider = orch.provider_of(rec.allocation)
        assert provider.status(rec.allocation).state != "terminated"  # nothing was released

        def cannot_say(allocation: Any) -> Any:
            raise ProviderUnavailable("the market does not answer", provider=provider.name)

        provider.status = cannot_say  # type: ignore[method-assign]
        lost = orch.check(now=1500.0)
        assert lost["state"] == L.LOST and lost["alive"] is False
        reason = orch.lifecycle().events[-1].reason or ""
        assert "no path reached the machine" in reason and "since 00:16Z" in reason, reason
        assert len(reads) == before, "check() read the clock although it was given now"
    finally:
        orch.close()
