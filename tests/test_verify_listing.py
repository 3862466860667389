"""verify against the directory: what is on disk and not in the version is reported, by the
cheap listing (names and entry types) and by the careful one (links, special files) alike."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.engine.listing import Lister


def _restored(tmp_path: Path) -> tuple[Workspace, Path]:
    src = tmp_path / "src"
    write_tree(src, {"a/x.txt": "x", "a/b/y.txt": "yy", "top.txt": "t", ".portableignore": "*.log\n"})
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    return Workspace.find(out), out


def _reasons(ws: Workspace) -> dict[str, str]:
    return {m["path"]: m["reason"] for m in ws.verify().mismatches}


def test_a_restored_copy_verifies_and_extra_files_are_named(tmp_path: Path) -> None:
    ws, out = _restored(tmp_path)
    assert ws.verify().ok
    (out / "a" / "new.txt").write_text("extra")
    (out / "a" / "c").mkdir()
    (out / "a" / "c" / "deep.txt").write_text("deeper")
    (out / "a" / "ignored.log").write_text("the ignore rules keep it out")
    (out / "a" / "b" / "y.txt").unlink()
    got = _reasons(ws)
    assert got == {"a/new.txt": "not in version 1", "a/c/deep.txt": "not in version 1", "a/b/y.txt": "missing"}


def test_links_and_special_files_are_listed_with_care(tmp_path: Path) -> None:
    ws, out = _restored(tmp_path)
    os.symlink("x.txt", out / "a" / "inside")
    os.symlink("/etc/passwd", out / "a" / "outside")  # never recorded: not part of the workspace
    os.mkfifo(out / "a" / "pipe")  # a special file is never recorded either
    got = _reasons(ws)
    assert got == {"a/inside": "not in version 1"}
    # the cheap listing declines such a folder, and keeps to plain ones
    lister = Lister(out)
    assert lister.names("a", str(out / "a")) is None
    names, dirs = lister.names("a/b", str(out / "a" / "b")) or ([], [])
    assert names == ["y.txt"] and dirs == []
    top = lister.names("", str(out))
    assert top is not None and sorted(top[0]) == [".portableignore", "top.txt"] and [n for n, _p in top[1]] == ["a"]
