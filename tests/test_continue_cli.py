"""``jupyter portable continue``, ``state`` and ``stop`` without a server, on the local market:
the JSON contract, loss recorded with its reason, epoch fencing of a lost worker, a Continue
with no admissible route, and the seal's read-back before release."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import (
    CATALOG,
    env,  # noqa: F401 - fixtures
    make_workspace,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def root(tmp_path: Path, env: dict[str, Path]) -> Path:
    make_workspace(tmp_path / "ws", env["store"])
    return tmp_path / "ws"


def _market() -> Any:
    from jupyter_portable.demo.market import LocalMarket

    return LocalMarket()


def test_continue_state_stop_and_fencing(env: dict[str, Path], root: Path, cli: Any) -> None:
    from jupyter_portable import FencedError, Workspace
    from jupyter_portable.demo.market import lose_allocation
    from jupyter_portable.workdir.workcopy import WorkspaceCopy

    out = cli.json("continue", cwd=root)
    assert set(out) == {"state", "allocation_id", "route", "version", "verified", "provider", "machine", "environment"}
    assert out["state"] == "ACTIVE" and out["verified"] is True and out["route"].startswith("r-")
    assert out["provider"] == "local" and out["machine"]["ssh"] is None  # the local market is not reached by SSH
    first = out["allocation_id"]
    state = cli.json("state", cwd=root)
    assert state["state"] == "ACTIVE" and state["alive"] is True
    again = cli("continue", cwd=root, check=False)
    assert again.returncode != 0 and "active" in again.stderr and len(again.stderr.strip().splitlines()) == 1

    # loss: recorded on the allocation, the workspace shows LOST with the reason
    lose_allocation(env["market"], first)
    state = cli.json("state", cwd=root)
    assert state["state"] == "LOST" and state["alive"] is False
    ws = Workspace.find(root)
    rec = next(a for a in ws.manifest(ws.store.read_head(ws.workspace_id)[0].version).allocations
               if a["allocation_id"] == first)
    assert rec["state"] == "lost" and rec["stop_reason"] == "preempted by the market" and rec["failures"]

    # the lost worker's copy can never publish again (epoch fencing), even if it comes back
    lost_copy = Workspace(WorkspaceCopy(env["market"] / "allocations" / first / "work"))
    (lost_copy.root / "late.txt").write_text("written after the loss")
    with pytest.raises(FencedError):
        lost_copy.snapshot("too late", progress=None)

    second = cli.json("continue", cwd=root)
    assert second["state"] == "ACTIVE" and second["allocation_id"] != first
    stopped = cli.json("stop", cwd=root)
    assert stopped["state"] == "RELEASED"
    head = ws.store.read_head(ws.workspace_id)[0]
    released = [a for a in ws.manifest(head.version).allocations if a["allocation_id"] == second["allocation_id"]]
    assert released[0]["state"] == "released" and released[0]["stop_reason"] == "stopped by the user"
    # released only after the seal: the sealed version is in the history, and the machine is gone
    assert stopped["sealed_version"] <= head.version
    assert all(a["state"] != "active" for a in _market().list_allocations())
    # the state in the words the sidebar and a cell's error use (core/state_words.py)
    from jupyter_portable.core.state_words import words

    said = cli("state", cwd=root).stdout
    assert said.startswith("RELEASED at version ") and words("RELEASED").meaning in said, said
    # the state's line ends with the machine; the budget follows on a line of its own (issue 43 item 4)
    line, budget = said.splitlines()[:2]
    assert line.endswith(")") and "(no machine; the last was al-" in line, said
    assert budget.startswith("budget: "), said
    nothing = cli("stop", cwd=root, check=False)
    assert nothing.returncode != 0 and "nothing to stop" in nothing.stderr


def test_no_admissible_route_fails_and_releases(env: dict[str, Path], root: Path, cli: Any,
                                                monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    only_stale = CATALOG[:CATALOG.index("[[offer]]\nid = \"a100\"")]
    (tmp_path / "stale.toml").write_text(only_stale)
    cli.env["JUPYTER_PORTABLE_CATALOG"] = str(tmp_path / "stale.toml")
    monkeypatch.setenv("JUPYTER_PORTABLE_CATALOG", str(tmp_path / "stale.toml"))
    cli("settings", "--driver", "550.54.15", cwd=root)
    proc = cli("continue", "--json", cwd=root, check=False)
    assert proc.returncode != 0
    assert "every route failed" in proc.stderr and "535.104.05" in proc.stderr
    state = cli.json("state", "--events", cwd=root)
    assert state["state"] == "FAILED"
    failed = [e for e in state["events"] if e["state"] == "FAILED"]
    assert "535.104.05" in failed[-1]["reason"]
    assert all(a["state"] != "active" for a in _market().list_allocations())


def test_continue_with_a_route_and_bad_routes(env: dict[str, Path], root: Path, cli: Any) -> None:
    routes = cli.json("routes", cwd=root)["routes"]
    a100 = next(r for r in routes if r["offer"] == "a100")
    out = cli.json("continue", "--route", a100["id"], cwd=root)
    assert out["route"] == a100["id"] and out["state"] == "ACTIVE"
    events = cli.json("state", "--events", cwd=root)["events"]
    assert [e["state"] for e in events] == ["ROUTING", "ACQUIRING", "ACQUIRING", "PROBING", "MATERIALIZING",
                                            "VERIFYING", "READY", "ACTIVE"]
    ready = events[6]
    assert ready["detail"]["matched"] == ["version", "checkpoints", "runtime", "path"]
    # the worker's token stays in its 0600 record on this machine: never in the lifecycle, the store or a log
    rec_file = root / ".portable" / "agents" / f"{out['allocation_id']}.json"
    assert rec_file.stat().st_mode & 0o077 == 0
    token = json.loads(rec_file.read_text())["token"]
    assert len(token) >= 32
    assert token not in (root / ".portable" / "lifecycle.json").read_text()
    for f in [*env["store"].rglob("*"), *env["market"].rglob("*.log")]:
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f
    cli("stop", cwd=root)
    assert not rec_file.exists()
    bad = cli("continue", "--route", "r-nope", cwd=root, check=False)
    assert bad.returncode != 0 and "no route" in bad.stderr


def test_a_checkpoint_file_saved_again_and_again_still_continues(env: dict[str, Path], root: Path, cli: Any) -> None:
    """Saving one checkpoint file each epoch is the common case: the read-back holds the newest
    verified record of a path to the file, not every record ever made of it (before, the second
    save failed every later Continue: "hashes to ..., recorded ...")."""
    from jupyter_portable import Workspace

    ws = Workspace.find(root)
    ckpt = root / "ckpt" / "weights.bin"
    ckpt.parent.mkdir()
    for step in (1, 2, 3):
        ckpt.write_bytes(f"epoch {step} ".encode() * 1000)
        rec = ws.checkpoint(ckpt, step=step, quiet_s=0, progress=None)
        assert rec.verified, rec
    out = cli.json("continue", cwd=root)
    assert out["state"] == "ACTIVE" and out["verified"] is True
    work = env["market"] / "allocations" / out["allocation_id"] / "work"
    assert (work / "ckpt" / "weights.bin").read_bytes() == ckpt.read_bytes()
    cli.json("stop", cwd=root)


def test_a_checkpoint_overwritten_without_a_new_record_is_named_not_fatal(
        env: dict[str, Path], root: Path, cli: Any) -> None:
    """The file of a verified checkpoint changed after it was verified (a save whose check was
    refused, or a plain overwrite), and a later version published it: the files are that version's,
    and READY says which checkpoint is no longer on disk (it is in the version that verified it)."""
    from jupyter_portable import Workspace

    ws = Workspace.find(root)
    ckpt = root / "model.bin"
    ckpt.write_bytes(b"verified weights " * 1000)
    rec = ws.checkpoint(ckpt, step=1, quiet_s=0, progress=None)
    assert rec.verified
    ckpt.write_bytes(b"half-written weights " * 10)
    ws.snapshot("after a crash mid-save", progress=None)
    out = cli.json("continue", cwd=root)
    assert out["state"] == "ACTIVE" and out["verified"] is True
    state = cli.json("state", "--events", cwd=root)
    ready = [e for e in state["events"] if e["state"] == "READY"][-1]
    superseded = ready["detail"]["superseded"]
    assert superseded == {"model.bin": rec.version}, ready["detail"]
    cli.json("stop", cwd=root)
