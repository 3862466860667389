"""Placing verified bytes on disk: the unnamed-file path (O_TMPFILE, linked into place) and
the temp-name path it falls back to behave alike, on the real filesystem."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from jupyter_portable.core.errors import IntegrityError, UsageError
from jupyter_portable.core.manifest import FileEntry, PackRef
from jupyter_portable.engine.fetch import Placer
from jupyter_portable.store.repo import digest

MTIME = 1_700_000_000_123_456_789


def _entry(path: str, data: bytes, mode: int = 0o640) -> FileEntry:
    return FileEntry(path, len(data), mode, digest(data), MTIME, PackRef("a" * 64, 0, len(data)))


@pytest.fixture(params=["unnamed", "temp name"])
def placer(request: pytest.FixtureRequest, tmp_path: Path) -> Placer:
    p = Placer(tmp_path)
    if request.param == "temp name":
        p._proc_fd = None  # what a kernel or filesystem without O_TMPFILE gets
    elif p._proc_fd is None:
        pytest.skip("this filesystem has no O_TMPFILE")
    return p


def _leftovers(root: Path) -> list[str]:
    tmp = root / ".portable" / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def test_a_new_file_gets_its_bytes_mode_and_mtime_and_nothing_else_is_left(placer: Placer, tmp_path: Path) -> None:
    data = b"hello\n" * 100
    placer.write_verified(_entry("a/b/c.txt", data), data)
    placer.write_verified(_entry("a/empty", b""), b"")
    target = tmp_path / "a" / "b" / "c.txt"
    assert target.read_bytes() == data
    st = target.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns == MTIME and st.st_nlink == 1
    assert (tmp_path / "a" / "empty").read_bytes() == b""
    assert sorted(os.listdir(tmp_path / "a")) == ["b", "empty"]
    assert _leftovers(tmp_path) == []


def test_an_existing_file_is_replaced_whole(placer: Placer, tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_bytes(b"old and longer than the new one")
    placer.write_verified(_entry("x.txt", b"new", 0o600), b"new")
    assert (tmp_path / "x.txt").read_bytes() == b"new"
    assert stat.S_IMODE((tmp_path / "x.txt").stat().st_mode) == 0o600
    assert _leftovers(tmp_path) == []


def test_a_symlink_at_the_name_is_replaced_and_its_target_is_untouched(placer: Placer, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_bytes(b"keep me")
    (tmp_path / "link").symlink_to(outside)
    placer.write_verified(_entry("link", b"mine"), b"mine")
    assert not (tmp_path / "link").is_symlink()
    assert (tmp_path / "link").read_bytes() == b"mine"
    assert outside.read_bytes() == b"keep me"


def test_a_folder_at_the_name_is_a_clear_error_and_stays(placer: Placer, tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_bytes(b"x")
    with pytest.raises(UsageError, match="is a folder"):
        placer.write_verified(_entry("d", b"file"), b"file")
    assert (tmp_path / "d" / "inside").read_bytes() == b"x"
    assert _leftovers(tmp_path) == []


def test_bytes_that_do_not_match_the_hash_write_nothing(placer: Placer, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError):
        placer.write_verified(_entry("f.txt", b"good"), b"evil")
    assert not (tmp_path / "f.txt").exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("mode", [0o666, 0o777, 0o755, 0o600, 0o400, 0o000])
def test_every_mode_is_exact_but_what_the_umask_takes_away(placer: Placer, tmp_path: Path, mode: int) -> None:
    # a store is writable by workers: a stored 0777 never makes a world-writable file (issue 28)
    old = os.umask(0o022)
    try:
        placer._umask = 0o022
        placer.write_verified(_entry(f"m{mode:o}", b"bytes", mode), b"bytes")
    finally:
        os.umask(old)
    st = (tmp_path / f"m{mode:o}").stat()
    assert stat.S_IMODE(st.st_mode) == mode & ~0o022 and st.st_mtime_ns == MTIME


def test_an_unknown_umask_takes_away_what_022_would(placer: Placer, tmp_path: Path) -> None:
    placer._umask = None  # no /proc/self/status: the mode is always set after the write
    placer.write_verified(_entry("u.txt", b"u", 0o666), b"u")
    placer.write_verified(_entry("x.sh", b"x", 0o750), b"x")
    assert stat.S_IMODE((tmp_path / "u.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "x.sh").stat().st_mode) == 0o750


def test_unnamed_files_on_another_filesystem_than_the_workspace_are_made_in_place(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    p = Placer(tmp_path)
    if p._proc_fd is None or not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs O_TMPFILE here and a /dev/shm on another filesystem")
    other = shm / f"placer-{os.getpid()}"
    other.mkdir()
    try:
        p._unnamed_in = str(other)  # what a .portable mounted from elsewhere gives: linkat says EXDEV
        data = b"across"
        p.write_verified(_entry("a/x.bin", data), data)
        p.write_verified(_entry("a/y.bin", data), data)
        assert (tmp_path / "a" / "x.bin").read_bytes() == data and (tmp_path / "a" / "y.bin").read_bytes() == data
        assert p._unnamed_in is None and os.listdir(other) == []
    finally:
        other.rmdir()
