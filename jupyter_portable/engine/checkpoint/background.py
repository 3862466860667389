"""Checkpoints in the background: the caller waits only for its local save.

``submit`` runs the write check, fsyncs the checkpoint's files and records their signatures
(size, mtime, ctime, inode), then returns a :class:`CheckpointHandle`. One thread per
workspace copy (per process) then uploads, reads back and publishes each checkpoint in turn
(``registry.CheckpointStep``): "latest verified" moves only when the read-back holds, as
before; it only arrives later. ``handle.wait()`` waits for it.

While a checkpoint is queued or uploading, ``.portable/checkpoints-inflight/`` holds a record
of it (its step, stage, bytes and rate), written by this process alone, so that
``%workspace checkpoints``, ``jupyter portable status`` and a seal on the worker (which waits
for them: ``wait_inflight``) see it. When it ends, its record says how (verified, or why not: the
reason) and stays among the newest :data:`KEEP_ENDED` (``ended``), so that the sidebar, which reads
them through the server (and from a rented machine through its worker's status), shows the end too.
A record whose process is gone is stale: that upload died with it, and "latest" is still the last
verified checkpoint; it is marked failed, saying so.

The queue's policy (``QUEUE_POLICIES``) says what a new checkpoint does while older ones are
in flight: ``wait`` for them, ``skip-older`` (an older one not yet started is dropped for it),
or ``keep-both``; under every policy the bytes of checkpoints in flight stay within a budget
(local disk they hold), and a new one waits for room.
"""

from __future__ import annotations

import atexit
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.records import CheckpointRecord
from jupyter_portable.core.state_words import CHECKPOINT_ENDED, checkpoint_line
from jupyter_portable.core.times import now_iso
from jupyter_portable.engine.progress import Progress
from jupyter_portable.workdir.workcopy import WorkspaceCopy

QUEUE_POLICIES = ("wait", "skip-older", "keep-both")
DEFAULT_POLICY = "skip-older"
DEFAULT_BUDGET = 64 * 1024**3  # bytes of checkpoints in flight (queued or uploading) at once

# One workspace operation at a time in this process: the kernel's magics, panel and
# auto-snapshot share it (interfaces/kernel/lock.py), and the uploads here take it for each
# checkpoint's snapshot, so that no two of them publish at once.
OPERATION_LOCK = threading.RLock()

Signature = tuple[int, int, int, int]  # size, mtime_ns, ctime_ns, inode


def _check_policy(policy: str) -> None:
    if policy not in QUEUE_POLICIES:
        raise UsageError(f"unknown checkpoint queue policy {policy!r}", hint=f"use one of: {', '.join(QUEUE_POLICIES)}")


def _check_budget(budget: object) -> int:
    """The byte budget as a whole number of bytes above zero; anything else is refused, saying so."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise UsageError(f"the checkpoint byte budget must be a positive whole number of bytes, got {budget!r}",
                         hint="for example budget=200 * 2**30 for 200 GiB")
    return budget


def signatures(root: Path, rel: str) -> dict[str, Signature]:
    """Each regular file of the checkpoint ``rel`` (a file or a folder) by workspace path."""
    full = root / rel
    paths = [full] if not full.is_dir() else sorted(
        Path(d) / n for d, _ds, names in os.walk(full) for n in names)
    out: dict[str, Signature] = {}
    for p in paths:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue  # stored as its target's name: no bytes of its own to hold to a signature
        out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return out


def moved_since_check(held: dict[str, tuple[int, int]] | None, signed: dict[str, Signature], rel: str) -> str | None:
    """Why the files signed after the fsync are not those the write check read (``held``: each
    one's size and mtime as its format check began, ``WriteCheck.held``), or None: the bytes that
    are uploaded and verified must be the ones that passed it."""
    if held is None:
        return None
    now = {("" if p == rel else p[len(rel) + 1:]): (s[0], s[1]) for p, s in signed.items()}
    if now == held:
        return None
    changed = sorted(set(now) ^ set(held)) or sorted(k for k in now if now[k] != held[k])
    what = f"'{rel}/{changed[0]}'" if changed[0] else f"'{rel}'"
    return (f"still being written: {what} changed after its write check began (while it was checked or "
            "fsynced); register it again when the writer has finished")


def fsync_checkpoint(root: Path, rel: str) -> None:
    """Every file of the checkpoint, and the folders holding them, on disk (not in the page
    cache only): the call returns "safely on local disk"."""
    full = root / rel
    folders = {full.parent}
    files = [full] if not full.is_dir() else [Path(d) / n for d, _ds, names in os.walk(full) for n in names]
    if full.is_dir():
        folders |= {Path(d) for d, _ds, _n in os.walk(full)}
    for p in files:
        if p.is_symlink():
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in folders:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError:
            pass  # some filesystems refuse a folder's fsync; the files themselves are on disk
        finally:
            os.close(fd)


@dataclass
class CheckpointHandle:
    """One checkpoint on its way: ``state`` is queued, uploading, verifying, then verified,
    rejected, skipped (a newer one took its place) or failed (``error``)."""

    path: str
    step: int | None
    note: str
    size: int
    key: str
    state: str = "queued"
    record: CheckpointRecord | None = None
    error: BaseException | None = None
    reason: str | None = None
    done_bytes: int = 0
    total_bytes: int = 0
    rate: float = 0.0  # bytes a second, of the upload or the read-back
    echo: Callable[[str], None] | None = field(default=None, repr=False)  # progress lines, for a waiting caller
    low_priority: bool = True  # beside a training loop; False when the caller waits for it anyway
    ended: str | None = None  # when it ended (UTC, ISO), once verified, rejected, skipped or failed
    since: str | None = None  # when its phase began (UTC, ISO): a view's rate is done_bytes over the time since
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    @property
    def verified(self) -> bool:
        return self.record is not None and self.record.verified

    def wait(self, timeout: float | None = None) -> CheckpointRecord | None:
        """Wait until the checkpoint is verified or rejected; its record (None when skipped).
        A failure (the store unreachable, a conflict) is raised here. ``timeout``: seconds, then
        UsageError."""
        if not self._done.wait(timeout):
            raise UsageError(f"checkpoint {self.path} is still {self.state} after {timeout:g} s")
        if self.error is not None:
            raise self.error
        return self.record

    def __repr__(self) -> str:
        # what a notebook shows for ``h = jp.checkpoint(...)`` or ``%workspace checkpoint PATH``
        line = self.describe()
        who = f"step {self.step}" if self.step is not None else self.path
        step = f" (step {self.step})" if self.step is not None else ""
        return f"<checkpoint {self.path}{step}: {line[len(who) + 2:]}>"

    def describe(self) -> str:
        """One line, in the words every view shares (core/state_words.checkpoint_line):
        "step 1200: uploading 63%, 1.1 GB/s"."""
        return checkpoint_line(self.to_json(line=False))

    def to_json(self, *, line: bool = True) -> dict[str, Any]:
        out = {"path": self.path, "step": self.step, "state": self.state, "size": self.size,
               "done_bytes": self.done_bytes, "total_bytes": self.total_bytes, "rate": round(self.rate),
               "pid": os.getpid(), "key": self.key,
               # how it ended (the record stays a while: ``ended``): why not verified, the version that has it
               "reason": self.reason, "version": self.record.version if self.record is not None else None,
               "ended": self.ended, "since": self.since}
        if line:
            out["line"] = checkpoint_line(out)
        return out


Job = Callable[[CheckpointHandle, Progress], CheckpointRecord]


class CheckpointQueue:
    """The checkpoints of one workspace copy in this process, uploaded one at a time in order."""

    def __init__(self, copy: WorkspaceCopy) -> None:
        self.copy = copy
        self.policy = DEFAULT_POLICY
        self.budget = DEFAULT_BUDGET
        self._cond = threading.Condition()
        self._io = threading.Lock()  # the records in .portable/checkpoints-inflight/
        self._queue: list[tuple[CheckpointHandle, Job]] = []
        self._running: CheckpointHandle | None = None
        self._thread: threading.Thread | None = None
        self._seq = 0
        # set while the uploads may run; cleared while the training loop saves (``pause``)
        self._running_ok = threading.Event()
        self._running_ok.set()
        self._paused_until = 0.0

    # -- what is in flight -----------------------------------------------------------------

    def in_flight(self) -> list[CheckpointHandle]:
        with self._cond:
            return ([self._running] if self._running is not None else []) + [h for h, _j in self._queue]

    def _held(self) -> int:
        return sum(h.size for h in self.in_flight())

    # -- submitting --------------------------------------------------------------------------

    def new_key(self) -> str:
        with self._cond:
            self._seq += 1
            return f"{os.getpid()}-{time.time_ns()}-{self._seq}"

    def submit(self, handle: CheckpointHandle, job: Job, *, policy: str | None = None,
               budget: int | None = None) -> CheckpointHandle:
        """Queue ``job`` (which uploads, reads back and publishes) under ``policy``; returns at
        once unless the policy or the byte budget says to wait for older checkpoints."""
        policy = policy or self.policy
        _check_policy(policy)
        budget = self.budget if budget is None else _check_budget(budget)
        with self._cond:
            if policy == "skip-older":
                for older, _j in self._queue:
                    older.state, older.reason = "skipped", f"a newer checkpoint ({handle.path}) took its place"
                    self._finish(older)
                self._queue.clear()
            while self._running is not None or self._queue:
                if policy == "wait" or self._held() + handle.size > budget:
                    self._cond.wait()
                else:
                    break
            self._queue.append((handle, job))
            # its record is written beside the caller (a write and an fsync it need not wait for)
            threading.Thread(target=self._write, args=(handle,), name="portable-inflight", daemon=True).start()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="portable-checkpoint", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return handle

    # -- making way for the training loop's own save ---------------------------------------------

    def pause(self, max_s: float = 120.0) -> None:
        """Uploads in flight stop taking the disk and the CPU, part by part (a part already on its
        way finishes), until ``resume`` or ``max_s`` seconds: the trainer is about to save."""
        self._paused_until = time.monotonic() + max_s
        self._running_ok.clear()

    def resume(self) -> None:
        self._running_ok.set()

    def hold(self, at_most: float | None = None) -> None:
        """Called by the upload before each part's write and each read-back, and between the
        pieces of a request on its way (then ``at_most`` seconds): waits while paused (never past
        the pause's bound), so that a pause holds back every byte not yet sent or read back, not
        only the parts not yet read from disk."""
        self._gate(at_most)

    def _gate(self, at_most: float | None = None) -> None:
        """Called by the upload between parts: wait while paused (never past the bound)."""
        if not self._running_ok.is_set():
            left = max(0.0, self._paused_until - time.monotonic())
            self._running_ok.wait(left if at_most is None else min(left, at_most))

    # -- the uploading thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread = None
                    self._cond.notify_all()
                    return
                handle, job = self._queue.pop(0)
                self._running = handle
            handle.state = "uploading"
            self._write(handle)
            meter = _Meter(self, handle)
            # called between parts, often: the pause takes hold within a part (the record is
            # written at most every quarter second)
            progress = meter.progress = Progress("checkpoint", sink=meter, interval=0.0)
            try:
                record = self._job(handle, job, progress)
                handle.record = record
                handle.state = "verified" if record.verified else "rejected"
                handle.reason = record.reason
            except BaseException as exc:  # the handle carries it to whoever waits
                handle.error, handle.state = exc, "failed"
                handle.reason = exc.one_line() if isinstance(exc, PortableError) else str(exc)
            with self._cond:
                self._running = None
                self._finish(handle)
                self._cond.notify_all()

    def _job(self, handle: CheckpointHandle, job: Job, progress: Progress) -> CheckpointRecord:
        """Run ``job`` under the operation lock; one the caller does not wait for runs in a thread
        of lower CPU priority (it, and the upload threads it starts, inherit it)."""
        if not handle.low_priority:
            with OPERATION_LOCK:
                return job(handle, progress)
        out: list[CheckpointRecord] = []
        failed: list[BaseException] = []

        def lowered() -> None:
            _lower_priority()
            try:
                with OPERATION_LOCK:
                    out.append(job(handle, progress))
            except BaseException as exc:  # handed to the queue's thread, which records it
                failed.append(exc)

        worker = threading.Thread(target=lowered, name="portable-checkpoint-upload", daemon=True)
        worker.start()
        worker.join()
        if failed:
            raise failed[0]
        return out[0]

    def _finish(self, handle: CheckpointHandle) -> None:
        with self._io:  # the record goes first: whoever waits on the handle sees it ended
            handle.ended = now_iso()
            try:  # how it ended, for the views (``ended``); no longer in flight (``inflight``)
                self.copy.write_inflight(handle.key, json.dumps(handle.to_json()).encode())
            except (OSError, PortableError):
                try:  # never left saying it is still in flight
                    self.copy.clear_inflight(handle.key)
                except (OSError, PortableError):
                    pass
            _prune_ended(self.copy)
            handle._done.set()

    def _write(self, handle: CheckpointHandle) -> None:
        with self._io:  # never after its _finish: a record left behind would say it is still in flight
            if handle.finished:
                return
            try:
                self.copy.write_inflight(handle.key, json.dumps(handle.to_json()).encode())
            except OSError:
                pass  # what others see is a view; the upload does not depend on it

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until nothing is in flight; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._running is not None or self._queue:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True


BACKGROUND_NICE = 10  # how much lower than the training loop the uploads run, where the system allows it


def _lower_priority() -> None:
    """This thread, and the threads it starts (the upload's), at a lower CPU priority than the
    training loop: on Linux a thread is a task of its own, and its threads inherit its nice."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere the call would reach the whole process
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except OSError:
        pass


class _Meter:
    """The snapshot's progress, turned into the handle's stage, bytes and rate and its record
    on disk (at most every quarter second, and a quarter second after the last call)."""

    def __init__(self, queue: CheckpointQueue, handle: CheckpointHandle) -> None:
        self.queue, self.handle = queue, handle
        self.progress: Progress | None = None
        self.stage = ""
        self.started = time.monotonic()
        self.echoed = 0.0
        self.written = 0.0
        self._trailing: threading.Timer | None = None
        self._lock = threading.Lock()

    def __call__(self, _line: str) -> None:
        self.queue._gate()
        p, h = self.progress, self.handle
        if p is None:
            return
        self._take(p, h)
        if time.monotonic() - self.written < 0.25:
            # the record is written a quarter second later with the newest figures: the last call
            # before a stall (a part that will not go up) is never left unwritten
            with self._lock:
                if self._trailing is None:
                    self._trailing = threading.Timer(0.25, self._write_trailing)
                    self._trailing.daemon = True
                    self._trailing.start()
            return
        self._write()

    def _write_trailing(self) -> None:
        with self._lock:
            self._trailing = None
        self._write()  # nothing once the checkpoint ended (the queue's _write checks)

    def _write(self) -> None:
        h = self.handle
        self.written = time.monotonic()
        self.queue._write(h)
        if h.echo is not None and time.monotonic() - self.echoed >= 2.0:
            self.echoed = time.monotonic()
            h.echo(h.describe())

    def _take(self, p: Progress, h: CheckpointHandle) -> None:
        """The progress's figures into the handle (every call: the handle's line is always current)."""
        # the phase each view names (core/state_words.CHECKPOINT_PHASES): uploading, reading back, sealing
        stage = p.stage if p.stage in ("verifying", "publishing") else "uploading"
        if stage != self.stage:
            self.stage, self.started = stage, time.monotonic()
            h.since = now_iso()
        h.state = stage
        # uploading: the bytes the store holds durably (read and hashed ones may run ahead of them)
        h.done_bytes = min(p.uploaded, p.bytes_total or h.size) if stage == "uploading" else p.bytes_done
        h.total_bytes = max(p.bytes_total, h.size) if stage == "uploading" else p.bytes_total
        spent = time.monotonic() - self.started
        h.rate = h.done_bytes / spent if spent > 0.05 else 0.0


_queues: dict[Path, CheckpointQueue] = {}
_queues_lock = threading.Lock()


def queue_for(copy: WorkspaceCopy) -> CheckpointQueue:
    """This process's queue of the copy at ``copy.root``."""
    with _queues_lock:
        q = _queues.get(copy.root)
        if q is None:
            q = _queues[copy.root] = CheckpointQueue(copy)
        return q


def configure(copy: WorkspaceCopy, *, policy: str | None = None, budget: int | None = None) -> CheckpointQueue:
    """Set the copy's queue policy and byte budget in this process."""
    q = queue_for(copy)
    if policy is not None:
        _check_policy(policy)
        q.policy = policy
    if budget is not None:
        q.budget = _check_budget(budget)
    return q


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


KEEP_ENDED = 8  # records of checkpoints that ended, kept for the views (the newest, per copy)


def _records(copy: WorkspaceCopy) -> list[dict[str, Any]]:
    out = []
    for data in copy.inflight_records():
        try:
            rec = json.loads(data)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("pid"), int) and isinstance(rec.get("key"), str):
            out.append(rec)
    return out


def inflight(copy: WorkspaceCopy) -> list[dict[str, Any]]:
    """The checkpoints in flight in any process on this copy. The record of one whose process is
    gone is stale: it is marked failed (``ended`` shows it), its upload died with the process."""
    out: list[dict[str, Any]] = []
    for rec in _records(copy):
        if rec.get("state") in CHECKPOINT_ENDED:
            continue
        if not pid_alive(rec["pid"]):
            rec.update(state="failed", ended=now_iso(), reason=(
                f"the process uploading it (pid {rec['pid']}) ended before it was verified; "
                "latest stays on the last verified checkpoint"))
            rec["line"] = checkpoint_line(rec)
            try:
                copy.write_inflight(rec["key"], json.dumps(rec).encode())
            except (OSError, PortableError):
                pass
            continue
        out.append(rec)
    return out


def ended(copy: WorkspaceCopy) -> list[dict[str, Any]]:
    """The checkpoints on this copy that ended lately (verified, rejected, skipped or failed, with
    ``reason`` and ``ended``), newest first: the last :data:`KEEP_ENDED` of them."""
    inflight(copy)  # a dead process's record becomes its failure first
    done = [r for r in _records(copy) if r.get("state") in CHECKPOINT_ENDED]
    return sorted(done, key=lambda r: (str(r.get("ended") or ""), _seq(r["key"])), reverse=True)


def _seq(key: str) -> tuple[int, ...]:
    """A key's (pid, time_ns, seq) as numbers: the order records were made in one process."""
    try:
        return tuple(int(p) for p in key.split("-"))
    except ValueError:
        return ()


def _prune_ended(copy: WorkspaceCopy) -> None:
    """Only the newest :data:`KEEP_ENDED` ended records stay."""
    try:
        done = sorted((r for r in _records(copy) if r.get("state") in CHECKPOINT_ENDED),
                      key=lambda r: (str(r.get("ended") or ""), _seq(r["key"])), reverse=True)
        for old in done[KEEP_ENDED:]:
            copy.clear_inflight(old["key"])
    except (OSError, PortableError):
        pass


def wait_inflight(copy: WorkspaceCopy, *, timeout_s: float, poll_s: float = 0.2,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait (up to ``timeout_s`` on ``clock``) until no checkpoint is in flight on this copy, in
    any process. Returns (those that were in flight at the start, those still in flight)."""
    first = inflight(copy)
    deadline = clock() + timeout_s
    left = first
    while left and clock() < deadline:
        sleep(poll_s)
        left = inflight(copy)
    return first, left


def _drain_at_exit() -> None:
    with _queues_lock:
        queues = list(_queues.values())
    busy = [h for q in queues for h in q.in_flight()]
    if busy:
        print(f"jupyter-portable: waiting for {len(busy)} checkpoint(s) in flight: "
              + "; ".join(h.describe() for h in busy), file=sys.stderr)
        for q in queues:
            q.drain()


atexit.register(_drain_at_exit)
