"""The change journal: which paths changed between two snapshots, so that a snapshot lists
only the folders on the way to them (git's fsmonitor, Watchman's "since" clock).

A watcher (inotify, through ``inotify_simple``) watches every folder of the workspace that
the ignore rules keep and records the paths the kernel reports. :meth:`ChangeJournal.cut`
hands a snapshot what changed since the previous cut, as a :class:`Cut`.

The journal is a hint, never the truth. A cut carries a token (like Watchman's clock) and
names the cut before it (``since``); a snapshot trusts it only when its stat cache was
written by the snapshot that took that earlier cut (``engine/snapshot``). Anything that
could leave a change unrecorded makes the cut invalid (``since`` is None, ``reason`` says
why), and the snapshot walks the whole tree as it would without a journal:

- the watcher has just started, or was restarted (a new watcher has a new token);
- the kernel's event queue overflowed (``IN_Q_OVERFLOW``);
- a folder could not be watched: the watch limit (``fs.inotify.max_user_watches``) was
  reached, or the folder could not be read;
- the ignore rules (``.portableignore``) changed, or the workspace folder itself moved (the
  rules are read again at each cut, so a ``.portableignore`` that is a symlink, or a hard
  link, whose target is edited elsewhere is seen too);
- a file system was mounted or unmounted under the workspace (``/proc/self/mountinfo`` is
  compared at each cut; ``IN_UNMOUNT``), or one folder is visible at two paths (a bind mount);
- two folders were exchanged (``renameat2(RENAME_EXCHANGE)``) or one was renamed over another;
- a regular file with other hard links was created, renamed in or written (its other names
  may lie in folders the journal says nothing about), a file was created and removed before
  the journal could look at it (it may have been such a name), or a name was written after
  it was removed (through a file held open: perhaps another name's);
- more than ``max_paths`` paths changed (a walk is then as cheap, and memory stays bounded);
- the reader thread failed;
- a full walk is due (every ``full_every_s`` seconds; 0: never on a schedule).

What inotify never reports (writes through a hard link that lives outside the workspace,
changes made by another machine on a network mount) only a full walk finds: on the schedule,
and before the final version of a stop. A write through a memory map to a page still dirty
moves no stat field either: only a re-read finds it (``engine/scrub``, ``verify``). Every full walk
heals the journal too (:meth:`ChangeJournal.rearm`): a folder it walked that has no watch,
or whose watch is on another folder than the one now at its path (a mount over it), is
watched again, reported, and walked whole by the next snapshot.
"""

from __future__ import annotations

import os
import select
import stat as statmod
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_portable.engine.journal_tree import META, WatchTree
from jupyter_portable.engine.listing import IGNORE_FILE, Lister

MAX_PATHS = 100_000  # changed paths kept before a cut is given up as invalid (a walk costs as much)
REARM_MOST = 64  # folders a full walk watches again one by one; past that the next cut watches all afresh


def available() -> str | None:
    """None where a journal can run here; else why not (no inotify, or no inotify_simple)."""
    try:
        import inotify_simple  # noqa: F401
    except ImportError:
        return "inotify_simple is not installed (pip install inotify_simple)"
    except OSError as exc:  # no libc inotify (not Linux)
        return f"inotify is not available here: {exc}"
    if not hasattr(os, "O_CLOEXEC") or not Path("/proc/sys/fs/inotify").exists():
        return "inotify is not available on this system (Linux only)"
    return None


@dataclass(frozen=True)
class Cut:
    """What changed between the previous cut and this one.

    ``paths``: each file, link or folder created, written, truncated, renamed (both names),
    deleted or whose attributes changed. ``trees``: folders to walk whole (created, moved in
    or renamed, or whose own attributes changed), since the files inside a folder moved in
    were never reported one by one. ``since`` is the token of the previous cut, or None
    where this cut cannot be trusted (``reason`` says why)."""

    token: str
    since: str | None
    paths: frozenset[str] = field(default_factory=frozenset)
    trees: frozenset[str] = field(default_factory=frozenset)
    reason: str | None = None
    # A journal snapshot that finds a changed file with other hard links walks instead: ``links``
    # says why where the journal already knows (a name created with links, or a file written
    # after its name was removed), since by the time the snapshot plans the other name may be gone.
    links: str | None = None
    # After a full walk, the snapshot hands the folders it walked back to the journal that
    # took this cut: it watches any that lost their watch, and answers how many (``rearm``).
    rearm: Callable[[Iterable[str]], int] | None = field(default=None, compare=False, repr=False)

    @property
    def valid(self) -> bool:
        return self.since is not None


class ChangeJournal(WatchTree):
    """Watches ``root`` and records what changes there, until :meth:`close`."""

    def __init__(self, root: Path | str, *, full_every_s: float = 3600.0, max_paths: int = MAX_PATHS) -> None:
        super().__init__(root)
        self.full_every_s = full_every_s
        self.max_paths = max_paths
        self._id = uuid.uuid4().hex[:16]
        self._seq = 0
        self._lock = threading.Lock()
        self._last: str | None = None  # the token of the previous cut
        self._last_full: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = False
        self._closed = False
        self._wake_r, self._wake_w = -1, -1
        self._rules: bytes | None = None  # the ignore file's bytes when the rules were read
        self._mounts: frozenset[str] = frozenset()  # mount points at or under the root then
        self._links: str | None = None  # why this period's journal snapshot must walk (hard links)
        self._unsure: set[str] = set()  # files created and gone before they were looked at
        self._unsure_moves: dict[int, str] = {}  # cookie -> such a file renamed, until its MOVED_TO
        self._written_gone: set[str] = set()  # names written and gone, no DELETE after the write yet
        self.events = 0  # events read, for the benchmark

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch every folder now (before returning), then read events in a thread.
        :class:`OSError` or :class:`ImportError` where inotify cannot run here at all."""
        why = available()
        if why is not None:
            raise ImportError(why)
        with self._lock:
            self._resync()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="portable-journal", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching; every later cut is invalid."""
        self._stop = True
        self._closed = True
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._invalidate("the watcher was closed")
            if self._ino is not None:
                self._ino.close()
                self._ino = None
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def __enter__(self) -> ChangeJournal:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def watches(self) -> int:
        """Folders watched now."""
        return len(self._nodes)

    # -- the cut ---------------------------------------------------------------------------

    def cut(self, *, now: float) -> Cut:
        """What changed since the previous cut (every event that happened before this call
        is in it), and start the next period. ``now``: seconds on a monotonic clock."""
        with self._lock:
            self._drain()
            self._settle_moves()
            self._check_outside_events()
            self._seq += 1
            token = f"{self._id}:{self._seq}"
            prev, self._last = self._last, token
            reason = self._reason if not self._valid else None
            if reason is None and prev is None:
                reason = "the watcher has just started"
            if (reason is None and self.full_every_s > 0 and self._last_full is not None
                    and now - self._last_full >= self.full_every_s):
                reason = f"a full walk is due (every {self.full_every_s:g} s)"
            paths, trees = self._paths, self._trees
            self._paths, self._trees = set(), set()
            links = self._links
            unsure = self._unsure | set(self._unsure_moves.values())
            if links is None and unsure:
                links = (f"{sorted(unsure)[0]} was created and removed before the journal looked at it "
                         "(it may have been another of a file's hard links)")
            if links is None and self._written_gone:
                links = (f"{sorted(self._written_gone)[0]} was written after it was removed (through a file "
                         "held open: it may have other hard links)")
            self._links = None
            self._unsure.clear()
            self._unsure_moves.clear()
            self._written_gone.clear()
            if reason is not None:
                self._last_full = now
                if not self._valid and not self._closed:
                    self._resync()  # watches afresh: the next period can be trusted again
                return Cut(token, None, reason=reason, rearm=self.rearm)
            return Cut(token, prev, frozenset(paths), frozenset(trees), links=links, rearm=self.rearm)

    def rearm(self, folders: Iterable[str]) -> int:
        """After a full walk of ``folders`` (paths from the root, '' for it): watch each that
        has no watch, or whose watch is on another folder than the one at its path now (a file
        system mounted over it, a folder exchanged behind the journal's back). Each one re-armed
        is walked whole by the next snapshot (what changed in it before its watch is unknown).
        Returns how many were re-armed."""
        with self._lock:
            if self._ino is None or not self._valid or self._closed:
                return 0  # the next cut watches everything afresh anyway
            self._drain()
            live: dict[str, int] = {}
            for wd in list(self._nodes):
                rel = self._path(wd)
                if rel is not None:
                    live[rel] = wd
            lost: list[tuple[str, int | None, os.stat_result]] = []  # (folder, its stale watch, its lstat)
            for rel in sorted(folders, key=lambda p: (p.count("/") if p else -1, p)):
                if (rel.split("/")[0] == META) or (rel and self._match(rel + "/")):
                    continue
                try:
                    st = os.lstat(self._abs(rel))
                except OSError:
                    continue  # gone since the walk: its folder above reported it
                if not statmod.S_ISDIR(st.st_mode):
                    continue
                at = live.get(rel)
                node = self._nodes.get(at) if at is not None else None
                if node is None or node.ident not in (None, (st.st_dev, st.st_ino)):
                    lost.append((rel, at if node is not None else None, st))
            if len(lost) > REARM_MOST:
                # as costly as watching everything afresh, which the next cut does
                self._invalidate(f"{len(lost)} folders had lost their watches")
                return len(lost)
            done = 0
            covered: list[str] = []
            for rel, stale, _st in lost:
                if any(rel == c or rel.startswith(c + "/") for c in covered):
                    continue  # watched with the folder above it, just now
                parent = live.get(rel.rpartition("/")[0]) if rel else None
                if rel and parent is None:
                    continue  # its folder above could not be watched: that made the cut invalid
                if stale is not None:
                    self._unhook(stale)
                self._watch_tree(self._abs(rel), parent, rel.rpartition("/")[2] if rel else "")
                if not self._valid:
                    return done
                covered.append(rel)
                done += 1
                self._trees.add(rel)
                self._paths.add(rel)
                for w in list(self._nodes):
                    p = self._path(w)
                    if p is not None:
                        live[p] = w
            return done

    # -- watching and events ---------------------------------------------------------------

    def _resync(self) -> None:
        """A new inotify instance watching the whole tree (the old one's queue is dropped)."""
        import inotify_simple

        old, self._ino = self._ino, None
        if old is not None:
            old.close()
        self._nodes.clear()
        self._moving.clear()
        self._paths.clear()
        self._trees.clear()
        self._valid, self._reason = True, None
        self._root_wd = None
        self._links = None
        self._unsure.clear()
        self._unsure_moves.clear()
        self._written_gone.clear()
        self._rules = _read_rules(self.root)
        self._mounts = _mounts_under(self.root)
        self._match = Lister(Path(self.root), warn=False).match  # the rules may have changed: that is one reason
        try:
            self._ino = inotify_simple.INotify()
        except OSError as exc:  # fs.inotify.max_user_instances reached, or no memory
            self._invalidate(f"cannot start watching: {exc.strerror or exc}")
            return
        self._watch_tree(self.root, None, "")
        if self._root_wd is None and self._valid:
            self._invalidate("the workspace folder cannot be watched")
        if self._valid and self._wake_w >= 0:
            os.write(self._wake_w, b"r")  # the reader takes the new instance

    def _check_outside_events(self) -> None:
        """What no event reports: the ignore rules edited through a link, a mount or unmount."""
        if not self._valid:
            return
        if _read_rules(self.root) != self._rules:
            self._invalidate(f"the ignore rules ({IGNORE_FILE}) changed")
        elif _mounts_under(self.root) != self._mounts:
            self._invalidate("a file system was mounted or unmounted under the workspace")

    def _run(self) -> None:
        try:
            while not self._stop:
                ino = self._ino
                try:
                    fds = [self._wake_r] + ([ino.fileno()] if ino is not None else [])
                    ready, _w, _x = select.select(fds, [], [])
                except (OSError, ValueError):
                    continue  # the instance was replaced while we waited
                if self._wake_r in ready:
                    os.read(self._wake_r, 64)
                with self._lock:
                    if self._ino is not None:
                        self._drain()
        except Exception as exc:  # noqa: BLE001 - recorded: every later cut is invalid, so nothing is missed
            with self._lock:
                self._invalidate(f"the journal's reader failed: {type(exc).__name__}: {exc}")
                self._valid = False

    def _drain(self) -> None:
        """Read and record every event queued now (under the lock)."""
        if self._ino is None:
            return
        while True:
            got = self._ino.read(timeout=0)
            if not got:
                return
            for ev in got:
                self.events += 1
                self._event(ev.wd, ev.mask, ev.cookie, ev.name)

    def _event(self, wd: int, mask: int, cookie: int, name: str) -> None:
        from inotify_simple import flags as f

        if mask & f.Q_OVERFLOW:
            self._invalidate("the kernel's event queue overflowed (IN_Q_OVERFLOW)")
            return
        if mask & f.IGNORED:
            node = self._nodes.get(wd)
            if node is not None and node.parent is not None and node.parent in self._nodes:
                if self._nodes[node.parent].kids.get(node.name) == wd:
                    del self._nodes[node.parent].kids[node.name]
            self._nodes.pop(wd, None)
            if wd == self._root_wd:
                self._invalidate("the workspace folder is no longer watched")
            return
        if wd == self._root_wd and mask & (f.DELETE_SELF | f.MOVE_SELF | f.UNMOUNT):
            self._invalidate("the workspace folder itself was moved, deleted or unmounted")
            return
        if mask & f.UNMOUNT:
            self._invalidate("a file system under the workspace was unmounted (IN_UNMOUNT)")
            return
        if not name:
            return  # an event of a watched folder itself: its folder above reports it by name
        node = self._nodes.get(wd)
        if node is None:
            return  # a watch already forgotten
        base = self._path(wd)
        if base is None:
            return  # inside a folder moved away: walked whole where it lands
        if not base and name == META:
            return
        if not base and name == IGNORE_FILE:
            self._invalidate(f"the ignore rules ({IGNORE_FILE}) changed")
            return
        if not self._valid:
            return
        rel = f"{base}/{name}" if base else name
        if mask & f.ISDIR:
            self._trees.add(rel)
            if mask & f.MOVED_FROM:
                kid = node.kids.pop(name, None)
                if kid is not None and kid in self._nodes:
                    self._nodes[kid].detached = True
                    self._moving[cookie] = kid
            elif mask & f.MOVED_TO:
                kid = self._moving.pop(cookie, None)
                moved = self._nodes.get(kid) if kid is not None else None
                if moved is not None and not self._match(rel + "/"):
                    old = node.kids.get(name)
                    if old is not None and old != kid:
                        # renamed over a folder (which must have been empty), or exchanged with it
                        # (renameat2 RENAME_EXCHANGE): the events alone cannot tell which
                        self._invalidate(f"folder {rel} was exchanged with another, or renamed over one")
                        return
                    moved.parent, moved.name, moved.detached = wd, name, False
                    node.kids[name] = kid  # type: ignore[assignment]
                else:
                    if kid is not None:
                        self._moving[cookie] = kid  # moved to an ignored name: as if moved out
                    self._watch_new(wd, name, rel)
            elif mask & f.CREATE:
                self._watch_new(wd, name, rel)
            elif mask & f.DELETE:
                kid = node.kids.pop(name, None)
                if kid is not None:
                    self._forget(kid)
        else:
            self._file_event(mask, cookie, rel)
        self._paths.add(rel)
        if len(self._paths) + len(self._trees) > self.max_paths:
            self._invalidate(f"more than {self.max_paths} paths changed")

    def _file_event(self, mask: int, cookie: int, rel: str) -> None:
        """Hard links decided at the event: a name created or moved in with other links, a name
        created and gone before it was looked at (unless it was renamed: its new name is looked
        at), a name written after it was removed (no DELETE of it follows the write)."""
        from inotify_simple import flags as f

        if mask & (f.DELETE | f.MOVED_FROM):
            self._written_gone.discard(rel)
            if mask & f.MOVED_FROM and rel in self._unsure:
                self._unsure.discard(rel)
                self._unsure_moves[cookie] = rel
            return
        try:
            st = os.lstat(self._abs(rel))
        except OSError:
            if mask & f.CREATE and not self._match(rel):  # an ignored name is never read: not a question
                self._unsure.add(rel)
            elif mask & f.MOVED_TO:
                if self._unsure_moves.pop(cookie, None) is not None:
                    self._unsure.add(rel)
            elif mask & (f.MODIFY | f.CLOSE_WRITE):
                self._written_gone.add(rel)
            return
        if mask & f.MOVED_TO:
            self._unsure_moves.pop(cookie, None)
        if statmod.S_ISREG(st.st_mode) and st.st_nlink > 1 and self._links is None:
            self._links = f"{rel} has other hard links"


def _read_rules(root: str) -> bytes | None:
    """The ignore file's bytes as the lister reads them (through a symlink too)."""
    try:
        with open(os.path.join(root, IGNORE_FILE), "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts_under(root: str) -> frozenset[str]:
    """Mount points at or under ``root`` (from ``/proc/self/mountinfo``), with their device."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return frozenset()
    out = set()
    for line in lines:
        parts = line.split(" ")
        if len(parts) < 5:
            continue
        point = _unescape(parts[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            out.add(f"{parts[2]} {point}")
    return frozenset(out)


__all__ = ["MAX_PATHS", "ChangeJournal", "Cut", "available"]
