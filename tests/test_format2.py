"""Store format 2: trees shared between versions, schema-1 stores read and upgraded,
hostile trees refused, the stat cache updated by what changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import read_tree, write_tree

from jupyter_portable import ManifestError, UnsafePath, Workspace
from jupyter_portable.core.tree_object import MAX_DEPTH, encode_tree
from jupyter_portable.engine.trees import write_trees
from jupyter_portable.store.backend import LocalBackend
from jupyter_portable.store.repo import Store, digest, object_key
from jupyter_portable.workdir.statcache import StatCache

FIXTURE = Path(__file__).parent / "fixtures" / "store-v1"
EXPECTED = json.loads((Path(__file__).parent / "fixtures" / "store-v1-expected.json").read_text())


class CountingBackend(LocalBackend):
    """A local store that counts the bytes of every write."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.written = 0
        self.keys: list[str] = []

    def write(self, key: str, data: bytes) -> None:
        self.written += len(data)
        self.keys.append(key)
        super().write(key, data)

    def write_new(self, key: str, data: bytes) -> None:
        self.written += len(data)
        self.keys.append(key)
        super().write_new(key, data)

    def write_batch(self, items: list[tuple[str, bytes]]) -> None:
        self.written += sum(len(d) for _k, d in items)
        self.keys += [k for k, _d in items]
        super().write_batch(items)


def _age(root: Path) -> None:
    """Files written a moment ago are re-read by the next snapshot (same clock tick); make them old."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (1_700_000_000, 1_700_000_000))


def _layout(n_dirs: int, per_dir: int) -> dict[str, str]:
    return {f"d{i:03d}/sub/f{j:04d}.txt": f"file {i} {j}\n" for i in range(n_dirs) for j in range(per_dir)}


def test_one_file_change_writes_one_tree_per_level(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, _layout(20, 50))
    _age(src)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    counting = CountingBackend(str(tmp_path / "store"))
    ws._store = Store(counting)
    (src / "d007" / "sub" / "f0003.txt").write_text("changed\n")
    res = ws.snapshot(progress=None)
    assert res.changed and res.hashed == 1
    objects = [k for k in counting.keys if k.startswith("objects/")]
    # one pack, one tree for d007/sub, one for d007, one for the root; then the pack's index and the manifest
    assert len(objects) == 4, counting.keys
    assert counting.written < 20_000, f"{counting.written} bytes written for one changed file"
    m1, m2 = ws.store.read_manifest(ws.workspace_id, 1), ws.store.read_manifest(ws.workspace_id, 2)
    shared = ws.store.find(m2.tree, "d008")
    assert shared is not None and shared == ws.store.find(m1.tree, "d008"), "unchanged subtrees are shared"
    assert ws.diff(1, 2)["files"] == {"added": [], "removed": [], "changed": ["d007/sub/f0003.txt"]}


def test_no_change_reads_no_file_and_writes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, _layout(5, 20))
    _age(src)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    counting = CountingBackend(str(tmp_path / "store"))
    ws._store = Store(counting)
    res = ws.snapshot(progress=None)
    assert not res.changed and res.hashed == 0 and counting.written == 0


def test_stat_cache_is_updated_by_what_changed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, _layout(3, 10))
    _age(src)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    with StatCache(src / ".portable") as cache:
        assert cache.count() == 30 and cache.version() == 1
    shutil.rmtree(src / "d001")
    (src / "d002" / "new.txt").write_text("n\n")
    res = ws.snapshot(progress=None)
    assert res.version == 2 and res.files == 21 and res.hashed == 1
    with StatCache(src / ".portable") as cache:
        assert cache.version() == 2 and cache.count() == 21
        assert cache.dir_of("d001/sub/f0000.txt") is None, "a removed folder leaves the cache"
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    assert read_tree(out) == read_tree(src)


def test_schema1_store_restores_byte_identically_and_upgrades(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(FIXTURE, store_dir)
    wsid = EXPECTED["workspace_id"]
    store = Store.open(str(store_dir))
    assert store.read_manifest(wsid).schema == 1
    dest = tmp_path / "copy"
    Workspace.restore(str(store_dir), wsid, dest, progress=None)
    for rel, want in EXPECTED["files"].items():
        full = dest / rel
        if "target" in want:
            assert os.readlink(full) == want["target"]
            continue
        assert full.read_bytes() == bytes.fromhex(want["data"]), rel
        st = full.stat()
        assert (st.st_mode & 0o777, st.st_mtime_ns) == (want["mode"], want["mtime_ns"]), rel
    # An older version restores too.
    Workspace.restore(str(store_dir), wsid, tmp_path / "v1", version=1, progress=None)
    assert (tmp_path / "v1" / "a.txt").read_text() == "alpha\n"
    # The next snapshot publishes format 2, with the same files, and a one-file change after it stays small.
    ws = Workspace.find(dest)
    res = ws.snapshot(progress=None)
    assert res.changed and res.version == 3
    m3 = store.read_manifest(wsid)
    assert m3.schema == 2 and m3.file_count == len(EXPECTED["files"])
    assert ws.diff(2, 3)["files"] == {"added": [], "removed": [], "changed": []}
    assert ws.verify().ok
    (dest / "notes.md").write_text("v4\n")
    res = ws.snapshot(progress=None)
    assert res.version == 4 and res.hashed == 1
    assert ws.diff(3, 4)["files"]["changed"] == ["notes.md"]
    again = tmp_path / "again"
    Workspace.restore(str(store_dir), wsid, again, progress=None)
    assert read_tree(again) == read_tree(dest)
    from jupyter_portable.engine.verify import fsck
    assert fsck(store, read_data=True).ok


def _tree_store(tmp_path: Path) -> tuple[Workspace, Store]:
    src = tmp_path / "src"
    write_tree(src, {"a/b.txt": "b\n"})
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    return ws, ws.store


def _publish_root(ws: Workspace, root: str, files: int = 1, total: int = 2) -> None:
    from jupyter_portable.core.manifest import Manifest, ParentRef
    from jupyter_portable.core.times import now_iso

    head, _ = ws.store.read_head(ws.workspace_id)
    m = Manifest.with_tree(root, files, total, ws.store, workspace_id=ws.workspace_id, version=head.version + 1,
                           created=now_iso(), parent=ParentRef(head.version, head.manifest or ""))
    ws.store.publish(m, expected_version=head.version, epoch=head.epoch)


def _entry(name: str) -> dict:
    return {"name": name, "type": "file", "size": 2, "mode": 420, "hash": digest(b"b\n"), "mtime_ns": 0,
            "parts": [[digest(b"b\n"), 2]]}


@pytest.mark.parametrize("case", ["twice", "unsorted", "file-and-folder", "dot-name", "slash-name",
                                  "unknown-field", "not-a-tree", "deep"])
def test_hostile_trees_are_refused_before_anything_is_written(tmp_path: Path, case: str) -> None:
    ws, store = _tree_store(tmp_path)
    store.put_object(b"b\n")
    sub = store.put_tree(encode_tree([_entry("x")]))
    if case == "deep":  # a chain of folders deeper than any walk accepts
        root = sub
        for _ in range(MAX_DEPTH + 2):
            root = store.put_tree(encode_tree([{"name": "d", "type": "dir", "tree": root}]))
    else:
        entries = {
            "twice": [_entry("x"), _entry("x")],
            "unsorted": [_entry("y"), _entry("x")],
            "file-and-folder": [_entry("x"), {"name": "x", "type": "dir", "tree": sub}],
            "dot-name": [{"name": "..", "type": "dir", "tree": sub}],
            "slash-name": [_entry("a/b")],
            "unknown-field": [dict(_entry("x"), owner="root")],
            "not-a-tree": [{"name": "x", "type": "dir", "tree": digest(b"b\n")}],
        }[case]
        root = store.put_object(json.dumps({"format": "jupyter-portable.tree", "schema": 2, "entries": entries},
                                           sort_keys=True, separators=(",", ":")).encode())
    _publish_root(ws, root)
    dest = tmp_path / "dest"
    with pytest.raises(ManifestError) as got:
        Workspace.restore(str(tmp_path / "store"), ws.workspace_id, dest, progress=None)
    if case in ("dot-name", "slash-name"):
        assert isinstance(got.value, UnsafePath)
    assert not dest.exists() or not [p for p in dest.rglob("*") if ".portable" not in p.parts]


def test_a_tree_that_lies_about_its_count_is_refused(tmp_path: Path) -> None:
    ws, store = _tree_store(tmp_path)
    m = store.read_manifest(ws.workspace_id)
    _publish_root(ws, m.tree, files=5, total=2)
    with pytest.raises(ManifestError, match="trees hold 1 files"):
        Workspace.restore(str(tmp_path / "store"), ws.workspace_id, tmp_path / "dest", progress=None)


def test_a_flipped_tree_byte_is_refused(tmp_path: Path) -> None:
    ws, store = _tree_store(tmp_path)
    root = store.read_manifest(ws.workspace_id).tree
    data = bytearray(store.backend.read(object_key(root)))
    data[10] ^= 1
    store.backend.write(object_key(root), bytes(data))
    from jupyter_portable import IntegrityError
    with pytest.raises(IntegrityError, match="corrupt"):
        Workspace.restore(str(tmp_path / "store"), ws.workspace_id, tmp_path / "dest", progress=None)


def test_write_trees_builds_the_same_tree_as_a_snapshot(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "1", "a/b/c.txt": "2", "a0": "3", "z/y": "4"})
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    m = ws.store.read_manifest(ws.workspace_id)
    assert [e.path for e in m.files] == ["a.txt", "a/b/c.txt", "a0", "z/y"], "path order, as schema 1 listed"
    assert write_trees(ws.store, list(m.files)) == (m.tree, 4, 4)
