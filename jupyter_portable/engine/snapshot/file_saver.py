"""The file saver: reads and hashes the files the scanner found changed, and hands their
bytes to the uploader (a small file's blob for a pack, a large file's parts).

Large files are read in a pool of threads (reads and hashing of big buffers leave the
interpreter lock); small ones in one thread beside the walk, and once a run has many of
them, in other processes (``hashproc``). A folder's jobs are futures on its
:class:`Folder`; the tree saver takes their entries when it finishes the folder.
"""

from __future__ import annotations

import os
import stat as statmod
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import blake3

from jupyter_portable.core.manifest import FileEntry, PackRef
from jupyter_portable.core.tree_object import Node
from jupyter_portable.engine.hashproc import PERMS, Fragment, Read, helper_pool, read_small, read_whole
from jupyter_portable.engine.listing import Found, Stat
from jupyter_portable.engine.progress import Progress
from jupyter_portable.engine.snapshot.context import Context
from jupyter_portable.engine.snapshot.folder import Entry, Folder
from jupyter_portable.engine.snapshot.uploader import Frag, Uploader
from jupyter_portable.store.repo import digest
from jupyter_portable.workdir.statcache import changed, stat_key

RETRIES = 2  # reads again of a file that changed while it was read, before it is left for the next snapshot


class _Unstable(Exception):
    """The file changed while it was being read."""


def _pack_json(ref: PackRef) -> dict[str, Any]:
    return {"id": ref.pack, "offset": ref.offset, "length": ref.length}


def _hash_small(root: str, f: Found, up: Uploader, prev: FileEntry | None) -> dict[str, Any]:
    data, fst = read_whole(os.path.join(root, f.path), f.st.st_size)
    if len(data) != f.st.st_size or changed(stat_key(f.st), fst):
        raise _Unstable(f.path)
    return _small_entry(f, digest(data), data, up, prev)


def _small_entry(f: Found, h: str, data: bytes, up: Uploader, prev: FileEntry | None) -> dict[str, Any]:
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


def _hash_large(root: str, f: Found, up: Uploader, prev: FileEntry | None, part_size: int) -> dict[str, Any]:
    known_parts = {h for h, _n in prev.parts} if prev is not None else set()
    whole = blake3.blake3()
    parts: list[list[Any]] = []
    with open(os.path.join(root, f.path), "rb") as fh:
        while True:
            data = fh.read(part_size)
            if not data:
                break
            whole.update(data)
            h = blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()
            parts.append([h, len(data)])
            up.add_part(h, data, known_parts, f.path)
            up.progress.add(nbytes=len(data))
        if sum(n for _, n in parts) != f.st.st_size or changed(stat_key(f.st), os.fstat(fh.fileno())):
            raise _Unstable(f.path)
    return {"path": f.path, "type": "file", "size": f.st.st_size, "mode": f.st.st_mode & PERMS,
            "hash": whole.hexdigest(), "mtime_ns": f.st.st_mtime_ns, "parts": parts}


def fragment_reads(frag: Fragment, prefix: str) -> dict[str, Read]:
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


class FileSaver:
    """Reads and hashes one snapshot's changed files; counts what it was given to read."""

    def __init__(self, ctx: Context, progress: Progress, first: bool) -> None:
        self.ctx = ctx
        self.progress = progress
        # nothing stored before to compare files with: folders listed ahead are taken whole
        self.first = first
        self.hashed = 0
        self.queued = 0  # files sent to be hashed, in folders not finished yet
        # Large files in parallel (reads and hashing of big buffers leave the interpreter lock);
        # small ones in one thread beside the walk: their cost is Python's, so more threads only
        # take turns with the lock (8 threads spent half the CPU time in the kernel doing that).
        workers = max(2, min(8, (os.cpu_count() or 2) * 2))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="portable-hash")
        self.small_pool = ThreadPoolExecutor(1, thread_name_prefix="portable-hash-small")
        # Once a run has many small files to read, they are read and hashed in other processes.
        self.procs: ProcessPoolExecutor | None = None
        self.procs_failed = (os.cpu_count() or 1) < 2
        self.small_sent = 0

    def shutdown(self) -> None:
        self.small_pool.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.procs is not None:
            self.procs.shutdown(wait=True, cancel_futures=True)

    def _hash_batch(self, batch: list[tuple[Found, FileEntry | None]]) -> list[tuple[Found, Entry | None]]:
        out: list[tuple[Found, Entry | None]] = []
        ctx = self.ctx
        for f, prev in batch:
            for attempt in range(RETRIES + 1):
                try:
                    if f.st.st_size < ctx.opts.small_max:
                        e = _hash_small(ctx.root, f, ctx.up, prev)
                        self.progress.add(files=1, nbytes=f.st.st_size)
                    else:
                        e = _hash_large(ctx.root, f, ctx.up, prev, ctx.opts.part_size)
                        self.progress.add(files=1)
                    out.append((f, e))
                    break
                except FileNotFoundError:
                    out.append((f, None))
                    break
                except _Unstable:
                    again = self._again(f) if attempt < RETRIES else None
                    if again is None:
                        out.append((f, None))  # left for the next snapshot: reported as skipped
                        break
                    f = again
        return out

    def _again(self, f: Found) -> Found | None:
        """The file as it is now, to be read again (None: gone, or no longer a regular file)."""
        try:
            st = os.lstat(os.path.join(self.ctx.root, f.path))
        except OSError:
            return None
        if not statmod.S_ISREG(st.st_mode):
            return None
        return Found(f.path, st)

    def submit(self, fr: Folder, todo: list[Found], nodes: dict[str, Node] | None,
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
        small_max, step = self.ctx.opts.small_max, self.ctx.opts.batch
        small = [p for p in pairs if p[0].st.st_size < small_max]
        large = [p for p in pairs if p[0].st.st_size >= small_max]
        fr.jobs += [self.pool.submit(self._hash_batch, [p]) for p in large]
        self.small_sent += len(small)
        if reads:  # read with the folder's listing: only their entries are left to make
            ready = [p for p in small if p[0].path in reads]
            small = [p for p in small if p[0].path not in reads] if len(ready) < len(small) else []
            for i in range(0, len(ready), step):
                batch = ready[i:i + step]
                fr.jobs.append(self.small_pool.submit(self._entries, batch, [reads[f.path] for f, _p in batch]))
        procs = self.process_pool() if self.small_sent > self.ctx.opts.process_min else None
        for i in range(0, len(small), step):
            batch = small[i:i + step]
            if procs is not None:
                try:
                    sent = procs.submit(read_small, self.ctx.root, [(f.path, *stat_key(f.st)) for f, _p in batch])
                except (BrokenProcessPool, RuntimeError, OSError):
                    procs = None
                    self.procs_failed = True
                else:
                    fr.jobs.append(self.small_pool.submit(self.take_read, batch, sent))
                    continue
            fr.jobs.append(self.small_pool.submit(self._hash_batch, batch))

    def process_pool(self) -> ProcessPoolExecutor | None:
        if self.procs is None and not self.procs_failed:
            # A first snapshot's helpers do nearly all of its work (see _fragment): they get every
            # core. Otherwise the walk takes each file in turn and keeps a core of its own.
            self.procs = helper_pool(spare_one=not self.first)
            self.procs_failed = self.procs is None  # no second process here: threads do it all
        return self.procs

    def take_read(self, batch: list[tuple[Found, FileEntry | None]],
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
        up = self.ctx.up
        for (f, prev), read in zip(batch, got, strict=True):
            if read is None:  # gone, or changed while read elsewhere: read again here
                again = self._again(f)
                out += self._hash_batch([(again, prev)]) if again is not None else [(f, None)]
            else:
                out.append((f, _small_entry(f, read[0], read[1], up, prev)))
                nbytes += len(read[1])
        self.progress.add(files=len(batch), nbytes=nbytes)
        return out

    def fragment(self, fr: Folder, frag: Fragment) -> None:
        """Take the files a helper read and wrote the entries of: their blobs join a pack (in
        turn with the other small files, on the same thread) and their rows are kept."""
        fg = fr.frag = Frag(frag, f"{fr.rel}/" if fr.rel else "")
        n = len(frag.files)
        self.progress.files_total += n
        self.progress.bytes_total += sum(t[2] for t in frag.files)
        self.hashed += n
        fr.queued += n
        self.queued += n
        self.small_sent += n
        fr.jobs.append(self.small_pool.submit(self._take_fragment, fr, fg, frag))

    def _take_fragment(self, fr: Folder, fg: Frag, frag: Fragment) -> list[tuple[Found, Entry | None]]:
        if self.ctx.up.add_fragment(fg):
            self.progress.add(files=len(frag.files), nbytes=fg.nbytes)
            return []
        # a blob of it is this run's already (the same file in another folder): file by file
        fr.frag = None
        prefix = f"{fr.rel}/" if fr.rel else ""
        reads = fragment_reads(frag, prefix)
        batch: list[tuple[Found, FileEntry | None]] = [(Found(prefix + name, Stat(*st)), None)
                                                       for name, *st in frag.files]
        return self._entries(batch, [reads[f.path] for f, _p in batch])

