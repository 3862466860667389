"""The worker agent: the one process of ours on an allocation.

It is started (``python -m jupyter_portable.worker --detach``, its configuration as JSON on
stdin) on the machine by :mod:`.launch`, once the machine passed admission. It then

1. materializes the workspace at the version it was given: small files first, the
   checkpoints, and large files in the background (any file asked for is fetched first);
2. verifies: reads the durable record back and compares it with what is on disk
   (manifest version, checkpoint hashes, runtime, workspace path: invariant 5);
3. serves a small HTTP API on 127.0.0.1 only, reached through an SSH port forward on
   remote hosts. Every request must carry the per-allocation token it printed once, on its
   stdout, when it came up; the token is never written to a log or the store;
4. runs the notebook's ipykernel in the workspace folder with ``%workspace`` loaded, takes
   snapshots straight to the store, accepts edits saved in JupyterLab (refusing a
   conflicting one), and seals: no new writes, the kernel stopped, the final manifest
   published and read back;
5. writes a heartbeat file every second, and exits when the machine's own process (the
   one the provider started) is gone.

Its modules: ``state`` (what it knows), ``kernel``, ``envbuild``, ``api`` (the HTTP API) and
``daemon`` (the process: configuration, heartbeat, detaching).
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import threading
import time
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import ConflictError, PortableError, UnsafePath, UsageError
from jupyter_portable.core.paths import check_relpath, in_reserved
from jupyter_portable.store.repo import digest, hash_file
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.envbuild import build_environment, image_will_do
from jupyter_portable.worker.kernel import prestart_kernel, stop_kernel
from jupyter_portable.worker.state import AgentState, progress_sink

log = logging.getLogger("jupyter_portable.worker")

_MAX_DEPTH = 256  # folders in an edited file's path; deeper is a mistake (and past Python's recursion)


# -- materialize and verify ------------------------------------------------------------------


def materialize(state: AgentState) -> None:
    from jupyter_portable.engine.checkpoint.registry import records
    from jupyter_portable.engine.gate import InboundGate
    from jupyter_portable.engine.restore import restore

    state.phase = "materializing"
    store = state.store()
    manifest = store.read_manifest(state.workspace_id, state.version)
    eager = [r.path for r in records(manifest) if r.verified]
    started = time.monotonic()
    # the machine's own copy is the version whole: the path rules only (the user's side has its own gate)
    restore(store, state.workspace_id, state.workdir, version=state.version, lazy=True,
            lazy_threshold=state.lazy_threshold, eager=eager, progress=progress_sink(state, "materialize"),
            start_fetcher=False, inbound=InboundGate.machine_side(state.workdir))
    state.timings["materialize_s"] = round(time.monotonic() - started, 3)


def fetch_in_background(state: AgentState) -> None:
    """Large files, smallest first, in this process: they stop when the machine's agent does.
    A file asked for (``/fetch``) jumps the queue: the fetcher and the request share per-file locks."""
    from jupyter_portable.engine.gate import InboundGate
    from jupyter_portable.engine.lazy import fetch_pending

    copy = WorkspaceCopy(state.workdir)
    started = time.monotonic()
    try:
        while fetch_pending(copy, inbound=InboundGate.machine_side(state.workdir)) is not None:
            pass
        state.timings["background_s"] = round(time.monotonic() - started, 3)
    except Exception as exc:  # the files stay pending; /fetch and a later Continue try again
        state.error = f"background fetch: {exc.one_line() if isinstance(exc, PortableError) else exc}"
        log.error("%s", state.error)


def verify(state: AgentState) -> dict[str, Any]:
    """Read the durable record back and compare it with the copy: the four checks of READY."""
    from jupyter_portable.engine.checkpoint.registry import listing_hash, records
    from jupyter_portable.engine.lazy import pending_paths
    from jupyter_portable.engine.verify import verify_dir

    state.phase = "verifying"
    started = time.monotonic()
    store = state.store()
    copy = WorkspaceCopy(state.workdir)
    cfg = copy.read_config()
    problems: list[str] = []
    # 1. version: the copy stands on the version it was sent for, read back from the store now
    manifest = store.read_manifest(state.workspace_id, state.version)
    if manifest.version != state.version or cfg.version != state.version:
        problems.append(f"version: the copy is at {cfg.version}, the store's record at {manifest.version}, "
                        f"expected {state.version}")
    pending = set(pending_paths(copy))
    result = verify_dir(store, manifest, state.workdir, pending=pending)
    real = [m for m in result.mismatches if m["path"] not in pending]
    if real:
        problems.append("files: " + "; ".join(f"{m['path']}: {m['reason']}" for m in real[:5]))
    # 2. checkpoints: the newest verified checkpoint of each path is on disk and hashes as
    # recorded. An older record of a path saved again is history (its bytes are in the version
    # that verified it); so is a newest one whose file a later version changed (a save whose
    # check was refused, an overwrite): named in "superseded", not a failure of this copy.
    checked: dict[str, str] = {}
    superseded: dict[str, int | None] = {}
    entries = manifest.by_path()
    newest: dict[str, Any] = {}
    for rec in records(manifest):
        if rec.verified and (rec.path not in newest or rec.id > newest[rec.path].id):
            newest[rec.path] = rec
    for rec in newest.values():
        # the files themselves were hashed on disk by verify_dir above
        mine = [e for p, e in entries.items() if p == rec.path or p.startswith(rec.path + "/")]
        if any(e.path in pending for e in mine):
            problems.append(f"checkpoints: {rec.path} is not all on disk")
        got = mine[0].hash if len(mine) == 1 and mine[0].path == rec.path else listing_hash(mine, rec.path)
        if got == rec.hash:
            checked[rec.path] = str(rec.hash)
        elif rec.version is not None and rec.version < manifest.version:
            superseded[rec.path] = rec.version
        else:  # verified in this very version and different now: the copy is wrong
            problems.append(f"checkpoints: {rec.path} hashes to {str(got)[:16]}, recorded {str(rec.hash)[:16]}")
    # 3. runtime: the recorded lockfile reads back, and this Python runs the same minor version
    runtime = manifest.runtime or {}
    runtime_detail: dict[str, Any] = {"recorded": bool(runtime)}
    if runtime.get("lockfile"):
        store.get_object(runtime["lockfile"], what="the lockfile")  # hash-checked
        runtime_detail["lockfile"] = runtime["lockfile"]
    recorded_py = str(runtime.get("python") or "")
    here = platform.python_version()
    runtime_detail.update(python=here, recorded_python=recorded_py or None)
    if recorded_py and recorded_py != here:
        built = state.env_build or {}
        other_minor = recorded_py.split(".")[:2] != here.split(".")[:2]
        if other_minor and (state.environment.get("mode") == "exact" or state.environment.get("exact")):
            problems.append(f"runtime: the work ran on Python {recorded_py}, this worker has {here} "
                            "(environment 'exact')")
        elif other_minor and built.get("mode") != "lockfile":
            problems.append(f"runtime: the work ran on Python {recorded_py}, this worker has {here}")
        else:
            # the same minor version, or an environment resolved for this Python with each
            # difference recorded (issue 26): accepted, and shown
            runtime_detail["python_changed"] = {"recorded": recorded_py, "installed": here}
    # 4. path: the copy is this workspace, from this store, in the folder the kernel runs in
    if cfg.workspace_id != state.workspace_id or copy.root != state.workdir:
        problems.append(f"path: {copy.root} holds workspace {cfg.workspace_id}, not {state.workspace_id}")
    state.timings["verify_s"] = round(time.monotonic() - started, 3)
    if problems:
        raise PortableError("the read-back did not match: " + " | ".join(problems))
    return {"matched": ["version", "checkpoints", "runtime", "path"], "version": manifest.version,
            "checkpoints": checked, "superseded": superseded, "runtime": runtime_detail, "path": str(state.workdir),
            "files_checked": len(manifest.files) - len(pending), "pending": sorted(pending)}


def prepare(state: AgentState) -> None:
    """The work thread: the environment, then the kernel, alongside the small files and
    checkpoints, then verify; large files go on arriving in the background.

    The kernel is started as soon as its Python is known, in the empty workspace folder, while
    the files land: it takes longer to come up than a small workspace takes to arrive and be
    checked, and no user code runs in it before READY (the notebook connects after). When it
    runs on this Python (``image_will_do``, decided from the manifest alone) it starts before
    the files are fetched; else once the lockfile's environment is built, beside the fetch.
    Its connection is handed to the first ``POST /kernel``."""
    try:
        env_error: list[BaseException] = []
        began = time.monotonic()

        def kernel_now() -> None:
            state.timings["environment_s"] = round(time.monotonic() - began, 3)
            state.workdir.mkdir(parents=True, exist_ok=True)  # the kernel's folder; restore fills it
            prestart_kernel(state)
            state.timings["kernel_start_s"] = round(time.monotonic() - began, 3)

        def env() -> None:
            try:
                build_environment(state, image=False)
            except BaseException as exc:
                env_error.append(exc)
                return
            kernel_now()

        builder: threading.Thread | None = None
        if image_will_do(state):
            kernel_now()
        else:
            builder = threading.Thread(target=env, daemon=True)
            builder.start()
        materialize(state)
        if builder is not None:
            builder.join()
        if env_error:
            raise env_error[0]
        state.verification = verify(state)
        state.activity.ready()  # the idle clock starts when the machine can first be used
        state.phase = "ready"
    except Exception as exc:  # reported through /status: the orchestrator decides what next
        state.error = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
        state.phase = "failed"
        stop_kernel(state)
        log.error("prepare failed: %s", state.error)
        return
    threading.Thread(target=fetch_in_background, args=(state,), daemon=True).start()


# -- the kernel --------------------------------------------------------------------------------


# -- writes: snapshots, edits, the seal -------------------------------------------------------

def take_snapshot(state: AgentState, message: str) -> dict[str, Any]:
    from jupyter_portable.engine.workspace import Workspace

    if not state.accepting:
        raise ConflictError("this worker is sealing: it takes no new writes")
    with state.writes:
        res = Workspace(WorkspaceCopy(state.workdir)).snapshot(message, progress=None, python=state.kernel_python)
    return {"version": res.version, "changed": res.changed, "skipped": list(res.to_json().get("skipped") or [])}


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def check_fits(root: Path, rel: str) -> None:
    """UsageError unless ``rel`` can be a file under ``root`` here: no name longer than the
    filesystem allows, no path longer than the system's limit, at most ``_MAX_DEPTH`` folders."""
    parts = rel.split("/")
    if len(parts) > _MAX_DEPTH:
        raise UsageError(f"path {_short(rel)!r} is {len(parts)} levels deep; the worker takes at most {_MAX_DEPTH}",
                         hint="save it at a shallower path")
    try:
        name_max, path_max = os.pathconf(root, "PC_NAME_MAX"), os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise UsageError(f"name {_short(part)!r} is {size} bytes; this filesystem allows at most {name_max}",
                             hint="save it under a shorter name")
    size = len(os.fsencode(os.path.join(root, rel)))
    if size >= path_max:
        raise UsageError(f"path {_short(rel)!r} would be {size} bytes long on the worker; the limit there is "
                         f"{path_max - 1}", hint="save it at a shorter path")


def put_file(state: AgentState, rel: str, content: bytes, base: str | None) -> dict[str, Any]:
    """Write an edit saved in JupyterLab; refuse it (409) if the worker's copy changed since ``base``."""
    if not state.accepting:
        raise ConflictError("this worker is sealing: it takes no new writes")
    rel = check_relpath(rel)
    if in_reserved(rel):
        raise UnsafePath(f"{rel}: the workspace's own records cannot be edited")
    check_fits(state.workdir, rel)
    new = digest(content)
    try:
        return _write_edit(state, rel, content, base, new)
    except OSError as exc:
        # The checks above leave little; what is left is the machine's fault, named, not a traceback.
        if exc.errno == errno.ENAMETOOLONG:
            raise UsageError(f"{_short(rel)!r}: {exc.strerror}", hint="save it under a shorter name") from exc
        raise PortableError(f"cannot write {_short(rel)!r} on the worker: {exc.strerror or exc}") from exc


def _write_edit(state: AgentState, rel: str, content: bytes, base: str | None, new: str) -> dict[str, Any]:
    from jupyter_portable.engine.gate import InboundGate

    with state.writes:
        placer = InboundGate.machine_side(state.workdir).placer()
        target = Path(placer.target(rel))
        current = hash_file(target) if target.is_file() else None
        if current is not None and current != new and current != base:
            raise ConflictError(f"{rel} changed on the worker since it was opened in JupyterLab",
                                current=current, hint="both versions were kept")
        tmp = placer.temp_path()
        with open(tmp, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    return {"path": rel, "hash": new, "size": len(content)}


def list_files(state: AgentState) -> dict[str, Any]:
    from jupyter_portable.engine.lazy import pending_paths
    from jupyter_portable.engine.listing import walk

    copy = WorkspaceCopy(state.workdir)
    files = [{"path": f.path, "size": f.st.st_size} for f in walk(state.workdir, warn=False) if f.target is None]
    return {"version": copy.read_config().version, "files": files, "pending": pending_paths(copy)}


CHECKPOINT_WAIT_S = 1800.0  # a seal waits this long at most for checkpoints still uploading


def seal(state: AgentState, message: str) -> dict[str, Any]:
    """Stop new writes, let the write in flight finish, stop the kernel, publish, read back."""
    from jupyter_portable.engine.checkpoint.background import wait_inflight
    from jupyter_portable.engine.workspace import Workspace

    state.accepting = False
    state.phase = "sealing"
    with state.writes:  # the write in flight finishes first; no new one starts
        # the kernel's checkpoints still uploading finish before the kernel stops (and say so);
        # one that does not within the bound is given up, and "latest" stays on the last verified
        copy = WorkspaceCopy(state.workdir)
        flying = wait_inflight(copy, timeout_s=0)[0]
        if flying:
            state.phase = f"sealing: waiting for {len(flying)} checkpoint(s) in flight"
        waited, left = wait_inflight(copy, timeout_s=CHECKPOINT_WAIT_S)
        state.phase = "sealing"
        stop_kernel(state)
        ws = Workspace(WorkspaceCopy(state.workdir))
        res = ws.snapshot(message or f"sealed {state.allocation_id}", progress=None, python=state.kernel_python)
        store = state.store()
        head, _ = store.read_head(state.workspace_id)
        if head.version != res.version:
            raise ConflictError(f"the head moved to {head.version} while sealing version {res.version}")
        check = ws.verify(res.version)
        if not check.ok and any("not fetched yet" not in m["reason"] for m in check.mismatches):
            raise PortableError("the sealed version did not read back: " +
                                "; ".join(f"{m['path']}: {m['reason']}" for m in check.mismatches[:3]))
    state.sealed = {"version": res.version, "manifest": head.manifest}
    state.phase = "sealed"
    out: dict[str, Any] = dict(state.sealed)
    if waited:
        out["checkpoints_waited"] = [str(c.get("line")) for c in waited]
        out["checkpoints_abandoned"] = [str(c.get("line")) for c in left]
    return out


# -- HTTP -------------------------------------------------------------------------------------


# -- the process ------------------------------------------------------------------------------


__all__ = ["AgentState", "list_files", "materialize", "prepare", "put_file", "seal", "take_snapshot", "verify"]
