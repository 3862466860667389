"""The uploader: new small blobs joined into packs, large files' parts, and tree objects,
all written to the store by a few threads within a budget of bytes not yet durable.

Both savers hand it their bytes: the file saver its blobs, parts and folder fragments, the
tree saver its trees. A blob's pack ref is known once its pack is formed (:meth:`Uploader.refs`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import blake3

from jupyter_portable.core import hooks
from jupyter_portable.core.manifest import PackIndex
from jupyter_portable.core.tree_object import pack_ref_text
from jupyter_portable.engine.hashproc import Fragment
from jupyter_portable.engine.progress import Progress
from jupyter_portable.engine.snapshot.options import DEFAULT, Options
from jupyter_portable.store.repo import Store, digest, object_key
from jupyter_portable.workdir.statcache import BlobReader

# How long a request already on its way waits, in all, at the gate (its body half sent, or its
# answer half read): longer and the service may end it (S3 ends a request whose body stalls for
# about 20 s), which would cost sending the part again. Requests not yet sent wait the whole pause.
WITHIN_REQUEST_S = 10.0


def _within_request(gate: Callable[..., None] | None) -> Callable[[], None] | None:
    """``gate`` for one request on its way: its waits bounded together by ``WITHIN_REQUEST_S``."""
    if gate is None:
        return None
    left = [WITHIN_REQUEST_S]

    def hold() -> None:
        if left[0] > 0:
            t0 = time.monotonic()
            gate(left[0])
            left[0] -= time.monotonic() - t0

    return hold


class Frag:
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


class Uploader:
    """Packs new small blobs, uploads packs and parts concurrently, within a byte budget."""

    def __init__(self, store: Store, workers: int, progress: Progress, opts: Options = DEFAULT) -> None:
        self.store = store
        self.opts = opts
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="portable-upload")
        self.progress = progress
        self.futures: list[Future[None]] = []
        self.new_bytes = 0
        self._budget = threading.Condition()
        self._inflight = 0
        self._lock = threading.Lock()
        self._buf: list[tuple[str, bytes] | Frag] = []
        self._buf_size = 0
        # blob hash -> pack ref of this run's packs, the newest ``packed_keep`` kept (for
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
        # A checkpoint's folder or file (its snapshot sets it): its parts are read back as they are
        # written, and those that hashed equal to their names are kept in ``read_back``.
        self.read_back_under: str | None = None
        self.read_back: set[str] = set()
        # called before each part's write and read-back, and (given a bound in seconds) within
        # them: a checkpoint's upload waits there while the trainer saves
        # (engine/checkpoint/background.py, ``pause``)
        self.gate: Callable[..., None] | None = None

    def _reserve(self, n: int) -> None:
        with self._budget:
            while self._inflight and self._inflight + n > self.opts.inflight_max:
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
                written = fn(*args)  # the bytes it wrote, or None for all of them
                sent = nbytes if written is None else written
                with self._lock:
                    self.new_bytes += sent
                self.progress.add(uploaded=sent)
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

    def _queue(self, item: tuple[str, bytes] | Frag, size: int) -> list[tuple[str, bytes] | Frag] | None:
        """Buffer ``item`` (under the lock); what to form a pack of now, if the buffer is full."""
        self._buf.append(item)
        self._buf_size += size
        if self._buf_size < self.opts.pack_target:
            return None
        flush, self._buf, self._buf_size = self._buf, [], 0
        return flush

    def add_fragment(self, frag: Frag) -> bool:
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

    def _flush(self, blobs: list[tuple[str, bytes] | Frag]) -> None:
        body = b"".join([b[1] if isinstance(b, tuple) else b.body for b in blobs])
        ph = digest(body)
        entries: list[tuple[str, int, int]] = []
        off = 0
        with self._lock:
            for b in blobs:
                if isinstance(b, Frag):
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
            while len(self.packed) > self.opts.packed_keep:
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
            if len(self._trees) < self.opts.tree_batch and self._trees_size < self.opts.pack_target:
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
                    self.store.backend.write_blobs(fresh)
                    with self._lock:
                        self.tree_bytes += sum(len(b) for _k, b in fresh)
            finally:
                self._release(nbytes)

        self.futures.append(self.pool.submit(run))

    def add_part(self, h: str, data: bytes, known: set[str], path: str = "") -> None:
        with self._lock:
            if h in known or h in self._parts_seen:
                return
            self._parts_seen.add(h)
        self._submit(len(data), self._write_part, h, data, self._reads_back(path))

    def _reads_back(self, path: str) -> bool:
        under = self.read_back_under
        return under is not None and (path == under or path.startswith(under + "/"))

    def _write_part(self, h: str, data: bytes, read_back: bool = False) -> int:
        """Store a part unless the store has it (a renamed or copied file); the bytes written.
        A checkpoint's part is read back as soon as it is written, beside the parts still going
        up, and hashed against its name (``read_back``: the parts that held)."""
        gate = self.gate
        if gate is not None:
            gate()
        if self.store.has_object(h):
            return 0
        if not read_back:
            self.store.backend.write_blob(object_key(h), data)
            return len(data)
        # its read-back below is its check: the service's own checksum would say it again
        self.store.backend.write_part(object_key(h), data, hold=_within_request(gate))
        if gate is not None:
            gate()
        hooks.before_readback(self.store, [object_key(h)])
        back = blake3.blake3()
        for piece in self.store.backend.read_pieces(object_key(h), hold=_within_request(gate)):
            back.update(piece)
        if back.hexdigest() == h:
            with self._lock:
                self.read_back.add(h)
        return len(data)

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


