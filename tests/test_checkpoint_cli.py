"""Checkpoints, runtime and diff from the command line, with a fake GPU on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import write_tree
from fakegpu import H100, install_fake_nvidia_smi
from safetensors.numpy import save_file

from jupyter_portable import Workspace


def _gpu_env(tmp_path: Path, driver: str = "550.54.15") -> dict[str, str]:
    bin_dir = tmp_path / f"gpu-bin-{driver}"
    install_fake_nvidia_smi(bin_dir, [H100, H100], driver=driver, cuda="12.4")
    return {"PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_status_shows_the_fake_gpu_and_the_latest_checkpoint(cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(root / "step2.safetensors"))
    env = _gpu_env(tmp_path)
    out = cli.json("checkpoint", "step2.safetensors", "--step", "2", "--settle", "0.2", cwd=root, extra_env=env)
    assert out["status"] == "verified" and out["step"] == 2 and out["reason"] is None and len(out["hash"]) == 64
    assert out["version"] == 1 and out["path"] == "step2.safetensors"
    (root / "half.safetensors").write_bytes((root / "step2.safetensors").read_bytes()[:40])
    proc = cli("checkpoint", "half.safetensors", "--step", "3", "--settle", "0.2", "--json", cwd=root,
               extra_env=env, check=False)
    assert proc.returncode == 1
    rejected = json.loads(proc.stdout)
    assert rejected["status"] == "rejected" and "truncated" in rejected["reason"] and rejected["hash"] is None
    assert proc.stderr.splitlines()[-1].startswith("error: REJECTED: half.safetensors")

    st = cli.json("status", cwd=root, extra_env=env)
    assert {"workspace_id", "version", "latest_checkpoint", "runtime", "next_action"} <= st.keys()
    assert st["latest_checkpoint"] == {"path": "step2.safetensors", "step": 2, "hash": out["hash"], "version": 1}
    gpus = st["runtime"]["gpus"]
    assert [g["driver"] for g in gpus] == ["550.54.15", "550.54.15"]
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3" and gpus[0]["memory_mb"] == 81559 and gpus[0]["uuid"]
    assert st["runtime"]["python"].count(".") == 2
    # The recorded runtime of the published version saw the same GPU.
    recorded = ws.manifest().runtime
    assert recorded["gpus"][0]["driver"] == "550.54.15" and recorded["lockfile"]
    lock = ws.store.get_object(recorded["lockfile"]).decode()
    assert "blake3==" in lock and "jupyter-portable" in lock
    # Without a GPU the status says so instead of failing.
    st = cli.json("status", cwd=root, extra_env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert st["runtime"]["gpus"] == [] and st["runtime"]["gpu_note"].startswith("no GPU")
    listing = cli.json("checkpoints", cwd=root)
    assert [c["status"] for c in listing["checkpoints"]] == ["verified", "rejected"]
    assert listing["latest"]["path"] == "step2.safetensors"


def test_diff_shows_files_and_driver(cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"a.txt": "a", "b.txt": "b"})
    Workspace.init(root, f"file://{tmp_path}/store")
    cli.json("snapshot", cwd=root, extra_env=_gpu_env(tmp_path, "550.54.15"))
    (root / "a.txt").write_text("changed")
    (root / "b.txt").unlink()
    (root / "c.txt").write_text("new")
    cli.json("snapshot", cwd=root, extra_env=_gpu_env(tmp_path, "535.104.05"))
    d = cli.json("diff", "1", "2", cwd=root)
    assert d["files"] == {"added": ["c.txt"], "removed": ["b.txt"], "changed": ["a.txt"]}
    assert d["runtime"]["driver"] == ["550.54.15", "535.104.05"]
    text = cli("diff", "1", "2", cwd=root).stdout
    assert "+ c.txt" in text and "- b.txt" in text and "~ a.txt" in text and "535.104.05" in text


def test_a_checkpoint_outside_or_ignored_is_a_usage_error(cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {".portableignore": "*.ckpt\n", "x.ckpt": "data"})
    Workspace.init(root, f"file://{tmp_path}/store")
    proc = cli("checkpoint", "x.ckpt", cwd=root, check=False)
    assert proc.returncode == 2 and "excluded by .portableignore" in proc.stderr
    proc = cli("checkpoint", str(tmp_path / "elsewhere.pt"), cwd=root, check=False)
    assert proc.returncode == 2 and "outside the workspace" in proc.stderr
    proc = cli("checkpoint", "not-saved-yet.pt", cwd=root, check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert Workspace.find(root).log() == [], "nothing was published for a path that is not there"


def test_lockfile_object_is_never_a_secret(tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"a.txt": "a"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="very-secret-value-123", HF_TOKEN="hf_secret_token_456")
    subprocess.run([sys.executable, "-m", "jupyter_portable", "snapshot", "-q"], cwd=root, env=env, check=True)
    store_dir = tmp_path / "store"
    for p in store_dir.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert b"very-secret-value-123" not in data and b"hf_secret_token_456" not in data, p
    assert ws.manifest().runtime is not None


def test_a_checkpoint_reached_through_a_symlink_leading_outside_is_refused_with_that_reason(
        cli, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(elsewhere / "real.safetensors"))
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n"})
    (root / "ckpt").mkdir()
    save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(root / "ckpt" / "inside.safetensors"))
    Workspace.init(root, f"file://{tmp_path}/store")
    (root / "model.safetensors").symlink_to(elsewhere / "real.safetensors")
    (root / "linked").symlink_to(elsewhere)
    (root / "ckpt" / "shard.safetensors").symlink_to(elsewhere / "real.safetensors")
    for path, said in (("model.safetensors", "model.safetensors: it is reached through a symlink that points "
                                             f"outside the workspace (to {elsewhere / 'real.safetensors'})"),
                       ("linked/real.safetensors", "reached through a symlink that points outside the workspace"),
                       ("ckpt", "ckpt/shard.safetensors in it is a symlink that points outside the workspace")):
        proc = cli("checkpoint", path, cwd=root, check=False)
        assert proc.returncode == 2, (path, proc.stdout, proc.stderr)
        assert said in proc.stderr and "never reach the store" in proc.stderr, proc.stderr
    assert Workspace.find(root).log() == [], "nothing was published"
    # a checkpoint in a file whose name a terminal would act on is registered; the log shows its name escaped
    (root / "ckpt" / "shard.safetensors").unlink()
    os.rename(root / "ckpt" / "inside.safetensors", root / "ckpt" / "in\x1b[2Jside.safetensors")
    assert cli.json("checkpoint", "ckpt/in\x1b[2Jside.safetensors", cwd=root)["status"] == "verified"
    assert "\x1b" not in cli("log", cwd=root).stdout


def test_a_checkpoint_of_a_symlink_inside_the_workspace_registers_the_file_it_points_to(cli, tmp_path: Path) -> None:
    """Issue 40: a symlink inside the workspace was recorded as a "verified" checkpoint with the hash
    "" and published; from then on log, status and snapshot failed and fsck said FAILED. The link is
    resolved before anything is published: the checkpoint is its target, verified by its bytes."""
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n"})
    save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(root / "step7.safetensors"))
    Workspace.init(root, f"file://{tmp_path}/store")
    (root / "latest.safetensors").symlink_to("step7.safetensors")
    out = cli.json("checkpoint", "latest.safetensors", "--settle", "0.2", cwd=root)
    assert out["status"] == "verified" and out["path"] == "step7.safetensors" and len(out["hash"]) == 64
    ws = Workspace.find(root)
    assert ws.latest_checkpoint().hash == out["hash"]
    assert cli.json("log", cwd=root) and cli.json("status", cwd=root)
    (root / "train.py").write_text("pass  # again\n")
    cli("snapshot", cwd=root)
    assert cli("fsck", cwd=root).returncode == 0
    # a link to nothing is refused, and nothing is published for it
    (root / "gone.safetensors").symlink_to("never-saved.safetensors")
    proc = cli("checkpoint", "gone.safetensors", cwd=root, check=False)
    assert proc.returncode == 2 and "does not exist" in proc.stderr, proc.stderr


def test_a_store_holding_a_symlink_checkpoint_recorded_verified_with_no_hash_stays_readable(
        cli, tmp_path: Path) -> None:
    """What an older version published for a symlink: a "verified" record with the hash "". The
    manifest reads as holding a rejected checkpoint (latest verified never points at it), log, status,
    snapshot and fsck work, and the next version carries the record as rejected."""
    from dataclasses import replace

    from jupyter_portable.core.manifest import ParentRef

    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n", "model.pt": "weights\n"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot("first", progress=None)
    store = ws.store
    head, _ = store.read_head(ws.workspace_id)
    base = store.read_manifest(ws.workspace_id)
    bad = {"id": 1, "path": "latest.pt", "status": "verified", "created": "2026-12-06T10:00:00.000Z", "step": None,
           "note": "", "reason": None, "format": "torch", "kind": "file", "hash": "", "size": 8, "files": 1,
           "version": base.version + 1}
    store.publish(replace(base, version=base.version + 1, parent=ParentRef(base.version, head.manifest or ""),
                          checkpoints=(bad,), message="checkpoint latest.pt"),
                  expected_version=base.version, epoch=head.epoch)
    from jupyter_portable.engine.checkpoint.registry import latest, records

    head_manifest = store.read_manifest(ws.workspace_id)
    (record,) = records(head_manifest)
    assert record.status == "rejected" and "symlink" in (record.reason or "") and latest(head_manifest) is None
    assert cli.json("log", cwd=root) and cli.json("status", cwd=root)["latest_checkpoint"] is None
    (root / "train.py").write_text("pass  # again\n")
    cli("snapshot", "--force", cwd=root)
    assert cli("fsck", cwd=root).returncode == 0
    carried = Workspace.find(root).store.read_manifest(ws.workspace_id).checkpoints
    assert [c["status"] for c in carried] == ["rejected"]
