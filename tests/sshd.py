"""A real OpenSSH server on 127.0.0.1 for tests: its own config, host key and authorized key.

No system service is involved: ``/usr/sbin/sshd -D -f CONFIG -E LOG`` runs as a child of the
test, listens on loopback only, and is stopped by its PID (:meth:`Sshd.stop`, or leaving
:func:`running_sshd`). sshd as a non-root user cannot log anyone in but itself and needs
setup this helper does not do, so :func:`unavailable` says why to skip there::

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with running_sshd(tmp_path, path_prefix=[bin_dir]) as sshd:
        subprocess.run(sshd.ssh_argv("true"), check=True)
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and insists on an absolute path
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"


def unavailable() -> str | None:
    """Why a real sshd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a loopback sshd needs root here (CI runs as root); run the tests as root to include it"
    missing = [p for p in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")) if not p or not os.path.exists(p)]
    if missing:
        return "OpenSSH is not installed (apt-get install -y openssh-server openssh-client)"
    return None


def keygen(path: Path) -> Path:
    """A fresh ed25519 key pair without passphrase at ``path`` and ``path.pub``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "jupyter-portable-test", "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL)
    return path


@dataclass
class Sshd:
    """A running sshd: where it listens, who may log in, and with which key."""

    dir: Path
    port: int
    client_key: Path
    host_key: Path
    log: Path
    proc: subprocess.Popen[bytes]
    host: str = "127.0.0.1"
    user: str = field(default_factory=getpass.getuser)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def host_key_line(self) -> str:
        """The public host key as a known_hosts line for this host and port."""
        kind, blob = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{self.host}]:{self.port} {kind} {blob}\n"

    def ssh_argv(self, command: str, known_hosts: Path | None = None) -> list[str]:
        """argv for the system ssh client to run ``command`` here with the client key."""
        return ["ssh", "-p", str(self.port), "-i", str(self.client_key), "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
                "-o", f"UserKnownHostsFile={known_hosts or self.dir / 'known_hosts'}", "-o", "LogLevel=ERROR",
                f"{self.user}@{self.host}", command]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """Stop the server by its PID; sessions already open end with their clients."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def sshd_processes(sshd: Sshd) -> list[int]:
    """The server's own processes: its listener and every sshd below it (one or two per connection,
    each holding that connection's forwards), never the commands its sessions run."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
            names[int(entry.name)] = name
    out, todo = [], [sshd.pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(c for c in children.get(pid, []) if names.get(c, "").startswith("sshd"))
    return out


@contextlib.contextmanager
def partitioned(sshd: Sshd) -> Iterator[list[int]]:
    """A network partition of this server, for real: its listener and every connection it holds are
    frozen (SIGSTOP), so a new connection hangs before the banner and an open one (a port forward)
    carries nothing, as when the packets are dropped; on the way out they go on (SIGCONT) and the
    connections that did not time out carry on where they were. What the sessions run is left alone."""
    pids = sshd_processes(sshd)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_sshd(directory: Path, *, path_prefix: Sequence[Path] = (), extra_config: Sequence[str] = (),
               env: dict[str, str] | None = None, timeout: float = 10.0, host: str = "127.0.0.1",
               port: int | None = None, host_key: tuple[str, str] | None = None, user: str | None = None) -> Sshd:
    """Start sshd on ``host`` (a loopback address), on ``port`` or a free one, with keys made in
    ``directory``; ``host_key`` (OpenSSH private text, public line) replaces the made host key.
    ``user`` is the only account that may log in (default: whoever runs the tests); sshd reads the
    authorized keys as that user, so ``directory`` and the folders above it must let it through.

    ``path_prefix`` goes in front of PATH in every session (sshd's ``SetEnv``), e.g. a bin dir
    with a fake ``nvidia-smi``; ``env`` adds variables to that ``SetEnv`` line (sshd takes only its
    first ``SetEnv``; values may not hold spaces). ``extra_config`` lines are appended to sshd_config.
    Raises OSError(EADDRINUSE) when a given ``port`` is taken, so a caller can pick another address.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if host_key is None:
        host_key_path = keygen(directory / "host_ed25519")
    else:
        host_key_path = directory / "host_ed25519"
        host_key_path.write_text(host_key[0].strip() + "\n")
        host_key_path.chmod(0o600)
        host_key_path.with_suffix(".pub").write_text(host_key[1].strip() + "\n")
    client_key = keygen(directory / "client_ed25519")
    authorized = directory / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o644)
    login = user or getpass.getuser()
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # the privilege-separation directory sshd insists on
    path = ":".join([*(str(p) for p in path_prefix), BASE_PATH])
    last = ""
    for _attempt in range(3 if port is None else 1):  # a free port may be taken between choosing and binding
        listen = port if port is not None else _free_port(host)
        config = directory / "sshd_config"
        config.write_text("\n".join([
            f"Port {listen}",
            f"ListenAddress {host}",
            f"HostKey {host_key_path}",
            f"PidFile {directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "PermitRootLogin prohibit-password" if login == "root" else "PermitRootLogin no",
            f"AllowUsers {login}",
            "StrictModes no",  # the temp dir's modes are the test runner's, not a user's home
            "AllowTcpForwarding yes",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in {"PATH": path, **(env or {})}.items()),
            *extra_config,
        ]) + "\n")
        log = directory / "sshd.log"
        log.write_text("")
        proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(log)], stdin=subprocess.DEVNULL)
        sshd = Sshd(dir=directory, port=listen, client_key=client_key, host_key=host_key_path, log=log, proc=proc,
                    host=host, user=login)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if "Server listening" in sshd.log_text():
                return sshd
            time.sleep(0.02)
        sshd.stop()
        last = sshd.log_text()
        if "Address already in use" not in last:
            break
    if port is not None and "Address already in use" in last:
        raise OSError(errno.EADDRINUSE, f"{host}:{port} is taken")
    raise RuntimeError(f"sshd did not start: {last.strip()[-1000:]}")


@contextlib.contextmanager
def running_sshd(directory: Path, **kwargs: object) -> Iterator[Sshd]:
    """:func:`start_sshd`, stopped on the way out whatever happened."""
    sshd = start_sshd(directory, **kwargs)  # type: ignore[arg-type]
    try:
        yield sshd
    finally:
        sshd.stop()
