"""The SSH transport: commands and port forwards to a host, with the system's OpenSSH client.

Every remote machine is reached this way: the ``ssh`` provider's hosts (:mod:`.ssh`), a rented
cloud machine at the endpoint its provider gives (:func:`.acquire.cloud_ssh`), a Slurm login node.

Why the system ``ssh`` client and not a Python SSH library: it is what the user already
configured (``~/.ssh/config``, ProxyJump, ssh-agent, hardware keys all keep working), it
adds no dependency, it pins host keys itself (``StrictHostKeyChecking=accept-new``), and a
forwarded port is one child process whose lifetime is easy to reason about. Its failures
are read from its exit status (255) and its one-line diagnostics, which OpenSSH has kept
stable for decades; ``tests/test_provider_ssh.py`` checks each one against a real sshd.

Host keys (trust on first use): the first connection to a host records its key in
``<state dir>/known_hosts``; from then on a different key is refused (AuthError) until the
user removes that line. Keys already in ``/etc/ssh/ssh_known_hosts`` are honoured too. A link
made with ``known_hosts`` (a cloud allocation's pinned file, :mod:`.keys`) holds to it strictly.

Connection sharing: a link made with ``multiplex=True`` (a rented cloud machine's) runs its
commands through one shared SSH connection per machine (OpenSSH's ``ControlMaster``, kept
``MULTIPLEX_PERSIST_S`` seconds after the last command), so the probe, the bootstrap and the
worker's start pay for one handshake instead of one each. The socket is in a private per-user
folder, named by the machine's endpoint, user, key and pinned ``known_hosts`` file, so a new
machine on a reused IP:port never rides an old machine's connection. Port forwards keep their
own connection: a tunnel's life is its process's (one connection carries all of a kernel's
ports, :meth:`SshLink.forward_ports`).

Nothing secret is logged or put in argv: the key is only named to ``ssh -i``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Protocol

import psutil

from jupyter_portable.compute.admission import Runner
from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.hosts import Host
from jupyter_portable.core.errors import AuthError, ComputeError, ProviderUnavailable, UsageError
from jupyter_portable.core.offers import Offer

_SHELL_ONLY = frozenset(";&|`$<>()*?[]{}!\\\"'")

# ssh's own diagnostics (exit status 255), most specific first.
_HOST_KEY = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed",
             "host key for", "No ED25519 host key is known", "No RSA host key is known")
_AUTH = ("Permission denied", "Too many authentication failures", "Load key", "UNPROTECTED PRIVATE KEY",
         "no such identity", "invalid format")
_UNREACHABLE = ("Connection refused", "Connection timed out", "timed out", "No route to host",
                "Could not resolve hostname", "Network is unreachable", "Connection closed by",
                "Connection reset", "kex_exchange_identification", "ssh: connect to host",
                "Name or service not known", "Temporary failure in name resolution")



class SshLink:
    """Commands and tunnels to the hosts ``hosts()`` names, over OpenSSH. See the module docstring."""

    name = "ssh"  # the provider named in the errors it raises

    def __init__(self, hosts: Callable[[], list[Host]] | Sequence[Host], *, state_dir: Path, ssh: str = "ssh",
                 connect_timeout: float = 10.0, command_timeout: float = 60.0, known_hosts: Path | None = None,
                 multiplex: bool = False, keepalive: tuple[int, int] = (10, 3)) -> None:
        """``hosts``: the hosts, or a function that lists them (re-read on each call). ``state_dir``:
        where host keys are pinned on first use. ``known_hosts``: a file of pinned host keys to hold the
        hosts to strictly instead. ``multiplex``: share one connection between commands. ``keepalive``:
        (seconds between, count) of ssh's ServerAlive probes: a connection silent for their product ends,
        and a tunnel then starts again (see :meth:`forward_ports`)."""
        self._hosts = hosts if callable(hosts) else (lambda fixed=list(hosts): list(fixed))
        self.state_dir = state_dir
        self._ssh = ssh
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self._forwards: dict[str, list[Callable[[], None]]] = {}
        self._pinned = known_hosts
        self.multiplex = multiplex
        interval, count = keepalive
        if not (isinstance(interval, int) and isinstance(count, int) and interval >= 1 and count >= 1):
            raise UsageError(f"ssh keepalive {keepalive!r} is not (seconds >= 1, count >= 1)")
        self.keepalive = (interval, count)

    @property
    def known_hosts(self) -> Path:
        """Where host keys are pinned (on first use, unless a pinned file was given)."""
        return self._pinned if self._pinned is not None else self.state_dir / "known_hosts"

    def close_forwards(self, allocation_id: str) -> None:
        """Close every port forward this link opened to ``allocation_id``."""
        for close in self._forwards.pop(allocation_id, []):
            close()

    def run(self, target: Allocation | Offer | str, argv: Sequence[str], *, timeout: float | None = None,
            input: str | None = None) -> tuple[int, str, str]:
        """Run ``argv`` on the host of ``target`` (an allocation, an offer or a host name):
        ``(exit status, stdout, stderr)``. Raises AuthError/ProviderUnavailable when SSH itself fails;
        a command still running after ``timeout`` gives status 124, as timeout(1) does (without a terminal,
        the remote command itself may run on until it next writes)."""
        name = target.offer_id if isinstance(target, Allocation) else target.id if isinstance(target, Offer) \
            else target
        host = self.host(name)
        if not argv:
            raise UsageError("run needs a command")
        try:
            proc = self.shell(host, shlex.join(argv), input=input, timeout=timeout or self.command_timeout,
                              timeout_raises=False)
        except subprocess.TimeoutExpired as exc:
            return 124, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out after {exc.timeout:g}s"
        return proc.returncode, proc.stdout, proc.stderr

    def exec_bytes(self, target: Allocation, command: str, data: bytes | None, timeout: float
                   ) -> tuple[int, bytes, bytes]:
        """Run a shell command line on ``target``'s host with ``data`` on its stdin (bytes both ways).
        SSH's own failures raise as for :meth:`run`; a timeout answers 124."""
        host = self.host(target.offer_id)
        argv = self._argv(host, "-o", "ClearAllForwardings=yes", *self._shared(host), command=command)
        try:
            proc = subprocess.run(argv, input=data or b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return 124, exc.stdout or b"", (exc.stderr or b"") + f"\ntimed out after {timeout:g}s".encode()
        except OSError as exc:
            raise ProviderUnavailable(f"cannot run ssh: {exc.strerror or exc}", provider=self.name) from exc
        error = self.error(host, proc.returncode, proc.stderr.decode(errors="replace"))
        if error is not None:
            raise error
        return proc.returncode, proc.stdout, proc.stderr

    def forward_port(self, allocation: Allocation, remote_port: int, *, remote_host: str = "127.0.0.1",
                     timeout: float | None = None) -> tuple[int, Callable[[], None]]:
        """Forward a fresh port on local 127.0.0.1 to ``remote_host:remote_port`` as seen from the host:
        ``(local port, closer)``. The closer is idempotent; :meth:`close_forwards` also calls it."""
        ports, close = self.forward_ports(allocation, [remote_port], remote_host=remote_host, timeout=timeout)
        return ports[0], close

    def forward_ports(self, allocation: Allocation, remote_ports: Sequence[int], *, remote_host: str = "127.0.0.1",
                      timeout: float | None = None) -> tuple[list[int], Callable[[], None]]:
        """Forward a fresh local port to each of ``remote_ports`` through one SSH connection (a
        kernel's five ports pay for one handshake, not five): ``(local ports in that order, closer)``.

        The tunnel comes back by itself: when its connection ends without the closer being called (a
        partition outlived the keepalive, the laptop moved to another network, the machine's sshd
        restarted), ssh is started again with the same forwards on the same local ports, with a
        growing wait between tries, until it holds or the closer is called. A client of those ports
        (a kernel's ZeroMQ sockets, the worker's HTTP) reconnects to them and the session goes on;
        what the far end sent while no tunnel was up is that protocol's to resend."""
        host = self.host(allocation.offer_id)
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
                tunnel = _Tunnel(argv, proc, errors)
                self._forwards.setdefault(allocation.allocation_id, []).append(tunnel.close)
                return ports, tunnel.close
            if proc.poll() is None:
                close()
                raise ProviderUnavailable(f"ssh host {host.name}: the port forward did not come up in time",
                                          provider=self.name, offer=host.name)
            errors.seek(0)
            last = errors.read().decode(errors="replace")
            close()
            error = self.error(host, 255, last)
            if error is not None:
                raise error
        raise ProviderUnavailable(f"ssh host {host.name}: cannot forward a local port: {first_line(last)}",
                                  provider=self.name, offer=host.name)

    # -- plumbing ----------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        for host in self._hosts():
            if host.name == name:
                return host
        raise UsageError(f"no ssh host named {name!r} is configured",
                         hint="add it to hosts.toml (see jupyter_portable.compute.hosts)")

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
                "-o", f"ServerAliveInterval={self.keepalive[0]}", "-o", f"ServerAliveCountMax={self.keepalive[1]}",
                "-o", "LogLevel=ERROR",  # stderr then carries the remote command's output and ssh's errors only
                "-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "PermitLocalCommand=no",
                "-o", "RequestTTY=no"]
        if self._pinned is not None:
            argv += ["-o", "GlobalKnownHostsFile=/dev/null"]  # this allocation's pinned key and no other
        if host.key is not None:
            argv += ["-i", str(host.key), "-o", "IdentitiesOnly=yes"]
        if host.proxy:
            argv += ["-o", f"ProxyCommand={host.proxy}"]  # through another host (a Slurm login node)
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

    def shell(self, host: Host, command: str, *, input: str | None = None, timeout: float | None = None,
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
        error = self.error(host, proc.returncode, proc.stderr)
        if error is not None:
            raise error
        return proc

    def error(self, host: Host, code: int, stderr: str) -> ComputeError | None:
        """The error for one of ssh's own failures (status 255 and its diagnostic); None otherwise."""
        if code != 255:
            return None
        line = first_line(stderr)
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


def default_state_dir() -> Path:
    """``$JUPYTER_PORTABLE_SSH_STATE``, else ``<jupyter data dir>/portable/ssh`` (compute.config)."""
    from jupyter_portable.compute.config import PortableSsh

    return Path(PortableSsh().state_dir).expanduser()


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


class _Runs(Protocol):
    def run(self, target: Allocation, argv: Sequence[str]) -> tuple[int, str, str]: ...


def ssh_runner(provider: _Runs, allocation: Allocation) -> Runner:
    """A :data:`~.admission.Runner` for admission: runs argv on the allocation's host. As a Runner
    must, it never raises: when SSH itself fails it answers 255 (ssh's own status) and the reason."""

    def runner(argv: list[str]) -> tuple[int, str, str]:
        try:
            return provider.run(allocation, argv)
        except (ComputeError, UsageError) as exc:
            return 255, "", exc.one_line()

    return runner


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


class _Tunnel:
    """One ``ssh -N`` process carrying port forwards on fixed local ports, started again on the same
    ports whenever it exits by itself, until :meth:`close` (see :meth:`SshLink.forward_ports`)."""

    FIRST_WAIT_S = 0.5
    MAX_WAIT_S = 5.0

    def __init__(self, argv: list[str], proc: subprocess.Popen[bytes], errors: IO[bytes]) -> None:
        self._argv = argv
        self._proc = proc
        self._errors = errors
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.restarts = 0  # how many times ssh was started again
        threading.Thread(target=self._watch, name="ssh-tunnel", daemon=True).start()

    def _watch(self) -> None:
        wait = self.FIRST_WAIT_S
        while True:
            with self._lock:
                proc = self._proc
            began = time.monotonic()
            proc.wait()
            if time.monotonic() - began > 4 * self.MAX_WAIT_S:
                wait = self.FIRST_WAIT_S  # it held for a while: this is a new outage, not the same one
            if self._closed.wait(wait):
                return
            wait = min(wait * 2, self.MAX_WAIT_S)
            with self._lock:
                if self._closed.is_set():
                    return
                self._errors.close()
                self._errors = tempfile.TemporaryFile()  # a file, not a pipe: nobody reads it while it runs
                try:
                    self._proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                  stderr=self._errors)
                except OSError:
                    continue  # no ssh to run just now: try again after the next wait
                self.restarts += 1

    def close(self) -> None:
        """Stop the tunnel for good (idempotent)."""
        self._closed.set()
        with self._lock:
            _closer(self._proc, self._errors)()


def first_line(text: str) -> str:
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


def last_line(text: str) -> str:
    return first_line("\n".join(reversed(text.splitlines())))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")



__all__ = ["MULTIPLEX_PERSIST_S", "Runner", "SshLink", "control_dir", "default_state_dir", "first_line", "last_line",
           "remote_python", "ssh_runner"]
