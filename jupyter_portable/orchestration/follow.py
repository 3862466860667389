"""The file browser follows the machine: while a worker serves the workspace, the files its
kernel writes are pulled into the user's copy, which is what JupyterLab's file browser and
editors show (docs/file-browser.md says why a pull and not a contents manager).

Each :meth:`Follower.tick` lists the worker's files with their hashes (``GET /tree``) and,
for each file the worker changed since the last tick, compares three hashes: the worker's,
the user's copy's, and the *base*, the content both sides last agreed on (a pull, a
forwarded save, or else the version the worker started from). Then:

- the user's copy equals the base (or lacks the file): the worker's bytes replace it;
- the worker equals the base: the user edited it; the next save forwards it, nothing moves;
- no base (a file the user's side never shared with this worker) and the user's copy has its
  own: it is *new on the machine*: kept there and offered (announced), the user's stays as it is;
- both changed: both are kept, on the side where the conflict is seen (this one): the
  worker's version at the name, the user's moved to ``NAME.conflict-lab-TIME`` here, recorded
  and announced. Nothing of the user's is sent to the machine by a tick.

A file the worker deleted is deleted here only if this copy received it from the worker
and still holds the bytes it received: never a file the user's side had on its own, even with
the same content. Bytes are hashed before they are renamed into place (invariant 4).

The worker is not trusted (docs/security.md): every path in its listing passes the check a
manifest's paths pass (relative, normalised, not under ``.portable/``), and a path that leads
through a symlink on the user's side to a folder outside the copy is neither read, written
nor deleted (invariant 8). A malformed path is an error of the tick, naming it. Every path
then passes the inbound gate (engine/gate.py, invariant 11) with the user's rules as they stand
at the tick: a path that runs or configures code, the copy's ``.portableignore``, or a path the
user's ignore rules keep out is not read from the worker nor written here (a file the user
ignores is not even read here); it is listed in ``TickResult.refused`` and announced once per
change on the worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import IntegrityError, PortableError, UnsafePath
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.core.times import to_iso
from jupyter_portable.core.validate import HASH_RE, short_repr
from jupyter_portable.engine.gate import InboundGate
from jupyter_portable.orchestration.hosting import ContentsManager, Timer
from jupyter_portable.store.repo import digest, hash_file
from jupyter_portable.workdir.conflicts import add_conflict
from jupyter_portable.workdir.follow_record import read_agreed, read_received, write_agreed
from jupyter_portable.workdir.statcache import stat_key

if TYPE_CHECKING:
    from jupyter_portable.orchestration.monitor import PortableService

log = logging.getLogger("jupyter_portable.follow")

SAVE_GRACE = timedelta(seconds=30)  # a save that began this long ago and never ended no longer holds its file


@dataclass
class TickResult:
    """What one tick did, path by path."""

    state: str
    worker_version: int | None = None
    pulled: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)  # {path, reason}: the inbound gate's
    offered: list[str] = field(default_factory=list)  # new on the machine: kept there, the user's stays


class Follower:
    """Pulls the serving worker's changed files into the user's copy, one tick at a time.

    ``orchestrator``: the service's (its lifecycle and worker client); ``synced``: the service's
    path -> hash map that a forwarded save uses as its base, kept true after each pull;
    ``clock``: now, for a save's grace and a conflict copy's name; ``notice(kind, text)``."""

    def __init__(self, ws: Any, orchestrator: Callable[[], Any], *, synced: dict[str, str],
                 clock: Callable[[], datetime], notice: Callable[[str, str], None] | None = None) -> None:
        self.ws = ws
        self.root: Path = ws.root
        self.orchestrator = orchestrator
        self.synced = synced
        self.clock = clock
        self.notice = notice or (lambda kind, text: None)
        self.lock = threading.Lock()  # one decision per file at a time: a tick or a forwarded save
        self.allocation_id: str | None = None
        self.start_version: int | None = None
        self.worker_version: int | None = None
        self.agreed: dict[str, str] = {}
        self.received: dict[str, str] = {}  # path -> the hash of the bytes this copy wrote from the worker
        self.seen: dict[str, str] = {}  # path -> the worker's hash already handled on this allocation
        self.listed: set[str] = set()  # the paths of the worker's last listing
        self.saving: dict[str, datetime] = {}  # path -> when a save of it began (JupyterLab writes it now)
        self._start_hashes: dict[str, str] | None = None
        self._local: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._gate: InboundGate | None = None  # made at each tick: the user's rules as they stand
        self.timer: Timer | None = None  # the server's PeriodicCallback (start_following)
        self.paused = False  # tests that need the copy to hold still while they edit both sides

    # -- saves in JupyterLab -------------------------------------------------------------------

    def rel(self, os_path: str | os.PathLike[str]) -> str | None:
        """``os_path`` relative to the workspace, or None outside it."""
        try:
            return Path(os_path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return None

    def save_begins(self, rel: str) -> None:
        """JupyterLab is about to write ``rel``: no pull replaces it until the save has been forwarded."""
        self.saving[rel] = self.clock()

    def save_forwarded(self, rel: str, allocation_id: str | None, saved: str, *, conflicted: bool) -> None:
        """The save of ``rel`` (bytes hashing ``saved``) was handled by the service: forwarded, or
        refused as a conflict and kept beside it on the worker; either way the worker's next
        version of ``rel`` may replace it here."""
        self.saving.pop(rel, None)
        self.seen.pop(rel, None)  # the next tick decides this file again
        if allocation_id is None or allocation_id != self.allocation_id:
            return
        if conflicted or self.synced.get(rel) == saved:
            self.agreed[rel] = saved
            self._persist()

    # -- one tick ---------------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> TickResult:
        """Pull what the worker changed since the last tick; does nothing unless the workspace is ACTIVE."""
        now = now or self.clock()
        if self.paused:
            return TickResult("paused")
        orch = self.orchestrator()
        lc = orch.lifecycle()
        if lc.state != L.ACTIVE or lc.allocation_id is None:
            return TickResult(lc.state)
        if lc.allocation_id != self.allocation_id:
            self._switch(lc)
        version, worker, pending, refused = worker_listing(orch.client().tree())
        res = TickResult(lc.state, worker_version=version, errors=refused)
        for line in refused:
            log.warning("jupyter-portable: the worker's listing was refused in part: %s", line)
        self.worker_version = res.worker_version
        self._gate = gate = InboundGate.for_copy(self.root)
        changed = False
        for path, w in sorted(worker.items()):
            if w is None or path in pending or self.seen.get(path) == w or self._is_saving(path, now):
                continue
            try:
                why = gate.reason(path)
                if why is not None:
                    self._refuse(path, w, why, res)
                    continue
                changed |= self._follow(orch, path, w, now, res)
            except (PortableError, OSError) as exc:
                res.errors.append(f"{path}: {exc}")
                log.warning("jupyter-portable: %s was not pulled from the worker: %s", path, exc)
        if res.refused:
            shown = "; ".join(f"{r['path']} ({r['reason']})" for r in res.refused[:5])
            more = f" and {len(res.refused) - 5} more" if len(res.refused) > 5 else ""
            self.notice("refused", f"{len(res.refused)} file(s) from the worker were not written into your copy: "
                                   f"{shown}{more}")
        # gone from the worker since the last listing (not a file this tick wrote there itself)
        gone = [p for p in self.listed if p not in worker and p not in pending
                and (p in self.agreed or p in self.received)]
        self.listed = set(worker)
        for path in gone:
            with self.lock:
                if self._is_saving(path, now):
                    continue
                try:
                    # only what this copy received from the worker, still as received
                    received = self.received.pop(path, None)
                    if received is not None and self._local_hash(path) == received:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self._local_path(path))
                        res.removed.append(path)
                except (PortableError, OSError) as exc:
                    res.errors.append(f"{path}: {exc}")
                self.agreed.pop(path, None)
                self.seen.pop(path, None)
                self.synced.pop(path, None)
                self._local.pop(path, None)
                changed = True
        if changed:
            self._persist()
        return res

    def view(self) -> dict[str, Any]:
        """For the panel: the serving worker and the version its copy stands on."""
        return {"allocation_id": self.allocation_id, "worker_version": self.worker_version,
                "start_version": self.start_version}

    # -- inside ------------------------------------------------------------------------------------

    def _switch(self, lc: Any) -> None:
        """A new worker: forget what was agreed with the last one; its base is the version it started from."""
        self.allocation_id = lc.allocation_id
        switch = getattr(self.synced, "switch", None)  # the service's AgreedHashes: a save's base too
        if switch is not None:
            switch(lc.allocation_id)
        ready = [e for e in lc.events if e.allocation_id == lc.allocation_id and e.state == L.READY]
        self.start_version = ready[-1].version if ready else lc.version
        self.agreed = read_agreed(self.ws.copy, lc.allocation_id)
        self.received = read_received(self.ws.copy, lc.allocation_id)
        self.seen = {}
        self.listed = set()
        self._start_hashes = None
        self.worker_version = None

    def _base(self, path: str) -> str | None:
        if path in self.agreed:
            return self.agreed[path]
        if self._start_hashes is None:
            self._start_hashes = {}
            if self.start_version:
                m = self.ws.store.read_manifest(self.ws.workspace_id, self.start_version)
                self._start_hashes = {e.path: e.hash for e in m.files if e.target is None and e.hash}
        return self._start_hashes.get(path)

    def _is_saving(self, path: str, now: datetime) -> bool:
        began = self.saving.get(path)
        return began is not None and now - began < SAVE_GRACE

    def _local_path(self, path: str) -> Path:
        """Where ``path`` is in the user's copy; UnsafePath when a folder on the way is a symlink
        that leads outside it (the file itself is never followed: it is lstat'ed or replaced)."""
        check_relpath(path, what="a path from the worker")
        real_root = os.path.realpath(self.root)
        parent = os.path.realpath(os.path.join(real_root, os.path.dirname(path)))
        if parent != real_root and not parent.startswith(real_root + os.sep):
            raise UnsafePath(f"{path!r} leads through a symlink to {parent}, outside the workspace; "
                             "nothing was read, written or deleted there")
        return self.root / path

    def _local_hash(self, path: str) -> str | None:
        full = self._local_path(path)
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(full) or os.path.islink(full):
            return "not-a-file"
        key = stat_key(st)
        old = self._local.get(path)
        if old is not None and old[0] == key:
            return old[1]
        h = hash_file(full, st.st_size)
        self._local[path] = (key, h)
        return h

    def _refuse(self, path: str, w: str, why: str, res: TickResult) -> None:
        """The gate refused ``path``: listed once per hash the worker gives it, never read from the
        worker. A file the user ignores is not read here either; another that is already the
        same here (the copy's own ``.portableignore``) is not news."""
        self.seen[path] = w
        assert self._gate is not None
        if not self._gate.ignored(path) and self._local_hash(path) == w:
            return
        res.refused.append({"path": path, "reason": why})
        log.warning("jupyter-portable: %s from the worker was not written into the copy: %s", path, why)

    def _follow(self, orch: Any, path: str, w: str, now: datetime, res: TickResult) -> bool:
        """Decide one file the worker changed; True when what was agreed changed."""
        local = self._local_hash(path)
        if local == w:
            self.seen[path] = w
            return self._agree(path, w)
        base = self._base(path)
        if local is not None and local != base and w == base:
            self.seen[path] = w  # the user's edit; a save forwards it
            return False
        if base is None and local is not None and local != "not-a-file":
            # never shared: the machine's is new there, not a conflict; the user's stays, unsent
            self.seen[path] = w
            res.offered.append(path)
            self.notice("offered", f"{path} is new on the worker and differs from yours: yours stays here as it "
                                   "is; the worker's is kept there")
            return False
        data, h = orch.client().read(path)
        if digest(data) != h:
            raise IntegrityError(f"{path}: the bytes from the worker do not match their hash; nothing was written")
        with self.lock:
            if self._is_saving(path, now) or self._local_hash(path) != local:
                return False  # a save got there first: the next tick decides again
            if local is not None and local != base and local != "not-a-file":
                res.conflicts.append(self._keep_both(path, now))
            self._place(path, data)
            res.pulled.append(path)
            self.seen[path] = h
            self.received[path] = h
            self._agree(path, h)
            return True

    def _agree(self, path: str, h: str) -> bool:
        self.synced[path] = h
        if self.agreed.get(path) == h:
            return False
        self.agreed[path] = h
        return True

    def _keep_both(self, path: str, now: datetime) -> dict[str, str]:
        """Both changed: the user's file moves to NAME.conflict-lab-TIME here, on the side where the
        conflict is seen; nothing of it is sent to the worker (a save of it would forward it)."""
        kept = f"{path}.conflict-lab-{now.strftime('%Y%m%d-%H%M%S')}"
        os.rename(self._local_path(path), self._local_path(kept))
        self._local.pop(path, None)
        add_conflict(self.ws.copy, path, to_iso(now, "seconds"), kept)
        self.notice("conflict", f"{path} changed on the worker too: the worker's version was kept, yours "
                                f"is saved here as {kept}")
        return {"path": path, "kept": kept}

    def _place(self, path: str, data: bytes) -> None:
        """The worker's bytes at ``path``, through the inbound gate's writer (it asks the gate again)."""
        assert self._gate is not None  # a tick made it
        placer = self._gate.placer()
        mode = 0o644
        with contextlib.suppress(OSError):
            mode = os.stat(placer.target(path)).st_mode & 0o777
        placer.place(path, len(data), digest(data), mode, time.time_ns(), data)
        self._local.pop(path, None)

    def _persist(self) -> None:
        if self.allocation_id is not None:
            with contextlib.suppress(OSError):
                write_agreed(self.ws.copy, self.allocation_id, self.agreed, self.received)


def worker_listing(obj: Any) -> tuple[int | None, dict[str, str | None], set[str], list[str]]:
    """``GET /tree``'s answer, checked: ``(version, {path: hash or None}, pending paths, refused)``.
    Every path passes :func:`check_relpath`, every hash is a hash; ``refused`` says, one line an
    entry, what was left out and why. A listing that is not one at all is a PortableError."""
    if not isinstance(obj, dict) or not isinstance(obj.get("files", []), list) \
            or not isinstance(obj.get("pending") or [], list):
        raise PortableError(f"the worker's listing of its files is malformed: {short_repr(obj)}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        version = None
    files: dict[str, str | None] = {}
    refused: list[str] = []
    for entry in obj.get("files") or []:
        path = entry.get("path") if isinstance(entry, dict) else None
        try:
            check_relpath(path, what="a path from the worker")
        except UnsafePath as exc:
            refused.append(f"{short_repr(path)}: {exc}")
            continue
        assert isinstance(path, str) and isinstance(entry, dict)
        h = entry.get("hash")
        if h is not None and not (isinstance(h, str) and HASH_RE.match(h)):
            refused.append(f"{path}: the worker's hash {short_repr(h)} is not a hash")
            continue
        files[path] = h
    pending = {p for p in obj.get("pending") or [] if isinstance(p, str)}
    return version, files, pending, refused


# -- the server's side: hooks and the timer --------------------------------------------------------


def start_following(service: PortableService, contents_manager: ContentsManager, *,
                    interval_s: float = 2.0) -> Follower:
    """Follow the worker for ``service``: a tick every ``interval_s`` while
    the workspace is ACTIVE, and JupyterLab's saves wrapped so a pull never overwrites one."""
    from datetime import timezone

    from tornado.ioloop import PeriodicCallback

    from jupyter_portable.workdir.conflicts import read_conflicts

    ws = service.ws
    assert ws is not None
    follower = Follower(ws, service.orchestrator, synced=service.synced, notice=service.notice,
                        clock=lambda: datetime.now(timezone.utc))
    root_dir = Path(getattr(contents_manager, "root_dir", ws.root))

    def pre_save(model: Any = None, path: str | None = None, **_: Any) -> None:
        rel = follower.rel(root_dir / path.lstrip("/")) if path else None
        if rel is not None:
            follower.save_begins(rel)

    def post_save(model: Any = None, os_path: str | None = None, contents_manager: Any = None, **kw: Any) -> None:
        rel = follower.rel(os_path) if os_path else None
        if rel is None:
            return service.post_save(model=model, os_path=os_path, contents_manager=contents_manager, **kw)
        with follower.lock:
            try:
                saved = hash_file(os_path) if os_path else None
            except OSError:
                saved = None
            before = read_conflicts(ws.copy)[-1:]
            try:
                service.post_save(model=model, os_path=os_path, contents_manager=contents_manager, **kw)
            finally:
                conflicted = read_conflicts(ws.copy)[-1:] != before
                lc = service.orchestrator().lifecycle()
                if saved is not None:
                    follower.save_forwarded(rel, lc.allocation_id if lc.state == L.ACTIVE else None, saved,
                                            conflicted=conflicted)
                else:
                    follower.saving.pop(rel, None)
        return None

    contents_manager.register_pre_save_hook(pre_save)
    contents_manager.register_post_save_hook(post_save)
    busy = threading.Event()

    def run() -> None:
        try:
            res = follower.tick()
            moved = len(res.pulled) + len(res.removed)
            if moved:  # the sidebar (and a file browser refresh) hears of it
                service.on_progress({"workspace_id": ws.workspace_id, "step": "follow",
                                     "message": f"{moved} file(s) from the worker's copy (version "
                                                f"{res.worker_version})", "done": moved, "total": moved})
        except PortableError as exc:
            log.info("jupyter-portable: following the worker's files failed: %s", exc.one_line())
        except Exception:
            log.exception("jupyter-portable: following the worker's files failed")
        finally:
            busy.clear()

    def on_timer() -> None:
        if busy.is_set() or service.is_continuing():
            return
        busy.set()
        try:
            service.pool.submit(run)
        except RuntimeError:  # the pool was shut down with the server
            busy.clear()

    timer = PeriodicCallback(on_timer, interval_s * 1000)
    timer.start()
    follower.timer = timer
    return follower


__all__ = ["SAVE_GRACE", "Follower", "TickResult", "start_following", "worker_listing"]
