"""No hostile store hangs or crashes restore: trees that name each other over and over are
refused before they are walked, folders nest up to one stated limit (1024) on both sides and a
deeper one is refused in one line, and names no filesystem can hold, or two names that are one
file on disk, are refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.core.manifest import Head, Manifest, ParentRef
from jupyter_portable.core.times import now_iso
from jupyter_portable.core.tree_object import MAX_DEPTH
from jupyter_portable.engine.fsck import fsck
from jupyter_portable.store.repo import digest, head_key, manifest_key


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied with ``rm -rf`` afterwards: Python's rmtree recurses once per level."""
    yield tmp_path
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


pytestmark = pytest.mark.timeout(300)  # a walk that expanded the DAG would hang: this ends it


def _workspace(tmp_path: Path, store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"ok.txt": "fine\n"})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws


def _tree(ws: Workspace, entries: list[dict[str, Any]]) -> str:
    """A tree object written as given (sorted by the caller), as a hostile store holds it."""
    body = json.dumps({"entries": entries, "format": "jupyter-portable.tree", "schema": 2},
                      sort_keys=True, separators=(",", ":")).encode()
    return ws.store.put_object(body)


def _file(ws: Workspace, name: str) -> dict[str, Any]:
    """The sound entry of ok.txt under another name."""
    entry = ws.store.read_manifest(ws.workspace_id).by_path()["ok.txt"].to_json()
    del entry["path"]
    return dict(entry, name=name)


def _publish(ws: Workspace, root: str, files: int, nbytes: int) -> None:
    store, wsid = ws.store, ws.workspace_id
    head, _ = store.read_head(wsid)
    manifest = Manifest.with_tree(root, files, nbytes, workspace_id=wsid, version=head.version + 1,
                                  created=now_iso(), parent=ParentRef(head.version, head.manifest or ""),
                                  epoch=head.epoch)
    store.publish(manifest, expected_version=head.version, epoch=head.epoch)


def _restore_fails(cli: Any, store: str, ws: Workspace, dest: Path, says: str) -> None:
    # a restore that walked all 2^60 paths would never end: the command's own timeout fails the test
    proc = cli("restore", "--store", store, "--workspace", ws.workspace_id, str(dest), check=False, timeout=60)
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("restore: ")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and len(errors[0]) < 600, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not [p for p in dest.rglob("*") if ".portable" not in p.parts] if dest.exists() else True


@pytest.mark.parametrize("leaf_files", [1, 0])
def test_trees_naming_each_other_twice_are_refused_quickly(tmp_path: Path, file_store: str, cli: Any,
                                                           leaf_files: int) -> None:
    """61 trees, each naming the next twice: 2^60 paths, 61 objects. With a file at the bottom
    the counts give it away; with none, the folders do."""
    ws = _workspace(tmp_path, file_store)
    h = _tree(ws, [_file(ws, "f.txt")] if leaf_files else [])
    for _ in range(60):
        h = _tree(ws, [{"name": "a", "tree": h, "type": "dir"}, {"name": "b", "tree": h, "type": "dir"}])
    _publish(ws, h, leaf_files, 5 * leaf_files)
    _restore_fails(cli, file_store, ws, tmp_path / "dest", "says" if leaf_files else "folders")
    report = fsck(ws.store)  # bounded by the module's timeout, not a clock read here
    assert not report.ok and any("version 2 of" in e for e in report.errors), report.errors
    # the version before is untouched; verifying a copy against the hostile one stops at once
    Workspace.restore(file_store, ws.workspace_id, tmp_path / "v1", version=1, progress=None)
    proc = cli("verify", "--version", "2", cwd=tmp_path / "v1", check=False, timeout=60)
    assert proc.returncode == 1 and "over and over" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def _nest(root: Path, levels: int) -> str:
    """``root/d/d/...`` ``levels`` folders deep with a file at the bottom (pathlib recurses per level)."""
    path = str(root)
    os.makedirs(path, exist_ok=True)
    for _ in range(levels):
        path += "/d"
        os.mkdir(path)
    with open(path + "/f.txt", "w") as fh:
        fh.write("deep\n")
    return path


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but .portable, by path (a stack: os.walk recurses per level)."""
    out: dict[str, bytes] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel)) as entries:
            for e in entries:
                path = f"{rel}/{e.name}" if rel else e.name
                if e.is_dir(follow_symlinks=False):
                    if path != ".portable":
                        stack.append(path)
                else:
                    with open(e.path, "rb") as fh:
                        out[path] = fh.read()
    return out


def test_folders_1024_levels_deep_snapshot_restore_and_verify(deep_tmp: Path, file_store: str, cli: Any) -> None:
    src = deep_tmp / "src"
    bottom = _nest(src, MAX_DEPTH)
    cli("init", "--store", file_store, cwd=src)
    cli("snapshot", "-q", cwd=src)
    with open(bottom + "/g.txt", "w") as fh:  # a second snapshot reads the base version's folders
        fh.write("more\n")
    cli("snapshot", "-q", cwd=src)
    wsid = json.loads((src / ".portable" / "workspace.json").read_text())["workspace_id"]
    dest = deep_tmp / "dest"
    cli("restore", "-q", "--store", file_store, "--workspace", wsid, str(dest))
    cli("verify", cwd=dest)
    assert "d/" * (MAX_DEPTH - 1) + "d/g.txt" in cli("diff", "1", "2", cwd=dest).stdout
    assert _files(dest) == _files(src) and len(_files(dest)) == 2
    assert cli.json("fsck", "--store", file_store, "--read-data")["ok"]


def test_verify_and_the_tree_count_agree_on_a_one_file_copy_1024_levels_deep(  # issue 41
        deep_tmp: Path, file_store: str, cli: Any) -> None:
    """``verify`` counted the root among the folders, ``trees.check_count`` did not: a valid
    copy of one file 1,024 levels down was refused by one and restored by the other."""
    src = deep_tmp / "src"
    _nest(src, MAX_DEPTH)
    cli("init", "--store", file_store, cwd=src)
    cli("snapshot", "-q", cwd=src)
    wsid = json.loads((src / ".portable" / "workspace.json").read_text())["workspace_id"]
    dest = deep_tmp / "dest"
    cli("restore", "-q", "--store", file_store, "--workspace", wsid, str(dest))
    assert cli.json("verify", cwd=dest)["ok"]
    assert _files(dest) == _files(src) and len(_files(dest)) == 1


def test_a_folder_deeper_than_the_limit_is_refused_in_one_line(deep_tmp: Path, file_store: str, cli: Any) -> None:
    src = deep_tmp / "src"
    _nest(src, MAX_DEPTH + 1)
    cli("init", "--store", file_store, cwd=src)
    proc = cli("snapshot", "-q", cwd=src, check=False)
    assert proc.returncode == 1 and f"more than {MAX_DEPTH} levels deep" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and len(proc.stderr) < 600, proc.stderr
    # the same depth from a hostile store
    ws = _workspace(deep_tmp / "w", file_store)
    h = _tree(ws, [_file(ws, "f.txt")])
    for _ in range(MAX_DEPTH + 1):
        h = _tree(ws, [{"name": "d", "tree": h, "type": "dir"}])
    _publish(ws, h, 1, 5)
    _restore_fails(cli, file_store, ws, deep_tmp / "dest", f"more than {MAX_DEPTH} levels deep")


def _publish_flat(ws: Workspace, files: list[dict[str, Any]]) -> None:
    """A schema-1 version 2 listing ``files``, written raw (as a hostile store holds it)."""
    store, wsid = ws.store, ws.workspace_id
    head, token = store.read_head(wsid)
    obj = {"format": "jupyter-portable.manifest", "schema": 1, "workspace_id": wsid, "version": 2,
           "parent": {"version": 1, "manifest": head.manifest}, "created": now_iso(), "message": "",
           "epoch": head.epoch, "files": files, "checkpoints": [], "runtime": None, "next_action": None,
           "allocations": []}
    body = json.dumps(obj).encode()
    mhash = digest(body)
    store.backend.write(manifest_key(wsid, 2, mhash), body)
    store.backend.swap(head_key(wsid), Head(wsid, 2, mhash, head.epoch, now_iso()).to_bytes(), token)


def _flat(ws: Workspace, path: str) -> dict[str, Any]:
    return dict(ws.store.read_manifest(ws.workspace_id, 1).by_path()["ok.txt"].to_json(), path=path)


@pytest.mark.parametrize("schema", [1, 2])
def test_a_name_with_a_lone_surrogate_is_refused_in_one_line(tmp_path: Path, file_store: str, cli: Any,
                                                              schema: int) -> None:
    ws = _workspace(tmp_path, file_store)
    if schema == 2:
        _publish(ws, _tree(ws, [_file(ws, "bad\ud800name"), _file(ws, "ok.txt")]), 2, 10)
    else:
        _publish_flat(ws, [_flat(ws, "bad\ud800name"), _flat(ws, "ok.txt")])
    _restore_fails(cli, file_store, ws, tmp_path / "dest", "lone surrogate")
    assert any("lone surrogate" in e for e in fsck(ws.store).errors)


@pytest.mark.parametrize("schema", [1, 2])
def test_two_names_that_are_one_file_on_disk_write_nothing(tmp_path: Path, file_store: str, cli: Any,
                                                           schema: int) -> None:
    """"é" and "\\udcc3\\udca9" (its UTF-8 bytes, escaped) are two strings and one folder on disk."""
    ws = _workspace(tmp_path, file_store)
    escaped = "\udcc3\udca9"
    if schema == 2:
        first = _tree(ws, [_file(ws, "pwned.txt")])
        second = _tree(ws, [_file(ws, "other.txt")])
        # sorted by code point: U+00E9 before U+DCC3
        _publish(ws, _tree(ws, [{"name": "é", "tree": first, "type": "dir"},
                                {"name": escaped, "tree": second, "type": "dir"}]), 2, 10)
    else:
        _publish_flat(ws, [_flat(ws, "é/pwned.txt"), _flat(ws, f"{escaped}/other.txt")])
    dest = tmp_path / "dest"
    _restore_fails(cli, file_store, ws, dest, "same")
    assert not os.path.lexists(dest / "é")
    assert any("same" in e for e in fsck(ws.store).errors)
    # a name that is not UTF-8 on its own is still a name: alone, it restores byte for byte
    src = tmp_path / "latin"
    src.mkdir()
    (src / os.fsdecode(b"caf\xe9.txt")).write_text("latin-1\n")
    ws2 = Workspace.init(src, file_store)
    ws2.snapshot(progress=None)
    Workspace.restore(file_store, ws2.workspace_id, tmp_path / "latin-dest", progress=None)
    assert os.listdir(os.fsencode(tmp_path / "latin-dest")) == [b".portable", b"caf\xe9.txt"] or \
        sorted(os.listdir(os.fsencode(tmp_path / "latin-dest"))) == [b".portable", b"caf\xe9.txt"]
