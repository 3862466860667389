"""The kernel provisioner behind the "Python (portable)" kernelspec.

Starting a kernel asks the workspace (the copy holding the notebook's folder) for its
current allocation and has that machine's worker agent start the ipykernel there, in
the workspace's copy, with ``%workspace`` loaded. The kernel's ports are on the worker's
loopback; for a remote machine each is forwarded over SSH to a fresh local port.

A restart calls ``pre_launch``/``launch_kernel`` again on the same provisioner with the
same kernel id. After a Continue the allocation is a new one, so the kernel comes up on
the new worker, on new ports: jupyter_server rebuilds its channels when the ports change,
and the open notebook goes on without being reopened.

A workspace with no machine (LOST, RELEASED, FAILED) gets a *placeholder*: a small local
kernel (``interfaces/kernel/placeholder.py``) that answers every cell at once with "No GPU
machine: press Continue in the portable sidebar" and the route a Continue would take, and
holds the cells sent while a Continue is under way until the kernel moves. Where to go
next stays the user's choice (the sidebar's routes, or ``jupyter portable continue``).
A workspace that never had a machine (IDLE) gets a placeholder too: opening a notebook rents
nothing, and its first executed cell asks before renting (docs/continue-experience.md).
``JUPYTER_PORTABLE_FIRST_MACHINE=open`` makes opening rent the first machine at once, on the
best route, for scripts that speak the kernel protocol with no notebook to ask in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core import state_words
from jupyter_portable.core.envconfig import PortableRun
from jupyter_portable.core.envconfig import first_machine_mode as check_first_machine
from jupyter_portable.core.errors import ConflictError, PortableError, UsageError
from jupyter_portable.worker.client import KERNEL_PORTS, AgentClient, AgentRecord

WORKSPACE_ENV = "JUPYTER_PORTABLE_WORKSPACE"
NO_MACHINE_ENV = "JUPYTER_PORTABLE_NO_MACHINE"  # what the placeholder kernel tells each cell (JSON)
FIRST_MACHINE_ENV = "JUPYTER_PORTABLE_FIRST_MACHINE"  # "first-cell" (default) or "open"
SERVER_PID_ENV = "JUPYTER_PORTABLE_SERVER_PID"  # the placeholder kernel ends with this process
PLACEHOLDER_MODULE = "jupyter_portable.interfaces.kernel.placeholder"


def _workspace_for(cwd: str | None) -> Any:
    from jupyter_portable.engine.workspace import Workspace

    start = cwd or PortableRun.current().workspace or os.getcwd()  # c.Portable.workspace, or its variable
    return Workspace.find(start)


class PortableProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """Runs the kernel on the workspace's current worker."""

    _client: AgentClient | None = None
    _record: AgentRecord | None = None
    _workspace_root: str | None = None
    _alive: bool = False
    _last_ports: tuple[int, ...] = ()
    _no_machine: dict[str, Any] | None = None  # set: this kernel is a local placeholder
    _placeholder: subprocess.Popen[bytes] | None = None
    _placeholder_dir: str | None = None
    _launched: asyncio.Event | None = None  # set once the launch in progress (if any) is done
    _gone: str | None = None  # the machine's state once it no longer serves the workspace (said once)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # A placeholder is started in a thread; a shutdown that overlaps a restart (the server
        # stopping while a kernel moves) must not remove the folder of one being started.
        self._placeholder_lock = threading.Lock()

    @property
    def allocation_id(self) -> str | None:
        return self._record.allocation_id if self._record is not None else None

    @property
    def workspace_root(self) -> str | None:
        return self._workspace_root

    @property
    def is_placeholder(self) -> bool:
        return self._no_machine is not None

    @property
    def agent_client(self) -> AgentClient | None:
        """The worker's client of the kernel running now (its forwards, its IOPub record); None for a placeholder."""
        return self._client if self._no_machine is None and self._alive else None

    @property
    def has_process(self) -> bool:
        if self._placeholder is not None:
            return self._placeholder.poll() is None
        return self._alive

    # -- launch -------------------------------------------------------------------------------

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        cwd = kwargs.get("cwd")
        ws = await asyncio.to_thread(_workspace_for, str(cwd) if cwd else self._workspace_root)
        self._workspace_root = str(ws.root)
        record, no_machine = await asyncio.to_thread(self._target, ws)
        self._close()
        self._record, self._no_machine, self._gone = record, no_machine, None
        kwargs = await super().pre_launch(**kwargs)
        kwargs.setdefault("cmd", list(self.kernel_spec.argv))
        return kwargs

    def _target(self, ws: Any) -> tuple[AgentRecord | None, dict[str, Any] | None]:
        """The current machine's record, or (None, what the placeholder says) when there is none."""
        try:
            return self._current_record(ws), None
        except _NoMachine as exc:
            return None, {**exc.facts, "route": _best_route(ws)}

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
            # the server's setting (c.Portable.first_machine), else the environment's
            mode = service.first_machine if service is not None else first_machine_mode()
            if lc.state == L.IDLE and mode == "first-cell" and not (
                    service is not None and service.is_continuing()):
                raise _NoMachine({"state": L.IDLE, "reason": "no machine yet", "first": True, "ask": True})
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
                why = idle[0] if idle is not None else ""
                if not why and lc.events and lc.events[-1].reason:
                    why = str(lc.events[-1].reason)
                # released (an idle stop, a Stop): a cell asks again, as for the first machine
                asks = mode == "first-cell" and state_words.words(lc.state).ask
                raise _NoMachine({"state": lc.state, "reason": why, "first": asks, "ask": mode == "first-cell"})
            record = orch.record(lc.allocation_id)
            if record is None:
                raise _NoMachine({"state": lc.state, "first": False,
                                  "reason": f"no record of how to reach allocation {lc.allocation_id} here"})
            return record
        finally:
            if service is None:
                orch.close()

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        kernel_id = str(kwargs.get("kernel_id") or self.kernel_id)
        launched = self._launched = asyncio.Event()
        try:
            if self._no_machine is not None:
                return await asyncio.to_thread(self._launch_placeholder, kernel_id)
            assert self._record is not None
            return await asyncio.to_thread(self._launch, kernel_id)
        finally:
            launched.set()

    async def _after_launch(self) -> None:
        """A stop or cleanup that overlaps a launch (the server stopping while a kernel moves)
        waits until the launch is done and its caller has seen the kernel up, then stops it."""
        launched = self._launched
        if launched is not None and not launched.is_set():
            await launched.wait()
            await asyncio.sleep(0)  # the launch's caller resumes first

    def _launch_placeholder(self, kernel_id: str) -> KernelConnectionInfo:
        """A local kernel that answers at once while the workspace has no machine (fresh ports,
        so jupyter_server rebuilds its channels, as for a move)."""
        from jupyter_client.connect import write_connection_file

        assert self._workspace_root is not None
        env = {**os.environ, NO_MACHINE_ENV: json.dumps(self._no_machine), WORKSPACE_ENV: self._workspace_root,
               SERVER_PID_ENV: str(os.getpid())}
        with self._placeholder_lock:
            folder = tempfile.mkdtemp(prefix="portable-placeholder-")
            fname, cfg = write_connection_file(os.path.join(folder, f"kernel-{kernel_id}.json"),
                                               ip="127.0.0.1", key=uuid.uuid4().hex.encode(), kernel_name="portable")
            self._placeholder_dir = folder
            self._placeholder = subprocess.Popen([sys.executable, "-m", PLACEHOLDER_MODULE, "-f", fname],
                                                 cwd=self._workspace_root, env=env, start_new_session=True)
        conn: dict[str, Any] = dict(cfg)
        self._last_ports = tuple(int(conn[p]) for p in KERNEL_PORTS)
        conn["key"] = str(cfg["key"]).encode()
        return conn  # type: ignore[return-value]

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
            local = self._client.forward_kernel(info)
            ports = tuple(local[p] for p in KERNEL_PORTS)
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
        if self._placeholder is not None:
            return self._placeholder.poll()
        if not self._alive or self._client is None:
            return 0 if not self._alive else None
        if getattr(self.parent, "shutting_down", False) and await self._ended_with_machine():
            self._alive = False  # a shutdown has nothing to wait for: its kernel ended with the machine
            return 0
        try:
            k = await asyncio.to_thread(self._client.kernel)
        except PortableError:
            return None  # the machine does not answer: a loss is the workspace's news, not a kernel exit
        if k.get("alive") or k.get("machine_gone"):
            return None  # dying with its machine is a loss, for Continue to handle, not a restart here
        if await asyncio.to_thread(self._machine_leaving):
            # sealed and being released (Stop, idle, budget): the agent stops its kernel on the way out.
            # Not a death for the restarter (JupyterLab's "Kernel Restarting" dialog): the RELEASED
            # event restarts this kernel plainly, as a placeholder (monitor._park_kernels)
            return None
        self._alive = False
        rc = k.get("returncode")
        return int(rc) if isinstance(rc, int) else 1

    async def wait(self) -> int | None:
        if self._placeholder is not None:
            return await asyncio.to_thread(self._placeholder.wait)
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
        if self._placeholder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._placeholder.send_signal(signum)
            return
        if self._client is not None and not await self._ended_with_machine():
            try:
                await asyncio.to_thread(self._client.signal_kernel, int(signum))
            except PortableError as exc:
                self.log.warning("portable kernel: signal %s not delivered: %s", signum, exc)

    async def _ended_with_machine(self) -> bool:
        """Whether this kernel's machine was released or lost (or another one serves the workspace): its
        kernel ended with it, so there is nothing to signal, stop or wait for. Said in the log once;
        nothing is lost by it (a release seals the work first; after a loss the last version stands)."""
        if self._gone is None and self._record is not None and not await asyncio.to_thread(self._still_serving):
            self._gone = self._gone_state()
            self.log.info("portable kernel %s: allocation %s is %s: nothing to signal or stop there, the kernel "
                          "ended with its machine", self.kernel_id, self._record.allocation_id, self._gone)
        return self._gone is not None

    async def kill(self, restart: bool = False) -> None:
        await self._stop()

    async def terminate(self, restart: bool = False) -> None:
        await self._stop()

    async def _stop(self) -> None:
        await self._after_launch()
        if self._placeholder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._placeholder.kill()
            await asyncio.to_thread(self._placeholder.wait)
            return
        if self._client is not None and not await self._ended_with_machine():
            try:
                await asyncio.to_thread(self._client.stop_kernel)
            except PortableError as exc:
                self.log.info("portable kernel: the worker did not answer the stop (%s)", exc)
        self._alive = False

    async def cleanup(self, restart: bool = False) -> None:
        await self._after_launch()
        self._close()

    def _still_serving(self) -> bool:
        """Whether this kernel's machine still serves the workspace: a lost or released one is not
        asked to stop its kernel (it would only make a restart wait on a dead machine)."""
        from jupyter_portable.workdir import lifecycle_file

        if self._record is None or self._workspace_root is None:
            return False
        with contextlib.suppress(PortableError):
            ws = _workspace_for(self._workspace_root)
            lc = lifecycle_file.load(ws.copy)
            return lc.allocation_id == self._record.allocation_id and lc.state not in (L.LOST, L.RELEASED)
        return True

    def _gone_state(self) -> str:
        """The lifecycle's word for a machine that no longer serves: RELEASED, LOST, or who serves now."""
        from jupyter_portable.workdir import lifecycle_file

        assert self._record is not None and self._workspace_root is not None
        with contextlib.suppress(PortableError):
            lc = lifecycle_file.load(_workspace_for(self._workspace_root).copy)
            if lc.allocation_id == self._record.allocation_id:
                return str(lc.state)
            return f"no longer the workspace's machine ({lc.allocation_id or 'none'} is, {lc.state})"
        return "gone"

    def _machine_leaving(self) -> bool:
        """Whether this kernel's machine is being stopped or has stopped serving the workspace
        (DRAINING, SEALED, RELEASED, LOST, or another machine serves it now)."""
        from jupyter_portable.workdir import lifecycle_file

        if self._record is None or self._workspace_root is None:
            return False
        with contextlib.suppress(PortableError):
            lc = lifecycle_file.load(_workspace_for(self._workspace_root).copy)
            return lc.allocation_id != self._record.allocation_id or lc.state not in (L.ACTIVE, L.READY)
        return False

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        with self._placeholder_lock:
            if self._placeholder is not None:
                if self._placeholder.poll() is None:
                    self._placeholder.kill()
                    self._placeholder.wait()
                self._placeholder = None
            if self._placeholder_dir is not None:
                shutil.rmtree(self._placeholder_dir, ignore_errors=True)
                self._placeholder_dir = None

    # -- persistence across server restarts ----------------------------------------------------

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update(workspace=self._workspace_root,
                    allocation_id=self._record.allocation_id if self._record else None,
                    placeholder=self._no_machine is not None)
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        await super().load_provisioner_info(provisioner_info)
        root = provisioner_info.get("workspace")
        self._workspace_root = str(Path(root)) if isinstance(root, str) else None

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return max(recommended, 10.0)


class _NoMachine(Exception):
    """The workspace has no machine for the kernel now; ``facts`` say why (for the placeholder)."""

    def __init__(self, facts: dict[str, Any]) -> None:
        super().__init__(facts.get("reason") or facts.get("state"))
        self.facts = facts


def first_machine_mode(value: str | None = None, where: str = FIRST_MACHINE_ENV) -> str:
    """``first-cell`` (default): a notebook's first executed cell rents the first machine, after a
    confirmation in the notebook; ``open``: opening it does. ``value`` is the setting
    (``c.Portable.first_machine``; None: as this process's configuration, else
    ``$JUPYTER_PORTABLE_FIRST_MACHINE``, sets it: core.envconfig.PortableRun, which checks it).
    UsageError naming ``where`` otherwise."""
    if value is None:
        return str(PortableRun.current().first_machine)
    return check_first_machine(value, where)


def _best_route(ws: Any) -> dict[str, Any] | None:
    """The route a Continue would take now, as the placeholder names it (None: none is open)."""
    from jupyter_portable.orchestration.monitor import service_for
    from jupyter_portable.orchestration.routes import compute_routes

    service = service_for(ws.root)
    providers = service.orchestrator().providers if service is not None else None
    try:
        routes, _ = compute_routes(ws, providers=providers)
    except PortableError:
        return None
    open_routes = [r for r in routes if not r.blocked]
    # after a stop (idle, or the user's), the machine's own route first, while it is still open
    with contextlib.suppress(PortableError):
        from jupyter_portable.workdir import lifecycle_file

        last = lifecycle_file.load(ws.copy).route
        open_routes.sort(key=lambda r: r.id != last)
    route = open_routes[0] if open_routes else None
    if route is None:
        return None
    o = route.offer
    return {"id": route.id, "gpu": o.gpu, "gpu_count": o.gpu_count, "provider": o.provider, "offer": o.id,
            "region": o.region, "price_per_hour": o.price_per_hour}


__all__ = ["FIRST_MACHINE_ENV", "NO_MACHINE_ENV", "PortableProvisioner", "WORKSPACE_ENV", "first_machine_mode"]
