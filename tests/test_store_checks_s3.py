"""The checks of issue 29 on an S3 store (moto), through the CLI: what fsck reports, what
restore refuses, and what snapshot says, are the same as on a local folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import make_bucket, write_tree
from test_fsck_report import _orphan
from test_fsck_restore import publish_edited
from test_hostile_trees import _file, _publish, _tree

from jupyter_portable import Workspace
from jupyter_portable.store.repo import head_key


@pytest.fixture
def s3_store(aws_env: dict[str, str]) -> str:
    return f"s3://{make_bucket()}/team/ws"


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"ok.txt": "fine\n", "big.bin": os.urandom(2 * 1024 * 1024)})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def _refused(cli: Any, store: str, ws: Workspace, dest: Path, says: str) -> None:
    proc = cli("restore", "--store", store, "--workspace", ws.workspace_id, str(dest), check=False, timeout=60)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("restore: ")]
    assert proc.returncode == 1 and len(errors) == 1 and says in errors[0], proc.stderr


def test_fsck_reports_orphans_and_unreachable_objects_on_s3(tmp_path: Path, s3_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, s3_store)
    publish_edited(ws)
    orphan = _orphan(ws, 3, "killed before the head moved")
    garbage = ws.store.put_object(b"y" * 777)
    report = cli.json("fsck", "--store", s3_store, "--read-data")
    assert report["ok"] and any(w.startswith(orphan) for w in report["warnings"]), report
    assert {"object": garbage, "bytes": 777} in report["unreachable"]


def test_restore_refuses_hostile_records_on_s3(tmp_path: Path, s3_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, s3_store)
    ok = _file(ws, "ok.txt")
    h = _tree(ws, [ok])
    for _ in range(60):  # 2^60 paths in 61 trees
        h = _tree(ws, [{"name": "a", "tree": h, "type": "dir"}, {"name": "b", "tree": h, "type": "dir"}])
    _publish(ws, h, 1, 5)
    _refused(cli, s3_store, ws, tmp_path / "dag", "says 1 files")
    _publish(ws, _tree(ws, [dict(ok, name="bad\ud800name")]), 1, 5)
    _refused(cli, s3_store, ws, tmp_path / "surrogate", "lone surrogate")
    backend = ws.store.backend
    body, token = backend.read_versioned(head_key(ws.workspace_id)) or (b"", "")
    backend.swap(head_key(ws.workspace_id), b"\xef\xbb\xbf" + body, token)
    _refused(cli, s3_store, ws, tmp_path / "bom", "byte-order mark")
    errors = json.loads(cli("fsck", "--store", s3_store, "--json", check=False).stdout)["errors"]
    assert any("byte-order mark" in e for e in errors), errors


def test_an_epoch_above_the_heads_is_refused_on_s3(tmp_path: Path, s3_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, s3_store)
    publish_edited(ws, epoch=4)
    _refused(cli, s3_store, ws, tmp_path / "dest", "epoch 4, above the head's 0")


def test_a_renamed_file_is_not_new_on_s3(tmp_path: Path, s3_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, s3_store)
    os.rename(ws.root / "big.bin", ws.root / "moved.bin")
    out = cli.json("snapshot", "-q", cwd=ws.root)
    assert out["changed"] and out["new_bytes"] == 0, out
