"""Store backends: the few byte-level operations the store format needs.

A backend maps slash-separated keys (``objects/ab/ab12...``) to bytes under one root.
The docstrings of :class:`Backend` are the contract; ``tests/test_backends.py`` runs
the same suite against every backend.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import blake3

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import ConflictError, ObjectMissing, StoreError
from jupyter_portable.workdir.files import file_lock


class Backend:
    """Byte storage under a root. Every method raises only :mod:`jupyter_portable.core.errors`."""

    url: str

    def read(self, key: str) -> bytes:
        """The whole object; :class:`ObjectMissing` if there is none."""
        raise NotImplementedError

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object; :class:`ObjectMissing` if there is none."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        """Whether a complete object is stored under ``key``."""
        raise NotImplementedError

    def size(self, key: str) -> int:
        """The object's size in bytes; :class:`ObjectMissing` if there is none."""
        raise NotImplementedError

    def write(self, key: str, data: bytes) -> None:
        """Store an immutable object. Readers see all of it or nothing; rewriting the
        same key with the same bytes is harmless. Durable when this returns."""
        raise NotImplementedError

    def write_batch(self, items: list[tuple[str, bytes]]) -> None:
        """:meth:`write` of each ``(key, data)``; every one durable when this returns. A
        backend may make them durable together (fewer round trips, fewer syncs), but never
        lets a key name bytes that are not durable yet."""
        for key, data in items:
            self.write(key, data)

    def write_blob(self, key: str, data: bytes) -> None:
        """Store a content-addressed object (its key names the hash of its bytes) as
        :meth:`write` does, except that an object already under the key may be left as it is:
        it holds the same bytes, and every reader hashes what it reads. A service that can
        refuse to replace an object is asked to (on S3 a worker's credentials allow nothing
        else on shared keys: ``docs/security.md`` 3.6); elsewhere this is :meth:`write`."""
        self.write(key, data)

    def write_blobs(self, items: list[tuple[str, bytes]]) -> None:
        """:meth:`write_blob` of each ``(key, data)``, durable together as :meth:`write_batch` is."""
        self.write_batch(items)

    def write_part(self, key: str, data: bytes, hold: Callable[[], None] | None = None) -> None:
        """:meth:`write_blob` of an object its writer reads back and hashes against its name at
        once (a checkpoint's part): a backend may leave out its service's own checksum of the
        body, which that read-back makes redundant. ``hold`` is called between pieces of the
        body as it is sent, where the service's client sends it in pieces (S3): it may wait
        there, so that a request already on its way stops taking the CPU, the network and
        the service while the trainer saves. Elsewhere this is :meth:`write_blob`."""
        self.write_blob(key, data)

    def read_pieces(self, key: str, hold: Callable[[], None] | None = None) -> Iterator[bytes]:
        """The object's bytes in pieces as they arrive (for a reader that hashes as it reads),
        ``hold`` called before each piece (it may wait, as in :meth:`write_part`). Elsewhere
        the whole object is one piece."""
        if hold is not None:
            hold()
        yield self.read(key)

    def write_new(self, key: str, data: bytes) -> None:
        """Like :meth:`write` but atomic create-only: :class:`ConflictError` if the key holds
        other bytes. The same bytes already there count as written (a retried request)."""
        raise NotImplementedError

    def durability_warnings(self) -> list[str]:
        """What the service's own settings leave unprotected: one line per risk, naming it and
        what to do (``init`` shows them); [] when there is none, or none this backend can see."""
        return []

    def list(self, prefix: str) -> list[str]:
        """Every complete object key under ``prefix`` (a folder, ending without '/'), sorted."""
        raise NotImplementedError

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object and an opaque version token for :meth:`swap`, or None if absent."""
        raise NotImplementedError

    def swap(self, key: str, data: bytes, token: str | None) -> None:
        """Compare-and-swap: replace the object only if its version token is still
        ``token`` (``None``: only if the key does not exist). :class:`ConflictError`
        otherwise, unless the key already holds exactly ``data`` (a retried request whose
        first try landed). Durable when this returns."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove an object if present (used only by tests and garbage collection)."""
        raise NotImplementedError

    def copy_to(self, key: str, fd: int, offset: int) -> int:
        """Write the whole object into open file ``fd`` at ``offset``; returns its size.
        Unverified: the caller hashes what it wrote before using it."""
        data = self.read(key)
        view = memoryview(data)
        pos = offset
        while view:
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
        return len(data)


class LocalBackend(Backend):
    """A folder on a local filesystem.

    Objects are written to a unique temp file in the target folder, fsynced, then
    linked into place (link fails if the name exists: an atomic create-only) and the
    folder fsynced. The head's compare-and-swap holds an ``flock`` on ``<key>.lock``,
    compares, writes a temp file, fsyncs and renames over the old one.

    Every file is written 0600 (a workspace's files may be private: an object must not be readable
    by more people than its source was), or 0660 where the store's folder is a team's (group-writable
    or setgid), for its group: never readable by others (:meth:`file_mode`).
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = "file://" + self.root
        self._made: set[str] = set()
        self._file_mode: int | None = None

    def file_mode(self) -> int:
        """The mode new files are created with: 0660 in a team's folder, else 0600."""
        if self._file_mode is None:
            try:
                folder = os.stat(self.root).st_mode
            except OSError:
                folder = 0
            self._file_mode = 0o660 if folder & (stat.S_IWGRP | stat.S_ISGID) else 0o600
        return self._file_mode

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _mkdirs(self, folder: str) -> None:
        if folder not in self._made:
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {folder}: {exc.strerror}") from exc
            self._made.add(folder)

    def read(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError as exc:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key) from exc
        except OSError as exc:
            raise StoreError(f"cannot read {key} from {self.url}: {exc.strerror}") from exc

    def read_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(start)
                return fh.read(end - start)
        except FileNotFoundError as exc:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key) from exc
        except OSError as exc:
            raise StoreError(f"cannot read {key} from {self.url}: {exc.strerror}") from exc

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def copy_to(self, key: str, fd: int, offset: int) -> int:
        # In-kernel copy: on this kind of machine several times faster than read + write.
        try:
            src = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key) from exc
        try:
            size = os.fstat(src).st_size
            done = 0
            while done < size:
                try:
                    n = os.copy_file_range(src, fd, size - done, done, offset + done)
                except OSError:
                    return super().copy_to(key, fd, offset)  # e.g. across filesystems on old kernels
                if n == 0:
                    break
                done += n
            return done
        finally:
            os.close(src)

    def size(self, key: str) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError as exc:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key) from exc

    def _write_temp(self, final: str, data: bytes) -> str:
        """A temp file beside ``final`` holding ``data``, fsynced and closed."""
        tmp, fd = self._stage(final, data, halves=True)
        try:
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        hooks.step(f"fsynced {final}")
        return tmp

    def _fsync_dir(self, folder: str) -> None:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_batch(self, items: list[tuple[str, bytes]]) -> None:
        # Every temp is written, then all are fsynced at once (the filesystem commits them
        # together), then each takes its name, then the folders are fsynced: an object is
        # durable before its name appears, with two rounds of syncs for the whole batch.
        staged: list[tuple[str, str]] = []  # (temp, final) not renamed yet
        fds: list[int] = []
        try:
            try:
                for key, data in items:
                    final = self._path(key)
                    tmp, fd = self._stage(final, data)
                    staged.append((tmp, final))
                    fds.append(fd)
                with ThreadPoolExecutor(min(16, len(fds) or 1), thread_name_prefix="portable-fsync") as pool:
                    list(pool.map(os.fsync, fds))
                    for _tmp, final in staged:
                        hooks.step(f"fsynced {final}")
                    while fds:
                        os.close(fds.pop())
                    while staged:
                        tmp, final = staged[0]
                        os.replace(tmp, final)
                        staged.pop(0)
                        hooks.step(f"renamed {final}")
                    folders = sorted({os.path.dirname(self._path(key)) for key, _d in items})
                    list(pool.map(self._fsync_dir, folders))
            finally:
                for fd in fds:
                    os.close(fd)
                for tmp, _final in staged:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        except OSError as exc:
            raise StoreError(f"cannot write {len(items)} objects to {self.url}: {exc.strerror}") from exc

    def _stage(self, final: str, data: bytes, *, halves: bool = False) -> tuple[str, int]:
        """A temp file beside ``final`` holding ``data``, not yet fsynced, and its open fd
        (``halves``: written in two halves, with a crash point between them)."""
        folder = os.path.dirname(final)
        self._mkdirs(folder)
        tmp = os.path.join(folder, f".tmp-{secrets.token_hex(8)}")
        hooks.step(f"temp {final}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode())
        try:
            view = memoryview(data)
            if halves:
                _write_all(fd, view[:len(data) // 2])
                hooks.step(f"half-written {final}")
                view = view[len(data) // 2:]
            _write_all(fd, view)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return tmp, fd

    def write(self, key: str, data: bytes) -> None:
        final = self._path(key)
        try:
            tmp = self._write_temp(final, data)
            os.replace(tmp, final)
            hooks.step(f"renamed {final}")
            self._fsync_dir(os.path.dirname(final))
        except OSError as exc:
            raise StoreError(f"cannot write {key} to {self.url}: {exc.strerror}") from exc

    def write_new(self, key: str, data: bytes) -> None:
        final = self._path(key)
        try:
            tmp = self._write_temp(final, data)
            try:
                os.link(tmp, final)
            except FileExistsError as exc:
                if self._holds(key, data):
                    return
                raise ConflictError(f"{key} already exists in {self.url}", key=key) from exc
            finally:
                os.unlink(tmp)
            hooks.step(f"linked {final}")
            self._fsync_dir(os.path.dirname(final))
        except OSError as exc:
            raise StoreError(f"cannot write {key} to {self.url}: {exc.strerror}") from exc

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.read(key) == data
        except ObjectMissing:
            return False

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix)
        out: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(base):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in filenames:
                if not name.startswith(".tmp-") and not name.endswith(".lock"):
                    out.append(f"{rel}/{name}")
        out.sort()
        return out

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self.read(key)
        except ObjectMissing:
            return None
        return data, blake3.blake3(data).hexdigest()

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        path = self._path(key) + ".lock"
        self._mkdirs(os.path.dirname(path))
        with file_lock(Path(path), mode=0o644):  # released by the kernel if we die; a team may share the store
            yield

    def swap(self, key: str, data: bytes, token: str | None) -> None:
        final = self._path(key)
        try:
            with self._locked(key):
                current = self.read_versioned(key)
                now = None if current is None else current[1]
                if now != token:
                    if current is not None and current[0] == data:
                        return
                    raise ConflictError(f"{key} changed under us in {self.url}", key=key)
                tmp = self._write_temp(final, data)
                os.replace(tmp, final)
                hooks.step(f"swapped {final}")
                self._fsync_dir(os.path.dirname(final))
        except OSError as exc:
            raise StoreError(f"cannot update {key} in {self.url}: {exc.strerror}") from exc

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise StoreError(f"cannot delete {key}: {exc.strerror}") from exc


def _write_all(fd: int, view: memoryview) -> None:
    """Write all of ``view`` (a write may take fewer bytes than it was given)."""
    while view:
        view = view[os.write(fd, view):]
