"""A cloud machine's worker: installed on a bare machine by the bootstrap, over SSH from the
allocation's endpoint alone (what RunPod, Vast, Lambda, AWS and GCP hand back), its API and the
kernel reached only through SSH port forwards. The "cloud machine" is a twin machine: a real
sshd on loopback with its own host key and home, and a Python without this package."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakegpu import H100
from jupyter_e2e import make_workspace
from twins.machines import BARE_PYTHON, TwinMachine, start_machine, unavailable

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> Iterator[TwinMachine]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    from jupyter_portable.compute.keys import user_key

    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    m = start_machine(tmp_path / "machines", "m1", gpus=[H100], driver="550.54.15", cuda="12.4",
                      public_keys=[user_key().public])
    try:
        yield m
    finally:
        m.remove()


def test_a_bare_cloud_machine_gets_the_worker_by_bootstrap(machine: TwinMachine, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client import BlockingKernelClient

    from jupyter_portable.compute.base import Allocation, SshEndpoint
    from jupyter_portable.compute.keys import pin_host_key, scan_host_key
    from jupyter_portable.core.errors import LaunchFailed
    from jupyter_portable.worker.client import AgentClient, start_agent

    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    monkeypatch.delenv("JUPYTER_PORTABLE_REMOTE_PYTHON", raising=False)
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    epoch = ws.store.claim_epoch(ws.workspace_id)
    head = ws.store.read_head(ws.workspace_id)[0]
    allocation = Allocation("al-cloud1", "runpod", "pod-offer", "pod-123", "2026-11-30T10:00:00Z",
                            ssh=SshEndpoint(machine.host, machine.port, "root"))

    # no host key pinned for the allocation: it is not reached at all
    with pytest.raises(LaunchFailed, match="no host key is pinned"):
        start_agent(None, allocation, store=ws.config.store, workspace_id=ws.workspace_id, version=head.version,
                    epoch=epoch)
    presented = scan_host_key(machine.host, machine.port)
    assert presented is not None
    assert pin_host_key("al-cloud1", machine.host, machine.port, presented) == machine.host_key_fingerprint()

    # the machine's own Python cannot run the worker: the bootstrap brings it
    bare = subprocess.run([BARE_PYTHON, "-c", "import jupyter_portable.worker"], capture_output=True, text=True,
                          cwd=machine.home)
    assert bare.returncode != 0 and "No module named" in bare.stderr
    lines: list[str] = []
    rec = start_agent(None, allocation, store=ws.config.store, workspace_id=ws.workspace_id, version=head.version,
                      epoch=epoch, progress=lines.append)
    python = allocation.details["python"]
    assert python.startswith(str(machine.home / ".jupyter-portable" / "venvs")), python
    assert allocation.details["bootstrap"]["warm"] is False and allocation.details["bootstrap"]["sent"] == 3
    assert allocation.details["bootstrap"]["installed_from"] == "archive"
    assert any("sending" in line for line in lines), lines
    client = AgentClient(rec, None)
    try:
        assert client.base != f"http://127.0.0.1:{rec.port}"  # through a forward, never the agent's own port
        st = client.wait(lambda s: s["phase"] in ("ready", "failed"), timeout=60)
        assert st["phase"] == "ready", st["error"]
        assert st["verification"]["matched"] == ["version", "checkpoints", "runtime", "path"]
        assert Path(st["workdir"]) == machine.home / ".jupyter-portable" / "allocations" / "al-cloud1" / "work"
        assert Path(st["workdir"], "train.py").read_text() == "print('training')\n"
        info_ = client.start_kernel("k-cloud")
        kc = BlockingKernelClient()
        kc.load_connection_info({**info_, **client.forward_kernel(info_),
                                 "ip": "127.0.0.1"})
        # heartbeats cross an SSH port forward: on a loaded machine one can be late by more than
        # the client's default second, which it would take for a dead kernel
        kc.hb_channel.time_to_dead = 30.0
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        out: list[str] = []
        reply = kc.execute_interactive("import os, sys; print(os.environ['JUPYTER_PORTABLE_ALLOCATION'], sys.prefix)",
                                       timeout=60, output_hook=lambda m: out.append(m["content"].get("text", "")))
        assert reply["content"]["status"] == "ok"
        assert "".join(out).split() == ["al-cloud1", str(Path(python).parent.parent)]  # the kernel runs in the venv
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

    # a second machine of the same kind is warm: every wheel comes from the store, no index is asked
    from jupyter_portable.store.repo import Store
    from jupyter_portable.worker.bootstrap import bootstrap

    monkeypatch.setenv("JUPYTER_PORTABLE_WHEEL_FIND_LINKS", str(tmp_path / "nowhere"))
    second = start_machine(tmp_path / "machines", "m2", gpus=[H100], driver="550.54.15", cuda="12.4",
                           public_keys=[machine.authorized[0]])
    try:
        argv = ["ssh", "-p", str(second.port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", f"UserKnownHostsFile={tmp_path / 'kh2'}", "-o", "LogLevel=ERROR", "-i",
                str(tmp_path / "ssh-state" / "id_ed25519"), f"root@{second.host}"]

        def exec_remote(command: str, data: bytes | None, limit: float) -> tuple[int, bytes, bytes]:
            proc = subprocess.run([*argv, command], input=data or b"", capture_output=True, timeout=limit)
            return proc.returncode, proc.stdout, proc.stderr

        warm = bootstrap(exec_remote, Store.open(ws.config.store))
        # the venv laid out on the user's side, one archive, with this package's wheel and uv
        assert warm.warm_store and warm.installed_from == "archive" and warm.sent == 3 and not warm.reused_venv
        check = subprocess.run([*argv, f"{warm.python} -c 'import jupyter_portable.worker.agent; print(1)'"],
                               capture_output=True, text=True, timeout=60)
        assert check.stdout.strip() == "1", check.stderr
        again = bootstrap(exec_remote, Store.open(ws.config.store))
        assert again.reused_venv and again.sent == 0
    finally:
        second.remove()


def test_an_interpreter_under_the_remote_home_is_found(machine: TwinMachine, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``~/...`` names the machine's home: the worker starts with it (quoted, never re-read by a shell)."""
    import sys

    from jupyter_portable.compute.base import Allocation, SshEndpoint
    from jupyter_portable.compute.keys import pin_host_key, scan_host_key
    from jupyter_portable.worker.client import AgentClient, start_agent

    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    wrapper = machine.home / "my python"  # an image's Python that has this package (a venv's, so not a symlink)
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    epoch = ws.store.claim_epoch(ws.workspace_id)
    head = ws.store.read_head(ws.workspace_id)[0]
    allocation = Allocation("al-home1", "runpod", "pod-offer", "pod-9", "2026-11-30T10:00:00Z",
                            ssh=SshEndpoint(machine.host, machine.port, "root"), details={"python": "~/my python"})
    presented = scan_host_key(machine.host, machine.port)
    assert presented is not None
    pin_host_key("al-home1", machine.host, machine.port, presented)
    rec = start_agent(None, allocation, store=ws.config.store, workspace_id=ws.workspace_id, version=head.version,
                      epoch=epoch)
    client = AgentClient(rec, None)
    try:
        st = client.wait(lambda s: s["phase"] in ("ready", "failed"), timeout=60)
        assert st["phase"] == "ready", st["error"]
        assert "bootstrap" not in allocation.details  # the named Python had the package: nothing installed
    finally:
        client.shutdown()
        client.close()
