"""One snapshot's walk: the scanner visits folders depth first, the file saver reads what
changed, and the tree saver finishes each folder (post-order) and writes its tree once its
new blobs are in packs; the stat cache is updated folder by folder inside one transaction."""

from __future__ import annotations

from collections import deque

from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.engine.progress import Progress
from jupyter_portable.engine.snapshot.context import Context
from jupyter_portable.engine.snapshot.file_saver import FileSaver
from jupyter_portable.engine.snapshot.folder import Folder, Result
from jupyter_portable.engine.snapshot.options import DEFAULT, Options
from jupyter_portable.engine.snapshot.scanner import Plan, Scanner
from jupyter_portable.engine.snapshot.tree_saver import TreeSaver
from jupyter_portable.engine.snapshot.uploader import Uploader
from jupyter_portable.engine.trees import BaseTree
from jupyter_portable.workdir.statcache import StatCache
from jupyter_portable.workdir.workcopy import WorkspaceCopy


class Walk:
    """The three stages of one snapshot's walk, and the order in which folders pass them."""

    def __init__(self, copy: WorkspaceCopy, cache: StatCache, usable: bool, base: BaseTree,
                 up: Uploader, progress: Progress, started_ns: int,
                 pending: dict[str, dict[str, FileEntry]], plan: Plan | None = None, opts: Options = DEFAULT) -> None:
        self.ctx = ctx = Context(str(copy.root), cache, usable, base, up, opts, started_ns - opts.racy_ns)
        # nothing stored before to compare files with: folders listed ahead are taken whole
        first = not usable and base.root is None and up.blobs is None
        self.files = FileSaver(ctx, progress, first)
        self.scanner = Scanner(ctx, self.files, pending, plan)
        self.trees = TreeSaver(ctx, self.scanner, self.files)
        self.last = Result(None, 0, 0, False)  # the folder finished last (the root, at the end)

    def run(self) -> Result:
        scanner, trees = self.scanner, self.trees
        try:
            scanner.look_ahead()
            top = scanner.visit("", self.ctx.root, "", None)
            stack = [top]
            scanner.list_ahead(stack)
            done: deque[Folder] = deque()  # walked (post-order), not finished yet
            while stack:
                fr = stack[-1]
                if fr.next_sub < len(fr.subdirs):
                    name, path = fr.subdirs[fr.next_sub]
                    fr.next_sub += 1
                    stack.append(scanner.visit(f"{fr.rel}/{name}" if fr.rel else name, path, name, fr))
                    scanner.list_ahead(stack)
                    continue
                stack.pop()
                done.append(fr)
                self._settle(done, final=not stack)
            trees.drain(force=True)
            for job in trees.blob_jobs:
                job.result()  # recorded before the transaction commits (or an error of theirs raised)
            return self.last
        finally:
            if trees.blob_pool is not None:
                trees.blob_pool.shutdown(wait=True)  # nothing writes the stat cache once the walk ends
            self.files.shutdown()

    def _settle(self, done: deque[Folder], *, final: bool) -> None:
        """Finish walked folders, oldest first (children before their parent).

        While other processes read the files, a folder is finished once its files are in,
        and the walk lists the next folders meanwhile (up to ``lookahead`` files queued), so
        listing and reading overlap. Threads alone finish each folder at once: two threads
        of Python taking turns with the interpreter lock are slower than one waiting."""
        files, trees, ctx = self.files, self.trees, self.ctx
        opts = ctx.opts
        lookahead = opts.lookahead if files.procs is not None and files.small_sent > opts.process_min else 0
        while done:
            fr = done[0]
            if not final and files.queued <= lookahead and not all(job.done() for job in fr.jobs):
                return
            done.popleft()
            result = trees.finish(fr)
            files.queued -= fr.queued
            fr.queued = 0
            if fr.parent is not None:
                fr.parent.children[fr.name] = result
            self.last = result
            trees.drain()
            if trees.waiting > opts.waiting_max and ctx.up.pending():
                ctx.up.flush_now()
                trees.drain()
