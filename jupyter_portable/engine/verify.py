"""Read-back checks: ``verify`` (a directory against a version and the store); ``fsck`` (the
store against itself) is :mod:`jupyter_portable.engine.fsck`, re-exported here."""

from __future__ import annotations

import os
import stat as statmod
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import ManifestError, StoreError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.tree_object import Node, SubTree, show_path
from jupyter_portable.engine.fsck import FsckResult, fsck, parse_subset  # noqa: F401 - re-exported
from jupyter_portable.engine.hashproc import check_file, check_files, helper_pool
from jupyter_portable.engine.listing import Lister
from jupyter_portable.engine.trees import most_folders, node_name
from jupyter_portable.store.repo import (
    Store,
    check_depth,
    tree_entries,
)

LARGE_MIN = 1024 * 1024  # files at least this large are checked in parallel


PROCESS_MIN = 20_000  # small files to check in one run before other processes check them


class _Helpers:
    """Processes that check small files once a verify has many (see engine.hashproc)."""

    def __init__(self) -> None:
        self.procs: ProcessPoolExecutor | None = None
        self.failed = (os.cpu_count() or 1) < 2

    def get(self, seen: int) -> ProcessPoolExecutor | None:
        if seen <= PROCESS_MIN or self.failed:
            return None
        if self.procs is None:
            self.procs = helper_pool()
            self.failed = self.procs is None
        return self.procs

    def __enter__(self) -> "_Helpers":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.procs is not None:
            self.procs.shutdown(wait=True, cancel_futures=True)


@dataclass
class VerifyResult:
    ok: bool
    version: int
    files: int
    mismatches: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "version": self.version, "files": self.files, "mismatches": self.mismatches}


def _check_entry(root: str | Path, e: FileEntry) -> str | None:
    full = os.path.join(root, e.path)
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
    if e.target is not None:
        if not statmod.S_ISLNK(st.st_mode):
            return "should be a symlink"
        got = os.readlink(full)
        return None if got == e.target else f"symlink points to {got!r}, expected {e.target!r}"
    return check_file(full, st, e.size, e.hash, e.mode)


def _folders_of_flat(manifest: Manifest) -> dict[str, dict[str, Node]]:
    """A schema-1 version's files grouped by folder, with its subfolders as nodes."""
    out: dict[str, dict[str, Node]] = {"": {}}
    for e in manifest.files:
        folder, _, name = e.path.rpartition("/")
        out.setdefault(folder, {})[name] = e
        while folder:
            parent, _, fname = folder.rpartition("/")
            kids = out.setdefault(parent, {})
            if fname in kids:
                break
            kids[fname] = SubTree(fname, folder, "")
            folder = parent
    return out


def _against_disk(lister: Lister, rel: str, path: str | None, nodes: dict[str, Node],
                  version: int) -> tuple[list[tuple[str, str]], list[tuple[str, str | None, str | None]]]:
    """The folder's files on disk that the version lacks (path, reason), and the folders under
    it, on disk or in the version, in name order: (path under the root, on disk or None, tree or None)."""
    # the names alone where that is enough (no stat: each file is looked at once, by its check)
    quick = lister.names(rel, path) if path is not None else None
    listing = lister.list(rel, path) if path is not None and quick is None else None
    disk_files, disk_dirs = quick if quick is not None else (
        ([f.path.rpartition("/")[2] for f in listing.files], listing.dirs) if listing is not None else ([], []))
    extra = [(f"{rel}/{fname}" if rel else fname, f"not in version {version}")
             for fname in disk_files if not isinstance(nodes.get(fname), FileEntry)]
    dir_paths = dict(disk_dirs)
    subs: list[tuple[str, str | None, str | None]] = []
    for name in sorted(dir_paths.keys() | {n for n, x in nodes.items() if isinstance(x, SubTree)}):
        sub = nodes.get(name)
        subs.append((f"{rel}/{name}" if rel else name, dir_paths.get(name), sub.tree if isinstance(sub, SubTree)
                     else None))
    return extra, subs


def verify_dir(store: Store, manifest: Manifest, root: Path, pending: set[str] | None = None) -> VerifyResult:
    """Compare ``root`` with ``manifest`` byte for byte, and check its objects are in the store.

    The version's trees and the directory are walked together, one folder at a time."""
    pending = pending or set()
    if manifest.tree is not None and manifest.file_count > PARALLEL_MIN:
        procs = helper_pool(most=PARALLEL_PROCS, spare_one=False)
        if procs is not None:
            with procs:
                return _verify_by_folders(store, manifest, root, pending, procs)
    mismatches: list[dict[str, str]] = []
    by_object: dict[str, str] = {}  # each object the version needs, and the first path that needs it
    flat = _folders_of_flat(manifest) if manifest.tree is None else None
    lister = Lister(root, warn=False, strict=False)
    checks: deque[tuple[list[FileEntry], Future[list[str | None]]]] = deque()

    def collect(limit: int) -> None:
        while len(checks) > limit:
            batch, fut = checks.popleft()
            try:
                reasons = fut.result()
            except BrokenProcessPool:  # a helper died: check the batch here
                helpers.failed = True
                reasons = [_check_entry(root, e) for e in batch]
            for e, reason in zip(batch, reasons, strict=True):
                if reason:
                    mismatches.append({"path": e.path, "reason": reason})

    def nodes_of(folder: str, tree: str | None, depth: int) -> dict[str, Node]:
        if flat is not None:
            return flat.get(folder, {})
        if tree is None:
            return {}
        return {node_name(n): n for n in store.read_tree(tree, folder, depth)}

    # Large files in parallel (their reads and hashing leave the interpreter lock); small ones in
    # one thread beside the walk, whose cost is Python's: more threads only take turns with the
    # lock, and a 100,000-file verify took twice as long with four.
    small_seen = 0
    helpers = _Helpers()
    bound = _Bound(manifest)
    with ThreadPoolExecutor(4) as pool, ThreadPoolExecutor(1) as small_pool, helpers:
        stack: list[tuple[str, str | None, str | None, int]] = [("", str(root), manifest.tree, 0)]
        while stack:
            rel, path, tree, depth = stack.pop()
            nodes = nodes_of(rel, tree, depth) if (tree is not None or flat is not None) else {}
            bound.add(rel, nodes)
            todo: list[FileEntry] = []
            for node in nodes.values():
                if isinstance(node, SubTree):
                    continue
                for h in node.object_keys():
                    by_object.setdefault(h, node.path)
                if node.path in pending:
                    mismatches.append({"path": node.path, "reason": "not fetched yet (lazy restore still running)"})
                else:
                    todo.append(node)
            small = [e for e in todo if e.size < LARGE_MIN]
            for e in todo:
                if e.size >= LARGE_MIN:
                    checks.append(([e], pool.submit(lambda b: [_check_entry(root, x) for x in b], [e])))
            small_seen += len(small)
            for i in range(0, len(small), 64):
                batch = small[i:i + 64]
                procs = helpers.get(small_seen)
                if procs is not None and all(e.target is None for e in batch):
                    try:
                        checks.append((batch, procs.submit(check_files, str(root),
                                                           [(e.path, e.size, e.hash, e.mode) for e in batch])))
                        continue
                    except (BrokenProcessPool, RuntimeError, OSError):
                        helpers.failed = True
                checks.append((batch, small_pool.submit(lambda b: [_check_entry(root, x) for x in b], batch)))
            collect(32)
            extra, subs = _against_disk(lister, rel, path, nodes, manifest.version)
            mismatches += ({"path": p, "reason": reason} for p, reason in extra)
            stack += ((sub_rel, sub_path, sub_tree, depth + 1) for sub_rel, sub_path, sub_tree in reversed(subs))
        collect(0)
    missing = _missing_objects(store, set(by_object))
    for h in sorted(missing):
        mismatches.append({"path": by_object[h], "reason": f"object {h[:16]}… is missing from the store"})
    mismatches.sort(key=lambda m: m["path"])
    return VerifyResult(not mismatches, manifest.version, manifest.file_count, mismatches)


PARALLEL_MIN = 50_000  # a version of more files is checked a folder at a time by helper processes
PARALLEL_PROCS = 4  # at most this many (as many as the cores)

# One folder's findings: mismatches (path, reason), the objects its files need (hash, path),
# the folders under it to check next (path under the root, its path on disk or None, its tree or
# None), and how many files and symlinks the version has in it.
FolderFindings = tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str | None, str | None]], int]

_folder_listers: dict[str, Lister] = {}


def check_folder(root: str, version: int, rel: str, path: str | None, tree: bytes | None, depth: int,
                 pending: frozenset[str] = frozenset(), lister: Lister | None = None) -> FolderFindings:
    """Everything :func:`verify_dir` finds in one folder of a version: ``tree`` is the folder's
    tree object, read and hashed by the caller (None: the version has no such folder), ``path``
    the folder on disk (None: there is none). Runs in a helper process or in the caller's."""
    nodes = {node_name(n): n for n in tree_entries(tree, rel, depth)} if tree is not None else {}
    if lister is None:  # in a helper process, whose pool lives as long as one verify
        lister = _folder_listers.get(root)
        if lister is None:
            lister = _folder_listers[root] = Lister(Path(root), warn=False, strict=False)
    mismatches: list[tuple[str, str]] = []
    objects: dict[str, str] = {}
    for node in nodes.values():
        if isinstance(node, SubTree):
            continue
        for h in node.object_keys():
            objects.setdefault(h, node.path)
        if node.path in pending:
            reason: str | None = "not fetched yet (lazy restore still running)"
        else:
            reason = _check_entry(root, node)
        if reason:
            mismatches.append((node.path, reason))
    extra, subs = _against_disk(lister, rel, path, nodes, version)
    return mismatches + extra, list(objects.items()), subs, sum(1 for n in nodes.values() if not isinstance(n, SubTree))


def _verify_by_folders(store: Store, manifest: Manifest, root: Path, pending: set[str],
                       procs: ProcessPoolExecutor) -> VerifyResult:
    """:func:`verify_dir` of a large version on every core: each folder (its tree parsed, its
    files hashed, its listing compared) is checked by a helper process; this one reads the
    trees from the store (hashing each) and hands out the folders. A folder a helper could not
    check (a helper died, a tree it refused) is checked here, which raises what it found."""
    by_folder: dict[str, set[str]] = {}
    for p in pending:
        by_folder.setdefault(p.rpartition("/")[0], set()).add(p)
    mismatches: list[dict[str, str]] = []
    by_object: dict[str, str] = {}
    todo: deque[tuple[str, str | None, str | None, int]] = deque([("", str(root), manifest.tree, 0)])
    running: dict[Future[FolderFindings], tuple[str, str | None, bytes | None, int]] = {}
    in_flight = 4 * PARALLEL_PROCS
    broken = False

    def merge(found: FolderFindings, depth: int) -> None:
        bad, objects, subs, files = found
        bound.files_in(files)
        for p, reason in bad:
            mismatches.append({"path": p, "reason": reason})
        for h, p in objects:
            if h not in by_object or p < by_object[h]:
                by_object[h] = p
        todo.extend((rel, path, tree, depth + 1) for rel, path, tree in subs)

    lister = Lister(root, warn=False, strict=False)  # this verify's ignore rules, read now
    bound = _Bound(manifest)

    def here(rel: str, path: str | None, data: bytes | None, depth: int) -> FolderFindings:
        return check_folder(str(root), manifest.version, rel, path, data, depth, frozenset(by_folder.get(rel, ())),
                            lister)

    while todo or running:
        while todo and len(running) < in_flight:
            rel, path, tree, depth = todo.popleft()
            check_depth(rel, depth)
            bound.folder(rel)
            data = store.get_object(tree, what=f"the tree of {rel or '/'}") if tree is not None else None
            if not broken:
                try:
                    job = procs.submit(check_folder, str(root), manifest.version, rel, path, data, depth,
                                       frozenset(by_folder.get(rel, ())))
                    running[job] = (rel, path, data, depth)
                    continue
                except (BrokenProcessPool, RuntimeError, OSError):
                    broken = True
            merge(here(rel, path, data, depth), depth)
        if not running:
            continue
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for job in done:
            rel, path, data, depth = running.pop(job)
            try:
                found = job.result()
            except BrokenProcessPool:  # a helper died: this folder and the rest are checked here
                broken = True
                found = here(rel, path, data, depth)
            except Exception:  # noqa: BLE001 - checked again here, which raises it with its hint
                found = here(rel, path, data, depth)
            merge(found, depth)
    missing = _missing_objects(store, set(by_object))
    for h in sorted(missing):
        mismatches.append({"path": by_object[h], "reason": f"object {h[:16]}… is missing from the store"})
    mismatches.sort(key=lambda m: m["path"])
    return VerifyResult(not mismatches, manifest.version, manifest.file_count, mismatches)


class _Bound:
    """Stops a walk of a version's trees once it meets more files, or more folders, than the
    manifest's counts allow (see engine.trees.check_count): trees that name a subtree over and
    over would otherwise be walked path by path, without end."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.files = 0
        self.folders = 0
        self.most_folders = most_folders(manifest.file_count)

    def folder(self, rel: str) -> None:
        if not rel:
            return  # the root: not one of the folders below it that trees.most_folders bounds
        self.folders += 1
        if self.folders > self.most_folders:
            self._refuse(f"more than {self.most_folders} folders (at {show_path(rel)})")

    def add(self, rel: str, nodes: dict[str, Node]) -> None:
        self.folder(rel)
        self.files_in(sum(1 for n in nodes.values() if not isinstance(n, SubTree)))

    def files_in(self, n: int) -> None:
        self.files += n
        if self.files > self.manifest.file_count:
            self._refuse(f"more than its {self.manifest.file_count} files")

    def _refuse(self, what: str) -> None:
        raise ManifestError(f"version {self.manifest.version}'s trees hold {what}: they name subtrees over and "
                            "over", hint="run `jupyter portable fsck`")


def _missing_objects(store: Store, hashes: set[str]) -> set[str]:
    if len(hashes) > 64:  # one listing beats many existence checks
        try:
            listed = {k.rsplit("/", 1)[-1] for k in store.backend.list("objects")}
            return hashes - listed
        except StoreError:
            pass  # a worker's scoped credentials may not list the shared blobs: check each one
    with ThreadPoolExecutor(8) as pool:
        return {h for h, ok in zip(sorted(hashes), pool.map(store.has_object, sorted(hashes)), strict=False) if not ok}
