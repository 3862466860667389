"""The store format document, checked where issue 29 corrected it: the sort order it states
(code points, on non-UTF-8 and astral names), and its Python reader (section 8.3) on deep,
shared and hostile trees: no recursion, no walk of every path of a DAG, the same refusals as
the package."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_hostile_trees import _file, _nest, _publish, _tree, _workspace
from test_store_format_doc import DOC, _doc_python_reader

from jupyter_portable import Workspace
from jupyter_portable.core.tree_object import MAX_DEPTH
from jupyter_portable.store.repo import head_key, object_key


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied with ``rm -rf`` afterwards: Python's rmtree recurses once per level."""
    yield tmp_path
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


pytestmark = pytest.mark.timeout(300)


def _documented_order() -> list[str]:
    """The names of section 4.7's sort-order table, in the order the table gives."""
    text = DOC.read_text()
    rows = re.findall(r'^  \| `("[^`]+")` ', text.split("### 4.7 ", 1)[1].split("### 4.8 ", 1)[0], re.M)
    return [json.loads(r) for r in rows]


def test_the_writer_sorts_names_by_code_point_as_the_document_says(tmp_path: Path, file_store: str) -> None:
    names = _documented_order()
    assert len(names) == 4 and names == sorted(names)  # code points: Python's order of str
    assert sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape")) != names  # not git's byte order
    assert sorted(names, key=lambda n: n.encode("utf-16-be", "surrogatepass")) != names  # nor UTF-16's
    src = tmp_path / "src"
    src.mkdir()
    for i, name in enumerate(reversed(names)):
        (src / name).write_text(f"{i}\n")  # "\udce9" is written as the single byte 0xE9
    assert os.fsencode(os.fsdecode(b"\xe9")) in os.listdir(os.fsencode(src))
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    root = ws.store.read_manifest(ws.workspace_id).tree or ""
    stored = json.loads(ws.store.backend.read(object_key(root)))
    assert [e["name"] for e in stored["entries"]] == names
    dest = tmp_path / "dest"
    Workspace.restore(file_store, ws.workspace_id, dest, progress=None)
    assert sorted(os.listdir(os.fsencode(dest))) == sorted([b".portable", *(os.fsencode(n) for n in names)])
    assert Workspace.find(dest).verify().ok
    # the document's own reader restores them byte for byte too
    _doc_python_reader()["read_workspace"](str(tmp_path / "store"), ws.workspace_id, str(tmp_path / "by-doc"))
    assert sorted(os.listdir(os.fsencode(tmp_path / "by-doc"))) == sorted(os.fsencode(n) for n in names)


def test_the_documents_reader_restores_folders_1024_levels_deep(deep_tmp: Path, file_store: str) -> None:
    src = deep_tmp / "src"
    bottom = _nest(src, MAX_DEPTH)
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    dest = deep_tmp / "by-doc"
    _doc_python_reader()["read_workspace"](str(deep_tmp / "store"), ws.workspace_id, str(dest))
    with open(str(dest) + bottom[len(str(src)):] + "/f.txt") as fh:
        assert fh.read() == "deep\n"


def _read_refused(tmp_path: Path, ws: Workspace, match: str) -> None:
    with pytest.raises(ValueError, match=match):  # a reader that expanded the DAG would hang: the timeout ends it
        _doc_python_reader()["read_workspace"](str(tmp_path / "store"), ws.workspace_id, str(tmp_path / "by-doc"))
    assert not (tmp_path / "by-doc").exists() or not list((tmp_path / "by-doc").iterdir())


@pytest.mark.parametrize("leaf_files", [1, 0])
def test_the_documents_reader_counts_shared_trees_before_it_walks(tmp_path: Path, file_store: str,
                                                                   leaf_files: int) -> None:
    ws = _workspace(tmp_path, file_store)
    h = _tree(ws, [_file(ws, "f.txt")] if leaf_files else [])
    for _ in range(60):
        h = _tree(ws, [{"name": "a", "tree": h, "type": "dir"}, {"name": "b", "tree": h, "type": "dir"}])
    _publish(ws, h, leaf_files, 5 * leaf_files)
    _read_refused(tmp_path, ws, "do not hold what the manifest says")


def test_the_documents_reader_refuses_what_the_package_refuses(tmp_path: Path, file_store: str) -> None:
    ws = _workspace(tmp_path, file_store)
    ok = _file(ws, "ok.txt")  # read while the head is sound

    def named(name: str) -> dict[str, Any]:
        return dict(ok, name=name)

    _publish(ws, _tree(ws, [named("bad\ud800name")]), 1, 5)
    _read_refused(tmp_path, ws, "surrogates not allowed")
    _publish(ws, _tree(ws, [named("é"), named("\udcc3\udca9")]), 2, 10)
    _read_refused(tmp_path, ws, "unsafe path")
    _publish(ws, _tree(ws, [{"name": "é", "tree": _tree(ws, [named("x")]), "type": "dir"},
                            {"name": "\udcc3\udca9", "tree": _tree(ws, [named("y")]), "type": "dir"}]), 2, 10)
    _read_refused(tmp_path, ws, "unsafe path")
    backend = ws.store.backend
    body, token = backend.read_versioned(head_key(ws.workspace_id)) or (b"", "")
    backend.swap(head_key(ws.workspace_id), body.decode().encode("utf-16"), token)
    _read_refused(tmp_path, ws, "codec can't decode")


def test_the_documents_reader_refuses_a_manifest_of_a_later_epoch(tmp_path: Path, file_store: str) -> None:
    from test_fsck_restore import publish_edited

    ws = _workspace(tmp_path, file_store)
    publish_edited(ws, epoch=2)
    _read_refused(tmp_path, ws, "epoch is above the head's")


def test_the_document_lists_every_local_file_of_a_copy(tmp_path: Path, file_store: str) -> None:
    """Section 4.6 names every file a copy's .portable/ holds (what a snapshot and a restore leave)."""
    ws = _workspace(tmp_path, file_store)
    ws.snapshot(progress=None)
    section = DOC.read_text().split("### 4.6 ", 1)[1].split("### 4.7 ", 1)[0]
    for name in os.listdir(tmp_path / "src" / ".portable"):
        stem = re.sub(r"-(wal|shm)$", "", name)
        assert f"`.portable/{stem}`" in section or f"`{stem}`" in section, name
    for name in ("publishing.json", "runtime.json", "pending.json", "restoring.json", "workspace.json"):
        assert f".portable/{name}" in section, name
