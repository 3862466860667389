"""Kernels get only what they need (issue 28, item 4): what environment reaches a worker and
its kernel is an allow-list (core/secretenv.py), and a variable gets there on purpose only when
it is named in ``JUPYTER_PORTABLE_PASS_ENV`` (``c.Portable.pass_env``).

Two real machines: a local-market worker started from the user's side (whose environment holds
the user's secrets, of kinds a deny-list missed: the project's own Azure key, ``PGPASSWORD``,
any ``*_KEY``, a connection URL, a name no list foresaw), and a worker on a real sshd whose
sessions carry the machine's own. Each kernel's, worker's and machine process's
``/proc/PID/environ`` is read: none holds them; what was passed on purpose is there."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakegpu import H100, install_fake_nvidia_smi
from jupyter_e2e import make_workspace, portable_env, release_all
from sshd import Sshd, running_sshd, unavailable

from jupyter_portable import Workspace
from jupyter_portable.orchestration.orchestrator import Orchestrator

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/PID/environ")]

# what a careless user's shell holds: names a deny-list did not know
USER_SECRETS = {"AZURE_STORAGE_ACCOUNT_KEY": "az-user-key-1", "PGPASSWORD": "pg-user-pw-2",
                "OPENAI_KEY": "openai-user-3", "DATABASE_URL": "postgres://me:db-user-pw-4@db/prod",
                "ACME_SIGNING_SEED": "unforeseen-user-5", "AWS_ACCESS_KEY_ID": "AKIAUSER000000000006"}
# what a rented machine's own environment holds (sshd's SetEnv takes no spaces)
MACHINE_SECRETS = {"PGPASSWORD": "pg-machine-7", "AZURE_STORAGE_ACCOUNT_KEY": "az-machine-8",
                   "RUNPOD_API_KEY": "rp-machine-9", "OPENAI_KEY": "openai-machine-10",
                   "ACME_SIGNING_SEED": "unforeseen-machine-11"}


def _environ(pid: int) -> tuple[dict[str, str], bytes]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(i.split("=", 1) for i in raw.decode(errors="replace").split("\0") if "=" in i), raw


def _kernel_pid(worker_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if ppid == worker_pid and b"ipykernel" in cmdline:
                return int(entry.name)
    raise AssertionError("the kernel did not start")


def _assert_none_of(secrets: dict[str, str], pid: int, what: str) -> dict[str, str]:
    env, raw = _environ(pid)
    for name, value in secrets.items():
        assert name not in env, f"{what} has {name}"
        assert value.encode() not in raw, f"{what} holds the value of {name}"
    return env


def test_a_local_workers_kernel_gets_none_of_the_users_secrets_and_what_is_passed_on_purpose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = portable_env(tmp_path, monkeypatch)
    for name, value in USER_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_API_KEY", "wandb-on-purpose")
    monkeypatch.setenv("JUPYTER_PORTABLE_PASS_ENV", "WANDB_API_KEY, NOT_SET_ANYWHERE")
    make_workspace(tmp_path / "ws", dirs["store"])
    orch = Orchestrator(Workspace.find(tmp_path / "ws"))
    try:
        assert orch.continue_()["state"] == "ACTIVE"
        client = orch.client()
        client.start_kernel("k-env")
        rec = client.record
        kernel = _assert_none_of(USER_SECRETS, _kernel_pid(rec.pid), "the kernel")
        _assert_none_of(USER_SECRETS, rec.pid, "the worker agent")
        _assert_none_of(USER_SECRETS, int(rec.allocation.details["pid"]), "the machine's process")
        assert kernel["WANDB_API_KEY"] == "wandb-on-purpose" and "NOT_SET_ANYWHERE" not in kernel
        assert kernel["HOME"] and kernel["PATH"]  # what a process needs still gets there
        orch.stop()
    finally:
        orch.close()
        release_all()


# allowed names whose values carry the user's credentials in a URL (issue 40, item 4)
URL_SECRETS = {"PIP_INDEX_URL": ("https://me:idx-user-pw-12@pypi.example/simple", "https://pypi.example/simple"),
               "UV_EXTRA_INDEX_URL": ("https://a.example/simple https://me:uv-user-pw-13@b.example/simple",
                                      "https://a.example/simple https://b.example/simple"),
               "HTTPS_PROXY": ("http://me:proxy-user-pw-14@proxy.example:3128", "http://proxy.example:3128")}


def test_credentials_in_an_index_url_or_a_proxy_do_not_reach_a_local_workers_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The allow-list let ``*_INDEX_URL`` and ``HTTPS_PROXY`` through whole, with the user's token in
    their URLs: the kernel held it. They still arrive (the kernel's pip and proxy work), without their
    ``user:password@``; a variable named in pass_env on purpose arrives as it is."""
    dirs = portable_env(tmp_path, monkeypatch)
    for name, (value, _) in URL_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://me:extra-on-purpose@c.example/simple")
    monkeypatch.setenv("JUPYTER_PORTABLE_PASS_ENV", "PIP_EXTRA_INDEX_URL")
    make_workspace(tmp_path / "ws", dirs["store"])
    orch = Orchestrator(Workspace.find(tmp_path / "ws"))
    try:
        assert orch.continue_()["state"] == "ACTIVE"
        client = orch.client()
        client.start_kernel("k-urls")
        rec = client.record
        for pid, what in ((_kernel_pid(rec.pid), "the kernel"), (rec.pid, "the worker agent"),
                          (int(rec.allocation.details["pid"]), "the machine's process")):
            env, raw = _environ(pid)
            for name, (value, stripped) in URL_SECRETS.items():
                password = value.split("@")[0].rsplit(":", 1)[1]
                assert password.encode() not in raw, f"{what} holds the password in {name}"
                assert env[name] == stripped, (what, name)
        # passed on purpose: over stdin to the worker, which gives it to its kernel as it is
        kernel, _ = _environ(_kernel_pid(rec.pid))
        assert kernel["PIP_EXTRA_INDEX_URL"] == "https://me:extra-on-purpose@c.example/simple"
        orch.stop()
    finally:
        orch.close()
        release_all()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_fake_nvidia_smi(bin_dir, [H100], driver="550.54.15", cuda="12.4")
    with running_sshd(tmp_path / "sshd", path_prefix=[bin_dir],
                      env={**MACHINE_SECRETS, "IMAGE_SETTING": "kept-by-name", "CUDA_VISIBLE_DEVICES": "0"}) as server:
        yield server


def test_a_worker_on_an_ssh_host_drops_the_machines_own_secrets_before_its_kernel_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f"""[[host]]
name = "box"
host = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
key = "{sshd.client_key}"
python = "{sys.executable}"
workdir = "{tmp_path / 'remote'}"

[host.labels]
gpu = "NVIDIA H100 80GB HBM3"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.0
""")
    monkeypatch.setenv("JUPYTER_PORTABLE_HOSTS", str(hosts))
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "ssh")
    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-on-purpose")
    monkeypatch.setenv("JUPYTER_PORTABLE_PASS_ENV", "WANDB_API_KEY IMAGE_SETTING")
    make_workspace(tmp_path / "ws", tmp_path / "store")
    orch = Orchestrator(Workspace.find(tmp_path / "ws"))
    try:
        assert orch.continue_()["state"] == "ACTIVE"
        client = orch.client()
        client.start_kernel("k-env")
        rec = client.record
        kernel = _assert_none_of(MACHINE_SECRETS, _kernel_pid(rec.pid), "the kernel")
        _assert_none_of(MACHINE_SECRETS, rec.pid, "the worker agent")
        # nor the allocation's stub, started over SSH (same user as the kernel, so readable by it)
        stub = _assert_none_of(MACHINE_SECRETS, int(rec.allocation.details["pid"]), "the machine's stub")
        assert "IMAGE_SETTING" not in stub and stub["CUDA_VISIBLE_DEVICES"] == "0" and stub["PATH"]
        assert kernel["WANDB_API_KEY"] == "wandb-on-purpose"  # sent by the user's side, on purpose
        assert kernel["IMAGE_SETTING"] == "kept-by-name"  # the machine's own, named on purpose
        assert kernel["CUDA_VISIBLE_DEVICES"] == "0"  # the GPU's settings are allowed
        orch.stop()
    finally:
        orch.close()
        release_all(("ssh",))


def test_the_local_admission_probe_runs_the_machines_nvidia_smi_with_none_of_the_users_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe that admits a local-market machine runs that machine's own ``nvidia-smi``
    (its ``bin`` first on PATH): a machine's program, so it gets the allow-list too."""
    from jupyter_portable.compute.admission import local_runner
    from jupyter_portable.compute.base import Allocation

    for name, value in USER_SECRETS.items():
        monkeypatch.setenv(name, value)
    bin_dir, seen = tmp_path / "bin", tmp_path / "seen-environ"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat /proc/$$/environ > '{seen}'\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    machine = Allocation(allocation_id="al-probe1", provider="local", offer_id="x", ref="0",
                         started="2030-01-01T00:00:00Z",
                         details={"dir": str(tmp_path), "bin": str(bin_dir), "work": str(tmp_path), "local": True})
    rc, out, _err = local_runner(machine)(["nvidia-smi"])
    assert (rc, out.strip()) == (6, "No devices were found")
    raw = seen.read_bytes()
    env = dict(i.split("=", 1) for i in raw.decode(errors="replace").split("\0") if "=" in i)
    for name, value in USER_SECRETS.items():
        assert name not in env and value.encode() not in raw, name
    assert env["PATH"].split(":")[0] == str(bin_dir) and env["HOME"]
