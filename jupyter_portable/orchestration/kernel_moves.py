"""Moving the notebook's portable kernels with their workspace, the way a user's restart does.

A kernel restarted by jupyter_server's restarter reaches JupyterLab as an *automatic* restart,
which opens the modal "Kernel Restarting: the kernel appears to have died". A move is not a
death: each kernel is restarted with the kernel manager's plain restart (its provisioner starts
it on the workspace's current machine, or as a placeholder when there is none) and its open
websockets are closed; JupyterLab reconnects at once, to the new channels, with no dialog. A
kernel that really dies still goes through the restarter and gets JupyterLab's own dialog.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from jupyter_portable.core.errors import PortableError
from jupyter_portable.orchestration.hosting import ServerApp, ServerLoop

log = logging.getLogger("jupyter_portable.server")
STOPPED_LOOK_S = 0.5  # how often a wait for kernel restarts looks whether the server's loop still runs


def drop_websockets(serverapp: ServerApp, kernel_id: str) -> int:
    """Close the kernel's open websockets (JupyterLab reconnects, to the kernel's new ports); how many."""
    cls = getattr(serverapp, "kernel_websocket_connection_class", None)
    closed = 0
    for conn in list(getattr(cls, "_open_sockets", ()) or ()):
        if getattr(conn, "kernel_id", None) == kernel_id:
            handler = getattr(conn, "websocket_handler", None)
            if handler is not None:
                handler.close()
                closed += 1
    return closed


def settle_execution_state(km: Any, kernel_id: str) -> None:
    """A moved kernel is a new process that has not answered yet: "starting", as a new kernel is.

    jupyter_server (2.21) resets ``execution_state`` on the multi-kernel manager, not on the
    kernel, when a restart changes the ports, and not at all when it keeps them: a kernel busy at
    the move (a cell held by the placeholder, or running on the lost machine) stayed "busy", and
    that is what the reconnecting websocket tells JupyterLab (interfaces/serverext/kernel_socket.py).
    The server's activity watch turns it "idle" at the new process's first status."""
    kernel = km.get_kernel(kernel_id)
    if getattr(kernel, "execution_state", None) not in (None, "dead"):
        kernel.execution_state = "starting"


def restart_kernels(serverapp: ServerApp, loop: ServerLoop, kernel_ids: Iterable[str],
                    timeout_s: float = 120.0) -> None:
    """Restart each kernel plainly (not as an auto-restart), on ``loop``, then drop its websockets;
    call from a thread, never from the loop itself. PortableError naming the kernels that failed.

    Nothing is waited for once ``loop`` has stopped (the server stops it after shutting its kernels
    down): a restart still under way then never finishes, and a thread waiting for it kept the server
    from exiting (Python waits for its pool's threads) for ``timeout_s``."""
    km = serverapp.kernel_manager

    async def one(kid: str) -> None:
        await km.restart_kernel(kid, now=True)
        settle_execution_state(km, kid)
        drop_websockets(serverapp, kid)

    futures = {kid: asyncio.run_coroutine_threadsafe(one(kid), loop.asyncio_loop) for kid in kernel_ids}
    waiting: set[Future[Any]] = set(futures.values())
    end = time.monotonic() + timeout_s
    while waiting and loop.asyncio_loop.is_running() and (left := end - time.monotonic()) > 0:
        _, waiting = wait(waiting, min(left, STOPPED_LOOK_S), FIRST_COMPLETED)
    failed = []
    for kid, fut in futures.items():
        if not fut.done():
            why = "the server stopped" if not loop.asyncio_loop.is_running() else f"not within {timeout_s:g}s"
            failed.append(f"{kid} ({why})")
            continue
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - every failure is named in the error below
            log.warning("jupyter-portable: kernel %s did not restart: %s", kid, exc)
            failed.append(f"{kid} ({type(exc).__name__}: {exc})")
    if failed:
        raise PortableError(f"kernel(s) did not restart: {', '.join(failed)}")


def machine_words(allocation: dict[str, Any] | None, fallback: str = "the new machine") -> str:
    """A machine as a researcher names it: "NVIDIA A100 80GB (runpod, eu-ro-1)", never its allocation id."""
    a = allocation or {}
    gpu = a.get("gpu") or a.get("offer") or fallback
    where = ", ".join(str(x) for x in (a.get("provider"), a.get("region")) if x)
    return f"{gpu}" + (f" ({where})" if where else "")


def moved_message(allocation: dict[str, Any] | None, version: int | None,
                  environment: dict[str, Any] | None = None, fell_back: list[dict[str, Any]] | None = None) -> str:
    """The notebook's notice after a move: "Now on NVIDIA A100 80GB (runpod, eu-ro-1). Workspace
    version 12 verified.", the routes tried before it that failed (``fell_back``: their allocation
    records, in the order tried), and the environment's differences when it is not the recorded one."""
    text = f"Now on {machine_words(allocation)}"
    if fell_back:
        first = fell_back[0]
        why = str(first.get("stop_reason") or "").strip()
        text += (f", not on {machine_words(first)} as chosen: it failed to "
                 f"{'start' if first.get('state') == 'refused' else 'launch'}" + (f" ({why})" if why else ""))
        if len(fell_back) > 1:
            others = ", ".join(machine_words(a) for a in fell_back[1:])
            text += f"; then {others} failed too"
    text += "."
    if version:
        text += f" Workspace version {version} verified."
    if isinstance(environment, dict) and environment.get("exact") is False and environment.get("summary"):
        text += f" Environment: {environment['summary']}."
    return text


def fell_back_records(records: list[dict[str, Any]], allocation_id: str) -> list[dict[str, Any]]:
    """The routes given up by the Continue that launched ``allocation_id``, in the order tried: the
    failed or refused records just before its own, as many as its record's ``failures``."""
    latest: dict[Any, dict[str, Any]] = {}
    for a in records:  # each allocation's newest record, where it was first recorded
        latest[a.get("allocation_id")] = a
    records = list(latest.values())
    ids = [a.get("allocation_id") for a in records]
    if allocation_id not in ids:
        return []
    at = ids.index(allocation_id)
    count = len(records[at].get("failures") or [])
    before = records[max(0, at - count):at] if count else []
    return [a for a in before if a.get("state") in ("failed", "refused")]


__all__ = ["drop_websockets", "fell_back_records", "machine_words", "moved_message", "restart_kernels",
           "settle_execution_state"]
