"""The host's ``python`` setting reaches the remote shell quoted, against a real sshd on loopback.

It names an interpreter: a path with a space in it works, ``~/`` is the remote home, and
shell syntax is refused before anything runs there (it used to run as a second command).
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import kill_worker_group
from sshd import Sshd, running_sshd, unavailable

from jupyter_portable.compute.base import Allocation, SshEndpoint
from jupyter_portable.compute.hosts import ENV_HOSTS
from jupyter_portable.compute.ssh import ENV_STATE, SshProvider
from jupyter_portable.core.errors import UsageError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with running_sshd(tmp_path_factory.mktemp("sshd") / "server") as server:
        yield server


def _provider(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python: str) -> SshProvider:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f"""
[[host]]
name = "box"
host = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
key = "{sshd.client_key}"
workdir = "{tmp_path / 'remote'}"
python = {json.dumps(python)}

[host.labels]
gpu = "NVIDIA H100 80GB HBM3"
gpu_memory_gb = 80
""")
    monkeypatch.setenv(ENV_HOSTS, str(hosts))
    monkeypatch.setenv(ENV_STATE, str(tmp_path / "state"))
    return SshProvider(connect_timeout=5, stale_after=3)


@pytest.fixture
def no_workers_left(tmp_path: Path) -> Iterator[None]:
    yield
    for rec_dir in (tmp_path / "remote" / "allocations").glob("*"):
        agent = rec_dir / "agent.json"
        if agent.exists():
            kill_worker_group(agent)


def _probe(provider: SshProvider, tmp_path: Path, state: str = "lost") -> str:
    """Run the status script with the host's python: its reason says whether the python ran. A
    worker whose process is gone is lost; a status script the host could not run is no evidence
    of a loss (issue 42: ``unknown``)."""
    gone = Allocation("a1", "ssh", "box", "box:1", "2024-01-01T00:00:00Z", ssh=SshEndpoint("127.0.0.1", 22),
                      details={"pid": 2**22 + 1, "remote_dir": str(tmp_path / "nowhere")})
    status = provider.status(gone)
    assert status.state == state
    return status.reason or ""


def test_shell_syntax_in_python_is_refused_and_never_runs_on_the_host(
        sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_workers_left: None) -> None:
    marker = tmp_path / "injected"
    provider = _provider(sshd, tmp_path, monkeypatch, f"python3; touch {marker}")
    [offer] = provider.offers()
    with pytest.raises(UsageError, match="is not the path or name of a Python interpreter") as info:
        provider.launch(offer, allocation_id="alloc-inject")
    assert "hosts.toml" in (info.value.hint or "")
    assert "not the path or name" in _probe(provider, tmp_path, state="unknown")
    assert not marker.exists()
    assert provider.check_capacity(offer) == 1  # the refused launch did not take the host


def test_a_python_path_with_a_space_and_one_under_home_run(sshd: Sshd, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spaced = tmp_path / "py dir"
    spaced.mkdir()
    os.symlink("/usr/bin/python3", spaced / "python3")
    provider = _provider(sshd, tmp_path, monkeypatch, str(spaced / "python3"))
    assert "the worker process is gone" in _probe(provider, tmp_path)

    home = Path(pwd.getpwnam(sshd.user).pw_dir)
    link = home / f".jp-test-python-{os.getpid()}"
    os.symlink("/usr/bin/python3", link)
    try:
        provider = _provider(sshd, tmp_path, monkeypatch, f"~/{link.name}")
        assert "the worker process is gone" in _probe(provider, tmp_path)
    finally:
        link.unlink()
