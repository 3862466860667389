"""Snapshot: walk, hash what changed, upload what the store lacks, then publish.

Order (invariant 2): pack objects and parts, then pack indexes, then the manifest,
then the head by compare-and-swap. A file whose size or mtime moves while it is read
is not published this time; its previous version (if any) stays.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3

from jupyter_portable.core.errors import ConflictError, FencedError, PortableError
from jupyter_portable.core.manifest import FileEntry, Manifest, PackIndex, ParentRef
from jupyter_portable.core.times import now_iso
from jupyter_portable.engine.progress import Progress, human_bytes
from jupyter_portable.engine.scan import Found, scan
from jupyter_portable.store.repo import CONFLICT_HINT, Store, digest, object_key
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

SMALL_MAX = 512 * 1024  # files below this are packed
PART_SIZE = 16 * 1024 * 1024  # large files are stored in parts of this size
PACK_TARGET = 8 * 1024 * 1024  # a pack is flushed once it holds this much
INFLIGHT_MAX = 256 * 1024 * 1024  # bytes read but not yet durable
RACY_NS = 2_000_000_000  # files modified this recently are re-hashed next time
BATCH = 128  # small files per hashing task
PERMS = 0o777  # setuid, setgid and sticky bits are never recorded or restored


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
        self._buf: list[tuple[str, bytes]] = []
        self._buf_size = 0
        self.packed: dict[str, dict[str, Any]] = {}  # blob hash -> pack ref, this run
        self._pending_blobs: set[str] = set()
        self._parts_seen: set[str] = set()

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
        flush = None
        with self._lock:
            if h in self._pending_blobs or h in self.packed:
                return
            self._pending_blobs.add(h)
            self._buf.append((h, data))
            self._buf_size += len(data)
            if self._buf_size >= PACK_TARGET:
                flush, self._buf, self._buf_size = self._buf, [], 0
        if flush:
            self._flush(flush)

    def _flush(self, blobs: list[tuple[str, bytes]]) -> None:
        body = b"".join(d for _, d in blobs)
        ph = digest(body)
        entries: list[tuple[str, int, int]] = []
        off = 0
        with self._lock:
            for h, d in blobs:
                self.packed[h] = {"id": ph, "offset": off, "length": len(d)}
                entries.append((h, off, len(d)))
                off += len(d)
        index = PackIndex(ph, len(body), tuple(entries))
        self._submit(len(body), self.store.write_pack, index, body)

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
        """Flush the last pack and wait until every object is durable; re-raise failures."""
        with self._lock:
            rest, self._buf, self._buf_size = self._buf, [], 0
        if rest:
            self._flush(rest)
        try:
            for fut in self.futures:
                fut.result()
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _Unstable(Exception):
    """The file changed while it was being read."""


def _same(st: os.stat_result, fst: os.stat_result) -> bool:
    return st.st_size == fst.st_size and st.st_mtime_ns == fst.st_mtime_ns


def _hash_small(root: str, f: Found, up: _Uploader, known_blobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    with open(os.path.join(root, f.path), "rb") as fh:
        data = fh.read()
        if len(data) != f.st.st_size or not _same(f.st, os.fstat(fh.fileno())):
            raise _Unstable(f.path)
    h = digest(data)
    entry: dict[str, Any] = {"path": f.path, "type": "file", "size": len(data),
                             "mode": f.st.st_mode & PERMS, "hash": h, "mtime_ns": f.st.st_mtime_ns}
    if not data:
        entry["parts"] = []
    elif h in known_blobs:
        entry["pack"] = known_blobs[h]
    else:
        up.add_blob(h, data)
        entry["pack"] = None  # filled in once the pack is flushed
    return entry


def _hash_large(root: str, f: Found, up: _Uploader, known_parts: set[str]) -> dict[str, Any]:
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


def _all_unchanged(keys: dict[str, Any], found: list[Found]) -> bool:
    """Every file's stat matches the cache (the hot loop of a no-change snapshot: no lists built)."""
    get = keys.get
    for f in found:
        k = get(f.path)
        if f.target is not None:
            if k != f.target:
                return False
            continue
        st = f.st
        if (k is None or k.__class__ is not list or k[0] != st.st_size or k[1] != st.st_mtime_ns
                or k[2] != st.st_ctime_ns or k[3] != st.st_ino):
            return False
    return True


Entry = dict[str, Any] | FileEntry  # a new entry (dict) or one kept from the base version


def _identity(e: Entry) -> tuple[Any, ...]:
    """What makes two entries the same version of a path (mtime alone does not)."""
    if isinstance(e, FileEntry):
        return ("symlink", None, None, e.target) if e.target is not None else ("file", e.hash, e.mode, None)
    return (e.get("type"), e.get("hash"), e.get("mode"), e.get("target"))


def _size(e: Entry) -> int:
    return e.size if isinstance(e, FileEntry) else int(e.get("size", 0))


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

    started_ns = time.time_ns()
    progress.set_stage("scanning")
    scanned = scan(copy.root)
    found = scanned.found
    special = [{"path": path, "kind": kind} for path, kind in scanned.special]
    extras = extras or Extras()
    keys = copy.read_statcache(cfg.version, extras.fingerprint) if not force else None
    if keys is not None and base_version and extras.before_publish is None and not extras.allocations \
            and len(keys) == len(found) and _all_unchanged(keys, found):
        # Every file's size, mtime, ctime and inode (every link's target) are as
        # recorded for the base version: nothing changed, nothing to read.
        total = sum(f.st.st_size for f in found if f.target is None)
        progress.done(f"no changes since version {base_version} ({len(found)} files, {human_bytes(total)})")
        return SnapshotResult(ws, base_version, len(found), total, 0, False, [], 0, special)
    keys = keys or {}
    base_manifest = store.read_manifest(ws, base_version) if base_version else None
    # Entries of the base version stay FileEntry objects (validated when read); new ones are dicts.
    base: dict[str, FileEntry] = base_manifest.by_path() if base_manifest else {}

    entries: dict[str, Entry] = {}
    new_stats: dict[str, list[int] | str | None] = {}
    todo_small: list[Found] = []
    todo_large: list[Found] = []
    for f in found:
        key = f.key
        prev = base.get(f.path)
        if f.target is not None:
            entries[f.path] = {"path": f.path, "type": "symlink", "target": f.target}
            new_stats[f.path] = key
        elif prev is not None and prev.target is None and keys.get(f.path) == key:
            entries[f.path] = prev
            new_stats[f.path] = key
        elif f.st.st_size < SMALL_MAX:
            todo_small.append(f)
        else:
            todo_large.append(f)

    skipped: list[str] = []
    workers = max(2, min(8, (os.cpu_count() or 2) * 2))
    up = _Uploader(store, 8 if store.url.startswith("s3") else 2, progress)
    if todo_small or todo_large:
        known_blobs: dict[str, dict[str, Any]] = {}
        known_parts: set[str] = set()
        for e in base.values():
            if e.pack is not None:
                known_blobs[e.hash] = {"id": e.pack.pack, "offset": e.pack.offset, "length": e.pack.length}
            for h, _n in e.parts:
                known_parts.add(h)
        progress.files_total = len(todo_small) + len(todo_large)
        progress.bytes_total = sum(f.st.st_size for f in todo_small) + sum(f.st.st_size for f in todo_large)
        progress.set_stage("hashing")
        root = str(copy.root)
        lock = threading.Lock()

        def do_small(batch: list[Found]) -> None:
            for f in batch:
                try:
                    e = _hash_small(root, f, up, known_blobs)
                except (_Unstable, FileNotFoundError):
                    with lock:
                        skipped.append(f.path)
                    continue
                with lock:
                    entries[f.path] = e
                    new_stats[f.path] = f.key
                progress.add(files=1, nbytes=f.st.st_size)

        def do_large(f: Found) -> None:
            try:
                e = _hash_large(root, f, up, known_parts)
            except (_Unstable, FileNotFoundError):
                with lock:
                    skipped.append(f.path)
                return
            with lock:
                entries[f.path] = e
                new_stats[f.path] = f.key
            progress.add(files=1)

        with ThreadPoolExecutor(workers, thread_name_prefix="portable-hash") as pool:
            futs = [pool.submit(do_large, f) for f in todo_large]
            futs += [pool.submit(do_small, todo_small[i:i + BATCH]) for i in range(0, len(todo_small), BATCH)]
            try:
                for fut in futs:
                    fut.result()
            except BaseException:
                up.pool.shutdown(wait=False, cancel_futures=True)
                raise
        progress.set_stage("uploading")
        up.finish()
        for new in entries.values():
            if isinstance(new, dict) and "pack" in new and new["pack"] is None:
                new["pack"] = up.packed[new["hash"]]
    else:
        up.pool.shutdown()

    # Files a lazy restore has not fetched yet are part of the copy, just not here yet.
    from jupyter_portable.workdir.pending import read_pending

    pending_version, pending = read_pending(copy)
    if pending_version == cfg.version:
        for e in pending:
            if e.path not in entries:
                entries[e.path] = e
                new_stats[e.path] = None
    # A file that changed while read keeps its previous version, if it had one.
    for path in skipped:
        if path in base:
            entries[path] = base[path]
            new_stats[path] = None

    new_checkpoints: list[dict[str, Any]] = []
    if extras.before_publish is not None:
        new_checkpoints, revert = extras.before_publish(entries, base_manifest)
        for path in revert:  # back to what the base version had there, or absent
            for p in [p for p in entries if p == path or p.startswith(path + "/")]:
                del entries[p]
                new_stats.pop(p, None)
            for p in [p for p in base if p == path or p.startswith(path + "/")]:
                entries[p] = base[p]

    ordered = [entries[p] for p in sorted(entries)]
    total = sum(_size(e) for e in ordered)
    unchanged = (bool(base_version) and not new_checkpoints and not extras.allocations
                 and len(ordered) == len(base)
                 and all(p in base and _identity(base[p]) == _identity(entries[p]) for p in entries))
    runtime = base_manifest.runtime if base_manifest else None
    if extras.runtime is not None:
        runtime = extras.runtime(base_manifest)
        if base_manifest is not None and runtime != base_manifest.runtime:
            unchanged = False
    if unchanged and not force:
        version = base_version
        _write_cache(copy, version, entries, new_stats, started_ns, extras.fingerprint)
        progress.done(f"no changes since version {version} ({len(ordered)} files, {human_bytes(total)})")
        return SnapshotResult(ws, version, len(ordered), total, up.new_bytes, False, sorted(skipped),
                              len(todo_small) + len(todo_large), special)

    # Carry the records later layers keep (checkpoints, runtime, ...) forward.
    head, _ = store.read_head(ws)
    parent = None
    if base_version:
        assert base_manifest is not None
        if head.version == base_version and head.manifest:
            parent = ParentRef(base_version, head.manifest)
        else:
            raise ConflictError(f"workspace {ws} moved to version {head.version} during the snapshot",
                                hint=CONFLICT_HINT)
    manifest = Manifest(
        workspace_id=ws, version=base_version + 1, created=now_iso(),
        files=tuple(e if isinstance(e, FileEntry) else FileEntry.from_json(e) for e in ordered),
        parent=parent, message=message,
        epoch=cfg.epoch,
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
    _write_cache(copy, manifest.version, entries, new_stats, started_ns, extras.fingerprint)
    progress.done(f"published version {manifest.version}: {len(ordered)} files, {human_bytes(total)}, "
                  f"{human_bytes(up.new_bytes)} new"
                  + (f"; {len(skipped)} file(s) changed while read, left for the next snapshot"
                     if skipped else ""))
    return SnapshotResult(ws, manifest.version, len(ordered), total, up.new_bytes, True, sorted(skipped),
                          len(todo_small) + len(todo_large), special)


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


def _write_cache(copy: WorkspaceCopy, version: int, entries: dict[str, Entry],
                 stats: dict[str, list[int] | str | None], started_ns: int, fingerprint: str | None) -> None:
    out: dict[str, list[int] | str | None] = {}
    for path in entries:
        key = stats.get(path)
        if isinstance(key, list) and key[1] >= started_ns - RACY_NS:
            key = None  # too fresh to trust: a write in the same clock tick would be missed
        out[path] = key
    try:
        copy.write_statcache(version, out, fingerprint)
    except OSError as exc:
        raise PortableError(f"cannot write the stat cache in {copy.meta}: {exc.strerror}") from exc


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
        manifest = Manifest(
            workspace_id=workspace_id, version=head.version + 1, created=now_iso(),
            files=base.files if base else (), message=message, epoch=epoch,
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
