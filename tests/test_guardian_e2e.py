"""The user side goes away and the machine looks after itself, end to end, on the RunPod, Vast.ai
and AWS twins (issue 42 item 2, item 5): a real ``jupyter server`` subprocess continues onto the
provider's machine, a cell starts there, and the server is SIGSTOPped (a laptop that sleeps). The cell
runs on to its end (nothing is released while it runs); once the kernel has been idle for the idle
window, the worker publishes a final version, reads it back, records why and ends its machine's
billing by the provider's own means: the pod-scoped key every pod carries (RunPod: stop this pod),
the instance's own key (Vast: stop this instance), or the machine's own ``shutdown`` (AWS, run by the
image's login user ``ubuntu`` through ``sudo -n``: the instance was launched with
InstanceInitiatedShutdownBehavior=terminate, so EC2 terminates it). On SIGCONT the server's state
(what the sidebar shows) and ``jupyter portable state`` say what happened, and that version restores
byte-identical.

Each machine's Python has this package (``JUPYTER_PORTABLE_REMOTE_PYTHON``, an image that ships it):
nothing is bootstrapped, so the three cases spend their time on the flow itself. Where the login
user is not root (AWS) that Python is one the user can run (:func:`image_python`), and the store is
S3 (a moto server): a folder of the tests' is not a store that user could write.

Settings kept short so it is fast: absent grace 3 s (the server asks every 2 s), idle window 4.2 s,
a cell of 7 s. The wall clock is only waited on for things to happen (bounded polls); the assertion
that nothing was released while the cell ran is made on what the machine published, not on timing:
the cell's last write is in the final version.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace

from jupyter_portable.core import guardian as G

pytestmark = pytest.mark.timeout(300)

TOKEN = "guardian-e2e-token"
AFTER = bytes(range(256)) * 64  # the cell's last write: its bytes must come back exactly
CELL = ("import os, pathlib, time\n"
        "pathlib.Path('before.txt').write_text('written as the cell began\\n')\n"
        # the machine's own key (a pod's, an instance's) is the worker's alone: the kernel never has it
        "pathlib.Path('key.txt').write_text(repr([os.environ.get(n) for n in ('RUNPOD_API_KEY', "
        "'CONTAINER_API_KEY')]))\n"
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


_IMAGE_PYTHON: dict[str, str] = {}


def image_python() -> str:
    """A Python that any login user can run (the AWS machines' ``ubuntu``, not root) and that has
    jupyter-portable and its dependencies, as an image that ships the package has it: a venv of
    Debian's Python (the tests' minor version, so the same wheels fit) whose site-packages adds the
    tests' own. Made once per process, and checked by running it as ``nobody``."""
    if "path" in _IMAGE_PYTHON:
        return _IMAGE_PYTHON["path"]
    from twins.machines import BARE_PYTHON, machines_dir

    bare = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    asked = subprocess.run([BARE_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, env=bare, cwd="/")
    if asked.stdout.strip() != minor:
        pytest.skip(f"{BARE_PYTHON} is not Python {minor}: no image Python can share the tests' packages")
    venv = Path(tempfile.mkdtemp(prefix="image-env-", dir=machines_dir()))
    venv.chmod(0o755)
    subprocess.run([BARE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   env=bare, cwd="/")
    (venv / "lib" / f"python{minor}" / "site-packages" / "zz_image_packages.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    python = str(venv / "bin" / "python3")
    seen = subprocess.run([python, "-c", "import jupyter_portable.worker, ipykernel, blake3"], user="nobody",
                          capture_output=True, text=True, env=bare, cwd="/")
    assert seen.returncode == 0, f"{python} lacks the package for another user: {seen.stderr[-800:]}"
    _IMAGE_PYTHON["path"] = python
    return python


H100 = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
        "driver": "550.90.07", "cuda": "12.4", "stock": 1, "region": "US-TX-3"}
MEANS = {"runpod": G.POD_KEY, "vastai": G.INSTANCE_KEY, "aws": G.SHUTDOWN_TERMINATE}


@dataclass
class Rented:
    """A provider's twin, and what points the server, the CLI and this test at it."""

    provider: str
    twin: Any
    env: dict[str, str]
    store: Path | str  # the workspace's store: a folder of the tests', or S3 where the login user is not root

    def ended_itself(self, ref: str) -> bool:
        """Whether the provider says the machine ``ref`` ended its billing (stopped, or terminated), and
        has noted the call that did it."""
        twin = self.twin
        if self.provider == "aws":
            return bool(twin.instance(ref)._state.name == "terminated")
        stopped = (twin._status(twin.rentals[ref]) == "EXITED" if self.provider == "runpod" else
                   bool(twin.rentals[ref].extra.get("stopped")))
        with twin.lock:  # the twin notes a request once it has answered it
            return stopped and any(r["op"] in ("podAction", "manageInstance") for r in twin.requests)

    def check_ended_by_its_own_means(self, ref: str, machine: Any) -> None:
        """The machine ``ref`` ended its billing itself, by its provider's means; the user side (stopped)
        asked nothing of the provider."""
        twin = self.twin
        if self.provider in ("runpod", "vastai"):
            op, call = (("podAction", ("POST", f"/v2/pods/{ref}/action")) if self.provider == "runpod" else
                        ("manageInstance", ("PUT", f"/api/v0/instances/{ref}/")))
            # once, with the machine's own key (the account's key is the server's, and the server is stopped)
            assert [(r["method"], r["path"], r["status"], r["machine_key"]) for r in twin.requests
                    if r["op"] == op] == [(*call, 200, True)]
            assert not any(r.get("scoped_refused") for r in twin.requests)
            return
        # AWS: the worker ran the machine's own shutdown as its login user through sudo, and EC2 terminated
        # the instance because it was launched so; nobody called TerminateInstances
        assert machine.user == "ubuntu"
        ran = (machine.home.parent / "shutdown.log").read_text().splitlines()
        assert ran == ["shutdown -h now by root through sudo from ubuntu"], ran
        assert twin.shutdowns == [(ref, "terminate")]
        assert [a for a, _status in twin.actions if a in ("TerminateInstances", "StopInstances")] == []


@pytest.fixture(params=list(MEANS))
def rented(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rented]:
    from twins.machines import unavailable

    if unavailable():
        pytest.skip(unavailable())
    provider = request.param
    if provider == "runpod":
        from twins.runpod import RunPodTwin

        with RunPodTwin(tmp_path / "twin", offers=[H100], boot_delay_s=0.3) as twin:
            # the pod's image has this package (its Python runs the worker): nothing to bootstrap
            yield Rented(provider, twin, {**twin.env(), "JUPYTER_PORTABLE_REMOTE_PYTHON": sys.executable},
                         tmp_path / "store")
    elif provider == "vastai":
        from twins.vastai import VastTwin

        with VastTwin(tmp_path / "twin", offers=[H100], boot_delay_s=0.3) as twin:
            yield Rented(provider, twin, {**twin.env(), "JUPYTER_PORTABLE_REMOTE_PYTHON": sys.executable},
                         tmp_path / "store")
    else:
        from conftest import make_bucket
        from twins.aws import AwsTwin

        aws = request.getfixturevalue("aws_env")  # the store: S3 on moto; EC2: the twin (AWS_ENDPOINT_URL_EC2)
        python = image_python()
        with AwsTwin(tmp_path / "twin", boot_delay_s=0.3, ssh_cidr="127.0.0.1/32") as twin:
            yield Rented(provider, twin, {**aws, **twin.env(), "JUPYTER_PORTABLE_REMOTE_PYTHON": python},
                         f"s3://{make_bucket()}/guardian")


def _words(state: dict[str, Any]) -> str:
    return str(state["idle"]["released"]["message"])


def test_a_stopped_server_past_the_idle_window_finds_its_machine_released_by_itself(
        tmp_path: Path, rented: Rented, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client import BlockingKernelClient

    from jupyter_portable.engine.restore import restore
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.settings import update_settings
    from jupyter_portable.store.repo import Store

    twin = rented.twin
    root = tmp_path / "ws"
    ws = make_workspace(root, rented.store)
    update_settings(ws, idle_minutes=1)  # the server's own idle stop: a minute, past this test's end
    env = {**rented.env, "JUPYTER_PORTABLE_PROVIDERS": rented.provider,
           "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh"), "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"),
           "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0", "JUPYTER_PORTABLE_ABSENT_GRACE": "3",
           "JUPYTER_PORTABLE_ENVIRONMENT": "image",
           # the machine's idle window: 4.2 s, shorter than the cell, so a guardian deaf to a running cell
           # would seal in the middle of it (and the cell's last write would be missing)
           "JUPYTER_PORTABLE_GUARDIAN_IDLE_MINUTES": "0.07"}
    for name, value in env.items():  # this test reaches the machine too, as the same user
        monkeypatch.setenv(name, value)
    server = Server(root, tmp_path / "home", env)
    orch: Orchestrator | None = None
    try:
        _until("the server answers", server.state, 60)
        server.api("continue", {})
        active = _until("the machine is active", lambda: (s := server.state()) and s["lifecycle"]["state"] == "ACTIVE"
                        and s, 180)
        aid = active["lifecycle"]["allocation_id"]
        [ref] = twin.running()
        machine = twin.machines[ref]
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

        # the machine seals, reads back, records why, and ends its own billing by its provider's means
        _until("the machine ended its own billing", lambda: rented.ended_itself(ref), 120)
        rented.check_ended_by_its_own_means(ref, machine)
        store = Store.open(ws.config.store)
        head, _ = store.read_head(ws.workspace_id)
        manifest = store.read_manifest(ws.workspace_id, head.version)
        [record] = [a for a in manifest.allocations if a["allocation_id"] == aid][-1:]
        released = record["released_by"]
        assert (record["state"], released["by"], released["reason"], released["means"], released.get("error")) == (
            "released", "machine", "idle", MEANS[rented.provider], None)
        sealed = released["version"]
        # nothing was released while the cell ran: its last write is in the version the machine sealed
        assert store.read_manifest(ws.workspace_id, sealed).find("after.bin") is not None
        # a machine's own key (RunPod's, Vast's; an AWS machine has none) never reached the store, nor the
        # machine's files (the worker's log)
        keys = [k for k, r in getattr(twin, "machine_keys", {}).items() if r == ref]
        assert len(keys) == (rented.provider != "aws")
        for key in keys:
            assert isinstance(rented.store, Path)
            assert not any(key.encode() in p.read_bytes() for folder in (rented.store, machine.home)
                           for p in folder.rglob("*") if p.is_file())
        kc.stop_channels()
        orch.close()  # its tunnels to the machine, which is gone

        # the laptop wakes: the server reads what the machine did and shows it
        server.proc.send_signal(signal.SIGCONT)
        back = _until("the server shows the release",
                      lambda: (s := server.state()) and s["lifecycle"]["state"] == "RELEASED" and s, 60)
        said = _words(back)
        assert said.startswith("Released at ") and f"after 0.07 min idle while you were away; saved as version " \
            f"{sealed}" in said, said
        # what still bills after the machine's means: a stopped pod's or instance's disk; nothing after a terminate
        assert ("; still billed: the stopped " in said) == (rented.provider != "aws"), said
        assert back["lost"] is None and twin.running() == []  # a stopped pod's or instance's disk removed too
        state = cli.json("state", cwd=root, extra_env=env)
        assert state["state"] == "RELEASED" and state["released"]["message"] == said

        # that version restores byte-identical
        out = tmp_path / "restored"
        restore(store, ws.workspace_id, out, version=sealed)
        assert (out / "after.bin").read_bytes() == AFTER
        assert (out / "before.txt").read_text() == "written as the cell began\n"
        assert (out / "key.txt").read_text() == "[None, None]"
    finally:
        if orch is not None:
            orch.close()
        server.close()
