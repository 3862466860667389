"""Small files read and hashed in a second process (snapshot), checked there (verify), or
written there (restore).

A large snapshot's cost is Python's, per file: listing, reading, hashing, recording. In one
process, threads take turns with one interpreter lock, so a cold snapshot of a million
small files used one core of two. The walk hands batches of small files to a process of
this module (spawned, so nothing of the parent's threads or locks is inherited), which
returns each file's hash and bytes. In a first snapshot these processes (one per core) also
list the folders ahead of the walk, read their small files and write each one's tree entry
and stat cache row (:func:`list_and_pack`); the snapshot's process joins the folders' bytes
into packs, fills in the pack refs and writes the trees.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat as statmod
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

from jupyter_portable.core.tree_object import entry_text, packed_text
from jupyter_portable.engine.fetch import Placer, process_umask, restored_mode
from jupyter_portable.engine.listing import Lister, Plain, PlainFile
from jupyter_portable.engine.process_lifetime import die_with
from jupyter_portable.store.repo import digest, hash_file
from jupyter_portable.workdir.statcache import Row, changed, file_row, settled, stat_key

_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)

Check = tuple[str, int, str, int]  # (path under the root, size, hash, mode) of a regular file
Item = tuple[str, int, int, int, int]  # (path under the root, size, mtime_ns, ctime_ns, inode) as listed
Quick = tuple[bytes, list[tuple[str, str]]] | None  # Lister.quick of one folder


log = logging.getLogger("jupyter_portable.engine")
_told_broken = False


class HelperPool(ProcessPoolExecutor):
    """The helpers' pool. Its callers go on in this process when a helper fails (the work is
    the same, slower); the pool says so on the log once per process as it shuts down, with the
    usual cause: a script that calls this package at its top level, with no ``__main__`` guard,
    which each spawned helper runs again as it starts."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        global _told_broken
        broken = getattr(self, "_broken", False)  # the executor's reason, once a process failed
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if broken and not _told_broken:
            _told_broken = True
            log.warning("helper processes stopped (%s); the rest of the work ran in this process, more slowly. A "
                        "script that calls jupyter_portable should do so under `if __name__ == \"__main__\":`, "
                        "since each helper starts by importing the script", str(broken)[:200])


def helper_pool(most: int = 3, spare_one: bool = True) -> ProcessPoolExecutor | None:
    """Spawned processes (one fewer than the cores, or as many as the cores when this one
    only hands out the work: ``spare_one=False``; at most ``most``) that end with this one;
    None where there is one core or no process can be started (the caller's threads then
    do the work)."""
    cores = os.cpu_count() or 1
    if cores < 2:
        return None
    try:
        # Each helper ends when this process ends. Linux's parent-death signal is not used: it
        # follows the *thread* that started the process, and a pool starts its processes in
        # whichever thread submits first (a restore's writer thread, which ends before the
        # pool: the helper it killed held the pool's queue lock, and the other helper waited
        # on it for ever).
        return HelperPool(min(most, cores - 1 if spare_one else cores),
                          mp_context=multiprocessing.get_context("spawn"),
                          initializer=die_with, initargs=(os.getpid(),))
    except (OSError, ValueError, ImportError):
        return None


def read_whole(path: str, size: int) -> tuple[bytes, os.stat_result]:
    """A small file's bytes, reading one byte past ``size`` (so a file that grew is seen), and
    its fstat after the read, for the caller to compare with what its listing saw."""
    # os.open/os.read: a file object's buffer and checks cost more than reading a small file
    fd = os.open(path, _RDONLY)
    try:
        return os.read(fd, size + 1), os.fstat(fd)
    finally:
        os.close(fd)


Read = tuple[str, bytes] | None  # a small file's (hash, bytes); None: gone, or changed while read
PERMS = 0o777  # setuid, setgid and sticky bits are never recorded or restored


def _read_one(path: str, size: int, mtime_ns: int, ctime_ns: int, ino: int) -> Read:
    try:
        data, st = read_whole(path, size)
    except FileNotFoundError:
        return None
    # statcache.changed: a same-size rewrite that puts the mtime back still moves the ctime
    if len(data) != size or changed((size, mtime_ns, ctime_ns, ino), st):
        return None
    return digest(data), data


def read_small(root: str, items: list[Item]) -> list[Read]:
    """Each file's ``(hash, bytes)``, or None when it is gone or no longer what the listing saw
    (another size, mtime, ctime or inode: changed while read). Any other error is raised, as
    in the walk."""
    return [_read_one(os.path.join(root, rel), *key) for rel, *key in items]


class Fragment(NamedTuple):
    """A folder's small files as a helper read them for a first snapshot: their bytes, each
    blob once, ready to join a pack; each file's tree entry written around its pack ref; and
    its stat cache row. What the walk is left to do is a few joins a folder."""

    body: bytes
    blobs: list[tuple[str, int, int]]  # (hash, offset in body, length), in body order
    files: list[PlainFile]  # each file read, as the listing saw it
    blob_of: list[int | None]  # its blob's index (-1: empty, no blob; None: changed while read)
    texts: list[tuple[str, str, int, str]]  # (name, head, blob index or -1: head is the whole entry, tail)
    rows: list[Row]  # stat cache rows of the files published (a racy one's is unknown)
    sound: bool  # every row known: the listing's signature may be kept


def list_and_pack(root: str, salt: bytes, rel: str, most: int, small_max: int,
                  budget: int, fresh_ns: int) -> tuple[Plain, Fragment] | None:
    """:meth:`Lister.plain` of one folder, less the files below ``small_max`` bytes that this
    read and hashed (as :func:`read_small`) until ``budget`` bytes were read: those come as a
    :class:`Fragment`. None where the walk must list the folder itself (not plain, other
    ignore rules than the walk's ``salt``). A file this could not read for another reason is
    left in the listing: the walk reads it itself, and raises what it meets. A file modified
    at ``fresh_ns`` or later is published with an unknown row (it is read again next time)."""
    lister = _lister(root, salt)
    if lister is None:
        return None
    folder = os.path.join(root, rel) if rel else root
    got = lister.plain(rel, folder, most)
    if got is None:
        return None
    listed, dirs, sig = got
    rest: list[PlainFile] = []
    files: list[PlainFile] = []
    blob_of: list[int | None] = []
    texts: list[tuple[str, str, int, str]] = []
    rows: list[Row] = []
    parts: list[bytes] = []
    blobs: list[tuple[str, int, int]] = []
    index: dict[str, int] = {}
    at = 0
    sound = True
    for t in listed:
        name, mode, size, mtime_ns, ctime_ns, ino = t
        if size >= small_max or budget <= 0:
            rest.append(t)
            continue
        try:
            read = _read_one(os.path.join(folder, name), size, mtime_ns, ctime_ns, ino)
        except OSError:
            rest.append(t)
            continue
        budget -= size
        files.append(t)
        if read is None:
            blob_of.append(None)
            continue
        h, data = read
        mode &= PERMS
        if data:
            i = index.get(h)
            if i is None:
                i = index[h] = len(blobs)
                blobs.append((h, at, size))
                parts.append(data)
                at += size
            head, tail = packed_text(name, h, mode, mtime_ns, size)
            texts.append((name, head, i, tail))
        else:
            i = -1
            texts.append((name, entry_text({"name": name, "type": "file", "size": 0, "mode": mode, "hash": h,
                                            "mtime_ns": mtime_ns, "parts": []}), -1, ""))
        blob_of.append(i)
        key = settled((size, mtime_ns, ctime_ns, ino), fresh_ns)
        sound = sound and key is not None
        rows.append(file_row(name, key))
    return (rest, dirs, sig), Fragment(b"".join(parts), blobs, files, blob_of, texts, rows, sound)


_UMASK: list[int | None] = []


def _umask() -> int | None:
    if not _UMASK:
        _UMASK.append(process_umask())
    return _UMASK[0]


def check_file(full: str, st: os.stat_result, size: int, h: str, mode: int) -> str | None:
    """Why the regular file at ``full`` (lstat ``st``) is not the version's, or None."""
    if not statmod.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size != size:
        return f"size {st.st_size} differs from {size}"
    try:
        if hash_file(full, size) != h:
            return "content differs (hash mismatch)"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    # the stored mode, or what a restore made of it under this process's umask
    if st.st_mode & 0o777 not in (mode & 0o777, restored_mode(mode, _umask())):
        return f"mode {oct(st.st_mode & 0o777)} differs from {oct(mode & 0o777)}"
    return None


def check_files(root: str, items: list[Check]) -> list[str | None]:
    """:func:`check_file` of each regular file of a version, looked up under ``root``."""
    out: list[str | None] = []
    for rel, size, h, mode in items:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            out.append("missing")
            continue
        except OSError as exc:
            out.append(f"unreadable: {exc.strerror}")
            continue
        out.append(check_file(full, st, size, h, mode))
    return out


_listers: dict[str, Lister] = {}


def quick_folders(root: str, salt: bytes, folders: list[str]) -> list[Quick] | None:
    """:meth:`Lister.quick` of each folder (a path under ``root``), or None when this
    process reads other ignore rules than the walk's (``salt``): they changed meanwhile."""
    lister = _lister(root, salt)
    if lister is None:
        return None
    return [lister.quick(rel, os.path.join(root, rel) if rel else root) for rel in folders]


def _lister(root: str, salt: bytes) -> Lister | None:
    """This process's lister of ``root``; None when its ignore rules are not the walk's."""
    lister = _listers.get(root)
    if lister is None or lister.salt != salt:
        lister = _listers[root] = Lister(Path(root), warn=False)
        if lister.salt != salt:
            return None
    return lister


Place = tuple[str, int, int, str, int, int]  # (path, offset in the bytes sent, size, hash, mode, mtime_ns)
StatKey = tuple[int, int, int, int]  # stat_key of a file placed

_placers: dict[str, Placer] = {}


def place_files(root: str, body: bytes, items: list[Place]) -> list[StatKey]:
    """Files of one range of a pack (``body``), each hashed and then written under ``root``
    as :meth:`Placer.place` does (refusing every way out of ``root``); each one's stat key.
    A helper keeps one placer per root: the folders it checked stay checked."""
    placer = _placers.get(root)
    if placer is None:
        placer = _placers[root] = Placer(Path(root))
    view = memoryview(body)
    out: list[StatKey] = []
    for path, at, size, h, mode, mtime_ns in items:
        out.append(stat_key(placer.place(path, size, h, mode, mtime_ns, view[at:at + size])))
    return out
