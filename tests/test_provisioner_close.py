"""A server stopping while a kernel moves to its placeholder: the shutdown's cleanup waits for
the placeholder being started, then stops it and removes its folder; the start does not fail.
And a placeholder never outlives the server that started it, however that one ends."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.timeout(120)
def test_cleanup_during_a_placeholder_start_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jupyter_client.connect as connect

    from jupyter_portable.orchestration.provisioner import PortableProvisioner

    prov = PortableProvisioner(kernel_id="k-1", kernel_spec=None)
    prov._workspace_root = str(tmp_path)
    prov._no_machine = {"state": "LOST", "reason": "test", "first": False}
    writing, go_on = threading.Event(), threading.Event()
    real = connect.write_connection_file

    folders: list[str] = []

    def slow_write(fname: str, **kwargs: Any) -> Any:
        folders.append(os.path.dirname(fname))
        writing.set()
        assert go_on.wait(60)
        return real(fname, **kwargs)

    monkeypatch.setattr(connect, "write_connection_file", slow_write)
    started: dict[str, Any] = {}

    def launch() -> None:
        try:
            started["conn"] = prov._launch_placeholder("k-1")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            started["error"] = exc

    launcher = threading.Thread(target=launch)
    launcher.start()
    assert writing.wait(60), "the start reached its connection file"
    closer = threading.Thread(target=prov._close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "the cleanup waits for the start in progress"
    go_on.set()
    launcher.join(60)
    closer.join(60)
    assert "error" not in started, started.get("error")
    assert "conn" in started
    assert prov._placeholder is None and prov._placeholder_dir is None, "the cleanup stopped what was started"
    assert folders and not os.path.exists(folders[0]), "its folder is removed"


@pytest.mark.timeout(120)
def test_a_stop_during_a_launch_lets_the_launch_finish_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jupyter_client asserts the kernel is up right after the launch returns: a server stop that
    overlaps a kernel's move to its placeholder must not kill it before that."""
    import asyncio

    import jupyter_client.connect as connect

    from jupyter_portable.orchestration.provisioner import PortableProvisioner

    prov = PortableProvisioner(kernel_id="k-2", kernel_spec=None)
    prov._workspace_root = str(tmp_path)
    prov._no_machine = {"state": "LOST", "reason": "test", "first": False}
    writing, go_on = threading.Event(), threading.Event()
    real = connect.write_connection_file

    def slow_write(fname: str, **kwargs: Any) -> Any:
        writing.set()
        assert go_on.wait(60)
        return real(fname, **kwargs)

    monkeypatch.setattr(connect, "write_connection_file", slow_write)
    seen: list[bool] = []

    async def scenario() -> None:
        async def launch() -> None:
            await prov.launch_kernel([], kernel_id="k-2")
            seen.append(prov.has_process)  # what jupyter_client asserts at once

        task = asyncio.create_task(launch())
        while not writing.is_set():
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(prov.kill())
        await asyncio.sleep(0.2)
        assert not stopping.done(), "the stop waits for the launch"
        go_on.set()
        await task
        await stopping
        await prov.cleanup()

    asyncio.run(scenario())
    assert seen == [True]
    assert prov._placeholder is None and prov._placeholder_dir is None


# a stand-in for the server: starts the placeholder as the provisioner does, says its pid, waits
_SERVER = """
import os, subprocess, sys, time
env = {**os.environ, "JUPYTER_PORTABLE_SERVER_PID": str(os.getpid())}
kernel = subprocess.Popen([sys.executable, "-m", "jupyter_portable.interfaces.kernel.placeholder", "-f", sys.argv[1]],
                          env=env, start_new_session=True)
print(kernel.pid, flush=True)
time.sleep(600)
"""


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


@pytest.mark.timeout(180)
def test_a_placeholder_kernel_ends_with_the_server_that_started_it(tmp_path: Path) -> None:
    """The server stopped while a kernel moved to its placeholder, or was killed: the
    placeholder it started must not run on with nobody to stop it."""
    from jupyter_client.connect import write_connection_file

    from jupyter_portable.interfaces.kernel import placeholder
    from jupyter_portable.orchestration import provisioner

    assert placeholder.SERVER_PID_ENV == provisioner.SERVER_PID_ENV
    fname, cfg = write_connection_file(str(tmp_path / "kernel.json"), ip="127.0.0.1")
    server = subprocess.Popen([sys.executable, "-c", _SERVER, fname], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    kernel = int(server.stdout.readline())
    gone = os.pidfd_open(kernel)  # readable once the placeholder has ended
    try:
        while not _answers(cfg["shell_port"]):  # the placeholder kernel is up (the test's timeout bounds the wait)
            time.sleep(0.1)
        server.kill()  # however the server ends: SIGKILL leaves it no say
        server.wait()
        assert select.select([gone], [], [])[0] == [gone], "the placeholder ended with its server"
    finally:
        server.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(kernel, signal.SIGKILL)
        os.close(gone)
