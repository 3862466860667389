"""What the worker agent knows while it runs: its workspace copy, store, kernel, phase, timings and errors."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import PortableError
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.activity import Activity
from jupyter_portable.worker.iopub_log import IOPubLog


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
        self.activity = Activity()  # the kernel's cells and the GPUs' work, for idle autostop
        self.iopub_log = IOPubLog()  # what the kernel published, for a user side that was cut off
        self.guardian: Any = None  # worker.guardian.Guardian, when the user side sent a policy

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
        # the checkpoints the kernel here has on their way to verified, and how the last ones ended:
        # the user's side shows them in the sidebar (orchestration/state_view.checkpoints_in_flight_view)
        checkpoints: dict[str, Any] = {"in_flight": [], "ended": []}
        if self.phase not in ("starting", "materializing"):
            with contextlib.suppress(PortableError, OSError):
                from jupyter_portable.engine.checkpoint.background import ended, inflight

                copy = WorkspaceCopy(self.workdir)
                checkpoints = {"in_flight": inflight(copy), "ended": ended(copy)}
        return {"phase": self.phase, "allocation_id": self.allocation_id, "workspace_id": self.workspace_id,
                "version": version, "epoch": self.epoch, "workdir": str(self.workdir), "error": self.error,
                "verification": self.verification, "progress": dict(self.progress), "timings": dict(self.timings),
                "pending": pending, "accepting": self.accepting, "sealed": self.sealed, "heartbeat": time.time(),
                "pid": os.getpid(), "python": self.kernel_python, "environment": self.env_build,
                "kernel": self.kernel_status(), "credentials": {"expiration": self.credentials_expiration},
                "activity": self.activity.to_json(),
                "guardian": self.guardian.view() if self.guardian is not None else None,
                "checkpoints": checkpoints}

    def kernel_status(self) -> dict[str, Any]:
        k = self.kernel
        if k is None:
            return {"alive": False, "returncode": None, "started": False, "machine_gone": self.machine_gone}
        rc = k.poll()
        return {"alive": rc is None, "returncode": rc, "started": True, "machine_gone": self.machine_gone}


def progress_sink(state: AgentState, step: str) -> Any:
    from jupyter_portable.engine.progress import Progress

    def sink(line: str) -> None:
        state.progress = {"step": step, "message": line}

    return Progress(step, stream=None, sink=sink)
