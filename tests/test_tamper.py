"""A tampered object is refused on restore with a clear error; no wrong bytes land."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import IntegrityError, Workspace
from jupyter_portable.engine.verify import fsck
from jupyter_portable.store.repo import object_key

FILES = {"notes.txt": "hello\n", "src/a.py": "a = 1\n", "src/b.py": "b = 2\n",
         "model.bin": os.urandom(2 * 1024 * 1024)}


def _flip(ws: Workspace, h: str, offset: int = 0) -> None:
    backend = ws.store.backend
    data = bytearray(backend.read(object_key(h)))
    data[offset] ^= 0x01
    backend.write(object_key(h), bytes(data))


def _assert_no_wrong_bytes(dest: Path, src: Path) -> None:
    for p in dest.rglob("*"):
        if p.is_file() and ".portable" not in p.parts:
            assert p.read_bytes() == (src / p.relative_to(dest)).read_bytes(), p


@pytest.mark.parametrize("victim", ["pack", "part"])
def test_tampered_object_is_refused(store_url: str, tmp_path: Path, victim: str, cli) -> None:
    src = tmp_path / "src"
    write_tree(src, FILES)
    ws = Workspace.init(src, store_url)
    ws.snapshot(progress=None)
    manifest = ws.store.read_manifest(ws.workspace_id)
    entry = manifest.by_path()["src/a.py" if victim == "pack" else "model.bin"]
    h = entry.pack.pack if victim == "pack" else entry.parts[0][0]
    _flip(ws, h, 3)

    dest = tmp_path / "dest"
    proc = cli("restore", "--store", store_url, "--workspace", ws.workspace_id, str(dest), check=False)
    assert proc.returncode == 1
    assert "corrupt" in proc.stderr and "fsck" in proc.stderr
    # one line of error; a progress line may come first when the machine is slow
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("restore: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
    assert not (dest / entry.path).exists()
    assert not (dest / ".portable" / "workspace.json").exists(), "a failed restore is not a copy"
    _assert_no_wrong_bytes(dest, src)
    report = fsck(ws.store, read_data=True)
    assert not report.ok and any(h in e for e in report.errors)
    assert fsck(ws.store).ok, "without --read-data the object is present, so the structure is fine"


def test_tampered_blob_read_by_range_is_refused(file_store: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {f"f{i}.txt": f"content {i}\n" * 50 for i in range(20)})
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    for i in range(1, 20):  # version 2 needs one blob of a big pack: fetched by range
        (src / f"f{i}.txt").unlink()
    ws.snapshot(progress=None)
    entry = ws.store.read_manifest(ws.workspace_id).by_path()["f0.txt"]
    _flip(ws, entry.pack.pack, entry.pack.offset + 5)
    dest = tmp_path / "dest"
    with pytest.raises(IntegrityError, match="f0.txt"):
        Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert not (dest / "f0.txt").exists()


@pytest.mark.parametrize("victim", ["manifest", "tree"])
def test_tampered_manifest_is_refused(file_store: str, tmp_path: Path, cli, victim: str) -> None:
    """Format 2 keeps names in trees: a renamed entry in the root tree is refused like a
    changed manifest (both are named by the hash of their bytes)."""
    src = tmp_path / "src"
    write_tree(src, FILES)
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    backend = ws.store.backend
    key = backend.list(f"workspaces/{ws.workspace_id}/manifests")[0]
    if victim == "tree":
        key = object_key(ws.store.read_manifest(ws.workspace_id).tree)
        assert b"notes.txt" in backend.read(key)
        body = backend.read(key).replace(b"notes.txt", b"notez.txt")
    else:
        assert b'"epoch":0' in backend.read(key)
        body = backend.read(key).replace(b'"epoch":0', b'"epoch":1')
    backend.write(key, body)
    proc = cli("restore", "--store", file_store, "--workspace", ws.workspace_id, str(tmp_path / "d"), check=False)
    assert proc.returncode == 1 and victim in proc.stderr and "corrupt" in proc.stderr
    assert not (tmp_path / "d" / "notez.txt").exists()
