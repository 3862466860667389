"""Manifest, head and pack-index records: immutable, versioned, validated on the way in.

The byte-level format is ``docs/store-format.md``; this module is its executable half.
Anything that is not exactly that format is refused with :class:`ManifestError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.errors import ManifestError, UnsafePath
from jupyter_portable.core.paths import check_link_target, check_relpath, disk_name
from jupyter_portable.core.records import CheckpointRecord, check_allocation, check_next_action, symlink_record_read
from jupyter_portable.core.tree_object import LazyFiles, TreeReader
from jupyter_portable.core.validate import (
    HASH_RE,
    MTIME_NS_MAX,
    MTIME_NS_MIN,
    check_hash,
    check_workspace_id,
    dumps_strict,
    loads_strict,
    short_repr,
)
from jupyter_portable.core.validate import check_int as _int
from jupyter_portable.core.validate import check_keys as _keys
from jupyter_portable.core.validate import check_str as _str

MANIFEST_FORMAT = "jupyter-portable.manifest"
HEAD_FORMAT = "jupyter-portable.head"
PACK_INDEX_FORMAT = "jupyter-portable.packindex"
SCHEMA = 1  # heads and pack indexes; manifests are written at MANIFEST_SCHEMA
MANIFEST_SCHEMA = 2  # a root record naming a tree (schema 1: one flat list of files, still read)

_MAX_MODE = 0o7777
# The largest object S3 and GCS store (5 TiB); no file, part, pack or offset in one may exceed it,
# and a filesystem refuses a bigger file anyway ("File too large", naming nothing).
MAX_OBJECT_SIZE = 5 * 2**40
MAX_FILE_SIZE = MAX_OBJECT_SIZE
_PACKED_KEYS = frozenset({"path", "type", "size", "mode", "hash", "mtime_ns", "pack"})
_PARTS_KEYS = frozenset({"path", "type", "size", "mode", "hash", "mtime_ns", "parts"})
_PACK_KEYS = frozenset({"id", "offset", "length"})


@dataclass(frozen=True, slots=True)
class PackRef:
    """A blob stored at ``offset`` in pack object ``pack``."""

    pack: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file or symlink of a manifest.

    A regular file's bytes live either in a pack (``pack``) or as a list of
    ``(part_hash, part_size)`` objects (``parts``) whose concatenation is the file.
    """

    path: str
    size: int = 0
    mode: int = 0o644
    hash: str = ""
    mtime_ns: int = 0
    pack: PackRef | None = None
    parts: tuple[tuple[str, int], ...] = ()
    target: str | None = None  # set only for symlinks

    @property
    def is_link(self) -> bool:
        return self.target is not None

    def object_keys(self) -> list[str]:
        """Content hashes of every store object this entry needs."""
        if self.target is not None:
            return []
        if self.pack is not None:
            return [self.pack.pack]
        return [h for h, _ in self.parts]

    def to_json(self) -> dict[str, Any]:
        if self.target is not None:
            return {"path": self.path, "type": "symlink", "target": self.target}
        out: dict[str, Any] = {
            "path": self.path,
            "type": "file",
            "size": self.size,
            "mode": self.mode,
            "hash": self.hash,
            "mtime_ns": self.mtime_ns,
        }
        if self.pack is not None:
            out["pack"] = {"id": self.pack.pack, "offset": self.pack.offset, "length": self.pack.length}
        else:
            out["parts"] = [[h, n] for h, n in self.parts]
        return out

    @classmethod
    def from_json(cls, obj: object) -> "FileEntry":
        """A validated entry. Sound regular files take a fast path that builds no messages;
        anything it does not accept goes through :meth:`_checked`, which names the problem."""
        entry = cls._fast(obj)
        return entry if entry is not None else cls._checked(obj)

    @classmethod
    def _fast(cls, obj: object) -> "FileEntry | None":
        if type(obj) is not dict or obj.get("type") != "file":
            return None
        keys = obj.keys()
        size, mode, digest, mtime_ns = obj.get("size"), obj.get("mode"), obj.get("hash"), obj.get("mtime_ns")
        if (type(size) is not int or not 0 <= size <= MAX_FILE_SIZE or type(mode) is not int
                or not 0 <= mode <= _MAX_MODE or type(digest) is not str or not HASH_RE.match(digest)
                or type(mtime_ns) is not int or not MTIME_NS_MIN <= mtime_ns <= MTIME_NS_MAX):
            return None
        try:
            path = check_relpath(obj["path"])
        except (UnsafePath, KeyError):
            return None
        if keys == _PACKED_KEYS:
            p = obj["pack"]
            if type(p) is not dict or p.keys() != _PACK_KEYS:
                return None
            pid, off, length = p["id"], p["offset"], p["length"]
            if (type(pid) is not str or not HASH_RE.match(pid) or type(off) is not int or off < 0
                    or type(length) is not int or length != size or off + length > MAX_OBJECT_SIZE):
                return None
            return cls(path, size, mode, digest, mtime_ns, pack=PackRef(pid, off, length))
        if keys != _PARTS_KEYS or type(obj["parts"]) is not list:
            return None
        parts = []
        total = 0
        for item in obj["parts"]:
            if type(item) is not list or len(item) != 2:
                return None
            h, n = item
            if type(h) is not str or not HASH_RE.match(h) or type(n) is not int or n < 1:
                return None
            parts.append((h, n))
            total += n
        if total != size:
            return None
        return cls(path, size, mode, digest, mtime_ns, parts=tuple(parts))

    @classmethod
    def _checked(cls, obj: object) -> "FileEntry":
        if not isinstance(obj, dict):
            raise ManifestError("a file entry must be a JSON object")
        kind = obj.get("type")
        path = check_relpath(obj.get("path"), what="manifest path")
        if kind == "symlink":
            _keys(obj, f"symlink {path!r}", ("path", "type", "target"))
            return cls(path=path, target=check_link_target(path, obj["target"]))
        if kind != "file":
            raise ManifestError(f"entry {path!r} has unknown type {kind!r}")
        has_pack = "pack" in obj
        _keys(obj, f"file {path!r}", ("path", "type", "size", "mode", "hash", "mtime_ns",
                                      "pack" if has_pack else "parts"))
        size = _int(obj["size"], f"size of {path!r}")
        if size > MAX_FILE_SIZE:
            raise ManifestError(f"size of {path!r} is {size} bytes, over the store's limit of "
                                f"{MAX_FILE_SIZE} bytes (5 TiB)")
        mode = _int(obj["mode"], f"mode of {path!r}")
        if mode > _MAX_MODE:
            raise ManifestError(f"mode of {path!r} is out of range: {mode}")
        digest = check_hash(obj["hash"], f"hash of {path!r}")
        mtime_ns = obj["mtime_ns"]
        if type(mtime_ns) is not int or not MTIME_NS_MIN <= mtime_ns <= MTIME_NS_MAX:
            raise ManifestError(f"mtime_ns of {path!r} must be an integer from {MTIME_NS_MIN} to {MTIME_NS_MAX} "
                                f"(a time this platform can set), got {short_repr(mtime_ns)}")
        if has_pack:
            p = _keys(obj["pack"], f"pack of {path!r}", ("id", "offset", "length"))
            ref = PackRef(check_hash(p["id"], f"pack of {path!r}"),
                          _int(p["offset"], f"pack offset of {path!r}"),
                          _int(p["length"], f"pack length of {path!r}"))
            if ref.length != size:
                raise ManifestError(f"pack length of {path!r} ({ref.length}) differs from its size ({size})")
            if ref.offset + ref.length > MAX_OBJECT_SIZE:
                raise ManifestError(f"pack offset of {path!r} lies past the store's object limit of "
                                    f"{MAX_OBJECT_SIZE} bytes")
            return cls(path, size, mode, digest, mtime_ns, pack=ref)
        raw_parts = obj["parts"]
        if not isinstance(raw_parts, list):
            raise ManifestError(f"parts of {path!r} must be a list")
        parts = []
        for item in raw_parts:
            if not isinstance(item, list) or len(item) != 2:
                raise ManifestError(f"a part of {path!r} must be [hash, size]")
            parts.append((check_hash(item[0], f"part of {path!r}"),
                          _int(item[1], f"part size of {path!r}", minimum=1)))
        if sum(n for _, n in parts) != size:
            raise ManifestError(f"parts of {path!r} do not add up to its size {size}")
        return cls(path, size, mode, digest, mtime_ns, parts=tuple(parts))


@dataclass(frozen=True, slots=True)
class ParentRef:
    version: int
    manifest: str  # the parent manifest's hash


@dataclass(frozen=True)
class Manifest:
    """One immutable version of a workspace.

    Schema 2 (what is written) names a root ``tree`` and iterates ``files`` from the trees
    as it goes; schema 1 (still read) holds every file in one list."""

    workspace_id: str
    version: int
    created: str
    files: Sequence[FileEntry]
    parent: ParentRef | None = None
    message: str = ""
    epoch: int = 0
    # Room for later records; each is validated by the issue that fills it in.
    checkpoints: tuple[dict[str, Any], ...] = ()
    runtime: dict[str, Any] | None = None
    next_action: dict[str, Any] | None = None
    allocations: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    tree: str | None = None  # schema 2: the root tree's hash
    total: int = 0  # schema 2: the bytes of every file (schema 1 adds them up)

    @classmethod
    def with_tree(cls, tree: str, file_count: int, total: int, reader: TreeReader | None = None,
                  **fields: Any) -> "Manifest":
        """A schema-2 version whose files are the tree ``tree`` (read through ``reader``)."""
        return cls(files=LazyFiles(tree, file_count, reader), tree=tree, total=total, **fields)

    @property
    def schema(self) -> int:
        return MANIFEST_SCHEMA if self.tree is not None else 1

    @property
    def file_count(self) -> int:
        return len(self.files)

    @property
    def total_bytes(self) -> int:
        return self.total if self.tree is not None else sum(f.size for f in self.files)

    def bind(self, reader: TreeReader) -> "Manifest":
        """Let a schema-2 manifest read its trees through ``reader`` (the store it came from)."""
        if isinstance(self.files, LazyFiles):
            self.files.reader = reader
        return self

    def find(self, path: str) -> FileEntry | None:
        """The entry at ``path``, reading only the trees on its way (schema 2)."""
        if isinstance(self.files, LazyFiles):
            found = self.files._need().find(self.files.tree, path)
            return found if isinstance(found, FileEntry) else None
        return next((f for f in self.files if f.path == path), None)

    def by_path(self) -> dict[str, FileEntry]:
        """Every entry by path (memory grows with the number of files: prefer iterating)."""
        return {f.path: f for f in self.files}

    def object_hashes(self) -> set[str]:
        out: set[str] = set()
        for f in self.files:
            out.update(f.object_keys())
        return out

    def _records(self) -> dict[str, Any]:
        return {
            "workspace_id": self.workspace_id,
            "version": self.version,
            "parent": None if self.parent is None
            else {"version": self.parent.version, "manifest": self.parent.manifest},
            "created": self.created,
            "message": self.message,
            "epoch": self.epoch,
            "checkpoints": list(self.checkpoints),
            "runtime": self.runtime,
            "next_action": self.next_action,
            "allocations": list(self.allocations),
        }

    def to_json(self) -> dict[str, Any]:
        if self.tree is not None:
            return {"format": MANIFEST_FORMAT, "schema": MANIFEST_SCHEMA, "tree": self.tree,
                    "file_count": len(self.files), "total_bytes": self.total, **self._records()}
        # schema 1 (still read): every file in one list (keys are sorted in the canonical bytes)
        return {"format": MANIFEST_FORMAT, "schema": 1, "files": [f.to_json() for f in self.files],
                **self._records()}

    def to_bytes(self) -> bytes:
        """The canonical bytes (computed once: the manifest is immutable)."""
        cached = self.__dict__.get("_bytes")
        if cached is None:
            cached = dumps_strict(self.to_json(), f"manifest version {self.version}", separators=(",", ":"),
                                  sort_keys=True).encode()
            object.__setattr__(self, "_bytes", cached)
        return cached

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        return cls.from_json(loads_strict(data, "manifest"))

    @classmethod
    def from_json(cls, obj: object) -> "Manifest":
        link = ManifestLink.from_json(obj)
        assert isinstance(obj, dict)
        schema, version, pref = link.schema, link.version, link.parent
        if schema == 1:
            files: Sequence[FileEntry] = _flat_files(obj["files"])
            tree, total = None, 0
        else:
            tree = check_hash(obj["tree"], "manifest tree")
            total = _int(obj["total_bytes"], "manifest total_bytes")
            files = LazyFiles(tree, _int(obj["file_count"], "manifest file_count"))
        for name in ("checkpoints", "allocations"):
            if not isinstance(obj[name], list) or not all(isinstance(x, dict) for x in obj[name]):
                raise ManifestError(f"manifest {name} must be a list of objects")
        for name in ("runtime", "next_action"):
            if obj[name] is not None and not isinstance(obj[name], dict):
                raise ManifestError(f"manifest {name} must be an object or null")
        obj["checkpoints"] = [symlink_record_read(c) for c in obj["checkpoints"]]
        ids = [CheckpointRecord.from_json(c).id for c in obj["checkpoints"]]
        if len(set(ids)) != len(ids):
            raise ManifestError("manifest checkpoints repeat an id")
        check_next_action(obj["next_action"])
        for a in obj["allocations"]:
            check_allocation(a)
        return cls(
            workspace_id=check_workspace_id(obj["workspace_id"]),
            version=version,
            created=_str(obj["created"], "created"),
            files=files,
            parent=pref,
            message=_str(obj["message"], "message"),
            epoch=_int(obj["epoch"], "epoch"),
            checkpoints=tuple(obj["checkpoints"]),
            runtime=obj["runtime"],
            next_action=obj["next_action"],
            allocations=tuple(obj["allocations"]),
            tree=tree,
            total=total,
        )


def _flat_files(raw_files: object) -> tuple[FileEntry, ...]:
    """A schema-1 file list, validated whole: no path twice, none under another entry."""
    if not isinstance(raw_files, list):
        raise ManifestError("manifest files must be a list")
    files = tuple(FileEntry.from_json(f) for f in raw_files)
    # Paths are compared as the bytes they are on disk: "é" and its escaped UTF-8 bytes
    # "\udcc3\udca9" are two strings but one file (only paths beyond ASCII can differ so).
    seen: dict[bytes, str] = {}
    for f in files:
        key = disk_name(f.path) if not f.path.isascii() else f.path.encode()
        other = seen.get(key)
        if other == f.path:
            raise ManifestError(f"manifest names {f.path!r} twice")
        if other is not None:
            raise UnsafePath(f"manifest names {other!r} and {f.path!r}, which are the same path on disk")
        seen[key] = f.path
    folders: dict[bytes, str] = {}  # the folders of paths beyond ASCII, by their bytes
    for f in files:  # a path must not live under a file or a symlink
        head, _, _ = f.path.rpartition("/")
        while head:
            wide = not head.isascii()
            key = disk_name(head) if wide else head.encode()
            if key in seen:
                raise ManifestError(f"{f.path!r} lies under another entry {head!r}")
            if wide and folders.setdefault(key, head) != head:
                raise UnsafePath(f"manifest names folders {folders[key]!r} and {head!r}, which are the same "
                                 "folder on disk")
            head, _, _ = head.rpartition("/")
    return files


@dataclass(frozen=True, slots=True)
class ManifestLink:
    """What a manifest says about its place in the history (section 5.4), validated as
    :meth:`Manifest.from_json` validates it, without reading its files: what a reader checks of
    each manifest it passes through on the way to an older version."""

    workspace_id: str
    version: int
    parent: ParentRef | None
    epoch: int
    schema: int

    @classmethod
    def from_json(cls, obj: object) -> "ManifestLink":
        if not isinstance(obj, dict):
            raise ManifestError("a manifest must be a JSON object")
        if obj.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"not a manifest (format {short_repr(obj.get('format'))})")
        schema = obj.get("schema")
        if schema not in (1, MANIFEST_SCHEMA) or type(schema) is not int:
            raise ManifestError(
                f"manifest schema {short_repr(schema)} is not supported (this package reads 1 and {MANIFEST_SCHEMA})",
                hint="upgrade jupyter-portable",
            )
        records = ("format", "schema", "workspace_id", "version", "parent", "created", "message", "epoch",
                   "checkpoints", "runtime", "next_action", "allocations")
        _keys(obj, "manifest", records + (("files",) if schema == 1 else ("tree", "file_count", "total_bytes")))
        parent = obj["parent"]
        pref = None
        if parent is not None:
            _keys(parent, "manifest parent", ("version", "manifest"))
            pref = ParentRef(_int(parent["version"], "parent version", minimum=1),
                             check_hash(parent["manifest"], "parent manifest"))
        version = _int(obj["version"], "manifest version", minimum=1)
        if (pref is None) != (version == 1) or (pref is not None and pref.version != version - 1):
            raise ManifestError(f"manifest version {version} must have parent version {version - 1}"
                                if version > 1 else "manifest version 1 must have no parent")
        return cls(check_workspace_id(obj["workspace_id"]), version, pref, _int(obj["epoch"], "epoch"), schema)


@dataclass(frozen=True, slots=True)
class Head:
    """The workspace's pointer to its newest manifest, and the allocation epoch."""

    workspace_id: str
    version: int  # 0 means: no manifest yet
    manifest: str | None  # the manifest's hash
    epoch: int
    updated: str

    def to_bytes(self) -> bytes:
        return dumps_strict({
            "format": HEAD_FORMAT, "schema": SCHEMA, "workspace_id": self.workspace_id,
            "version": self.version, "manifest": self.manifest, "epoch": self.epoch,
            "updated": self.updated,
        }, "head", sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Head":
        obj = loads_strict(data, "head")
        _keys(obj, "head", ("format", "schema", "workspace_id", "version", "manifest", "epoch", "updated"))
        if obj["format"] != HEAD_FORMAT or obj["schema"] != SCHEMA:
            raise ManifestError(f"unsupported head format {obj['format']!r} schema {obj['schema']!r}")
        version = _int(obj["version"], "head version")
        manifest = obj["manifest"]
        if version == 0:
            if manifest is not None:
                raise ManifestError("head at version 0 must not name a manifest")
        else:
            check_hash(manifest, "head manifest")
        return cls(check_workspace_id(obj["workspace_id"]), version, manifest,
                   _int(obj["epoch"], "head epoch"), _str(obj["updated"], "head updated"))


@dataclass(frozen=True, slots=True)
class PackIndex:
    """Where each blob of one pack object lies."""

    pack: str
    size: int
    blobs: tuple[tuple[str, int, int], ...]  # (hash, offset, length)

    def to_bytes(self) -> bytes:
        return dumps_strict({"format": PACK_INDEX_FORMAT, "schema": SCHEMA, "pack": self.pack,
                             "size": self.size, "blobs": [list(b) for b in self.blobs]},
                            "pack index", separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "PackIndex":
        obj = loads_strict(data, "pack index")
        _keys(obj, "pack index", ("format", "schema", "pack", "size", "blobs"))
        if obj["format"] != PACK_INDEX_FORMAT or obj["schema"] != SCHEMA:
            raise ManifestError("unsupported pack index format")
        size = _int(obj["size"], "pack size", maximum=MAX_OBJECT_SIZE)
        blobs = []
        if not isinstance(obj["blobs"], list):
            raise ManifestError("pack index blobs must be a list")
        for b in obj["blobs"]:
            if not isinstance(b, list) or len(b) != 3:
                raise ManifestError("a pack index blob must be [hash, offset, length]")
            h, off, n = check_hash(b[0], "blob"), _int(b[1], "blob offset"), _int(b[2], "blob length")
            if off + n > size:
                raise ManifestError(f"blob {h} runs past the end of its pack")
            blobs.append((h, off, n))
        return cls(check_hash(obj["pack"], "pack"), size, tuple(blobs))
