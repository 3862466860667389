"""The notebook's kernel websocket across an SSH partition (issue 42): through a real Jupyter server
with this extension, the kernel on a worker behind a real sshd reached only through SSH port forwards
(tests/partition.py). The sshd is frozen (a partition) while a cell prints; the forwards' ssh processes
end, as ssh ends them when its keepalive goes unanswered, and start again by themselves; the line the
cell printed while they were down reaches the websocket once, and every line in order
(worker/catchup.py through interfaces/serverext/kernel_socket.py). The server's own state, the one
the sidebar renders (``GET /portable/api/state``), says "unreachable since" while the partition lasts
and names the machine again after it (its loss check, every 2 s, on the wall's time; its SSH connect
timeout 2 s instead of 10 s, so that a look through the partition takes seconds)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import KernelSocket, make_workspace, release_all, start_session
from partition import CELL, forwards, gpu_sshd, in_order, partition, ssh_env
from sshd import Sshd, unavailable

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    with gpu_sshd(tmp_path) as server:
        yield server


@pytest.fixture
def jp_root_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> Iterator[Path]:
    # the server's SSH connect timeout 2 s (c.PortableSsh.connect_timeout; 10 s by default): its loss
    # check through the partition takes seconds, not 20
    for key, value in ssh_env(sshd, tmp_path, environment="image", first_machine="open",
                              ssh_connect_timeout="2").items():
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
    msg_id = await kernel.execute(CELL.format(flag=str(flag), pause=0.2))
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

    async def sidebar() -> dict[str, Any]:
        return dict(json.loads((await jp_fetch("portable", "api", "state")).body))

    reader = asyncio.ensure_future(read())
    try:
        assert await _until(lambda: "tick" in "".join(out), 60), out
        service = service_for(jp_root_dir)
        assert service is not None
        provider = service.orchestrator().providers["ssh"]
        [allocation_id] = list(provider.link._forwards)
        assert (await sidebar())["unreachable"] is None
        with partition(sshd, forwards(provider, allocation_id), kill=True) as cut:
            await asyncio.to_thread(cut.restarted, 30)
            Path(f"{flag}.during").write_text("")
            assert await _until(Path(f"{flag}.said").exists, 30)
            before = len(out)
            # the server's loss check finds no path: the sidebar's state says so, the machine still held
            shown: dict[str, Any] = {}
            deadline = asyncio.get_running_loop().time() + 30
            while not shown.get("unreachable") and asyncio.get_running_loop().time() < deadline:
                shown = await sidebar()
                await asyncio.sleep(0.2)
            assert (shown.get("unreachable") or {}).get("line", "").startswith("unreachable since "), shown
            assert shown["lifecycle"]["state"] == "ACTIVE" and shown["allocation"] is not None
        # and then the machine again, with nothing lost
        deadline = asyncio.get_running_loop().time() + 30
        while shown.get("unreachable") and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
            shown = await sidebar()
        assert shown["unreachable"] is None and shown["lifecycle"]["state"] == "ACTIVE", shown
        assert shown["lifecycle"]["allocation_id"] == allocation_id
        assert await _until(lambda: "tick" in "".join(out[before:]), 60), "no output after the partition"
        flag.write_text("")
        assert await _until(lambda: "after the partition" in "".join(out) and status, 60), out
        in_order("".join(out))
        assert status == ["ok"]
    finally:
        reader.cancel()
