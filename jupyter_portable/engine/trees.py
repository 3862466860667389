"""Trees from entries and entries from trees: the format-2 helpers every engine step shares."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.tree import MAX_DEPTH, Node, SubTree, encode_tree, join, node_json, order_key
from jupyter_portable.store.repo import Store


def node_name(node: Node) -> str:
    return node.name if isinstance(node, SubTree) else node.path.rpartition("/")[2]


def sort_nodes(nodes: Iterable[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: order_key(node_name(n), isinstance(n, SubTree)))


class TreeWriter:
    """Builds the trees of a stream of entries given in path order, innermost folder first;
    memory is depth x width. ``put`` stores one tree's bytes and returns its hash."""

    def __init__(self, put: Callable[[bytes], str]) -> None:
        self.put = put
        self.stack: list[tuple[str, list[Node]]] = [("", [])]
        self.files = 0
        self.bytes = 0

    def add(self, entry: FileEntry) -> None:
        folder = entry.path.rpartition("/")[0]
        while self.stack[-1][0] and not (folder == self.stack[-1][0] or folder.startswith(self.stack[-1][0] + "/")):
            self._close()
        top = self.stack[-1][0]
        if folder != top:
            rest = folder[len(top) + 1:] if top else folder
            for name in rest.split("/"):
                if len(self.stack) > MAX_DEPTH:
                    raise ManifestError(f"{entry.path!r} is nested more than {MAX_DEPTH} folders deep")
                self.stack.append((join(self.stack[-1][0], name), []))
        self.stack[-1][1].append(entry)
        self.files += 1
        self.bytes += entry.size

    def _close(self) -> None:
        path, nodes = self.stack.pop()
        h = self.put(encode_tree([node_json(n) for n in sort_nodes(nodes)], path))
        self.stack[-1][1].append(SubTree(path.rpartition("/")[2], path, h))

    def finish(self) -> str:
        """Close every open folder; the root tree's hash."""
        while len(self.stack) > 1:
            self._close()
        _, nodes = self.stack[0]
        return self.put(encode_tree([node_json(n) for n in sort_nodes(nodes)], "the workspace root"))


def write_trees(store: Store, entries: Iterable[FileEntry]) -> tuple[str, int, int]:
    """Store the trees of ``entries`` (any order); ``(root hash, files, bytes)``."""
    writer = TreeWriter(store.put_tree)
    for e in sorted(entries, key=lambda e: e.path):
        writer.add(e)
    return writer.finish(), writer.files, writer.bytes


def as_tree(store: Store, manifest: Manifest) -> tuple[str, int, int]:
    """The root tree of a version: its own (schema 2), or one written now from its file list (schema 1)."""
    if manifest.tree is not None:
        return manifest.tree, manifest.file_count, manifest.total_bytes
    writer = TreeWriter(store.put_tree)
    for e in manifest.files:  # schema 1 lists files in path order
        writer.add(e)
    return writer.finish(), writer.files, writer.bytes


class BaseTree:
    """The folders of a base version, read on demand (a few at a time, most recent kept)."""

    def __init__(self, store: Store, root: str | None, keep: int = 256) -> None:
        self.store = store
        self.root = root
        self.keep = keep
        self._cache: OrderedDict[str, dict[str, Node] | None] = OrderedDict()

    def nodes(self, folder: str) -> dict[str, Node] | None:
        """Name -> node of ``folder`` in the base version; None if it has no such folder."""
        if self.root is None:
            return None
        if folder in self._cache:
            self._cache.move_to_end(folder)
            return self._cache[folder]
        if not folder:
            got: dict[str, Node] | None = {node_name(n): n for n in self.store.read_tree(self.root)}
        else:
            parent, _, name = folder.rpartition("/")
            above = self.nodes(parent)
            sub = above.get(name) if above is not None else None
            got = ({node_name(n): n for n in self.store.read_tree(sub.tree, folder, folder.count("/") + 1)}
                   if isinstance(sub, SubTree) else None)
        self._cache[folder] = got
        if len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return got

    def node(self, path: str) -> Node | None:
        folder, _, name = path.rpartition("/")
        nodes = self.nodes(folder)
        return nodes.get(name) if nodes is not None else None


def replace_at(store: Store, root: str, path: str, node: Node | None) -> str:
    """A new root in which ``path`` is ``node`` (None: absent), writing one tree per level."""
    parts = path.split("/")
    chain: list[list[Node]] = [store.read_tree(root)]
    for depth, name in enumerate(parts[:-1]):
        here = next((n for n in chain[-1] if node_name(n) == name), None)
        chain.append(store.read_tree(here.tree, here.path, depth + 1) if isinstance(here, SubTree) else [])
    current: Node | None = node
    for depth in range(len(parts) - 1, -1, -1):
        name = parts[depth]
        nodes = [n for n in chain[depth] if node_name(n) != name]
        if current is not None:
            nodes.append(current)
        folder = "/".join(parts[:depth])
        if depth == 0:
            return store.put_tree(encode_tree([node_json(n) for n in sort_nodes(nodes)], "the workspace root"))
        if nodes:
            h = store.put_tree(encode_tree([node_json(n) for n in sort_nodes(nodes)], folder))
            current = SubTree(parts[depth - 1], folder, h)
        else:
            current = None  # a folder left empty is not recorded
    raise AssertionError("unreachable")


def iter_under(store: Store, root: str, path: str) -> Iterator[FileEntry]:
    """Every file at or under ``path`` in the version whose root tree is ``root``."""
    node = store.find(root, path)
    if node is None:
        return
    if not isinstance(node, SubTree):
        yield node
        return
    yield from store.iter_files(node.tree, node.path)


def diff_trees(store: Store, a: str | None, b: str | None, at: str = "") -> Iterator[tuple[str, FileEntry | None,
                                                                                         FileEntry | None]]:
    """``(path, old, new)`` for every file that differs between two trees, skipping every
    subtree they share (memory: depth x width)."""
    if a == b:
        return
    na = {node_name(n): n for n in store.read_tree(a, at, at.count("/") + bool(at))} if a else {}
    nb = {node_name(n): n for n in store.read_tree(b, at, at.count("/") + bool(at))} if b else {}
    for name in sorted(na.keys() | nb.keys()):
        x, y = na.get(name), nb.get(name)
        xt = x.tree if isinstance(x, SubTree) else None
        yt = y.tree if isinstance(y, SubTree) else None
        if xt is not None or yt is not None:
            if xt != yt:
                yield from diff_trees(store, xt, yt, join(at, name))
        xf = x if x is not None and not isinstance(x, SubTree) else None
        yf = y if y is not None and not isinstance(y, SubTree) else None
        if xf is None and yf is None:
            continue
        if xf is None or yf is None or (xf.hash, xf.target, xf.mode) != (yf.hash, yf.target, yf.mode):
            yield join(at, name), xf, yf


def files_of(store: Store, manifest: Manifest) -> Iterator[FileEntry]:
    """A version's files in path order, streamed for schema 2."""
    return iter(manifest.files)


Json = dict[str, Any]
