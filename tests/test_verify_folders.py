"""A large version is verified a folder at a time by helper processes (engine/verify.py
_verify_by_folders): it finds exactly what the one-process walk finds, on a damaged copy,
and refuses a hostile tree the same way."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree

from jupyter_portable import ManifestError, Workspace
from jupyter_portable.core.tree_object import MAX_DEPTH, encode_tree
from jupyter_portable.engine import verify as V
from jupyter_portable.engine.hashproc import helper_pool
from jupyter_portable.store.repo import digest, object_key


def _both(monkeypatch: pytest.MonkeyPatch, ws: Workspace, **kw: Any) -> tuple[Any, Any]:
    """verify_dir one folder at a time in helpers, then in this process alone."""
    manifest = ws.store.read_manifest(ws.workspace_id, ws.config.version)
    monkeypatch.setattr(V, "PARALLEL_MIN", 0)
    by_folders = V.verify_dir(ws.store, manifest, ws.root, **kw)
    monkeypatch.setattr(V, "PARALLEL_MIN", 10**12)
    alone = V.verify_dir(ws.store, manifest, ws.root, **kw)
    return by_folders, alone


@pytest.fixture
def copy(tmp_path: Path) -> Workspace:
    pool = helper_pool()
    if pool is None:
        pytest.skip("one core: no helper processes")
    pool.shutdown()
    src = tmp_path / "src"
    files: dict[str, bytes | str] = {f"d{i}/s{j}/f{k}.txt": f"{i} {j} {k}\n" for i in range(4) for j in range(3)
                                     for k in range(20)}
    files.update({"top.txt": "t", "big.bin": os.urandom(2 * 1024 * 1024), ".portableignore": "*.log\n"})
    write_tree(src, files)
    os.symlink("top.txt", src / "link")
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    return Workspace.find(out)


def test_a_sound_copy_verifies_either_way(monkeypatch: pytest.MonkeyPatch, copy: Workspace) -> None:
    by_folders, alone = _both(monkeypatch, copy)
    assert by_folders.ok and alone.ok
    assert by_folders.to_json() == alone.to_json()


def test_every_kind_of_damage_is_found_alike(monkeypatch: pytest.MonkeyPatch, copy: Workspace) -> None:
    out = copy.root
    (out / "d0" / "s0" / "f1.txt").unlink()  # missing
    (out / "d0" / "s1" / "f2.txt").write_text("other bytes\n")  # content
    os.chmod(out / "d1" / "s0" / "f0.txt", 0o600)  # mode
    (out / "d1" / "extra.txt").write_text("x")  # not in the version
    (out / "d1" / "new" / "deep").mkdir(parents=True)
    (out / "d1" / "new" / "deep" / "n.txt").write_text("n")  # a folder not in the version
    (out / "d1" / "kept.log").write_text("ignored by the rules: not reported")
    for name in os.listdir(out / "d2" / "s2"):
        os.unlink(out / "d2" / "s2" / name)
    os.rmdir(out / "d2" / "s2")  # a whole folder gone
    os.unlink(out / "link")
    os.symlink("d1", out / "link")  # a link that points elsewhere
    with open(out / "big.bin", "r+b") as fh:
        fh.seek(1_500_000)
        byte = fh.read(1)
        fh.seek(1_500_000)
        fh.write(bytes([byte[0] ^ 0xFF]))  # a large file's content: a byte flipped (random bytes may hold any)
    by_folders, alone = _both(monkeypatch, copy, pending={"d3/s0/f3.txt"})
    assert not by_folders.ok
    assert by_folders.mismatches == alone.mismatches
    got = {m["path"]: m["reason"] for m in by_folders.mismatches}
    assert got["d0/s0/f1.txt"] == "missing" and got["d1/extra.txt"] == "not in version 1"
    assert got["d1/new/deep/n.txt"] == "not in version 1" and "d1/kept.log" not in got
    assert got["d0/s1/f2.txt"].startswith(("size", "content")) and got["d1/s0/f0.txt"].startswith("mode")
    assert got["d3/s0/f3.txt"].startswith("not fetched yet") and got["big.bin"].startswith("content")
    assert all(got[f"d2/s2/f{k}.txt"] == "missing" for k in range(20))
    assert "link" in got


def test_an_object_missing_from_the_store_is_named_alike(monkeypatch: pytest.MonkeyPatch, copy: Workspace) -> None:
    manifest = copy.store.read_manifest(copy.workspace_id)
    big = next(e for e in copy.store.iter_files(manifest.tree or "") if e.path == "big.bin")
    (Path(copy.store.url.removeprefix("file://")) / object_key(big.parts[0][0])).unlink()
    by_folders, alone = _both(monkeypatch, copy)
    assert by_folders.mismatches == alone.mismatches
    assert [m["path"] for m in by_folders.mismatches] == ["big.bin"]
    assert "missing from the store" in by_folders.mismatches[0]["reason"]


@pytest.mark.parametrize("case", ["twice", "deep"])
def test_a_hostile_tree_is_refused_alike(monkeypatch: pytest.MonkeyPatch, copy: Workspace, case: str) -> None:
    store = copy.store
    entry = {"name": "x", "type": "file", "size": 2, "mode": 420, "hash": digest(b"b\n"), "mtime_ns": 0,
             "parts": [[store.put_object(b"b\n"), 2]]}
    if case == "deep":
        root = store.put_tree(encode_tree([entry]))
        for _ in range(MAX_DEPTH + 2):
            root = store.put_tree(encode_tree([{"name": "d", "type": "dir", "tree": root}]))
    else:
        root = store.put_object(json.dumps({"format": "jupyter-portable.tree", "schema": 2,
                                            "entries": [entry, entry]}, sort_keys=True,
                                           separators=(",", ":")).encode())
    hostile = dataclasses.replace(store.read_manifest(copy.workspace_id), tree=root)
    errors = []
    for threshold in (0, 10**12):
        monkeypatch.setattr(V, "PARALLEL_MIN", threshold)
        with pytest.raises(ManifestError) as got:
            V.verify_dir(store, hostile, copy.root)
        errors.append((type(got.value), str(got.value)))
    assert errors[0] == errors[1]


def test_without_helpers_every_folder_is_checked_here_with_the_rules_of_each_verify(
        monkeypatch: pytest.MonkeyPatch, copy: Workspace) -> None:
    def shut_pool(**_kw: Any) -> Any:
        pool = helper_pool()
        assert pool is not None
        pool.shutdown()  # a pool that takes no work: submit raises, as when no process can start
        return pool

    monkeypatch.setattr(V, "helper_pool", shut_pool)
    (copy.root / "d0" / "notes.tmp").write_text("extra")
    by_folders, alone = _both(monkeypatch, copy)
    assert by_folders.mismatches == alone.mismatches == [{"path": "d0/notes.tmp", "reason": "not in version 1"}]
    # the ignore rules are read by each verify, not kept from the last one
    (copy.root / ".portableignore").write_text("*.log\n*.tmp\n")
    by_folders, alone = _both(monkeypatch, copy)
    assert [m["path"] for m in by_folders.mismatches] == [m["path"] for m in alone.mismatches] == [".portableignore"]
