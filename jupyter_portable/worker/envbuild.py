"""The kernel's environment on the worker: a venv built from the recorded lockfile, warm
from wheels kept in the store (``envcache``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.worker.state import AgentState


def pinned_only(lockfile: bytes) -> tuple[bytes, list[str]]:
    """The lockfile's ``NAME==VERSION`` lines (what a wheel can satisfy), and the names left out
    (editable and direct-URL installs: local to the machine that made the lockfile).

    This package itself is neither: the kernel gets it from the worker's own venv (link_worker),
    built from the code the user runs. A lockfile recorded on a rented machine before the worker's
    packages were left out of it (lockfile.WORKER_PTH) lists it as a plain pin, which no index holds."""
    from jupyter_portable.engine.runtime.lockfile import parse_lockfile

    keep: list[str] = []
    skipped: list[str] = []
    for name, line in sorted(parse_lockfile(lockfile).items()):
        if name == "jupyter-portable":
            continue
        (keep if "==" in line and " @ " not in line and not line.startswith("-e") else skipped).append(
            line if "==" in line else name)
    return ("\n".join(keep) + "\n").encode(), skipped


def _digest_or_none(value: object) -> str | None:
    """The index digest the user's side sent, validated (a config is input like any other)."""
    if value is None:
        return None
    from jupyter_portable.core.validate import check_hash

    return check_hash(value, "the environment's index digest")


def missing_here(lockfile: bytes) -> list[str]:
    """The lockfile's pinned packages this Python lacks, or has at another version."""
    from importlib.metadata import PackageNotFoundError, version

    from jupyter_portable.engine.runtime.lockfile import parse_lockfile

    out = []
    for name, line in sorted(parse_lockfile(lockfile).items()):
        if "==" not in line or " @ " in line:
            continue
        wanted = line.split("==", 1)[1].split(";")[0].strip()
        try:
            if version(name) != wanted:
                out.append(line)
        except PackageNotFoundError:
            out.append(line)
    return out


def link_worker(python: Path) -> None:
    """Let the kernel in a venv built from the lockfile import this package (its ``%workspace``
    magics) without shadowing the lockfile's own versions: a ``.pth`` file puts the worker's
    site-packages *after* the venv's, so the recorded ipython or numpy win and only what the
    lockfile lacks comes from the worker (PYTHONPATH would put it first)."""
    import subprocess

    from jupyter_portable.engine.runtime.lockfile import WORKER_PTH

    proc = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    purelib = Path(proc.stdout.strip())
    if proc.returncode != 0 or not purelib.is_dir():
        raise PortableError(f"cannot find the site-packages of {python}: {proc.stderr.strip()[-200:]}")
    worker_site = Path(__file__).resolve().parents[2]
    (purelib / WORKER_PTH).write_text(f"{worker_site}\n")


def image_will_do(state: AgentState) -> bool:
    """Whether the kernel runs on this Python (the image's libraries), decided before anything
    is built and recorded in ``state.env_build``: ``environment.mode`` ``image``, or ``auto`` (the
    default) when this Python already has every recorded package at its recorded version.
    Quick (the manifest and the lockfile, no process started), so that the kernel can be
    started before the workspace's files land."""
    mode = state.environment.get("mode", "image")
    if mode not in ("image", "lockfile", "auto", "exact"):
        raise UsageError(f"unknown environment mode {mode!r} (auto, image, lockfile or exact)")
    if mode == "image":
        state.env_build = {"mode": "image", "python": sys.executable}
        return True
    if mode != "auto":
        return False
    store = state.store()
    lock_hash = (store.read_manifest(state.workspace_id, state.version).runtime or {}).get("lockfile")
    missing = missing_here(store.get_object(lock_hash, what="the lockfile")) if lock_hash else []
    if not missing:
        state.env_build = {"mode": "image", "chosen_by": "auto", "python": sys.executable}
        return True
    state.progress.update(step="environment", message=f"this machine's Python lacks {len(missing)} recorded "
                                                      f"package(s) ({', '.join(missing[:3])}…): building the "
                                                      "lockfile's environment")
    return False


def build_environment(state: AgentState, *, image: bool | None = None) -> None:
    """The kernel's Python: this one when :func:`image_will_do` (``image``: what it said, when the
    caller asked it already), else a venv from the recorded lockfile (``lockfile``, ``exact``, or
    ``auto`` when this Python lacks a recorded package), its wheels from the store when the user's
    side prepared them and sent the index's digest, else from the package index: a store's index
    with no digest from the user's side is never used, and this machine's own build is never
    published for another machine to use."""
    from jupyter_portable.core.envplan import EnvChange
    from jupyter_portable.worker.envcache import build_env
    from jupyter_portable.worker.localwheels import LocalWheel

    if image_will_do(state) if image is None else image:
        return
    store = state.store()
    manifest = store.read_manifest(state.workspace_id, state.version)
    lock_hash = (manifest.runtime or {}).get("lockfile")
    if not lock_hash:
        raise PortableError(f"version {state.version} recorded no lockfile to build the environment from",
                            hint="use the image's Python (environment mode 'image')")
    lockfile, skipped = pinned_only(store.get_object(lock_hash, what="the lockfile"))
    venv = state.state_dir / f"env-{lock_hash[:16]}"
    started = time.monotonic()
    local = [LocalWheel.from_json(w) for w in state.environment.get("built") or []]
    notes = [EnvChange.from_json(c, "the environment's notes") for c in state.environment.get("not_built") or []]
    skipped = [n for n in skipped if n not in {w.name for w in local}]
    built = build_env(store, lockfile, venv, find_links=state.environment.get("find_links"),
                      index_url=state.environment.get("index_url"), local=local, notes=notes,
                      expect=_digest_or_none(state.environment.get("index_digest")), pinned_only=True,
                      progress=lambda line: state.progress.update(step="environment", message=line))
    link_worker(built.python)
    state.kernel_python = str(built.python)
    state.env_build = {**built.to_json(), "mode": "lockfile",
                       "chosen_by": state.environment.get("chosen_by", state.environment.get("mode")),
                       "skipped": skipped,
                       "seconds": round(time.monotonic() - started, 3)}
    state.timings["environment_s"] = round(time.monotonic() - started, 3)
