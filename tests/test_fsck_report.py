"""fsck reports what docs/store-format.md says it reports: orphan manifests as warnings,
objects no version reaches with their bytes, and a history with a gap or an epoch out of place
as errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import write_tree
from test_fsck_restore import publish_edited

from jupyter_portable import Workspace
from jupyter_portable.core.manifest import Head, Manifest
from jupyter_portable.store.repo import digest, head_key, manifest_key, object_key


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a\n", "sub/b.txt": "b\n"})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def _fsck(cli: Any, store: str, *more: str) -> tuple[int, dict[str, Any]]:
    proc = cli("fsck", "--store", store, "--json", *more, check=False)
    return proc.returncode, json.loads(proc.stdout)


def _orphan(ws: Workspace, version: int, message: str) -> str:
    """A manifest at ``version`` written create-only and never swapped into the head (with an
    object of its own), as a writer that lost a race or was killed leaves it."""
    store = ws.store
    lost = store.put_object(f"only the orphan {message} has this\n".encode())
    manifest = store.read_manifest(ws.workspace_id)
    body = json.loads(manifest.to_bytes())
    parent, _ = store.read_head(ws.workspace_id)
    parent_manifest = store.read_manifest(ws.workspace_id, version - 1)
    body.update(version=version, message=message,
                parent={"version": version - 1, "manifest": digest(parent_manifest.to_bytes())},
                runtime=dict(body["runtime"] or {}, conda=lost))
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    key = manifest_key(ws.workspace_id, version, digest(data))
    store.backend.write_new(key, data)
    assert parent.version >= version - 1
    return key


def test_orphans_are_warnings_and_what_no_version_reaches_is_counted(tmp_path: Path, file_store: str,
                                                                      cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)  # version 2
    lost_race = _orphan(ws, 2, "lost a race")
    killed = _orphan(ws, 3, "killed before the head moved")
    garbage = ws.store.put_object(b"x" * 1000)  # a killed snapshot's data
    wheel = ws.store.put_object(b"a wheel's bytes")
    ws.store.backend.write("wheels/" + "0" * 64 + "/cpython-311-linux-x86_64.json",
                           json.dumps({"wheels": [{"filename": "w-1-py3-none-any.whl", "hash": wheel}]}).encode())
    code, report = _fsck(cli, file_store, "--read-data")
    assert code == 0 and report["ok"] and report["errors"] == [], report
    # the same manifest is left by a writer killed before it moved the head and one that lost a race
    assert any(w.startswith(lost_race) and "either a writer killed" in w and "lost a race" in w
               for w in report["warnings"]), report["warnings"]
    assert any(w.startswith(killed) and "stopped before it moved the head" in w for w in report["warnings"])
    unreachable = {u["object"]: u["bytes"] for u in report["unreachable"]}
    assert unreachable[garbage] == 1000
    assert wheel not in unreachable, "a wheel set's objects are reached"
    orphans_own = [h for h in unreachable if h not in (garbage,)]
    assert len(orphans_own) == 2, "each orphan's own object is reached by no version"
    assert report["unreachable_bytes"] == sum(unreachable.values())
    text = cli("fsck", "--store", file_store).stdout
    assert "3 objects no version reaches" in text and "warning: " + lost_race in text, text
    # Restoring is untouched by orphans: the head's history is the truth.
    Workspace.restore(file_store, ws.workspace_id, tmp_path / "dest", progress=None)


def test_a_history_with_a_gap_is_an_error(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)
    publish_edited(ws)
    v2 = next(k for k in ws.store.backend.list(f"workspaces/{ws.workspace_id}/manifests") if "/0000000002-" in k)
    ws.store.backend.delete(v2)
    code, report = _fsck(cli, file_store)
    assert code == 1
    assert any("version 2, named by version 3 as its parent, is missing" in e and "gap" in e
               and "versions 1 to 1 cannot be reached" in e for e in report["errors"]), report["errors"]


def test_an_epoch_above_the_heads_is_an_error(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws, epoch=5)  # the head stays at epoch 0
    code, report = _fsck(cli, file_store)
    assert code == 1
    assert any("version 2 of" in e and "epoch 5, above the head's 0" in e for e in report["errors"]), report


def test_an_epoch_below_its_parents_is_an_error(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    ws.store.claim_epoch(ws.workspace_id)
    ws.store.claim_epoch(ws.workspace_id)
    publish_edited(ws, epoch=2)
    publish_edited(ws, epoch=1)
    code, report = _fsck(cli, file_store)
    assert code == 1
    assert any("version 3 has epoch 1, below its parent's 2" in e for e in report["errors"]), report


def test_a_head_naming_a_missing_manifest_is_an_error(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    head, token = ws.store.read_head(ws.workspace_id)
    ws.store.backend.swap(head_key(ws.workspace_id),
                          Head(ws.workspace_id, 2, "ab" * 32, head.epoch, head.updated).to_bytes(), token)
    code, report = _fsck(cli, file_store)
    assert code == 1
    assert any("version 2, named by the head, is missing" in e for e in report["errors"]), report
    # version 1's manifest is still there, but no history reaches it now
    assert any("orphan manifest" in w for w in report["warnings"])


def test_objects_only_an_orphan_needs_are_warnings_when_missing(tmp_path: Path, file_store: str,
                                                                cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    key = _orphan(ws, 2, "lost")
    lost = json.loads(ws.store.backend.read(key))["runtime"]["conda"]
    ws.store.backend.delete(object_key(lost))
    code, report = _fsck(cli, file_store)
    assert code == 0 and report["ok"], report
    assert any(lost in w and "only an orphan manifest needs it" in w for w in report["warnings"]), report
    assert Manifest.from_bytes(ws.store.backend.read(key)).version == 2


def test_fsck_tells_a_lost_race_where_the_store_can(tmp_path: Path, file_store: str, cli: Any) -> None:  # issue 41
    """An orphan that follows a version which is itself in no history lost a race (its base had
    lost one); fsck says so, not "either"."""
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)  # version 2
    first = _orphan(ws, 2, "lost first")
    publish_edited(ws)  # version 3
    store = ws.store
    body = json.loads(store.read_manifest(ws.workspace_id).to_bytes())
    body.update(version=3, message="built on the loser",
                parent={"version": 2, "manifest": first.rsplit("-", 1)[1].removesuffix(".json")})
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    second = manifest_key(ws.workspace_id, 3, digest(data))
    store.backend.write_new(second, data)
    code, report = _fsck(cli, file_store)
    assert code == 0 and report["ok"], report
    assert any(w.startswith(second) and "lost a race: the version it followed is in no history" in w
               for w in report["warnings"]), report["warnings"]
