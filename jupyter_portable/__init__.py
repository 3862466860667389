"""jupyter-portable: a durable workspace for notebooks on rented GPUs.

In a notebook: ``%load_ext jupyter_portable`` adds ``%workspace``. In Python::

    import jupyter_portable as jp
    h = jp.checkpoint("ckpt.pt", step=2)  # write check and fsync; upload and read-back go on beside
    h.wait()                              # verified (or rejected, with the reason)
    jp.latest_checkpoint()                # the last verified one
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from jupyter_portable.core.errors import (
    ConflictError,
    FencedError,
    IntegrityError,
    ManifestError,
    PortableError,
    StoreError,
    UnsafePath,
    UsageError,
)
from jupyter_portable.core.records import CheckpointRecord

if _TYPE_CHECKING:
    from jupyter_portable.engine.workspace import Workspace


def __getattr__(name: str) -> _Any:
    # Workspace is imported on first use: a helper process the engine spawns imports this
    # package first, and needs none of it
    if name == "Workspace":
        from jupyter_portable.engine.workspace import Workspace

        return Workspace
    raise AttributeError(f"module 'jupyter_portable' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "Workspace"})

__version__ = "0.1.0"


def _here() -> Workspace:
    from jupyter_portable.engine.workspace import Workspace

    return Workspace.find(os.getcwd())


def checkpoint(path: str | os.PathLike[str], step: int | None = None, note: str | None = None, *,
               wait: bool = False, policy: str | None = None) -> _Any:
    """Register a checkpoint of the workspace around the current folder. Returns once it passed
    its write check and is fsynced, with a handle (``.wait()``, ``.state``, ``.describe()``);
    its upload and read-back run in a thread of this process. ``wait=True`` waits and returns
    the record, verified or rejected. ``policy``: the queue's (``checkpoint_queue``)."""
    ws = _here()
    if wait:
        return ws.checkpoint(path, step=step, note=note or "")
    return ws.checkpoint_async(path, step=step, note=note or "", policy=policy)


def checkpoint_queue(policy: str | None = None, budget: int | None = None) -> dict[str, _Any]:
    """Set what a new checkpoint does while older ones are in flight (``wait``, ``skip-older``,
    ``keep-both``) and the bytes in flight at most; returns the settings and what is in flight."""
    return _here().checkpoint_queue(policy=policy, budget=budget)


def latest_checkpoint() -> CheckpointRecord | None:
    """The last verified checkpoint of the workspace around the current folder."""
    return _here().latest_checkpoint()


def checkpoints() -> list[CheckpointRecord]:
    """Every registered checkpoint, oldest first."""
    return _here().checkpoints()


def panel() -> _Any:
    """The ipywidgets panel of the workspace around the current folder."""
    from jupyter_portable.interfaces.kernel.panel import panel as make_panel

    return make_panel(_here())


def load_ipython_extension(ipython: _Any) -> None:
    """``%load_ext jupyter_portable``: the magics, next-action recording, auto-snapshot."""
    from jupyter_portable.interfaces.kernel import autosnapshot
    from jupyter_portable.interfaces.kernel.cell_recorder import CellRecorder
    from jupyter_portable.interfaces.kernel.magics import WorkspaceMagics

    ipython.register_magics(WorkspaceMagics)
    CellRecorder.install(ipython)
    autosnapshot.start(ipython, autosnapshot.default_minutes())


def unload_ipython_extension(ipython: _Any) -> None:
    from jupyter_portable.interfaces.kernel import autosnapshot
    from jupyter_portable.interfaces.kernel.cell_recorder import CellRecorder

    CellRecorder.uninstall(ipython)
    autosnapshot.stop_now()


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_portable.interfaces.serverext"}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-portable"}]


__all__ = [
    "CheckpointRecord",
    "ConflictError",
    "FencedError",
    "IntegrityError",
    "ManifestError",
    "PortableError",
    "StoreError",
    "UnsafePath",
    "UsageError",
    "Workspace",
    "__version__",
    "checkpoint",
    "checkpoint_queue",
    "checkpoints",
    "latest_checkpoint",
    "load_ipython_extension",
    "panel",
    "unload_ipython_extension",
]
