"""Starting the worker agent on an allocation, and talking to it.

The agent listens on the machine's loopback only. On the local market it is reached
directly; on an SSH host through a port forward (``SshProvider.forward_port``), one per
process that needs it. What it takes to reach one agent (its allocation, port, PID and
token) is an :class:`AgentRecord`, kept in the copy's ``.portable/agents/`` with mode 0600:
the token never enters the store, an event or a log line.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from jupyter_portable.compute.base import Allocation, Provider, SshEndpoint
from jupyter_portable.core.envconfig import PortableRemote
from jupyter_portable.core.errors import (
    ConflictError,
    LaunchFailed,
    PortableError,
    ProviderUnavailable,
    UsageError,
)
from jupyter_portable.core.secretenv import passed_values, scrubbed
from jupyter_portable.store.credentials import SessionCredentials, store_env
from jupyter_portable.store.credentials import issue as issue_credentials
from jupyter_portable.workdir.workcopy import WorkspaceCopy
from jupyter_portable.worker.protocol import READY_PREFIX

REMOTE_PYTHON_ENV = "JUPYTER_PORTABLE_REMOTE_PYTHON"  # an image's Python that has this package: no bootstrap


def allocation_from_json(obj: dict[str, Any]) -> Allocation:
    ssh = obj.get("ssh")
    return Allocation(allocation_id=obj["allocation_id"], provider=obj["provider"], offer_id=obj["offer_id"],
                      ref=obj["ref"], started=obj["started"], ssh=SshEndpoint(**ssh) if ssh else None,
                      details=dict(obj.get("details") or {}))


@dataclass
class AgentRecord:
    allocation: Allocation
    port: int
    pid: int
    token: str
    workdir: str

    @property
    def allocation_id(self) -> str:
        return self.allocation.allocation_id

    def to_json(self) -> dict[str, Any]:
        return {"allocation": self.allocation.to_json(), "port": self.port, "pid": self.pid, "token": self.token,
                "workdir": self.workdir}

    @classmethod
    def from_json(cls, obj: Any) -> "AgentRecord":
        try:
            return cls(allocation_from_json(obj["allocation"]), int(obj["port"]), int(obj["pid"]),
                       str(obj["token"]), str(obj["workdir"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PortableError(f"a worker agent record is malformed ({exc})") from None


def save_record(copy: WorkspaceCopy, rec: AgentRecord) -> None:
    copy.write_agent(rec.allocation_id, json.dumps(rec.to_json()).encode())  # 0600: it holds the token


def load_record(copy: WorkspaceCopy, allocation_id: str) -> AgentRecord | None:
    data = copy.agent_bytes(allocation_id)
    if data is None:
        return None
    try:
        return AgentRecord.from_json(json.loads(data))
    except ValueError as exc:
        raise PortableError(f"the worker agent record of {allocation_id} is not JSON ({exc})") from None


def save_allocation(copy: WorkspaceCopy, allocation: Allocation) -> None:
    """The machine, recorded before its agent starts: a restart can start the agent itself."""
    copy.write_agent_allocation(allocation.allocation_id, json.dumps(allocation.to_json()).encode())


def load_allocation(copy: WorkspaceCopy, allocation_id: str) -> Allocation | None:
    data = copy.agent_allocation_bytes(allocation_id)
    if data is None:
        return None
    try:
        return allocation_from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise PortableError(f"the allocation record of {allocation_id} is malformed ({exc})") from None


def forget_record(copy: WorkspaceCopy, allocation_id: str) -> None:
    copy.forget_agent(allocation_id)


# -- starting the agent ------------------------------------------------------------------------

def start_agent(provider: Provider, allocation: Allocation, *, store: str, workspace_id: str, version: int,
                epoch: int, lazy_threshold: int | None = None, environment: dict[str, Any] | None = None,
                autosnapshot_minutes: float | None = None, timeout: float = 120,
                credentials: SessionCredentials | None = None,
                progress: Callable[[str], None] | None = None, pass_env: tuple[str, ...] = (),
                guardian: dict[str, Any] | None = None) -> AgentRecord:
    """Start the agent on ``allocation``'s machine and return how to reach it.

    ``environment``: ``{"mode": "image"}`` (the machine's Python runs the kernel) or
    ``{"mode": "lockfile", "find_links": [...], "index_url": ...}`` (a venv from the recorded
    lockfile, its wheels cached in the store). A cloud machine whose Python lacks this package gets
    it first (:mod:`.bootstrap`; ``JUPYTER_PORTABLE_REMOTE_PYTHON`` names an image's Python that has
    it instead), with ``progress`` lines on the way. An ``s3://`` store's worker gets ``credentials``
    (by default fresh STS session credentials scoped to the workspace), over stdin; no other
    store's worker gets any, and no worker gets the user's own keys or a provider's. ``pass_env``
    names variables passed on purpose (core.secretenv): the user's values go over stdin too.
    ``guardian``: the workspace's policy for a machine whose user side is away (core.guardian).
    On every path (the local market, an ssh host, an image's Python, a bootstrapped machine) an
    environment built from the lockfile is pinned here (:func:`_pin_environment`): the worker
    uses a wheel index from the store only when its digest is the one this side sends."""
    details = allocation.details
    if credentials is None:
        credentials = issue_credentials(store, workspace_id, session_name=allocation.allocation_id)
    config: dict[str, Any] = {"store": store, "workspace_id": workspace_id, "allocation_id": allocation.allocation_id,
                              "version": version, "epoch": epoch,
                              "env": {**store_env(store), **passed_values(os.environ, pass_env)},
                              "pass_env": list(pass_env), "environment": environment or {"mode": "image"}}
    if credentials is not None:
        config["credentials"] = credentials.to_json()
    if lazy_threshold is not None:
        config["lazy_threshold"] = lazy_threshold
    if autosnapshot_minutes is not None:
        config["autosnapshot_minutes"] = autosnapshot_minutes
    if guardian is not None:  # what the machine does while the user side is away (worker/guardian)
        config["guardian"] = guardian
    if details.get("local"):
        config.update(workdir=str(details["work"]), state_dir=str(Path(details["dir"]) / "agent"),
                      machine_pid=int(details["pid"]))
        # the local machine runs this Python (_start_local): its environment is pinned here like any other
        _pin_environment(config, _local_machine, store=store, workspace_id=workspace_id, version=version,
                         allocation=allocation, progress=progress)
        env = scrubbed(os.environ)  # the user's keys and the providers' stay on the user's side
        env["PATH"] = f"{details['bin']}{os.pathsep}{env.get('PATH', '')}"
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        env["JUPYTER_PORTABLE_ALLOCATION"] = allocation.allocation_id
        try:
            rc, out, err = _start_local(json.dumps(config), env=env, cwd=str(details["work"]), timeout=timeout,
                                        log=Path(config["state_dir"]) / "agent.log")
        except OSError as exc:
            raise LaunchFailed(f"cannot start the worker agent: {exc}", provider=allocation.provider) from exc
    elif allocation.ssh is not None:
        # an ssh host (the stub runs in remote_dir) or a cloud machine (the machine is the allocation)
        ssh, target = ssh_route(provider, allocation)
        host = ssh.host(target.offer_id)
        pinned = False
        if isinstance(details.get("remote_dir"), str):
            remote = details["remote_dir"]
            config.update(workdir=f"{remote}/work", state_dir=f"{remote}/agent", machine_pid=int(details["pid"]))
        else:
            remote = f"{host.workdir}/allocations/{allocation.allocation_id}"
            config.update(workdir=f"{remote}/work", state_dir=f"{remote}/agent")
            if not allocation.details.get("python") and not PortableRemote.current().python:
                host, machine = _bootstrap(ssh, target, host, allocation, store, progress)
                _pin_environment(config, lambda: machine, store=store, workspace_id=workspace_id, version=version,
                                 allocation=allocation, progress=progress, bootstrapped=True)
                pinned = True
        from jupyter_portable.compute.sshlink import remote_python

        if not pinned:
            # an ssh host's Python, or an image's (JUPYTER_PORTABLE_REMOTE_PYTHON): asked what it is, and
            # its environment pinned here as a bootstrapped machine's is
            _pin_environment(config, lambda: _ssh_machine(ssh, target, remote_python(host), timeout), store=store,
                             workspace_id=workspace_id, version=version, allocation=allocation, progress=progress)

        # remote_python quotes the interpreter and lets a leading ~/ be the remote home
        code, raw_out, raw_err = ssh.exec_bytes(target, f"{remote_python(host)} -m jupyter_portable.worker --detach",
                                                json.dumps(config).encode(), timeout)
        rc, out, err = code, raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
        if rc != 0 and "No module named" in err and "jupyter_portable" in err:
            raise LaunchFailed(f"{allocation.allocation_id}: jupyter-portable is not installed for `{host.python}` "
                               "on the machine", provider=allocation.provider, offer=allocation.offer_id,
                               hint="install it there (pip install jupyter-portable) or in the image; for an ssh host "
                                    "set `python` in hosts.toml, for a cloud machine JUPYTER_PORTABLE_REMOTE_PYTHON, "
                                    "to a Python that has it")
    else:
        raise LaunchFailed(f"{allocation.provider} gave no way to reach {allocation.allocation_id} (no SSH endpoint)",
                           provider=allocation.provider, offer=allocation.offer_id)
    ready = [line for line in out.splitlines() if line.startswith(READY_PREFIX)]
    if rc != 0 or not ready:
        raise LaunchFailed(f"{allocation.allocation_id}: the worker agent did not start: "
                           f"{(err.strip().splitlines() or ['no output'])[-1][:400]}",
                           provider=allocation.provider, offer=allocation.offer_id)
    info = json.loads(ready[-1][len(READY_PREFIX):])
    return AgentRecord(allocation, int(info["port"]), int(info["pid"]), str(info["token"]), str(config["workdir"]))


def _pin_environment(config: dict[str, Any], machine: Callable[[], Any], *, store: str, workspace_id: str,
                     version: int, allocation: Allocation, progress: Callable[[str], None] | None,
                     bootstrapped: bool = False) -> None:
    """The environment the worker gets, pinned from this side (invariant 9): where it builds a venv
    from the recorded lockfile, the wheel index is prepared (or checked and recorded) here for
    ``machine()`` (the machine's interpreter, asked only when needed) and its digest sent, so the
    worker uses no index from the store that this side did not record (``envprep``)."""
    if config["environment"].get("mode", "image") == "image":
        return
    from jupyter_portable.worker.envprep import prepare_environment

    config["environment"] = prepare_environment(config["environment"], machine(), store=store,
                                                workspace_id=workspace_id, version=version, allocation=allocation,
                                                progress=progress, pins_decide=not bootstrapped)


def _local_machine() -> Any:
    from jupyter_portable.worker.interpreter import local_target

    return local_target()


def _ssh_machine(ssh: Any, target: Allocation, python: str, timeout: float) -> Any:
    """The machine's interpreter ``python`` (shell words), as the bootstrap's probe describes it."""
    from jupyter_portable.worker.bootstrap import remote_command
    from jupyter_portable.worker.interpreter import probe_python

    def run_python(script: str) -> str:
        code, out, err = ssh.exec_bytes(target, remote_command(python, script, {}), None, timeout)
        if code != 0:
            raise LaunchFailed(f"{target.allocation_id}: the machine's Python did not describe itself: "
                               f"{(err.decode(errors='replace').strip().splitlines() or ['no output'])[-1][:300]}",
                               provider=target.provider, offer=target.offer_id)
        return out.decode(errors="replace")  # type: ignore[no-any-return]

    return probe_python(run_python)


def _bootstrap(ssh: Any, target: Allocation, host: Any, allocation: Allocation, store: str,
               progress: Callable[[str], None] | None) -> tuple[Any, Any]:
    """Install the worker on a bare cloud machine; the host as it is reached from now on, and the
    machine's interpreter as the bootstrap found it."""
    from dataclasses import replace

    from jupyter_portable.compute.sshlink import remote_python
    from jupyter_portable.store.repo import Store
    from jupyter_portable.worker.bootstrap import bootstrap

    def exec_remote(command: str, data: bytes | None, limit: float) -> tuple[int, bytes, bytes]:
        return ssh.exec_bytes(target, command, data, limit)  # type: ignore[no-any-return]

    result = bootstrap(exec_remote, Store.open(store), workdir=host.workdir, python=remote_python(host),
                       progress=progress)
    allocation.details["python"] = result.python  # every later command and the worker's record use it
    allocation.details["bootstrap"] = result.to_json()
    return replace(host, python=result.python), result.target


def ssh_route(provider: Provider | None, allocation: Allocation) -> tuple[Any, Allocation]:
    """The SSH link (:class:`~jupyter_portable.compute.sshlink.SshLink`) that reaches ``allocation``, and
    the allocation as it knows it: the ``ssh`` provider's own for its hosts, an endpoint-only one for a
    cloud machine."""
    link = getattr(provider, "link", None)
    if link is not None and callable(getattr(link, "forward_ports", None)) \
            and isinstance(allocation.details.get("remote_dir"), str):
        return link, allocation
    from jupyter_portable.compute.acquire import cloud_ssh

    return cloud_ssh(allocation)


_LOCAL_AGENTS: list[subprocess.Popen[bytes]] = []


def _start_local(config: str, *, env: dict[str, str], cwd: str, timeout: float, log: Path) -> tuple[int, str, str]:
    """Start a local agent in a session of its own and read its ready line: (0, line, "") or a failure."""
    _LOCAL_AGENTS[:] = [p for p in _LOCAL_AGENTS if p.poll() is None]  # reap the ones that ended
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True)
    _LOCAL_AGENTS.append(proc)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(config.encode())
    proc.stdin.close()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        buf = b""
        while READY_PREFIX.encode() not in buf or not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                proc.kill()
                return 124, "", f"the agent wrote no ready line within {timeout:g}s"
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buf += chunk
    proc.stdout.close()
    if READY_PREFIX.encode() not in buf:
        tail = ""
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").strip().splitlines()[-1]
        return 1, "", tail or f"the agent exited with status {proc.poll()}"
    return 0, buf.decode(errors="replace"), ""


# -- talking to it -----------------------------------------------------------------------------

KERNEL_PORTS = ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")


class AgentClient:
    """HTTP to one agent, through a port forward where the machine is remote."""

    def __init__(self, record: AgentRecord, provider: Provider | None = None, *, timeout: float = 30) -> None:
        self.record = record
        self.provider = provider
        self._closers: list[Callable[[], None]] = []
        self._ssh: tuple[Any, Allocation] | None = None
        # the forward of the kernel's ports (its closer) and the worker's API through it (forward_kernel)
        self._kernel_forward: tuple[Callable[[], None], str] | None = None
        port = record.port
        if record.allocation.ssh is not None:
            port = self.forward(record.port)
        self.base = f"http://127.0.0.1:{port}"
        self._http = httpx.Client(timeout=timeout, headers={"Authorization": f"token {record.token}"},
                                  trust_env=False)

    def forward(self, remote_port: int) -> int:
        """A local port that reaches ``remote_port`` on the machine's loopback."""
        return self.forward_many([remote_port])[0]

    def forward_kernel(self, info: dict[str, Any]) -> dict[str, int]:
        """The local ports of a kernel's connection ``info`` (:data:`KERNEL_PORTS`), all through one
        SSH connection where the machine is remote. That connection carries the worker's API too, for
        :meth:`iopub_after`: when the kernel's IOPub comes back after a partition, so does the way to
        ask what it published meanwhile (a forward of its own may come back seconds later, and the
        messages that came live meanwhile would go on before the missed ones: worker/catchup.py)."""
        remote = [int(info[p]) for p in KERNEL_PORTS]
        if self.record.allocation.ssh is None:
            return dict(zip(KERNEL_PORTS, remote, strict=True))
        *local, agent = self.forward_many([*remote, self.record.port])
        self._kernel_forward = (self._closers[-1], f"http://127.0.0.1:{agent}")
        return dict(zip(KERNEL_PORTS, local, strict=True))

    def forward_many(self, remote_ports: Sequence[int]) -> list[int]:
        """Local ports that reach ``remote_ports`` on the machine's loopback, in that order, through
        one SSH connection (a kernel's five ports: one handshake)."""
        if self.record.allocation.ssh is None:
            return list(remote_ports)
        if self._ssh is None:
            self._ssh = ssh_route(self.provider, self.record.allocation)
        ssh, target = self._ssh
        ports, close = ssh.forward_ports(target, list(remote_ports))
        self._closers.append(close)
        return [int(p) for p in ports]

    def forward_restarts(self) -> int:
        """How many times the SSH forward of the kernel's ports (:meth:`forward_kernel`; before one, every
        forward of this client) started again after it died (a partition; ``compute/sshlink.py``): what
        tells a kernel connection it may have missed output (worker/catchup.py)."""
        closers = [self._kernel_forward[0]] if self._kernel_forward is not None else self._closers
        return sum(int(getattr(getattr(close, "__self__", None), "restarts", 0)) for close in closers)

    def close(self) -> None:
        self._http.close()
        for close in self._closers:
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()
        self._kernel_forward = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                timeout: float | None = None, base: str | None = None) -> dict[str, Any]:
        try:
            resp = self._http.request(method, (base or self.base) + path, json=body,
                                      timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.HTTPError as exc:
            raise ProviderUnavailable(f"the worker agent of {self.record.allocation_id} does not answer "
                                      f"({type(exc).__name__})", provider=self.record.allocation.provider) from None
        try:
            obj = resp.json()
        except ValueError:
            obj = {"error": resp.text[:200]}
        # the worker answers an error as the server does (core.http_status): {"error", "hint"}
        hint = obj.get("hint") if isinstance(obj, dict) and isinstance(obj.get("hint"), str) else None
        if resp.status_code == 409:
            raise ConflictError(str(obj.get("error") or "conflict"), hint=hint)
        if resp.status_code == 400:
            raise UsageError(str(obj.get("error") or "bad request"), hint=hint)
        if resp.status_code >= 300:
            raise PortableError(f"the worker agent answered {resp.status_code}: {obj.get('error') or resp.text[:200]}")
        if not isinstance(obj, dict):
            raise PortableError("the worker agent's answer was not a JSON object")
        return obj

    def status(self, timeout: float | None = 5) -> dict[str, Any]:
        return self.request("GET", "/status", timeout=timeout)

    def wait(self, until: Callable[[dict[str, Any]], bool], *, timeout: float,
             on_status: Callable[[dict[str, Any]], None] | None = None, poll: float = 0.05) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if on_status is not None:
                on_status(st)
            if until(st):
                return st
            if time.monotonic() > deadline:
                raise PortableError(f"the worker agent of {self.record.allocation_id} is still {st['phase']} "
                                    f"after {timeout:g}s")
            time.sleep(poll)

    def start_kernel(self, kernel_id: str) -> dict[str, Any]:
        return self.request("POST", "/kernel", {"kernel_id": kernel_id}, timeout=60)

    def kernel(self) -> dict[str, Any]:
        return self.request("GET", "/kernel", timeout=5)

    def signal_kernel(self, signum: int, timeout: float = 5) -> dict[str, Any]:
        # short: an interrupt is answered at once, and a shutdown begins with one (a machine that went
        # away without its lifecycle saying so yet must not hold it for the client's 30 s)
        return self.request("POST", "/kernel/signal", {"signum": signum}, timeout=timeout)

    def iopub_after(self, msg_id: str, timeout: float = 5) -> dict[str, Any]:
        """What the kernel published after ``msg_id`` (``GET /kernel/iopub``; worker/iopub_log.py), asked
        through the kernel's own SSH forward where it has one (:meth:`forward_kernel`)."""
        return self.request("GET", "/kernel/iopub?" + urlencode({"after": msg_id}), timeout=timeout,
                            base=self._kernel_forward[1] if self._kernel_forward is not None else None)

    def stop_kernel(self) -> dict[str, Any]:
        return self.request("DELETE", "/kernel", timeout=30)

    def snapshot(self, message: str = "") -> dict[str, Any]:
        return self.request("POST", "/snapshot", {"message": message}, timeout=3600)

    def put_file(self, path: str, content: bytes, base: str | None) -> dict[str, Any]:
        import base64

        return self.request("PUT", "/files", {"path": path, "content": base64.b64encode(content).decode(),
                                              "base": base}, timeout=120)

    def files(self) -> dict[str, Any]:
        return self.request("GET", "/files")

    def tree(self) -> dict[str, Any]:
        """The worker copy's files with their hashes (``GET /tree``, worker/follow.py)."""
        return self.request("GET", "/tree", timeout=60)

    def read(self, path: str) -> tuple[bytes, str]:
        """One file's bytes and the hash the worker gave them (the caller checks it)."""
        import base64

        obj = self.request("POST", "/read", {"path": path}, timeout=120)
        try:
            return base64.b64decode(str(obj["content"]), validate=True), str(obj["hash"])
        except (KeyError, ValueError):
            raise PortableError(f"the worker agent's answer for {path} is malformed") from None

    def fetch(self, path: str) -> dict[str, Any]:
        return self.request("POST", "/fetch", {"path": path}, timeout=3600)

    def seal(self, message: str = "") -> dict[str, Any]:
        return self.request("POST", "/seal", {"message": message}, timeout=3600)

    def put_credentials(self, credentials: SessionCredentials) -> dict[str, Any]:
        """Hand the agent fresh store credentials; it (and its kernel) use them from the next request."""
        return self.request("PUT", "/credentials", credentials.to_json(), timeout=30)

    def keep_running(self) -> dict[str, Any]:
        """"Keep running": the worker's idle clock starts again now; ``{"kept_at"}`` on its clock."""
        return self.request("POST", "/activity", {}, timeout=10)

    def shutdown(self) -> None:
        with contextlib.suppress(PortableError):
            self.request("POST", "/shutdown", timeout=5)


__all__ = ["KERNEL_PORTS", "AgentClient", "AgentRecord", "allocation_from_json", "forget_record", "load_allocation",
           "load_record", "save_allocation", "save_record", "start_agent"]
