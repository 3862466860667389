"""`fsck --read-data` never says ok about a version a restore cannot read: each way a head can
be unreadable is made in a real store, and both fsck and the reader that trips on it fail,
naming the file or object."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.core.manifest import FileEntry, Manifest, PackRef, ParentRef
from jupyter_portable.engine.trees import write_trees
from jupyter_portable.store.repo import digest, object_key

PART = 16 * 1024 * 1024
FILES: dict[str, bytes | str] = {
    "notes.txt": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 2\n",
    "data/model.bin": bytes(range(256)) * (PART // 256) + b"tail" * 512,  # two parts: 16 MiB and 2 KiB
    "data/one.bin": b"\x01" * (600 * 1024),  # one part
}
Entries = dict[str, FileEntry]


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, FILES)
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def publish_edited(ws: Workspace, edit: Callable[[Entries], None] = lambda e: None, **fields: Any) -> None:
    """Publish the head's files, edited, as the next version: every record valid on its own,
    as a buggy writer or a hostile store could leave it."""
    store, wsid = ws.store, ws.workspace_id
    head, _ = store.read_head(wsid)
    base = store.read_manifest(wsid)
    entries = {e.path: e for e in base.files}
    edit(entries)
    root, files, nbytes = write_trees(store, entries.values())
    record: dict[str, Any] = dict(workspace_id=wsid, version=head.version + 1, created=base.created,
                                  parent=ParentRef(head.version, head.manifest or ""), message="edited",
                                  epoch=head.epoch, runtime=base.runtime)
    record.update(fields)
    counts = {"file_count": record.pop("file_count", files), "total": record.pop("total", nbytes)}
    manifest = Manifest.with_tree(root, counts["file_count"], counts["total"], **record)
    store.publish(manifest, expected_version=head.version, epoch=head.epoch)


def _flip(ws: Workspace, h: str, offset: int = 3) -> None:
    data = bytearray(ws.store.backend.read(object_key(h)))
    data[offset] ^= 0x01
    ws.store.backend.write(object_key(h), bytes(data))


def _parts_resized(e: Entries) -> None:
    """The model's first part said 10 bytes shorter, its last 10 longer: the sizes still add up."""
    m = e["data/model.bin"]
    (h1, n1), (h2, n2) = m.parts
    e[m.path] = replace(m, parts=((h1, n1 - 10), (h2, n2 + 10)))


def _parts_swapped(e: Entries) -> None:
    """Each part as long as its object, but in the wrong order: the file does not hash to its hash."""
    m = e["data/model.bin"]
    (h1, n1), (h2, n2) = m.parts
    e[m.path] = replace(m, parts=((h2, n2), (h1, n1)))


def _one_part_other_file(e: Entries) -> None:
    one = e["data/one.bin"]
    e[one.path] = replace(one, hash=digest(b"something else"))


def _range_moved(e: Entries) -> None:
    """src/a.py's range points at src/b.py's bytes (same length): the pack is sound, the file is not."""
    a, b = e["src/a.py"], e["src/b.py"]
    assert a.pack is not None and b.pack is not None
    e[a.path] = replace(a, pack=b.pack)


def _range_past_end(e: Entries) -> None:
    a = e["src/a.py"]
    assert a.pack is not None
    e[a.path] = replace(a, pack=PackRef(a.pack.pack, a.pack.offset + 10**6, a.pack.length))


# case -> (how to break the head, what fsck's error names, what restore's error names)
Breaker = Callable[[Workspace], None]
CASES: dict[str, tuple[Breaker, str, str]] = {
    "part-shorter-than-said": (lambda ws: publish_edited(ws, _parts_resized),
                               "data/model.bin: part", "data/model.bin"),
    "parts-that-do-not-make-the-file": (lambda ws: publish_edited(ws, _parts_swapped),
                                        "data/model.bin: its parts", "data/model.bin"),
    "one-part-of-another-file": (lambda ws: publish_edited(ws, _one_part_other_file),
                                 "data/one.bin: its one part", "data/one.bin"),
    "packed-range-of-another-file": (lambda ws: publish_edited(ws, _range_moved),
                                     "src/a.py: its bytes", "src/a.py"),
    "packed-range-past-the-pack": (lambda ws: publish_edited(ws, _range_past_end),
                                   "src/a.py: its bytes", "src/a.py"),
    "counts-that-are-not-the-trees": (lambda ws: publish_edited(ws, file_count=99),
                                      "says 99 files", "says 99 files"),
}


def _break_subtree(ws: Workspace) -> None:
    src = ws.store.find(ws.store.read_manifest(ws.workspace_id).tree or "", "src")
    _flip(ws, src.tree, 10)


CASES["corrupt-tree"] = (_break_subtree, "the tree of src", "corrupt")


def _fsck(cli: Any, store: str) -> dict[str, Any]:
    proc = cli("fsck", "--store", store, "--read-data", "--json", check=False)
    assert proc.returncode == 1, proc.stdout
    return json.loads(proc.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fsck_fails_on_every_head_restore_cannot_read(case: str, tmp_path: Path, file_store: str, cli: Any) -> None:
    breaker, fsck_says, restore_says = CASES[case]
    ws = _workspace(tmp_path, file_store)
    breaker(ws)
    report = _fsck(cli, file_store)
    assert not report["ok"]
    assert any(fsck_says in e for e in report["errors"]), report["errors"]
    proc = cli("restore", "--store", file_store, "--workspace", ws.workspace_id, str(tmp_path / "dest"), check=False)
    assert proc.returncode == 1 and restore_says in proc.stderr, proc.stderr
    # the version before is sound, and fsck says which one is not
    assert any(e.startswith("version 2 of ") or "the tree of src" in e for e in report["errors"]), report["errors"]


@pytest.mark.usefixtures("aws_env")
@pytest.mark.parametrize("case", ["part-shorter-than-said", "packed-range-of-another-file"])
def test_fsck_fails_on_s3_too(case: str, tmp_path: Path, store_url: str, cli: Any) -> None:
    if not store_url.startswith("s3://"):
        pytest.skip("the file store is checked above")
    breaker, fsck_says, restore_says = CASES[case]
    ws = _workspace(tmp_path, store_url)
    breaker(ws)
    assert any(fsck_says in e for e in _fsck(cli, store_url)["errors"])
    proc = cli("restore", "--store", store_url, "--workspace", ws.workspace_id, str(tmp_path / "dest"), check=False)
    assert proc.returncode == 1 and restore_says in proc.stderr, proc.stderr


def _lockfile(ws: Workspace) -> str:
    h = (ws.store.read_manifest(ws.workspace_id).runtime or {}).get("lockfile")
    assert isinstance(h, str), "a snapshot records the runtime's lockfile"
    return h


LOCKFILE_CASES: dict[str, Callable[[Workspace], None]] = {
    "missing": lambda ws: ws.store.backend.delete(object_key(_lockfile(ws))),
    "corrupt": lambda ws: _flip(ws, _lockfile(ws)),
    "not-a-lockfile": lambda ws: publish_edited(
        ws, runtime=dict(ws.store.read_manifest(ws.workspace_id).runtime or {},
                         lockfile=ws.store.put_object(b"\xff\xfenot a lockfile\n"))),
}


@pytest.mark.parametrize("case", sorted(LOCKFILE_CASES))
def test_fsck_checks_the_runtime_lockfile_that_diff_reads(case: str, tmp_path: Path, file_store: str,
                                                          cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)  # version 2, the same runtime
    LOCKFILE_CASES[case](ws)
    errors = _fsck(cli, file_store)["errors"]
    assert any("runtime.lockfile" in e for e in errors), errors
    head, _ = ws.store.read_head(ws.workspace_id)
    proc = cli("diff", "1", str(head.version), "-C", str(ws.root), check=False)
    assert proc.returncode == 1, proc.stdout


def test_a_sound_store_is_ok_and_each_object_is_read_once(tmp_path: Path, file_store: str, cli: Any) -> None:
    ws = _workspace(tmp_path, file_store)
    publish_edited(ws)
    report = cli.json("fsck", "--store", file_store, "--read-data")
    assert report["ok"] and report["errors"] == [] and report["warnings"] == [], report
    assert report["read_objects"] == report["objects"]
    assert report["unreachable"] == [] and report["unreachable_bytes"] == 0
