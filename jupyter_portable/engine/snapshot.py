"""Snapshot: walk, hash what changed, upload what the store lacks, then publish.

Order (invariant 2): pack objects and parts, then pack indexes, then the manifest,
then the head by compare-and-swap. A file whose size or mtime moves while it is read
is not published this time; its previous version (if any) stays.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import blake3

from jupyter_portable.core.errors import ConflictError, FencedError, PortableError
from jupyter_portable.core.manifest import FileEntry, Manifest, PackIndex, PackRef, ParentRef
from jupyter_portable.core.times import now_iso
from jupyter_portable.core.tree import MAX_DEPTH, Node, encode_texts, entry_text, node_json, pack_ref_text
from jupyter_portable.engine.hashproc import (
    PERMS,
    Fragment,
    Quick,
    Read,
    helper_pool,
    list_and_pack,
    quick_folders,
    read_small,
    read_whole,
)
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.engine.scan import IGNORE_FILE, Found, Lister, Listing, Plain, Stat
from jupyter_portable.engine.trees import BaseTree, as_tree, iter_under, replace_at, write_trees
from jupyter_portable.store.repo import CONFLICT_HINT, Store, digest, object_key
from jupyter_portable.workdir.statcache import ROOT, BlobReader, Key, StatCache, StatLike, stat_key
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

SMALL_MAX = 512 * 1024  # files below this are packed
PART_SIZE = 16 * 1024 * 1024  # large files are stored in parts of this size
PACK_TARGET = 8 * 1024 * 1024  # a pack is flushed once it holds this much
INFLIGHT_MAX = 256 * 1024 * 1024  # bytes read but not yet durable
RACY_NS = 2_000_000_000  # files modified this recently are re-hashed next time
BATCH = 64  # small files per hashing task
PROCESS_MIN = 20_000  # small files to read in one run before other processes read them
TREE_BATCH = 256  # tree objects written (and fsynced) together
PACKED_KEEP = 100_000  # pack refs of this run kept for deduplication
AHEAD_MIN = 100_000  # files in the last snapshot before another process stats folders ahead of the walk
AHEAD_CHUNK = 2_000  # files per batch of folders it stats
AHEAD_IN_FLIGHT = 4  # batches sent to it at a time
LOOKAHEAD = 8_192  # files queued for other processes before the walk waits for the oldest folder
WAITING_MAX = 20_000  # entries of folders waiting for their pack refs before a pack is formed early
LIST_AHEAD = 8  # folders a first snapshot has other processes list (and read) ahead of the walk
LIST_MOST = 20_000  # files in a folder the walk lists itself rather than receive them all at once
LIST_READ = 4 * 1024 * 1024  # bytes of small files read with a folder's listing (the rest as usual)


@dataclass
class SnapshotResult:
    workspace_id: str
    version: int
    files: int
    bytes: int
    new_bytes: int
    changed: bool
    skipped: list[str] = field(default_factory=list)
    hashed: int = 0  # files read and hashed (the rest were known from the stat cache)
    # FIFOs, sockets and devices, never recorded: [{"path": ..., "kind": "FIFO"}]
    special: list[dict[str, str]] = field(default_factory=list)
    tree_bytes: int = 0  # tree objects written (format 2), besides the data in new_bytes

    def to_json(self) -> dict[str, Any]:
        """``skipped`` lists every path not recorded as it is now: changed while read, or special."""
        return {"workspace_id": self.workspace_id, "version": self.version, "files": self.files,
                "bytes": self.bytes, "new_bytes": self.new_bytes, "changed": self.changed,
                "skipped": sorted(self.skipped + [s["path"] for s in self.special]), "special": self.special,
                "hashed": self.hashed}


@dataclass
class Extras:
    """What a caller adds to the version a snapshot publishes.

    ``fingerprint`` names the environment cheaply: when it differs from the one the
    stat cache remembers, the no-change shortcut is not taken. ``runtime`` is called
    only when a version is published, with the base manifest, and returns the runtime
    record (it may store objects first). ``before_publish`` sees the entries about to
    be published and returns checkpoint records to add and paths to keep at their base
    version (a checkpoint whose read-back failed is not published).
    """

    fingerprint: str | None = None
    runtime: Callable[[Manifest | None], dict[str, Any] | None] | None = None
    next_action: dict[str, Any] | None = None
    before_publish: Callable[[dict[str, Any], Manifest | None],
                             tuple[list[dict[str, Any]], set[str]]] | None = None
    # Allocation records to add; one with the allocation_id of an earlier record replaces it.
    allocations: list[dict[str, Any]] = field(default_factory=list)


class _Frag:
    """A folder's :class:`Fragment` on its way into a pack, then into the folder's tree."""

    __slots__ = ("at", "blobs", "body", "nbytes", "pack", "rows", "skipped", "sound", "texts")

    def __init__(self, frag: Fragment, prefix: str) -> None:
        self.body = frag.body
        self.blobs = frag.blobs
        self.texts = frag.texts
        self.rows = frag.rows
        self.sound = frag.sound
        self.skipped: list[str] = []
        self.nbytes = 0  # of the files published (not those changed while read)
        for t, i in zip(frag.files, frag.blob_of, strict=True):
            if i is None:
                self.skipped.append(prefix + t[0])
            else:
                self.nbytes += t[2]
        # the pack its body joined and where in it ("" once formed: no bytes to pack)
        self.pack: str | None = None if frag.blobs else ""
        self.at = 0

    def entries(self) -> list[tuple[str, str]]:
        """``(name, tree entry)`` of each file, once its pack is formed."""
        pack, at, blobs = self.pack, self.at, self.blobs
        assert pack is not None
        return [(name, head if i < 0 else head + pack_ref_text(pack, at + blobs[i][1], blobs[i][2]) + tail)
                for name, head, i, tail in self.texts]


class _Uploader:
    """Packs new small blobs, uploads packs and parts concurrently, within a byte budget."""

    def __init__(self, store: Store, workers: int, progress: Progress) -> None:
        self.store = store
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="portable-upload")
        self.progress = progress
        self.futures: list[Future[None]] = []
        self.new_bytes = 0
        self._budget = threading.Condition()
        self._inflight = 0
        self._lock = threading.Lock()
        self._buf: list[tuple[str, bytes] | _Frag] = []
        self._buf_size = 0
        # blob hash -> pack ref of this run's packs, the newest PACKED_KEEP kept (for
        # deduplication within the run; every folder takes its refs long before eviction)
        # (a tuple each: a hundred thousand refs as dicts held 17 MB more)
        self.packed: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self._pending_blobs: set[str] = set()
        self._parts_seen: set[str] = set()
        self.tree_bytes = 0
        self._trees: list[tuple[str, bytes]] = []  # tree objects waiting to be written together
        self._trees_size = 0
        # Blobs of earlier versions (the stat cache's record), so that a moved or copied small
        # file is not stored again; each pack named is checked once to be in the store.
        self.blobs: BlobReader | None = None
        self._packs_ok: dict[str, bool] = {}
        self.formed: list[tuple[str, str, int, int]] = []  # this run's packed blobs, for the stat cache

    def _reserve(self, n: int) -> None:
        with self._budget:
            while self._inflight and self._inflight + n > INFLIGHT_MAX:
                self._budget.wait()
            self._inflight += n

    def _release(self, n: int) -> None:
        with self._budget:
            self._inflight -= n
            self._budget.notify_all()

    def _submit(self, nbytes: int, fn: Any, *args: Any) -> None:
        self._reserve(nbytes)

        def run() -> None:
            try:
                fn(*args)
                with self._lock:
                    self.new_bytes += nbytes
                self.progress.add(uploaded=nbytes)
            finally:
                self._release(nbytes)

        self.futures.append(self.pool.submit(run))

    def add_blob(self, h: str, data: bytes) -> None:
        with self._lock:
            if h in self._pending_blobs or h in self.packed:
                return
            self._pending_blobs.add(h)
            flush = self._queue((h, data), len(data))
        if flush:
            self._flush(flush)

    def _queue(self, item: tuple[str, bytes] | _Frag, size: int) -> list[tuple[str, bytes] | _Frag] | None:
        """Buffer ``item`` (under the lock); what to form a pack of now, if the buffer is full."""
        self._buf.append(item)
        self._buf_size += size
        if self._buf_size < PACK_TARGET:
            return None
        flush, self._buf, self._buf_size = self._buf, [], 0
        return flush

    def add_fragment(self, frag: _Frag) -> bool:
        """Queue a folder's fragment for the next pack; False (nothing queued) when a blob of
        it is this run's already: its files are then taken one by one, each blob once."""
        if not frag.blobs:
            return True
        hashes = [h for h, _o, _n in frag.blobs]
        with self._lock:
            if not (self._pending_blobs.isdisjoint(hashes) and self.packed.keys().isdisjoint(hashes)):
                return False
            self._pending_blobs.update(hashes)
            flush = self._queue(frag, len(frag.body))
        if flush:
            self._flush(flush)
        return True

    def _flush(self, blobs: list[tuple[str, bytes] | _Frag]) -> None:
        body = b"".join([b[1] if isinstance(b, tuple) else b.body for b in blobs])
        ph = digest(body)
        entries: list[tuple[str, int, int]] = []
        off = 0
        with self._lock:
            for b in blobs:
                if isinstance(b, _Frag):
                    got = [(h, off + o, n) for h, o, n in b.blobs]
                    entries += got
                    self.packed.update([(h, (ph, o, n)) for h, o, n in got])
                    self._pending_blobs.difference_update([h for h, _o, _n in got])
                    self.formed += [(h, ph, o, n) for h, o, n in got]
                    b.at, b.pack = off, ph  # the pack last: the walk reads it without the lock
                    off += len(b.body)
                    b.body = b""
                    continue
                h, d = b
                self.packed[h] = (ph, off, len(d))
                self._pending_blobs.discard(h)
                entries.append((h, off, len(d)))
                self.formed.append((h, ph, off, len(d)))
                off += len(d)
            while len(self.packed) > PACKED_KEEP:
                self.packed.popitem(last=False)
        index = PackIndex(ph, len(body), tuple(entries))
        self._submit(len(body), self.store.write_pack, index, body)

    def ref(self, h: str) -> dict[str, Any] | None:
        """The pack ref of a blob of this run, once its pack is formed (a new dict)."""
        with self._lock:
            got = self.packed.get(h)
        return None if got is None else {"id": got[0], "offset": got[1], "length": got[2]}

    def refs(self, hashes: list[str]) -> list[dict[str, Any] | None]:
        """:meth:`ref` of each blob, looked up together."""
        with self._lock:
            get = self.packed.get
            got = [get(h) for h in hashes]
        return [None if t is None else {"id": t[0], "offset": t[1], "length": t[2]} for t in got]

    def known(self, h: str, size: int) -> dict[str, Any] | None:
        """The pack ref of a blob an earlier version stored, if its pack is in the store."""
        got = self.blobs.get(h) if self.blobs is not None else None
        if got is None or got[2] != size:
            return None
        pack = got[0]
        with self._lock:
            ok = self._packs_ok.get(pack)
        if ok is None:
            ok = self.store.has_object(pack)
            with self._lock:
                self._packs_ok[pack] = ok
        return {"id": pack, "offset": got[1], "length": got[2]} if ok else None

    def take_formed(self) -> list[tuple[str, str, int, int]]:
        with self._lock:
            out, self.formed = self.formed, []
        return out

    def pending(self) -> bool:
        with self._lock:
            return bool(self._buf)

    def flush_now(self) -> None:
        """Form a pack of what is buffered (so that folders waiting for refs can be written)."""
        with self._lock:
            rest, self._buf, self._buf_size = self._buf, [], 0
        if rest:
            self._flush(rest)

    def add_tree(self, body: bytes) -> str:
        """Queue one tree object; its hash. Trees are written in batches in the background."""
        h = digest(body)
        with self._lock:
            self._trees.append((h, body))
            self._trees_size += len(body)
            if len(self._trees) < TREE_BATCH and self._trees_size < PACK_TARGET:
                return h
            batch, self._trees, self._trees_size = self._trees, [], 0
        self._write_trees(batch)
        return h

    def _write_trees(self, batch: list[tuple[str, bytes]]) -> None:
        nbytes = sum(len(b) for _h, b in batch)
        self._reserve(nbytes)

        def run() -> None:
            try:
                # a folder re-read (a racy stat, a cache miss) often makes the tree the store has:
                # asking is one small request, sending it again is the whole folder listing
                fresh = [(object_key(h), b) for h, b in dict(batch).items() if not self.store.has_object(h)]
                if fresh:
                    self.store.backend.write_batch(fresh)
                    with self._lock:
                        self.tree_bytes += sum(len(b) for _k, b in fresh)
            finally:
                self._release(nbytes)

        self.futures.append(self.pool.submit(run))

    def add_part(self, h: str, data: bytes, known: set[str]) -> None:
        with self._lock:
            if h in known or h in self._parts_seen:
                return
            self._parts_seen.add(h)
        self._submit(len(data), self._write_part, h, data)

    def _write_part(self, h: str, data: bytes) -> None:
        if not self.store.has_object(h):
            self.store.backend.write(object_key(h), data)

    def finish(self) -> None:
        """Flush the last pack and trees and wait until every object is durable; re-raise failures."""
        with self._lock:
            rest, self._buf, self._buf_size = self._buf, [], 0
            trees, self._trees, self._trees_size = self._trees, [], 0
        if rest:
            self._flush(rest)
        if trees:
            self._write_trees(trees)
        try:
            for fut in self.futures:
                fut.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _Unstable(Exception):
    """The file changed while it was being read."""


def _same(st: StatLike, fst: StatLike) -> bool:
    return st.st_size == fst.st_size and st.st_mtime_ns == fst.st_mtime_ns


def _pack_json(ref: PackRef) -> dict[str, Any]:
    return {"id": ref.pack, "offset": ref.offset, "length": ref.length}


def _hash_small(root: str, f: Found, up: _Uploader, prev: FileEntry | None) -> dict[str, Any]:
    data, fst = read_whole(os.path.join(root, f.path), f.st.st_size)
    if len(data) != f.st.st_size or not _same(f.st, fst):
        raise _Unstable(f.path)
    return _small_entry(f, digest(data), data, up, prev)


def _small_entry(f: Found, h: str, data: bytes, up: _Uploader, prev: FileEntry | None) -> dict[str, Any]:
    """The entry of a small file read and hashed: its blob packed unless the store has it."""
    entry: dict[str, Any] = {"path": f.path, "type": "file", "size": len(data),
                             "mode": f.st.st_mode & PERMS, "hash": h, "mtime_ns": f.st.st_mtime_ns}
    if not data:
        entry["parts"] = []
    elif prev is not None and prev.pack is not None and prev.hash == h:
        entry["pack"] = _pack_json(prev.pack)  # same bytes as the base version: already stored
    else:
        ref = up.ref(h) or up.known(h, len(data))  # a blob of this run, or a moved or copied file's
        if ref is not None:
            entry["pack"] = ref
        else:
            up.add_blob(h, data)
            entry["pack"] = None  # filled in once the pack is formed
    return entry


def _hash_large(root: str, f: Found, up: _Uploader, prev: FileEntry | None) -> dict[str, Any]:
    known_parts = {h for h, _n in prev.parts} if prev is not None else set()
    whole = blake3.blake3()
    parts: list[list[Any]] = []
    with open(os.path.join(root, f.path), "rb") as fh:
        while True:
            data = fh.read(PART_SIZE)
            if not data:
                break
            whole.update(data)
            h = blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()
            parts.append([h, len(data)])
            up.add_part(h, data, known_parts)
            up.progress.add(nbytes=len(data))
        if sum(n for _, n in parts) != f.st.st_size or not _same(f.st, os.fstat(fh.fileno())):
            raise _Unstable(f.path)
    return {"path": f.path, "type": "file", "size": f.st.st_size, "mode": f.st.st_mode & PERMS,
            "hash": whole.hexdigest(), "mtime_ns": f.st.st_mtime_ns, "parts": parts}


Entry = dict[str, Any] | FileEntry  # a new entry (dict) or one kept from the base version


def _identity(e: Entry) -> tuple[Any, ...]:
    """What makes two entries the same version of a path (mtime alone does not)."""
    if isinstance(e, FileEntry):
        return ("symlink", None, None, e.target) if e.target is not None else ("file", e.hash, e.mode, None)
    return (e.get("type"), e.get("hash"), e.get("mode"), e.get("target"))


def _size(e: Entry) -> int:
    return e.size if isinstance(e, FileEntry) else int(e.get("size", 0))


@dataclass
class _Result:
    """What a folder became: its tree (None until written), and what it holds."""

    tree: str | None
    files: int
    bytes: int
    unchanged: bool  # exactly the tree the stat cache remembers


@dataclass
class _Folder:
    rel: str
    abs: str
    name: str
    depth: int
    parent: "_Folder | None"
    cache_id: int | None
    cached: tuple[str | None, int, int] | None
    rows: dict[str, Key]
    subdirs: list[tuple[str, str]]
    changed: bool = False
    next_sub: int = 0
    kept: dict[str, Entry] = field(default_factory=dict)
    keys: dict[str, Key] = field(default_factory=dict)
    maybe: list[tuple[Found, Key]] = field(default_factory=list)  # stat as cached: kept if the base has it
    jobs: list[Future[list[tuple[Found, Entry | None]]]] = field(default_factory=list)
    children: dict[str, _Result] = field(default_factory=dict)
    entries: list[Entry | tuple[str, _Result]] = field(default_factory=list)
    frag: _Frag | None = None  # files a helper read and wrote the entries of (a first snapshot)
    result: _Result | None = None
    quick: bool = False  # its files were vouched for by the listing's signature alone
    sig: bytes | None = None  # the listing's signature, kept with the rows when all are sound
    queued: int = 0  # files sent to be hashed and not yet taken


class _Ahead:
    """Quick signatures of the last snapshot's folders, taken by other processes from the
    far end of the walk while the walk takes them itself from the near end, so that a
    snapshot of a large workspace that changed little (one lstat per file) uses two cores.

    Only AHEAD_IN_FLIGHT batches are sent at a time, each beyond the walk's position; once
    the far end reaches the walk no more are sent. So nothing is cancelled (in CPython 3.11
    a cancelled job can keep a pool from reporting a dead helper) and the files a snapshot
    hands the same processes to read never wait behind more than a few batches. A
    signature taken early is no different from one taken at the visit: either way, a file
    written after its folder was looked at waits for the next snapshot."""

    def __init__(self, procs: ProcessPoolExecutor, root: str, salt: bytes, folders: list[tuple[str, int]]) -> None:
        self.procs, self.root, self.salt = procs, root, salt
        self.at: dict[str, tuple[int, int]] = {}
        self.batches: list[list[str]] = [[]]
        files = 0
        for rel, n in folders:
            if files >= AHEAD_CHUNK:
                self.batches.append([])
                files = 0
            self.at[rel] = (len(self.batches) - 1, len(self.batches[-1]))
            self.batches[-1].append(rel)
            files += n + 1
        self.jobs: dict[int, Future[list[Quick] | None]] = {}
        self.far = len(self.batches) - 1  # the next batch to send
        self.near = 0  # the batch of the walk's last folder
        self.sent: deque[Future[list[Quick] | None]] = deque()
        self.broken = False
        self._send()

    def _send(self) -> None:
        while self.sent and self.sent[0].done():
            self.sent.popleft()
        while not self.broken and len(self.sent) < AHEAD_IN_FLIGHT and self.far > self.near:
            try:
                job = self.procs.submit(quick_folders, self.root, self.salt, self.batches[self.far])
            except (BrokenProcessPool, RuntimeError, OSError):
                self.broken = True
                return
            self.jobs[self.far] = job
            self.sent.append(job)
            self.far -= 1

    def take(self, rel: str) -> tuple[bool, Quick]:
        """``(True, quick)`` where another process looked at the folder, else ``(False, None)``."""
        at = self.at.pop(rel, None)
        if at is None:
            return False, None
        self.near = max(self.near, at[0])
        job = self.jobs.get(at[0])
        got: list[Quick] | None = None
        if job is not None and not self.broken:
            try:
                got = job.result()
            except BrokenProcessPool:
                self.broken = True
        self._send()
        return (True, got[at[1]]) if got is not None else (False, None)


class _Walk:
    """One snapshot's walk: folders listed one at a time, changed files hashed in a pool,
    each changed folder's tree written once its new blobs are in packs (post-order), and the
    stat cache updated folder by folder inside one transaction."""

    def __init__(self, copy: WorkspaceCopy, store: Store, cache: StatCache, usable: bool, base: BaseTree,
                 up: _Uploader, progress: Progress, started_ns: int,
                 pending: dict[str, dict[str, FileEntry]]) -> None:
        self.root = str(copy.root)
        self.copy = copy
        self.store = store
        self.cache = cache
        self.usable = usable
        self.base = base
        self.up = up
        self.progress = progress
        self.started_ns = started_ns
        self.pending = pending
        # Folders that hold files not fetched yet, by parent: walked even where nothing is on disk yet.
        self.pending_dirs: dict[str, set[str]] = {}
        for folder in pending:
            while folder:
                parent, _, name = folder.rpartition("/")
                self.pending_dirs.setdefault(parent, set()).add(name)
                folder = parent
        self.lister = Lister(copy.root)
        self.skipped: list[str] = []
        self.special: list[dict[str, str]] = []
        self.hashed = 0
        self.queue: deque[_Folder] = deque()
        self.waiting = 0
        self.queued = 0  # files sent to be hashed, in folders not finished yet
        self.last = _Result(None, 0, 0, False)  # the folder finished last (the root, at the end)
        # Large files in parallel (reads and hashing of big buffers leave the interpreter lock);
        # small ones in one thread beside the walk: their cost is Python's, so more threads only
        # take turns with the lock (8 threads spent half the CPU time in the kernel doing that).
        workers = max(2, min(8, (os.cpu_count() or 2) * 2))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="portable-hash")
        self.small_pool = ThreadPoolExecutor(1, thread_name_prefix="portable-hash-small")
        # The blobs of new packs are recorded in the stat cache by a thread of their own where
        # SQLite lets threads share a connection (its inserts leave the interpreter lock, so a
        # first snapshot's million of them run beside the walk); by the walk elsewhere.
        self.blob_pool = (ThreadPoolExecutor(1, thread_name_prefix="portable-statcache")
                          if sqlite3.threadsafety == 3 else None)
        self.blob_jobs: list[Future[None]] = []
        # Once a run has many small files to read, they are read and hashed in other processes.
        self.procs: ProcessPoolExecutor | None = None
        self.procs_failed = (os.cpu_count() or 1) < 2
        self.small_sent = 0
        self.ahead: _Ahead | None = None
        # folders listed (and their small files read) by other processes, ahead of the walk
        self.listed: dict[str, Future[tuple[Plain, Fragment] | None]] = {}
        # nothing stored before to compare files with: folders listed ahead are taken whole
        self.first = not usable and base.root is None and up.blobs is None

    # -- hashing -------------------------------------------------------------------------

    def _hash_batch(self, batch: list[tuple[Found, FileEntry | None]]) -> list[tuple[Found, Entry | None]]:
        out: list[tuple[Found, Entry | None]] = []
        for f, prev in batch:
            try:
                if f.st.st_size < SMALL_MAX:
                    e = _hash_small(self.root, f, self.up, prev)
                    self.progress.add(files=1, nbytes=f.st.st_size)
                else:
                    e = _hash_large(self.root, f, self.up, prev)
                    self.progress.add(files=1)
                out.append((f, e))
            except (_Unstable, FileNotFoundError):
                out.append((f, None))
        return out

    def _submit(self, fr: _Folder, todo: list[Found], nodes: dict[str, Node] | None,
                reads: dict[str, Read] | None = None) -> None:
        if not todo:
            return
        self.progress.files_total += len(todo)
        self.progress.bytes_total += sum(f.st.st_size for f in todo)
        self.hashed += len(todo)
        fr.queued += len(todo)
        self.queued += len(todo)
        pairs = []
        for f in todo:
            prev = nodes.get(f.path.rpartition("/")[2]) if nodes else None
            pairs.append((f, prev if isinstance(prev, FileEntry) and prev.target is None else None))
        small = [p for p in pairs if p[0].st.st_size < SMALL_MAX]
        large = [p for p in pairs if p[0].st.st_size >= SMALL_MAX]
        fr.jobs += [self.pool.submit(self._hash_batch, [p]) for p in large]
        self.small_sent += len(small)
        if reads:  # read with the folder's listing: only their entries are left to make
            ready = [p for p in small if p[0].path in reads]
            small = [p for p in small if p[0].path not in reads] if len(ready) < len(small) else []
            for i in range(0, len(ready), BATCH):
                batch = ready[i:i + BATCH]
                fr.jobs.append(self.small_pool.submit(self._entries, batch, [reads[f.path] for f, _p in batch]))
        procs = self._procs() if self.small_sent > PROCESS_MIN else None
        for i in range(0, len(small), BATCH):
            batch = small[i:i + BATCH]
            if procs is not None:
                try:
                    sent = procs.submit(read_small, self.root,
                                        [(f.path, f.st.st_size, f.st.st_mtime_ns) for f, _p in batch])
                except (BrokenProcessPool, RuntimeError, OSError):
                    procs = None
                    self.procs_failed = True
                else:
                    fr.jobs.append(self.small_pool.submit(self._take_read, batch, sent))
                    continue
            fr.jobs.append(self.small_pool.submit(self._hash_batch, batch))

    def _procs(self) -> ProcessPoolExecutor | None:
        if self.procs is None and not self.procs_failed:
            # A first snapshot's helpers do nearly all of its work (see _fragment): they get every
            # core. Otherwise the walk takes each file in turn and keeps a core of its own.
            self.procs = helper_pool(spare_one=not self.first)
            self.procs_failed = self.procs is None  # no second process here: threads do it all
        return self.procs

    def _take_read(self, batch: list[tuple[Found, FileEntry | None]],
                   sent: Future[list[tuple[str, bytes] | None]]) -> list[tuple[Found, Entry | None]]:
        """Entries of a batch another process read and hashed (read here, should it have died)."""
        try:
            got = sent.result()
        except BrokenProcessPool:
            self.procs_failed = True
            return self._hash_batch(batch)
        return self._entries(batch, got)

    def _entries(self, batch: list[tuple[Found, FileEntry | None]],
                 got: list[Read]) -> list[tuple[Found, Entry | None]]:
        """Entries of small files read and hashed elsewhere (None: changed while read)."""
        out: list[tuple[Found, Entry | None]] = []
        nbytes = 0
        for (f, prev), read in zip(batch, got, strict=True):
            if read is None:
                out.append((f, None))
            else:
                out.append((f, _small_entry(f, read[0], read[1], self.up, prev)))
                nbytes += len(read[1])
        self.progress.add(files=len(batch), nbytes=nbytes)
        return out

    # -- folders -------------------------------------------------------------------------

    def visit(self, rel: str, abs_dir: str, name: str, parent: _Folder | None) -> _Folder:
        depth = parent.depth + 1 if parent is not None else 0
        if depth > MAX_DEPTH:
            raise PortableError(f"folder {rel!r} is nested more than {MAX_DEPTH} levels deep; nothing was published",
                                hint=f"move it higher up, or add it to {IGNORE_FILE}")
        cache_id: int | None
        cached: tuple[str | None, int, int] | None
        if parent is None:
            cache_id, cached = ROOT, self.cache.folder(ROOT)
        elif parent.cache_id is not None:
            got = self.cache.child(parent.cache_id, name)
            cache_id, cached = (got[0], got[1:]) if got is not None else (None, None)
        else:
            cache_id, cached = None, None
        if (self.usable and cache_id is not None and cached is not None and cached[0] is not None
                and rel not in self.pending_dirs and rel not in self.pending):
            want = self.cache.sig(cache_id)
            quick = self._quick(rel, abs_dir) if want is not None else None
            if quick is not None and quick[0] == want:
                # Every file's name and lstat as when the folder's rows were written: none is
                # looked at one by one unless a subfolder changed (see finish).
                fr = _Folder(rel, abs_dir, name, depth, parent, cache_id, cached, {}, sorted(quick[1]))
                fr.quick = True
                fr.sig = want
                return fr
        fr = _Folder(rel, abs_dir, name, depth, parent, cache_id, cached, {}, [])
        self._list(fr)
        return fr

    def _quick(self, rel: str, abs_dir: str) -> Quick:
        if self.ahead is not None:
            taken, quick = self.ahead.take(rel)
            if taken:
                return quick
        return self.lister.quick(rel, abs_dir)

    def _look_ahead(self) -> None:
        """Other processes stat the last snapshot's folders from the far end (see _Ahead)."""
        if not self.usable or self.pending:
            return
        top = self.cache.folder(ROOT)
        if top is None or top[1] < AHEAD_MIN:
            return
        procs = self._procs()
        if procs is None:
            return
        try:
            self.ahead = _Ahead(procs, self.root, self.lister.salt, self.cache.signed_folders())
        except (BrokenProcessPool, RuntimeError, OSError):
            self.ahead = None

    def _list(self, fr: _Folder) -> None:
        """List the folder with care: compare each file with its row, hash what changed."""
        rel, abs_dir, cache_id = fr.rel, fr.abs, fr.cache_id
        rows = fr.rows = self.cache.rows(cache_id) if cache_id is not None and self.usable else {}
        listing, reads, frag = self._listing(rel, abs_dir, whole=not rows and rel not in self.pending)
        fr.sig = listing.sig
        subdirs = listing.dirs
        if rel in self.pending_dirs:
            on_disk = {n for n, _p in subdirs}
            subdirs += [(n, os.path.join(abs_dir, n)) for n in self.pending_dirs[rel] if n not in on_disk]
        if not fr.quick:
            fr.subdirs = sorted(subdirs)
        self.special += [{"path": p, "kind": k} for p, k in listing.special]
        lookup = self.cache.lookup_name
        todo: list[Found] = []
        if not rows and rel not in self.pending:  # nothing recorded here (a first snapshot): every file is new
            for f in listing.files:
                if f.target is not None:
                    _keep_link(fr, f, f.target)
                else:
                    todo.append(f)
            fr.changed = fr.changed or bool(listing.files) or frag is not None
            self._submit(fr, todo, self.base.nodes(rel) if todo else None, reads)
            if frag is not None:
                self._fragment(fr, frag)
            return
        seen: set[str] = set()
        for f in listing.files:
            fname = f.path.rpartition("/")[2]
            lname = lookup(fname)
            seen.add(lname)
            was = rows.get(lname)
            if f.target is not None:
                _keep_link(fr, f, f.target)
                if was != f.target:
                    fr.changed = True
                continue
            key = stat_key(f.st)
            if was is not None and was == key:
                fr.maybe.append((f, key))
            else:
                fr.changed = True
                todo.append(f)
        if seen != rows.keys():
            fr.changed = True
        for pname, e in self.pending.get(rel, {}).items():
            if lookup(pname) not in seen:  # not fetched yet: still part of the copy
                fr.kept[pname] = e
                fr.keys[pname] = None
                fr.changed = True
        nodes = self.base.nodes(rel) if todo else None
        self._submit(fr, todo, nodes, reads)

    def _listing(self, rel: str, abs_dir: str,
                 whole: bool) -> tuple[Listing, dict[str, Read] | None, Fragment | None]:
        """The folder's listing where another process made it, less the small files it read:
        as a fragment, taken ``whole`` (nothing of an earlier version to compare them with), or
        else as reads, for each file to be taken one by one."""
        job = self.listed.pop(rel, None)
        got = None
        if job is not None:
            try:
                got = job.result()
            except BrokenProcessPool:
                self.procs_failed = True
            except Exception:  # noqa: BLE001 - whatever the helper met, the walk meets again itself
                got = None
        if got is None:
            return self.lister.list(rel, abs_dir), None, None
        (files, dirs, sig), fragment = got
        prefix = f"{rel}/" if rel else ""
        reads = None
        frag: Fragment | None = fragment
        if not fragment.files:
            frag = None
        elif not whole or not self.first:
            # an earlier version may hold these files (kept from it, or a blob already stored)
            files = files + fragment.files
            reads = _reads(fragment, prefix)
            frag = None
        listing = Listing([Found(prefix + name, Stat(*st)) for name, *st in files], dirs)
        listing.sig = sig
        return listing, reads, frag

    def _fragment(self, fr: _Folder, frag: Fragment) -> None:
        """Take the files a helper read and wrote the entries of: their blobs join a pack (in
        turn with the other small files, on the same thread) and their rows are kept."""
        fg = fr.frag = _Frag(frag, f"{fr.rel}/" if fr.rel else "")
        n = len(frag.files)
        self.progress.files_total += n
        self.progress.bytes_total += sum(t[2] for t in frag.files)
        self.hashed += n
        fr.queued += n
        self.queued += n
        self.small_sent += n
        fr.jobs.append(self.small_pool.submit(self._take_fragment, fr, fg, frag))

    def _take_fragment(self, fr: _Folder, fg: _Frag, frag: Fragment) -> list[tuple[Found, Entry | None]]:
        if self.up.add_fragment(fg):
            self.progress.add(files=len(frag.files), nbytes=fg.nbytes)
            return []
        # a blob of it is this run's already (the same file in another folder): file by file
        fr.frag = None
        prefix = f"{fr.rel}/" if fr.rel else ""
        reads = _reads(frag, prefix)
        batch: list[tuple[Found, FileEntry | None]] = [(Found(prefix + name, Stat(*st)), None)
                                                       for name, *st in frag.files]
        return self._entries(batch, [reads[f.path] for f, _p in batch])

    def _list_ahead(self, stack: list[_Folder]) -> None:
        """In a first snapshot of a large workspace, other processes list the next folders
        of the walk (each folder's subfolders, deepest first, as the walk will meet them)
        and read their small files, up to LIST_AHEAD folders at a time."""
        if self.usable or self.procs is None or self.procs_failed:
            return
        for fr in reversed(stack):
            for name, _path in fr.subdirs[fr.next_sub:]:
                if len(self.listed) >= LIST_AHEAD:
                    return
                rel = f"{fr.rel}/{name}" if fr.rel else name
                if rel in self.listed:
                    continue
                try:
                    self.listed[rel] = self.procs.submit(list_and_pack, self.root, self.lister.salt, rel,
                                                         LIST_MOST, SMALL_MAX, LIST_READ, self.started_ns - RACY_NS)
                except (BrokenProcessPool, RuntimeError, OSError):
                    self.procs_failed = True
                    return

    def _racy(self, key: Key) -> Key:
        if isinstance(key, tuple) and key[1] >= self.started_ns - RACY_NS:
            return None  # too fresh to trust: a write in the same clock tick would be missed
        return key

    def _take(self, fr: _Folder, f: Found, e: Entry | None, nodes: dict[str, Node] | None) -> None:
        fname = f.path.rpartition("/")[2]
        if e is None:
            self.skipped.append(f.path)
            prev = nodes.get(fname) if nodes else None
            if isinstance(prev, FileEntry):  # changed while read: the previous version stays
                fr.kept[fname] = prev
                fr.keys[fname] = None
            return
        fr.kept[fname] = e
        fr.keys[fname] = self._racy(stat_key(f.st))

    def _sound(self, fr: _Folder) -> bool:
        """Whether the folder's signature may be kept: every file's row known and not too fresh."""
        return (fr.sig is not None and all(k is not None for k in fr.keys.values())
                and all(self._racy(k) is not None for _f, k in fr.maybe) and (fr.frag is None or fr.frag.sound))

    def finish(self, fr: _Folder) -> _Result:
        """Decide the folder's entries once its subfolders are done; queue its tree."""
        kids = {n: r for n, r in fr.children.items() if r.files}
        cached_kids = self.cache.children(fr.cache_id) if fr.cache_id is not None else {}
        kid_names = {self.cache.lookup_name(n) for n in kids}
        same_kids = all(r.unchanged for r in kids.values()) and kid_names == cached_kids.keys()
        if fr.quick:
            if same_kids:
                assert fr.cached is not None and fr.cached[0] is not None
                tree, files, nbytes = fr.cached
                return _Result(tree, files, nbytes, True)
            self._list(fr)  # a subfolder changed: this folder's tree is written again, so list it
        results = [(f, e) for job in fr.jobs for f, e in job.result()]
        fr.jobs = []
        if results:
            fr.changed = True
        if (self.usable and not fr.changed and fr.cached is not None and fr.cached[0] is not None
                and same_kids):
            assert fr.cache_id is not None
            if self._sound(fr) and self.cache.sig(fr.cache_id) != fr.sig:
                self.cache.set_sig(fr.cache_id, fr.sig)
            tree, files, nbytes = fr.cached
            return _Result(tree, files, nbytes, True)
        nodes = self.base.nodes(fr.rel)
        for f, e in results:
            self._take(fr, f, e, nodes)
        rehash: list[Found] = []
        for f, key in fr.maybe:
            prev = nodes.get(f.path.rpartition("/")[2]) if nodes else None
            if isinstance(prev, FileEntry) and prev.target is None:
                fr.kept[prev.path.rpartition("/")[2]] = prev
                fr.keys[prev.path.rpartition("/")[2]] = self._racy(key)
            else:
                rehash.append(f)  # the cache and the base disagree: read it again
        fr.maybe = []
        if rehash:
            self._submit(fr, rehash, nodes)
            for job in fr.jobs:
                for f, e in job.result():
                    self._take(fr, f, e, nodes)
            fr.jobs = []
        fg = fr.frag
        files = len(fr.kept) + sum(r.files for r in kids.values()) + (len(fg.texts) if fg else 0)
        nbytes = (sum(_size(e) for e in fr.kept.values()) + sum(r.bytes for r in kids.values())
                  + (fg.nbytes if fg else 0))
        if fg is not None:
            self.skipped += fg.skipped
        result = _Result(None, files, nbytes, False)
        # The stat cache follows the folder (inside the snapshot's transaction).
        for gone, (gid, _tree) in cached_kids.items():
            if gone not in kid_names:
                self.cache.drop_folder(gid)
        if not files and fr.parent is not None:
            if fr.cache_id is not None:
                self.cache.drop_folder(fr.cache_id)
            return result  # an empty folder is not recorded
        if fr.cache_id is None:
            fr.cache_id = self._ensure_id(fr)
        self.cache.replace_rows(fr.cache_id, fr.keys.items())
        if fg is not None:
            self.cache.put_rows(fr.cache_id, fg.rows)
            fg.rows = []
        if self._sound(fr):
            self.cache.set_sig(fr.cache_id, fr.sig)
        fr.entries = [*fr.kept.values(), *((n, r) for n, r in sorted(kids.items()))]
        fr.kept, fr.keys = {}, {}
        fr.result = result
        self.queue.append(fr)
        self.waiting += len(fr.entries) + (len(fg.texts) if fg else 0)
        return result

    def _ensure_id(self, fr: _Folder) -> int:
        if fr.cache_id is None:
            assert fr.parent is not None
            fr.cache_id = self.cache.ensure_dir(self._ensure_id(fr.parent), fr.name)
        return fr.cache_id

    def drain(self, force: bool = False) -> None:
        """Write the trees of queued folders, oldest first, while their blobs have pack refs."""
        formed = self.up.take_formed()
        if formed:
            if self.blob_pool is not None:
                self.blob_jobs.append(self.blob_pool.submit(self.cache.add_blobs, formed))
            else:
                self.cache.add_blobs(formed)
        while self.queue:
            fr = self.queue[0]
            fg = fr.frag
            unpacked = [e for e in fr.entries if type(e) is dict and e.get("pack", 0) is None]
            if unpacked or (fg is not None and fg.pack is None):
                refs = self.up.refs([e["hash"] for e in unpacked])
                if force and not self._packed(refs, fg):
                    self.up.flush_now()
                    refs = self.up.refs([e["hash"] for e in unpacked])
                if not self._packed(refs, fg):
                    return
                for u, ref in zip(unpacked, refs, strict=True):
                    u["pack"] = ref
            where = fr.rel or "the workspace root"
            out = fg.entries() if fg is not None else []
            for e in fr.entries:
                if isinstance(e, tuple):
                    name, r = e
                    assert r.tree is not None, "a subfolder's tree is written before its parent's"
                    out.append((name + "/", entry_text({"name": name, "type": "dir", "tree": r.tree}, where)))
                elif isinstance(e, FileEntry):
                    j = node_json(e)
                    out.append((j["name"], entry_text(j, where)))
                else:  # this folder's own new entry: made its tree entry in place (nothing else holds it)
                    name = e.pop("path").rpartition("/")[2]
                    e["name"] = name
                    out.append((name, entry_text(e, where)))
            out.sort(key=itemgetter(0))
            body = encode_texts([t for _k, t in out])
            assert fr.result is not None and fr.cache_id is not None
            fr.result.tree = self.up.add_tree(body)
            self.cache.set_folder(fr.cache_id, fr.result.tree, fr.result.files, fr.result.bytes)
            self.waiting -= len(fr.entries) + (len(fg.texts) if fg else 0)
            fr.entries = []
            fr.frag = None
            self.queue.popleft()

    @staticmethod
    def _packed(refs: list[dict[str, Any] | None], fg: _Frag | None) -> bool:
        """Whether a folder's new blobs all have their pack refs (its fragment's pack formed)."""
        return None not in refs and (fg is None or fg.pack is not None)

    def run(self) -> _Result:
        try:
            self._look_ahead()
            top = self.visit("", self.root, "", None)
            stack = [top]
            self._list_ahead(stack)
            done: deque[_Folder] = deque()  # walked (post-order), not finished yet
            while stack:
                fr = stack[-1]
                if fr.next_sub < len(fr.subdirs):
                    name, path = fr.subdirs[fr.next_sub]
                    fr.next_sub += 1
                    stack.append(self.visit(f"{fr.rel}/{name}" if fr.rel else name, path, name, fr))
                    self._list_ahead(stack)
                    continue
                stack.pop()
                done.append(fr)
                self._settle(done, final=not stack)
            self.drain(force=True)
            for job in self.blob_jobs:
                job.result()  # recorded before the transaction commits (or an error of theirs raised)
            return self.last
        finally:
            if self.blob_pool is not None:
                self.blob_pool.shutdown(wait=True)  # nothing writes the stat cache once the walk ends
            self.small_pool.shutdown(wait=True, cancel_futures=True)
            self.pool.shutdown(wait=True, cancel_futures=True)
            if self.procs is not None:
                self.procs.shutdown(wait=True, cancel_futures=True)

    def _settle(self, done: deque[_Folder], *, final: bool) -> None:
        """Finish walked folders, oldest first (children before their parent).

        While other processes read the files, a folder is finished once its files are in,
        and the walk lists the next folders meanwhile (up to LOOKAHEAD files queued), so
        listing and reading overlap. Threads alone finish each folder at once: two threads
        of Python taking turns with the interpreter lock are slower than one waiting."""
        lookahead = LOOKAHEAD if self.procs is not None and self.small_sent > PROCESS_MIN else 0
        while done:
            fr = done[0]
            if not final and self.queued <= lookahead and not all(job.done() for job in fr.jobs):
                return
            done.popleft()
            result = self.finish(fr)
            self.queued -= fr.queued
            fr.queued = 0
            if fr.parent is not None:
                fr.parent.children[fr.name] = result
            self.last = result
            self.drain()
            if self.waiting > WAITING_MAX and self.up.pending():
                self.up.flush_now()
                self.drain()


def _keep_link(fr: _Folder, f: Found, target: str) -> None:
    """Record a symlink of the folder as found: its target is all there is to it."""
    fname = f.path.rpartition("/")[2]
    fr.kept[fname] = {"path": f.path, "type": "symlink", "target": target}
    fr.keys[fname] = target


def _reads(frag: Fragment, prefix: str) -> dict[str, Read]:
    """What a fragment's files read, by path, for the walk to take them one by one."""
    out: dict[str, Read] = {}
    for t, i in zip(frag.files, frag.blob_of, strict=True):
        if i is None:
            out[prefix + t[0]] = None
        elif i < 0:
            out[prefix + t[0]] = (digest(b""), b"")
        else:
            h, at, n = frag.blobs[i]
            out[prefix + t[0]] = (h, frag.body[at:at + n])
    return out


def _pending_by_folder(copy: WorkspaceCopy, version: int) -> dict[str, dict[str, FileEntry]]:
    from jupyter_portable.workdir.pending import read_pending

    pending_version, pending = read_pending(copy)
    out: dict[str, dict[str, FileEntry]] = {}
    if pending_version == version:
        for e in pending:
            folder, _, name = e.path.rpartition("/")
            out.setdefault(folder, {})[name] = e
    return out


def _count(store: Store, root: str | None, path: str) -> tuple[int, int]:
    if root is None:
        return 0, 0
    n = b = 0
    for e in iter_under(store, root, path):
        n += 1
        b += e.size
    return n, b


def snapshot(copy: WorkspaceCopy, store: Store, *, message: str = "", force: bool = False,
             progress: Progress | None = None, extras: Extras | None = None) -> SnapshotResult:
    """Publish the copy's files as the workspace's next version (or report no change)."""
    cfg: CopyConfig = copy.read_config()
    progress = progress or Progress("snapshot")
    ws = cfg.workspace_id
    head, _ = store.read_head(ws)
    cfg = adopt_published(copy, cfg, head.version, head.manifest)
    if head.epoch > cfg.epoch:
        raise FencedError(
            f"workspace {ws} was claimed by a newer allocation (epoch {head.epoch}, this copy holds "
            f"{cfg.epoch}); this copy can no longer publish",
            hint="restore the workspace afresh to continue from its latest version")
    if head.version != cfg.version and not force:
        raise ConflictError(
            f"workspace {ws} is at version {head.version} but this copy is based on version {cfg.version}",
            hint=CONFLICT_HINT)
    base_version = head.version if force else cfg.version
    extras = extras or Extras()
    started_ns = time.time_ns()
    progress.set_stage("scanning")
    base_manifest = store.read_manifest(ws, base_version) if base_version else None
    # A schema-1 base gets trees now (the upgrade); a schema-2 base is read folder by folder.
    base_root = as_tree(store, base_manifest)[0] if base_manifest is not None else None
    base = BaseTree(store, base_root)
    up = _Uploader(store, 8 if store.url.startswith("s3") else 2, progress)
    try:
        cache = StatCache(copy.meta)
        cache.open()
    except sqlite3.Error as exc:
        raise PortableError(f"cannot open the stat cache in {copy.meta}: {exc}",
                            hint="delete .portable/statcache.sqlite (it is only a cache)") from exc
    try:
        cache.begin()
        usable = (not force and base_manifest is not None and base_manifest.tree is not None
                  and cache.valid_for(cfg.version))
        fingerprint_same = usable and cache.fingerprint() == extras.fingerprint
        if not usable:
            cache.clear()
        up.blobs = cache.blob_reader()
        walk = _Walk(copy, store, cache, usable, base, up, progress, started_ns,
                     _pending_by_folder(copy, cfg.version))
        try:
            top = walk.run()
        except BaseException:
            up.pool.shutdown(wait=False, cancel_futures=True)
            raise
        skipped, special = walk.skipped, walk.special
        if (top.unchanged and fingerprint_same and extras.before_publish is None and not extras.allocations
                and base_manifest is not None):
            # Every file's size, mtime, ctime and inode (every link's target) are as
            # recorded for the base version: nothing changed, nothing to read. The signatures
            # of folders listed with care this time are kept, so the next run trusts them.
            up.pool.shutdown()
            cache.commit()
            progress.done(f"no changes since version {base_version} ({top.files} files, {human_bytes(top.bytes)})")
            return SnapshotResult(ws, base_version, top.files, top.bytes, 0, False, [], 0, special)
        progress.set_stage("uploading")
        up.finish()
        cache.add_blobs(up.take_formed())
        assert top.tree is not None
        root, files, total = top.tree, top.files, top.bytes

        new_checkpoints: list[dict[str, Any]] = []
        if extras.before_publish is not None:
            rel = getattr(extras.before_publish, "rel", None)
            mine = iter_under(store, root, rel) if isinstance(rel, str) else store.iter_files(root)
            entries: dict[str, Any] = {e.path: e for e in mine}
            new_checkpoints, revert = extras.before_publish(entries, base_manifest)
            for path in revert:  # back to what the base version had there, or absent
                was_n, was_b = _count(store, root, path)
                now_n, now_b = _count(store, base_root, path)
                root = replace_at(store, root, path, base.node(path))
                files, total = files - was_n + now_n, total - was_b + now_b
                _forget(cache, path)
        unchanged = (base_manifest is not None and base_manifest.tree is not None and root == base_root
                     and not new_checkpoints and not extras.allocations)
        runtime = base_manifest.runtime if base_manifest else None
        if extras.runtime is not None:
            runtime = extras.runtime(base_manifest)
            if base_manifest is not None and runtime != base_manifest.runtime:
                unchanged = False
        if unchanged and not force:
            cache.set_version(base_version, extras.fingerprint)
            cache.commit()
            progress.done(f"no changes since version {base_version} ({files} files, {human_bytes(total)})")
            return SnapshotResult(ws, base_version, files, total, up.new_bytes, False, sorted(skipped),
                                  walk.hashed, special)

        head, _ = store.read_head(ws)
        parent = None
        if base_version:
            if head.version == base_version and head.manifest:
                parent = ParentRef(base_version, head.manifest)
            else:
                raise ConflictError(f"workspace {ws} moved to version {head.version} during the snapshot",
                                    hint=CONFLICT_HINT)
        manifest = Manifest.with_tree(
            root, files, total, store,
            workspace_id=ws, version=base_version + 1, created=now_iso(),
            parent=parent, message=message, epoch=cfg.epoch,
            checkpoints=(base_manifest.checkpoints if base_manifest else ()) + tuple(new_checkpoints),
            runtime=runtime,
            next_action=extras.next_action if extras.next_action is not None
            else (base_manifest.next_action if base_manifest else None),
            allocations=_merge_allocations(base_manifest.allocations if base_manifest else (), extras.allocations),
        )
        progress.set_stage("publishing")
        # Say what we are about to publish, so a copy killed right after the head moved
        # recognises the new version as its own (see adopt_published) instead of a conflict.
        copy.write_intent(manifest.version, digest(manifest.to_bytes()))
        store.publish(manifest, expected_version=base_version, epoch=cfg.epoch)
        cfg.version = manifest.version
        copy.write_config(cfg)
        copy.clear_intent()
        cache.set_version(manifest.version, extras.fingerprint)
        cache.commit()
    except BaseException:
        try:
            cache.rollback()
        except sqlite3.Error:
            pass
        raise
    finally:
        if up.blobs is not None:
            up.blobs.close()
        cache.close()
    progress.done(f"published version {manifest.version}: {files} files, {human_bytes(total)}, "
                  f"{human_bytes(up.new_bytes)} new"
                  + (f"; {len(skipped)} file(s) changed while read, left for the next snapshot"
                     if skipped else ""))
    result = SnapshotResult(ws, manifest.version, files, total, up.new_bytes, True, sorted(skipped),
                            walk.hashed, special)
    result.tree_bytes = up.tree_bytes
    return result


def _forget(cache: StatCache, path: str) -> None:
    """Make the next snapshot look at ``path`` again (its folders' trees are no longer the cached ones)."""
    dir_id = ROOT
    cache.set_folder(ROOT, None, 0, 0)
    for name in path.split("/")[:-1]:
        got = cache.child(dir_id, name)
        if got is None:
            return
        dir_id = got[0]
        cache.set_folder(dir_id, None, 0, 0)
    leaf = cache.child(dir_id, path.rpartition("/")[2])
    if leaf is not None:
        cache.drop_folder(leaf[0])
    cache.add_rows(dir_id, [(path.rpartition("/")[2], None)])


def _merge_allocations(old: tuple[dict[str, Any], ...], new: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    out = list(old)
    for record in new:
        for i, prev in enumerate(out):
            if prev.get("allocation_id") == record.get("allocation_id"):
                out[i] = record
                break
        else:
            out.append(record)
    return tuple(out)


def adopt_published(copy: WorkspaceCopy, cfg: CopyConfig, head_version: int, head_manifest: str | None) -> CopyConfig:
    """If this copy died between moving the head and recording it, record it now."""
    intent = copy.read_intent()
    if intent is None:
        return cfg
    version, mhash = intent
    if head_version == version and head_manifest == mhash and cfg.version == version - 1:
        cfg.version = version
        copy.write_config(cfg)
    copy.clear_intent()
    return cfg


def publish_records(store: Store, workspace_id: str, *, epoch: int, allocations: list[dict[str, Any]],
                    message: str, tries: int = 8) -> int:
    """Publish the head's files again with ``allocations`` merged into its history: a
    version that records what happened to machines without touching any file.

    Used by whoever holds the lease when no worker copy can publish (the orchestration
    after a loss, a failed Continue or a release). Retries when another writer moved the
    head first; FencedError when the head's epoch is newer than ``epoch``. Returns the
    published version.
    """
    for _attempt in range(tries):
        head, _ = store.read_head(workspace_id)
        base = store.read_manifest(workspace_id, head.version) if head.version else None
        if head.epoch > epoch:
            raise FencedError(f"workspace {workspace_id} was claimed by a newer allocation (epoch {head.epoch}, "
                              f"this writer holds {epoch}); it can no longer publish")
        # The same tree as the head (written now if the head is schema 1): no file is read or sent.
        root, files, total = as_tree(store, base) if base else write_trees(store, ())
        manifest = Manifest.with_tree(
            root, files, total, store,
            workspace_id=workspace_id, version=head.version + 1, created=now_iso(),
            message=message, epoch=epoch,
            parent=ParentRef(head.version, head.manifest) if base and head.manifest else None,
            checkpoints=base.checkpoints if base else (), runtime=base.runtime if base else None,
            next_action=base.next_action if base else None,
            allocations=_merge_allocations(base.allocations if base else (), allocations))
        try:
            store.publish(manifest, expected_version=head.version, epoch=epoch)
        except FencedError:
            raise
        except ConflictError:
            continue
        return manifest.version
    raise ConflictError(f"workspace {workspace_id}: other writers kept moving the head; the record was not published",
                        hint="try again")
