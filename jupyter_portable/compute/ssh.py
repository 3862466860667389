"""The ``ssh`` provider: the user's own machines (:mod:`.hosts`), reached with OpenSSH.

Each configured host is one offer with capacity 1, or 0 while one of our allocations runs
there. Launching starts the worker stub (:mod:`.agent_stub`) on the host in its own session,
under ``<workdir>/allocations/<allocation id>/``; status reads its heartbeat back over SSH.

Why the system ``ssh`` client and not a Python SSH library: it is what the user already
configured (``~/.ssh/config``, ProxyJump, ssh-agent, hardware keys all keep working), it
adds no dependency, it pins host keys itself (``StrictHostKeyChecking=accept-new``), and a
forwarded port is one child process whose lifetime is easy to reason about. Its failures
are read from its exit status (255) and its one-line diagnostics, which OpenSSH has kept
stable for decades; ``tests/test_provider_ssh.py`` checks each one against a real sshd.

Host keys (trust on first use): the first connection to a host records its key in
``<state dir>/known_hosts``; from then on a different key is refused (AuthError) until the
user removes that line. Keys already in ``/etc/ssh/ssh_known_hosts`` are honoured too.

Local state, in ``$JUPYTER_PORTABLE_SSH_STATE`` or ``<jupyter data dir>/portable/ssh``:
``known_hosts`` and ``allocations.json`` (which allocation holds which host). A host stays
in use until :meth:`SshProvider.terminate`, even when its worker looks lost: an unreachable
worker may still be running, and handing the host out twice is worse than waiting.

Connection sharing: a provider made with ``multiplex=True`` (a rented cloud machine's, see
:func:`.acquire.cloud_ssh`) runs its commands through one shared SSH connection per machine
(OpenSSH's ``ControlMaster``, kept ``MULTIPLEX_PERSIST_S`` seconds after the last command), so
the probe, the bootstrap and the worker's start pay for one handshake instead of one each. The
socket is in a private per-user folder, named by the machine's endpoint, user, key and pinned
``known_hosts`` file, so a new machine on a reused IP:port never rides an old machine's
connection. Port forwards keep their own connection: a tunnel's life is its process's (one
connection carries all of a kernel's ports, :meth:`SshProvider.forward_ports`).

Nothing secret is logged or put in argv: the key is only named to ``ssh -i``, and ``env``
for the worker travels inside the script on ssh's stdin.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from jupyter_portable.compute import agent_stub
from jupyter_portable.compute.admission import Runner
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider, SshEndpoint
from jupyter_portable.compute.hosts import Host, load_hosts
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    ProviderUnavailable,
    UsageError,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.secretenv import ALLOWED_NAMES, ALLOWED_PREFIXES, SECRET_NAMES, SECRET_SUFFIXES
from jupyter_portable.core.times import now_iso
from jupyter_portable.workdir.files import atomic_write, file_lock

ENV_STATE = "JUPYTER_PORTABLE_SSH_STATE"
_ALLOCATION_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
# Characters only a shell command line needs: an interpreter's path holding one is refused
# rather than quoted, since its author meant the shell to read it.
_SHELL_ONLY = frozenset(";&|`$<>()*?[]{}!\\\"'")
_IN_USE = ("launching", "running")
_KEEP_ENDED = 200  # ended allocations kept in allocations.json as history
_LAUNCH_CLAIM = 600.0  # seconds a launch in progress holds its host (launches time out well before)

# ssh's own diagnostics (exit status 255), most specific first.
_HOST_KEY = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed",
             "host key for", "No ED25519 host key is known", "No RSA host key is known")
_AUTH = ("Permission denied", "Too many authentication failures", "Load key", "UNPROTECTED PRIVATE KEY",
         "no such identity", "invalid format")
_UNREACHABLE = ("Connection refused", "Connection timed out", "timed out", "No route to host",
                "Could not resolve hostname", "Network is unreachable", "Connection closed by",
                "Connection reset", "kex_exchange_identification", "ssh: connect to host",
                "Name or service not known", "Temporary failure in name resolution")

# The remote half: compute/hostside.py, streamed to the host's ``python3 -`` with one call after it.

@functools.cache
def _hostside_source() -> str:
    """The source of :mod:`.hostside`, as the host's Python runs it."""
    from jupyter_portable.compute import hostside

    return Path(hostside.__file__).read_text(encoding="utf-8")


def default_state_dir() -> Path:
    """``$JUPYTER_PORTABLE_SSH_STATE``, else ``<jupyter data dir>/portable/ssh`` (compute.settings)."""
    from jupyter_portable.compute.settings import PortableSsh

    return Path(PortableSsh().state_dir).expanduser()


def _holder(table: dict[str, dict[str, Any]], host: str) -> str | None:
    """The allocation holding ``host``: a running one, or a launch still within its time."""
    for aid, rec in table.items():
        if rec.get("host") != host:
            continue
        if rec.get("state") == "running":
            return aid
        # A launch whose process died before recording its outcome must not hold the host forever.
        if rec.get("state") == "launching" and time.time() - float(rec.get("claimed") or 0) < _LAUNCH_CLAIM:
            return aid
    return None


class _State:
    """``allocations.json``: which of our allocations holds which host. Read-modify-write under a lock."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.file = directory / "allocations.json"

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The allocations table, locked; written back atomically when the block ends without error."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with file_lock(self.dir / "allocations.lock"):
            table = self._read()
            before = json.dumps(table, sort_keys=True)
            yield table
            if json.dumps(table, sort_keys=True) != before:
                self._write(table)

    def holder(self, host: str) -> str | None:
        """The allocation of ours that holds ``host``, if any."""
        with self.edit() as table:
            return _holder(table, host)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise UsageError(f"ssh provider state {self.file} cannot be read: {exc}",
                             hint="move the file away; hosts it marked as in use become free") from exc
        table = data.get("allocations") if isinstance(data, dict) and data.get("version") == 1 else None
        if not isinstance(table, dict) or not all(isinstance(rec, dict) for rec in table.values()):
            raise UsageError(f"ssh provider state {self.file} is not version 1 of its format",
                             hint="move the file away; hosts it marked as in use become free")
        return table

    def _write(self, table: dict[str, dict[str, Any]]) -> None:
        ended = sorted((rec.get("ended") or "", aid) for aid, rec in table.items() if rec.get("state") not in _IN_USE)
        for _, aid in ended[:-_KEEP_ENDED] if len(ended) > _KEEP_ENDED else []:
            del table[aid]
        atomic_write(self.file, json.dumps({"version": 1, "allocations": table}, indent=1, sort_keys=True).encode())


class SshProvider(Provider):
    """Machines the user already has, reached over SSH. See the module docstring for the rules."""

    name = "ssh"

    def __init__(self, hosts: Sequence[Host] | None = None, *, hosts_file: Path | str | None = None,
                 state_dir: Path | str | None = None, ssh: str = "ssh", connect_timeout: float = 10.0,
                 command_timeout: float = 60.0, stale_after: float = 10.0, launch_wait: float = 20.0,
                 known_hosts: Path | None = None, multiplex: bool = False) -> None:
        """``hosts`` fixes the host list; otherwise ``hosts_file`` (or the default) is re-read on each call,
        so edits apply without a restart. ``stale_after``: seconds without a heartbeat before a worker is lost.
        ``known_hosts``: a file of pinned host keys to hold the hosts to strictly (a cloud allocation's own,
        see :mod:`.keys`); without it, keys are trusted on first use into the state dir's. ``multiplex``:
        share one connection between commands (see the module docstring)."""
        self._fixed = list(hosts) if hosts is not None else None
        self._hosts_file = hosts_file
        self.state_dir = Path(state_dir).expanduser() if state_dir is not None else default_state_dir()
        self._state = _State(self.state_dir)
        self._ssh = ssh
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.stale_after = stale_after
        self.launch_wait = launch_wait
        self._forwards: dict[str, list[Callable[[], None]]] = {}
        self._pinned = known_hosts
        self.multiplex = multiplex

    @property
    def known_hosts(self) -> Path:
        """Where host keys are pinned (on first use, unless a pinned file was given)."""
        return self._pinned if self._pinned is not None else self.state_dir / "known_hosts"

    # -- the Provider contract ---------------------------------------------------------------

    def hosts(self) -> list[Host]:
        """The configured hosts."""
        return list(self._fixed) if self._fixed is not None else load_hosts(self._hosts_file)

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One offer a host; capacity 0 while an allocation of ours holds it. Reads no network."""
        hosts = self.hosts()
        with self._state.edit() as table:
            held = {h.name for h in hosts if _holder(table, h.name)}
        return [h.offer(0 if h.name in held else 1) for h in hosts]

    def check_permission(self, offer: Offer) -> None:
        """Log in and run ``true``: AuthError for a refused key or a changed host key,
        ProviderUnavailable when nothing answers."""
        host = self._host(offer.id)
        proc = self._exec(host, "true")
        if proc.returncode != 0:
            raise ProviderUnavailable(f"ssh host {host.name}: `true` failed there ({proc.returncode}): "
                                      f"{_first_line(proc.stderr)}", provider=self.name, offer=host.name)

    def check_capacity(self, offer: Offer) -> int | None:
        """1 when no allocation of ours holds the host; NoCapacity otherwise."""
        host = self._host(offer.id)
        holder = self._state.holder(host.name)
        if holder:
            raise NoCapacity(f"ssh host {host.name} is in use by allocation {holder}", provider=self.name,
                             offer=host.name, hint=f"terminate allocation {holder}, or pick another host")
        return 1

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Start the worker stub on the host, detached, and wait for its first heartbeat.

        ``ssh_public_key`` is not used: the host is reached with the configured key. ``env``
        is given to the worker's environment and never written to disk or argv."""
        host = self._host(offer.id)
        if image:
            raise NotSupported(f"ssh host {host.name} runs its own environment; images are not supported",
                               provider=self.name, offer=host.name, hint="drop the image requirement for ssh hosts")
        if not _ALLOCATION_ID.match(allocation_id):
            raise UsageError(f"allocation id {allocation_id!r} is not letters, digits, '.', '_' or '-'")
        remote_python(host)  # refused before the host is claimed
        env = dict(env or {})
        bad = [k for k, v in env.items() if not _ENV_NAME.match(k) or not isinstance(v, str)]
        if bad:
            raise UsageError(f"bad environment variable name(s) or value(s): {', '.join(sorted(bad))}")
        started = now_iso("seconds")
        with self._state.edit() as table:
            holder = _holder(table, host.name)
            if holder:
                raise NoCapacity(f"ssh host {host.name} is in use by allocation {holder}", provider=self.name,
                                 offer=host.name, hint=f"terminate allocation {holder}, or pick another host")
            # Claimed before connecting, so two launches cannot both take the host.
            table[allocation_id] = {"host": host.name, "state": "launching", "started": started,
                                    "claimed": time.time()}
        try:
            out = self._python(host, "launch", {"workdir": host.workdir, "allocation": allocation_id,
                                               "source": _agent_source(), "env": env, "wait": self.launch_wait,
                                               "allowed_names": sorted(ALLOWED_NAMES),
                                               "allowed_prefixes": list(ALLOWED_PREFIXES),
                                               "secret_names": sorted(SECRET_NAMES),
                                               "secret_suffixes": list(SECRET_SUFFIXES)},
                               timeout=self.launch_wait + self.connect_timeout + 10)
            if "error" in out:
                log = str(out.get("log") or "").strip()
                raise LaunchFailed(f"ssh host {host.name}: {out['error']}" + (f"; its log ends: {log[-500:]}"
                                                                            if log else ""),
                                   provider=self.name, offer=host.name,
                                   hint=f"check that `{host.python}` runs on {host.name}")
            pid = int(out["agent"]["pid"])
            remote_dir = str(out["remote_dir"])
        except Exception as exc:
            with self._state.edit() as table:
                table[allocation_id] = {"host": host.name, "state": "failed", "started": started,
                                        "ended": now_iso("seconds"),
                                        "reason": exc.one_line() if isinstance(exc, ComputeError) else repr(exc)}
            if isinstance(exc, LaunchFailed):
                raise
            if isinstance(exc, ComputeError):
                raise LaunchFailed(f"launch on ssh host {host.name} failed: {exc}", provider=self.name,
                                   offer=host.name, hint=exc.hint) from exc
            raise LaunchFailed(f"launch on ssh host {host.name} failed: the worker's answer was not understood "
                               f"({exc!r})", provider=self.name, offer=host.name) from exc
        with self._state.edit() as table:
            table[allocation_id].update(state="running", pid=pid, remote_dir=remote_dir)
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=host.name,
                          ref=f"{host.name}:{pid}", started=started,
                          ssh=SshEndpoint(host=host.host, port=host.port, user=host.user),
                          details={"remote_dir": remote_dir, "pid": pid})

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``reachable`` while the worker is alive and its heartbeat is under ``stale_after`` seconds
        old (by the host's clock); ``lost`` when the host answers that the worker is gone or writes no
        heartbeat; ``running`` when its process lives but its heartbeat is stale; ``unknown`` when the
        host does not answer (an SSH or transport error says nothing of the worker: issue 42)."""
        endpoint = allocation.ssh
        with self._state.edit() as table:
            rec = table.get(allocation.allocation_id, {})
        if rec.get("state") == "terminated":
            return AllocationStatus("terminated", ssh=endpoint)
        try:
            host = self._host(allocation.offer_id)
            out = self._python(host, "status", self._worker_args(allocation), timeout=self.connect_timeout + 10)
        except (ComputeError, UsageError) as exc:
            return AllocationStatus("unknown", ssh=endpoint, reason=f"ssh host does not answer: {exc.one_line()}")
        if not out.get("alive"):
            why = "the worker stopped" if out.get("stopped") else "the worker process is gone"
            return AllocationStatus("lost", ssh=endpoint, reason=f"{why} on ssh host {host.name}")
        if out.get("heartbeat") is None:
            return AllocationStatus("lost", ssh=endpoint, reason=f"the worker on {host.name} writes no heartbeat")
        age = float(out["now"]) - float(out["heartbeat"])
        if age > self.stale_after:
            # the process lives: the heartbeat decides (core.reachability), not this one look
            return AllocationStatus("running", ssh=endpoint,
                                    reason=f"the worker's last heartbeat on {host.name} is {age:.0f}s old")
        return AllocationStatus("reachable", ssh=endpoint)

    def terminate(self, allocation: Allocation, *, grace: float = 5.0) -> None:
        """Stop the worker (SIGTERM, SIGKILL after ``grace`` seconds), close our port forwards to it,
        and free the host. Already gone is fine; a host that does not answer raises ProviderUnavailable
        and the host stays in use, since the worker may still run."""
        for close in self._forwards.pop(allocation.allocation_id, []):
            close()
        with self._state.edit() as table:
            rec = table.get(allocation.allocation_id, {})
        if rec.get("state") == "terminated":
            return
        host = self._host(allocation.offer_id)
        if allocation.details.get("pid") is not None:
            out = self._python(host, "terminate", {**self._worker_args(allocation), "grace": grace},
                               timeout=grace + self.connect_timeout + 15)
            if not out.get("gone"):
                raise ProviderUnavailable(f"the worker of {allocation.allocation_id} on ssh host {host.name} "
                                          f"survived SIGKILL", provider=self.name, offer=host.name)
        with self._state.edit() as table:
            rec = table.setdefault(allocation.allocation_id, {"host": host.name, "started": allocation.started})
            rec.update(state="terminated", ended=now_iso("seconds"))

    # -- commands and tunnels -----------------------------------------------------------------

    def run(self, target: Allocation | Offer | str, argv: Sequence[str], *, timeout: float | None = None,
            input: str | None = None) -> tuple[int, str, str]:
        """Run ``argv`` on the host of ``target`` (an allocation, an offer or a host name):
        ``(exit status, stdout, stderr)``. Raises AuthError/ProviderUnavailable when SSH itself fails;
        a command still running after ``timeout`` gives status 124, as timeout(1) does (without a terminal,
        the remote command itself may run on until it next writes)."""
        name = target.offer_id if isinstance(target, Allocation) else target.id if isinstance(target, Offer) \
            else target
        host = self._host(name)
        if not argv:
            raise UsageError("run needs a command")
        try:
            proc = self._exec(host, shlex.join(argv), input=input, timeout=timeout or self.command_timeout,
                              timeout_raises=False)
        except subprocess.TimeoutExpired as exc:
            return 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {exc.timeout:g}s"
        return proc.returncode, proc.stdout, proc.stderr

    def exec_bytes(self, target: Allocation, command: str, data: bytes | None, timeout: float
                   ) -> tuple[int, bytes, bytes]:
        """Run a shell command line on ``target``'s host with ``data`` on its stdin (bytes both ways).
        SSH's own failures raise as for :meth:`run`; a timeout answers 124."""
        host = self._host(target.offer_id)
        argv = self._argv(host, "-o", "ClearAllForwardings=yes", *self._shared(host), command=command)
        try:
            proc = subprocess.run(argv, input=data or b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return 124, exc.stdout or b"", (exc.stderr or b"") + f"\ntimed out after {timeout:g}s".encode()
        except OSError as exc:
            raise ProviderUnavailable(f"cannot run ssh: {exc.strerror or exc}", provider=self.name) from exc
        error = self._error(host, proc.returncode, proc.stderr.decode(errors="replace"))
        if error is not None:
            raise error
        return proc.returncode, proc.stdout, proc.stderr

    def forward_port(self, allocation: Allocation, remote_port: int, *, remote_host: str = "127.0.0.1",
                     timeout: float | None = None) -> tuple[int, Callable[[], None]]:
        """Forward a fresh port on local 127.0.0.1 to ``remote_host:remote_port`` as seen from the host:
        ``(local port, closer)``. The closer is idempotent; :meth:`terminate` also calls it."""
        ports, close = self.forward_ports(allocation, [remote_port], remote_host=remote_host, timeout=timeout)
        return ports[0], close

    def forward_ports(self, allocation: Allocation, remote_ports: Sequence[int], *, remote_host: str = "127.0.0.1",
                      timeout: float | None = None) -> tuple[list[int], Callable[[], None]]:
        """Forward a fresh local port to each of ``remote_ports`` through one SSH connection (a
        kernel's five ports pay for one handshake, not five): ``(local ports in that order, closer)``."""
        host = self._host(allocation.offer_id)
        if not remote_ports:
            raise UsageError("no remote port to forward")
        for remote_port in remote_ports:
            if not 1 <= remote_port <= 65535:
                raise UsageError(f"remote port {remote_port} is not within 1..65535")
        target = f"[{remote_host}]" if ":" in remote_host else remote_host
        deadline = time.monotonic() + (timeout or self.connect_timeout + 5)
        last = ""
        for _attempt in range(3):  # another process may take a free port before ssh binds it
            ports: list[int] = []
            while len(ports) < len(remote_ports):
                if (port := _free_port()) not in ports:
                    ports.append(port)
            argv = self._argv(host, "-N", "-o", "ExitOnForwardFailure=yes",
                              *(arg for port, remote_port in zip(ports, remote_ports, strict=True)
                                for arg in ("-L", f"127.0.0.1:{port}:{target}:{remote_port}")))
            # A file, not a pipe: nobody reads a long-lived tunnel's complaints, and a full pipe would stall it.
            errors = tempfile.TemporaryFile()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
            close = _closer(proc, errors)
            while proc.poll() is None and time.monotonic() < deadline:
                if _forward_listening(proc.pid, ports):
                    break
                time.sleep(0.05)
            if proc.poll() is None and time.monotonic() < deadline:
                self._forwards.setdefault(allocation.allocation_id, []).append(close)
                return ports, close
            if proc.poll() is None:
                close()
                raise ProviderUnavailable(f"ssh host {host.name}: the port forward did not come up in time",
                                          provider=self.name, offer=host.name)
            errors.seek(0)
            last = errors.read().decode(errors="replace")
            close()
            error = self._error(host, 255, last)
            if error is not None:
                raise error
        raise ProviderUnavailable(f"ssh host {host.name}: cannot forward a local port: {_first_line(last)}",
                                  provider=self.name, offer=host.name)

    # -- plumbing ----------------------------------------------------------------------------

    def _host(self, name: str) -> Host:
        for host in self.hosts():
            if host.name == name:
                return host
        raise UsageError(f"no ssh host named {name!r} is configured",
                         hint="add it to hosts.toml (see jupyter_portable.compute.hosts)")

    def _worker_args(self, allocation: Allocation) -> dict[str, Any]:
        pid, remote_dir = allocation.details.get("pid"), allocation.details.get("remote_dir")
        if not isinstance(pid, int) or not isinstance(remote_dir, str):
            raise UsageError(f"allocation {allocation.allocation_id} has no worker pid and remote_dir")
        return {"pid": pid, "remote_dir": remote_dir, "allocation": allocation.allocation_id}

    def _argv(self, host: Host, *options: str, command: str | None = None) -> list[str]:
        exe = shutil.which(self._ssh)
        if exe is None:
            raise ProviderUnavailable(f"the ssh client {self._ssh!r} is not installed", provider=self.name,
                                      hint="install OpenSSH's client (Debian: apt-get install openssh-client)")
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        argv = [exe, "-p", str(host.port), "-l", host.user,
                "-o", "BatchMode=yes",  # never prompt: a passphrase comes from ssh-agent or not at all
                "-o", f"StrictHostKeyChecking={'yes' if self._pinned is not None else 'accept-new'}",
                "-o", f'UserKnownHostsFile="{self.known_hosts}"',
                "-o", "UpdateHostKeys=no",
                "-o", "HashKnownHosts=no",  # readable, so the user can find and remove a host's line
                "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
                "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR",  # stderr then carries the remote command's output and ssh's errors only
                "-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "PermitLocalCommand=no",
                "-o", "RequestTTY=no"]
        if self._pinned is not None:
            argv += ["-o", "GlobalKnownHostsFile=/dev/null"]  # this allocation's pinned key and no other
        if host.key is not None:
            argv += ["-i", str(host.key), "-o", "IdentitiesOnly=yes"]
        return [*argv, *options, "--", host.host, *([command] if command is not None else [])]

    def _shared(self, host: Host) -> list[str]:
        """ssh options that share one connection to ``host`` between commands; none when not
        multiplexing or when no private socket folder can be had."""
        if not self.multiplex:
            return []
        folder = control_dir()
        if folder is None:
            return []
        ident = f"{host.user}@{host.host}:{host.port}|{host.key}|{self.known_hosts}"
        name = hashlib.blake2b(ident.encode(), digest_size=10).hexdigest()
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={folder / name}",
                "-o", f"ControlPersist={MULTIPLEX_PERSIST_S}"]

    def _exec(self, host: Host, command: str, *, input: str | None = None, timeout: float | None = None,
              timeout_raises: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a shell command line on the host; SSH's own failures become our errors."""
        # ClearAllForwardings: forwards from the user's ssh config must not start with a plain command.
        argv = self._argv(host, "-o", "ClearAllForwardings=yes", *self._shared(host), command=command)
        limit = timeout or self.command_timeout
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, text=True, errors="replace",
                                  timeout=limit, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            if not timeout_raises:
                raise
            raise ProviderUnavailable(f"ssh host {host.name} did not answer within {limit:g}s", provider=self.name,
                                      offer=host.name) from exc
        except OSError as exc:
            raise ProviderUnavailable(f"cannot run ssh: {exc.strerror or exc}", provider=self.name) from exc
        error = self._error(host, proc.returncode, proc.stderr)
        if error is not None:
            raise error
        return proc

    def _python(self, host: Host, function: str, payload: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Run one function of :mod:`.hostside` on the host's Python; its last stdout line is its answer."""
        source = (_hostside_source() +
                  f"\nprint(json.dumps({function}(json.loads({json.dumps(payload)!r}))))\n")
        proc = self._exec(host, f"{remote_python(host)} -", input=source, timeout=timeout)
        lines = proc.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ProviderUnavailable(f"ssh host {host.name}: `{host.python} -` failed ({proc.returncode}): "
                                      f"{_last_line(proc.stderr) or _last_line(proc.stdout)}",
                                      provider=self.name, offer=host.name,
                                      hint=f"set `python` for {host.name} in hosts.toml to a Python 3 there")
        return answer

    def _error(self, host: Host, code: int, stderr: str) -> ComputeError | None:
        """The error for one of ssh's own failures (status 255 and its diagnostic); None otherwise."""
        if code != 255:
            return None
        line = _first_line(stderr)
        where = f"ssh host {host.name} ({host.user}@{host.host}:{host.port})"
        if any(s in stderr for s in _HOST_KEY):
            return AuthError(f"{where}: its host key is not the one recorded on first connection",
                             provider=self.name, offer=host.name,
                             hint=f"if the host was reinstalled, remove its line from {self.known_hosts}; "
                                  "otherwise do not connect: someone may be in the middle")
        if any(s in stderr for s in _AUTH):
            return AuthError(f"{where} refused the login: {line}", provider=self.name, offer=host.name,
                             hint=f"check `key` and `user` for {host.name} in hosts.toml, and that the key's public "
                                  "half is in that user's ~/.ssh/authorized_keys; a passphrase-protected key must "
                                  "be loaded into ssh-agent")
        if any(s in stderr for s in _UNREACHABLE):
            return ProviderUnavailable(f"{where} cannot be reached: {line}", provider=self.name, offer=host.name,
                                       hint="check that the host is up and sshd listens on that port")
        return None


MULTIPLEX_PERSIST_S = 30  # a shared connection outlives its last command by this long


def control_dir() -> Path | None:
    """The private folder for shared-connection sockets (``<tmp>/jp-ssh-<uid>``, mode 0700, ours):
    short, as a socket's path must be; None when it cannot be made private."""
    folder = Path(tempfile.gettempdir()) / f"jp-ssh-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # someone else's, or readable by others: do not put sockets there
    return folder


def ssh_runner(provider: SshProvider, allocation: Allocation) -> Runner:
    """A :data:`~.admission.Runner` for admission: runs argv on the allocation's host. As a Runner
    must, it never raises: when SSH itself fails it answers 255 (ssh's own status) and the reason."""

    def runner(argv: list[str]) -> tuple[int, str, str]:
        try:
            return provider.run(allocation, argv)
        except (ComputeError, UsageError) as exc:
            return 255, "", exc.one_line()

    return runner


def _agent_source() -> str:
    with open(agent_stub.__file__, encoding="utf-8") as fh:
        return fh.read()


def _forward_listening(pid: int, ports: Iterable[int]) -> bool:
    """Whether ssh (``pid``) itself listens on every local port of ``ports`` now. Another process
    may bind a free port first (a kernel started at the same moment picks ports the same way); a
    connection test alone then passes on that process's socket, and the tunnel's traffic would go
    to it. Where the system does not show another process's sockets, connections that open are
    taken as the forwards, as before."""
    wanted = set(ports)
    try:
        proc = psutil.Process(pid)
        conns = [c for p in (proc, *proc.children(recursive=True)) for c in p.net_connections(kind="tcp4")]
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        for port in wanted:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    pass
            except OSError:
                return False
        return True
    return wanted <= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _closer(proc: subprocess.Popen[bytes], errors: IO[bytes]) -> Callable[[], None]:
    def close() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        errors.close()

    return close


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def remote_python(host: Host) -> str:
    """The shell words that run ``host.python`` on the host, quoted: it names an interpreter,
    and nothing in it may become a second command. ``~/`` is the remote home."""
    python = host.python
    if not python or len(python) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in python) \
            or any(c in python for c in _SHELL_ONLY):
        raise UsageError(f"ssh host {host.name}: python = {python!r} is not the path or name of a Python "
                         "interpreter", hint=f"set `python` for {host.name} in hosts.toml to a path such as "
                                             "/usr/bin/python3 (no shell syntax)")
    if python.startswith("~/"):
        return '"$HOME"/' + shlex.quote(python[2:])
    return shlex.quote(python)


def _last_line(text: str) -> str:
    return _first_line("\n".join(reversed(text.splitlines())))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


__all__ = ["ENV_STATE", "Runner", "SshProvider", "default_state_dir", "ssh_runner"]
