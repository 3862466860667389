"""An ``ssh`` host with a GPU on loopback, and a partition of it: what the SSH end-to-end tests share.

The machine is a real sshd (:mod:`sshd`) whose sessions find a fake ``nvidia-smi`` presenting one
H100 (:mod:`fakegpu`); the ``ssh`` provider finds it in a hosts file. The Python it runs the worker
with is the tests' own (it has this package, so nothing is bootstrapped). A partition freezes its
sshd and every connection it holds (:func:`sshd.partitioned`); :func:`partition` also ends the
port forwards' ssh processes where the test does not wait for their keepalive to end them::

    with gpu_sshd(tmp_path) as sshd:
        for key, value in ssh_env(sshd, tmp_path).items():
            monkeypatch.setenv(key, value)
        ...
        with partition(sshd, forwards(provider, allocation_id), kill=True) as cut:
            cut.restarted()  # nothing reaches the machine; every forward died and was started again

Used by tests/test_unreachable.py, tests/test_partition_websocket.py, tests/test_continue_ssh.py
and bench/blips.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fakegpu import H100, install_fake_nvidia_smi
from sshd import Sshd, partitioned, running_sshd

DRIVER, CUDA = "550.54.15", "12.4"

HOST = """
[[host]]
name = "{name}"
host = "127.0.0.1"
port = {port}
user = "{user}"
key = "{key}"
python = "{python}"
workdir = "{workdir}"

[host.labels]
gpu = "NVIDIA H100 80GB HBM3"
gpu_count = 1
gpu_memory_gb = 80
driver = "{driver}"
cuda = "{cuda}"
region = "loopback"
price_per_hour = {price}
"""


@contextlib.contextmanager
def gpu_sshd(directory: Path) -> Iterator[Sshd]:
    """A running sshd under ``directory`` whose sessions see one H100 (driver 550.54.15, CUDA 12.4)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    install_fake_nvidia_smi(bin_dir, [H100], driver=DRIVER, cuda=CUDA)
    with running_sshd(directory / "server", path_prefix=[bin_dir]) as server:
        yield server


def ssh_env(sshd: Sshd, root: Path, hosts: Sequence[tuple[str, float]] = (("box", 1.0),),
            **extra: str) -> dict[str, str]:
    """Write ``root/hosts.toml`` with one host on ``sshd`` per (name, $/h) of ``hosts`` (each its own
    workdir, ``root/remote-<name>``), and return the environment that makes ``ssh`` the only provider
    with those hosts: its state under ``root``, no autosnapshot, plus ``extra`` (JUPYTER_PORTABLE_<KEY>)."""
    from jupyter_portable.compute.hosts import ENV_HOSTS
    from jupyter_portable.compute.ssh import ENV_STATE

    path = root / "hosts.toml"
    path.write_text("".join(HOST.format(name=name, port=sshd.port, user=sshd.user, key=sshd.client_key,
                                        python=sys.executable, workdir=root / f"remote-{name}", price=price,
                                        driver=DRIVER, cuda=CUDA) for name, price in hosts))
    return {ENV_HOSTS: str(path), ENV_STATE: str(root / "ssh-state"), "JUPYTER_PORTABLE_PROVIDERS": "ssh",
            "JUPYTER_PORTABLE_MARKET_DIR": str(root / "market"), "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
            **{f"JUPYTER_PORTABLE_{key.upper()}": value for key, value in extra.items()}}


def forwards(provider: Any, allocation_id: str) -> list[Any]:
    """The port forwards (``sshlink._Tunnel``) that ``provider``'s SSH link holds to ``allocation_id``:
    the worker's HTTP and the kernels' ports, of every client that opened one."""
    return [close.__self__ for close in provider.link._forwards.get(allocation_id, [])]


def alive(pid: int) -> bool:
    """Whether the process ``pid`` (a worker on the machine) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def until(done: Any, limit: float) -> bool:
    """Poll ``done()`` for up to ``limit`` seconds (an upper bound for something to happen)."""
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Cut:
    """What :func:`partition` yields: the frozen processes, and the forwards it watches."""

    def __init__(self, pids: list[int], tunnels: Sequence[Any]) -> None:
        self.pids = pids
        self.tunnels = list(tunnels)
        self._before = [t.restarts for t in self.tunnels]

    def restarted(self, limit: float = 60.0) -> None:
        """Wait until every forward has died and been started again (it then waits to connect until the
        partition ends); an AssertionError after ``limit`` seconds."""
        assert until(lambda: all(t.restarts > n for t, n in zip(self.tunnels, self._before, strict=True)), limit), \
            f"not every port forward died and started again: {[t.restarts for t in self.tunnels]} (was {self._before})"


@contextlib.contextmanager
def partition(sshd: Sshd, tunnels: Sequence[Any] = (), *, kill: bool = False) -> Iterator[Cut]:
    """:func:`sshd.partitioned`, watching ``tunnels`` (see :meth:`Cut.restarted`). ``kill``: end each
    tunnel's ssh at once, as ssh ends itself when its keepalive goes unanswered; else its keepalive
    (a short ServerAlive) does."""
    with partitioned(sshd) as pids:
        cut = Cut(pids, tunnels)
        if kill:
            for tunnel in cut.tunnels:
                tunnel._proc.kill()
        yield cut


# A cell that prints "tick N" every ``pause`` seconds until ``flag`` exists, and once, when
# ``flag``.during exists, "during the partition" (then ``flag``.said exists); its last line is
# "after the partition". Every line it prints must arrive, once, in order.
CELL = """
import os, time
n = 0
while not os.path.exists({flag!r}):
    n += 1
    print("tick", n, flush=True)
    if os.path.exists({flag!r} + ".during") and not os.path.exists({flag!r} + ".said"):
        print("during the partition", flush=True)
        open({flag!r} + ".said", "w").close()
    time.sleep({pause})
print("after the partition", flush=True)
"""


READER_STOPPED = "the reader stopped"  # what a test's IOPub reader adds to the output when it fails


def in_order(text: str) -> list[int]:
    """The tick numbers of ``text``; AssertionError unless each came once, in order, and "during the
    partition" once (and the reader did not stop)."""
    import re

    assert READER_STOPPED not in text and text.count("during the partition") == 1, text
    ticks = [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]
    assert ticks == list(range(1, len(ticks) + 1)), ticks
    return ticks


__all__ = ["CELL", "CUDA", "DRIVER", "HOST", "READER_STOPPED", "Cut", "alive", "forwards", "gpu_sshd", "in_order",
           "partition", "ssh_env", "until"]
