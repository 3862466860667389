"""The stat cache's folder signatures: a no-change snapshot stats each file once and lists no
folder with care, and every change a careful listing would see is still seen."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from conftest import read_tree, write_tree

from jupyter_portable import Workspace
from jupyter_portable.engine.listing import Lister
from jupyter_portable.store.repo import digest
from jupyter_portable.workdir.statcache import StatCache


def _age(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        if ".portable" in dirpath:
            continue
        for name in files:
            os.utime(os.path.join(dirpath, name), (1_700_000_000, 1_700_000_000))


def _layout() -> dict[str, str]:
    return {f"d{i}/sub/f{j:03d}.txt": f"file {i} {j}\n" for i in range(3) for j in range(20)}


@pytest.fixture
def careful(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders listed with care (every file compared with its row) from now on."""
    seen: list[str] = []
    real = Lister.list

    def counting(self: Lister, rel_dir: str, abs_dir: str):  # type: ignore[no-untyped-def]
        seen.append(rel_dir)
        return real(self, rel_dir, abs_dir)

    monkeypatch.setattr(Lister, "list", counting)
    return seen


def _workspace(tmp_path: Path) -> tuple[Path, Workspace]:
    src = tmp_path / "src"
    write_tree(src, _layout())
    _age(src)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    return src, ws


def test_a_no_change_snapshot_lists_no_folder_with_care(tmp_path: Path, careful: list[str]) -> None:
    _src, ws = _workspace(tmp_path)
    careful.clear()
    res = ws.snapshot(progress=None)
    assert not res.changed and res.hashed == 0
    assert careful == [], "every folder's signature held"


def test_a_rewrite_with_the_same_size_and_the_old_mtime_is_seen(tmp_path: Path, careful: list[str]) -> None:
    src, ws = _workspace(tmp_path)
    victim = src / "d1" / "sub" / "f007.txt"
    old = victim.stat()
    victim.write_text("FILE 1 7\n")  # same size
    os.utime(victim, ns=(old.st_atime_ns, old.st_mtime_ns))
    careful.clear()
    res = ws.snapshot(progress=None)
    assert res.changed and res.hashed == 1
    assert "d1/sub" in careful and "d0/sub" not in careful, "only the changed folder (and those above) listed"
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    assert (out / "d1" / "sub" / "f007.txt").read_text() == "FILE 1 7\n"


def test_a_new_ignore_rule_drops_files_of_unchanged_folders(tmp_path: Path) -> None:
    src, ws = _workspace(tmp_path)
    (src / ".portableignore").write_text("f003.txt\n")
    res = ws.snapshot(progress=None)
    assert res.changed and res.files == 60 - 3 + 1
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    assert not (out / "d2" / "sub" / "f003.txt").exists() and (out / "d2" / "sub" / "f004.txt").exists()


def test_a_retargeted_symlink_is_recorded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, _layout())
    os.symlink("f001.txt", src / "d0" / "sub" / "link")
    _age(src)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    ws.snapshot(progress=None)
    os.unlink(src / "d0" / "sub" / "link")
    os.symlink("f002.txt", src / "d0" / "sub" / "link")
    assert ws.snapshot(progress=None).changed
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    assert os.readlink(out / "d0" / "sub" / "link") == "f002.txt"


def test_after_a_restore_the_second_snapshot_trusts_the_signatures(tmp_path: Path, careful: list[str]) -> None:
    _src, ws = _workspace(tmp_path)
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    copy = Workspace.find(out)
    careful.clear()
    assert not copy.snapshot(progress=None).changed
    assert careful, "the restore kept rows but no signature: listed with care once"
    careful.clear()
    assert not copy.snapshot(progress=None).changed
    assert careful == []
    assert read_tree(out) == read_tree(tmp_path / "src")


def test_a_layout_2_cache_is_upgraded_in_place(tmp_path: Path) -> None:
    src, ws = _workspace(tmp_path)
    db = sqlite3.connect(src / ".portable" / "statcache.sqlite")
    db.execute("ALTER TABLE dirs DROP COLUMN sig")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    with StatCache(src / ".portable") as cache:
        assert cache.count() == 60 and cache.version() == 1, "rows kept"
    res = ws.snapshot(progress=None)
    assert not res.changed and res.hashed == 0


def test_a_layout_3_cache_keeps_its_rows_and_gets_the_compact_blobs_table(tmp_path: Path) -> None:
    src, ws = _workspace(tmp_path)
    db = sqlite3.connect(src / ".portable" / "statcache.sqlite")
    db.executescript("DROP TABLE blobs; DROP TABLE packs; CREATE TABLE blobs (hash TEXT PRIMARY KEY, pack TEXT "
                     "NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL) WITHOUT ROWID;")
    db.execute("INSERT INTO blobs VALUES (?, ?, 0, 1)", ("a" * 64, "b" * 64))
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    with StatCache(src / ".portable") as cache:
        assert cache.count() == 60 and cache.version() == 1, "rows kept"
        assert cache.blob_reader() is None, "the old blob rows are dropped"
    res = ws.snapshot(progress=None)
    assert not res.changed and res.hashed == 0
    (src / "d0" / "new.txt").write_bytes(b"fresh bytes")
    assert ws.snapshot(progress=None).changed
    with StatCache(src / ".portable") as cache:
        reader = cache.blob_reader()
        assert reader is not None
        got = reader.get(digest(b"fresh bytes"))
        reader.close()
    assert got is not None and got[2] == len(b"fresh bytes") and len(got[0]) == 64


def test_a_moved_folder_of_small_files_stores_no_blob_again(tmp_path: Path) -> None:
    from test_format2 import CountingBackend

    from jupyter_portable.store.repo import Store

    src, ws = _workspace(tmp_path)
    os.rename(src / "d1", src / "moved")
    (src / "d2" / "copy.txt").write_bytes((src / "d0" / "sub" / "f005.txt").read_bytes())
    counting = CountingBackend(str(tmp_path / "store"))
    ws._store = Store(counting)
    res = ws.snapshot(progress=None)
    assert res.changed and res.hashed == 21
    assert not [k for k in counting.keys if k.startswith("index/")], f"no pack was written: {counting.keys}"
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    assert read_tree(out) == read_tree(src)


def test_after_a_restore_a_moved_file_is_not_stored_again(tmp_path: Path) -> None:
    from test_format2 import CountingBackend

    from jupyter_portable.store.repo import Store

    _src, ws = _workspace(tmp_path)
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, out, progress=None)
    os.rename(out / "d0" / "sub" / "f001.txt", out / "d0" / "f001.txt")
    copy = Workspace.find(out)
    counting = CountingBackend(str(tmp_path / "store"))
    copy._store = Store(counting)
    assert copy.snapshot(progress=None).changed
    assert not [k for k in counting.keys if k.startswith("index/")], counting.keys
