"""``Workspace``: the Python API every interface (CLI, magics, server) calls."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.core.records import CheckpointRecord
from jupyter_portable.core.times import utcnow
from jupyter_portable.core.validate import terminal_safe
from jupyter_portable.engine.fsck import FsckResult, fsck
from jupyter_portable.engine.journal import Cut
from jupyter_portable.engine.progress import Progress
from jupyter_portable.engine.restore import RestoreResult, restore
from jupyter_portable.engine.scrub import ScrubResult, scrub
from jupyter_portable.engine.snapshot import Extras, SnapshotResult, snapshot
from jupyter_portable.engine.verify import VerifyResult, verify_dir
from jupyter_portable.store.credentials import check_store_url as check_s3_text
from jupyter_portable.store.repo import Store, head_key
from jupyter_portable.workdir.pending import read_pending
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy, check_store_url

if TYPE_CHECKING:
    from jupyter_portable.engine.checkpoint.background import CheckpointHandle


def _progress(label: str, stream: TextIO | None, sink: Callable[[str], None] | None = None) -> Progress:
    return Progress(label, stream=stream, sink=sink)


def new_workspace_id() -> str:
    return "ws-" + uuid.uuid4().hex[:20]


class Workspace:
    """One workspace copy on disk and the store behind it."""

    def __init__(self, copy: WorkspaceCopy) -> None:
        self.copy = copy
        self._store: Store | None = None

    # -- finding and creating ----------------------------------------------------------

    @classmethod
    def find(cls, start: str | os.PathLike[str] = ".") -> "Workspace":
        """The workspace whose copy holds ``start`` (it or a parent has ``.portable/``)."""
        return cls(WorkspaceCopy.find(start))

    @classmethod
    def init(cls, directory: str | os.PathLike[str] = ".", store: str | None = None) -> "Workspace":
        """Make ``directory`` a new workspace in ``store`` (default: a local folder)."""
        from jupyter_portable.store import default_store_url

        url = check_store_url(store or default_store_url())
        check_s3_text(url)  # a worker's IAM policy could not name this prefix, and only it
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        copy = WorkspaceCopy(root)
        if copy.exists():
            cfg = copy.read_config()
            raise UsageError(f"{copy.root} is already workspace {cfg.workspace_id} in {cfg.store}")
        st = Store.open(url)
        ws = new_workspace_id()
        try:
            st.create_workspace(ws)
        except PortableError:
            # The head may exist even so (a write whose answer was lost). The id is new and
            # known to no one else, so removing it leaves no empty orphan workspace behind.
            try:
                st.backend.delete(head_key(ws))
            except PortableError:
                pass  # the store is unreachable; the error below is the one to report
            raise
        copy.write_config(CopyConfig(ws, st.url, 0, 0))
        return cls(copy)

    @classmethod
    def restore(cls, store: str, workspace_id: str, dest: str | os.PathLike[str], *,
                version: int | None = None, lazy: bool = False, lazy_threshold: int | None = None,
                delete: bool = False, progress: TextIO | None = sys.stderr, force: bool = False,
                now: datetime | None = None) -> RestoreResult:
        """Restore a version of a workspace into ``dest`` and make it a copy of it. ``force``
        restores over a folder's files, keeping each that differs as ``NAME.orig-TIME`` (``now``)."""
        kwargs: dict[str, Any] = {}
        if lazy_threshold is not None:
            kwargs["lazy_threshold"] = lazy_threshold
        if force and now is None:
            now = utcnow()  # the API's edge: it names the kept files, it times nothing
        return restore(Store.open(check_store_url(store)), workspace_id, Path(dest), version=version,
                       lazy=lazy, delete=delete, progress=_progress("restore", progress), force=force, now=now,
                       **kwargs)

    # -- properties --------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.copy.root

    @property
    def config(self) -> CopyConfig:
        return self.copy.read_config()

    @property
    def workspace_id(self) -> str:
        return self.config.workspace_id

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.open(self.config.store)
        return self._store

    # -- verbs -------------------------------------------------------------------------

    def snapshot(self, message: str = "", *, force: bool = False, progress: TextIO | None = sys.stderr,
                 sink: Callable[[str], None] | None = None, journal: Cut | None = None,
                 python: str | None = None) -> SnapshotResult:
        """Publish the files as the next version (nothing is published if nothing changed).
        ``journal``: a change journal's cut taken just before (only what changed is looked at).
        ``python``: the notebook kernel's interpreter, whose environment the version records,
        where it is not this process's (the worker's kernel runs in an environment of its own)."""
        return snapshot(self.copy, self.store, message=message, force=force,
                        progress=_progress("snapshot", progress, sink), extras=self.extras(python), journal=journal)

    def scrub(self, budget: int, files: int | None = None) -> ScrubResult:
        """Re-hash unchanged files, about ``budget`` bytes or ``files`` files of them, from where the
        last scrub stopped: a file whose bytes changed where stat could not see is named, and read
        again by the next snapshot (``engine/scrub``)."""
        return scrub(self.copy, self.store, budget, files)

    def log(self) -> list[dict[str, Any]]:
        """Every version, newest first."""
        return [{"version": m.version, "created": m.created, "files": len(m.files),
                 "bytes": m.total_bytes, "message": m.message}
                for m in self.store.history(self.workspace_id)]

    def status(self) -> dict[str, Any]:
        """Where this copy stands: version, head, fencing, pending files, the latest verified
        checkpoint, this machine's runtime, the next action and the allocation."""
        from jupyter_portable.engine.checkpoint.registry import latest
        from jupyter_portable.engine.snapshot import adopt_published
        from jupyter_portable.workdir.next_action import read_next_action

        cfg = self.config
        head, _ = self.store.read_head(cfg.workspace_id)
        cfg = adopt_published(self.copy, cfg, head.version, head.manifest)
        pending = [e.path for e in read_pending(self.copy)[1]]
        manifest = self.store.read_manifest(cfg.workspace_id, cfg.version) if cfg.version else None
        best = latest(manifest)
        allocations = list(manifest.allocations) if manifest else []
        return {"workspace_id": cfg.workspace_id, "store": cfg.store, "path": str(self.root),
                "version": cfg.version, "head_version": head.version, "epoch": cfg.epoch,
                "fenced": head.epoch > cfg.epoch, "pending": pending,
                "latest_checkpoint": None if best is None else
                {"path": best.path, "step": best.step, "hash": best.hash, "version": best.version},
                "checkpoints_in_flight": self.checkpoints_in_flight(),
                "runtime": self.machine_runtime(),
                "next_action": read_next_action(self.copy) or (manifest.next_action if manifest else None),
                "allocation": allocations[-1] if allocations else None, "lifecycle": self.lifecycle_status()}

    def lifecycle_status(self) -> dict[str, Any] | None:
        """This copy's lifecycle state and version in the words every view uses (core/state_words.py);
        None where no lifecycle was recorded here (a copy on a rented machine)."""
        from jupyter_portable.core import state_words
        from jupyter_portable.workdir import lifecycle_file

        if self.copy.lifecycle_bytes() is None:
            return None
        lc = lifecycle_file.load(self.copy)
        return {"state": lc.state, "version": lc.version, "words": state_words.words(lc.state).to_json(),
                "line": state_words.state_line(lc.state, lc.version)}

    def machine_runtime(self) -> dict[str, Any]:
        """This machine's Python and GPUs, probed now (a missing GPU is a note, not a failure)."""
        import platform

        from jupyter_portable.compute.gpus import query_gpus

        gpus, cuda_driver, note = query_gpus()
        return {"python": platform.python_version(), "platform": platform.platform(),
                "gpus": [{"name": g.name, "driver": g.driver, "memory_mb": g.memory_mb, "uuid": g.uuid}
                         for g in gpus],
                "cuda_driver": cuda_driver, "gpu_note": note}

    def verify(self, version: int | None = None) -> VerifyResult:
        """Compare the copy with a version (default: the one it is based on) and the store."""
        cfg = self.config
        v = version if version is not None else cfg.version
        if v == 0:
            raise UsageError("this workspace has no snapshot yet; nothing to verify against")
        manifest = self.store.read_manifest(cfg.workspace_id, v)
        pending_version, pending = read_pending(self.copy)
        names = {e.path for e in pending} if pending_version == v else set()
        return verify_dir(self.store, manifest, self.root, names)

    # -- checkpoints -------------------------------------------------------------------

    def manifest(self, version: int | None = None) -> Manifest | None:
        """This copy's version's manifest (or ``version``'s); None before the first snapshot."""
        cfg = self.config
        v = version if version is not None else cfg.version
        return self.store.read_manifest(cfg.workspace_id, v) if v else None

    def checkpoint(self, path: str | os.PathLike[str], *, step: int | None = None, note: str = "",
                   quiet_s: float = 2.0, timeout_s: float = 30.0, progress: TextIO | None = sys.stderr,
                   sink: Callable[[str], None] | None = None) -> CheckpointRecord:
        """Register a checkpoint and wait for it: write check, upload, read-back; verified or
        rejected with its reason (:meth:`checkpoint_async`, then ``wait``)."""
        echo = sink
        if echo is None and progress is not None:
            stream = progress

            def echo(line: str) -> None:
                stream.write(line + "\n")
                stream.flush()
        handle = self.checkpoint_async(path, step=step, note=note, quiet_s=quiet_s, timeout_s=timeout_s,
                                       echo=echo, policy="keep-both", low_priority=False)
        record = handle.wait()
        if record is None:
            raise UsageError(f"checkpoint {handle.path} was skipped: {handle.reason}")
        return record

    def checkpoint_async(self, path: str | os.PathLike[str], *, step: int | None = None, note: str = "",
                         quiet_s: float = 2.0, timeout_s: float = 30.0, policy: str | None = None,
                         budget: int | None = None, echo: Callable[[str], None] | None = None,
                         low_priority: bool = True) -> CheckpointHandle:
        """Register a checkpoint; return once it is safely on local disk (write check passed,
        fsynced) with a handle, while a thread of this process uploads it, reads it back and
        publishes it (``engine/checkpoint/background.py``). ``handle.wait()`` waits for the
        verdict. ``policy``/``budget``: the queue's, for this one (``checkpoint_queue``).
        ``low_priority``: the upload runs at a lower CPU priority than the caller (Linux), as
        beside a training loop; a caller that waits for it anyway says False."""
        from jupyter_portable.engine.checkpoint.background import (
            CheckpointHandle,
            fsync_checkpoint,
            moved_since_check,
            queue_for,
            signatures,
        )
        from jupyter_portable.engine.checkpoint.registry import CheckpointStep, prepare

        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
            raise UsageError(f"step must be a non-negative integer, got {step!r}")
        rel, check = prepare(self.root, path, quiet_s=quiet_s, timeout_s=timeout_s)
        is_dir = (self.root / rel).is_dir()
        signed = None
        if check.ok:
            try:
                fsync_checkpoint(self.root, rel)
                signed = signatures(self.root, rel)
            except OSError as exc:
                raise UsageError(f"cannot register {rel}: {exc.strerror or exc}") from exc
            moved = moved_since_check(check.held, signed, rel)
            if moved is not None:  # rejected, in turn, with this reason: what passed is not what is there
                check, signed = dataclasses.replace(check, ok=False, reason=moved), None
        queue = queue_for(self.copy)
        handle = CheckpointHandle(rel, step, note or "", sum(s[0] for s in (signed or {}).values()), queue.new_key())
        handle.echo, handle.low_priority = echo, low_priority
        if not check.ok:
            handle.reason = check.reason  # published as rejected, with this reason, in turn
        # a file's name may hold what a terminal acts on; the message of a version may not
        label = f"checkpoint {terminal_safe(rel, one_line=True)}" + (f" (step {step})" if step is not None else "")

        def job(_handle: CheckpointHandle, meter: Progress) -> CheckpointRecord:
            hook = CheckpointStep(self.store, rel, check, step, note or "", signed, meter)
            hook.is_dir, hook.root, hook.gate = is_dir, self.root, queue.hold
            extras = self.extras()
            extras.before_publish = hook
            snapshot(self.copy, self.store, message=label, progress=meter, extras=extras)
            assert hook.record is not None
            return hook.record

        return queue.submit(handle, job, policy=policy, budget=budget)

    def checkpoint_queue(self, *, policy: str | None = None, budget: int | None = None) -> dict[str, Any]:
        """Set (or, with neither, show) this process's checkpoint queue: its policy (wait,
        skip-older, keep-both) and byte budget; and the checkpoints in flight in any process."""
        from jupyter_portable.engine.checkpoint.background import configure, inflight

        q = configure(self.copy, policy=policy, budget=budget)
        return {"policy": q.policy, "budget": q.budget, "in_flight": inflight(self.copy)}

    def checkpoints_in_flight(self) -> list[dict[str, Any]]:
        """The checkpoints queued or uploading on this copy, in any process (oldest first)."""
        from jupyter_portable.engine.checkpoint.background import inflight

        return inflight(self.copy)

    def record_allocation(self, record: dict[str, Any], message: str = "", *, epoch: int | None = None) -> int:
        """Publish a version whose allocation history holds ``record`` (validated; a record
        with the same allocation_id replaces the earlier one). The files are the head's, not
        this copy's: recording a machine's fate never publishes unsaved edits. Publishes with
        this copy's epoch unless ``epoch`` (one the caller claimed) is given. Returns the version."""
        from jupyter_portable.core.records import check_allocation
        from jupyter_portable.engine.snapshot import publish_records

        cfg = self.config
        checked = check_allocation(dict(record))
        label = message or f"allocation {checked.get('allocation_id')}: {checked.get('state', '')}".strip()
        version = publish_records(self.store, cfg.workspace_id, epoch=cfg.epoch if epoch is None else epoch,
                                  allocations=[checked], message=label)
        if cfg.version == version - 1:
            # the new version has this copy's files exactly: the copy moves up with it
            self.copy.advance(version)
        return version

    def checkpoints(self) -> list[CheckpointRecord]:
        """Every registered checkpoint of this copy's version, oldest first."""
        from jupyter_portable.engine.checkpoint.registry import records

        return records(self.manifest())

    def latest_checkpoint(self) -> CheckpointRecord | None:
        """The last verified checkpoint; rejected ones never count."""
        from jupyter_portable.engine.checkpoint.registry import latest

        return latest(self.manifest())

    def extras(self, python: str | None = None) -> Extras:
        """What every snapshot of this copy records besides files (runtime, next action)."""
        from jupyter_portable.engine.runtime.record import RuntimeRecorder, env_fingerprint
        from jupyter_portable.workdir.next_action import read_next_action

        fingerprint = env_fingerprint(python)
        return Extras(fingerprint=fingerprint, runtime=RuntimeRecorder(self.copy, self.store, fingerprint, python),
                      next_action=read_next_action(self.copy))

    def diff(self, a: int, b: int) -> dict[str, Any]:
        """What changed from version ``a`` to ``b``: files, packages, driver, GPU."""
        from jupyter_portable.engine.runtime.diff import diff_runtime

        ma, mb = self.manifest(a), self.manifest(b)
        assert ma is not None and mb is not None
        added: list[str] = []
        removed: list[str] = []
        changed: list[str] = []
        if ma.tree is not None and mb.tree is not None:
            from jupyter_portable.engine.trees import diff_trees

            # Walks only the subtrees that differ: the cost is the change, not the workspace.
            for path, old, new in diff_trees(self.store, ma.tree, mb.tree):
                (added if old is None else removed if new is None else changed).append(path)
        else:
            fa, fb = ma.by_path(), mb.by_path()
            added, removed = sorted(fb.keys() - fa.keys()), sorted(fa.keys() - fb.keys())
            changed = sorted(p for p in fa.keys() & fb.keys()
                             if (fa[p].hash, fa[p].target, fa[p].mode) != (fb[p].hash, fb[p].target, fb[p].mode))

        def lock(m: Manifest) -> bytes | None:
            h = (m.runtime or {}).get("lockfile")
            return self.store.get_object(h, what="the lockfile") if h else None

        runtime = None
        if ma.runtime and mb.runtime:
            runtime = diff_runtime(ma.runtime, mb.runtime, lock(ma), lock(mb))
        # the machines recorded since ``a`` whose environment differed from the recorded one (issue 26)
        before = {x.get("allocation_id"): x for x in ma.allocations}
        machines = [{"allocation_id": x["allocation_id"], "provider": x.get("provider"),
                     "environment": x["environment"]}
                    for x in mb.allocations if isinstance(x.get("environment"), dict)
                    and not x["environment"].get("exact") and before.get(x.get("allocation_id")) != x]
        return {"a": a, "b": b,
                "files": {"added": sorted(added), "removed": sorted(removed), "changed": sorted(changed)},
                "runtime": runtime, "machines": machines,
                "checkpoints": {"a": len(ma.checkpoints), "b": len(mb.checkpoints)}}

    @staticmethod
    def format_diff(d: dict[str, Any]) -> str:
        from jupyter_portable.engine.runtime.diff import format_diff

        lines = [f"version {d['a']} -> {d['b']}"]
        for kind, mark in (("added", "+"), ("removed", "-"), ("changed", "~")):
            lines += [f"  {mark} {p}" for p in d["files"][kind]]
        if not any(d["files"].values()):
            lines.append("  no file changes")
        lines.append(format_diff(d["runtime"]) if d["runtime"] else "runtime: not recorded in both versions")
        for m in d.get("machines") or []:
            lines.append(f"machine {m['allocation_id']} ({m.get('provider') or '?'}) ran the environment with "
                         f"differences: {m['environment'].get('summary')}")
        return "\n".join(lines)

    def diff_text(self, a: int, b: int) -> str:
        return self.format_diff(self.diff(a, b))

    def fetch(self, path: str) -> None:
        """Materialize a file still pending from a lazy restore, ahead of the queue."""
        from jupyter_portable.core.paths import check_relpath
        from jupyter_portable.engine.lazy import ensure

        ensure(self.copy, check_relpath(path))


def fsck_store(url: str, *, read_data: bool = False, subset: float | None = None) -> FsckResult:
    return fsck(Store.open(check_store_url(url)), read_data=read_data, subset=subset)
