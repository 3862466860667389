"""What the orchestration needs from the Jupyter server that hosts it, as typing Protocols.

The service (``monitor``), the kernel moves (``kernel_moves``) and the file follower (``follow``)
run inside Jupyter Server but may not import it (the layers in pyproject.toml): they name here
the few parts of it they use, and jupyter_server's own objects (``ServerApp``, its kernel
manager, event logger and contents manager, tornado's IO loop) fit these shapes as they are.
A test can hand in anything of the same shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


class EventLogger(Protocol):
    """jupyter_events' ``EventLogger``: the sidebar's events go out through it."""

    def emit(self, *, schema_id: str, data: dict[str, Any]) -> Any: ...


class KernelManager(Protocol):
    """Jupyter Server's multi-kernel manager, as far as moving the notebook's kernels needs it."""

    def list_kernel_ids(self) -> list[str]: ...

    def get_kernel(self, kernel_id: str) -> Any:
        """The kernel's own manager (its ``provisioner`` says where it runs)."""
        ...

    def restart_kernel(self, kernel_id: str, now: bool = False) -> Awaitable[Any]: ...


class ServerApp(Protocol):
    """Jupyter Server's ``ServerApp``: its kernels and its event logger."""

    @property
    def kernel_manager(self) -> KernelManager: ...

    @property
    def event_logger(self) -> EventLogger: ...


class ServerLoop(Protocol):
    """The server's IO loop (tornado's ``AsyncIOLoop``): a callback from any thread runs on it,
    and coroutines are handed to its asyncio loop."""

    @property
    def asyncio_loop(self) -> asyncio.AbstractEventLoop: ...

    def add_callback(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> None: ...


class ContentsManager(Protocol):
    """Jupyter Server's contents manager: JupyterLab's saves go through its hooks."""

    def register_pre_save_hook(self, hook: Callable[..., Any]) -> None: ...

    def register_post_save_hook(self, hook: Callable[..., Any]) -> None: ...


class Timer(Protocol):
    """A periodic callback on the server's loop (tornado's ``PeriodicCallback``)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


__all__ = ["ContentsManager", "EventLogger", "KernelManager", "ServerApp", "ServerLoop", "Timer"]
