"""Records are as strict as docs/store-format.md (section 5): UTF-8 only, and a restore checks
the parent links and epochs it follows (section 5.4), as fsck does for the whole history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree
from test_fsck_restore import publish_edited

from jupyter_portable import Workspace
from jupyter_portable.core.manifest import Manifest, ParentRef
from jupyter_portable.core.times import now_iso
from jupyter_portable.engine.fsck import fsck
from jupyter_portable.store.repo import Store, head_key, object_key

ENCODINGS = {
    "bom": lambda data: b"\xef\xbb\xbf" + data,
    "utf-16": lambda data: data.decode().encode("utf-16"),
    "utf-16-le": lambda data: data.decode().encode("utf-16-le"),
    "utf-32": lambda data: data.decode().encode("utf-32"),
}


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a\n", "sub/b.txt": "b\n"})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def _restore_refused(cli: Any, store: str, ws: Workspace, dest: Path, *more: str) -> str:
    proc = cli("restore", "--store", store, "--workspace", ws.workspace_id, *more, str(dest), check=False)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("restore: ")]
    assert proc.returncode == 1 and len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
    assert not dest.exists() or not [p for p in dest.rglob("*") if ".portable" not in p.parts]
    return errors[0]


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_a_head_that_is_not_plain_utf8_is_refused(encoding: str, tmp_path: Path, file_store: str,
                                                  cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    backend = ws.store.backend
    body, token = backend.read_versioned(head_key(ws.workspace_id)) or (b"", "")
    backend.swap(head_key(ws.workspace_id), ENCODINGS[encoding](body), token)
    error = _restore_refused(cli, file_store, ws, tmp_path / "dest")
    assert "head" in error and ("byte-order mark" in error or "not UTF-8" in error or "not valid JSON" in error)
    assert any("head" in e for e in fsck(Store.open(file_store)).errors)


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_a_tree_that_is_not_plain_utf8_is_refused(encoding: str, tmp_path: Path, file_store: str,
                                                  cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    store = ws.store
    base = store.read_manifest(ws.workspace_id)
    root = store.put_object(ENCODINGS[encoding](store.backend.read(object_key(base.tree or ""))))
    head, _ = store.read_head(ws.workspace_id)
    store.publish(Manifest.with_tree(root, base.file_count, base.total_bytes, workspace_id=ws.workspace_id,
                                     version=2, created=now_iso(), parent=ParentRef(1, head.manifest or ""),
                                     epoch=head.epoch), expected_version=1, epoch=head.epoch)
    error = _restore_refused(cli, file_store, ws, tmp_path / "dest")
    assert "tree" in error, error
    assert any("version 2 of" in e and "tree" in e for e in fsck(store).errors)


def test_a_config_that_is_not_plain_utf8_is_refused(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    config = tmp_path / "store" / "config.json"
    config.write_bytes(config.read_text().encode("utf-16"))
    error = _restore_refused(cli, file_store, ws, tmp_path / "dest")
    assert "config.json" in error and "not UTF-8" in error, error


def test_restore_refuses_a_head_manifest_of_a_later_epoch(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws, epoch=3)  # the head stays at epoch 0: no writer held epoch 3
    error = _restore_refused(cli, file_store, ws, tmp_path / "dest")
    assert "epoch 3, above the head's 0" in error and "fsck" in error, error
    # an older version is reached through it (never through a listing): refused too
    assert "epoch 3" in _restore_refused(cli, file_store, ws, tmp_path / "v1", "--version", "1")


def test_restore_checks_each_link_it_follows(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    ws.store.claim_epoch(ws.workspace_id)
    ws.store.claim_epoch(ws.workspace_id)
    publish_edited(ws, epoch=2)  # version 2
    publish_edited(ws, epoch=1)  # version 3: below its parent's epoch
    error = _restore_refused(cli, file_store, ws, tmp_path / "dest", "--version", "2")
    assert "version 3 of" in error and "below its parent's 2" in error, error
    report = cli("fsck", "--store", file_store, "--json", check=False)
    assert report.returncode == 1 and "below its parent's 2" in report.stdout


def test_an_older_version_is_reached_through_the_history_not_a_listing(tmp_path: Path, file_store: str) -> None:
    """An orphan of the same version number (a writer that lost a race) is never restored."""
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)  # version 2
    publish_edited(ws)  # version 3
    store = ws.store
    v2 = store.read_manifest(ws.workspace_id, 2)
    orphan = json.loads(v2.to_bytes())
    orphan["message"] = "the loser"
    body = json.dumps(orphan, sort_keys=True, separators=(",", ":")).encode()
    from jupyter_portable.store.repo import digest, manifest_key

    store.backend.write_new(manifest_key(ws.workspace_id, 2, digest(body)), body)
    assert store.read_manifest(ws.workspace_id, 2).message == "edited"
    Workspace.restore(file_store, ws.workspace_id, tmp_path / "v2", version=2, progress=None)
