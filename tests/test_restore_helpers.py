"""A large restore writes its small files on helper processes. These tests lower the
threshold so that a small version takes that path, and compare it with the threads' path on
the real filesystem: the same bytes, modes and mtimes, a stat cache that knows every file,
and the same refusals (a corrupt object, a folder that leads out of the destination, a
helper that died)."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import pytest
from conftest import read_tree, write_tree

from jupyter_portable import IntegrityError, UnsafePath, Workspace
from jupyter_portable.engine import restore as restore_mod
from jupyter_portable.engine.hashproc import helper_pool, place_files
from jupyter_portable.engine.restore import restore
from jupyter_portable.store.repo import Store, digest
from jupyter_portable.workdir.statcache import StatCache, stat_key

MTIME = 1_650_000_000_987_654_321


def _source(tmp_path: Path) -> tuple[Workspace, dict[str, tuple[bytes, int]]]:
    rnd = random.Random(15)
    files = {f"d{i % 9}/s{i % 4}/f{i:04d}.bin": rnd.randbytes(rnd.randrange(0, 3000)) for i in range(700)}
    src = tmp_path / "src"
    write_tree(src, files)
    for i, rel in enumerate(files):
        os.chmod(src / rel, (0o600, 0o640, 0o755, 0o444)[i % 4])
        os.utime(src / rel, ns=(MTIME + i, MTIME + i))
    os.symlink("../d1/s1/f0001.bin", src / "d0" / "link")
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    return ws, read_tree(src)


@pytest.fixture
def on_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every restore takes the helpers' path, with small chunks and few in flight."""
    monkeypatch.setattr(restore_mod, "HELPER_MIN", 0)
    monkeypatch.setattr(restore_mod, "HELPER_CHUNK", 16)
    monkeypatch.setattr(restore_mod, "HELPER_IN_FLIGHT", 2)


def _mtimes(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".portable"]
        for name in names:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                out[os.path.relpath(full, root)] = os.lstat(full).st_mtime_ns
    return out


def _cache_matches_disk(root: Path) -> int:
    """Every file's stat key in the copy's stat cache is its stat now; how many there are."""
    n = 0
    with StatCache(root / ".portable") as cache:
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != ".portable"]
            for name in names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root)
                dir_id = cache.dir_of(rel)
                assert dir_id is not None, rel
                key = cache.rows(dir_id)[cache.lookup_name(name)]
                if os.path.islink(full):
                    assert key == os.readlink(full), rel
                else:
                    assert key == stat_key(os.lstat(full)), rel
                n += 1
    return n


def test_helpers_restore_what_threads_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws, want = _source(tmp_path)
    by_threads = tmp_path / "threads"
    Workspace.restore(str(tmp_path / "store"), ws.workspace_id, by_threads, progress=None)
    monkeypatch.setattr(restore_mod, "HELPER_MIN", 0)
    monkeypatch.setattr(restore_mod, "HELPER_CHUNK", 16)
    monkeypatch.setattr(restore_mod, "HELPER_IN_FLIGHT", 2)
    used = []
    real_pool = restore_mod.helper_pool

    def counting_pool(**kw: object) -> object:
        pool = real_pool(**kw)  # type: ignore[arg-type]
        used.append(pool)
        return pool

    monkeypatch.setattr(restore_mod, "helper_pool", counting_pool)
    by_helpers = tmp_path / "helpers"
    res = Workspace.restore(str(tmp_path / "store"), ws.workspace_id, by_helpers, progress=None)
    if used == [None]:
        pytest.skip("no helper process can be started here")
    assert len(used) == 1
    assert res.files == len(want)
    assert read_tree(by_helpers) == read_tree(by_threads) == want
    assert _mtimes(by_helpers) == _mtimes(by_threads) == _mtimes(tmp_path / "src")
    assert _cache_matches_disk(by_helpers) == len(want)
    assert not (by_helpers / ".portable" / "tmp").exists(), "no temp file is left"
    assert Workspace.find(by_helpers).verify().ok


def test_a_corrupt_file_in_a_pack_is_refused_with_its_hint_and_no_wrong_file_is_left(
        tmp_path: Path, on_helpers: None) -> None:
    ws, everything = _source(tmp_path)
    src = tmp_path / "src"
    for i, rel in enumerate(sorted(everything)):
        if i % 5 and rel != "d0/link" and rel != "d1/s1/f0001.bin":
            (src / rel).unlink()
    assert ws.snapshot(progress=None).version == 2  # a fifth of the pack: read as ranges, each file hashed alone
    want = read_tree(src)
    manifest = ws.store.read_manifest(ws.workspace_id, 2)
    victim = next(e for e in ws.store.iter_files(manifest.tree) if e.pack is not None and e.size > 100)
    pack = tmp_path / "store" / "objects" / victim.pack.pack[:2] / victim.pack.pack
    os.chmod(pack, 0o644)
    body = bytearray(pack.read_bytes())
    body[victim.pack.offset + victim.size // 2] ^= 0xFF
    pack.write_bytes(bytes(body))
    dest = tmp_path / "out"
    with pytest.raises(IntegrityError) as err:
        Workspace.restore(str(tmp_path / "store"), ws.workspace_id, dest, progress=None)
    assert victim.path in str(err.value) and err.value.hint and "fsck" in err.value.hint
    got = read_tree(dest)
    assert victim.path not in got
    for rel, value in got.items():  # whatever was written is a file of the version, whole
        assert value == want[rel], rel


def test_a_helper_pool_that_died_leaves_the_work_to_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 on_helpers: None) -> None:
    ws, want = _source(tmp_path)
    pool = helper_pool(most=1, spare_one=False)
    if pool is None:
        pytest.skip("no helper process can be started here")
    with pytest.raises(Exception):  # noqa: B017 - the helper's own end breaks the pool
        pool.submit(os._exit, 3).result()
    monkeypatch.setattr(restore_mod, "helper_pool", lambda **_kw: pool)
    dest = tmp_path / "out"
    res = restore(Store.open(str(tmp_path / "store")), ws.workspace_id, dest)
    assert res.files == len(want)
    assert read_tree(dest) == want
    assert _cache_matches_disk(dest) == len(want)


def test_a_helper_refuses_a_folder_that_leads_out_of_the_destination(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    os.symlink(outside, root / "d")
    data = b"escape"
    with pytest.raises(UnsafePath):
        place_files(str(root), data, [("d/x", 0, len(data), digest(data), 0o644, MTIME)])
    assert os.listdir(outside) == []
    with pytest.raises(IntegrityError):
        place_files(str(root), data, [("y", 0, len(data), digest(b"other"), 0o644, MTIME)])
    assert not (root / "y").exists()
    got = place_files(str(root), b"..ab", [("a/1", 2, 1, digest(b"a"), 0o600, MTIME),
                                           ("a/2", 3, 1, digest(b"b"), 0o755, MTIME + 1)])
    assert [(root / "a" / n).read_bytes() for n in ("1", "2")] == [b"a", b"b"]
    assert stat.S_IMODE(os.lstat(root / "a" / "2").st_mode) == 0o755
    assert got == [stat_key(os.lstat(root / "a" / n)) for n in ("1", "2")]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_restore_leaves_the_cycle_collector_as_it_found_it(tmp_path: Path, enabled: bool) -> None:
    """Restore pauses Python's cycle collector while it runs (its objects hold no cycles) and
    gives it back as it was, also when the restore fails."""
    import gc

    from jupyter_portable.engine.progress import Progress

    seen: list[bool] = []  # the collector's state at each stage of the restore

    class Watching(Progress):
        def set_stage(self, stage: str) -> None:
            seen.append(gc.isenabled())
            super().set_stage(stage)

    ws, files = _source(tmp_path)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        restore(ws.store, ws.workspace_id, tmp_path / "out", progress=Watching("restore", sink=lambda _line: None))
        assert seen and not any(seen)  # paused while it ran
        assert gc.isenabled() is enabled
        assert read_tree(tmp_path / "out") == files
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "mine.txt").write_text("not the workspace's")
        with pytest.raises(Exception, match="not empty"):
            restore(Store.open(ws.store.url), ws.workspace_id, tmp_path / "other")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
