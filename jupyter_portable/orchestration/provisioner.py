"""The kernel provisioner behind the "Python (portable)" kernelspec.

Starting a kernel asks the workspace (the copy holding the notebook's folder) for its
current allocation and has that machine's worker agent start the ipykernel there, in
the workspace's copy, with ``%workspace`` loaded. The kernel's ports are on the worker's
loopback; for a remote machine each is forwarded over SSH to a fresh local port.

A restart calls ``pre_launch``/``launch_kernel`` again on the same provisioner with the
same kernel id. After a Continue the allocation is a new one, so the kernel comes up on
the new worker, on new ports: jupyter_server rebuilds its channels when the ports change,
and the open notebook goes on without being reopened.

A workspace that never had a machine (IDLE) gets its first one here (a Continue on the
best route). One whose machine was lost refuses with the reason: where to go next is
the user's choice (the sidebar's routes, or ``jupyter portable continue``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import ConflictError, PortableError, UsageError
from jupyter_portable.worker.client import AgentClient, AgentRecord

WORKSPACE_ENV = "JUPYTER_PORTABLE_WORKSPACE"
_PORTS = ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")


def _workspace_for(cwd: str | None) -> Any:
    from jupyter_portable.engine.workspace import Workspace

    start = cwd or os.environ.get(WORKSPACE_ENV) or os.getcwd()
    return Workspace.find(start)


class PortableProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """Runs the kernel on the workspace's current worker."""

    _client: AgentClient | None = None
    _record: AgentRecord | None = None
    _workspace_root: str | None = None
    _alive: bool = False
    _moved: bool = False
    _last_ports: tuple[int, ...] = ()

    def move(self) -> None:
        """The workspace moved to another machine: report this kernel as gone, so that the
        server's restarter restarts it (there) and tells every open notebook, which then opens
        a new websocket to the new ports, as JupyterLab does after any automatic restart."""
        self._moved = True

    @property
    def allocation_id(self) -> str | None:
        return self._record.allocation_id if self._record is not None else None

    @property
    def workspace_root(self) -> str | None:
        return self._workspace_root

    @property
    def has_process(self) -> bool:
        # a moved kernel still counts as one: its restarter must restart it (on the new machine)
        return self._alive or self._moved

    # -- launch -------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        cwd = kwargs.get("cwd")
        ws = await asyncio.to_thread(_workspace_for, str(cwd) if cwd else self._workspace_root)
        self._workspace_root = str(ws.root)
        record = await asyncio.to_thread(self._current_record, ws)
        self._close()
        self._record = record
        self._moved = False
        kwargs = await super().pre_launch(**kwargs)
        kwargs.setdefault("cmd", list(self.kernel_spec.argv))
        return kwargs

    def _current_record(self, ws: Any, wait_s: float = 900.0) -> AgentRecord:
        from jupyter_portable.orchestration.orchestrator import Orchestrator

        service = None
        try:
            from jupyter_portable.orchestration.monitor import service_for

            service = service_for(ws.root)
        except ImportError:  # no Jupyter server here
            service = None
        # in a server, its orchestrator: the sidebar then hears of everything this start does
        orch = service.orchestrator() if service is not None else Orchestrator(ws)
        try:
            lc = orch.lifecycle()
            if lc.state == L.IDLE:
                if service is not None:  # the first machine, on the best route, as a Continue of the server's
                    with contextlib.suppress(ConflictError):
                        service.start_continue(None)
                else:
                    orch.continue_()
                lc = orch.lifecycle()
            deadline = time.monotonic() + wait_s

            def under_way(lc: L.Lifecycle) -> bool:
                # READY: the machine was verified, the kernel may start there (the Continue waits for it)
                if lc.state in L.CONTINUE_STATES and lc.state != L.READY:
                    return True
                return lc.state == L.IDLE and service is not None and service.is_continuing()

            while under_way(lc):
                if time.monotonic() > deadline:
                    raise UsageError(f"workspace {ws.workspace_id} is still {lc.state} after {wait_s:g}s")
                time.sleep(0.1)  # a Continue is under way: the kernel starts on its machine
                lc = orch.lifecycle()
            if lc.state not in (L.ACTIVE, L.READY):
                from jupyter_portable.orchestration.idle import no_machine_hint

                idle = no_machine_hint(lc)  # released as idle: Continue, on the same route
                if idle is not None:
                    raise UsageError(f"workspace {ws.workspace_id} has no machine: {idle[0]}", hint=idle[1])
                why = ""
                if lc.state in (L.LOST, L.FAILED) and lc.events and lc.events[-1].reason:
                    why = f" ({lc.events[-1].reason})"
                raise UsageError(f"workspace {ws.workspace_id} has no machine: it is {lc.state}{why}",
                                 hint="press Continue in the portable sidebar, or run `jupyter portable continue`")
            record = orch.record(lc.allocation_id)
            if record is None:
                raise UsageError(f"no record of how to reach allocation {lc.allocation_id} on this machine",
                                 hint="run `jupyter portable continue` to get a fresh machine")
            return record
        finally:
            if service is None:
                orch.close()

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        assert self._record is not None
        kernel_id = str(kwargs.get("kernel_id") or self.kernel_id)
        return await asyncio.to_thread(self._launch, kernel_id)

    def _launch(self, kernel_id: str) -> KernelConnectionInfo:
        from jupyter_portable.compute.registry import enabled_providers
        from jupyter_portable.orchestration.monitor import service_for

        assert self._record is not None
        service = service_for(self._workspace_root) if self._workspace_root else None
        # the server's configured providers (c.Portable), else the environment's
        providers = service.orchestrator().providers if service is not None else enabled_providers()
        provider = providers.get(self._record.allocation.provider)
        self._client = AgentClient(self._record, provider)
        for _attempt in range(3):
            info = self._client.start_kernel(kernel_id)
            local = {name: self._client.forward(int(info[name])) for name in _PORTS}
            ports = tuple(local[p] for p in _PORTS)
            # fresh ports on every relaunch: that is what makes jupyter_server rebuild its channels
            if not set(ports) & set(self._last_ports):
                break
        self._last_ports = ports
        self._alive = True
        conn: dict[str, Any] = {**info, **local, "ip": "127.0.0.1"}
        conn["key"] = str(info["key"]).encode()
        return conn  # type: ignore[return-value]

    # -- the running kernel -----------------------------------------------------------------

    async def poll(self) -> int | None:
        if self._moved:
            return 1
        if not self._alive or self._client is None:
            return 0 if not self._alive else None
        try:
            k = await asyncio.to_thread(self._client.kernel)
        except PortableError:
            return None  # the machine does not answer: a loss is the workspace's news, not a kernel exit
        if k.get("alive") or k.get("machine_gone"):
            return None  # dying with its machine is a loss, for Continue to handle, not a restart here
        self._alive = False
        rc = k.get("returncode")
        return int(rc) if isinstance(rc, int) else 1

    async def wait(self) -> int | None:
        while True:
            if self._client is None:
                return 0
            try:
                k = await asyncio.to_thread(self._client.kernel)
            except PortableError:
                self._alive = False
                return 0  # gone with its machine
            if not k.get("alive"):
                self._alive = False
                rc = k.get("returncode")
                return int(rc) if isinstance(rc, int) else 0
            await asyncio.sleep(0.1)

    async def send_signal(self, signum: int) -> None:
        if self._client is not None:
            try:
                await asyncio.to_thread(self._client.signal_kernel, int(signum))
            except PortableError as exc:
                self.log.warning("portable kernel: signal %s not delivered: %s", signum, exc)

    async def kill(self, restart: bool = False) -> None:
        await self._stop()

    async def terminate(self, restart: bool = False) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._client is not None:
            try:
                await asyncio.to_thread(self._client.stop_kernel)
            except PortableError as exc:
                self.log.info("portable kernel: the worker did not answer the stop (%s)", exc)
        self._alive = False

    async def cleanup(self, restart: bool = False) -> None:
        self._close()

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- persistence across server restarts ----------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update(workspace=self._workspace_root,
                    allocation_id=self._record.allocation_id if self._record else None)
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        root = provisioner_info.get("workspace")
        self._workspace_root = str(Path(root)) if isinstance(root, str) else None

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 10.0)


__all__ = ["PortableProvisioner", "WORKSPACE_ENV"]
