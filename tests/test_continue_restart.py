"""A server restarted mid-Continue leaves one consistent state and no fork.

``jupyter portable continue`` is SIGKILLed just after it recorded entering each state of the
Continue (the write-ahead ACQUIRING, PROBING, MATERIALIZING, VERIFYING, READY); then a real
Jupyter server with the extension starts in the workspace and finishes or rolls back."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace, portable_env, release_all

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

KILL_POINTS = ["ACQUIRING:2", "PROBING", "MATERIALIZING", "VERIFYING", "READY"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    yield portable_env(tmp_path, monkeypatch)
    release_all()


@pytest.fixture
def jp_root_dir(tmp_path: Path, env: dict[str, Path], request: pytest.FixtureRequest) -> Path:
    root = tmp_path / "workspace"
    make_workspace(root, env["store"])
    kill_at = request.node.callspec.params["kill_at"]
    proc = subprocess.run([str(Path(sys.executable).parent / "jupyter-portable"), "continue", "--json"], cwd=root,
                          env={**os.environ, "JUPYTER_PORTABLE_KILL_IN_STATE": kill_at},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    return root


@pytest.mark.parametrize("kill_at", KILL_POINTS)
async def test_restart_mid_continue_ends_consistent(kill_at: str, jp_serverapp: Any, jp_fetch: Any,
                                                    jp_root_dir: Path, env: dict[str, Path]) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.compute.local import LocalMarket
    from jupyter_portable.core.lifecycle import Lifecycle
    from jupyter_portable.workdir.lifecycle_file import lifecycle_path

    state: dict[str, Any] = {}
    for _ in range(600):
        state = json.loads((await jp_fetch("portable", "api", "state")).body)
        if state["lifecycle"]["state"] in ("ACTIVE", "FAILED") and not state["continuing"]:
            break
        await asyncio.sleep(0.2)
    lc = state["lifecycle"]
    assert lc["state"] == "ACTIVE" and lc["verified"] is True, lc
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
