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
