"""Hostile manifests and destinations: refused, and nothing is written outside the target."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree

from jupyter_portable import ManifestError, UnsafePath, Workspace
from jupyter_portable.core.manifest import Head, Manifest
from jupyter_portable.core.times import now_iso
from jupyter_portable.store.repo import digest, head_key, manifest_key


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"ok.txt": "fine\n"})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def _raw_trees(store: Any, files: list[Any]) -> str:
    """Trees of hand-edited entries, written as they are (no validation), as an attacker could."""
    root: list[Any] = []
    for e in files:
        path = e.get("path") if isinstance(e, dict) else None
        segs = path.split("/") if isinstance(path, str) else [path]
        folder = root
        for seg in segs[:-1]:
            sub = next((x for x in folder if x[0] == seg and isinstance(x[1], list)), None)
            if sub is None:
                sub = (seg, [])
                folder.append(sub)
            folder = sub[1]
        folder.append((segs[-1], {k: v for k, v in e.items() if k != "path"}))

    def write(items: list[Any]) -> str:
        entries = []
        for name, x in sorted(items, key=lambda it: (str(it[0]) + "/") if isinstance(it[1], list) else str(it[0])):
            entries.append({"name": name, "type": "dir", "tree": write(x)} if isinstance(x, list)
                           else dict(x, name=name))
        body = json.dumps({"format": "jupyter-portable.tree", "schema": 2, "entries": entries},
                          sort_keys=True, separators=(",", ":")).encode()
        return store.put_object(body)

    return write(root)


def _publish_raw(ws: Workspace, mutate: Any, schema: int = 2) -> None:
    """Publish a hand-edited version 2 straight into the store, as an attacker could: the
    edit is made to the flat file list, then stored as that list (schema 1) or as trees (schema 2)."""
    store, wsid = ws.store, ws.workspace_id
    manifest = store.read_manifest(wsid)
    obj = manifest.to_json()
    for key in ("tree", "file_count", "total_bytes"):
        obj.pop(key, None)
    obj["schema"] = 1
    obj["files"] = [e.to_json() for e in manifest.files]
    head, token = store.read_head(wsid)
    obj["version"] = 2
    obj["parent"] = {"version": 1, "manifest": head.manifest}
    mutate(obj)
    if schema == 2:
        files = obj.pop("files")
        obj.update(schema=2, tree=_raw_trees(store, files), file_count=len(files),
                   total_bytes=sum(e["size"] for e in files if isinstance(e.get("size"), int) and e["size"] > 0))
    body = json.dumps(obj).encode()
    mhash = digest(body)
    store.backend.write(manifest_key(wsid, 2, mhash), body)
    store.backend.swap(head_key(wsid), Head(wsid, 2, mhash, head.epoch, now_iso()).to_bytes(), token)


def _set_path(value: Any) -> Any:
    def mutate(obj: dict) -> None:
        obj["files"][0]["path"] = value
    return mutate


def _set(field: str, value: Any) -> Any:
    def mutate(obj: dict) -> None:
        obj["files"][0][field] = value
    return mutate


def _add_link(target: str) -> Any:
    def mutate(obj: dict) -> None:
        obj["files"].append({"path": "escape", "type": "symlink", "target": target})
    return mutate


HOSTILE = {
    "dotdot": (_set_path("../outside.txt"), UnsafePath),
    "nested-dotdot": (_set_path("a/../../outside.txt"), UnsafePath),
    "absolute": (_set_path("/tmp/outside.txt"), UnsafePath),
    "nul": (_set_path("ok\x00.txt"), UnsafePath),
    "backslash": (_set_path("..\\outside.txt"), UnsafePath),
    "portable-dir": (_set_path(".portable/workspace.json"), UnsafePath),
    "empty": (_set_path(""), UnsafePath),
    "negative-size": (_set("size", -1), ManifestError),
    "huge-mode": (_set("mode", 0o170777), ManifestError),
    "bad-hash": (_set("hash", "../../etc"), ManifestError),
    "string-size": (_set("size", "5"), ManifestError),
    "symlink-out": (_add_link("../../outside"), UnsafePath),
    "symlink-absolute": (_add_link("/etc/passwd"), UnsafePath),
    "duplicate": (lambda o: o["files"].append(dict(o["files"][0])), ManifestError),
    "under-a-file": (lambda o: o["files"].append(dict(o["files"][0], path="ok.txt/inner")), ManifestError),
    "unknown-field": (_set("owner", "root"), ManifestError),
}


@pytest.mark.parametrize("schema", [1, 2])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_is_refused(case: str, tmp_path: Path, store_url: str, cli, schema: int) -> None:
    mutate, error = HOSTILE[case]
    ws = _workspace(tmp_path, store_url)
    _publish_raw(ws, mutate, schema)
    outside = tmp_path / "outside.txt"
    dest = tmp_path / "deep" / "er" / "dest"
    with pytest.raises(error):
        Workspace.restore(store_url, ws.workspace_id, dest, progress=None)
    proc = cli("restore", "--store", store_url, "--workspace", ws.workspace_id, str(dest), check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert not outside.exists()
    assert not list(dest.rglob("*")) if dest.exists() else True
    # Version 1, which is sound, still restores.
    Workspace.restore(store_url, ws.workspace_id, tmp_path / "v1", version=1, progress=None)
    assert (tmp_path / "v1" / "ok.txt").read_text() == "fine\n"


def test_symlinked_folder_in_destination_is_not_written_through(tmp_path: Path, file_store: str) -> None:
    src = tmp_path / "src"
    write_tree(src, {"sub/secret.txt": "data\n"})
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    Workspace.restore(file_store, ws.workspace_id, dest, progress=None)  # a copy: restoring into it is allowed
    shutil.rmtree(dest / "sub")
    os.symlink(outside, dest / "sub")
    with pytest.raises(UnsafePath, match="symlink"):
        Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("schema", [1, 2])
def test_symlink_chain_resolving_outside_is_removed(tmp_path: Path, file_store: str, schema: int) -> None:
    # Each link is lexically inside, but together they resolve outside.
    ws = _workspace(tmp_path, file_store)

    def mutate(obj: dict) -> None:
        obj["files"] += [{"path": "d1/d2/d3/x", "type": "symlink", "target": "../.."},
                         {"path": "d1/d2/d3/y", "type": "symlink", "target": "x/../../.."}]
    _publish_raw(ws, mutate, schema)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafePath, match="outside"):
        Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert not os.path.lexists(dest / "d1" / "d2" / "d3" / "y")


def test_manifest_records_validate_on_the_way_in() -> None:
    good = {"format": "jupyter-portable.manifest", "schema": 1, "workspace_id": "ws-abc", "version": 1,
            "parent": None, "created": "2026-01-01T00:00:00Z", "message": "", "epoch": 0, "files": [],
            "checkpoints": [], "runtime": None, "next_action": None, "allocations": []}
    assert Manifest.from_json(good).version == 1
    for bad in ({"schema": 2}, {"version": 0}, {"workspace_id": "../x"}, {"files": {}},
                {"format": "other"}, {"parent": {"version": 1, "manifest": "0" * 64}}):
        with pytest.raises(ManifestError):
            Manifest.from_json(dict(good, **bad))
    with pytest.raises(ManifestError):
        Manifest.from_bytes(b"{not json")


def test_links_that_escape_only_together_are_refused(tmp_path: Path, file_store: str) -> None:
    # `a` is checked before `p/L` exists; only once both exist does `a` lead outside.
    ws = _workspace(tmp_path, file_store)

    def mutate(obj: dict) -> None:
        obj["files"] += [{"path": "a", "type": "symlink", "target": "p/L/../../escaped"},
                         {"path": "p/L", "type": "symlink", "target": "../q"}]
    _publish_raw(ws, mutate)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafePath, match="outside"):
        Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert not os.path.lexists(dest / "a") and not os.path.lexists(dest / "p" / "L")


def test_special_mode_bits_are_not_restored(tmp_path: Path, file_store: str) -> None:
    ws = _workspace(tmp_path, file_store)
    _publish_raw(ws, _set("mode", 0o4755))
    dest = tmp_path / "dest"
    Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert (dest / "ok.txt").stat().st_mode & 0o7777 == 0o755
    assert Workspace.find(dest).verify().ok


def test_files_older_than_1970_snapshot_and_restore(tmp_path: Path, file_store: str) -> None:
    src = tmp_path / "src"
    write_tree(src, {"old.txt": "from the past"})
    os.utime(src / "old.txt", ns=(-10**18, -10**18))
    ws = Workspace.init(src, file_store)
    assert ws.snapshot(progress=None).version == 1
    dest = tmp_path / "dest"
    Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert (dest / "old.txt").stat().st_mtime_ns == -10**18
