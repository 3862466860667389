"""The kernel on the worker: warmed up during the read-back, started with the notebook's
kernel id, stopped at the seal."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from typing import Any

from jupyter_portable.worker.state import AgentState

log = logging.getLogger("jupyter_portable.worker")


def prestart_kernel(state: AgentState) -> None:
    try:
        start_kernel(state, "prestarted")
        state.prestarted = True
    except Exception as exc:  # the kernel is then started on request, as usual
        log.warning("could not start a kernel ahead: %s", exc)


def start_watched_kernel(state: AgentState, kernel_id: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """``start_kernel`` for ``POST /kernel``: its connection once the activity watcher hears the
    kernel, so the idle clock sees the first cell the notebook sends. A kernel slower than
    ``timeout_s`` to come up is handed over all the same (its early cells may then go unseen)."""
    conn = start_kernel(state, kernel_id)
    k = state.kernel
    if state.activity.watcher_running and not state.activity.wait_watched(
            int(conn["iopub_port"]), lambda: k is not None and k.poll() is None, timeout_s):
        log.warning("kernel %s: handed over before the idle watcher heard it", kernel_id)
    return conn


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
    # a venv built from the lockfile finds this package through a .pth file, after its own
    # packages (envbuild.link_worker): never PYTHONPATH, which would shadow the recorded versions
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
