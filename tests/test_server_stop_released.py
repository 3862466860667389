"""Stopping the Jupyter server after the kernel's machine was released: nothing is left to signal or
wait for there, so the server stops at once and says so in its log once.

Seen in the browser tests on two workers: the last server of one took 30 s to stop (killed then),
its log showing the shutdown signalling the worker of a machine released by a terminal's `stop`.
Two causes, one test each:

- the shutdown of a kernel whose machine was released asked the gone worker to interrupt it, then
  waited 5 s for it to exit (the provisioner said "alive" while the worker did not answer), then
  terminated it: the real server below, its kernel on a local-market machine stopped from a terminal;
- a kernel move (the machine went: the kernel restarts as the local placeholder) still under way
  when the server stopped never finished, and the thread waiting for it held the process's exit
  for 120 s (Python waits for its pool's threads): a real event loop stopped under the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace, portable_env, release_all

from jupyter_portable.core.errors import PortableError

TOKEN = "server-stop-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(180)
def test_a_server_stops_at_once_when_its_kernels_machine_was_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    portable_env(tmp_path, monkeypatch)
    root = tmp_path / "workspace"
    make_workspace(root, tmp_path / "store")
    conf = tmp_path / "config"
    conf.mkdir()
    # the server does not look at the machine before it is stopped (60 s): nothing has moved the
    # kernel to its placeholder, as when a server is stopped right after a terminal's `stop`
    (conf / "jupyter_server_config.py").write_text(
        "c.ServerApp.jpserver_extensions = {'jupyter_portable': True}\n"
        f"c.IdentityProvider.token = {TOKEN!r}\nc.ServerApp.open_browser = False\n"
        "c.Portable.check_interval_s = 60.0\n")
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(conf), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_PORTABLE_TRUST_FILE": str(tmp_path / "trust.json")}
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1",
                                 "--allow-root", f"--ServerApp.root_dir={root}"],
                                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def api(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        with opener.open(req, timeout=150) as reply:
            return dict(json.loads(reply.read() or b"{}"))

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                api("GET", "api/status")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
        api("POST", "api/sessions", {"path": "nb.ipynb", "type": "notebook", "name": "nb.ipynb",
                                     "kernel": {"name": "portable"}})  # rents the first machine (open)
        allocation = api("GET", "portable/api/state")["lifecycle"]["allocation_id"]
        assert allocation, "the kernel runs on a machine"
        stop = subprocess.run([sys.executable, "-m", "jupyter_portable", "stop", "--json"], cwd=root,
                              env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert json.loads(stop.stdout)["state"] == "RELEASED"

        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)  # generous: it took 5-7 s, and 30 s (killed) on two test workers
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop within 10 s:\n{log_path.read_text()[-3000:]}")
        took = time.monotonic() - stopping
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        release_all()
    text = log_path.read_text()
    said = [line for line in text.splitlines() if "nothing to signal or stop there" in line]
    assert len(said) == 1, text[-3000:]
    assert f"allocation {allocation} is RELEASED" in said[0]
    assert "not delivered" not in text, text[-3000:]  # nothing was sent to the released machine's worker
    print(f"stopped in {took:.2f} s")


class _HeldRestarts:
    """A kernel manager whose restarts are under way until ``release`` (never, here)."""

    def __init__(self) -> None:
        self.begun = threading.Event()
        self.release: asyncio.Event | None = None

    async def restart_kernel(self, kernel_id: str, now: bool = False) -> None:
        self.release = asyncio.Event()
        self.begun.set()
        await self.release.wait()


class _Loop:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.asyncio_loop = loop


@pytest.mark.timeout(60)
def test_a_kernel_move_under_way_when_the_server_stops_does_not_hold_its_exit() -> None:
    from jupyter_portable.orchestration.kernel_moves import restart_kernels

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    km = _HeldRestarts()
    server = type("Server", (), {"kernel_manager": km})()
    outcome: list[BaseException | None] = []

    def move() -> None:
        try:
            restart_kernels(server, _Loop(loop), ["k-1"], timeout_s=45)  # type: ignore[arg-type]
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    try:
        assert km.begun.wait(20), "the restart began"
        loop.call_soon_threadsafe(loop.stop)  # the server stopped its loop, the restart still under way
        mover.join(10)
        assert not mover.is_alive(), "the wait for the move ended with the server's loop"
    finally:
        runner.join(10)
        with contextlib.suppress(RuntimeError):
            loop.close()
    assert len(outcome) == 1 and isinstance(outcome[0], PortableError), outcome
    assert "k-1 (the server stopped)" in str(outcome[0])
