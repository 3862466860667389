"""Trees from entries and entries from trees: the format-2 helpers every engine step shares."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.manifest import FileEntry, Manifest
from jupyter_portable.core.tree_object import (
    MAX_DEPTH,
    Node,
    SubTree,
    encode_tree,
    join,
    node_json,
    order_key,
    show_path,
)
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
                    raise ManifestError(f"{show_path(entry.path)} is nested more than {MAX_DEPTH} folders deep")
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


@dataclass(frozen=True, slots=True)
class TreeCount:
    """What a tree holds, every path counted: files and symlinks, their bytes, folders, and
    how many levels of folders lie under it (0: none)."""

    files: int
    bytes: int
    folders: int
    height: int


def count_trees(store: Store, root: str, memo: dict[str, TreeCount] | None = None,
                seen: Callable[[str, str, list[Node]], None] | None = None) -> TreeCount:
    """Count the version whose root tree is ``root``, reading each distinct tree once (a
    subtree named twice is counted twice, walked once), so a store whose trees name each
    other many times costs one read a tree, not one a path. ``memo`` carries the counts of
    trees already read (between versions); ``seen(hash, folder, nodes)`` is called once for
    each tree read. The root is always read afresh: it alone may not hold ``.portable``."""
    memo = {} if memo is None else memo
    # a frame: hash, folder, depth, its subfolders, the next one to count, files, bytes, folders, height
    stack: list[list[Any]] = []

    def push(h: str, folder: str, depth: int) -> None:
        nodes = store.read_tree(h, folder, depth)  # checks the depth, the hash and every entry
        if seen is not None:
            seen(h, folder, nodes)
        subs = [n for n in nodes if isinstance(n, SubTree)]
        files = [n for n in nodes if not isinstance(n, SubTree)]
        stack.append([h, folder, depth, subs, 0, len(files), sum(f.size for f in files), 0, 0])

    def add(frame: list[Any], sub: TreeCount) -> None:
        frame[5] += sub.files
        frame[6] += sub.bytes
        frame[7] += 1 + sub.folders
        frame[8] = max(frame[8], 1 + sub.height)

    push(root, "", 0)
    while True:
        frame = stack[-1]
        if frame[4] < len(frame[3]):
            sub = frame[3][frame[4]]
            frame[4] += 1
            got = memo.get(sub.tree)
            if got is None:
                push(sub.tree, sub.path, frame[2] + 1)
            elif frame[2] + 1 + got.height > MAX_DEPTH:
                raise ManifestError(f"folder {show_path(sub.path)} holds folders nested more than {MAX_DEPTH} levels "
                                    "deep", hint="this store holds a hostile or corrupt tree")
            else:
                add(frame, got)
            continue
        stack.pop()
        count = memo[frame[0]] = TreeCount(frame[5], frame[6], frame[7], frame[8])
        if not stack:
            return count
        add(stack[-1], count)


def most_folders(files: int) -> int:
    """The most folders below the root (the root is not counted) a version of ``files`` files
    can hold: a writer records no empty folder, and no file lies more than MAX_DEPTH down.
    ``check_count`` and ``verify``'s walk both hold versions to it."""
    return max(1, files) * MAX_DEPTH


def check_count(manifest: Manifest, count: TreeCount) -> None:
    """Refuse a version whose trees do not hold what its manifest says, or that name far more
    folders than its files could need (a writer records no empty folder, and no file lies more
    than MAX_DEPTH folders down): such trees name subtrees over and over, and walking every
    path of them would not end."""
    if (count.files, count.bytes) != (manifest.file_count, manifest.total_bytes):
        raise ManifestError(f"version {manifest.version} says {manifest.file_count} files and "
                            f"{manifest.total_bytes} bytes, but its trees hold {_many(count.files)} files and "
                            f"{_many(count.bytes)} bytes", hint="run `jupyter portable fsck`; restore another version")
    if count.folders > most_folders(count.files):
        raise ManifestError(f"version {manifest.version} has {count.files} files in {_many(count.folders)} "
                            f"folders, more than {MAX_DEPTH} a file: its trees name subtrees over and over",
                            hint="run `jupyter portable fsck`; restore another version")


def _many(n: int) -> str:
    """A count, shortened when a hostile store made it astronomical."""
    return str(n) if n < 10**15 else f"about 2^{n.bit_length() - 1}"


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
        # the nearest folder above that is cached, then down from it (a loop: up to MAX_DEPTH levels)
        todo: list[str] = []
        at = folder
        while at and at not in self._cache:
            todo.append(at)
            at = at.rpartition("/")[0]
        if at in self._cache:
            self._cache.move_to_end(at)
            got = self._cache[at]
        else:
            got = self._remember("", {node_name(n): n for n in self.store.read_tree(self.root)})
        for path in reversed(todo):
            sub = got.get(path.rpartition("/")[2]) if got is not None else None
            got = self._remember(path, {node_name(n): n for n in self.store.read_tree(sub.tree, path,
                                                                                       path.count("/") + 1)}
                                 if isinstance(sub, SubTree) else None)
        return got

    def _remember(self, folder: str, nodes: dict[str, Node] | None) -> dict[str, Node] | None:
        self._cache[folder] = nodes
        if len(self._cache) > self.keep:
            self._cache.popitem(last=False)
        return nodes

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
    subtree they share (memory: depth x width; a stack, not a recursion: up to MAX_DEPTH levels)."""
    if a == b:
        return
    base = at.count("/") + bool(at)
    # each level: the rest of its names to compare, in order, and both sides' nodes
    stack: list[tuple[str, Iterator[str], dict[str, Node], dict[str, Node]]] = []

    def push(folder: str, ta: str | None, tb: str | None) -> None:
        depth = base + len(stack)
        na = {node_name(n): n for n in store.read_tree(ta, folder, depth)} if ta else {}
        nb = {node_name(n): n for n in store.read_tree(tb, folder, depth)} if tb else {}
        stack.append((folder, iter(sorted(na.keys() | nb.keys())), na, nb))

    push(at, a, b)
    while stack:
        folder, names, na, nb = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        x, y = na.get(name), nb.get(name)
        xf = x if x is not None and not isinstance(x, SubTree) else None
        yf = y if y is not None and not isinstance(y, SubTree) else None
        if xf is not None or yf is not None:
            if xf is None or yf is None or (xf.hash, xf.target, xf.mode) != (yf.hash, yf.target, yf.mode):
                yield join(folder, name), xf, yf
        xt = x.tree if isinstance(x, SubTree) else None
        yt = y.tree if isinstance(y, SubTree) else None
        if (xt is not None or yt is not None) and xt != yt:
            push(join(folder, name), xt, yt)


def files_of(store: Store, manifest: Manifest) -> Iterator[FileEntry]:
    """A version's files in path order, streamed for schema 2."""
    return iter(manifest.files)


Json = dict[str, Any]
