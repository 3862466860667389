"""The kernel a notebook has while its workspace has no machine (LOST, RELEASED, FAILED, or no
machine yet).

The provisioner (``orchestration/provisioner.py``) starts it locally in place of the portable
kernel. It never runs code: every cell gets, at once, the error "No GPU machine: press Continue
in the portable sidebar" with the route a Continue would take. A cell sent while a Continue is
under way is held (the notebook shows it queued) until the kernel moves; the notebook then runs
it again on the new machine. ``JUPYTER_PORTABLE_NO_MACHINE`` (JSON: state, reason, route) says
what to tell.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from ipykernel.kernelbase import Kernel

NO_MACHINE_ENV = "JUPYTER_PORTABLE_NO_MACHINE"
WORKSPACE_ENV = "JUPYTER_PORTABLE_WORKSPACE"
ERROR_NAME = "NoGPUMachine"


def route_text(route: dict[str, Any] | None) -> str:
    """The route a Continue would take, in words ("1x NVIDIA L4 on local/l4 (local-a) at $0.40/h")."""
    if not route:
        return "no route is open now: see the portable sidebar's routes"
    return (f"{route.get('gpu_count', 1)}x {route.get('gpu')} on {route.get('provider')}/{route.get('offer')} "
            f"({route.get('region')}) at ${float(route.get('price_per_hour') or 0):.2f}/h")


def no_machine_message(facts: dict[str, Any]) -> tuple[str, str]:
    """(evalue, traceback text) of the error every cell gets."""
    state = str(facts.get("state") or "no machine")
    reason = str(facts.get("reason") or "")
    head = "No GPU machine: press Continue in the portable sidebar"
    if facts.get("first"):
        head = "No GPU machine yet: confirm the start in the notebook, or press Continue in the portable sidebar"
    lines = [head, f"The workspace is {state}" + (f": {reason}" if reason else "") + ".",
             f"Continue would take: {route_text(facts.get('route'))}"]
    return head, "\n".join(lines)


def _continuing() -> bool:
    """Whether a Continue of this workspace is under way now (its lifecycle file says so)."""
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.core.errors import PortableError
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.workdir import lifecycle_file

    try:
        ws = Workspace.find(os.environ.get(WORKSPACE_ENV) or os.getcwd())
        return lifecycle_file.load(ws.copy).state in L.CONTINUE_STATES
    except PortableError:
        return False


class PlaceholderKernel(Kernel):  # type: ignore[misc]
    """Answers every cell with the no-machine error; holds cells sent during a Continue."""

    implementation = "portable-placeholder"
    implementation_version = "1"
    banner = "jupyter-portable: this workspace has no GPU machine now"
    language_info = {"name": "python", "mimetype": "text/x-python", "file_extension": ".py",
                     "codemirror_mode": {"name": "ipython", "version": 3}, "pygments_lexer": "ipython3",
                     "nbconvert_exporter": "python"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            self.facts: dict[str, Any] = json.loads(os.environ.get(NO_MACHINE_ENV) or "{}")
        except ValueError:
            self.facts = {}

    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: dict[str, Any] | None = None, allow_stdin: bool = False,
                         **_: Any) -> dict[str, Any]:
        if not code.strip():
            return {"status": "ok", "execution_count": self.execution_count, "payload": [],
                    "user_expressions": {}}
        # held while a Continue runs: the kernel moves, and the notebook runs the cell there
        while await asyncio.to_thread(_continuing):
            await asyncio.sleep(0.25)
        evalue, text = no_machine_message(self.facts)
        traceback = [f"\x1b[0;31m{ERROR_NAME}\x1b[0m: {text}"]
        if not silent:
            self.send_response(self.iopub_socket, "error",
                               {"ename": ERROR_NAME, "evalue": evalue, "traceback": traceback})
        return {"status": "error", "execution_count": self.execution_count, "ename": ERROR_NAME,
                "evalue": evalue, "traceback": traceback}

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        return {"status": "ok", "matches": [], "cursor_start": cursor_pos, "cursor_end": cursor_pos, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        return {"status": "complete"}


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=PlaceholderKernel)


if __name__ == "__main__":
    main()
