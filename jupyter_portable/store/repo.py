"""The store format over a backend: objects, packs, manifests and the head.

Layout (``docs/store-format.md`` is the full description)::

    config.json                                     store format marker
    objects/<h[:2]>/<h>                             immutable blobs and trees keyed by BLAKE3
    index/<p[:2]>/<p>.json                          which blobs each pack object holds
    workspaces/<id>/manifests/<v:010d>-<m>.json     manifest version v, BLAKE3 m
    workspaces/<id>/HEAD                            newest version, its manifest, epoch

Write order is data, then index, then manifest, then head (invariant 2).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import blake3

from jupyter_portable.core.errors import (
    ConflictError,
    FencedError,
    IntegrityError,
    ManifestError,
    ObjectMissing,
    PortableError,
    StoreError,
    VersionNotFound,
)
from jupyter_portable.core.manifest import (
    MAX_FILE_SIZE,
    MAX_OBJECT_SIZE,
    FileEntry,
    Head,
    Manifest,
    ManifestLink,
    PackIndex,
    PackRef,
    check_hash,
    check_workspace_id,
)
from jupyter_portable.core.times import now_iso
from jupyter_portable.core.tree_object import MAX_DEPTH, Node, SubTree, parse_tree, show_path
from jupyter_portable.core.validate import MTIME_NS_MAX, MTIME_NS_MIN, loads_strict
from jupyter_portable.store import open_backend
from jupyter_portable.store.backend import Backend

STORE_FORMAT = "jupyter-portable.store"
STORE_SCHEMA = 1
READBACK_WORKERS = 8  # a large file's parts read back at once (bench/checkpoint.py)
# The command that works after another writer moved the head: publishing again without
# --force fails the same way, since this copy is still based on the older version.
CONFLICT_HINT = ("run `jupyter portable snapshot --force` to publish this copy on top of the newer version "
                 "(it stays in the history), or restore the latest version into another directory")


def digest(data: bytes | memoryview) -> str:
    """BLAKE3 of ``data`` in hex: the name the store gives those bytes."""
    return blake3.blake3(data).hexdigest()


_MMAP_MIN = 1 << 20


def hash_file(path: str | os.PathLike[str], size: int | None = None) -> str:
    """:func:`digest` of a file's bytes, read through mmap (``size``: its size, when known)."""
    n = size if size is not None else os.stat(path).st_size
    if n < _MMAP_MIN:  # mapping a small file costs more than reading it
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
        return blake3.blake3(b"".join(chunks)).hexdigest()
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(os.fspath(path))
    return h.hexdigest()


_PACKED_KEYS = frozenset({"type", "size", "mode", "hash", "mtime_ns", "pack"})
_PACK_KEYS = frozenset({"id", "offset", "length"})
_HEX = "0123456789abcdef"


def _hex64(v: object) -> bool:
    return type(v) is str and len(v) == 64 and not v.strip(_HEX)


def _packed_file(item: dict[str, Any], path: str) -> FileEntry | None:
    """A packed file's tree entry (its name already checked and joined into ``path``), checked
    as :meth:`FileEntry.from_json` checks it; None for anything else (it decides)."""
    if item.keys() != _PACKED_KEYS or item["type"] != "file":
        return None
    size, mode, h, mtime, p = item["size"], item["mode"], item["hash"], item["mtime_ns"], item["pack"]
    if (type(size) is not int or not 0 <= size <= MAX_FILE_SIZE or type(mode) is not int or not 0 <= mode <= 0o7777
            or not _hex64(h) or type(mtime) is not int or not MTIME_NS_MIN <= mtime <= MTIME_NS_MAX
            or type(p) is not dict or p.keys() != _PACK_KEYS):
        return None
    pid, off, length = p["id"], p["offset"], p["length"]
    if (not _hex64(pid) or type(off) is not int or off < 0 or type(length) is not int or length != size
            or off + length > MAX_OBJECT_SIZE):
        return None
    return FileEntry(path, size, mode, h, mtime, pack=PackRef(pid, off, length))


def check_depth(dirpath: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ManifestError(f"folder {show_path(dirpath)} is nested more than {MAX_DEPTH} levels deep",
                            hint="this store holds a hostile or corrupt tree")


def tree_entries(data: bytes, dirpath: str, depth: int) -> list[Node]:
    """The validated entries of a tree object's bytes (already hashed against its name), the
    tree of the folder at workspace path ``dirpath``, ``depth`` folders down."""
    check_depth(dirpath, depth)
    return parse_tree(data, dirpath, FileEntry.from_json, _packed_file)


def object_key(h: str) -> str:
    return f"objects/{h[:2]}/{h}"


def index_key(pack: str) -> str:
    return f"index/{pack[:2]}/{pack}.json"


def manifests_prefix(ws: str) -> str:
    return f"workspaces/{ws}/manifests"


def manifest_key(ws: str, version: int, mhash: str) -> str:
    return f"{manifests_prefix(ws)}/{version:010d}-{mhash}.json"


def head_key(ws: str) -> str:
    return f"workspaces/{ws}/HEAD"


def parse_manifest_key(key: str) -> tuple[int, str]:
    """``(version, manifest hash)`` from a manifest key; ManifestError if malformed."""
    name = key.rsplit("/", 1)[-1]
    stem, _, ext = name.partition(".")
    ver, _, mhash = stem.partition("-")
    if ext != "json" or len(ver) != 10 or not ver.isdigit():
        raise ManifestError(f"malformed manifest key {key!r}")
    return int(ver), check_hash(mhash, f"manifest key {key!r}")


class Store:
    """A store of workspaces: immutable objects, manifests and one head per workspace."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.url = backend.url
        self._config_ok = False

    @classmethod
    def open(cls, url: str) -> "Store":
        return cls(open_backend(url))

    # -- store marker ------------------------------------------------------------------

    def ensure_config(self) -> None:
        """Write ``config.json`` if absent; refuse a store of another format."""
        got = self.backend.read_versioned("config.json")
        if got is None:
            body = json.dumps({"format": STORE_FORMAT, "schema": STORE_SCHEMA}).encode()
            try:
                self.backend.write_new("config.json", body)
            except ConflictError:
                pass  # a concurrent init wrote it; checked below
            got = self.backend.read_versioned("config.json")
            if got is None:
                raise StoreError(f"config.json written to {self.url} cannot be read back", hint="try again")
        self.check_config(got[0], self.url)
        self._config_ok = True

    def check_store(self) -> None:
        """Refuse to read a store whose ``config.json`` is missing, foreign or of another
        schema (read once per Store: the marker never changes under a reader)."""
        if self._config_ok:
            return
        try:
            data = self.backend.read("config.json")
        except ObjectMissing as exc:
            raise StoreError(
                f"{self.url} is not a jupyter-portable store: it has no config.json",
                hint="check the store URL (`jupyter portable init --store URL` creates a store); "
                     "if this is the right store, its config.json was lost: restore it from a backup",
            ) from exc
        self.check_config(data, self.url)
        self._config_ok = True

    @staticmethod
    def check_config(data: bytes, url: str = "the store") -> None:
        """Accept only this package's format at the schema it reads; ManifestError otherwise."""
        try:
            obj = loads_strict(data, f"config.json of {url}")
        except ManifestError as exc:
            raise ManifestError(str(exc), hint="check the store URL; if it is right, restore config.json from a "
                                               "backup") from exc
        if not isinstance(obj, dict) or obj.get("format") != STORE_FORMAT:
            raise ManifestError(f"{url} holds something that is not a jupyter-portable store "
                                f"(config.json says format {obj.get('format') if isinstance(obj, dict) else obj!r})",
                                hint="check the store URL: point it at a jupyter-portable store")
        if obj.get("schema") != STORE_SCHEMA:
            raise ManifestError(f"{url}: its config.json says store schema {obj.get('schema')!r}; this "
                                f"jupyter-portable reads schema {STORE_SCHEMA} only",
                                hint="upgrade jupyter-portable to a version that reads it")

    # -- objects -----------------------------------------------------------------------

    def put_object(self, data: bytes, h: str | None = None) -> str:
        h = h or digest(data)
        self.backend.write_blob(object_key(h), data)
        return h

    def has_object(self, h: str) -> bool:
        return self.backend.exists(object_key(h))

    def get_object(self, h: str, *, what: str | None = None) -> bytes:
        """The object's bytes, hashed equal to its name; IntegrityError otherwise."""
        data = self.backend.read(object_key(h))
        if digest(data) != h:
            raise IntegrityError(
                f"object {h[:16]}… in {self.url} is corrupt"
                + (f" (needed for {what})" if what else "")
                + ": its bytes do not hash to its name",
                hint="run `jupyter portable fsck --read-data`; restore another version",
            )
        return data

    def get_range(self, h: str, start: int, end: int) -> bytes:
        """Unverified bytes of an object; the caller hashes what it extracts."""
        return self.backend.read_range(object_key(h), start, end)

    def write_pack(self, index: PackIndex, body: bytes) -> None:
        """Store a pack object, then its index (data before index)."""
        self.backend.write_blob(object_key(index.pack), body)
        self.backend.write_blob(index_key(index.pack), index.to_bytes())

    def read_file_range(self, entry: FileEntry, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stored file, fetching only the parts that hold them.

        Each part fetched is hashed against its name; a packed file is fetched whole
        and hashed (packed files are small).
        """
        if entry.target is not None:
            raise ManifestError(f"{entry.path} is a symlink, not a file")
        start, end = max(0, start), min(end, entry.size)
        if end <= start:
            return b""
        if entry.pack is not None:
            blob = self.get_range(entry.pack.pack, entry.pack.offset, entry.pack.offset + entry.pack.length)
            if digest(blob) != entry.hash:
                raise IntegrityError(f"{entry.path}: the bytes from the store do not match its hash")
            return blob[start:end]
        out, off = [], 0
        for h, n in entry.parts:
            if off < end and off + n > start:
                data = self.get_object(h, what=entry.path)
                out.append(data[max(0, start - off):min(n, end - off)])
            off += n
        return b"".join(out)

    def verify_file(self, entry: FileEntry, *, workers: int = READBACK_WORKERS,
                    on_bytes: Callable[[int], None] | None = None) -> None:
        """Read a stored file back and hash it equal to its entry (or raise). A large file's
        parts are fetched ``workers`` at a time and hashed as they arrive, in order: each part
        against its name, the whole against the entry (no second pass over anything).
        ``on_bytes`` is told each part's size once it is hashed."""
        if entry.target is not None:
            return
        if entry.pack is not None:
            blob = self.get_range(entry.pack.pack, entry.pack.offset, entry.pack.offset + entry.pack.length)
            got = digest(blob)
            if on_bytes is not None:
                on_bytes(len(blob))
        else:
            whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
            parts = list(entry.parts)

            def fetch(h: str) -> bytes:
                return self.get_object(h, what=entry.path)

            with ThreadPoolExecutor(max(1, min(workers, len(parts) or 1)),
                                    thread_name_prefix="portable-readback") as pool:
                window: deque[tuple[Future[bytes], int]] = deque()
                queue = iter(parts)
                try:
                    for h, n in itertools.islice(queue, workers):
                        window.append((pool.submit(fetch, h), n))
                    while window:
                        fut, n = window.popleft()
                        data = fut.result()
                        nxt = next(queue, None)
                        if nxt is not None:
                            window.append((pool.submit(fetch, nxt[0]), nxt[1]))
                        if len(data) != n:
                            raise IntegrityError(f"{entry.path}: a part read back has {len(data)} bytes, not {n}")
                        whole.update(data)
                        if on_bytes is not None:
                            on_bytes(n)
                finally:
                    for fut, _n in window:
                        fut.cancel()
            got = whole.hexdigest()
        if got != entry.hash:
            raise IntegrityError(f"{entry.path}: the bytes read back from the store do not match its hash")

    # -- trees (format 2) ------------------------------------------------------------

    def put_tree(self, body: bytes) -> str:
        """Store one tree object (its bytes from :func:`~jupyter_portable.core.tree_object.encode_tree`)."""
        return self.put_object(body)

    def read_tree(self, h: str, dirpath: str = "", depth: int = 0) -> list[Node]:
        """The validated entries of tree ``h`` found at workspace path ``dirpath``."""
        check_depth(dirpath, depth)
        return tree_entries(self.get_object(h, what=f"the tree of {dirpath or '/'}"), dirpath, depth)

    def iter_nodes(self, tree: str, at: str = "") -> Iterator[tuple[int, Node]]:
        """Every node under ``tree`` (the folder at workspace path ``at``) depth-first in path
        order, with its depth; a folder comes before its contents. Holds one listing per
        level: memory is depth x width."""
        base = at.count("/") + 1 if at else 0
        stack: list[Iterator[Node]] = [iter(self.read_tree(tree, at, base))]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                continue
            yield base + len(stack) - 1, node
            if isinstance(node, SubTree):
                stack.append(iter(self.read_tree(node.tree, node.path, base + len(stack))))

    def iter_files(self, tree: str, at: str = "") -> Iterator[FileEntry]:
        """Every file and symlink under ``tree``, in path order, streamed."""
        for _depth, node in self.iter_nodes(tree, at):
            if not isinstance(node, SubTree):
                yield node

    def find(self, tree: str, path: str) -> Node | None:
        """The node at ``path`` under ``tree`` (reading only the trees on its way), or None."""
        parts = path.split("/")
        nodes = self.read_tree(tree)
        for depth, name in enumerate(parts):
            node = next((n for n in nodes if (n.name if isinstance(n, SubTree) else n.path.rpartition("/")[2])
                         == name), None)
            if node is None or depth == len(parts) - 1:
                return node
            if not isinstance(node, SubTree):
                return None
            nodes = self.read_tree(node.tree, node.path, depth + 1)
        return None

    def get_index(self, pack: str) -> PackIndex:
        index = PackIndex.from_bytes(self.backend.read(index_key(pack)))
        if index.pack != pack:
            raise ManifestError(f"pack index {pack} names another pack {index.pack}")
        return index

    # -- head and manifests ------------------------------------------------------------

    def read_head(self, ws: str) -> tuple[Head, str]:
        """The head and its CAS token; VersionNotFound if the workspace is unknown."""
        check_workspace_id(ws)
        self.check_store()
        got = self.backend.read_versioned(head_key(ws))
        if got is None:
            raise VersionNotFound(
                f"workspace {ws} does not exist in {self.url}",
                hint="check the store URL and the workspace id (`jupyter portable log` in a copy)",
            )
        head = Head.from_bytes(got[0])
        if head.workspace_id != ws:
            raise ManifestError(f"head of {ws} names workspace {head.workspace_id}")
        return head, got[1]

    def create_workspace(self, ws: str) -> Head:
        self.ensure_config()
        head = Head(check_workspace_id(ws), 0, None, 0, now_iso())
        self.backend.swap(head_key(ws), head.to_bytes(), None)
        return head

    def claim_epoch(self, ws: str, *, attempts: int = 8) -> int:
        """Advance the head's allocation epoch; every writer of an older epoch is fenced off.

        Another writer may move the head between the read and the swap (the loss of the last
        machine being recorded as a Continue starts): the claim reads the head again and retries,
        ``attempts`` times at most, since a claim only needs to be above whatever is there."""
        for _ in range(attempts - 1):
            with contextlib.suppress(ConflictError):
                return self._claim_once(ws)
        return self._claim_once(ws)

    def _claim_once(self, ws: str) -> int:
        head, token = self.read_head(ws)
        new = replace(head, epoch=head.epoch + 1, updated=now_iso())
        self.backend.swap(head_key(ws), new.to_bytes(), token)
        return new.epoch

    def read_manifest_key(self, key: str) -> Manifest:
        return Manifest.from_json(self.read_manifest_link(key)[0]).bind(self)

    def read_manifest_link(self, key: str) -> tuple[Any, ManifestLink]:
        """A manifest's JSON (its bytes hashed against its key), and its place in the history,
        checked against the key (its files are not looked at)."""
        data = self.backend.read(key)
        version, mhash = parse_manifest_key(key)
        if digest(data) != mhash:
            raise IntegrityError(f"manifest {key} is corrupt: its bytes do not hash to its name",
                                 hint="run `jupyter portable fsck` to see the whole history")
        obj = loads_strict(data, "manifest")
        link = ManifestLink.from_json(obj)
        if link.version != version:
            raise ManifestError(f"manifest {key} says version {link.version}")
        return obj, link

    def read_manifest(self, ws: str, version: int | None = None) -> Manifest:
        """The manifest at ``version`` (default: the head's) of the workspace's one history,
        reached from the head through ``parent`` links: each manifest on the way is hashed
        against the name its child gives and its link checked (section 5.4: version, epoch), and
        the one asked for is validated in full. Never through a listing, which holds orphans."""
        head, _ = self.read_head(ws)
        if head.version == 0:
            raise VersionNotFound(f"workspace {ws} has no snapshot yet",
                                  hint="run `jupyter portable snapshot` in the workspace")
        want = head.version if version is None else version
        if want < 1 or want > head.version:
            raise VersionNotFound(f"workspace {ws} has versions 1 to {head.version}, not {version}")
        at, mhash = head.version, head.manifest or ""
        child: ManifestLink | None = None
        while True:
            obj, link = self.read_manifest_link(manifest_key(ws, at, mhash))
            self._check_link(ws, head, link, child)
            if at == want:
                return self._checked(ws, Manifest.from_json(obj).bind(self))
            assert link.parent is not None  # only version 1 has none, and want >= 1
            child, at, mhash = link, link.parent.version, link.parent.manifest

    @staticmethod
    def _checked(ws: str, manifest: Manifest) -> Manifest:
        if manifest.workspace_id != ws:
            raise ManifestError(f"a manifest of {ws} names workspace {manifest.workspace_id}")
        return manifest

    def chain(self, ws: str, head: Head) -> Iterator[Manifest]:
        """The manifests of ``head``'s history, newest first, read one at a time as they are
        taken. Each is checked as section 5.4 of docs/store-format.md asks: it hashes to the name
        its child (or the head) gives, its version is one below its child's (ending at 1), and its
        epoch is not above the head's nor above its child's. A reader checks the links it follows;
        fsck follows them all."""
        version, mhash = head.version, head.manifest
        child: ManifestLink | None = None
        while version and mhash:
            obj, link = self.read_manifest_link(manifest_key(ws, version, mhash))
            self._check_link(ws, head, link, child)
            yield self._checked(ws, Manifest.from_json(obj).bind(self))
            if link.parent is None:
                return
            child, version, mhash = link, link.parent.version, link.parent.manifest

    @staticmethod
    def _check_link(ws: str, head: Head, link: ManifestLink, child: ManifestLink | None) -> None:
        """Section 5.4 for one manifest of ``ws``'s history: its workspace, and an epoch not above
        the head's (``child``: the version that named it as its parent) nor its child's."""
        if link.workspace_id != ws:
            raise ManifestError(f"a manifest of {ws} names workspace {link.workspace_id}")
        if link.epoch > head.epoch:
            raise ManifestError(f"version {link.version} of {ws} has epoch {link.epoch}, above the head's "
                                f"{head.epoch}: a writer that was fenced off, or a corrupt store",
                                hint="run `jupyter portable fsck` to see the whole history")
        if child is not None and child.epoch < link.epoch:
            raise ManifestError(f"version {child.version} of {ws} has epoch {child.epoch}, below its parent's "
                                f"{link.epoch}: its history is not one line of writers",
                                hint="run `jupyter portable fsck` to see the whole history")

    def history(self, ws: str) -> list[Manifest]:
        """Every published manifest, newest first, following parent links from the head."""
        head, _ = self.read_head(ws)
        return list(self.chain(ws, head))

    def publish(self, manifest: Manifest, *, expected_version: int, epoch: int) -> str:
        """Publish ``manifest`` as the next version, by compare-and-swap on the head.

        Every object the manifest names must already be durable (the caller wrote them).
        ConflictError if the head moved past ``expected_version``; FencedError if the
        head's epoch is newer than ``epoch``. Returns the manifest's hash.
        """
        ws = manifest.workspace_id
        head, token = self.read_head(ws)
        if head.epoch > epoch:
            raise FencedError(
                f"workspace {ws} was claimed by a newer allocation (epoch {head.epoch}, "
                f"this copy holds {epoch}); this copy can no longer publish",
                hint="restore the workspace afresh to continue from its latest version",
            )
        if head.version != expected_version:
            raise ConflictError(
                f"workspace {ws} moved to version {head.version} while this copy was based on "
                f"version {expected_version}",
                hint=CONFLICT_HINT,
            )
        if manifest.version != head.version + 1:
            raise ConflictError(f"manifest version {manifest.version} does not follow head {head.version}")
        body = manifest.to_bytes()
        mhash = digest(body)
        self.backend.write_new(manifest_key(ws, manifest.version, mhash), body)
        new_head = Head(ws, manifest.version, mhash, max(head.epoch, epoch), now_iso())
        try:
            self.backend.swap(head_key(ws), new_head.to_bytes(), token)
        except (ConflictError, StoreError) as exc:
            # The swap may have landed even though its answer was lost or was a 412 on a
            # retry: only the head can tell, and a version we published is never lost.
            ours = self.published(ws, manifest.version, mhash)
            if ours:
                return mhash
            if ours is None:
                raise StoreError(
                    f"cannot tell whether version {manifest.version} of {ws} was published: {exc}",
                    hint="run the same command again: it finds out which") from exc
            if isinstance(exc, ConflictError):
                raise ConflictError(
                    f"another writer published version {manifest.version} of {ws} first",
                    hint=CONFLICT_HINT) from exc
            raise StoreError(f"version {manifest.version} of {ws} was not published: {exc}",
                             hint="run the same command again") from exc
        return mhash

    def published(self, ws: str, version: int, mhash: str) -> bool | None:
        """Whether the workspace's history holds manifest ``mhash`` as ``version``; None if
        the store cannot be read to tell."""
        try:
            head, _ = self.read_head(ws)
            at, name = head.version, head.manifest
            while at > version and name:
                parent = self.read_manifest_key(manifest_key(ws, at, name)).parent
                at, name = (parent.version, parent.manifest) if parent else (0, None)
        except PortableError:
            return None
        return at == version and name == mhash

    # -- small mutable documents kept with the workspace (settings, reservations) --------

    DOCS = ("settings", "reservations", "allocations")

    def _doc_key(self, ws: str, name: str) -> str:
        if name not in self.DOCS:
            raise ManifestError(f"unknown workspace document {name!r}")
        return f"workspaces/{check_workspace_id(ws)}/{name}.json"

    def read_doc(self, ws: str, name: str) -> Any:
        """A workspace document's JSON value, or None if it was never written."""
        got = self.backend.read_versioned(self._doc_key(ws, name))
        if got is None:
            return None
        try:
            return json.loads(got[0])
        except ValueError as exc:
            raise ManifestError(f"workspace document {name} of {ws} is not valid JSON") from exc

    def update_doc(self, ws: str, name: str, change: Callable[[Any], Any], *, tries: int = 8) -> Any:
        """Read, change and compare-and-swap a workspace document; retried when raced."""
        key = self._doc_key(ws, name)
        for _ in range(tries):
            got = self.backend.read_versioned(key)
            current = None if got is None else json.loads(got[0])
            new = change(current)
            try:
                self.backend.swap(key, json.dumps(new, sort_keys=True).encode(), None if got is None else got[1])
                return new
            except ConflictError:
                continue
        raise ConflictError(f"workspace document {name} of {ws} kept changing under us", hint="try again")

    def workspaces(self) -> list[str]:
        out = []
        for key in self.backend.list("workspaces"):
            parts = key.split("/")
            if len(parts) == 3 and parts[2] == "HEAD":
                out.append(parts[1])
        return out


__all__ = ["Store", "ObjectMissing", "digest", "hash_file", "object_key", "index_key"]
