"""The machine's warning that it ends soon (a Slurm job's ``--signal=B:USR1@<lead>``, passed on to
the worker as SIGUSR1): the worker publishes a version at once and reads it back, so that what the
kernel wrote up to the warning outlives the machine, whether or not the user's side is there."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from jupyter_portable.core.errors import PortableError
from jupyter_portable.worker.agent import take_snapshot
from jupyter_portable.worker.state import AgentState

log = logging.getLogger("jupyter_portable.worker")

MESSAGE = "published at the machine's warning that it ends soon"


def publish_at_warning(state: AgentState) -> dict[str, Any]:
    """Publish a version and read it back: ``{"at", "version", "verified", "error"}``, also said in
    the worker's log. A worker that is sealing publishes nothing more."""
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.workdir.workcopy import WorkspaceCopy

    out: dict[str, Any] = {"at": time.time(), "version": None, "verified": False, "error": None}
    try:
        res = take_snapshot(state, MESSAGE)  # nothing changed: the version published last is the truth
        out["version"] = res["version"]
        check = Workspace(WorkspaceCopy(state.workdir)).verify(res["version"])
        bad = [m for m in check.mismatches if "not fetched yet" not in m["reason"]]
        out["verified"] = not bad
        if bad:
            out["error"] = "; ".join(f"{m['path']}: {m['reason']}" for m in bad[:3])
    except PortableError as exc:
        out["error"] = exc.one_line()
    if out["error"]:
        log.warning("the machine warned it ends soon; publishing failed: %s", out["error"])
    else:
        log.info("the machine warned it ends soon: version %s published and read back", out["version"])
    return out


def on_warning(state: AgentState) -> None:
    """SIGUSR1 publishes (in a thread of its own: a signal handler must not wait on the store)."""

    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=publish_at_warning, args=(state,), name="warning", daemon=True).start()

    signal.signal(signal.SIGUSR1, handler)


__all__ = ["MESSAGE", "on_warning", "publish_at_warning"]
