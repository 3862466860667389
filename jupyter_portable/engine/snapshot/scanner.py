"""The scanner: which folders a snapshot looks at, and what it finds in each.

A folder is taken as the stat cache has it without a look (a journal snapshot, where the
journal says nothing under it changed), vouched for by its listing's signature alone (every
name and lstat as when its rows were written), or listed with care: each file compared with
its row, the changed ones handed to the file saver. Other processes may take signatures
(:class:`Ahead`) or listings (:meth:`Scanner.list_ahead`) ahead of the walk.
"""

from __future__ import annotations

import os
import stat as statmod
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.core.tree_object import MAX_DEPTH, show_path
from jupyter_portable.engine.hashproc import Fragment, Quick, Read, list_and_pack, quick_folders
from jupyter_portable.engine.journal import Cut
from jupyter_portable.engine.listing import IGNORE_FILE, LINK_OUT, Found, Lister, Listing, Plain, Stat
from jupyter_portable.engine.snapshot.context import Context
from jupyter_portable.engine.snapshot.file_saver import FileSaver, fragment_reads
from jupyter_portable.engine.snapshot.folder import Folder
from jupyter_portable.engine.snapshot.options import DEFAULT, Options
from jupyter_portable.workdir.statcache import ROOT, StatCache, changed


@dataclass(frozen=True)
class Plan:
    """The folders a journal snapshot looks at: those holding a changed path and every
    folder above them (``listed``), and the folders walked whole as without a journal
    (``whole``: created, moved in, renamed). Every other folder is taken as the stat cache
    has it."""

    listed: frozenset[str]
    whole: frozenset[str]

    def looks_at(self, rel: str) -> bool:
        if rel in self.listed:
            return True
        at = rel
        while at:
            if at in self.whole:
                return True
            at = at.rpartition("/")[0]
        return False


def journal_plan(root: str, cut: Cut | None, cache: StatCache, usable: bool, force: bool,
                  pending: dict[str, dict[str, FileEntry]]) -> tuple[Plan | None, str | None]:
    """The folders to look at where ``cut`` can be trusted, else None and why not (the tree
    is then walked whole). Anything uncertain is a reason."""
    if cut is None:
        return None, None
    if not cut.valid:
        return None, cut.reason
    if force:
        return None, "a forced snapshot reads every file"
    if not usable:
        return None, "the stat cache does not describe this copy's version"
    if cache.journal() != cut.since:
        return None, "the stat cache was not written by the snapshot that took the journal's previous cut"
    if pending:
        return None, "files of a lazy restore are still arriving"
    if cut.links is not None:
        return None, cut.links
    walk_next = cache.meta("walk_next")
    if walk_next:
        return None, walk_next
    links = cache.link_folders()
    if links is None:
        return None, "the folders holding symlinks are not known yet"
    for p in cut.paths:
        try:
            st = os.lstat(os.path.join(root, p))
        except OSError:
            continue  # gone: its folder is listed
        if statmod.S_ISREG(st.st_mode) and st.st_nlink > 1:
            # its other names may lie in folders the journal says nothing about
            return None, f"{show_path(p)} has other hard links"
    listed: set[str] = set()

    def with_parents(folder: str) -> None:
        while folder not in listed:
            listed.add(folder)
            if not folder:
                return
            folder = folder.rpartition("/")[0]

    for p in cut.paths:
        with_parents(p.rpartition("/")[0])
    for folder in (*cut.trees, *links):
        with_parents(folder)
    return Plan(frozenset(listed), cut.trees), None


class Ahead:
    """Quick signatures of the last snapshot's folders, taken by other processes from the
    far end of the walk while the walk takes them itself from the near end, so that a
    snapshot of a large workspace that changed little (one lstat per file) uses two cores.

    Only ``opts.ahead_in_flight`` batches are sent at a time, each beyond the walk's position; once
    the far end reaches the walk no more are sent. So nothing is cancelled (in CPython 3.11
    a cancelled job can keep a pool from reporting a dead helper) and the files a snapshot
    hands the same processes to read never wait behind more than a few batches. A
    signature taken early is no different from one taken at the visit: either way, a file
    written after its folder was looked at waits for the next snapshot."""

    def __init__(self, procs: ProcessPoolExecutor, root: str, salt: bytes, folders: list[tuple[str, int]],
                 opts: Options = DEFAULT) -> None:
        self.procs, self.root, self.salt = procs, root, salt
        self.in_flight = opts.ahead_in_flight
        self.at: dict[str, tuple[int, int]] = {}
        self.batches: list[list[str]] = [[]]
        files = 0
        for rel, n in folders:
            if files >= opts.ahead_chunk:
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
        while not self.broken and len(self.sent) < self.in_flight and self.far > self.near:
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


class Scanner:
    """Visits one snapshot's folders: what each holds, and which files the file saver reads."""

    def __init__(self, ctx: Context, files: FileSaver, pending: dict[str, dict[str, FileEntry]],
                 plan: Plan | None = None) -> None:
        self.ctx = ctx
        # A journal snapshot: folders not in ``plan.listed`` nor under one of ``plan.whole`` are
        # taken as the stat cache has them, unlooked at.
        self.plan = plan
        self.looked: set[str] = set()  # folders looked at (listed, or vouched for by a signature)
        # A changed file found with other hard links when a journal snapshot listed it: its other
        # names may lie in folders this snapshot does not look at, so the next one walks the tree.
        self.linked: str | None = None
        self.link_dirs: set[str] = set()  # those of them that hold a symlink
        self.files = files
        self.pending = pending
        # Folders that hold files not fetched yet, by parent: walked even where nothing is on disk yet.
        self.pending_dirs: dict[str, set[str]] = {}
        for folder in pending:
            while folder:
                parent, _, name = folder.rpartition("/")
                self.pending_dirs.setdefault(parent, set()).add(name)
                folder = parent
        self.lister = Lister(Path(ctx.root))
        self.special: list[dict[str, str]] = []
        self.ahead: Ahead | None = None
        # folders listed (and their small files read) by other processes, ahead of the walk
        self.listed: dict[str, Future[tuple[Plain, Fragment] | None]] = {}

    def visit(self, rel: str, abs_dir: str, name: str, parent: Folder | None) -> Folder:
        depth = parent.depth + 1 if parent is not None else 0
        if depth > MAX_DEPTH:
            raise PortableError(f"folder {show_path(rel)} is nested more than {MAX_DEPTH} levels deep; nothing was "
                                "published",
                                hint=f"move it higher up, or add it to {IGNORE_FILE}")
        cache_id: int | None
        cached: tuple[str | None, int, int] | None
        if parent is None:
            cache_id, cached = ROOT, self.ctx.cache.folder(ROOT)
        elif parent.cache_id is not None:
            got = self.ctx.cache.child(parent.cache_id, name)
            cache_id, cached = (got[0], got[1:]) if got is not None else (None, None)
        else:
            cache_id, cached = None, None
        if (self.plan is not None and cache_id is not None and cached is not None and cached[0] is not None
                and not self.plan.looks_at(rel)):
            fr = Folder(rel, abs_dir, name, depth, parent, cache_id, cached, {}, [])
            fr.trusted = True
            return fr
        self.looked.add(rel)
        if (self.ctx.usable and cache_id is not None and cached is not None and cached[0] is not None
                and rel not in self.pending_dirs and rel not in self.pending):
            want = self.ctx.cache.sig(cache_id)
            quick = self._quick(rel, abs_dir) if want is not None else None
            if quick is not None and quick[0] == want:
                # Every file's name and lstat as when the folder's rows were written: none is
                # looked at one by one unless a subfolder changed (see finish).
                fr = Folder(rel, abs_dir, name, depth, parent, cache_id, cached, {}, sorted(quick[1]))
                fr.quick = True
                fr.sig = want
                return fr
        fr = Folder(rel, abs_dir, name, depth, parent, cache_id, cached, {}, [])
        self.list_folder(fr)
        return fr

    def _quick(self, rel: str, abs_dir: str) -> Quick:
        if self.ahead is not None:
            taken, quick = self.ahead.take(rel)
            if taken:
                return quick
        return self.lister.quick(rel, abs_dir)

    def look_ahead(self) -> None:
        """Other processes stat the last snapshot's folders from the far end (see Ahead)."""
        if not self.ctx.usable or self.pending or self.plan is not None:
            return
        top = self.ctx.cache.folder(ROOT)
        if top is None or top[1] < self.ctx.opts.ahead_min:
            return
        procs = self.files.process_pool()
        if procs is None:
            return
        try:
            self.ahead = Ahead(procs, self.ctx.root, self.lister.salt, self.ctx.cache.signed_folders(), self.ctx.opts)
        except (BrokenProcessPool, RuntimeError, OSError):
            self.ahead = None

    def list_folder(self, fr: Folder) -> None:
        """List the folder with care: compare each file with its row, hash what changed."""
        rel, abs_dir, cache_id = fr.rel, fr.abs, fr.cache_id
        rows = fr.rows = self.ctx.cache.rows(cache_id) if cache_id is not None and self.ctx.usable else {}
        listing, reads, frag = self._listing(rel, abs_dir, whole=not rows and rel not in self.pending)
        fr.sig = listing.sig
        subdirs = listing.dirs
        if rel in self.pending_dirs:
            on_disk = {n for n, _p in subdirs}
            subdirs += [(n, os.path.join(abs_dir, n)) for n in self.pending_dirs[rel] if n not in on_disk]
        if not fr.quick:
            fr.subdirs = sorted(subdirs)
        self.special += [{"path": p, "kind": k} for p, k in listing.special]
        if any(f.target is not None for f in listing.files) or any(k == LINK_OUT for _p, k in listing.special):
            self.link_dirs.add(rel)
        lookup = self.ctx.cache.lookup_name
        todo: list[Found] = []
        if not rows and rel not in self.pending:  # nothing recorded here (a first snapshot): every file is new
            for f in listing.files:
                if f.target is not None:
                    _keep_link(fr, f, f.target)
                else:
                    todo.append(f)
            fr.changed = fr.changed or bool(listing.files) or frag is not None
            self.files.submit(fr, todo, self.ctx.base.nodes(rel) if todo else None, reads)
            if frag is not None:
                self.files.fragment(fr, frag)
            return
        seen: set[str] = set()
        for f in listing.files:
            fname = f.path.rpartition("/")[2]
            lname = lookup(fname)
            seen.add(lname)
            was = rows.get(lname)
            if f.target is not None:
                _keep_link(fr, f, f.target)
                if changed(was, f.target):
                    fr.changed = True
                continue
            if not changed(was, f.st):
                fr.maybe.append((f, was))
            else:
                fr.changed = True
                todo.append(f)
                if self.plan is not None and self.linked is None and getattr(f.st, "st_nlink", 1) > 1:
                    self.linked = f.path
        if seen != rows.keys():
            fr.changed = True
        for pname, e in self.pending.get(rel, {}).items():
            if lookup(pname) not in seen:  # not fetched yet: still part of the copy
                fr.kept[pname] = e
                fr.keys[pname] = None
                fr.changed = True
        nodes = self.ctx.base.nodes(rel) if todo else None
        self.files.submit(fr, todo, nodes, reads)

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
                self.files.procs_failed = True
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
        elif not whole or not self.files.first:
            # an earlier version may hold these files (kept from it, or a blob already stored)
            files = files + fragment.files
            reads = fragment_reads(fragment, prefix)
            frag = None
        listing = Listing([Found(prefix + name, Stat(*st)) for name, *st in files], dirs)
        listing.sig = sig
        return listing, reads, frag

    def list_ahead(self, stack: list[Folder]) -> None:
        """In a first snapshot of a large workspace, other processes list the next folders
        of the walk (each folder's subfolders, deepest first, as the walk will meet them)
        and read their small files, up to ``opts.list_ahead`` folders at a time."""
        if self.ctx.usable or self.files.procs is None or self.files.procs_failed:
            return
        ctx = self.ctx
        opts = ctx.opts
        for fr in reversed(stack):
            for name, _path in fr.subdirs[fr.next_sub:]:
                if len(self.listed) >= opts.list_ahead:
                    return
                rel = f"{fr.rel}/{name}" if fr.rel else name
                if rel in self.listed:
                    continue
                try:
                    self.listed[rel] = self.files.procs.submit(list_and_pack, ctx.root, self.lister.salt, rel,
                                                         opts.list_most, opts.small_max, opts.list_read,
                                                         ctx.fresh_ns)
                except (BrokenProcessPool, RuntimeError, OSError):
                    self.files.procs_failed = True
                    return


def _keep_link(fr: Folder, f: Found, target: str) -> None:
    """Record a symlink of the folder as found: its target is all there is to it."""
    fname = f.path.rpartition("/")[2]
    fr.kept[fname] = {"path": f.path, "type": "symlink", "target": target}
    fr.keys[fname] = target
