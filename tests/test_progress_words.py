"""The words of a Continue's steps once they are done (issue 30, item 5): the acquire step ends
saying the machine is up, never on its last "waiting for the machine (0:00): pending"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace, portable_env, release_all

from jupyter_portable import Workspace
from jupyter_portable.orchestration.orchestrator import Orchestrator


@pytest.mark.timeout(300)
def test_the_acquire_step_ends_saying_the_machine_is_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = portable_env(tmp_path, monkeypatch)
    make_workspace(tmp_path / "ws", dirs["store"])
    seen: list[dict[str, Any]] = []
    orch = Orchestrator(Workspace.find(tmp_path / "ws"), on_progress=seen.append)
    try:
        assert orch.continue_()["state"] == "ACTIVE"
        steps = [e["step"] for e in seen]
        acquire = [e["message"] for e in seen[:steps.index("probe")] if e["step"] == "acquire"]
        # the step's last message, which the sidebar keeps under the finished step
        assert re.fullmatch(r"local/\S+ is up after \d+:\d\d", acquire[-1]), acquire
        assert "acquire" not in steps[steps.index("probe"):], "nothing more is said of a finished step"
    finally:
        orch.stop()
        release_all()
