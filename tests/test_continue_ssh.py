"""Continue over SSH, end to end: the worker agent started on a real sshd on loopback, its API
and the notebook's kernel reached only through SSH port forwards, the host's machine lost, and
the same kernel id running its next cell on a second host on the files read back."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import EventStream, KernelSocket, is_state, make_workspace, release_all, start_session
from partition import gpu_sshd, ssh_env
from sshd import Sshd, unavailable

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with gpu_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> Iterator[dict[str, Path]]:
    # two hosts on the one sshd, box1 the cheaper; the session opened rents the first machine
    for key, value in ssh_env(sshd, tmp_path, hosts=(("box1", 1.0), ("box2", 2.0)), first_machine="open").items():
        monkeypatch.setenv(key, value)
    yield {"store": tmp_path / "store", "remote": tmp_path}
    release_all(("ssh",))


@pytest.fixture
def jp_root_dir(tmp_path: Path, env: dict[str, Path]) -> Path:
    root = tmp_path / "workspace"
    make_workspace(root, env["store"])
    return root


async def test_continue_over_ssh(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path,
                                 env: dict[str, Path]) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.worker.client import load_record

    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert state["lifecycle"]["state"] == "ACTIVE" and state["allocation"]["provider"] == "ssh"
    first = state["lifecycle"]["allocation_id"]
    assert state["allocation"]["offer"] == "box1"
    rec = load_record(Workspace.find(jp_root_dir).copy, first)
    assert rec is not None and rec.allocation.ssh is not None
    # the token stays on this machine, never in the store
    store_bytes = b"".join(p.read_bytes() for p in env["store"].rglob("*") if p.is_file())
    assert rec.token.encode() not in store_bytes

    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; open('made-on-box1.txt','w').write('from box1');"
                                   "print(os.environ['JUPYTER_PORTABLE_ALLOCATION'], os.getcwd())")
    assert status == "ok", out
    assert out.split()[0] == first and "remote-box1" in out.split()[1]
    snap = json.loads((await jp_fetch("portable", "api", "snapshot", method="POST",
                                      body='{"message": "from the worker"}')).body)
    assert snap["changed"] is True

    # the machine dies: its process on the host is killed
    os.kill(int(rec.allocation.details["pid"]), signal.SIGKILL)
    lost = await events.wait_for(is_state("LOST"), timeout=90)
    assert lost["allocation_id"] == first

    mark = len(events.seen)
    await jp_fetch("portable", "api", "continue", method="POST", body="{}")
    await events.wait_for(is_state("ACTIVE"), timeout=150, after=mark)
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    second = state["lifecycle"]["allocation_id"]
    assert second != first and state["allocation"]["provider"] == "ssh"
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION']);"
                                   "print(open('made-on-box1.txt').read())", timeout=60)
    assert status == "ok", out
    assert out.split() == [second, "from", "box1"]
