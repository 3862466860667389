"""A researcher's environment on the user's side, as the tests need one: a real venv on the tests'
interpreter (pyenv's 3.11.7) holding the worker's packages at the versions installed here
(ipython 9, which needs Python >= 3.11, among them), installed offline from the wheelhouse, and
its lockfile made the way a snapshot records it. Published as a workspace version's runtime, it
is what a machine of another Python must rebuild."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any


def user_lockfile(root: Path, wheelhouse: Path) -> bytes:
    from jupyter_portable.engine.runtime.lockfile import lock_environment
    from jupyter_portable.worker.resolve import uv_bin
    from jupyter_portable.worker.wheelset import requirements

    venv = root / "user-venv"
    if not (venv / "bin" / "python").exists():
        env = {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "PATH": "/usr/bin:/bin",
               "UV_CACHE_DIR": str(root / "uv-cache")}
        subprocess.run([uv_bin(), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
        proc = subprocess.run([uv_bin(), "pip", "install", "--quiet", "--offline", "--no-index", "--find-links",
                               str(wheelhouse), "--python", str(venv / "bin" / "python"),
                               *[r for r in requirements("file://") if not r.startswith(("uv==", "pip=="))]],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return lock_environment(str(venv / "bin" / "python"))


def publish_lockfile(ws: Any, lock: bytes, message: str = "the researcher's environment") -> int:
    """Publish the head again with ``lock`` as its runtime's lockfile; the new version."""
    from jupyter_portable.core.manifest import ParentRef

    store = ws.store
    head, _ = store.read_head(ws.workspace_id)
    base = store.read_manifest(ws.workspace_id)
    store.publish(replace(base, version=base.version + 1, parent=ParentRef(base.version, head.manifest or ""),
                          runtime={**(base.runtime or {}), "lockfile": store.put_object(lock)}, message=message),
                  expected_version=base.version, epoch=head.epoch)
    ws.copy.advance(base.version + 1)
    return base.version + 1
