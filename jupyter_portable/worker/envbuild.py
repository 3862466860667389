"""The kernel's environment on the worker: a venv built from the recorded lockfile, warm
from wheels kept in the store (``envcache``)."""

from __future__ import annotations

import sys
import time

from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.worker.state import AgentState


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


def build_environment(state: AgentState) -> None:
    """The kernel's Python. ``environment.mode``: ``image`` (this Python, the image's libraries),
    ``lockfile`` (a venv from the recorded lockfile, its wheels from the store when a worker built
    it before, else from the package index), or ``auto`` (the default: ``image`` when this Python
    already has every recorded package at its recorded version, else ``lockfile``)."""
    from jupyter_portable.worker.envcache import build_env

    mode = state.environment.get("mode", "image")
    if mode not in ("image", "lockfile", "auto"):
        raise UsageError(f"unknown environment mode {mode!r} (auto, image or lockfile)")
    if mode == "image":
        state.env_build = {"mode": "image", "python": sys.executable}
        return
    store = state.store()
    manifest = store.read_manifest(state.workspace_id, state.version)
    lock_hash = (manifest.runtime or {}).get("lockfile")
    if mode == "auto":
        missing = missing_here(store.get_object(lock_hash, what="the lockfile")) if lock_hash else []
        if not missing:
            state.env_build = {"mode": "image", "chosen_by": "auto", "python": sys.executable}
            return
        state.progress.update(step="environment", message=f"this machine's Python lacks {len(missing)} recorded "
                                                          f"package(s) ({', '.join(missing[:3])}…): building the "
                                                          "lockfile's environment")
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
    state.env_build = {**built.to_json(), "mode": "lockfile", "chosen_by": mode, "skipped": skipped,
                       "seconds": round(time.monotonic() - started, 3)}
    state.timings["environment_s"] = round(time.monotonic() - started, 3)
