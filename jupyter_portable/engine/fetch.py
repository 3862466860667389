"""Bytes from the store into a directory: every file hashed before it is renamed into place
(invariant 4) and nothing written outside the destination (invariant 8)."""

from __future__ import annotations

import errno
import itertools
import os
import secrets
import stat as statmod
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jupyter_portable.core.errors import IntegrityError, UnsafePath, UsageError
from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.engine.progress import Progress
from jupyter_portable.store.repo import Store, digest, hash_file, object_key
from jupyter_portable.workdir.workcopy import WorkspaceCopy

_TMPFILE = getattr(os, "O_TMPFILE", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_PATH = getattr(os, "O_PATH", 0)


def process_umask() -> int | None:
    """This process's umask as Linux reports it, without setting it (os.umask would, for a
    moment, for every thread); None where it cannot be read."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def restored_mode(mode: int, umask: int | None) -> int:
    """The mode a restore gives a file stored with ``mode``: its permission bits less what the
    umask takes away (022 where the umask cannot be read), as ``tar`` does for a user. A store
    is writable by workers, so a stored 0777 never makes a world-writable file here."""
    return mode & 0o777 & ~(0o022 if umask is None else umask)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Placer:
    """Writes verified bytes into one destination root, refusing every way out of it, and every
    path that ``refuse`` (the inbound gate's rules, engine/gate.py) gives a reason for."""

    def __init__(self, root: Path, refuse: Callable[[str], str | None] | None = None) -> None:
        self.root = root
        self.refuse = refuse
        self.real_root = os.path.realpath(root)
        self.tmp = WorkspaceCopy(root).tmp_dir
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._dirs_ok: set[str] = {""}
        # One random prefix per restore, then a counter (O_EXCL still refuses a name taken).
        self._temp_prefix = os.path.join(self.tmp, f"restore-{secrets.token_hex(8)}-")
        self._temp_n = itertools.count()
        # Small files are written unnamed and linked into place through /proc/self/fd. They are
        # made in .portable/tmp, not in their own folders: the filesystem then gives their inodes
        # neighbouring places (ext4 places a file's inode near its folder's, and a restore makes
        # thousands of new folders), which took 2.5x less kernel time a file on this machine's ext4.
        self._unnamed_in: str | None = str(self.tmp)  # None: in each file's own folder
        self._umask = process_umask()
        self._proc_fd: int | None = None
        if _TMPFILE:
            try:
                self._proc_fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
                weakref.finalize(self, os.close, self._proc_fd)
            except OSError:
                self._proc_fd = None

    def _ensure_dirs(self, rel_dir: str) -> None:
        """Make ``rel_dir`` and every folder above it that is not checked yet, top down (a loop:
        folders nest up to MAX_DEPTH levels)."""
        todo: list[str] = []
        while rel_dir not in self._dirs_ok:
            todo.append(rel_dir)
            rel_dir = rel_dir.rpartition("/")[0]
        for folder in reversed(todo):
            self._ensure_dir(folder)

    def _ensure_dir(self, rel_dir: str) -> None:
        """Make one folder whose parent is checked, and check it: a real folder, inside the root."""
        full = os.path.join(self.root, rel_dir)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            try:
                os.mkdir(full)
            except FileExistsError:
                pass
            st = os.lstat(full)
        if statmod.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{rel_dir!r} in {self.root} is a symlink; restoring through it could "
                             "write outside the workspace", hint="remove the symlink, or restore elsewhere")
        if not statmod.S_ISDIR(st.st_mode):
            raise UsageError(f"{rel_dir!r} in {self.root} is a file, but the version has a folder there",
                             hint="move it away, or restore into an empty directory")
        # Each folder is resolved for real once; its parents were checked before it.
        real = self._resolved(full)
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            raise UnsafePath(f"{rel_dir!r} resolves outside {self.root}")
        self._dirs_ok.add(rel_dir)

    def _resolved(self, full: str) -> str:
        """``os.path.realpath(full)``, from the kernel where Linux's /proc tells it: Python's walks the
        path a folder at a time in Python, and a folder 1,024 levels down took 17 s to restore."""
        if _O_PATH and self._proc_fd is not None:
            try:
                fd = os.open(full, _O_PATH | os.O_DIRECTORY | _CLOEXEC)
            except OSError:
                return os.path.realpath(full)
            try:
                return os.readlink(str(fd), dir_fd=self._proc_fd)
            except OSError:
                return os.path.realpath(full)
            finally:
                os.close(fd)
        return os.path.realpath(full)

    def target(self, rel: str) -> str:
        check_relpath(rel)
        why = self.refuse(rel) if self.refuse is not None else None
        if why is not None:
            raise UnsafePath(f"{rel}: not written: {why}")
        self._ensure_dirs(rel.rpartition("/")[0])
        return os.path.join(self.root, rel)

    def temp_path(self) -> str:
        return f"{self._temp_prefix}{next(self._temp_n)}"

    def commit(self, tmp: str, entry: FileEntry, fd: int | None = None) -> None:
        """Rename a verified temp file into place with the entry's mode and mtime."""
        self._commit(tmp, self.target(entry.path), entry.path, entry.mode, entry.mtime_ns, fd)

    def mode_for(self, mode: int) -> int:
        """The mode a file stored with ``mode`` gets here (:func:`restored_mode`)."""
        return restored_mode(mode, self._umask)

    def _commit(self, tmp: str, full: str, path: str, mode: int, mtime_ns: int, fd: int | None = None) -> None:
        if fd is not None:
            os.fchmod(fd, self.mode_for(mode))
            os.utime(fd, ns=(mtime_ns, mtime_ns))
        else:
            os.chmod(tmp, self.mode_for(mode))
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
        try:
            os.replace(tmp, full)
        except (IsADirectoryError, OSError) as exc:
            os.unlink(tmp)
            if os.path.isdir(full) and not os.path.islink(full):
                raise UsageError(f"{path!r} in {self.root} is a folder, but the version has a file there") \
                    from exc
            raise

    def write_verified(self, entry: FileEntry, data: bytes | memoryview) -> os.stat_result:
        """Write ``entry``'s bytes ``data`` to its place once they hash to its hash; its stat."""
        return self.place(entry.path, entry.size, entry.hash, entry.mode, entry.mtime_ns, data)

    def place(self, path: str, size: int, h: str, mode: int, mtime_ns: int,
              data: bytes | memoryview) -> os.stat_result:
        """:meth:`write_verified` of a file given by its fields (what a helper process gets);
        the stat of the file placed, taken once it has its name."""
        if len(data) != size or digest(data) != h:
            raise IntegrityError(f"{path}: the bytes from the store do not match its hash; "
                                 "nothing was written", hint="run `jupyter portable fsck --read-data`")
        full = self.target(path)
        mode = self.mode_for(mode)
        # the mode at creation when the umask is known (it then leaves the mode whole: no fchmod), else set after
        as_made = self._umask is not None
        fd = self._open_unnamed(self._unnamed_in or os.path.dirname(full), mode if as_made else 0o600)
        if fd is not None:
            try:
                _write_all(fd, data)
                if not as_made:
                    os.fchmod(fd, mode)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
                try:
                    # the written inode takes its name in one step: no temp name, and no rename
                    # across folders (those take a lock of the whole filesystem, one at a time)
                    os.link(str(fd), full, src_dir_fd=self._proc_fd, follow_symlinks=True)
                    return os.fstat(fd)  # after the link, which changed its ctime
                except FileExistsError:
                    tmp = self.temp_path()  # something is there: replace it the usual way
                    os.link(str(fd), tmp, src_dir_fd=self._proc_fd, follow_symlinks=True)
                except OSError as exc:
                    if exc.errno != errno.EXDEV or self._unnamed_in is None:
                        raise
                    # .portable/tmp is on another filesystem (a mount): make them in place from now on
                    self._unnamed_in = None
                    os.close(fd)
                    fd = -1
                    return self.place(path, size, h, mode, mtime_ns, data)
                self._commit(tmp, full, path, mode, mtime_ns)
                return os.fstat(fd)
            finally:
                if fd >= 0:
                    os.close(fd)
        tmp = self.temp_path()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
            self._commit(tmp, full, path, mode, mtime_ns, fd)
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _open_unnamed(self, folder: str, mode: int = 0o600) -> int | None:
        """A new file without a name on ``folder``'s filesystem (Linux's O_TMPFILE), or None
        where the kernel, the filesystem or a missing /proc cannot make or name one."""
        if self._proc_fd is None:
            return None
        try:
            return os.open(folder, os.O_WRONLY | _TMPFILE | _CLOEXEC, mode)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                self._proc_fd = None  # not here: temp names from now on
                return None
            raise

    def link(self, entry: FileEntry) -> None:
        full = self.target(entry.path)
        assert entry.target is not None
        if os.path.lexists(full):
            if os.path.isdir(full) and not os.path.islink(full):
                raise UsageError(f"{entry.path!r} in {self.root} is a folder, but the version has a symlink")
            os.unlink(full)
        os.symlink(entry.target, full)

    def check_links(self, links: list[FileEntry]) -> None:
        """Once every link exists, resolve each for real: links that are each lexically
        inside can still lead outside together. Any escape removes them all."""
        for entry in links:
            real = os.path.realpath(os.path.join(self.root, entry.path))
            if real != self.real_root and not real.startswith(self.real_root + os.sep):
                for other in links:
                    try:
                        os.unlink(os.path.join(self.root, other.path))
                    except FileNotFoundError:
                        pass
                raise UnsafePath(f"symlink {entry.path!r} -> {entry.target!r} resolves outside {self.root}; "
                                 "no symlink was restored")


def already_there(root: Path, entry: FileEntry) -> bool:
    """Whether the destination already holds exactly this file's bytes."""
    full = os.path.join(root, entry.path)
    try:
        st = os.lstat(full)
    except OSError:
        return False
    if not statmod.S_ISREG(st.st_mode) or st.st_size != entry.size:
        return False
    return hash_file(full, entry.size) == entry.hash


def fetch_large(store: Store, placer: Placer, entry: FileEntry, progress: Progress | None = None,
                workers: int = 4) -> int:
    """Fetch a file stored in parts, verify each part and the whole, then place it."""
    tmp = placer.temp_path()
    offsets, off = [], 0
    for h, n in entry.parts:
        offsets.append((h, off, n))
        off += n
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, entry.size)

        def one(part: tuple[str, int, int]) -> None:
            h, start, n = part
            # Copied unverified: the whole file is hashed below before it is renamed into place.
            got = store.backend.copy_to(object_key(h), fd, start)
            if got != n:
                raise IntegrityError(f"{entry.path}: a part has {got} bytes, expected {n}; nothing was written",
                                     hint="run `jupyter portable fsck --read-data`")
            if progress:
                progress.add(nbytes=n, uploaded=n)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, offsets))
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    if hash_file(tmp, entry.size) != entry.hash:
        bad = _corrupt_parts(tmp, offsets)
        os.unlink(tmp)
        which = f" (object {bad[0][:16]}…)" if bad else ""
        raise IntegrityError(f"{entry.path}: the bytes from the store are corrupt{which}: the file does not match "
                             "its hash; nothing was written", hint="run `jupyter portable fsck --read-data`")
    placer.commit(tmp, entry)
    return entry.size


def _corrupt_parts(path: str, offsets: list[tuple[str, int, int]]) -> list[str]:
    """Which parts of a reassembled file do not hash to their names (only read on failure)."""
    bad = []
    with open(path, "rb") as fh:
        for h, start, n in offsets:
            fh.seek(start)
            if digest(fh.read(n)) != h:
                bad.append(h)
    return bad
