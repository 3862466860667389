"""SSH keys for rented machines: the user's key pair, and each allocation's pinned host key.

**The user's key.** One ed25519 pair per user, made on first use by ``ssh-keygen`` in
``<jupyter data dir>/portable/ssh/id_ed25519`` (or ``$JUPYTER_PORTABLE_SSH_STATE``), mode 0600
in a 0700 folder. Its public half goes to each machine at launch by the provider's own means;
the private half never leaves this folder: not the store, not an event, not a log.
``c.PortableRemote.ssh_key`` (``$JUPYTER_PORTABLE_SSH_KEY``) names another private key to use instead.

**Host keys, pinned per allocation.** Every cloud allocation has a ``known_hosts`` of its own,
``<ssh state>/allocations/<allocation id>/known_hosts``, and is reached with
``StrictHostKeyChecking=yes`` against it alone. So a second rental on a reused IP:port never
meets the first machine's key (no false alarm) and never trusts a key it did not pin. The
key pinned is either the one the launch generated and sent as user data (cloud-init, where
the provider takes it: AWS, GCP), or the first one the machine presents (trust on first use,
read with ``ssh-keyscan`` once sshd answers). Its ``SHA256:`` fingerprint is recorded in the
allocation's details, and shown by ``jupyter portable state``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jupyter_portable.core.errors import LaunchFailed, ProviderUnavailable, UsageError

KEY_ENV = "JUPYTER_PORTABLE_SSH_KEY"
_ALLOCATION_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_PUBLIC_LINE = re.compile(r"\A(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp256|ecdsa-sha2-nistp384|ecdsa-sha2-nistp521)"
                          r" ([A-Za-z0-9+/]+={0,2})(?: .*)?\Z")


def state_dir() -> Path:
    from jupyter_portable.compute.sshlink import default_state_dir

    return default_state_dir()


@dataclass(frozen=True)
class UserKey:
    """The key pair rented machines are reached with: ``private`` is a path, never read here."""

    private: Path
    public: str  # one OpenSSH public key line

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)


def _keygen(path: Path, comment: str) -> None:
    exe = shutil.which("ssh-keygen")
    if exe is None:
        raise ProviderUnavailable("ssh-keygen is not installed, so no SSH key can be made for rented machines",
                                  provider="ssh", hint="install OpenSSH's client (Debian: apt-get install "
                                                        "openssh-client)")
    proc = subprocess.run([exe, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ProviderUnavailable(f"ssh-keygen failed: {proc.stderr.strip()[:200]}", provider="ssh")


def user_key(directory: Path | None = None) -> UserKey:
    """The user's key pair for rented machines, made on first use (see the module docstring)."""
    from jupyter_portable.core.envconfig import PortableRemote

    section = PortableRemote.current()
    named = section.ssh_key
    if named:
        private = Path(named).expanduser()
        pub = private.with_name(private.name + ".pub")
        if not private.is_file() or not pub.is_file():
            where = section.where("ssh_key")
            raise UsageError(f"{where}={named} does not name a private key with its .pub beside it",
                             hint=f"unset {where} to use a key made for jupyter-portable, or point it at a key "
                                  "pair made by ssh-keygen")
        return UserKey(private, check_public_key(pub.read_text()))
    folder = directory or state_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    private = folder / "id_ed25519"
    if not private.exists():
        # made beside and renamed, so a crash never leaves half a key where the next run looks
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            fresh = Path(tmp) / "id_ed25519"
            _keygen(fresh, "jupyter-portable")
            os.chmod(fresh, 0o600)
            os.replace(fresh.with_name("id_ed25519.pub"), folder / "id_ed25519.pub")
            os.replace(fresh, private)
    os.chmod(private, 0o600)
    return UserKey(private, check_public_key((folder / "id_ed25519.pub").read_text()))


def check_public_key(text: str) -> str:
    """One OpenSSH public key line, stripped; UsageError for anything else (e.g. a private key)."""
    line = text.strip()
    if "\n" in line or not _PUBLIC_LINE.match(line):
        raise UsageError("not an OpenSSH public key line (expected e.g. 'ssh-ed25519 AAAA... comment')")
    return line


def fingerprint(public_line: str) -> str:
    """``SHA256:<base64, no padding>`` of a public key line, as ``ssh-keygen -l`` prints it."""
    blob = base64.b64decode(check_public_key(public_line).split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def host_key_pair() -> tuple[str, str]:
    """A fresh ed25519 host key for one machine: (private key text, public key line). The
    private half goes only into that machine's user data."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host"
        _keygen(path, "jupyter-portable-host")
        return path.read_text(), check_public_key(path.with_name("host.pub").read_text())


def known_hosts_path(allocation_id: str, directory: Path | None = None) -> Path:
    """The ``known_hosts`` that holds this allocation's host key, and nothing else."""
    if not _ALLOCATION_ID.match(allocation_id):
        raise UsageError(f"not an allocation id: {allocation_id!r}")
    return (directory or state_dir()) / "allocations" / allocation_id / "known_hosts"


def pin_host_key(allocation_id: str, host: str, port: int, public_line: str, directory: Path | None = None) -> str:
    """Write ``public_line`` as the only key of ``host:port`` for this allocation; its fingerprint."""
    path = known_hosts_path(allocation_id, directory)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    kind, blob = check_public_key(public_line).split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    from jupyter_portable.workdir.files import atomic_write

    atomic_write(path, f"{name} {kind} {blob}\n".encode())
    return fingerprint(public_line)


def scan_host_key(host: str, port: int, *, timeout_s: float = 5.0, proxy: str | None = None) -> str | None:
    """The ed25519 host key sshd at ``host:port`` presents, as a public key line; None when sshd
    does not answer (yet). ``proxy``: an ssh ProxyCommand that reaches it (ssh-keyscan cannot)."""
    if proxy:
        return _scan_through(host, port, proxy, timeout_s)
    exe = shutil.which("ssh-keyscan")
    if exe is None:
        raise ProviderUnavailable("ssh-keyscan is not installed", provider="ssh",
                                  hint="install OpenSSH's client (Debian: apt-get install openssh-client)")
    try:
        # "--": the host comes from a provider's answer, and "-f FILE" there would be an option
        proc = subprocess.run([exe, "-T", str(max(1, round(timeout_s))), "-p", str(port), "-t", "ed25519", "--", host],
                              capture_output=True, text=True, timeout=timeout_s + 5, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            try:
                return check_public_key(" ".join(parts[1:3]))
            except UsageError:
                continue
    return None


def _scan_through(host: str, port: int, proxy: str, timeout_s: float) -> str | None:
    """The key of a host reached through ``proxy``: ssh records it on the key exchange into a file
    of its own (it never authenticates: every method is off), and it is read from there."""
    exe = shutil.which("ssh")
    if exe is None:
        raise ProviderUnavailable("ssh is not installed", provider="ssh",
                                  hint="install OpenSSH's client (Debian: apt-get install openssh-client)")
    with tempfile.TemporaryDirectory(prefix="jp-scan-") as folder:
        seen = Path(folder) / "known_hosts"
        argv = [exe, "-p", str(port), "-o", f"ProxyCommand={proxy}", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=accept-new", "-o", f'UserKnownHostsFile="{seen}"',
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlgorithms=ssh-ed25519",
                "-o", "HashKnownHosts=no", "-o", "PubkeyAuthentication=no", "-o", "PasswordAuthentication=no",
                "-o", "KbdInteractiveAuthentication=no", "-o", "GSSAPIAuthentication=no",
                "-o", f"ConnectTimeout={max(1, round(timeout_s))}", "-o", "LogLevel=ERROR", "--", host, "true"]
        try:
            subprocess.run(argv, capture_output=True, timeout=timeout_s + 10, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None
        lines = seen.read_text().splitlines() if seen.exists() else []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3:
            try:
                return check_public_key(" ".join(parts[1:3]))
            except UsageError:
                continue
    return None


def pinned_key(allocation_id: str, directory: Path | None = None) -> str | None:
    """The host key pinned for this allocation (``kind blob``), or None when none is."""
    try:
        text = known_hosts_path(allocation_id, directory).read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            return f"{parts[1]} {parts[2]}"
    return None


def forget(allocation_id: str, directory: Path | None = None) -> None:
    """Drop an ended allocation's pinned key (its machine is gone; the IP may serve another)."""
    shutil.rmtree(known_hosts_path(allocation_id, directory).parent, ignore_errors=True)


def require_pinned(allocation_id: str, directory: Path | None = None) -> Path:
    path = known_hosts_path(allocation_id, directory)
    if not path.is_file():
        raise LaunchFailed(f"no host key is pinned for {allocation_id}; it is not reached without one",
                           provider="ssh")
    return path


__all__ = ["KEY_ENV", "UserKey", "check_public_key", "fingerprint", "forget", "host_key_pair", "known_hosts_path",
           "pin_host_key", "pinned_key", "require_pinned", "scan_host_key", "user_key"]
