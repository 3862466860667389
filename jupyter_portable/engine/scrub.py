"""The scrub: re-reads a few files that stat says are unchanged, to find what stat cannot see.

A second write through a memory map to a page still dirty moves neither the mtime nor the
ctime (the kernel stamps a shared mapping's file at its first write after a writeback, not
at every write); nor does anything else show a change whose size, mtime, ctime and inode all
read as before. No journal and no walk can see such a change. Each run hashes, in a rotating
order (the stat cache's (folder, name) order, from where the last run stopped), files whose
lstat is as the stat cache recorded for the copy's version, until ``budget`` bytes were read,
and compares each hash with the version's. A mismatch, with the file's lstat the same before
and after the read, is a change stat never saw: the result names the file, and its folder's
rows are forgotten, so that the next snapshot (journal or not) reads every file of it again.

A run also stops after ``files`` files, whatever their bytes: in a workspace of a million small
files, 64 MiB is most of the files, and a run would take minutes. Every file is read once per
``total bytes / budget`` or ``total files / files`` runs, whichever is more: budgets of at least
the workspace's bytes and files times the run interval over a day (``budget_for``,
``files_for``) read each file at least once a day.
"""

from __future__ import annotations

import os
import stat as statmod
from dataclasses import dataclass, field

from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.engine.trees import BaseTree
from jupyter_portable.store.repo import Store, hash_file
from jupyter_portable.workdir.statcache import ROOT, changed
from jupyter_portable.workdir.workcopy import WorkspaceCopy

DAY_S = 86_400.0
DEFAULT_BUDGET = 64 * 1024 * 1024  # bytes a run reads at least (JUPYTER_PORTABLE_SCRUB_MB)
DEFAULT_FILES = 2_000  # files a run reads at most, unless a day of runs needs more to read each once


@dataclass
class ScrubResult:
    files: int = 0  # files read and hashed
    bytes: int = 0
    mismatched: list[str] = field(default_factory=list)  # changed where stat could not see: re-read next time
    wrapped: bool = False  # the run reached the end of the order and went on from its start

    def warnings(self) -> list[str]:
        return [f"{p} changed without any change to its size, mtime or ctime (a write through a memory map?): "
                "the next snapshot reads its folder again" for p in self.mismatched]


def budget_for(total_bytes: int, every_s: float, least: int = DEFAULT_BUDGET) -> int:
    """Bytes a run every ``every_s`` seconds reads so that each file is read at least once a day."""
    runs = max(1.0, DAY_S / max(every_s, 1.0))
    return max(least, int(total_bytes / runs) + 1)


def files_for(total_files: int, every_s: float, least: int = DEFAULT_FILES) -> int:
    """Files a run every ``every_s`` seconds reads at most: ``least``, or more where a day of runs
    would not otherwise read each file once."""
    return budget_for(total_files, every_s, least)


def scrub(copy: WorkspaceCopy, store: Store, budget: int, files: int | None = None) -> ScrubResult:
    """Hash unchanged files of the copy's version from where the last run stopped, until
    ``budget`` bytes or ``files`` files were read (at least one file); see the module's docstring."""
    out = ScrubResult()
    cfg = copy.read_config()
    if not cfg.version:
        return out
    with copy.statcache() as cache:
        if not cache.valid_for(cfg.version):
            return out  # the next snapshot reads every file anyway
        manifest = store.read_manifest(cfg.workspace_id, cfg.version)
        if manifest.tree is None:
            return out
        base = BaseTree(store, manifest.tree)
        cursor = start = _cursor(cache.meta("scrub"))
        paths: dict[int, str | None] = {ROOT: ""}
        bad: set[int] = set()
        done = False
        def enough() -> bool:
            return out.files > 0 and (out.bytes >= budget or (files is not None and out.files >= files))

        while not done and not enough():
            batch = cache.rows_after(cursor, 256)
            if not batch:
                if out.wrapped or start == (0, ""):
                    break
                out.wrapped, cursor = True, (0, "")
                continue
            for dir_id, name, key in batch:
                if out.wrapped and (dir_id, name) > start:
                    done = True  # every file once this run
                    break
                cursor = (dir_id, name)
                if not isinstance(key, tuple):
                    continue  # a symlink, or a file the next snapshot reads anyway
                folder = paths[dir_id] if dir_id in paths else paths.setdefault(dir_id, cache.path_of(dir_id))
                if folder is None:
                    continue
                rel = f"{folder}/{name}" if folder else name
                if _read_if_unchanged(copy, base, rel, key, out):
                    bad.add(dir_id)
                if enough():
                    break
        cache.begin()
        try:
            cache.set_meta("scrub", f"{cursor[0]}\t{cursor[1]}")
            for dir_id in bad:
                cache.forget_files(dir_id)
            cache.commit()
        except BaseException:
            cache.abandon()
            raise
    return out


def _read_if_unchanged(copy: WorkspaceCopy, base: BaseTree, rel: str, key: tuple[int, int, int, int],
                       out: ScrubResult) -> bool:
    """Hash one file whose lstat is as recorded; True where its bytes are not the version's."""
    full = os.path.join(str(copy.root), rel)
    try:
        st = os.lstat(full)
    except OSError:
        return False
    if not statmod.S_ISREG(st.st_mode) or changed(key, st):
        return False  # changed as stat sees it: the next snapshot reads it
    node = base.node(rel)
    if not isinstance(node, FileEntry) or node.target is not None or node.size != st.st_size:
        return False
    try:
        h = hash_file(full, st.st_size)
        after = os.lstat(full)
    except OSError:
        return False
    out.files += 1
    out.bytes += st.st_size
    if h == node.hash or changed(key, after):
        return False  # the same bytes, or a change stat sees: no finding
    out.mismatched.append(rel)
    return True


def _cursor(raw: str | None) -> tuple[int, str]:
    if raw is None or "\t" not in raw:
        return (0, "")
    d, _, name = raw.partition("\t")
    return (int(d), name) if d.isdigit() else (0, "")


__all__ = ["DEFAULT_BUDGET", "DEFAULT_FILES", "ScrubResult", "budget_for", "files_for", "scrub"]
