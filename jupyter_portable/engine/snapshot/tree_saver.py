"""The tree saver: a folder's entries decided once its files and subfolders are done, its
tree object written once its new blobs have pack refs, and the stat cache updated with it.

Folders are finished in post-order (children before their parent) and their trees written
oldest first (:meth:`TreeSaver.drain`), so a folder's tree names subfolder trees already
queued. A folder whose files and subfolders are all as the stat cache remembers keeps its
cached tree without writing anything.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import Any

from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.core.tree_object import Node, encode_texts, entry_text, node_json
from jupyter_portable.engine.listing import Found
from jupyter_portable.engine.snapshot.context import Context
from jupyter_portable.engine.snapshot.file_saver import FileSaver
from jupyter_portable.engine.snapshot.folder import Entry, Folder, Result, entry_size
from jupyter_portable.engine.snapshot.scanner import Scanner
from jupyter_portable.engine.snapshot.uploader import Frag
from jupyter_portable.workdir.statcache import settled, stat_key


class TreeSaver:
    """Finishes one snapshot's folders and writes their trees; records what it left out."""

    def __init__(self, ctx: Context, scanner: Scanner, files: FileSaver) -> None:
        self.ctx = ctx
        self.scanner = scanner
        self.files = files
        self.skipped: list[str] = []
        self.queue: deque[Folder] = deque()
        self.waiting = 0
        # The blobs of new packs are recorded in the stat cache by a thread of their own where
        # SQLite lets threads share a connection (its inserts leave the interpreter lock, so a
        # first snapshot's million of them run beside the walk); by the walk elsewhere.
        self.blob_pool = (ThreadPoolExecutor(1, thread_name_prefix="portable-statcache")
                          if sqlite3.threadsafety == 3 else None)
        self.blob_jobs: list[Future[None]] = []

    def _take(self, fr: Folder, f: Found, e: Entry | None, nodes: dict[str, Node] | None) -> None:
        fname = f.path.rpartition("/")[2]
        if e is None:
            self.skipped.append(f.path)
            prev = nodes.get(fname) if nodes else None
            if isinstance(prev, FileEntry):  # changed while read: the previous version stays
                fr.kept[fname] = prev
                fr.keys[fname] = None
            return
        fr.kept[fname] = e
        fr.keys[fname] = settled(stat_key(f.st), self.ctx.fresh_ns)

    def _sound(self, fr: Folder) -> bool:
        """Whether the folder's signature may be kept: every file's row known and not too fresh."""
        return (fr.sig is not None and all(k is not None for k in fr.keys.values())
                and all(settled(k, self.ctx.fresh_ns) is not None for _f, k in fr.maybe)
                and (fr.frag is None or fr.frag.sound))

    def finish(self, fr: Folder) -> Result:
        """Decide the folder's entries once its subfolders are done; queue its tree."""
        if fr.trusted:
            assert fr.cached is not None and fr.cached[0] is not None
            tree, files, nbytes = fr.cached
            return Result(tree, files, nbytes, True)
        kids = {n: r for n, r in fr.children.items() if r.files}
        cached_kids = self.ctx.cache.children(fr.cache_id) if fr.cache_id is not None else {}
        kid_names = {self.ctx.cache.lookup_name(n) for n in kids}
        same_kids = all(r.unchanged for r in kids.values()) and kid_names == cached_kids.keys()
        if fr.quick:
            if same_kids:
                assert fr.cached is not None and fr.cached[0] is not None
                tree, files, nbytes = fr.cached
                return Result(tree, files, nbytes, True)
            self.scanner.list_folder(fr)  # a subfolder changed: this folder's tree is written again, so list it
        results = [(f, e) for job in fr.jobs for f, e in job.result()]
        fr.jobs = []
        if results:
            fr.changed = True
        if (self.ctx.usable and not fr.changed and fr.cached is not None and fr.cached[0] is not None
                and same_kids):
            assert fr.cache_id is not None
            if self._sound(fr) and self.ctx.cache.sig(fr.cache_id) != fr.sig:
                self.ctx.cache.set_sig(fr.cache_id, fr.sig)
            tree, files, nbytes = fr.cached
            return Result(tree, files, nbytes, True)
        nodes = self.ctx.base.nodes(fr.rel)
        for f, e in results:
            self._take(fr, f, e, nodes)
        rehash: list[Found] = []
        for f, key in fr.maybe:
            prev = nodes.get(f.path.rpartition("/")[2]) if nodes else None
            if isinstance(prev, FileEntry) and prev.target is None:
                fr.kept[prev.path.rpartition("/")[2]] = prev
                fr.keys[prev.path.rpartition("/")[2]] = settled(key, self.ctx.fresh_ns)
            else:
                rehash.append(f)  # the cache and the base disagree: read it again
        fr.maybe = []
        if rehash:
            self.files.submit(fr, rehash, nodes)
            for job in fr.jobs:
                for f, e in job.result():
                    self._take(fr, f, e, nodes)
            fr.jobs = []
        fg = fr.frag
        files = len(fr.kept) + sum(r.files for r in kids.values()) + (len(fg.texts) if fg else 0)
        nbytes = (sum(entry_size(e) for e in fr.kept.values()) + sum(r.bytes for r in kids.values())
                  + (fg.nbytes if fg else 0))
        if fg is not None:
            self.skipped += fg.skipped
        result = Result(None, files, nbytes, False)
        # The stat cache follows the folder (inside the snapshot's transaction).
        for gone, (gid, _tree) in cached_kids.items():
            if gone not in kid_names:
                self.ctx.cache.drop_folder(gid)
        if not files and fr.parent is not None:
            # An empty folder is not recorded. Its folder above forgets it (above): were it to
            # forget itself now, a folder above vouched for by its signature would find the same
            # subfolders as cached and keep its old tree, with the files deleted here still in it.
            return result
        if fr.cache_id is None:
            fr.cache_id = self._ensure_id(fr)
        self.ctx.cache.replace_rows(fr.cache_id, fr.keys.items())
        if fg is not None:
            self.ctx.cache.put_rows(fr.cache_id, fg.rows)
            fg.rows = []
        if self._sound(fr):
            self.ctx.cache.set_sig(fr.cache_id, fr.sig)
        fr.entries = [*fr.kept.values(), *((n, r) for n, r in sorted(kids.items()))]
        fr.kept, fr.keys = {}, {}
        fr.result = result
        self.queue.append(fr)
        self.waiting += len(fr.entries) + (len(fg.texts) if fg else 0)
        return result

    def _ensure_id(self, fr: Folder) -> int:
        """The stat cache's id of ``fr``, made (with those of its folders above) where missing;
        a loop, not a recursion: folders nest up to MAX_DEPTH levels."""
        chain: list[Folder] = []
        at: Folder | None = fr
        while at is not None and at.cache_id is None:
            chain.append(at)
            at = at.parent
        assert at is not None and at.cache_id is not None, "the root folder always has an id"
        got: int = at.cache_id
        for f in reversed(chain):
            got = f.cache_id = self.ctx.cache.ensure_dir(got, f.name)
        return got

    def drain(self, force: bool = False) -> None:
        """Write the trees of queued folders, oldest first, while their blobs have pack refs."""
        formed = self.ctx.up.take_formed()
        if formed:
            if self.blob_pool is not None:
                self.blob_jobs.append(self.blob_pool.submit(self.ctx.cache.add_blobs, formed))
            else:
                self.ctx.cache.add_blobs(formed)
        while self.queue:
            fr = self.queue[0]
            fg = fr.frag
            if fr.unpacked is None:  # looked for once: the walk may ask again after each folder
                fr.unpacked = [e for e in fr.entries if type(e) is dict and e.get("pack", 0) is None]
            unpacked = fr.unpacked
            if unpacked or (fg is not None and fg.pack is None):
                refs = self.ctx.up.refs([e["hash"] for e in unpacked])
                if force and not self._packed(refs, fg):
                    self.ctx.up.flush_now()
                    refs = self.ctx.up.refs([e["hash"] for e in unpacked])
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
            fr.result.tree = self.ctx.up.add_tree(body)
            self.ctx.cache.set_folder(fr.cache_id, fr.result.tree, fr.result.files, fr.result.bytes)
            self.waiting -= len(fr.entries) + (len(fg.texts) if fg else 0)
            fr.entries = []
            fr.unpacked = None
            fr.frag = None
            self.queue.popleft()

    @staticmethod
    def _packed(refs: list[dict[str, Any] | None], fg: Frag | None) -> bool:
        """Whether a folder's new blobs all have their pack refs (its fragment's pack formed)."""
        return None not in refs and (fg is None or fg.pack is not None)
