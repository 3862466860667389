"""Restore: materialize a manifest version into a directory, hashing every file before
it is renamed into place (invariant 4) and writing nothing outside it (invariant 8)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat as statmod
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from jupyter_portable.core.errors import IntegrityError, ManifestError, UnsafePath, UsageError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.store.repo import Store, digest, object_key
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy, atomic_write

LAZY_THRESHOLD = 64 * 1024 * 1024


@dataclass
class RestoreResult:
    workspace_id: str
    version: int
    files: int
    bytes: int
    pending: list[str] = field(default_factory=list)
    fetched_bytes: int = 0
    removed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "pending": self.pending, "fetched_bytes": self.fetched_bytes,
                "removed": self.removed}


class Placer:
    """Writes verified bytes into one destination root, refusing every way out of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.tmp = root / ".portable" / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._dirs_ok: set[str] = {""}

    def _ensure_dirs(self, rel_dir: str) -> None:
        if rel_dir in self._dirs_ok:
            return
        parent, _, _ = rel_dir.rpartition("/")
        self._ensure_dirs(parent)
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
        real = os.path.realpath(full)
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            raise UnsafePath(f"{rel_dir!r} resolves outside {self.root}")
        self._dirs_ok.add(rel_dir)

    def target(self, rel: str) -> str:
        check_relpath(rel)
        self._ensure_dirs(rel.rpartition("/")[0])
        return os.path.join(self.root, rel)

    def temp_path(self) -> str:
        return str(self.tmp / f"restore-{secrets.token_hex(8)}")

    def commit(self, tmp: str, entry: FileEntry, fd: int | None = None) -> None:
        """Rename a verified temp file into place with the entry's mode and mtime."""
        full = self.target(entry.path)
        if fd is not None:
            os.fchmod(fd, entry.mode & 0o777)
            os.utime(fd, ns=(entry.mtime_ns, entry.mtime_ns))
        else:
            os.chmod(tmp, entry.mode & 0o777)
            os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))
        try:
            os.replace(tmp, full)
        except (IsADirectoryError, OSError) as exc:
            os.unlink(tmp)
            if os.path.isdir(full) and not os.path.islink(full):
                raise UsageError(f"{entry.path!r} in {self.root} is a folder, but the version has a file there") \
                    from exc
            raise

    def write_verified(self, entry: FileEntry, data: bytes | memoryview) -> None:
        if len(data) != entry.size or digest(data) != entry.hash:
            raise IntegrityError(f"{entry.path}: the bytes from the store do not match its hash; "
                                 "nothing was written", hint="run `jupyter portable fsck --read-data`")
        tmp = self.temp_path()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            self.commit(tmp, entry, fd)
        finally:
            os.close(fd)

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
    h = blake3.blake3()
    if entry.size:
        h.update_mmap(full)
    return h.hexdigest() == entry.hash


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
    whole = blake3.blake3()
    if entry.size:
        whole.update_mmap(tmp)
    if whole.hexdigest() != entry.hash:
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


def _fetch_packed(store: Store, placer: Placer, pack: str, entries: list[FileEntry],
                  progress: Progress) -> int:
    needed = sum(e.size for e in entries)
    pack_size = store.backend.size(f"objects/{pack[:2]}/{pack}")
    if needed * 2 >= pack_size:
        body = memoryview(store.get_object(pack, what=entries[0].path))
        for e in entries:
            assert e.pack is not None
            placer.write_verified(e, body[e.pack.offset:e.pack.offset + e.pack.length])
            progress.add(files=1, nbytes=e.size)
        fetched = len(body)
    else:
        fetched = 0
        for e in entries:
            assert e.pack is not None
            data = store.get_range(pack, e.pack.offset, e.pack.offset + e.pack.length)
            placer.write_verified(e, data)
            fetched += len(data)
            progress.add(files=1, nbytes=e.size)
    progress.add(uploaded=fetched)
    return fetched


def materialize(store: Store, manifest: Manifest, root: Path, entries: Iterable[FileEntry],
                progress: Progress) -> int:
    """Fetch ``entries`` of ``manifest`` into ``root``: small files first, then large ones."""
    placer = Placer(root)
    by_pack: dict[str, list[FileEntry]] = {}
    large: list[FileEntry] = []
    links: list[FileEntry] = []
    for e in entries:
        if e.target is not None:
            links.append(e)
        elif already_there(root, e):
            os.chmod(placer.target(e.path), e.mode & 0o777)
            os.utime(os.path.join(root, e.path), ns=(e.mtime_ns, e.mtime_ns))
            progress.add(files=1, nbytes=e.size)
        elif e.pack is not None:
            by_pack.setdefault(e.pack.pack, []).append(e)
        elif not e.parts:
            placer.write_verified(e, b"")
            progress.add(files=1)
        else:
            large.append(e)
    fetched = 0
    workers = 8 if store.url.startswith("s3") else 4
    with ThreadPoolExecutor(workers) as pool:
        packs = sorted(by_pack.items(), key=lambda kv: min(e.size for e in kv[1]))
        for n in pool.map(lambda kv: _fetch_packed(store, placer, kv[0], kv[1], progress), packs):
            fetched += n
    for e in sorted(large, key=lambda e: e.size):
        fetched += fetch_large(store, placer, e, progress, workers)
        progress.add(files=1)
    for e in links:
        placer.link(e)
        progress.add(files=1)
    placer.check_links(links)
    return fetched


def restore(store: Store, workspace_id: str, dest: Path, *, version: int | None = None,
            lazy: bool = False, lazy_threshold: int = LAZY_THRESHOLD, delete: bool = False,
            progress: Progress | None = None, start_fetcher: bool = True,
            eager: Iterable[str] = ()) -> RestoreResult:
    """Make ``dest`` a copy of ``workspace_id`` at ``version`` (default: the latest).

    With ``lazy``, files of ``lazy_threshold`` bytes or more are left to a background
    fetcher, except those at or under a path in ``eager`` (a worker's checkpoints)."""
    progress = progress or Progress("restore")
    dest = dest.resolve()
    copy = WorkspaceCopy(dest)
    if copy.exists():
        other = copy.read_config()
        if other.workspace_id != workspace_id:
            raise UsageError(f"{dest} is a copy of workspace {other.workspace_id}, not {workspace_id}",
                             hint="restore into an empty directory")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    head, _ = store.read_head(workspace_id)
    manifest = store.read_manifest(workspace_id, version)

    keep_now = tuple(eager)

    def wanted_now(path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in keep_now)

    pending = [e for e in manifest.files
               if lazy and e.target is None and e.size >= lazy_threshold and not wanted_now(e.path)
               and not already_there(dest, e)]
    pending_paths = {e.path for e in pending}
    now = [e for e in manifest.files if e.path not in pending_paths]
    progress.files_total = len(now)
    progress.bytes_total = sum(e.size for e in now)
    progress.set_stage("fetching")
    fetched = materialize(store, manifest, dest, now, progress)

    removed: list[str] = []
    if delete:
        from jupyter_portable.engine.scan import walk

        keep = {e.path for e in manifest.files}
        for f in walk(dest, warn=False):
            if f.path not in keep:
                os.unlink(os.path.join(dest, f.path))
                removed.append(f.path)

    copy.write_config(CopyConfig(workspace_id, store.url, manifest.version, head.epoch))
    stats: dict[str, Any] = {}
    for e in now:
        if e.target is None:
            st = os.stat(os.path.join(dest, e.path))
            stats[e.path] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        else:
            stats[e.path] = e.target
    for e in pending:
        stats[e.path] = None
    copy.write_statcache(manifest.version, stats)
    if pending:
        write_pending(copy, manifest.version, pending)
        if start_fetcher:
            from jupyter_portable.engine.lazy import start_background_fetch

            start_background_fetch(dest)
    else:
        try:
            copy.pending_path.unlink()
        except FileNotFoundError:
            pass
    shutil.rmtree(copy.tmp_dir, ignore_errors=True)
    total = manifest.total_bytes
    progress.done(f"restored version {manifest.version} of {workspace_id} into {dest}: "
                  f"{len(manifest.files)} files, {human_bytes(total)}"
                  + (f"; {len(pending)} large file(s) fetching in the background" if pending else ""))
    return RestoreResult(workspace_id, manifest.version, len(manifest.files), total,
                         sorted(pending_paths), fetched, removed)


def write_pending(copy: WorkspaceCopy, version: int, entries: list[FileEntry]) -> None:
    body = {"version": version, "files": [e.to_json() for e in entries]}
    atomic_write(copy.pending_path, json.dumps(body).encode())


def read_pending(copy: WorkspaceCopy) -> tuple[int, list[FileEntry]]:
    """The version and entries still to be fetched by a lazy restore (validated)."""
    try:
        obj = json.loads(copy.pending_path.read_bytes())
    except FileNotFoundError:
        return 0, []
    except ValueError as exc:
        raise ManifestError(f"{copy.pending_path} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("files"), list):
        raise ManifestError(f"{copy.pending_path} is malformed")
    return int(obj.get("version", 0)), [FileEntry.from_json(e) for e in obj["files"]]
