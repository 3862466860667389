"""The machines a provider twin rents out: each one a real ``sshd`` on 127.0.0.1.

A twin machine is what a bare cloud image gives: SSH for ``root`` with the keys the launch
put there, its own host key and home directory, a fake ``nvidia-smi`` that presents the
offer's GPUs and driver, and a plain Python (Debian's ``/usr/bin/python3``) that does not
have jupyter-portable or any of its dependencies. Sessions start in the machine's home with
``HOME`` set to it, so two machines never share files.

Every process a session starts carries ``TWIN_MACHINE=<id>`` and ``TWIN_MACHINE_MARK=<id>-<random>``
in its environment; stopping the machine (:meth:`TwinMachine.kill`) kills the sshd and every
process with its mark, the way a provider's reclaim takes the whole machine, detached workers
included. The random part keeps apart machines of the same id in two twins: two test
processes number their machines alike, and a teardown in one must not kill the other's
sessions (it did: a worker's install died with no output).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakegpu import install_fake_nvidia_smi
from sshd import Sshd, start_sshd, unavailable

BARE_PYTHON = "/usr/bin/python3"  # Debian's: no jupyter-portable, no blake3, no jupyter_client

__all__ = ["BARE_PYTHON", "TwinMachine", "start_machine", "unavailable"]


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
        """Put ``public_keys`` in root's authorized_keys (sshd reads it on every login)."""
        for key in public_keys:
            key = key.strip()
            if key and key not in self.authorized:
                self.authorized.append(key)
        (self.sshd.dir / "authorized_keys").write_text("".join(k + "\n" for k in self.authorized))

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
        # look again until none is left (bounded: 100 looks)
        for _ in range(100):
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


_SESSION = """#!/bin/sh
# every session of a twin machine starts in its own home, whatever the command
cd "$HOME" || exit 1
if [ -n "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"; fi
exec /bin/sh -l
"""


def start_machine(root: Path, machine_id: str, *, gpus: list[dict[str, Any]], driver: str, cuda: str,
                  public_keys: Iterable[str] = (), nvidia_mode: str = "ok", host: str = "127.0.0.1",
                  port: int | None = None, host_key: tuple[str, str] | None = None) -> TwinMachine:
    """Start a machine under ``root/machine_id``: sshd, home, fake GPUs, bare Python.

    Only ``public_keys`` may log in (as root); more can be added with :meth:`TwinMachine.authorize`
    (a provider that attaches keys after the launch). ``host``/``port`` say where its sshd listens
    (a cloud twin gives each machine its own 127.x.y.z and port 22); ``host_key`` is the host key
    its user data installed. Raises RuntimeError when sshd cannot start, OSError when ``port`` is taken.
    """
    base = root / machine_id
    home = base / "home"
    bin_dir = base / "bin"
    home.mkdir(parents=True)
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir, gpus, driver=driver, cuda=cuda, mode=nvidia_mode)
    (bin_dir / "python3").symlink_to(BARE_PYTHON)
    session = base / "session.sh"
    session.write_text(_SESSION)
    session.chmod(0o755)
    marker = f"{machine_id}-{secrets.token_hex(8)}"
    sshd = start_sshd(base / "sshd", path_prefix=[bin_dir], env={"HOME": str(home), "TWIN_MACHINE": machine_id,
                                                                    "TWIN_MACHINE_MARK": marker},
                      extra_config=[f"ForceCommand {session}"], host=host, port=port, host_key=host_key)
    machine = TwinMachine(machine_id=machine_id, sshd=sshd, home=home, gpus=gpus, driver=driver, cuda=cuda,
                          marker=marker)
    machine.authorize(public_keys)  # replaces the helper's own client key: only the launch's keys log in
    return machine
