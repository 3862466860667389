"""Restore: materialize a manifest version into a directory, hashing every file before
it is renamed into place (invariant 4) and writing nothing outside it (invariant 8)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "pending": self.pending, "fetched_bytes": self.fetched_bytes,
                "removed": self.removed}


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
    store.check_store()  # a store of unknown format is refused before anything is written
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


