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

API (JSON; ``Authorization: token <token>``)::

    GET  /status                    phase, version, epoch, verification, progress, pending files
    POST /kernel   {"kernel_id"}    start (or restart) the kernel; its connection info (ports on 127.0.0.1)
    GET  /kernel                    {"alive": bool, "returncode": int | null}
    POST /kernel/signal {"signum"}  signal the kernel
    DELETE /kernel                  stop the kernel
    POST /snapshot {"message"}      publish the worker's copy: {"version", "changed"}
    PUT  /files {"path", "content" (base64), "base" (hash or null)}   409 on a conflicting edit
    GET  /files                     the copy's files (path, size) and what is still pending
    POST /fetch {"path"}            fetch a pending large file now
    POST /seal {"message"}          seal: {"version", "manifest"}
    PUT  /credentials {credential_process JSON}   fresh store credentials: {"expiration"}
    POST /shutdown                  stop the kernel and exit
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import errno
import hmac
import json
import logging
import os
import platform
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

from jupyter_portable.core.errors import ConflictError, PortableError, UnsafePath, UsageError
from jupyter_portable.core.paths import check_relpath
from jupyter_portable.store.repo import digest, hash_file
from jupyter_portable.workdir.files import atomic_write
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.protocol import READY_PREFIX

log = logging.getLogger("jupyter_portable.worker")

_MAX_BODY = 64 * 2**20  # an edit saved in JupyterLab; large data goes through the store
_MAX_DEPTH = 256  # folders in an edited file's path; deeper is a mistake (and past Python's recursion)


class AgentState:
    """Everything the agent knows, shared by the HTTP handlers and the work thread."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.workspace_id: str = config["workspace_id"]
        self.allocation_id: str = config["allocation_id"]
        self.store_url: str = config["store"]
        self.version: int = int(config["version"])
        self.epoch: int = int(config["epoch"])
        self.workdir = Path(config["workdir"]).expanduser().resolve()
        self.state_dir = Path(config["state_dir"]).expanduser().resolve()
        self.lazy_threshold = int(config.get("lazy_threshold", 64 * 2**20))
        self.token: str = secrets.token_urlsafe(32)
        self.phase = "starting"
        self.error: str | None = None
        self.verification: dict[str, Any] | None = None
        self.progress: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.sealed: dict[str, Any] | None = None
        self.environment: dict[str, Any] = dict(config.get("environment") or {"mode": "image"})
        self.kernel_python: str = sys.executable
        self.env_build: dict[str, Any] | None = None
        self.kernel: subprocess.Popen[bytes] | None = None
        self.kernel_info: dict[str, Any] | None = None
        self.prestarted = False
        self.writes = threading.Lock()  # held by a write in flight (snapshot, edit)
        self.accepting = True
        self.machine_gone = False
        self.lock = threading.Lock()
        self.credentials_expiration: str | None = None  # of the store credentials in use; never the keys

    # -- the store, opened lazily in the threads that need it --
    def store(self) -> Any:
        from jupyter_portable.store.repo import Store

        return Store.open(self.store_url)

    def status(self) -> dict[str, Any]:
        pending: list[str] = []
        if self.phase not in ("starting", "materializing"):
            with contextlib.suppress(PortableError, OSError):
                from jupyter_portable.engine.lazy import pending_paths

                pending = pending_paths(WorkspaceCopy(self.workdir))
        version = self.version
        with contextlib.suppress(PortableError, OSError):
            version = WorkspaceCopy(self.workdir).read_config().version
        return {"phase": self.phase, "allocation_id": self.allocation_id, "workspace_id": self.workspace_id,
                "version": version, "epoch": self.epoch, "workdir": str(self.workdir), "error": self.error,
                "verification": self.verification, "progress": dict(self.progress), "timings": dict(self.timings),
                "pending": pending, "accepting": self.accepting, "sealed": self.sealed, "heartbeat": time.time(),
                "pid": os.getpid(), "python": self.kernel_python, "environment": self.env_build,
                "kernel": self.kernel_status(), "credentials": {"expiration": self.credentials_expiration}}

    def kernel_status(self) -> dict[str, Any]:
        k = self.kernel
        if k is None:
            return {"alive": False, "returncode": None, "started": False, "machine_gone": self.machine_gone}
        rc = k.poll()
        return {"alive": rc is None, "returncode": rc, "started": True, "machine_gone": self.machine_gone}


# -- materialize and verify ------------------------------------------------------------------

def _progress_sink(state: AgentState, step: str) -> Any:
    from jupyter_portable.engine.progress import Progress

    def sink(line: str) -> None:
        state.progress = {"step": step, "message": line}

    return Progress(step, stream=None, sink=sink)


def materialize(state: AgentState) -> None:
    from jupyter_portable.engine.checkpoint.registry import records
    from jupyter_portable.engine.restore import restore

    state.phase = "materializing"
    store = state.store()
    manifest = store.read_manifest(state.workspace_id, state.version)
    eager = [r.path for r in records(manifest) if r.verified]
    started = time.monotonic()
    restore(store, state.workspace_id, state.workdir, version=state.version, lazy=True,
            lazy_threshold=state.lazy_threshold, eager=eager, progress=_progress_sink(state, "materialize"),
            start_fetcher=False)
    state.timings["materialize_s"] = round(time.monotonic() - started, 3)


def fetch_in_background(state: AgentState) -> None:
    """Large files, smallest first, in this process: they stop when the machine's agent does.
    A file asked for (``/fetch``) jumps the queue: the fetcher and the request share per-file locks."""
    from jupyter_portable.engine.lazy import fetch_pending

    copy = WorkspaceCopy(state.workdir)
    started = time.monotonic()
    try:
        while fetch_pending(copy) is not None:
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
    # 2. checkpoints: every verified checkpoint is on disk and hashes as recorded
    checked: dict[str, str] = {}
    entries = manifest.by_path()
    for rec in records(manifest):
        if not rec.verified:
            continue
        # the files themselves were hashed on disk by verify_dir above
        mine = [e for p, e in entries.items() if p == rec.path or p.startswith(rec.path + "/")]
        if any(e.path in pending for e in mine):
            problems.append(f"checkpoints: {rec.path} is not all on disk")
        got = mine[0].hash if len(mine) == 1 and mine[0].path == rec.path else listing_hash(mine, rec.path)
        if got != rec.hash:
            problems.append(f"checkpoints: {rec.path} hashes to {str(got)[:16]}, recorded {str(rec.hash)[:16]}")
        checked[rec.path] = str(rec.hash)
    # 3. runtime: the recorded lockfile reads back, and this Python runs the same minor version
    runtime = manifest.runtime or {}
    runtime_detail: dict[str, Any] = {"recorded": bool(runtime)}
    if runtime.get("lockfile"):
        store.get_object(runtime["lockfile"], what="the lockfile")  # hash-checked
        runtime_detail["lockfile"] = runtime["lockfile"]
    recorded_py = str(runtime.get("python") or "")
    here = platform.python_version()
    runtime_detail.update(python=here, recorded_python=recorded_py or None)
    if recorded_py and recorded_py.split(".")[:2] != here.split(".")[:2]:
        problems.append(f"runtime: the work ran on Python {recorded_py}, this worker has {here}")
    # 4. path: the copy is this workspace, from this store, in the folder the kernel runs in
    if cfg.workspace_id != state.workspace_id or copy.root != state.workdir:
        problems.append(f"path: {copy.root} holds workspace {cfg.workspace_id}, not {state.workspace_id}")
    state.timings["verify_s"] = round(time.monotonic() - started, 3)
    if problems:
        raise PortableError("the read-back did not match: " + " | ".join(problems))
    return {"matched": ["version", "checkpoints", "runtime", "path"], "version": manifest.version,
            "checkpoints": checked, "runtime": runtime_detail, "path": str(state.workdir),
            "files_checked": len(manifest.files) - len(pending), "pending": sorted(pending)}


def pinned_only(lockfile: bytes) -> tuple[bytes, list[str]]:
    """The lockfile's ``NAME==VERSION`` lines (what a wheel can satisfy), and the names left out
    (editable and direct-URL installs: local to the machine that made the lockfile)."""
    from jupyter_portable.engine.runtime.lockfile import parse_lockfile

    keep: list[str] = []
    skipped: list[str] = []
    for name, line in sorted(parse_lockfile(lockfile).items()):
        (keep if "==" in line and " @ " not in line and not line.startswith("-e") else skipped).append(
            line if "==" in line else name)
    return ("\n".join(keep) + "\n").encode(), skipped


def build_environment(state: AgentState) -> None:
    """With ``environment.mode == "lockfile"``: the kernel's venv from the recorded lockfile, its
    wheels from the store when a worker built it before (warm), else from the package index (cold)."""
    from jupyter_portable.worker.envcache import build_env

    if state.environment.get("mode", "image") == "image":
        state.env_build = {"mode": "image", "python": sys.executable}
        return
    if state.environment.get("mode") != "lockfile":
        raise UsageError(f"unknown environment mode {state.environment.get('mode')!r} (image or lockfile)")
    store = state.store()
    manifest = store.read_manifest(state.workspace_id, state.version)
    lock_hash = (manifest.runtime or {}).get("lockfile")
    if not lock_hash:
        raise PortableError(f"version {state.version} recorded no lockfile to build the environment from",
                            hint="use the image's Python (environment mode 'image')")
    lockfile, skipped = pinned_only(store.get_object(lock_hash, what="the lockfile"))
    venv = state.state_dir / f"env-{lock_hash[:16]}"
    started = time.monotonic()
    built = build_env(store, lockfile, venv, find_links=state.environment.get("find_links"),
                      index_url=state.environment.get("index_url"),
                      progress=lambda line: state.progress.update(step="environment", message=line))
    state.kernel_python = str(built.python)
    state.env_build = {**built.to_json(), "mode": "lockfile", "skipped": skipped,
                       "seconds": round(time.monotonic() - started, 3)}
    state.timings["environment_s"] = round(time.monotonic() - started, 3)


def prepare(state: AgentState) -> None:
    """The work thread: the environment alongside the small files and checkpoints, then verify;
    large files go on arriving in the background."""
    try:
        env_error: list[BaseException] = []

        def env() -> None:
            try:
                build_environment(state)
            except BaseException as exc:
                env_error.append(exc)

        builder = threading.Thread(target=env, daemon=True)
        builder.start()
        materialize(state)
        builder.join()
        if env_error:
            raise env_error[0]
        warm = threading.Thread(target=prestart_kernel, args=(state,), daemon=True)
        warm.start()  # no user code runs in it before READY: it only has to come up
        state.verification = verify(state)
        warm.join()
        state.phase = "ready"
    except Exception as exc:  # reported through /status: the orchestrator decides what next
        state.error = exc.one_line() if isinstance(exc, PortableError) else f"{type(exc).__name__}: {exc}"
        state.phase = "failed"
        stop_kernel(state)
        log.error("prepare failed: %s", state.error)
        return
    threading.Thread(target=fetch_in_background, args=(state,), daemon=True).start()


# -- the kernel --------------------------------------------------------------------------------

def prestart_kernel(state: AgentState) -> None:
    try:
        start_kernel(state, "prestarted")
        state.prestarted = True
    except Exception as exc:  # the kernel is then started on request, as usual
        log.warning("could not start a kernel ahead: %s", exc)


def start_kernel(state: AgentState, kernel_id: str) -> dict[str, Any]:
    from jupyter_client.connect import write_connection_file

    if state.prestarted and state.kernel is not None and state.kernel.poll() is None and state.kernel_info:
        state.prestarted = False  # handed over once; a restart gets a fresh kernel
        return dict(state.kernel_info)
    state.prestarted = False
    stop_kernel(state)
    kdir = state.state_dir / "kernels"
    kdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = secrets.token_hex(32).encode()
    fname, info = write_connection_file(str(kdir / f"kernel-{kernel_id}.json"), ip="127.0.0.1", key=key,
                                        transport="tcp", signature_scheme="hmac-sha256", kernel_name="portable")
    env = {**os.environ, "JUPYTER_PORTABLE_ALLOCATION": state.allocation_id, "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    auto = state.config.get("autosnapshot_minutes")
    if isinstance(auto, (int, float)) and not isinstance(auto, bool) and auto >= 0:
        env["JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES"] = f"{auto:g}"  # the workspace's setting
    if state.kernel_python != sys.executable:
        # a venv built from the lockfile: this package comes from the machine's copy of it
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    with open(state.state_dir / "kernel.log", "ab") as out:
        state.kernel = subprocess.Popen(
            [state.kernel_python, "-m", "ipykernel_launcher", "-f", fname, "--IPKernelApp.extensions=jupyter_portable"],
            cwd=state.workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    conn: dict[str, Any] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in dict(info).items()}
    state.kernel_info = conn
    return conn


def stop_kernel(state: AgentState, timeout: float = 5.0) -> None:
    k = state.kernel
    if k is None or k.poll() is not None:
        return
    k.terminate()
    try:
        k.wait(timeout)
    except subprocess.TimeoutExpired:
        k.kill()
        k.wait(5)


# -- writes: snapshots, edits, the seal -------------------------------------------------------

def take_snapshot(state: AgentState, message: str) -> dict[str, Any]:
    from jupyter_portable.engine.workspace import Workspace

    if not state.accepting:
        raise ConflictError("this worker is sealing: it takes no new writes")
    with state.writes:
        res = Workspace(WorkspaceCopy(state.workdir)).snapshot(message, progress=None)
    return {"version": res.version, "changed": res.changed}


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
    if rel == ".portable" or rel.startswith(".portable/"):
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
    from jupyter_portable.engine.fetch import Placer

    with state.writes:
        placer = Placer(state.workdir)
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
    from jupyter_portable.engine.scan import walk

    copy = WorkspaceCopy(state.workdir)
    files = [{"path": f.path, "size": f.st.st_size} for f in walk(state.workdir, warn=False) if f.target is None]
    return {"version": copy.read_config().version, "files": files, "pending": pending_paths(copy)}


def seal(state: AgentState, message: str) -> dict[str, Any]:
    """Stop new writes, let the write in flight finish, stop the kernel, publish, read back."""
    from jupyter_portable.engine.workspace import Workspace

    state.accepting = False
    state.phase = "sealing"
    with state.writes:  # the write in flight finishes first; no new one starts
        stop_kernel(state)
        ws = Workspace(WorkspaceCopy(state.workdir))
        res = ws.snapshot(message or f"sealed {state.allocation_id}", progress=None)
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
    return dict(state.sealed)


# -- HTTP -------------------------------------------------------------------------------------

class _Handler(web.RequestHandler):
    state: AgentState

    def initialize(self, state: AgentState) -> None:
        self.state = state

    def prepare(self) -> None:
        given = self.request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "token" or not hmac.compare_digest(token.encode(), self.state.token.encode()):
            raise web.HTTPError(403, reason="a valid token is required")

    def body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            obj = json.loads(self.request.body)
        except ValueError:
            raise web.HTTPError(400, reason="the body is not JSON") from None
        if not isinstance(obj, dict):
            raise web.HTTPError(400, reason="the body must be a JSON object")
        return obj

    def answer(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = self._reason
        if isinstance(exc, web.HTTPError) and exc.reason:
            message = exc.reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    async def run(self, fn: Any, *args: Any) -> None:
        try:
            result = await IOLoop.current().run_in_executor(None, fn, *args)
        except ConflictError as exc:
            self.answer({"error": exc.one_line(), "type": "ConflictError", **_jsonable(exc.context)}, 409)
            return
        except (UsageError, UnsafePath) as exc:
            self.answer({"error": exc.one_line(), "type": type(exc).__name__}, 400)
            return
        except PortableError as exc:
            self.answer({"error": exc.one_line(), "type": type(exc).__name__}, 500)
            return
        self.answer(result)


def _jsonable(context: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in context.items() if isinstance(v, (str, int, float, bool)) or v is None}


class StatusHandler(_Handler):
    def get(self) -> None:
        self.answer(self.state.status())


class KernelHandler(_Handler):
    async def post(self) -> None:
        kernel_id = str(self.body().get("kernel_id") or "kernel")
        if not kernel_id.replace("-", "").isalnum() or len(kernel_id) > 64:
            raise web.HTTPError(400, reason="bad kernel_id")
        if self.state.phase != "ready":
            raise web.HTTPError(409, reason=f"the worker is {self.state.phase}, not ready")
        await self.run(start_kernel, self.state, kernel_id)

    def get(self) -> None:
        self.answer(self.state.kernel_status())

    async def delete(self) -> None:
        def stop() -> dict[str, Any]:
            stop_kernel(self.state)
            return {"stopped": True}

        await self.run(stop)


class KernelSignalHandler(_Handler):
    def post(self) -> None:
        signum = self.body().get("signum")
        if not isinstance(signum, int) or signum not in {s.value for s in signal.Signals}:
            raise web.HTTPError(400, reason="signum must be a signal number")
        k = self.state.kernel
        if k is None or k.poll() is not None:
            raise web.HTTPError(409, reason="no kernel is running")
        k.send_signal(signum)
        self.answer({"sent": signum})


class SnapshotHandler(_Handler):
    async def post(self) -> None:
        message = self.body().get("message") or ""
        if not isinstance(message, str):
            raise web.HTTPError(400, reason="message must be text")
        await self.run(take_snapshot, self.state, message)


class FilesHandler(_Handler):
    async def get(self) -> None:
        await self.run(list_files, self.state)

    async def put(self) -> None:
        body = self.body()
        rel, content, base = body.get("path"), body.get("content"), body.get("base")
        if not isinstance(rel, str) or not isinstance(content, str) or not (base is None or isinstance(base, str)):
            raise web.HTTPError(400, reason="expected {path: str, content: base64 str, base: hash or null}")
        try:
            data = base64.b64decode(content, validate=True)
        except ValueError:
            raise web.HTTPError(400, reason="content is not base64") from None
        await self.run(put_file, self.state, rel, data, base)


class FetchHandler(_Handler):
    async def post(self) -> None:
        from jupyter_portable.engine.lazy import ensure

        rel = self.body().get("path")
        if not isinstance(rel, str):
            raise web.HTTPError(400, reason="path must be text")
        def fetch() -> dict[str, Any]:
            ensure(WorkspaceCopy(self.state.workdir), check_relpath(rel))
            return {"path": rel}

        await self.run(fetch)


class SealHandler(_Handler):
    async def post(self) -> None:
        message = self.body().get("message") or ""
        await self.run(seal, self.state, str(message))


class CredentialsHandler(_Handler):
    def put(self) -> None:
        from jupyter_portable.store.credentials import SessionCredentials, write

        if self.state.credentials_expiration is None:
            raise web.HTTPError(409, reason="this worker's store takes no credentials")
        try:
            creds = SessionCredentials.from_json(self.body())
        except UsageError as exc:
            raise web.HTTPError(400, reason=exc.one_line()) from None
        # botocore reads the file again when the credentials it holds near their expiry
        write(self.state.state_dir / "aws", creds)
        self.state.credentials_expiration = creds.expiration
        self.answer({"expiration": creds.expiration})


class ShutdownHandler(_Handler):
    def post(self) -> None:
        self.answer({"stopping": True})
        IOLoop.current().add_callback(_shutdown, self.state)


def _shutdown(state: AgentState) -> None:
    stop_kernel(state)
    IOLoop.current().stop()


def make_app(state: AgentState) -> web.Application:
    args = {"state": state}
    return web.Application([
        (r"/status", StatusHandler, args), (r"/kernel", KernelHandler, args),
        (r"/kernel/signal", KernelSignalHandler, args), (r"/snapshot", SnapshotHandler, args),
        (r"/files", FilesHandler, args), (r"/fetch", FetchHandler, args), (r"/seal", SealHandler, args),
        (r"/shutdown", ShutdownHandler, args), (r"/credentials", CredentialsHandler, args),
    ], max_body_size=_MAX_BODY)


# -- the process ------------------------------------------------------------------------------

def _heartbeat(state: AgentState, machine_pid: int | None) -> None:
    beat = state.state_dir / "heartbeat"
    while True:
        try:
            atomic_write(beat, f"{time.time():.3f}\n".encode())
        except OSError:
            if not state.state_dir.exists():  # the machine's folder is gone: so is the machine
                log.warning("the allocation's folder %s is gone: stopping", state.state_dir)
                state.machine_gone = True
                stop_kernel(state, timeout=1)
                os._exit(3)
        if machine_pid is not None and not _alive(machine_pid):
            log.warning("the machine's process %d is gone: stopping", machine_pid)
            state.machine_gone = True
            stop_kernel(state, timeout=1)
            os._exit(3)
        time.sleep(1.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rpartition(")")[2].split()[:1] == ["Z"]:
            return False
    return True


def check_config(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise UsageError("the agent's configuration must be a JSON object")
    for key in ("store", "workspace_id", "allocation_id", "workdir", "state_dir"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise UsageError(f"the agent's configuration needs {key!r}")
    for key in ("version", "epoch"):
        if not isinstance(obj.get(key), int) or obj[key] < 0:
            raise UsageError(f"the agent's configuration needs a non-negative integer {key!r}")
    environment = obj.get("environment") or {"mode": "image"}
    if not isinstance(environment, dict) or environment.get("mode") not in ("image", "lockfile"):
        raise UsageError("environment must be {\"mode\": \"image\"} or {\"mode\": \"lockfile\", ...}")
    env = obj.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("env must map names to text")
    if obj.get("credentials") is not None:
        from jupyter_portable.store.credentials import SessionCredentials

        SessionCredentials.from_json(obj["credentials"])
    return obj


def _scrub_environment(config: dict[str, Any], state_dir: Path) -> None:
    """This process's environment, which the kernel inherits: no secret of the machine's or the
    user's, the store's settings, and the store credentials only as a 0600 file botocore reads."""
    from jupyter_portable.core.secretenv import is_secret
    from jupyter_portable.store.credentials import SessionCredentials, install

    for name in [n for n in os.environ if is_secret(n)]:
        del os.environ[name]
    os.environ.update({k: v for k, v in (config.get("env") or {}).items() if not is_secret(k)})
    if config.get("credentials") is not None:
        os.environ.update(install(state_dir / "aws", SessionCredentials.from_json(config["credentials"])))


def serve(config: dict[str, Any], ready_out: Any) -> int:
    config = check_config(config)
    state = AgentState(config)
    state.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _scrub_environment(config, state.state_dir)
    if config.get("credentials") is not None:
        state.credentials_expiration = str(config["credentials"]["Expiration"])
    state.workdir.mkdir(parents=True, exist_ok=True)
    asyncio.set_event_loop(asyncio.new_event_loop())
    server = HTTPServer(make_app(state))
    sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    atomic_write(state.state_dir / "agent.json",
                 json.dumps({"pid": os.getpid(), "port": port, "allocation_id": state.allocation_id}).encode())
    ready_out.write(READY_PREFIX + json.dumps({"port": port, "pid": os.getpid(), "token": state.token}) + "\n")
    ready_out.close()  # whoever started the agent reads to the end of this pipe
    threading.Thread(target=_heartbeat, args=(state, config.get("machine_pid")), daemon=True).start()
    threading.Thread(target=prepare, args=(state,), daemon=True).start()

    def stop(_signum: int, _frame: object) -> None:
        IOLoop.current().add_callback_from_signal(_shutdown, state)

    signal.signal(signal.SIGTERM, stop)
    IOLoop.current().start()
    stop_kernel(state)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_portable.worker",
                                     description="the jupyter-portable worker agent (configuration on stdin)")
    parser.add_argument("--detach", action="store_true",
                        help="start the agent in a session of its own, print its ready line, and return")
    args = parser.parse_args(argv)
    raw = sys.stdin.read()
    try:
        config = check_config(json.loads(raw))
    except (ValueError, UsageError) as exc:
        print(f"jupyter-portable worker: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.detach:
        return _detach(raw, Path(config["state_dir"]).expanduser())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # the ready line goes to the parent's pipe; everything after it to the log
    ready = os.fdopen(os.dup(1), "w")
    state_dir = Path(config["state_dir"]).expanduser()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return serve(config, ready)


def _detach(raw: str, state_dir: Path, timeout: float = 60.0) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(raw.encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(READY_PREFIX.encode()) or not line:
            break
    if not line.startswith(READY_PREFIX.encode()):
        tail = ""
        with contextlib.suppress(OSError):
            tail = (state_dir / "agent.log").read_text(errors="replace")[-800:]
        print(f"jupyter-portable worker: the agent did not come up: {tail}", file=sys.stderr)
        return 1
    sys.stdout.write(line.decode())
    sys.stdout.flush()
    return 0


__all__ = ["AgentState", "main", "make_app", "serve"]
