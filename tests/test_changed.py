"""``statcache.changed`` is the snapshot's one answer to "did this file change?", and
``statcache.settled`` keeps no row for a file written in the snapshot's clock tick."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_portable.workdir.statcache import changed, settled, stat_key


def test_a_row_sees_every_change_of_size_mtime_ctime_or_inode(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    row = stat_key(os.lstat(f))
    assert not changed(row, os.lstat(f))
    os.chmod(f, 0o600)  # the ctime moves, nothing else
    assert changed(row, os.lstat(f))
    row = stat_key(os.lstat(f))
    st = os.lstat(f)
    f.unlink()
    (tmp_path / "b.txt").write_text("other")
    os.replace(tmp_path / "b.txt", f)  # another inode under the same name
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert changed(row, os.lstat(f))
    assert changed(None, os.lstat(f)), "an unknown row has always changed"
    assert changed("target", os.lstat(f)), "a symlink's row is never a file's"


def test_a_file_read_is_compared_by_size_mtime_ctime_and_inode(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    st = os.lstat(f)
    seen = stat_key(st)
    with open(f, "rb") as fh:
        assert not changed(seen, os.fstat(fh.fileno()))
    f.write_text("hello, longer")
    with open(f, "rb") as fh:
        assert changed(seen, os.fstat(fh.fileno()))
    seen = stat_key(os.lstat(f))
    before = os.lstat(f).st_ctime_ns
    with open(f, "r+b") as fh:  # the same size, the mtime put back: only the ctime tells
        while os.fstat(fh.fileno()).st_ctime_ns == before:  # a ctime tick may be coarse: wait for it to move
            fh.seek(0)
            fh.write(b"HELLO, LONGER")
            fh.flush()
            os.utime(f, ns=(st.st_atime_ns, seen[1]))
        after = os.fstat(fh.fileno())
    assert (after.st_size, after.st_mtime_ns) == seen[:2]
    assert changed(seen, after), "a same-size rewrite with its mtime put back passed as unchanged"


def test_a_symlink_changed_when_its_target_did() -> None:
    assert not changed("x/y", "x/y")
    assert changed("x/y", "x/z")
    assert changed(None, "x/y")


def test_a_file_written_in_the_snapshots_clock_tick_keeps_no_row() -> None:
    key = (5, 1_000, 1_000, 7)
    assert settled(key, 1_001) == key
    assert settled(key, 1_000) is None and settled(key, 999) is None
    assert settled("target", 0) == "target" and settled(None, 0) is None
