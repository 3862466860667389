"""The notebook's kernel websocket across an SSH partition (issue 42): through a real Jupyter server
with this extension, the kernel on a worker behind a real sshd reached only through SSH port forwards.
The sshd is frozen (a partition) while a cell prints; the forwards' ssh processes end, as ssh ends
them when its keepalive goes unanswered, and start again by themselves; the line the cell printed
while they were down reaches the websocket once, and every line in order (worker/catchup.py through
interfaces/serverext/kernel_socket.py)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakegpu import H100, install_fake_nvidia_smi
from jupyter_e2e import KernelSocket, make_workspace, release_all, start_session
from sshd import Sshd, partitioned, running_sshd, unavailable

from jupyter_portable.compute.hosts import ENV_HOSTS
from jupyter_portable.compute.ssh import ENV_STATE

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

HOST = """
[[host]]
name = "box"
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
driver = "550.54.15"
cuda = "12.4"
region = "loopback"
price_per_hour = 1.0
"""

CELL = """
import os, time
n = 0
while not os.path.exists({flag!r}):
    n += 1
    print("tick", n, flush=True)
    if os.path.exists({flag!r} + ".during") and not os.path.exists({flag!r} + ".said"):
        print("during the partition", flush=True)
        open({flag!r} + ".said", "w").close()
    time.sleep(0.2)
print("after the partition", flush=True)
"""


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir, [H100], driver="550.54.15", cuda="12.4")
    with running_sshd(tmp_path / "server", path_prefix=[bin_dir]) as server:
        yield server


@pytest.fixture
def jp_root_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> Iterator[Path]:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(HOST.format(port=sshd.port, user=sshd.user, key=sshd.client_key, python=sys.executable,
                                 workdir=tmp_path / "remote"))
    for key, value in {ENV_HOSTS: str(hosts), ENV_STATE: str(tmp_path / "ssh-state"),
                       "JUPYTER_PORTABLE_PROVIDERS": "ssh", "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"),
                       "JUPYTER_PORTABLE_ENVIRONMENT": "image", "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
                       "JUPYTER_PORTABLE_FIRST_MACHINE": "open"}.items():
        monkeypatch.setenv(key, value)
    root = tmp_path / "workspace"
    make_workspace(root, tmp_path / "store")
    yield root
    release_all(("ssh",))


async def _until(done: Any, limit: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not done():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_what_a_cell_prints_during_a_partition_reaches_the_websocket_once_and_in_order(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, sshd: Sshd, tmp_path: Path) -> None:
    from jupyter_portable.orchestration.monitor import service_for

    kernel_id = await start_session(jp_fetch)
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    await kernel.nudge()
    flag = tmp_path / "go-on"
    msg_id = await kernel.execute(CELL.format(flag=str(flag)))
    out: list[str] = []
    status: list[str] = []

    async def read() -> None:
        while True:
            raw = await kernel.ws.read_message()
            if raw is None:
                return
            if isinstance(raw, bytes):
                continue
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "execute_reply":
                status.append(msg["content"]["status"])

    reader = asyncio.ensure_future(read())
    try:
        assert await _until(lambda: "tick" in "".join(out), 60), out
        service = service_for(jp_root_dir)
        assert service is not None
        [allocation_id] = list(service.orchestrator().providers["ssh"].link._forwards)
        tunnels = [close.__self__ for close in service.orchestrator().providers["ssh"].link._forwards[allocation_id]]
        with partitioned(sshd):
            for tunnel in tunnels:  # what ssh does once its keepalive goes unanswered: it ends
                tunnel._proc.kill()
            assert await _until(lambda: all(t.restarts >= 1 for t in tunnels), 30), [t.restarts for t in tunnels]
            Path(f"{flag}.during").write_text("")
            assert await _until(Path(f"{flag}.said").exists, 30)
            before = len(out)
            await asyncio.sleep(1.0)  # the cell goes on printing; none of it can come through
        assert await _until(lambda: "tick" in "".join(out[before:]), 60), "no output after the partition"
        flag.write_text("")
        assert await _until(lambda: "after the partition" in "".join(out) and status, 60), out
        text = "".join(out)
        assert text.count("during the partition") == 1, text
        ticks = [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]
        assert ticks == list(range(1, len(ticks) + 1)), ticks
        assert status == ["ok"]
    finally:
        reader.cancel()
