"""Helpers for the end-to-end tests: a catalog, a workspace, and cells run over the
server's real kernel websocket (the JSON protocol JupyterLab speaks)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CATALOG = """
version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "cheap-stale"
gpu = "NVIDIA L4"
gpu_count = 1
gpu_memory_gb = 24
driver = "550.54.15"
actual_driver = "535.104.05"
cuda = "12.4"
price_per_hour = 0.10
region = "local-a"
capacity = 2
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
reservable = true

[[offer]]
id = "a100"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "local-a"
capacity = 3
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
reservable = true
"""


def portable_env(tmp_path: Path, monkeypatch: Any, catalog: str = CATALOG,
                 first_machine: str = "open") -> dict[str, Path]:
    """The local market's environment for a test's server. ``first_machine="open"``: opening a
    notebook session rents the first machine (these tests speak the protocol: no notebook asks)."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(catalog)
    dirs = {"catalog": cat, "market": tmp_path / "market", "store": tmp_path / "store"}
    monkeypatch.setenv("JUPYTER_PORTABLE_CATALOG", str(cat))
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(dirs["market"]))
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "local")
    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    monkeypatch.setenv("JUPYTER_PORTABLE_FIRST_MACHINE", first_machine)
    return dirs


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[dict[str, Path]]:
    """The local market in this test's folder, with the test module's ``SERVER_ENV`` (names to
    values) set first; every machine still running is released after the test. A test module
    takes it (and :func:`jp_root_dir`) with ``from jupyter_e2e import env, jp_root_dir``."""
    for name, value in getattr(request.module, "SERVER_ENV", {}).items():
        monkeypatch.setenv(name, value)
    yield portable_env(tmp_path, monkeypatch)
    release_all()


@pytest.fixture
def jp_root_dir(tmp_path: Path, env: dict[str, Path]) -> Path:
    """The server's root (pytest-jupyter's fixture): a workspace with a first version in the store."""
    root = tmp_path / "workspace"
    make_workspace(root, env["store"])
    return root


def release_all(providers: tuple[str, ...] = ("local",)) -> None:
    """Terminate every machine the test's markets still run: no worker outlives its test."""
    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.demo.market import LocalMarket

    if "local" in providers:
        market = LocalMarket()
        for rec in market.list_allocations():
            if rec["state"] not in ("terminated", "lost"):
                market.terminate(market.allocation(rec["allocation_id"]))
    if "ssh" in providers:
        from jupyter_portable.compute.ssh import SshProvider

        ssh = SshProvider()
        state = ssh.state_dir / "allocations.json"
        table = json.loads(state.read_text())["allocations"] if state.exists() else {}
        for aid, rec in table.items():
            if rec.get("state") == "running":
                ssh.terminate(Allocation(aid, "ssh", rec["host"], "", rec.get("started", ""),
                                         details={"pid": rec["pid"], "remote_dir": rec["remote_dir"]}))


def make_workspace(root: Path, store: Path | str) -> Any:
    """A workspace at ``root`` with a first version in ``store`` (a folder, or a store URL)."""
    from jupyter_portable import Workspace

    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "data").mkdir(exist_ok=True)
    (root / "data" / "small.csv").write_text("a,b\n1,2\n")
    ws = Workspace.init(root, store if isinstance(store, str) else f"file://{store}")
    ws.snapshot("first", progress=None)
    return ws


async def start_session(jp_fetch: Any, path: str = "nb.ipynb") -> str:
    resp = await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": path, "type": "notebook", "name": path, "kernel": {"name": "portable"}}), request_timeout=180)
    return str(json.loads(resp.body)["kernel"]["id"])


class KernelSocket:
    """One websocket to a kernel's channels, as a notebook keeps open."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex

    async def follow_restart(self, connect: Any, timeout: float = 60) -> None:
        """What JupyterLab's kernel connection does when the server restarts its kernel: on the
        "restarting" status, open a new websocket (the server refreshes its ZMQ channels, to the
        kernel's new ports, only for a new websocket). The notebook itself stays open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("the kernel never said it was restarting")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                break
            if isinstance(raw, bytes):
                continue
            msg = json.loads(raw)
            if msg.get("msg_type") == "status" and msg["content"].get("execution_state") == "restarting":
                break
        self.ws.close()
        self.ws = await connect()
        await self.nudge()

    async def nudge(self, tries: int = 24) -> None:
        """Until the kernel's iopub answers through this websocket, as JupyterLab's connection does: a
        fresh ZMQ subscription drops what is published before it joins (a cell's first output was lost
        that way under load), so a request's idle status must arrive before any cell runs."""
        for _ in range(tries):
            try:
                await self.reply(await self.send("shell", "kernel_info_request", {}), timeout=5)
                return
            except TimeoutError:
                continue
        raise TimeoutError("the kernel's iopub never answered through the new websocket")

    async def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        """Send one message on ``channel``; its msg_id."""
        msg_id = uuid.uuid4().hex
        msg = {"header": {"msg_id": msg_id, "username": "test", "session": self.session, "msg_type": msg_type,
                          "version": "5.3", "date": ""},
               "parent_header": {}, "metadata": {}, "channel": channel, "buffers": [], "content": content}
        await self.ws.write_message(json.dumps(msg))
        return msg_id

    async def execute(self, code: str) -> str:
        """Send ``code`` to run without waiting; its msg_id (``reply`` waits)."""
        return await self.send("shell", "execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
            "stop_on_error": True})

    async def run(self, code: str, timeout: float = 120) -> tuple[str, str]:
        """Execute ``code``; (status, everything printed)."""
        return await self.reply(await self.execute(code), timeout)

    async def busy(self, msg_id: str, timeout: float = 60) -> None:
        """Wait until the kernel says it is busy with ``msg_id`` (it has the request in hand)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"the kernel never took {msg_id} within {timeout}s")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise ConnectionError("the kernel websocket closed")
            if isinstance(raw, bytes):
                continue
            msg = json.loads(raw)
            if (msg.get("parent_header", {}).get("msg_id") == msg_id and msg["msg_type"] == "status"
                    and msg["content"]["execution_state"] == "busy"):
                return

    async def reply(self, msg_id: str, timeout: float = 120) -> tuple[str, str]:
        """(status, everything printed) of the request ``msg_id``, once its reply and idle came."""
        out: list[str] = []
        status = None
        idle = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (status and idle):
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no reply to {msg_id} within {timeout}s; got {''.join(out)!r}")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise ConnectionError("the kernel websocket closed")
            if isinstance(raw, bytes):
                continue
            reply = json.loads(raw)
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = reply["msg_type"]
            content = reply["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                out.append("\n".join(content.get("traceback", [])) or content.get("evalue", ""))
            elif kind.endswith("_reply"):
                status = content.get("status", "ok")
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        return status, "".join(out)


class EventStream:
    """The server's event bus, read from its websocket (what the sidebar listens to)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []

    async def wait_for(self, pred: Any, timeout: float = 120, *, after: int = 0) -> dict[str, Any]:
        """The first event matching ``pred``, among those from the ``after``-th seen on."""
        for ev in self.seen[after:]:
            if pred(ev):
                return ev
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no such event within {timeout}s; saw {[e.get('state') for e in self.seen]}")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise ConnectionError("the event websocket closed")
            ev = json.loads(raw)
            self.seen.append(ev)
            if pred(ev):
                return ev

    def states(self) -> list[str]:
        return [e["state"] for e in self.seen if e.get("schema_id", "").endswith("/state/v1")]


def is_state(state: str) -> Any:
    return lambda ev: ev.get("schema_id", "").endswith("/state/v1") and ev.get("state") == state
