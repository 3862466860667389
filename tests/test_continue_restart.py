"""A server restarted mid-Continue leaves one consistent state and no fork.

``jupyter portable continue`` is SIGKILLed just after it recorded entering each state of the
Continue (the write-ahead ACQUIRING, PROBING, MATERIALIZING, VERIFYING, READY); then a real
Jupyter server with the extension starts in the workspace and finishes or rolls back."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hooks_site.portable_faults import fault_env
from jupyter_e2e import (
    env,  # noqa: F401 - fixtures
    make_workspace,
)

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

KILL_POINTS = ["ACQUIRING:2", "PROBING", "MATERIALIZING", "VERIFYING", "READY"]


@pytest.fixture
def jp_root_dir(tmp_path: Path, env: dict[str, Path], request: pytest.FixtureRequest) -> Path:
    root = tmp_path / "workspace"
    make_workspace(root, env["store"])
    kill_at = request.node.callspec.params["kill_at"]
    proc = subprocess.run([str(Path(sys.executable).parent / "jupyter-portable"), "continue", "--json"], cwd=root,
                          env=fault_env(JUPYTER_PORTABLE_KILL_IN_STATE=kill_at),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    return root


async def settled(jp_fetch: Any) -> dict[str, Any]:
    """The state once the server's resume (and the Continue it goes on with) has ended: no
    Continue runs and the lifecycle is out of the Continue's states. The test's timeout bounds
    the wait, not a count of polls (a loaded machine is slower, not wrong)."""
    from jupyter_portable.core.lifecycle import CONTINUE_STATES

    while True:
        state = json.loads((await jp_fetch("portable", "api", "state")).body)
        if not state["continuing"] and state["lifecycle"]["state"] not in CONTINUE_STATES:
            return dict(state)
        await asyncio.sleep(0.2)


def story(root: Path, state: dict[str, Any]) -> str:
    """What a failed assertion shows: every recorded move with its reason, and the answer."""
    from jupyter_portable import Workspace
    from jupyter_portable.workdir.lifecycle_file import lifecycle_path

    record = json.loads(lifecycle_path(Workspace.find(root).copy).read_bytes())
    moves = [f"{e.get('state')}: {e.get('reason')} {e.get('allocation_id')}" for e in record.get("events", [])]
    return "\n".join([*moves, json.dumps(state["lifecycle"])[:2000]])


@pytest.fixture
def failing_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restarted server's resume raises something no step expected (a bug, a store answering
    nonsense): set before the server starts."""
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    def resume(self: Any) -> dict[str, Any]:
        raise RuntimeError("the store answered nonsense")

    monkeypatch.setattr(Orchestrator, "resume", resume)


@pytest.mark.parametrize("kill_at", ["ACQUIRING:2"])
async def test_a_resume_that_fails_ends_failed_and_continue_is_offered(
        kill_at: str, failing_resume: None, jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path,
        env: dict[str, Path]) -> None:
    """Nothing is left half-way with nothing driving it: before, the lifecycle stayed ACQUIRING
    with no Continue running, and the sidebar could neither cancel nor Continue."""
    state = await settled(jp_fetch)
    lc = state["lifecycle"]
    assert lc["state"] == "FAILED", story(jp_root_dir, state)
    assert "the store answered nonsense" in (lc["events"][-1].get("reason") or ""), story(jp_root_dir, state)
    assert state["can_continue"] is True
    # and Continue, pressed again, reaches a verified machine
    await jp_fetch("portable", "api", "continue", method="POST", body=json.dumps({}))
    state = await settled(jp_fetch)
    assert state["lifecycle"]["state"] == "ACTIVE", story(jp_root_dir, state)


@pytest.mark.parametrize("kill_at", KILL_POINTS)
async def test_restart_mid_continue_ends_consistent(kill_at: str, jp_serverapp: Any, jp_fetch: Any,
                                                    jp_root_dir: Path, env: dict[str, Path]) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.core.lifecycle import Lifecycle
    from jupyter_portable.demo.market import LocalMarket
    from jupyter_portable.workdir.lifecycle_file import lifecycle_path

    state = await settled(jp_fetch)
    lc = state["lifecycle"]
    assert lc["state"] == "ACTIVE" and lc["verified"] is True, story(jp_root_dir, state)
    # the record replays by the rules (a reader refuses anything else)
    Lifecycle.from_json(json.loads(lifecycle_path(Workspace.find(jp_root_dir).copy).read_bytes()))
    # exactly one machine runs: the one the workspace is active on; any orphan was released
    running = [a for a in LocalMarket().list_allocations() if a["state"] in ("active", "pending", "reachable")]
    assert [a["allocation_id"] for a in running] == [lc["allocation_id"]], running
    # no fork: one manifest per version, one chain from the head
    ws = Workspace.find(jp_root_dir)
    head = ws.store.read_head(ws.workspace_id)[0]
    manifests = ws.store.backend.list(f"workspaces/{ws.workspace_id}/manifests")
    assert len(manifests) == head.version
    assert [m.version for m in ws.store.history(ws.workspace_id)] == list(range(head.version, 0, -1))
    active = [a for a in ws.manifest(head.version).allocations if a["state"] == "active"]
    assert [a["allocation_id"] for a in active] == [lc["allocation_id"]]
    # and the restored worker answers
    st = json.loads((await jp_fetch("portable", "api", "files")).body)
    assert st["worker"] and "error" not in st["worker"], st["worker"]
