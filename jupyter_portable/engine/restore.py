"""Restore: materialize a manifest version into a directory, hashing every file before
it is renamed into place (invariant 4), writing nothing outside it (invariant 8), and nothing
the inbound gate refuses (invariant 11, engine/gate.py): on the user's side a path that runs or
configures code, the copy's own ignore rules, or a path its ignore rules keep out is not
written, not moved aside, not deleted, and listed in ``RestoreResult.refused`` with its reason."""

from __future__ import annotations

import gc
import os
import re
import stat as statmod
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.paths import RESERVED_TOP
from jupyter_portable.core.tree_object import SubTree
from jupyter_portable.engine.fetch import Placer, already_there, fetch_large
from jupyter_portable.engine.gate import InboundGate
from jupyter_portable.engine.hashproc import StatKey, helper_pool, place_files
from jupyter_portable.engine.lazy import start_background_fetch
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.engine.snapshot.options import DEFAULT as DEFAULT_OPTIONS
from jupyter_portable.engine.snapshot.options import Options
from jupyter_portable.engine.trees import check_count, count_trees
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.pending import write_pending
from jupyter_portable.workdir.statcache import ROOT, Key, StatCache, stat_key
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

LAZY_THRESHOLD = 64 * 1024 * 1024
RESTORE_BATCH = 20_000  # files fetched together (packs shared within a batch are read once)


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
    refused: list[dict[str, str]] = field(default_factory=list)  # {path, reason}: not written (the inbound gate)

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "pending": self.pending, "fetched_bytes": self.fetched_bytes,
                "removed": self.removed, "kept": self.kept, "refused": self.refused}


PLACE_CHUNK = 64  # small files written by one task
HELPER_CHUNK = 256  # small files sent to a helper process at once
HELPER_CHUNK_BYTES = 4 * 1024 * 1024  # and about this many bytes of them (a chunk, a thread's task)
HELPER_IN_FLIGHT = 8  # chunks sent and not yet placed (memory: this many chunks' bytes)
HELPER_MIN = 50_000  # a version of more files is written by helper processes
HELPER_PROCS = 2  # at most this many (as many as the cores)
# Threads writing small files: their time is the kernel's, but each system call hands the
# interpreter lock over; at 100,000 files on 2 cores, 2 threads restored in 0.65-0.9x the
# time of 8 (interleaved runs), with a third less system time.
PLACE_THREADS = max(2, min(4, os.cpu_count() or 1))
SPAN_GAP = 1024 * 1024  # files of a pack this close together are read with one request
SPAN_MAX = 16 * 1024 * 1024  # the most one request reads


Span = tuple[int, int, list[FileEntry]]  # (start, end, the files in it) of one pack


def pack_spans(entries: list[FileEntry], gap: int = SPAN_GAP, most: int = SPAN_MAX) -> list[Span]:
    """The ranges of one pack to read for ``entries`` (its members), as ``(start, end, members)``
    in offset order: members less than ``gap`` bytes apart share a range of at most ``most``
    bytes (one larger member is a range of its own). A request per file cost more than the
    bytes between neighbours."""
    spans: list[Span] = []
    for e in sorted(entries, key=lambda e: e.pack.offset if e.pack else 0):
        assert e.pack is not None
        start, end = e.pack.offset, e.pack.offset + e.pack.length
        if spans:
            s0, s1, members = spans[-1]
            if start - s1 < gap and max(s1, end) - s0 <= most:
                spans[-1] = (s0, max(s1, end), members)
                members.append(e)
                continue
        spans.append((start, end, [e]))
    return spans


class _Placing:
    """Writes the files of a pack's ranges: on helper processes when the restore has some
    (hashing, creating and naming a file is Python's time and the kernel's, per file, and one
    process's threads take turns with its interpreter lock), else on this process's threads.
    Each file placed leaves its stat key in ``keys``."""

    def __init__(self, placer: Placer, progress: Progress, procs: ProcessPoolExecutor | None) -> None:
        self.placer = placer
        self.progress = progress
        self.procs = procs
        self.keys: dict[str, Key] = {}
        self._threads: ThreadPoolExecutor | None = None
        # (job, its files, the bytes sent, the pack offset they start at), oldest first
        self._running: deque[tuple[Future[list[StatKey]], list[FileEntry], bytes, int]] = deque()

    def write(self, members: list[FileEntry], body: memoryview, start: int) -> None:
        """Place ``members`` (sorted by offset), whose bytes are ``body``, read from ``start``."""
        if self.procs is not None:
            for chunk in _chunks(members, HELPER_CHUNK, HELPER_CHUNK_BYTES):
                procs = self.procs
                if procs is None:  # a helper died: the rest are placed here
                    self._here(chunk, body, start)
                    continue
                lo = chunk[0].pack.offset  # type: ignore[union-attr]
                hi = max(e.pack.offset + e.pack.length for e in chunk)  # type: ignore[union-attr]
                data = bytes(body[lo - start:hi - start])
                items = [(e.path, e.pack.offset - lo, e.pack.length, e.hash, e.mode, e.mtime_ns)  # type: ignore[union-attr]
                         for e in chunk]
                try:
                    job = procs.submit(place_files, str(self.placer.root), data, items)
                except (BrokenProcessPool, RuntimeError, OSError):
                    self.procs = None
                    self._here(chunk, memoryview(data), lo)
                    continue
                self._running.append((job, chunk, data, lo))
                self.drain(HELPER_IN_FLIGHT)
            return
        if self._threads is None:
            self._threads = ThreadPoolExecutor(PLACE_THREADS)
        list(self._threads.map(lambda chunk: self._here(chunk, body, start),
                               _chunks(members, PLACE_CHUNK, HELPER_CHUNK_BYTES)))

    def _here(self, chunk: list[FileEntry], body: memoryview, start: int) -> None:
        for e in chunk:
            assert e.pack is not None
            at = e.pack.offset - start
            self.keys[e.path] = stat_key(self.placer.write_verified(e, body[at:at + e.pack.length]))
            self.progress.add(files=1, nbytes=e.size)

    def drain(self, most: int = 0) -> None:
        """Wait for the oldest helpers' files until at most ``most`` chunks are in flight. Files a
        helper could not place (it died, or refused them) are placed here, which raises the
        real error with its hint."""
        while len(self._running) > most:
            job, chunk, data, lo = self._running.popleft()
            try:
                got = job.result()
            except BrokenProcessPool:
                self.procs = None
                self._here(chunk, memoryview(data), lo)
                continue
            except Exception:  # noqa: BLE001 - placed again here, which raises it with its hint
                self._here(chunk, memoryview(data), lo)
                continue
            for e, key in zip(chunk, got, strict=True):
                self.keys[e.path] = key
            self.progress.add(files=len(chunk), nbytes=sum(e.size for e in chunk))

    def close(self) -> None:
        try:
            self.drain()
        finally:
            if self._threads is not None:
                self._threads.shutdown()


def _chunks(members: list[FileEntry], most: int, most_bytes: int) -> Iterator[list[FileEntry]]:
    """``members`` in runs of at most ``most`` files and about ``most_bytes`` bytes."""
    chunk: list[FileEntry] = []
    size = 0
    for e in members:
        if chunk and (len(chunk) >= most or size + e.size > most_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(e)
        size += e.size
    if chunk:
        yield chunk


def _fetch_packed(store: Store, placing: _Placing, pack: str, entries: list[FileEntry]) -> int:
    """Fetch one pack's files (the whole pack when they are most of it, else the ranges that
    hold them) and write them in parallel: creating files, not reading the pack, is what
    takes the time."""
    needed = sum(e.size for e in entries)
    pack_size = store.backend.size(f"objects/{pack[:2]}/{pack}")
    if needed * 2 >= pack_size:
        spans = [(0, pack_size, sorted(entries, key=lambda e: e.pack.offset if e.pack else 0))]
    else:
        spans = pack_spans(entries)
    fetched = 0
    for start, end, members in spans:
        if (start, end) == (0, pack_size):
            body = memoryview(store.get_object(pack, what=members[0].path))  # hashed whole
        else:
            body = memoryview(store.get_range(pack, start, end))  # each file is hashed as it is placed
        fetched += len(body)
        placing.write(members, body, start)
    placing.progress.add(uploaded=fetched)
    return fetched


def materialize(store: Store, manifest: Manifest, root: Path, entries: Iterable[FileEntry],
                progress: Progress, *, placer: Placer | None = None, links_out: list[FileEntry] | None = None,
                procs: ProcessPoolExecutor | None = None, keys_out: dict[str, Key] | None = None,
                opts: Options = DEFAULT_OPTIONS) -> int:
    """Fetch ``entries`` of ``manifest`` into ``root``: small files first, then large ones
    (``opts.download_pool``: how many parts of a large file at once).
    With ``links_out``, symlinks are left there for the caller to make once every file is in place.
    With ``procs``, small files are written by those helper processes; with ``keys_out``, the
    stat key of each file written from a pack is put there. Without ``placer``, the user's
    copy's: each path passes the inbound gate (engine/gate.py) as it is written."""
    placer = placer or InboundGate.for_copy(root).placer()
    by_pack: dict[str, list[FileEntry]] = {}
    large: list[FileEntry] = []
    links: list[FileEntry] = []
    for e in entries:
        if e.target is not None:
            links.append(e)
        elif already_there(root, e):
            os.chmod(placer.target(e.path), placer.mode_for(e.mode))
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
    workers = opts.download_pool(store.url)
    placing = _Placing(placer, progress, procs)
    try:
        for pack, members in sorted(by_pack.items(), key=lambda kv: min(e.size for e in kv[1])):
            fetched += _fetch_packed(store, placing, pack, members)
    finally:
        placing.close()
    if keys_out is not None:
        keys_out.update(placing.keys)
    for e in sorted(large, key=lambda e: e.size):
        fetched += fetch_large(store, placer, e, progress, workers)
        progress.add(files=1)
    if links_out is not None:
        links_out += links
        return fetched
    for e in links:
        placer.link(e)
        progress.add(files=1)
    placer.check_links(links)
    return fetched


def check_trees(store: Store, manifest: Manifest) -> None:
    """Read and validate every tree of a version before anything is written (a hostile entry
    anywhere refuses the whole version): each distinct tree once, counted against the
    manifest's file_count and total_bytes, so trees that name each other over and over are
    refused before the walk that would expand them."""
    if manifest.tree is None:
        return  # schema 1 was validated whole when read
    check_count(manifest, count_trees(store, manifest.tree))


def _holds_files(dest: Path) -> bool:
    """Whether ``dest`` holds anything besides ``.portable``."""
    try:
        with os.scandir(dest) as entries:
            return any(e.name != RESERVED_TOP for e in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False


_KEPT_RE = re.compile(r"\.orig-\d{8}T\d{6}Z(?:-\d+)?\Z")  # what _kept_name makes


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


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the block (then as it was). A restore makes and drops
    millions of small objects (entries, tuples, rows) with no cycles among them: reference
    counting frees them, and the collector's passes over them took a quarter of the main
    process's CPU at 200,000 files."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@_collector_paused()
def restore(store: Store, workspace_id: str, dest: Path, *, version: int | None = None,
            lazy: bool = False, lazy_threshold: int = LAZY_THRESHOLD, delete: bool = False,
            progress: Progress | None = None, start_fetcher: bool = True,
            eager: Iterable[str] = (), force: bool = False, now: datetime | None = None,
            inbound: InboundGate | None = None) -> RestoreResult:
    """Make ``dest`` a copy of ``workspace_id`` at ``version`` (default: the latest).

    ``inbound``: the gate every path passes; by default the user's side's, with the rules
    ``dest`` holds before anything is written (a worker's own copy passes its machine-side gate).

    With ``lazy``, files of ``lazy_threshold`` bytes or more are left to a background
    fetcher, except those at or under a path in ``eager`` (a worker's checkpoints).
    A ``dest`` that holds files but is not a copy of this workspace is refused unless
    ``force``; then each file there that differs is kept as ``NAME.orig-TIME`` (``now``)."""
    progress = progress or Progress("restore")
    store.check_store()  # a store of unknown format is refused before anything is written
    dest = dest.resolve()
    gate = inbound or InboundGate.for_copy(dest)  # the user's rules as they stand, before the version's arrive
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
    check_trees(store, manifest)
    kept = keep_differing(dest, [e for e in manifest.files if gate.reason(e.path) is None], now) \
        if foreign and now is not None else {}
    if not copy.exists():
        copy.write_restoring(workspace_id)  # after the files in the way were kept: a rerun keeps the rest

    keep_now = tuple(eager)

    def wanted_now(path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in keep_now)

    progress.files_total = manifest.file_count
    progress.bytes_total = manifest.total_bytes
    progress.set_stage("fetching")
    pending: list[FileEntry] = []
    placer = gate.placer()
    refused: set[str] = set()
    links: list[FileEntry] = []
    fetched = 0
    removed: list[str] = []
    cache = copy.open_statcache()
    try:
        cache.begin()
        cache.clear()
        ids: dict[str, int] = {"": ROOT}

        def folder_id(folder: str) -> int:
            """The stat cache's id of ``folder``, made with those above it (a loop: up to MAX_DEPTH levels)."""
            missing: list[str] = []
            at = folder
            while at not in ids:
                missing.append(at)
                at = at.rpartition("/")[0]
            got = ids[at]
            for path in reversed(missing):
                got = ids[path] = cache.ensure_dir(got, path.rpartition("/")[2])
            return got

        def write(batch: list[FileEntry]) -> tuple[int, list[Key]]:
            """The batch's files written (in another thread), and each one's stat key."""
            keys: dict[str, Key] = {}
            n = materialize(store, manifest, dest, batch, progress, placer=placer, links_out=links, procs=procs,
                            keys_out=keys)
            return n, [None if e.target is not None
                       else keys.get(e.path) or stat_key(os.stat(os.path.join(dest, e.path))) for e in batch]

        def record(batch: list[FileEntry], done: Future[tuple[int, list[Key]]]) -> None:
            nonlocal fetched
            n, keys = done.result()
            fetched += n
            rows: dict[int, list[tuple[str, Key]]] = {}
            for e, key in zip(batch, keys, strict=True):
                if e.target is None:
                    folder, _, name = e.path.rpartition("/")
                    rows.setdefault(folder_id(folder), []).append((name, key))
            for dir_id, got in rows.items():
                cache.add_rows(dir_id, got)
            # the blobs are in the store: a file moved or copied later is not stored again
            cache.add_blobs((e.hash, e.pack.pack, e.pack.offset, e.pack.length) for e in batch if e.pack is not None)

        # One batch is written while the trees of the next are read: the walk's Python and the
        # writes' system calls overlap. The stat cache is written here, in this thread.
        writing: list[tuple[list[FileEntry], Future[tuple[int, list[Key]]]]] = []

        def place(batch: list[FileEntry]) -> None:
            while writing:
                record(*writing.pop())
            writing.append((batch, writer.submit(write, batch)))

        # Folder by folder in path order, a batch at a time: memory is the batch plus depth x width.
        # A folder with a refused file is not the version's tree here: the cache does not say it is.
        open_dirs: list[list[Any]] = [["", manifest.tree, 0, 0, False]]  # path, tree, files, bytes, refused

        def close_to(path: str) -> None:
            while len(open_dirs) > 1 and not path.startswith(open_dirs[-1][0] + "/"):
                folder, tree, n, b, short = open_dirs.pop()
                if not short:
                    cache.set_folder(folder_id(folder), tree, n, b)
                open_dirs[-1][2] += n
                open_dirs[-1][3] += b
                open_dirs[-1][4] |= short

        batch: list[FileEntry] = []
        nodes = store.iter_nodes(manifest.tree) if manifest.tree is not None else ((0, e) for e in manifest.files)
        writer = ThreadPoolExecutor(1, thread_name_prefix="portable-restore")
        # a large version's small files are written by helper processes (a core each)
        procs = helper_pool(most=HELPER_PROCS, spare_one=False) if manifest.file_count > HELPER_MIN else None
        try:
            for _depth, node in nodes:
                close_to(node.path)
                if isinstance(node, SubTree):
                    open_dirs.append([node.path, node.tree, 0, 0, False])
                    continue
                e = node
                if gate.reason(e.path) is not None:
                    # the same bytes already here (the copy's own .portableignore) are no news;
                    # a file the user ignores is not even read to be compared
                    if gate.ignored(e.path) or not already_there(dest, e):
                        gate.admit(e.path)
                    refused.add(e.path)
                    open_dirs[-1][4] = True
                    progress.add(files=1)
                    continue
                open_dirs[-1][2] += 1
                open_dirs[-1][3] += e.size
                if (lazy and e.target is None and e.size >= lazy_threshold and not wanted_now(e.path)
                        and not already_there(dest, e)):
                    pending.append(e)
                    folder, _, name = e.path.rpartition("/")
                    cache.add_rows(folder_id(folder), [(name, None)])
                    continue
                batch.append(e)
                if len(batch) >= RESTORE_BATCH:
                    place(batch)
                    batch = []
            if batch:
                place(batch)
            while writing:
                record(*writing.pop())
        finally:
            # nothing is left writing once restore returns or raises
            writer.shutdown(wait=True, cancel_futures=True)
            if procs is not None:
                procs.shutdown(wait=True, cancel_futures=True)
        close_to("")
        if manifest.tree is not None and not open_dirs[0][4]:
            cache.set_folder(ROOT, manifest.tree, open_dirs[0][2], open_dirs[0][3])
        for e in links:
            placer.link(e)
            progress.add(files=1)
            cache.add_rows(folder_id(e.path.rpartition("/")[0]), [(e.path.rpartition("/")[2], e.target)])
        placer.check_links(links)

        if delete:
            # in a folder that was not a copy of this workspace, what --delete takes away is kept
            # as NAME.orig-TIME, as what the version replaced is: none of it is ours to destroy
            removed = _remove_others(dest, cache, set(kept.values()) | refused, kept if foreign else None, now)

        cache.set_version(manifest.version)
        copy.write_config(CopyConfig(workspace_id, store.url, manifest.version, head.epoch))
        copy.clear_restoring()
        cache.commit()
    except BaseException:
        cache.abandon()
        raise
    finally:
        cache.close()
    pending_paths = [e.path for e in pending]
    if pending:
        write_pending(copy, manifest.version, pending)
        if start_fetcher:
            start_background_fetch(dest)
    else:
        copy.clear_pending()
    copy.clear_tmp()
    total = manifest.total_bytes
    progress.done(f"restored version {manifest.version} of {workspace_id} into {dest}: "
                  f"{manifest.file_count} files, {human_bytes(total)}"
                  + (f"; {len(pending)} large file(s) fetching in the background" if pending else "")
                  + (f"; {len(kept)} differing file(s) kept beside them as NAME.orig-TIME" if kept else "")
                  + (f"; {len(gate.refused)} file(s) refused by the inbound gate" if gate.refused else ""))
    return RestoreResult(workspace_id, manifest.version, manifest.file_count, total,
                         sorted(pending_paths), fetched, removed, kept, [r.to_json() for r in gate.refused])


def _remove_others(dest: Path, cache: StatCache, keep: set[str], aside: dict[str, str] | None = None,
                   now: datetime | None = None) -> list[str]:
    """Delete every file of ``dest`` the version does not have (the cache now lists exactly its files);
    with ``aside`` (and ``now``), move each to ``NAME.orig-TIME`` instead and record it there."""
    from jupyter_portable.engine.listing import Lister

    lister = Lister(dest, warn=False, strict=False)
    removed: list[str] = []
    stack: list[tuple[str, str, int | None]] = [("", str(dest), ROOT)]
    while stack:
        rel, path, dir_id = stack.pop()
        listing = lister.list(rel, path)
        rows = cache.rows(dir_id) if dir_id is not None else {}
        for f in listing.files:
            if cache.lookup_name(f.path.rpartition("/")[2]) not in rows and f.path not in keep:
                full = os.path.join(dest, f.path)
                if aside is not None and now is not None:
                    if _KEPT_RE.search(f.path):
                        continue  # already a kept copy: left where it is
                    kept_as = _kept_name(full, now)
                    os.rename(full, kept_as)
                    aside[f.path] = os.path.relpath(kept_as, dest).replace(os.sep, "/")
                else:
                    os.unlink(full)
                removed.append(f.path)
        for name, sub in listing.dirs:
            got = cache.child(dir_id, name) if dir_id is not None else None
            stack.append((f"{rel}/{name}" if rel else name, sub, got[0] if got else None))
    return sorted(removed)
