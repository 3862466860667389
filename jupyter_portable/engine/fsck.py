"""``fsck``: the store checked against itself, as a restore reads it.

Every version in a workspace's history (the head, then ``parent`` links) is checked the way
a restore would read it: its manifest, every tree (each distinct tree read once), every object
its files and its runtime record name. A problem in one of those is an **error**: ``ok``
means every version in every history can be restored. Manifests that no history reaches
(a writer that lost a race, a snapshot killed before it moved the head: fsck says which where
the store can tell, and "either" where it cannot) are **warnings**, and
so is anything only they need; objects no version reaches are reported with their bytes.

With ``read_data`` every object is read back too: it must hash to its name, a part must be
as long as every entry that names it says, each packed file's byte range must lie inside its
pack and hash to the file's hash, a file of several parts must hash whole to its hash, and a
runtime lockfile must parse.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3

from jupyter_portable.core.errors import ManifestError, ObjectMissing, PortableError, StoreError, UnsupportedStore
from jupyter_portable.core.manifest import FileEntry, Head, Manifest, ManifestLink
from jupyter_portable.core.tree_object import Node, SubTree
from jupyter_portable.engine.trees import TreeCount, check_count, count_trees
from jupyter_portable.store.repo import Store, digest, manifest_key, manifests_prefix, parse_manifest_key

EMPTY_HASH = digest(b"")
RUNTIME_OBJECTS = ("lockfile", "conda")  # the runtime record's fields that name objects


@dataclass
class FsckResult:
    ok: bool
    manifests: int
    objects: int
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    read_objects: int = 0
    unreachable: dict[str, int] = field(default_factory=dict)  # object -> its bytes, for objects no version reaches

    @property
    def unreachable_bytes(self) -> int:
        return sum(self.unreachable.values())

    def lines(self) -> list[str]:
        """The report as text: a summary line, then each error and warning."""
        from jupyter_portable.engine.progress import human_bytes

        head = (f"{'ok' if self.ok else 'FAILED'}: {self.manifests} manifests, {self.objects} objects"
                + (f", {self.read_objects} re-hashed" if self.read_objects else "")
                + (f"; {len(self.unreachable)} objects no version reaches ({human_bytes(self.unreachable_bytes)})"
                   if self.unreachable else ""))
        return [head] + [f"error: {e}" for e in self.errors] + [f"warning: {w}" for w in self.warnings]

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "manifests": self.manifests, "objects": self.objects,
                "errors": self.errors, "warnings": self.warnings, "read_objects": self.read_objects,
                "unreachable": [{"object": h, "bytes": n} for h, n in sorted(self.unreachable.items())],
                "unreachable_bytes": self.unreachable_bytes}


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
    """Check every workspace's history as a restore would read it (see the module docstring);
    with ``read_data``, read every object back (``subset``: a random fraction of them)."""
    # fsck only reads: a transient error is asked again (a view with the Backend's read methods)
    store = Store(_RetryingReads(store.backend))  # type: ignore[arg-type]
    try:
        store.check_store()
    except PortableError as exc:
        # Nothing else in a store of unknown format can be read meaningfully.
        return FsckResult(False, 0, 0, [f"config.json: {exc.one_line()}"])
    check = _Check(store, read_data)
    orphans: list[tuple[str, str]] = []
    for ws in store.workspaces():
        orphans += check.workspace(ws)
    check.orphaned = True  # from here on, what is found concerns no version: a warning
    for ws, key in orphans:
        check.orphan(ws, key)
    check.wheels()
    check.missing()
    if read_data:
        check.read_data(subset, seed)
    check.unreachable()
    return FsckResult(not check.errors, check.manifests, len(check.objects), check.errors, check.warnings,
                      check.read, check.unreached)


class _Check:
    """The state of one fsck: what each object is needed for, and what was found."""

    def __init__(self, store: Store, read_data: bool) -> None:
        self.store = store
        self.read_data_too = read_data
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.objects: dict[str, str] = {k.rsplit("/", 1)[-1]: k for k in store.backend.list("objects")}
        self.manifests = 0
        self.read = 0
        self.orphaned = False
        self.memo: dict[str, TreeCount] = {}  # trees read (and hashed), with what they hold
        self.recorded: set[str] = set()  # trees whose entries were looked at
        self.bad_trees: dict[str, PortableError] = {}
        self.needed: dict[str, str] = {}  # object -> the first thing of a version that needs it
        self.orphan_needed: dict[str, str] = {}  # the same, for what only orphan manifests need
        self.index_sizes: dict[str, int | None] = {}  # pack -> the size its index gives (None: unreadable)
        self.part_sizes: dict[str, tuple[int, str]] = {}  # part -> its length as first named, and where
        # kept for reading the data back: a pack's ranges, files of several parts, lockfiles
        self.ranges: dict[str, dict[tuple[int, int, str], str]] = {}
        self.whole: dict[tuple[str, tuple[tuple[str, int], ...]], str] = {}
        self.lockfiles: dict[str, str] = {}
        self.wheel_objects: set[str] = set()
        self.unreached: dict[str, int] = {}

    def problem(self, text: str) -> None:
        (self.warnings if self.orphaned else self.errors).append(
            f"{text} (only an orphan manifest needs it; harmless)" if self.orphaned else text)

    # -- histories and manifests -------------------------------------------------------------

    def workspace(self, ws: str) -> list[tuple[str, str]]:
        """Check the history of ``ws``; the keys of its manifests that no history reaches."""
        try:
            head, _ = self.store.read_head(ws)
        except PortableError as exc:
            self.errors.append(f"workspace {ws}: head: {exc.one_line()}")
            return []
        try:
            keys = self.store.backend.list(manifests_prefix(ws))
        except PortableError as exc:
            self.errors.append(f"workspace {ws}: its manifests cannot be listed: {exc.one_line()}")
            keys = []
        in_history = set()
        by_version: dict[int, str] = {}
        for key, manifest in self.history(ws, head):
            in_history.add(key)
            try:
                by_version[parse_manifest_key(key)[0]] = key
            except PortableError:
                pass
            self.manifests += 1
            if manifest is not None:
                self.version(f"version {manifest.version} of {ws}", manifest)
        orphans = []
        for key in keys:
            if key in in_history:
                continue
            try:
                version, _ = parse_manifest_key(key)
            except PortableError as exc:
                self.warnings.append(f"{key}: {exc.one_line()}; not a manifest of the history, never read")
                continue
            why = self.orphan_cause(key, version, head.version, by_version)
            self.warnings.append(f"{key}: an orphan manifest, in no history of {ws} ({why}); never restored, "
                                 "harmless")
            orphans.append((ws, key))
        return orphans

    def orphan_cause(self, key: str, version: int, head_version: int, by_version: dict[int, str]) -> str:
        """Why a manifest is in no history, as far as the store can tell. Past the head: a
        snapshot stopped (killed) before it moved the head. Following a version that is itself in
        no history: a writer that lost a race (its base had lost one already). Otherwise a killed
        writer's leftover and a lost race leave the same manifest behind: fsck says either."""
        if version > head_version:
            return "a snapshot stopped before it moved the head"
        try:
            parent = self.store.read_manifest_link(key)[1].parent
        except PortableError:
            parent = None
        if parent is not None and parent.version in by_version and \
                parse_manifest_key(by_version[parent.version])[1] != parent.manifest:
            return "a writer that lost a race: the version it followed is in no history either"
        return "either a writer killed before it moved the head or one that lost a race: the store cannot tell which"

    def history(self, ws: str, head: Head) -> Iterable[tuple[str, Manifest | None]]:
        """The manifests of the head's history, newest first (None: one whose link to its parent
        holds but which cannot be restored, reported), checking what section 5.4 asks of the chain:
        each version's parent exists, and no epoch exceeds the head's or its child's."""
        version, mhash = head.version, head.manifest
        child: ManifestLink | None = None
        while version and mhash:
            key = manifest_key(ws, version, mhash)
            named_by = "the head" if child is None else f"version {child.version} as its parent"
            try:
                obj, link = self.store.read_manifest_link(key)
                if link.workspace_id != ws:
                    raise ManifestError(f"it names workspace {link.workspace_id}")
            except ObjectMissing:
                self.errors.append(f"workspace {ws}: version {version}, named by {named_by}, is missing ({key}): "
                                   f"the history has a gap" + (f"; versions 1 to {version - 1} cannot be reached"
                                                                if version > 1 else ""))
                return
            except PortableError as exc:
                self.errors.append(f"workspace {ws}: version {version} ({key}), named by {named_by}, cannot be "
                                   f"read: {_text(exc)}" + (f"; versions 1 to {version - 1} cannot be reached"
                                                           if version > 1 else ""))
                return
            if link.epoch > head.epoch:
                self.errors.append(f"{key}: version {version} of {ws} has epoch {link.epoch}, above the head's "
                                   f"{head.epoch}")
            if child is not None and child.epoch < link.epoch:
                self.errors.append(f"workspace {ws}: version {child.version} has epoch {child.epoch}, below its "
                                   f"parent's {link.epoch}")
            try:
                manifest: Manifest | None = Manifest.from_json(obj).bind(self.store)
            except PortableError as exc:
                self.errors.append(f"version {version} of {ws} cannot be restored: its manifest ({key}) is "
                                   f"refused: {_text(exc)}")
                manifest = None
            yield key, manifest
            child = link
            version, mhash = (link.parent.version, link.parent.manifest) if link.parent is not None else (0, None)

    def orphan(self, ws: str, key: str) -> None:
        try:
            manifest = self.store.read_manifest_key(key)
            if manifest.workspace_id != ws:
                raise ManifestError(f"it names workspace {manifest.workspace_id}")
        except PortableError as exc:
            self.warnings.append(f"{key}: an orphan manifest that cannot be read: {exc.one_line()}")
            return
        self.manifests += 1
        self.version(f"orphan manifest {key}", manifest)

    def version(self, what: str, manifest: Manifest) -> None:
        """Everything a restore of ``manifest`` reads: its trees, its files' objects, its runtime's."""
        self.runtime(what, manifest.runtime)
        if manifest.tree is None:
            for e in manifest.files:
                self.entry(what, e)
            return
        bad = self.bad_trees.get(manifest.tree)
        try:
            if bad is not None:
                raise bad
            count = count_trees(self.store, manifest.tree, self.memo,
                                lambda h, folder, nodes: self.tree(what, h, folder, nodes))
            check_count(manifest, count)
        except PortableError as exc:
            self.bad_trees.setdefault(manifest.tree, exc)
            self.problem(f"{what} cannot be restored: {_text(exc)}")

    def tree(self, what: str, h: str, folder: str, nodes: list[Node]) -> None:
        self.need(h, f"{what}: the tree of {folder or '/'}")
        if h in self.recorded:  # a root read again for another version
            return
        self.recorded.add(h)
        for node in nodes:
            if not isinstance(node, SubTree):
                self.entry(what, node)

    def runtime(self, what: str, runtime: dict[str, Any] | None) -> None:
        for name in RUNTIME_OBJECTS:
            h = (runtime or {}).get(name)
            if h is None:
                continue
            if not isinstance(h, str) or len(h) != 64 or h.strip("0123456789abcdef"):
                self.problem(f"{what}: runtime.{name} is not an object's hash: {h!r}")
                continue
            self.need(h, f"{what}: runtime.{name}")
            if name == "lockfile":
                self.lockfiles.setdefault(h, f"{what}: runtime.lockfile")

    def need(self, h: str, where: str) -> None:
        if h not in self.needed:
            (self.orphan_needed if self.orphaned else self.needed).setdefault(h, where)

    def entry(self, what: str, e: FileEntry) -> None:
        """One file as a restore reads it: what it needs, and what can be told without its bytes."""
        if e.target is not None:
            return
        where = f"{what}: {e.path}"
        for h in e.object_keys():
            self.need(h, where)
        if e.pack is not None:
            self.packed(where, e)
            return
        if not e.parts and e.hash != EMPTY_HASH:
            self.problem(f"{where}: an empty file whose hash {e.hash[:16]}… is not the empty file's")
        if len(e.parts) == 1 and e.parts[0][0] != e.hash:
            # a file of one part is that part: their hashes are the same string
            self.problem(f"{where}: its one part {e.parts[0][0][:16]}… is not a file of hash {e.hash[:16]}…")
        for h, n in e.parts:
            first = self.part_sizes.setdefault(h, (n, where))
            if first[0] != n:
                self.problem(f"{where}: part {h[:16]}… is {n} bytes here but {first[0]} bytes in {first[1]}")
        if len(e.parts) > 1 and self.read_data_too:
            self.whole.setdefault((e.hash, e.parts), where)

    def packed(self, where: str, e: FileEntry) -> None:
        assert e.pack is not None
        pack = e.pack.pack
        if pack not in self.objects:
            return  # reported as missing
        if pack not in self.index_sizes:
            try:
                self.index_sizes[pack] = self.store.get_index(pack).size
            except PortableError as exc:
                self.index_sizes[pack] = None
                self.problem(f"pack {pack}: index: {exc.one_line()}")
        size = self.index_sizes[pack]
        if size is not None and e.pack.offset + e.pack.length > size:
            self.problem(f"{where}: its bytes at {e.pack.offset}+{e.pack.length} run past the end of pack "
                         f"{pack[:16]}… ({size} bytes)")
        if self.read_data_too:
            self.ranges.setdefault(pack, {}).setdefault((e.pack.offset, e.pack.length, e.hash), where)

    # -- what the store holds -------------------------------------------------------------

    def wheels(self) -> None:
        """Wheel sets and indexes name objects too (section 4.8): they are reached, not garbage."""
        try:
            keys = [k for k in self.store.backend.list("wheels") if k.endswith(".json")]
        except PortableError as exc:
            self.warnings.append(f"wheels/: cannot be listed ({exc.one_line()}); the wheels it names are counted "
                                 "as reached by nothing")
            return
        for key in keys:
            try:
                obj = json.loads(self.store.backend.read(key))
                wheels = obj["wheels"]
                hashes = [w["hash"] for w in wheels]
                if not all(isinstance(h, str) for h in hashes):
                    raise TypeError("a wheel's hash is not a string")
            except (PortableError, ValueError, TypeError, KeyError) as exc:
                self.warnings.append(f"{key}: not a wheel set or index ({exc}); the wheels it names are counted "
                                     "as reached by nothing")
                continue
            self.wheel_objects.update(hashes)

    def missing(self) -> None:
        for h, where in sorted(self.needed.items()):
            if h not in self.objects:
                self.errors.append(f"object {h} needed by {where} is missing")
        for h, where in sorted(self.orphan_needed.items()):
            if h not in self.objects:
                self.warnings.append(f"object {h} needed by {where} is missing (only an orphan manifest needs it; "
                                     "harmless)")

    def unreachable(self) -> None:
        """Objects no version of any history reaches (nor a wheel set), with their sizes: what a
        prune could delete."""
        gone = sorted(set(self.objects) - set(self.needed) - self.wheel_objects)

        def size(h: str) -> int:
            try:
                return self.store.backend.size(self.objects[h])
            except PortableError:
                return 0

        with ThreadPoolExecutor(8) as pool:
            self.unreached = dict(zip(gone, pool.map(size, gone), strict=True))

    # -- reading the data back ------------------------------------------------------------

    def read_data(self, subset: float | None, seed: int | None) -> None:
        names = sorted(self.objects)
        if subset is not None:
            rng = random.Random(seed)
            names = sorted(rng.sample(names, max(1, round(len(names) * subset)))) if names else []
        chosen = set(names)
        # A file of several parts is read whole (its parts in order), when its first part is chosen.
        files = [(h, parts, where) for (h, parts), where in sorted(self.whole.items()) if parts[0][0] in chosen]
        parts_read = {p for _, parts, _ in files for p, _ in parts}
        # Trees were read and hashed already; every other chosen object is read once here.
        rest = [h for h in names if h not in parts_read and h not in self.memo]
        self.read = len({h for h in names if h in self.memo} | parts_read)
        with ThreadPoolExecutor(4) as pool:
            for problems in pool.map(lambda f: self.check_whole(*f), files):
                self.report(problems)
            for problems in pool.map(self.check_object, rest):
                self.read += 1
                self.report(problems)

    def report(self, problems: list[tuple[bool, str]]) -> None:
        for orphan_only, text in problems:
            if orphan_only:
                self.warnings.append(f"{text} (only an orphan manifest needs it; harmless)")
            else:
                self.errors.append(text)

    def _orphan_only(self, h: str) -> bool:
        return h not in self.needed

    def check_whole(self, h: str, parts: tuple[tuple[str, int], ...], where: str) -> list[tuple[bool, str]]:
        """A file of several parts as a restore assembles it."""
        orphan = self._orphan_only(parts[0][0])
        whole = blake3.blake3()
        out: list[tuple[bool, str]] = []
        for ph, n in parts:
            if ph not in self.objects:
                return out  # reported as missing
            try:
                data = self.store.backend.read(self.objects[ph])
            except PortableError as exc:
                return out + [(self._orphan_only(ph), f"object {ph} cannot be read: {exc.one_line()}")]
            out += [(self._orphan_only(ph), text) for text in self.object_problems(ph, data)]
            if len(data) != n and self.part_sizes[ph][0] == len(data):  # else object_problems said so
                out.append((orphan, f"{where}: part {ph[:16]}… has {len(data)} bytes, the manifest says {n}"))
            whole.update(data)
        if not out and whole.hexdigest() != h:
            out.append((orphan, f"{where}: its parts are sound but together do not hash to the file's hash "
                                f"{h[:16]}…"))
        return out

    def check_object(self, h: str) -> list[tuple[bool, str]]:
        try:
            data = self.store.backend.read(self.objects[h])
        except PortableError as exc:
            return [(self._orphan_only(h), f"object {h} cannot be read: {exc.one_line()}")]
        return [(self._orphan_only(h), text) for text in self.object_problems(h, data)]

    def object_problems(self, h: str, data: bytes) -> list[str]:
        """What is wrong with object ``h`` whose bytes are ``data``, for every use of it."""
        where = self.needed.get(h) or self.orphan_needed.get(h)
        if digest(data) != h:
            return [f"object {h} is corrupt: its bytes do not hash to its name"
                    + (f" (needed by {where})" if where else "")]
        out = []
        if h in self.part_sizes and len(data) != self.part_sizes[h][0]:
            n, first = self.part_sizes[h]
            out.append(f"{first}: part {h[:16]}… has {len(data)} bytes, the manifest says {n}")
        for (offset, length, fh), user in sorted(self.ranges.get(h, {}).items()):
            if offset + length > len(data):
                out.append(f"{user}: its bytes at {offset}+{length} run past the end of pack {h[:16]}… "
                           f"({len(data)} bytes)")
            elif digest(data[offset:offset + length]) != fh:
                out.append(f"{user}: its bytes at {offset}+{length} of pack {h[:16]}… do not hash to its hash "
                           f"{fh[:16]}…")
        if self.index_sizes.get(h) is not None:  # a pack: every blob its index lists hashes right
            try:
                index = self.store.get_index(h)
                for bh, o, n in index.blobs:
                    if digest(data[o:o + n]) != bh:
                        out.append(f"pack {h}: blob {bh} of its index is corrupt")
            except PortableError as exc:
                out.append(f"pack {h}: index: {exc.one_line()}")
        if h in self.lockfiles:
            from jupyter_portable.engine.runtime.lockfile import parse_lockfile

            try:
                parse_lockfile(data)
            except PortableError as exc:
                out.append(f"{self.lockfiles[h]}: the lockfile {h[:16]}… cannot be read: {exc.one_line()}")
        return out


def _text(exc: PortableError) -> str:
    """An error as fsck reports it: with its hint, unless the hint is to run fsck."""
    return str(exc) if exc.hint and "fsck" in exc.hint else exc.one_line()


def _transient(exc: BaseException) -> bool:
    """A store error that may pass (a 5xx, a reset): not a missing object, not an unsupported store."""
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


__all__ = ["FsckResult", "fsck", "parse_subset"]
