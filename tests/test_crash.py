"""Crash consistency: a snapshot SIGKILLed at any step leaves a store that fsck finds
clean, whose previous version still restores, and whose manifests name only objects
that exist; and a copy whose ``.portable/`` holds only what the copy keeps, each file whole.

The steps are the store's writes and the copy's one writer of ``.portable/``
(``WorkspaceCopy._write``), so a kill also lands between a ``.portable/`` file's new bytes
and their rename."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import read_tree, write_tree
from hooks_site.portable_faults import fault_env

from jupyter_portable import Workspace
from jupyter_portable.engine.verify import fsck
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.workcopy import KEPT_FILES, WorkspaceCopy

V1 = {f"src/m{i}.py": f"print({i})\n" for i in range(12)} | {"data/big.bin": os.urandom(20 * 1024 * 1024)}


def _make_v1(root: Path, store_url: str) -> Workspace:
    write_tree(root, V1)
    ws = Workspace.init(root, store_url)
    ws.snapshot(progress=None)
    return ws


def _change(root: Path) -> None:
    write_tree(root, {f"src/new{i}.py": f"x = {i}\n" for i in range(10)})
    (root / "src" / "m0.py").unlink()
    with open(root / "data" / "big.bin", "r+b") as fh:  # a new first part, the second stays
        fh.write(b"changed!")
    write_tree(root, {"data/more.bin": os.urandom(17 * 1024 * 1024)})  # two new parts


def _snapshot_killed_at(root: Path, step: int) -> subprocess.CompletedProcess[str]:
    env = fault_env(JUPYTER_PORTABLE_KILL_AT=str(step))
    return subprocess.run([sys.executable, "-m", "jupyter_portable", "snapshot", "--json", "-q"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-[0-9a-f]{8}")  # the writer's new bytes, cut before their rename


def _check_copy_after_crash(root: Path) -> int:
    """Every file under ``.portable/`` is one the copy keeps (or a cut write's temp, never read), and
    every JSON file there reads whole; the copy still opens. The number of cut writes found."""
    meta = root / ".portable"
    cut = 0
    for path in sorted(p for p in meta.rglob("*") if not p.is_dir()):
        rel = path.relative_to(meta).as_posix()
        temp = _TEMP.fullmatch(path.name)
        kept_as = rel[: -len(path.name)] + temp["name"] if temp else rel
        kept = any(fnmatch.fnmatchcase(kept_as, k.name) for k in KEPT_FILES)
        assert kept, f".portable/{rel} is no file the copy keeps"
        if temp:
            cut += 1
        elif rel.endswith(".json"):
            json.loads(path.read_bytes())  # whole: the old bytes or the new ones
    WorkspaceCopy(root).read_config()
    return cut


def _check_after_crash(store_url: str, ws_id: str, tmp: Path, v1_tree: dict) -> int:
    store = Store.open(store_url)
    report = fsck(store)
    assert report.ok, report.errors  # every manifest's objects exist; the head names one
    head, _ = store.read_head(ws_id)
    assert head.version in (1, 2)
    dest = tmp / "restore-v1"
    shutil.rmtree(dest, ignore_errors=True)
    Workspace.restore(store_url, ws_id, dest, version=1, progress=None)
    assert read_tree(dest) == v1_tree
    assert Workspace.find(dest).verify().ok
    return head.version


def test_sigkill_at_every_local_store_step(tmp_path: Path) -> None:
    base_ws = tmp_path / "base-ws"
    base_store = tmp_path / "base-store"
    _make_v1(base_ws, f"file://{base_store}")
    v1_tree = read_tree(base_ws)
    _change(base_ws)
    killed_at: list[int] = []
    published_after: list[int] = []
    cut_copy_writes = 0
    step = 0
    while True:
        step += 1
        assert step < 200, "the snapshot never completed"
        run_dir = tmp_path / f"run{step}"
        ws_dir, store_dir = run_dir / "ws", run_dir / "store"
        shutil.copytree(base_store, store_dir)
        shutil.copytree(base_ws, ws_dir, symlinks=True)
        cfg_path = ws_dir / ".portable" / "workspace.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["store"] = f"file://{store_dir}"
        cfg_path.write_text(json.dumps(cfg))
        proc = _snapshot_killed_at(ws_dir, step)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        killed_at.append(step)
        if "writing .portable/" in proc.stderr:
            cut_copy_writes += 1
            assert _check_copy_after_crash(ws_dir) == 1, proc.stderr
        else:
            _check_copy_after_crash(ws_dir)
        ws_id = cfg["workspace_id"]
        version = _check_after_crash(f"file://{store_dir}", ws_id, run_dir, v1_tree)
        if version == 2:
            published_after.append(step)
        # The same copy snapshots again without help: no stale lock, no false conflict.
        again = subprocess.run([sys.executable, "-m", "jupyter_portable", "snapshot", "--json", "-q"],
                               cwd=ws_dir, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["version"] == 2
        assert fsck(Store.open(f"file://{store_dir}")).ok
        shutil.rmtree(run_dir)
    assert len(killed_at) >= 20, f"only {len(killed_at)} distinct kill points"
    assert published_after, "some kill points fall after the head moved"
    assert cut_copy_writes >= 2, "the kills land inside the copy's own writes too (the publish intent, the config)"


def _copy_bucket(s3: Any, source: str, dest: str) -> None:
    """Every object of ``source`` into the empty bucket ``dest``, copied inside the server."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=source):
        for obj in page.get("Contents", []):
            s3.copy_object(Bucket=dest, Key=obj["Key"], CopySource={"Bucket": source, "Key": obj["Key"]})


@pytest.mark.usefixtures("aws_env")
def test_sigkill_at_every_s3_step(tmp_path: Path) -> None:
    import boto3
    from conftest import make_bucket

    # v1 and the change once; each step starts from a copy of that bucket and of that folder
    base_bucket = make_bucket()
    base_ws = tmp_path / "base-ws"
    ws = _make_v1(base_ws, f"s3://{base_bucket}/p")
    v1_tree = read_tree(base_ws)
    _change(base_ws)
    s3 = boto3.client("s3")
    step = 0
    kills = 0
    while True:
        step += 1
        assert step < 100
        bucket = make_bucket()
        _copy_bucket(s3, base_bucket, bucket)
        url = f"s3://{bucket}/p"
        root = tmp_path / f"ws{step}"
        shutil.copytree(base_ws, root, symlinks=True)
        cfg_path = root / ".portable" / "workspace.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "store": url}))
        proc = _snapshot_killed_at(root, step)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        kills += 1
        _check_copy_after_crash(root)
        _check_after_crash(url, ws.workspace_id, root.parent / f"r{step}", v1_tree)
        shutil.rmtree(root)
        shutil.rmtree(root.parent / f"r{step}")
    assert kills >= 8
