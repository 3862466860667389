"""A cloud machine's worker: bootstrapped over SSH from the allocation's endpoint alone (what
RunPod, Vast, Lambda, AWS and GCP hand back), its API and the kernel reached only through SSH
port forwards. The "cloud machine" is a real sshd on loopback."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakegpu import H100, install_fake_nvidia_smi
from jupyter_e2e import make_workspace
from sshd import Sshd, running_sshd, unavailable

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cloud-sshd")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir, [H100], driver="550.54.15", cuda="12.4")
    with running_sshd(root / "server", path_prefix=[bin_dir]) as server:
        yield server


def test_a_cloud_machine_runs_the_worker_over_ssh(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                   ) -> None:
    from jupyter_client import BlockingKernelClient

    from jupyter_portable.compute.base import Allocation, SshEndpoint
    from jupyter_portable.core.errors import LaunchFailed
    from jupyter_portable.worker.client import AgentClient, start_agent

    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_KEY", str(sshd.client_key))
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    monkeypatch.setenv("JUPYTER_PORTABLE_REMOTE_WORKDIR", str(tmp_path / "remote"))
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    epoch = ws.store.claim_epoch(ws.workspace_id)
    head = ws.store.read_head(ws.workspace_id)[0]
    allocation = Allocation("al-cloud1", "runpod", "pod-offer", "pod-123", "2026-11-30T10:00:00Z",
                            ssh=SshEndpoint("127.0.0.1", sshd.port, sshd.user))

    # the image's Python has no jupyter-portable: a clear refusal, naming the fix
    monkeypatch.setenv("JUPYTER_PORTABLE_REMOTE_PYTHON", "/usr/bin/python3")
    with pytest.raises(LaunchFailed) as info:
        start_agent(None, allocation, store=ws.config.store, workspace_id=ws.workspace_id, version=head.version,
                    epoch=epoch)
    assert "not installed" in str(info.value) and "JUPYTER_PORTABLE_REMOTE_PYTHON" in (info.value.hint or "")

    monkeypatch.setenv("JUPYTER_PORTABLE_REMOTE_PYTHON", sys.executable)
    rec = start_agent(None, allocation, store=ws.config.store, workspace_id=ws.workspace_id, version=head.version,
                      epoch=epoch)
    client = AgentClient(rec, None)
    try:
        assert client.base != f"http://127.0.0.1:{rec.port}"  # through a forward, never the agent's own port
        st = client.wait(lambda s: s["phase"] in ("ready", "failed"), timeout=60)
        assert st["phase"] == "ready", st["error"]
        assert st["verification"]["matched"] == ["version", "checkpoints", "runtime", "path"]
        assert Path(st["workdir"]) == tmp_path / "remote" / "allocations" / "al-cloud1" / "work"
        assert Path(st["workdir"], "train.py").read_text() == "print('training')\n"
        info_ = client.start_kernel("k-cloud")
        kc = BlockingKernelClient()
        kc.load_connection_info({**info_, **{p: client.forward(int(info_[p])) for p in
                                             ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")},
                                 "ip": "127.0.0.1"})
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION'])", timeout=60)
        assert reply["content"]["status"] == "ok"
        kc.stop_channels()
        snap = client.snapshot("from the cloud machine")
        assert snap["version"] >= head.version
    finally:
        client.shutdown()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.status(timeout=1)
            except Exception:
                break
            time.sleep(0.2)
        client.close()
