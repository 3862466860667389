"""The change journal's folders: one inotify watch per folder the ignore rules keep, each
folder's path from the root through the watches above it, and the bookkeeping of folders
moved away, moved in, created and deleted (:mod:`.journal` reads the events and cuts)."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.paths import RESERVED_TOP
from jupyter_portable.engine.listing import Lister

META = RESERVED_TOP  # the copy's own folder: never watched


@dataclass
class _Node:
    parent: int | None  # watch descriptor of the folder above; None for the root
    name: str
    kids: dict[str, int] = field(default_factory=dict)
    detached: bool = False  # moved away; its MOVED_TO has not been read yet
    ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder when it was watched


class WatchTree:
    """The folders of ``root`` watched now, and what changed among them since the last cut."""

    def __init__(self, root: Path | str) -> None:
        self.root = os.path.realpath(root)  # watches never follow a symlink, the root's either
        self._ino: Any = None
        self._nodes: dict[int, _Node] = {}
        self._root_wd: int | None = None
        self._moving: dict[int, int] = {}  # cookie -> wd of a folder moved away, until its MOVED_TO
        self._paths: set[str] = set()
        self._trees: set[str] = set()
        self._valid = False
        self._reason: str | None = "the watcher has not started"
        self._match = Lister(Path(self.root), warn=False).match  # the ignore rules, read again at each resync

    def _invalidate(self, reason: str) -> None:
        if self._valid:
            self._valid = False
            self._reason = reason
        self._paths.clear()
        self._trees.clear()

    def _mask(self) -> int:
        from inotify_simple import flags as f

        # No IN_EXCL_UNLINK: a write through a file held open after its name was removed is news
        # (the file may be another name of one kept elsewhere in the workspace).
        return int(f.MODIFY | f.ATTRIB | f.CLOSE_WRITE | f.MOVED_FROM | f.MOVED_TO | f.CREATE | f.DELETE
                   | f.DELETE_SELF | f.MOVE_SELF | f.ONLYDIR | f.DONT_FOLLOW)

    def _watch_tree(self, abs_dir: str, parent: int | None, name: str) -> None:
        """Watch ``abs_dir`` (named ``name`` in folder ``parent``) and every folder under it that
        the ignore rules keep: a loop, not a recursion."""
        mask = self._mask()
        stack = [(abs_dir, parent, name)]
        while stack and self._valid:
            path, up, nm = stack.pop()
            try:
                st = os.lstat(path)
                wd = self._ino.add_watch(path, mask)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue  # gone already: its folder's DELETE or MOVED_FROM says so
                if exc.errno == errno.ENOSPC:
                    self._invalidate("the inotify watch limit is reached (raise fs.inotify.max_user_watches)")
                else:
                    self._invalidate(f"cannot watch {path}: {exc.strerror or exc}")
                return
            ident = (st.st_dev, st.st_ino)
            node = self._nodes.get(wd)
            if node is not None and not node.detached:
                was = self._path(wd)
                if was is not None and was != self._rel_of(up, nm) and _ident(self._abs(was)) == ident:
                    # one folder at two paths (a bind mount): an event names one of them only
                    self._invalidate(f"folder {was or '.'} is also at {self._rel_of(up, nm) or '.'}: one folder at "
                                     "two paths (a bind mount?), and an event names only one of them")
                    return
            if node is not None and node.parent is not None and node.parent in self._nodes:
                if self._nodes[node.parent].kids.get(node.name) == wd:
                    del self._nodes[node.parent].kids[node.name]  # the same folder, met again
            self._nodes[wd] = _Node(up, nm, node.kids if node is not None else {}, ident=ident)
            if up is None:
                self._root_wd = wd
            else:
                self._nodes[up].kids[nm] = wd
            rel = self._path(wd)
            if rel is None:
                continue
            try:
                with os.scandir(path) as it:
                    subs = [(e.path, e.name) for e in it if e.is_dir(follow_symlinks=False)]
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    continue
                self._invalidate(f"cannot list {path}: {exc.strerror or exc}")
                return
            for sub_path, sub in subs:
                sub_rel = f"{rel}/{sub}" if rel else sub
                if (not rel and sub == META) or self._match(sub_rel + "/"):
                    continue
                stack.append((sub_path, wd, sub))

    def _rel_of(self, parent: int | None, name: str) -> str | None:
        if parent is None:
            return ""
        base = self._path(parent)
        return None if base is None else (f"{base}/{name}" if base else name)

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def _unhook(self, wd: int) -> None:
        """Take a watched folder out of its folder above (it is watched again where it is)."""
        node = self._nodes.get(wd)
        if node is not None and node.parent is not None and node.parent in self._nodes:
            if self._nodes[node.parent].kids.get(node.name) == wd:
                del self._nodes[node.parent].kids[node.name]

    def _path(self, wd: int) -> str | None:
        """The folder's path from the root; None where it (or a folder above) moved away."""
        parts: list[str] = []
        at: int | None = wd
        seen = 0
        while at is not None:
            node = self._nodes.get(at)
            if node is None or node.detached or seen > len(self._nodes):
                return None
            if node.parent is not None:
                parts.append(node.name)
            at = node.parent
            seen += 1
        return "/".join(reversed(parts))

    def _forget(self, wd: int) -> None:
        stack = [wd]
        while stack:
            node = self._nodes.pop(stack.pop(), None)
            if node is not None:
                stack += node.kids.values()

    def _settle_moves(self) -> None:
        """Folders moved away whose MOVED_TO never came: moved out of the workspace. One that
        came back (moved in again, or renamed back from an ignored name) was watched again
        under the same watch, and is not detached any more: it keeps its watches."""
        for wd in self._moving.values():
            node = self._nodes.get(wd)
            if node is None or not node.detached:
                continue
            ids = []
            stack = [wd]
            while stack:
                w = stack.pop()
                n = self._nodes.get(w)
                if n is not None:
                    ids.append(w)
                    stack += n.kids.values()
            for w in ids:
                try:
                    self._ino.rm_watch(w)
                except OSError:
                    pass
            self._forget(wd)
        self._moving.clear()

    def _watch_new(self, parent: int, name: str, rel: str) -> None:
        if self._match(rel + "/"):
            return
        self._watch_tree(os.path.join(self.root, rel), parent, name)


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


__all__ = ["META", "WatchTree"]
