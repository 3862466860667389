"""Tree records (format 2): one folder's entries, content-addressed as in git and restic.

A version names one root tree; a folder's entry names its subtree by hash, so a version
shares every unchanged subtree with its parent. ``docs/store-format.md`` section 4.7 is
the byte-level description; anything that is not exactly that is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_portable.core.errors import ManifestError, UnsafePath
from jupyter_portable.core.paths import RESERVED_TOP, check_encodable, disk_name
from jupyter_portable.core.validate import HASH_RE, check_hash, dumps_strict, loads_strict, short_repr

TREE_FORMAT = "jupyter-portable.tree"
TREE_SCHEMA = 2
# Folders nested deeper than this are refused on both sides: a walk's memory is bounded
# by depth times width, and no real workspace comes near it (PATH_MAX is 4096 bytes).
MAX_DEPTH = 1024
_DIR_KEYS = frozenset({"name", "type", "tree"})


@dataclass(frozen=True, slots=True)
class SubTree:
    """A folder of a tree: its name, its workspace path and its own tree's hash."""

    name: str
    path: str
    tree: str


def check_name(name: object, where: str, *, top: bool) -> str:
    """One path segment: non-empty, no ``/``, NUL or backslash, not ``.``/``..``; not ``.portable`` at the top."""
    if not isinstance(name, str) or not name:
        raise UnsafePath(f"an entry of tree {where} has no name (got {short_repr(name)})")
    if "/" in name or "\x00" in name or "\\" in name or name in (".", ".."):
        raise UnsafePath(f"tree {where} has an unsafe entry name {name!r}")
    if top and name == RESERVED_TOP:
        raise UnsafePath("the root tree names the reserved .portable folder")
    check_encodable(name, f"an entry of tree {where}:")
    return name


def show_path(path: str, limit: int = 120) -> str:
    """``repr(path)`` for a one-line message: a path nested a thousand folders deep is cut in the
    middle, keeping its start and its end."""
    text = repr(path)
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]}…{text[-keep:]} ({path.count('/') + 1} levels)"


def order_key(name: str, is_dir: bool) -> str:
    """Entries are sorted as git sorts them: a folder as if its name ended in ``/``, so that
    a depth-first walk yields paths in plain string order."""
    return name + "/" if is_dir else name


def join(dirpath: str, name: str) -> str:
    return f"{dirpath}/{name}" if dirpath else name


Node = Any  # FileEntry | SubTree (FileEntry lives in manifest.py, which imports this module)


class _Unusual(Exception):
    """The fast reader met something it does not vouch for; the careful one decides."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Unusual  # a key twice
    return out


def _unusual(_text: str) -> Any:
    raise _Unusual  # a float or a NaN/Infinity constant: never in a sound tree


FastFile = Callable[[dict[str, Any], str], Any]  # (entry without its name, path) -> a file node, or None


def parse_tree(data: bytes, dirpath: str, entry_from_json: Callable[[object], Any],
               fast_file: FastFile | None = None) -> list[Node]:
    """The validated entries of one tree object at workspace path ``dirpath`` ('' for the root).

    A sound tree takes a fast path (``fast_file`` may build the commonest
    file entries, checking everything ``entry_from_json`` would, or return None); anything
    else is read again by the careful path, which refuses it naming the problem (both accept
    exactly the same trees)."""
    try:
        return _parse_fast(data, dirpath, entry_from_json, fast_file)
    except (_Unusual, ManifestError, UnsafePath, ValueError, RecursionError, KeyError, TypeError):
        pass
    return _parse_checked(data, dirpath, entry_from_json)


def _parse_fast(data: bytes, dirpath: str, entry_from_json: Callable[[object], Any],
                fast_file: FastFile | None) -> list[Node]:
    # Every value of an accepted tree is checked for its exact shape (at most 4 levels deep),
    # so the careful path's depth walk has nothing to add here.
    # UTF-8 only (json.loads of bytes takes UTF-16 and a BOM too); a BOM fails the parse below
    obj = json.loads(data.decode(), object_pairs_hook=_pairs, parse_float=_unusual, parse_constant=_unusual)
    if (type(obj) is not dict or obj.keys() != _TOP_KEYS or obj["format"] != TREE_FORMAT
            or type(obj["schema"]) is not int or obj["schema"] != TREE_SCHEMA or type(obj["entries"]) is not list):
        raise _Unusual
    out: list[Node] = []
    names: set[str] = set()
    wide: set[bytes] = set()  # the bytes of names beyond ASCII: two may be one name on disk
    last = ""
    prefix = dirpath + "/" if dirpath else ""
    top = not dirpath
    match = HASH_RE.match
    for item in obj["entries"]:
        if type(item) is not dict or "path" in item:
            raise _Unusual
        name = item.pop("name", None)
        if (type(name) is not str or not name or "/" in name or "\x00" in name or "\\" in name
                or name in (".", "..") or (top and name == RESERVED_TOP) or name in names):
            raise _Unusual
        names.add(name)
        if not name.isascii():
            try:
                on_disk = disk_name(name)
            except UnicodeEncodeError:
                raise _Unusual from None
            if on_disk in wide:
                raise _Unusual
            wide.add(on_disk)
        if item.get("type") == "dir":
            tree = item.get("tree")
            if len(item) != 2 or type(tree) is not str or not match(tree):
                raise _Unusual
            node: Node = SubTree(name, prefix + name, tree)
            key = name + "/"
        else:
            node = fast_file(item, prefix + name) if fast_file is not None else None
            if node is None:
                item["path"] = prefix + name
                node = entry_from_json(item)
            key = name
        if key <= last:
            raise _Unusual
        last = key
        out.append(node)
    return out


_TOP_KEYS = frozenset({"format", "schema", "entries"})


def _parse_checked(data: bytes, dirpath: str, entry_from_json: Callable[[object], Any]) -> list[Node]:
    where = repr(dirpath or "/")
    obj = loads_strict(data, f"tree {where}")
    if not isinstance(obj, dict) or set(obj) != {"format", "schema", "entries"}:
        raise ManifestError(f"tree {where} must have exactly the fields format, schema, entries")
    if obj["format"] != TREE_FORMAT:
        raise ManifestError(f"tree {where} is not a tree (format {short_repr(obj['format'])})")
    if obj["schema"] != TREE_SCHEMA:
        raise ManifestError(f"tree {where} has schema {short_repr(obj['schema'])}; this package reads {TREE_SCHEMA}",
                            hint="upgrade jupyter-portable")
    raw = obj["entries"]
    if not isinstance(raw, list):
        raise ManifestError(f"entries of tree {where} must be a list")
    out: list[Node] = []
    last: str | None = None
    top = not dirpath
    for item in raw:
        if not isinstance(item, dict):
            raise ManifestError(f"an entry of tree {where} is not a JSON object")
        name = check_name(item.get("name"), where, top=top)
        path = join(dirpath, name)
        kind = item.get("type")
        if kind == "dir":
            if item.keys() != _DIR_KEYS:
                raise ManifestError(f"folder {path!r} must have exactly the fields name, type, tree")
            node: Node = SubTree(name, path, check_hash(item["tree"], f"tree of {path!r}"))
            key = name + "/"
        else:
            fields = {k: v for k, v in item.items() if k != "name"}
            fields["path"] = path
            node = entry_from_json(fields)
            key = name
        if last is not None and key <= last:
            raise ManifestError(f"entries of tree {where} are out of order or name {name!r} twice",
                                hint="a tree lists each name once, sorted (a folder as NAME/)")
        last = key
        out.append(node)
    _no_twins(out, where)
    return out


def _no_twins(nodes: list[Node], where: str) -> None:
    # "a" (a file) and "a/" (a folder) sort apart; a name may still appear once only. Two
    # different strings can be one name on disk too: "é" and its escaped UTF-8 bytes
    # "\udcc3\udca9" (only names beyond ASCII can).
    names = [n.name if isinstance(n, SubTree) else n.path.rpartition("/")[2] for n in nodes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ManifestError(f"tree {where} names {dup!r} twice")
    seen: dict[bytes, str] = {}
    for name in names:
        if not name.isascii():
            other = seen.setdefault(disk_name(name), name)
            if other != name:
                raise UnsafePath(f"tree {where} names {other!r} and {name!r}, which are the same name on disk "
                                 f"({disk_name(name)!r})", hint="this store holds a hostile or corrupt tree")


def node_json(node: Node) -> dict[str, Any]:
    """A node as its tree entry (``name`` instead of ``path``)."""
    if isinstance(node, SubTree):
        return {"name": node.name, "type": "dir", "tree": node.tree}
    out: dict[str, Any] = node.to_json()
    out["name"] = out.pop("path").rpartition("/")[2]
    return out


_quote = json.encoder.encode_basestring_ascii  # the escaping json.dumps itself uses (ensure_ascii)
_PACKED_KEYS = frozenset({"hash", "mode", "mtime_ns", "name", "pack", "size", "type"})
_REF_KEYS = frozenset({"id", "length", "offset"})


def entry_text(entry: dict[str, Any], where: str = "a folder") -> str:
    """One tree entry as canonical JSON: exactly what ``json.dumps(entry, sort_keys=True,
    separators=(",", ":"))`` writes. The commonest entries (a packed file, a folder) are
    written directly, a few times faster; anything else goes through ``json.dumps``."""
    keys = entry.keys()
    if keys == _PACKED_KEYS:
        ref, name, h, kind = entry["pack"], entry["name"], entry["hash"], entry["type"]
        size, mode, mtime_ns = entry["size"], entry["mode"], entry["mtime_ns"]
        if (kind == "file" and type(ref) is dict and ref.keys() == _REF_KEYS and type(name) is str
                and type(h) is str and type(size) is int and type(mode) is int and type(mtime_ns) is int):
            pid, length, offset = ref["id"], ref["length"], ref["offset"]
            if type(pid) is str and type(length) is int and type(offset) is int:
                return (f'{{"hash":{_quote(h)},"mode":{mode},"mtime_ns":{mtime_ns},"name":{_quote(name)},'
                        f'"pack":{{"id":{_quote(pid)},"length":{length},"offset":{offset}}},'
                        f'"size":{size},"type":"file"}}')
    elif keys == _DIR_KEYS:
        name, tree = entry["name"], entry["tree"]
        if entry["type"] == "dir" and type(name) is str and type(tree) is str:
            return f'{{"name":{_quote(name)},"tree":{_quote(tree)},"type":"dir"}}'
    return dumps_strict(entry, f"an entry of the tree of {where}", separators=(",", ":"), sort_keys=True)


def packed_text(name: str, h: str, mode: int, mtime_ns: int, size: int) -> tuple[str, str]:
    """:func:`entry_text` of a packed file split around its pack ref, for a file hashed before
    its pack is formed: ``head + pack_ref_text(...) + tail`` is the whole entry."""
    return (f'{{"hash":{_quote(h)},"mode":{int(mode)},"mtime_ns":{int(mtime_ns)},"name":{_quote(name)},"pack":',
            f',"size":{int(size)},"type":"file"}}')


def pack_ref_text(pack: str, offset: int, length: int) -> str:
    """A pack ref as :func:`entry_text` writes it inside a packed file's entry."""
    return f'{{"id":{_quote(pack)},"length":{int(length)},"offset":{int(offset)}}}'


def encode_tree(entries: Sequence[dict[str, Any]], where: str = "a folder") -> bytes:
    """Canonical bytes of a tree whose ``entries`` are already in :func:`order_key` order:
    ``json.dumps`` of ``{"format", "schema", "entries"}`` with sorted keys and no spaces."""
    return encode_texts([entry_text(e, where) for e in entries])


def encode_texts(texts: Sequence[str]) -> bytes:
    """:func:`encode_tree` of entries already written by :func:`entry_text` (in order)."""
    body = ",".join(texts)
    return f'{{"entries":[{body}],"format":{_quote(TREE_FORMAT)},"schema":{TREE_SCHEMA}}}'.encode()


class TreeReader(Protocol):
    """What reads a version's trees (the store); core holds no I/O of its own."""

    def iter_files(self, tree: str) -> Iterator[Any]: ...

    def find(self, tree: str, path: str) -> Any: ...


class LazyFiles(Sequence[Any]):
    """A format-2 version's files: counted without reading, streamed from the trees when
    iterated (memory bounded by depth and width), listed whole only when indexed."""

    def __init__(self, tree: str, count: int, reader: TreeReader | None = None) -> None:
        self.tree = tree
        self.n = count
        self.reader = reader
        self._all: tuple[Any, ...] | None = None

    def _need(self) -> TreeReader:
        if self.reader is None:
            raise ManifestError("this version's trees were not read from a store")
        return self.reader

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        if self._all is not None:
            return iter(self._all)
        return self._need().iter_files(self.tree)

    def __getitem__(self, i: Any) -> Any:
        if self._all is None:
            self._all = tuple(self._need().iter_files(self.tree))
        return self._all[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyFiles) and other.tree == self.tree

    def __hash__(self) -> int:
        return hash(self.tree)

    def __repr__(self) -> str:
        return f"LazyFiles(tree={self.tree[:16]}…, count={self.n})"


__all__ = ["MAX_DEPTH", "TREE_FORMAT", "TREE_SCHEMA", "LazyFiles", "SubTree", "TreeReader", "check_name",
           "encode_texts", "encode_tree", "entry_text", "join", "node_json", "order_key", "pack_ref_text",
           "packed_text", "parse_tree", "show_path"]
