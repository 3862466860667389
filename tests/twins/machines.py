"""The machines a provider twin rents out: each one a real ``sshd`` on 127.0.0.1.

A twin machine is what a bare cloud image gives: SSH for the image's login user (``root`` on
RunPod and Vast.ai, ``ubuntu`` with passwordless sudo on Lambda, AWS and GCP) with the keys the
launch put there, its own host key and home directory, a fake ``nvidia-smi`` that presents the
offer's GPUs and driver, and a plain Python of the image's version that does not have
jupyter-portable or any of its dependencies: Debian's ``/usr/bin/python3`` (:data:`BARE_PYTHON`)
unless the offer or image names another from :data:`PYTHONS`. ``python3`` on the session's PATH
is that interpreter, found in its own ``bin`` folder as on an image (a ``python3`` linked from
another folder is not enough: a venv made from it records that folder as its home, and Python
3.12 then finds its standard library only through the prefix built in).

Sessions start in the machine's home with ``HOME`` set to it, so two machines never share a home
(a real Lambda machine would call it ``/home/ubuntu``; here it is the machine's own folder, the
same path inside and outside, so a test can compare what the worker reports with
:attr:`TwinMachine.home`). The ``ubuntu`` machines of one host share that Unix account, so one
could still write into another's home if it looked for it.

No machine reaches a package index: every session's proxies point at a closed loopback port and
``PIP_INDEX_URL``/``UV_INDEX_URL`` at a dead loopback URL (:func:`no_index_env`), so pip and uv
fail in a second instead of hanging; ``no_proxy`` keeps the tests' loopback services (the moto
store on 127.0.0.1) reachable.

A machine's disk lives in a folder of this test process that other users may pass through
(pytest's temp dirs are mode 700, and a login user that is not root must reach its home, its
``authorized_keys`` and its ``bin``); ``root/machine_id`` is a link to it.

Every process a session starts carries ``TWIN_MACHINE=<id>`` and ``TWIN_MACHINE_MARK=<id>-<random>``
in its environment (sudo keeps both); stopping the machine (:meth:`TwinMachine.kill`) kills the
sshd and every process with its mark, the way a provider's reclaim takes the whole machine,
detached workers included. The random part keeps apart machines of the same id in two twins: two
test processes number their machines alike, and a teardown in one must not kill the other's
sessions (it did: a worker's install died with no output).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakegpu import install_fake_nvidia_smi
from sshd import Sshd, start_sshd, unavailable

BARE_PYTHON = "/usr/bin/python3"  # Debian's: no jupyter-portable, no blake3, no jupyter_client
# the bare interpreters a machine may have, by version; each differs from the tests' (pyenv 3.11.7)
PYTHONS = {
    "3.10": "/root/.pyenv/versions/3.10.13/bin/python3.10",
    "3.11.2": BARE_PYTHON,
    "3.12": "/root/.pyenv/versions/3.12.1/bin/python3.12",
    "3.13": "/root/.pyenv/versions/3.13.0/bin/python3.13",
}
CLOUD_USER = "ubuntu"  # the login user of Lambda Stack, the AWS DLAMI and GCP's Ubuntu images

__all__ = ["BARE_PYTHON", "CLOUD_USER", "PYTHONS", "TwinMachine", "ensure_login_user", "machine_python",
           "no_index_env", "python_missing", "require_python", "start_machine", "unavailable"]


def python_missing(version: str) -> str | None:
    """Why :data:`PYTHONS`'s ``version`` cannot be a machine's Python here, or None when it can."""
    path = PYTHONS.get(version)
    if path is None:
        return f"no machine Python {version!r} is known (tests/twins/machines.py PYTHONS has {sorted(PYTHONS)})"
    if not os.access(path, os.X_OK):
        return f"the machine Python {version} ({path}) is not installed here"
    return None


def require_python(version: str) -> str:
    """The path of :data:`PYTHONS`'s ``version``; skips the calling test where it is missing."""
    reason = python_missing(version)
    if reason:
        import pytest

        pytest.skip(reason)
    return PYTHONS[version]


# -- where machines live ---------------------------------------------------------------------

_lock = threading.Lock()
_copying = threading.Lock()
_disks: Path | None = None
_pythons: dict[str, str] = {}
_closed: socket.socket | None = None
_BARE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def machines_dir() -> Path:
    """This process's folder of machine disks and interpreter copies: others may pass through it
    (mode 711), and it is removed when the process ends."""
    global _disks
    with _lock:
        if _disks is None:
            _disks = Path(tempfile.mkdtemp(prefix="jupyter-portable-twin-machines-"))
            _disks.chmod(0o711)
            atexit.register(shutil.rmtree, _disks, True)
        return _disks


def put_disks_in(folder: Path) -> None:
    """Make machines started from now on keep their disks in ``folder`` (a benchmark gives each
    machine a new filesystem); the interpreter copies made so far stay where they are."""
    global _disks
    folder.chmod(0o711)
    with _lock:
        _disks = folder


def _open_to_others(path: Path) -> bool:
    """Whether a user that is neither the owner nor in the group can run ``path``."""
    if not path.exists() or not path.stat().st_mode & 0o001:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in path.parents)


def machine_python(python: str) -> str:
    """An interpreter path any login user can run, with ``python``'s version and modules.

    ``python`` itself when every folder above it lets others through; otherwise (pyenv's under
    /root, mode 700) a copy of its install tree, made once per process in :func:`machines_dir`
    (its ``lib`` less the test suite and static library: about 100 MB, a second or two), whose
    executable finds its shared library next to it (the run path pyenv built in is rewritten to
    ``$ORIGIN/../lib``). The copy is checked by running it as ``nobody``.
    """
    resolved = Path(python).resolve()
    if _open_to_others(resolved):
        return str(resolved)
    with _copying:  # machines boot in threads: one copy, the others wait for it
        if str(resolved) not in _pythons:
            _pythons[str(resolved)] = _copy_python(resolved)
        return _pythons[str(resolved)]


def _copy_python(resolved: Path) -> str:
    # isolated, and with a login's bare environment: the tests' own (a Jupyter server's PYTHONPATH
    # under test) can hold another version's modules, which stop this interpreter from starting
    asked = subprocess.run([str(resolved), "-I", "-S", "-c", "import sys; print(sys.base_prefix); print('%d.%d' % "
                            "sys.version_info[:2])"], capture_output=True, text=True, env=_BARE_ENV, cwd="/")
    if asked.returncode != 0:
        raise RuntimeError(f"{resolved} does not run: {asked.stderr.strip()[-500:]}")
    prefix, version = Path(asked.stdout.split()[0]), asked.stdout.split()[1]
    dest = machines_dir() / "pythons" / f"{prefix.name}-{secrets.token_hex(4)}"
    stdlib = prefix / "lib" / f"python{version}"

    def leave_out(folder: str, names: list[str]) -> list[str]:
        if Path(folder) == stdlib:
            return [n for n in names if n == "test"]
        return [n for n in names if n.endswith(".a")]

    dest.mkdir(parents=True)
    for folder in (dest.parent, dest):
        folder.chmod(0o755)
    shutil.copytree(prefix / "lib", dest / "lib", symlinks=True, ignore=leave_out)
    (dest / "bin").mkdir(mode=0o755)
    exe = dest / "bin" / resolved.name
    exe.write_bytes(_relocated(resolved.read_bytes(), str(prefix / "lib")))
    exe.chmod(0o755)
    if exe.name != "python3":
        (dest / "bin" / "python3").symlink_to(exe.name)
    seen = subprocess.run([str(exe), "-c", "import sys, ssl, sqlite3, venv; print(sys.prefix)"], user="nobody",
                          capture_output=True, text=True, cwd="/", env=_BARE_ENV)
    if seen.returncode != 0 or seen.stdout.strip() != str(dest):
        raise RuntimeError(f"the copy of {resolved} at {dest} does not run for another user: "
                           f"{(seen.stdout + seen.stderr).strip()[-500:]}")
    return str(exe)


def _relocated(binary: bytes, run_path: str) -> bytes:
    """``binary`` with its run path ``run_path`` (an absolute folder, NUL-ended in the ELF string
    table) replaced by ``$ORIGIN/../lib``, padded to the same length; unchanged without one."""
    old = run_path.encode() + b"\0"
    found = binary.count(old)
    if found == 0:
        return binary
    new = b"$ORIGIN/../lib"
    if found > 1 or len(new) >= len(old):
        raise RuntimeError(f"cannot rewrite the run path {run_path!r} (found {found} times)")
    return binary.replace(old, new + b"\0" * (len(old) - len(new)))


# -- the login user --------------------------------------------------------------------------

_SUDOERS = Path("/etc/sudoers.d/jupyter-portable-twin")
# sudo resets the environment: the machine's mark (so a sudo'd process dies with the machine)
# and the dead index and proxies (so sudo pip fails as fast) are kept
_KEPT = ("TWIN_MACHINE TWIN_MACHINE_MARK http_proxy https_proxy all_proxy no_proxy HTTP_PROXY HTTPS_PROXY "
         "ALL_PROXY NO_PROXY PIP_INDEX_URL UV_INDEX_URL")


def ensure_login_user(user: str) -> pwd.struct_passwd:
    """The Unix account ``user``, made when missing (``useradd -m``, as the images have it) with
    passwordless sudo where sudo is installed; idempotent, safe to race with another process.

    Its password field is ``*`` (no password, not locked): sshd without PAM refuses a locked
    account (``!``), even for a key. Raises RuntimeError when the account cannot be made.
    """
    with _lock:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            made = subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-p", "*", user], capture_output=True, text=True)
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise RuntimeError(f"cannot make the login user {user!r}: {made.stderr.strip()}") from None
        if user != "root":
            _unlock(user)
            _allow_sudo(user)
        return entry


def _unlock(user: str) -> None:
    with contextlib.suppress(OSError):
        for line in Path("/etc/shadow").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == user and rest.split(":", 1)[0] in ("!", "!*", "!!"):
                subprocess.run(["usermod", "-p", "*", user], check=True, capture_output=True)


def _allow_sudo(user: str) -> None:
    if not shutil.which("sudo") or not _SUDOERS.parent.is_dir():
        return  # scripts/setup.sh installs sudo; without it the machines have none
    text = f'{user} ALL=(ALL:ALL) NOPASSWD:ALL\nDefaults:{user} env_keep += "{_KEPT}"\n'
    with contextlib.suppress(OSError):
        if _SUDOERS.read_text() == text:
            return
    tmp = _SUDOERS.with_name(f".{_SUDOERS.name}.{os.getpid()}")  # sudo skips names with a dot
    tmp.write_text(text)
    tmp.chmod(0o440)
    os.replace(tmp, _SUDOERS)


# -- no package index ---------------------------------------------------------------------------

def no_index_env() -> dict[str, str]:
    """What every machine session's environment holds so that no package index is reached: proxies
    and indexes on a loopback port bound by this process and never listening (a connection is
    refused at once), and ``no_proxy`` for the loopback services the worker still uses."""
    global _closed
    with _lock:
        if _closed is None:
            _closed = socket.socket()
            _closed.bind(("127.0.0.1", 0))
        port = _closed.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    direct = "127.0.0.1,localhost,::1"
    return {"http_proxy": dead, "https_proxy": dead, "all_proxy": dead, "HTTP_PROXY": dead, "HTTPS_PROXY": dead,
            "ALL_PROXY": dead, "no_proxy": direct, "NO_PROXY": direct, "PIP_INDEX_URL": f"{dead}/simple/",
            "UV_INDEX_URL": f"{dead}/simple/"}


@dataclass
class TwinMachine:
    """One rented machine: where its sshd listens and what it presents."""

    machine_id: str
    sshd: Sshd
    home: Path
    gpus: list[dict[str, Any]]
    driver: str
    cuda: str
    authorized: list[str] = field(default_factory=list)
    marker: str = ""  # TWIN_MACHINE_MARK's value in every process of the machine
    user: str = "root"  # who logs in
    python: str = BARE_PYTHON  # what the machine's python3 runs (a copy of the one asked for, where it must be)
    link: Path | None = None  # root/machine_id, pointing at the disk

    @property
    def host(self) -> str:
        return self.sshd.host

    @property
    def port(self) -> int:
        return self.sshd.port

    def host_key_fingerprint(self) -> str:
        """``SHA256:...`` of the machine's host key, as ``ssh-keygen -lf`` prints it."""
        out = subprocess.run(["ssh-keygen", "-lf", str(self.sshd.host_key.with_suffix(".pub"))],
                             capture_output=True, text=True, check=True).stdout
        return out.split()[1]

    def authorize(self, public_keys: Iterable[str]) -> None:
        """Put ``public_keys`` in the login user's authorized_keys (sshd reads it, as that user, on
        every login)."""
        for key in public_keys:
            key = key.strip()
            if key and key not in self.authorized:
                self.authorized.append(key)
        path = self.sshd.dir / "authorized_keys"
        path.write_text("".join(k + "\n" for k in self.authorized))
        path.chmod(0o644)

    def processes(self) -> list[int]:
        """PIDs of every process started on this machine (its sessions and what they detached)."""
        marker = f"TWIN_MACHINE_MARK={self.marker}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
        return pids

    def alive(self) -> bool:
        return self.sshd.proc.poll() is None

    def kill(self) -> None:
        """Take the machine away: its sshd and every process on it, at once (SIGKILL)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.sshd.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.sshd.proc.wait(5)
        # a session may be forking as we look, and a killed process lingers until it is reaped:
        # look again until none is left (bounded: 30 s; a clean-clone make test at load 8 outlasted
        # 100 looks of 50 ms with one process left)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill the machine and delete its disk."""
        self.kill()
        shutil.rmtree(self.home.parent, ignore_errors=True)
        if self.link is not None:
            with contextlib.suppress(FileNotFoundError):
                self.link.unlink()


_SESSION = """#!/bin/sh
# every session of a twin machine starts in its own home, whatever the command
cd "$HOME" || exit 1
if [ -n "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"; fi
exec /bin/sh -l
"""


_SHUTDOWN = """#!/bin/sh
# a twin machine's shutdown: root only (a login user that is not root goes through sudo, as systemd
# refuses it over SSH), noted with who asked, and told to its provider twin (which stops or terminates
# the machine as its API says: AWS by the instance's InstanceInitiatedShutdownBehavior)
if [ "$(id -u)" != 0 ]; then
  echo "Call to PowerOff failed: Interactive authentication required." >&2
  exit 1
fi
echo "shutdown $* by $(id -un)${{SUDO_USER:+ through sudo from $SUDO_USER}}" >> '{log}'
[ -n '{url}' ] || exit 0
exec {python} -c 'import sys, urllib.request as u
u.build_opener(u.ProxyHandler({{}})).open(u.Request(sys.argv[1], data=b"", method="POST"), timeout=10)' '{url}'
"""


def start_machine(root: Path, machine_id: str, *, gpus: list[dict[str, Any]], driver: str, cuda: str,
                  public_keys: Iterable[str] = (), nvidia_mode: str = "ok", host: str = "127.0.0.1",
                  port: int | None = None, host_key: tuple[str, str] | None = None, user: str = "root",
                  python: str = BARE_PYTHON, env: dict[str, str] | None = None,
                  shutdown_url: str | None = None) -> TwinMachine:
    """Start a machine ``root/machine_id``: sshd, home, fake GPUs, bare Python, no package index.

    Only ``public_keys`` may log in, as ``user`` (made when missing, see :func:`ensure_login_user`);
    more can be added with :meth:`TwinMachine.authorize` (a provider that attaches keys after the
    launch). ``python`` is the bare interpreter the machine's ``python3`` runs (a path, e.g. from
    :data:`PYTHONS`). ``env``: what the provider puts in every process's environment (RunPod's pod id and
    pod-scoped key, Vast's instance key). ``shutdown_url``: where the machine's ``shutdown`` tells its
    provider it powers off (:data:`_SHUTDOWN`: root only, as systemd's over SSH; each call noted in the
    machine's ``shutdown.log``, e.g. ``shutdown -h now by root through sudo from ubuntu``).
    ``host``/``port`` say where its sshd listens (a cloud twin gives each machine
    its own 127.x.y.z and port 22); ``host_key`` is the host key its user data installed. Raises
    RuntimeError when sshd cannot start, OSError when ``port`` is taken.
    """
    account = ensure_login_user(user)
    base = Path(tempfile.mkdtemp(prefix=f"{machine_id}-", dir=machines_dir()))
    try:
        return _start(root, machine_id, base, account, gpus=gpus, driver=driver, cuda=cuda, public_keys=public_keys,
                      nvidia_mode=nvidia_mode, host=host, port=port, host_key=host_key, python=python,
                      provider_env=env or {}, shutdown_url=shutdown_url)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise


def _start(root: Path, machine_id: str, base: Path, account: pwd.struct_passwd, *, gpus: list[dict[str, Any]],
           driver: str, cuda: str, public_keys: Iterable[str], nvidia_mode: str, host: str, port: int | None,
           host_key: tuple[str, str] | None, python: str, provider_env: dict[str, str],
           shutdown_url: str | None) -> TwinMachine:
    base.chmod(0o755)
    home = base / "home"
    bin_dir = base / "bin"
    home.mkdir(mode=0o750)
    os.chown(home, account.pw_uid, account.pw_gid)
    bin_dir.mkdir(mode=0o755)
    # nvidia-smi is the driver's own binary, whatever Python the image has: Debian's runs the fake
    install_fake_nvidia_smi(bin_dir, gpus, driver=driver, cuda=cuda, mode=nvidia_mode, python=BARE_PYTHON)
    runs = machine_python(python)
    own_bin = Path(runs).parent
    if (own_bin / "python3").resolve() == Path(runs):
        path = [bin_dir, own_bin]  # before /usr/local/bin, where the host may have a python3 of its own
    else:  # an interpreter without a python3 beside it
        (bin_dir / "python3").symlink_to(runs)
        path = [bin_dir]
    # every machine has a shutdown of its own, first on PATH: never the host's (systemctl), even through sudo
    shutdown = bin_dir / "shutdown"
    shutdown.write_text(_SHUTDOWN.format(log=base / "shutdown.log", python=BARE_PYTHON, url=shutdown_url or ""))
    shutdown.chmod(0o755)
    session = base / "session.sh"
    session.write_text(_SESSION)
    session.chmod(0o755)
    marker = f"{machine_id}-{secrets.token_hex(8)}"
    # the worker keeps of a machine's environment only what core.secretenv allows; the machine's
    # mark is named for it on purpose, so its kernel too dies with the machine
    env = {"HOME": str(home), "TWIN_MACHINE": machine_id, "TWIN_MACHINE_MARK": marker,
           "JUPYTER_PORTABLE_PASS_ENV": "TWIN_MACHINE,TWIN_MACHINE_MARK", **no_index_env(), **provider_env}
    sshd = start_sshd(base / "sshd", path_prefix=path, env=env, extra_config=[f"ForceCommand {session}"],
                      host=host, port=port, host_key=host_key, user=account.pw_name)
    machine = TwinMachine(machine_id=machine_id, sshd=sshd, home=home, gpus=gpus, driver=driver, cuda=cuda,
                          marker=marker, user=account.pw_name, python=runs)
    machine.authorize(public_keys)  # replaces the helper's own client key: only the launch's keys log in
    root.mkdir(parents=True, exist_ok=True)
    link = root / machine_id
    with contextlib.suppress(FileExistsError):  # a machine of that id started before (another twin's): keep it
        link.symlink_to(base)
        machine.link = link
    return machine
