"""The user side goes away and the machine looks after itself, end to end (issue 42 item 2, item 5):
a real ``jupyter server`` subprocess continues onto a RunPod twin's pod, a cell starts on the
machine, and the server is SIGSTOPped (a laptop that sleeps). The cell runs on to its end (nothing
is released while it runs); once the kernel has been idle for the idle window, the worker publishes
a final version, reads it back, records why and stops its own pod with the pod-scoped key the pod
carries. On SIGCONT the server's state (what the sidebar shows) and ``jupyter portable state`` say
what happened, and that version restores byte-identical.

The per-provider release paths (a Vast instance's own key, an AWS instance's shutdown) are the
cheaper tests of ``tests/test_guardian.py``, against their twins.

Settings kept short so it is fast: absent grace 3 s (the server asks every 2 s), idle window 4.2 s,
a cell of 7 s. The wall clock is only waited
on for things to happen (bounded polls); the assertion that nothing was released while the cell ran
is made on what the machine published, not on timing: the cell's last write is in the final version.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace

pytestmark = pytest.mark.timeout(300)

TOKEN = "guardian-e2e-token"
AFTER = bytes(range(256)) * 64  # the cell's last write: its bytes must come back exactly
CELL = ("import os, pathlib, time\n"
        "pathlib.Path('before.txt').write_text('written as the cell began\\n')\n"
        # the pod's own key is the worker's alone: the kernel never has it
        "pathlib.Path('key.txt').write_text(repr(os.environ.get('RUNPOD_API_KEY')))\n"
        "time.sleep(7)\n"
        "pathlib.Path('after.bin').write_bytes(bytes(range(256)) * 64)\n")


def _until(what: str, check: Callable[[], Any], limit_s: float = 120.0, every_s: float = 0.25) -> Any:
    """Poll ``check`` until it answers something true (bounded: ``limit_s``); that answer."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"never happened: {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A Jupyter server with this extension in a process of its own, as on a laptop."""

    def __init__(self, root: Path, home: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        conf = home / "config"
        conf.mkdir(parents=True)
        (conf / "jupyter_server_config.py").write_text(
            "c.ServerApp.jpserver_extensions = {'jupyter_portable': True}\n"
            f"c.IdentityProvider.token = {TOKEN!r}\nc.ServerApp.open_browser = False\n")
        self.env = {**os.environ, **env, "JUPYTER_CONFIG_DIR": str(conf), "JUPYTER_RUNTIME_DIR": str(home / "rt"),
                    "JUPYTER_PLATFORM_DIRS": "1"}
        self.log = (home / "server.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", f"--port={self.port}",
                                      "--ip=127.0.0.1", "--allow-root", f"--ServerApp.root_dir={root}"],
                                     cwd=root, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/portable/api/{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST",
                                     headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as reply:
            return json.loads(reply.read() or b"{}")

    def state(self) -> dict[str, Any] | None:
        try:
            return self.api("state")
        except OSError:
            return None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[Any]:
    from twins.machines import unavailable
    from twins.runpod import RunPodTwin

    if unavailable():
        pytest.skip(unavailable())
    offer = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
             "driver": "550.90.07", "cuda": "12.4", "stock": 1, "region": "US-TX-3"}
    with RunPodTwin(tmp_path / "twin", offers=[offer], boot_delay_s=0.3) as twin:
        yield twin


def test_a_stopped_server_past_the_idle_window_finds_its_machine_released_by_itself(
        tmp_path: Path, runpod: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client import BlockingKernelClient

    from jupyter_portable.engine.restore import restore
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.settings import update_settings
    from jupyter_portable.store.repo import Store

    root = tmp_path / "ws"
    ws = make_workspace(root, tmp_path / "store")
    update_settings(ws, idle_minutes=1)  # the server's own idle stop: a minute, past this test's end
    env = {**runpod.env(), "JUPYTER_PORTABLE_PROVIDERS": "runpod", "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh"),
           "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"), "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
           "JUPYTER_PORTABLE_ABSENT_GRACE": "3", "JUPYTER_PORTABLE_ENVIRONMENT": "image",
           # the machine's idle window: 4.2 s, shorter than the cell, so a guardian deaf to a running cell
           # would seal in the middle of it (and the cell's last write would be missing)
           "JUPYTER_PORTABLE_GUARDIAN_IDLE_MINUTES": "0.07",
           # the pod's image has this package (its Python runs the worker): nothing to bootstrap
           "JUPYTER_PORTABLE_REMOTE_PYTHON": sys.executable}
    for name, value in env.items():  # this test reaches the machine too, as the same user
        monkeypatch.setenv(name, value)
    server = Server(root, tmp_path / "home", env)
    try:
        _until("the server answers", server.state, 60)
        server.api("continue", {})
        active = _until("the machine is active", lambda: (s := server.state()) and s["lifecycle"]["state"] == "ACTIVE"
                        and s, 180)
        aid = active["lifecycle"]["allocation_id"]
        [ref] = runpod.running()
        assert active["unreachable"] is None

        # the laptop sleeps: the server is stopped outright, mid-session
        server.proc.send_signal(signal.SIGSTOP)
        # a cell starts on the machine (from this test, as a notebook's last cell before the lid closed)
        orch = Orchestrator(ws)
        client = orch.client(aid)
        client.keep_running()
        info = client.start_kernel("k-guardian")
        kc = BlockingKernelClient()
        kc.load_connection_info({**info, **client.forward_kernel(info), "ip": "127.0.0.1"})
        kc.hb_channel.time_to_dead = 30.0
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(CELL)
        # nothing more is asked of the worker: the user side is away; the cell's end is heard on the kernel's
        # own channel, which the worker's API never sees
        reply = kc.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok", reply["content"]

        # the machine seals, reads back, records why, and stops its own pod with the pod's key
        _until("the pod stopped itself", lambda: runpod._status(runpod.rentals[ref]) == "EXITED", 120)
        stops = [r for r in runpod.requests if r["op"] == "podAction"]
        assert [(r["method"], r["path"], r["status"]) for r in stops] == [("POST", f"/v2/pods/{ref}/action", 200)]
        store = Store.open(ws.config.store)
        head, _ = store.read_head(ws.workspace_id)
        manifest = store.read_manifest(ws.workspace_id, head.version)
        [record] = [a for a in manifest.allocations if a["allocation_id"] == aid][-1:]
        released = record["released_by"]
        assert (record["state"], released["by"], released["reason"], released["means"]) == (
            "released", "machine", "idle", "pod-key")
        sealed = released["version"]
        # nothing was released while the cell ran: its last write is in the version the machine sealed
        assert store.read_manifest(ws.workspace_id, sealed).find("after.bin") is not None
        # the pod-scoped key never reached the store
        key = next(k for k, r in runpod.machine_keys.items() if r == ref)
        machine = runpod.machines[ref]
        assert not any(key.encode() in p.read_bytes() for folder in (tmp_path / "store", machine.home)
                       for p in folder.rglob("*") if p.is_file())  # nor the machine's files (the worker's log)
        kc.stop_channels()

        # the laptop wakes: the server reads what the machine did and shows it
        server.proc.send_signal(signal.SIGCONT)
        back = _until("the server shows the release",
                      lambda: (s := server.state()) and s["lifecycle"]["state"] == "RELEASED" and s, 60)
        said = back["idle"]["released"]["message"]
        assert said.startswith("Released at ") and f"after 0.07 min idle while you were away; saved as version " \
            f"{sealed}" in said, said
        assert back["lost"] is None and runpod.running() == []  # the stopped pod (its disk) removed too
        state = cli.json("state", cwd=root, extra_env=env)
        assert state["state"] == "RELEASED" and state["released"]["message"] == said

        # that version restores byte-identical
        out = tmp_path / "restored"
        restore(store, ws.workspace_id, out, version=sealed)
        assert (out / "after.bin").read_bytes() == AFTER
        assert (out / "before.txt").read_text() == "written as the cell began\n"
        assert (out / "key.txt").read_text() == "None"
    finally:
        server.close()
