"""Restore: materialize a manifest version into a directory, hashing every file before
it is renamed into place (invariant 4) and writing nothing outside it (invariant 8)."""

from __future__ import annotations

import os
import shutil
import stat as statmod
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.engine.fetch import Placer, already_there, fetch_large
from jupyter_portable.engine.lazy import start_background_fetch
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.pending import write_pending
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

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
    kept: dict[str, str] = field(default_factory=dict)  # path -> where the file it replaced was kept

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "pending": self.pending, "fetched_bytes": self.fetched_bytes,
                "removed": self.removed, "kept": self.kept}


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


def _holds_files(dest: Path) -> bool:
    """Whether ``dest`` holds anything besides ``.portable``."""
    try:
        with os.scandir(dest) as entries:
            return any(e.name != ".portable" for e in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _kept_name(full: str, now: datetime) -> str:
    """``NAME.orig-TIME`` beside ``full`` (``-2``, ``-3``... if taken)."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{full}.orig-{stamp}"
    n = 1
    while os.path.lexists(name):
        n += 1
        name = f"{full}.orig-{stamp}-{n}"
    return name


def keep_differing(dest: Path, entries: Iterable[FileEntry], now: datetime) -> dict[str, str]:
    """Move every file, link or folder-in-the-way of ``dest`` that a restore of ``entries``
    would replace with something different aside as ``NAME.orig-TIME``; returns path -> kept path."""
    kept: dict[str, str] = {}

    def move(rel: str) -> None:
        full = os.path.join(dest, rel)
        aside = _kept_name(full, now)
        os.rename(full, aside)
        kept[rel] = os.path.relpath(aside, dest).replace(os.sep, "/")

    for e in entries:
        parts = e.path.split("/")
        blocked = False
        # Each folder on the way must be a real folder: a file or a link there is moved aside
        # (never followed), and nothing below it exists any more.
        for i in range(1, len(parts)):
            rel = "/".join(parts[:i])
            try:
                st = os.lstat(os.path.join(dest, rel))
            except FileNotFoundError:
                blocked = True
                break
            if not statmod.S_ISDIR(st.st_mode):
                move(rel)
                blocked = True
                break
        if blocked:
            continue
        full = os.path.join(dest, e.path)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue
        if statmod.S_ISDIR(st.st_mode):
            continue  # the version has a file where a folder is: the restore refuses it, naming it
        if e.target is not None:
            same = statmod.S_ISLNK(st.st_mode) and os.readlink(full) == e.target
        else:
            same = already_there(dest, e)
        if not same:
            move(e.path)
    return kept


def restore(store: Store, workspace_id: str, dest: Path, *, version: int | None = None,
            lazy: bool = False, lazy_threshold: int = LAZY_THRESHOLD, delete: bool = False,
            progress: Progress | None = None, start_fetcher: bool = True,
            eager: Iterable[str] = (), force: bool = False, now: datetime | None = None) -> RestoreResult:
    """Make ``dest`` a copy of ``workspace_id`` at ``version`` (default: the latest).

    With ``lazy``, files of ``lazy_threshold`` bytes or more are left to a background
    fetcher, except those at or under a path in ``eager`` (a worker's checkpoints).
    A ``dest`` that holds files but is not a copy of this workspace is refused unless
    ``force``; then each file there that differs is kept as ``NAME.orig-TIME`` (``now``)."""
    progress = progress or Progress("restore")
    store.check_store()  # a store of unknown format is refused before anything is written
    dest = dest.resolve()
    copy = WorkspaceCopy(dest)
    foreign = False
    if copy.exists():
        other = copy.read_config()
        if other.workspace_id != workspace_id:
            raise UsageError(f"{dest} is a copy of workspace {other.workspace_id}, not {workspace_id}",
                             hint="restore into an empty directory")
    elif copy.read_restoring() != workspace_id and _holds_files(dest):
        if not force:
            raise UsageError(f"{dest} is not empty and is not a copy of workspace {workspace_id}: restoring "
                             "there would overwrite its files",
                             hint="restore into an empty folder, or add --force to restore over it (each file "
                                  "that differs is kept beside it as NAME.orig-TIME)")
        if now is None:
            raise UsageError("restoring over a folder's files needs `now`, the time that names the kept files")
        foreign = True
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    head, _ = store.read_head(workspace_id)
    manifest = store.read_manifest(workspace_id, version)
    kept = keep_differing(dest, manifest.files, now) if foreign and now is not None else {}
    if not copy.exists():
        copy.write_restoring(workspace_id)  # after the files in the way were kept: a rerun keeps the rest

    keep_now = tuple(eager)

    def wanted_now(path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in keep_now)

    pending = [e for e in manifest.files
               if lazy and e.target is None and e.size >= lazy_threshold and not wanted_now(e.path)
               and not already_there(dest, e)]
    pending_paths = {e.path for e in pending}
    at_once = [e for e in manifest.files if e.path not in pending_paths]
    progress.files_total = len(at_once)
    progress.bytes_total = sum(e.size for e in at_once)
    progress.set_stage("fetching")
    fetched = materialize(store, manifest, dest, at_once, progress)

    removed: list[str] = []
    if delete:
        from jupyter_portable.engine.scan import walk

        keep = {e.path for e in manifest.files} | set(kept.values())
        for f in walk(dest, warn=False):
            if f.path not in keep:
                os.unlink(os.path.join(dest, f.path))
                removed.append(f.path)

    copy.write_config(CopyConfig(workspace_id, store.url, manifest.version, head.epoch))
    copy.clear_restoring()
    stats: dict[str, Any] = {}
    for e in at_once:
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
                  + (f"; {len(pending)} large file(s) fetching in the background" if pending else "")
                  + (f"; {len(kept)} differing file(s) kept beside them as NAME.orig-TIME" if kept else ""))
    return RestoreResult(workspace_id, manifest.version, len(manifest.files), total,
                         sorted(pending_paths), fetched, removed, kept)


