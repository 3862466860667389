"""The scrub (engine/scrub): what no journal and no stat sees, a re-read of unchanged files
finds, in a rotating order, within a bound; the next snapshot publishes the file's bytes."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from jupyter_portable import Workspace
from jupyter_portable.engine.scrub import DAY_S, budget_for
from jupyter_portable.workdir.statcache import stat_key


def _tree(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == root and d == ".portable")]
        for n in filenames:
            p = Path(dirpath) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _same_elsewhere(ws: Workspace, src: Path, dest: Path) -> None:
    Workspace.restore(ws.store.url, ws.workspace_id, dest, progress=None)
    assert _tree(dest) == _tree(src)


def _unseen_rewrite(ws: Workspace, path: Path, data: bytes) -> None:
    """New bytes of the same size whose change stat cannot see: the stat cache is made to hold
    the file's stat after the write, as a write through a dirty mapped page leaves it."""
    path.write_bytes(data)
    rel = str(path.relative_to(ws.root))
    with ws.copy.statcache() as cache:
        cache.begin()
        cache.set_key(rel, stat_key(os.lstat(path)))
        cache.commit()


def test_a_change_stat_never_saw_is_found_by_the_scrub_and_published(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "deep" / "er").mkdir(parents=True)
    (src / "deep" / "er" / "m.bin").write_bytes(b"A" * 4096)
    (src / "deep" / "er" / "n.bin").write_bytes(b"n" * 10)
    (src / "top.txt").write_text("top")
    for p in (src / "deep" / "er" / "m.bin", src / "deep" / "er" / "n.bin", src / "top.txt"):
        os.utime(p, (1_700_000_000, 1_700_000_000))  # not too fresh: the stat cache keeps their rows
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    _unseen_rewrite(ws, src / "deep" / "er" / "m.bin", b"B" * 4096)
    assert not ws.snapshot(progress=None).changed, "stat saw the change: the test shows nothing"
    found = ws.scrub(budget=1 << 30)
    assert found.mismatched == ["deep/er/m.bin"] and found.files == 3
    assert "deep/er/m.bin changed without any change to its size, mtime or ctime" in found.warnings()[0]
    res = ws.snapshot(progress=None)
    assert res.changed and res.hashed == 2, "the folder of the file was not read again whole"
    _same_elsewhere(ws, src, tmp_path / "dest")
    assert ws.scrub(budget=1 << 30).mismatched == []


def test_the_scrub_rotates_so_every_file_is_read_within_its_bound(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_bytes(bytes([65 + i]) * 100)
        os.utime(src / f"f{i}", (1_700_000_000, 1_700_000_000))
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    _unseen_rewrite(ws, src / "f7", b"z" * 100)
    runs, found = 0, []
    while not found:
        got = ws.scrub(budget=300)  # three files a run: ten files take four runs
        assert got.files == 3 or got.wrapped
        found = got.mismatched
        runs += 1
        assert runs <= 4, "a file was not read within total / budget runs"
    assert found == ["f7"]
    # a budget of total bytes x interval / day reads every file at least once a day
    assert budget_for(10**12, 600, least=1) * (DAY_S / 600) >= 10**12
    assert budget_for(10, 600) == 64 * 1024 * 1024


def test_a_run_of_many_small_files_stops_at_its_file_bound(tmp_path: Path) -> None:
    """A million small files hold 64 MiB between them: the byte budget alone made one run read
    587,117 files (209 s, bench/scale.py on 2026-12-06). A run also stops at its file bound, which
    grows only as far as a day of runs needs to read every file once."""
    from jupyter_portable.engine.scrub import DEFAULT_FILES, files_for

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}").write_bytes(b"x" * 10)
        os.utime(src / f"f{i:02d}", (1_700_000_000, 1_700_000_000))  # settled: the stat cache keeps its row
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    got = ws.scrub(budget=64 * 1024 * 1024, files=7)
    assert (got.files, got.bytes) == (7, 70)
    assert files_for(40, 600) == DEFAULT_FILES
    assert files_for(1_000_000, 600) * (DAY_S / 600) >= 1_000_000  # every file once a day at 10-minute runs
    assert files_for(1_000_000, 600) < 10_000


def test_a_second_write_through_a_dirty_mapped_page_is_published(tmp_path: Path) -> None:
    """The adversary's case: the mapping's second write moves no stat field; the scrub finds it."""
    src = tmp_path / "src"
    src.mkdir()
    f = src / "mapped.bin"
    f.write_bytes(b"\0" * mmap.PAGESIZE)
    os.utime(f, (1_700_000_000, 1_700_000_000))
    ws = Workspace.init(src, str(tmp_path / "store"))
    with open(f, "r+b") as fh, mmap.mmap(fh.fileno(), mmap.PAGESIZE) as m:
        m[0:5] = b"first"
        while True:  # until the stat cache keeps the file's row (a file written in a snapshot's tick gets none)
            ws.snapshot(progress=None)
            with ws.copy.statcache() as cache:
                if isinstance(cache.rows(1).get("mapped.bin"), tuple):
                    break
        before = stat_key(os.lstat(f))
        m[0:6] = b"second"  # the page is still dirty: no fault, no timestamp
        unseen = stat_key(os.lstat(f)) == before
        res = ws.snapshot(progress=None)
        assert res.changed != unseen, "stat saw what it could not, or missed what it saw"
        found = ws.scrub(budget=1 << 20)
        assert found.mismatched == (["mapped.bin"] if unseen else [])
        ws.snapshot(progress=None)
    _same_elsewhere(ws, src, tmp_path / "dest")
