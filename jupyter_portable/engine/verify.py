"""Read-back checks: ``verify`` (a directory against a version and the store) and
``fsck`` (the store against itself)."""

from __future__ import annotations

import os
import random
import stat as statmod
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import ManifestError, PortableError, StoreError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.tree import Node, SubTree
from jupyter_portable.engine.hashproc import check_file, check_files, helper_pool
from jupyter_portable.engine.scan import Lister
from jupyter_portable.engine.trees import node_name
from jupyter_portable.store.repo import (
    Store,
    check_depth,
    digest,
    manifests_prefix,
    parse_manifest_key,
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
    with ThreadPoolExecutor(4) as pool, ThreadPoolExecutor(1) as small_pool, helpers:
        stack: list[tuple[str, str | None, str | None, int]] = [("", str(root), manifest.tree, 0)]
        while stack:
            rel, path, tree, depth = stack.pop()
            nodes = nodes_of(rel, tree, depth) if (tree is not None or flat is not None) else {}
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
# and the folders under it to check next (path under the root, its path on disk or None, its tree or None).
FolderFindings = tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str | None, str | None]]]

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
    return mismatches + extra, list(objects.items()), subs


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
        bad, objects, subs = found
        for p, reason in bad:
            mismatches.append({"path": p, "reason": reason})
        for h, p in objects:
            if h not in by_object or p < by_object[h]:
                by_object[h] = p
        todo.extend((rel, path, tree, depth + 1) for rel, path, tree in subs)

    lister = Lister(root, warn=False, strict=False)  # this verify's ignore rules, read now

    def here(rel: str, path: str | None, data: bytes | None, depth: int) -> FolderFindings:
        return check_folder(str(root), manifest.version, rel, path, data, depth, frozenset(by_folder.get(rel, ())),
                            lister)

    while todo or running:
        while todo and len(running) < in_flight:
            rel, path, tree, depth = todo.popleft()
            check_depth(rel, depth)
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


def _missing_objects(store: Store, hashes: set[str]) -> set[str]:
    if len(hashes) > 64:  # one listing beats many existence checks
        try:
            listed = {k.rsplit("/", 1)[-1] for k in store.backend.list("objects")}
            return hashes - listed
        except StoreError:
            pass  # a worker's scoped credentials may not list the shared blobs: check each one
    with ThreadPoolExecutor(8) as pool:
        return {h for h, ok in zip(sorted(hashes), pool.map(store.has_object, sorted(hashes)), strict=False) if not ok}


@dataclass
class FsckResult:
    ok: bool
    manifests: int
    objects: int
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read_objects: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "manifests": self.manifests, "objects": self.objects,
                "errors": self.errors, "warnings": self.warnings, "read_objects": self.read_objects}


def parse_subset(text: str | None) -> float | None:
    """``"10%"`` or ``"0.1"`` or ``"1/10"`` -> fraction; None for everything."""
    if text is None:
        return None
    try:
        if text.endswith("%"):
            frac = float(text[:-1]) / 100
        elif "/" in text:
            a, b = text.split("/", 1)
            frac = float(a) / float(b)
        else:
            frac = float(text)
    except ValueError as exc:
        raise PortableError(f"--read-data-subset {text!r} is not a fraction like 10% or 1/10") from exc
    if not 0 < frac <= 1:
        raise PortableError(f"--read-data-subset {text!r} must be above 0 and at most 100%")
    return frac


def fsck(store: Store, *, read_data: bool = False, subset: float | None = None, seed: int | None = None) -> FsckResult:
    """Every manifest's objects exist, every head names a manifest; optionally re-hash objects."""
    errors: list[str] = []
    warnings: list[str] = []
    # fsck only reads: a transient error is asked again (a view with the Backend's read methods)
    store = Store(_RetryingReads(store.backend))  # type: ignore[arg-type]
    try:
        store.check_store()
    except PortableError as exc:
        # Nothing else in a store of unknown format can be read meaningfully.
        return FsckResult(False, 0, 0, [f"config.json: {exc.one_line()}"])
    object_keys = store.backend.list("objects")
    sizes: dict[str, str] = {k.rsplit("/", 1)[-1]: k for k in object_keys}
    manifests = 0
    needed: dict[str, str] = {}
    walked: set[str] = set()  # trees already walked: a subtree shared by many versions is read once
    index_sizes: dict[str, int | None] = {}  # pack -> size its index gives (None: unreadable)
    for ws in store.workspaces():
        try:
            head, _ = store.read_head(ws)
        except PortableError as exc:
            errors.append(f"workspace {ws}: head: {exc}")
            continue
        keys = store.backend.list(manifests_prefix(ws))
        reachable = {(m.version) for m in _safe_history(store, ws, errors)}
        if head.version and head.version not in reachable:
            errors.append(f"workspace {ws}: head names version {head.version}, which cannot be read")
        for key in keys:
            try:
                version, _ = parse_manifest_key(key)
                manifest = store.read_manifest_key(key)
            except PortableError as exc:
                errors.append(f"{key}: {exc}")
                continue
            manifests += 1
            if version not in reachable or version > head.version:
                warnings.append(f"{key}: not in the history of {ws} (a writer that lost a race); harmless")
            try:
                for e in _files_once(store, manifest, walked, needed, key):
                    for h in e.object_keys():
                        needed.setdefault(h, f"{key} ({e.path})")
                    if e.pack is not None:
                        if e.pack.pack in sizes:
                            _check_ref(store, e, key, index_sizes, errors)
            except PortableError as exc:
                errors.append(f"{key}: {exc.one_line() if hasattr(exc, 'one_line') else exc}")
    for h, where in sorted(needed.items()):
        if h not in sizes:
            errors.append(f"object {h} named by {where} is missing")
    read = 0
    if read_data:
        names = sorted(sizes)
        if subset is not None:
            rng = random.Random(seed)
            names = sorted(rng.sample(names, max(1, round(len(names) * subset)))) if names else []

        def check(h: str) -> str | None:
            data = store.backend.read(sizes[h])
            if digest(data) != h:
                return f"object {h} is corrupt: its bytes do not hash to its name"
            if h in index_sizes:  # a pack: every blob its index lists (and so every entry's range) hashes right
                try:
                    index = store.get_index(h)
                except PortableError as exc:
                    return f"pack {h}: index: {exc}"
                for bh, o, n in index.blobs:
                    if digest(data[o:o + n]) != bh:
                        return f"pack {h}: blob {bh} named by {needed.get(h, 'its index')} is corrupt"
            return None

        with ThreadPoolExecutor(4) as pool:
            for problem in pool.map(check, names):
                read += 1
                if problem:
                    errors.append(problem)
    return FsckResult(not errors, manifests, len(object_keys), errors, warnings, read)


def _transient(exc: BaseException) -> bool:
    """A store error that may pass (a 5xx, a reset): not a missing object, not an unsupported store."""
    from jupyter_portable.core.errors import ObjectMissing, StoreError, UnsupportedStore

    return isinstance(exc, StoreError) and not isinstance(exc, (ObjectMissing, UnsupportedStore))


def _retrying(call: Any) -> Any:
    """``call()``, asked again on a transient store error: it is not corruption (tenacity: up to 6
    tries, backing off from 50 ms to 2 s) before fsck gives up on the store."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    for attempt in Retrying(stop=stop_after_attempt(6), wait=wait_exponential(multiplier=0.05, max=2),
                            retry=retry_if_exception(_transient), reraise=True):
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity either returned or raised")


class _RetryingReads:
    """A backend's reads (the head, manifests, trees, indexes, listings, objects) asked again on a
    transient error; fsck writes nothing, so only reads are wrapped."""

    _READS = frozenset({"read", "read_range", "exists", "size", "list", "read_versioned"})

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name in self._READS and callable(attr):
            return lambda *args, **kwargs: _retrying(lambda: attr(*args, **kwargs))
        return attr


def _files_once(store: Store, manifest: Manifest, walked: set[str], needed: dict[str, str],
                key: str) -> Iterator[FileEntry]:
    """A version's files, skipping subtrees an earlier version already had (their objects
    are recorded); every tree object walked is recorded as needed too."""
    if manifest.tree is None:
        yield from manifest.files
        return
    needed.setdefault(manifest.tree, f"{key} (root tree)")
    if manifest.tree in walked:
        return
    walked.add(manifest.tree)
    stack: list[tuple[str, str, int]] = [(manifest.tree, "", 0)]
    while stack:
        tree, at, depth = stack.pop()
        for node in store.read_tree(tree, at, depth):
            if isinstance(node, SubTree):
                needed.setdefault(node.tree, f"{key} ({node.path}/)")
                if node.tree not in walked:
                    walked.add(node.tree)
                    stack.append((node.tree, node.path, depth + 1))
            else:
                yield node


def _check_ref(store: Store, e: FileEntry, key: str, index_sizes: dict[str, int | None], errors: list[str]) -> None:
    assert e.pack is not None
    pack = e.pack.pack
    if pack not in index_sizes:
        try:
            index_sizes[pack] = store.get_index(pack).size
        except PortableError as exc:
            index_sizes[pack] = None
            errors.append(f"pack {pack}: index: {exc}")
            return
    size = index_sizes[pack]
    if size is not None and e.pack.offset + e.pack.length > size:
        errors.append(f"{key}: blob {e.hash[:16]}… at {e.pack.offset}+{e.pack.length} runs past the end of "
                      f"pack {pack[:16]}…")


def _safe_history(store: Store, ws: str, errors: list[str]) -> list[Manifest]:
    try:
        return store.history(ws)
    except (PortableError, ManifestError) as exc:
        errors.append(f"workspace {ws}: history: {exc}")
        return []
