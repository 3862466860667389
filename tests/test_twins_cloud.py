"""AWS and Google Cloud reach a bare machine, through the real providers and their twins.

Each test launches with the user's key and a host key made for the machine, waits for the
provider's own endpoint (public IP, port 22), logs in with ``StrictHostKeyChecking=yes`` and a
``known_hosts`` holding only the pinned key (so the host key can only have come from the
launch's user data), then terminates and sees the machine gone. Every server is on loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from sshd import keygen, unavailable
from twins.aws import SPOT_INTERRUPTION, AwsTwin
from twins.gcp import GcpOffer, GcpTwin
from twins.machines import CLOUD_USER, require_python

from jupyter_portable.compute.aws import DLAMI_IMAGE, AwsProvider
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider
from jupyter_portable.compute.gcp import ALLOCATION_LABEL, DLVM_IMAGE, WORKSPACE_LABEL, GcpProvider
from jupyter_portable.compute.keys import host_key_pair as new_host_key
from jupyter_portable.core.offers import Offer

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")

CIDR = "198.51.100.7/32"


def never_asked() -> str:
    raise AssertionError("checkip.amazonaws.com must not be asked when JUPYTER_PORTABLE_SSH_CIDR is set")


def wait_reachable(provider: Provider, alloc: Allocation) -> AllocationStatus:
    """Poll status() as acquire does; 400 polls of 50 ms bound it on a loaded machine."""
    seen = []
    for _ in range(400):
        status = provider.status(alloc)
        seen.append(status.state)
        if status.state == "reachable":
            assert status.ssh is not None
            return status
        assert status.state in ("pending", "running"), status
        time.sleep(0.05)
    raise AssertionError(f"never reachable: {seen[-5:]}")


def ssh(key: Path, status: AllocationStatus, known_hosts: Path, command: str) -> subprocess.CompletedProcess[str]:
    assert status.ssh is not None
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(status.ssh.port), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
         f"{status.ssh.user}@{status.ssh.host}", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def pinned(tmp_path: Path, name: str, status: AllocationStatus, public_line: str) -> Path:
    assert status.ssh is not None
    path = tmp_path / name
    host = status.ssh.host if status.ssh.port == 22 else f"[{status.ssh.host}]:{status.ssh.port}"
    path.write_text(f"{host} {public_line}\n")
    return path


def machine_gone(twin: Any, ref: str) -> bool:
    machine = twin.machines[ref]
    return not machine.alive() and not machine.processes()


# -- AWS ----------------------------------------------------------------------------------------

def test_aws_machine_is_reached_with_the_imported_key_and_the_pinned_host_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keygen(tmp_path / "user_ed25519")
    public = key.with_suffix(".pub").read_text().strip()
    offer = Offer(provider="aws", id="g5.xlarge@us-east-1a:spot", gpu="A10G", gpu_count=1, gpu_memory_gb=24,
                  price_per_hour=0.41, region="us-east-1", spot=True)
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.3) as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        first, second = new_host_key(), new_host_key()
        provider = AwsProvider(caller_address=never_asked, **twin.provider_kwargs())
        one = provider.launch(offer, allocation_id="alloc-1", ssh_public_key=public, host_key=first,
                              env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-42"})
        # a second provider (a new session) finds the key pair and the group instead of making them
        again = AwsProvider(caller_address=never_asked)
        two = again.launch(offer, allocation_id="alloc-2", ssh_public_key=public, host_key=second)

        assert one.details["host_key"] == first[1] and two.details["host_key"] == second[1]
        for alloc in (one, two):
            assert "PRIVATE KEY" not in json.dumps(alloc.to_json())  # the private half only in the user data
        s1, s2 = wait_reachable(provider, one), wait_reachable(again, two)
        assert s1.ssh is not None and s2.ssh is not None
        assert (s1.ssh.port, s1.ssh.user) == (22, "ubuntu") and s1.ssh.host != s2.ssh.host
        ec2 = boto3.client("ec2")
        described = {i["InstanceId"]: i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
        assert described[one.ref]["PublicIpAddress"] == s1.ssh.host  # EC2's own answer, used as it is
        # a shutdown from the machine ends its billing (the guardian's means, issue 42)
        assert twin.instance(one.ref).instance_initiated_shutdown_behavior == "terminate"

        # the pinned key, and only it, lets the client in: the machine runs the user data's host key
        out = ssh(key, s1, pinned(tmp_path, "kh1", s1, first[1]), "echo $TWIN_MACHINE; nvidia-smi --query-gpu=name "
                  "--format=csv,noheader; python3 -c 'import jupyter_portable' 2>&1 | tail -1")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0] == one.ref and lines[1] == "NVIDIA A10G" and "ModuleNotFoundError" in lines[2]
        wrong = ssh(key, s1, pinned(tmp_path, "kh-wrong", s1, second[1]), "true")
        assert wrong.returncode == 255 and "Host key verification failed" in wrong.stderr
        assert ssh(key, s2, pinned(tmp_path, "kh2", s2, second[1]), "true").returncode == 0
        stranger = keygen(tmp_path / "stranger")
        assert ssh(stranger, s1, pinned(tmp_path, "kh1b", s1, first[1]), "true").returncode == 255

        # one key pair, imported once and tagged; one group, 22/tcp open to the CIDR alone
        pairs = ec2.describe_key_pairs()["KeyPairs"]
        assert [p["KeyName"] for p in pairs] == [one.details["key_name"]] == [two.details["key_name"]]
        assert pairs[0]["KeyName"].startswith("jupyter-portable-")
        assert {"Key": "jupyter-portable:purpose", "Value": "ssh"} in pairs[0]["Tags"]
        groups = ec2.describe_security_groups(Filters=[{"Name": "tag:jupyter-portable:purpose",
                                                        "Values": ["ssh"]}])["SecurityGroups"]
        assert len(groups) == 1 and groups[0]["GroupName"] == "jupyter-portable-ssh"
        assert [(r["IpProtocol"], r["FromPort"], r["ToPort"], [x["CidrIp"] for x in r["IpRanges"]])
                for r in groups[0]["IpPermissions"]] == [("tcp", 22, 22, [CIDR])]
        for alloc in (one, two):
            instance = described[alloc.ref]
            assert instance["KeyName"] == pairs[0]["KeyName"]
            assert [g["GroupId"] for g in instance["SecurityGroups"]] == [groups[0]["GroupId"]]
        tags = {t["Key"]: t["Value"] for t in described[one.ref]["Tags"]}
        assert tags["jupyter-portable:allocation"] == "alloc-1" and tags["jupyter-portable:workspace"] == "ws-42"

        # from elsewhere (no CIDR set): checkip's address is added to the same group, the old one kept
        monkeypatch.delenv("JUPYTER_PORTABLE_SSH_CIDR")
        moved = AwsProvider(caller_address=lambda: "203.0.113.9\n")
        three = moved.launch(offer, allocation_id="alloc-3", ssh_public_key=public)
        group = ec2.describe_security_groups(GroupIds=[groups[0]["GroupId"]])["SecurityGroups"][0]
        assert sorted(x["CidrIp"] for r in group["IpPermissions"] for x in r["IpRanges"]) == [CIDR, "203.0.113.9/32"]
        assert three.details["security_group_ids"] == [groups[0]["GroupId"]]

        # terminate: the machine is gone; a spot interruption: lost with EC2's reason
        provider.terminate(one)
        assert machine_gone(twin, one.ref)
        assert provider.status(one).state == "terminated" and one.ref not in twin.running()
        twin.kill(two.ref, "EC2 reclaimed the spot capacity")
        lost = again.status(two)
        assert lost.state == "lost" and SPOT_INTERRUPTION in (lost.reason or "") and machine_gone(twin, two.ref)
        assert twin.errors == []


# -- Google Cloud ----------------------------------------------------------------------------------

def test_gcp_machine_is_reached_with_the_metadata_key_and_the_pinned_host_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = keygen(tmp_path / "user_ed25519")
    public = key.with_suffix(".pub").read_text().strip()
    # the project turns OS Login on (enable-oslogin=TRUE in its metadata): the VM's own metadata turns
    # it off, so the key in ssh-keys logs in (issue 42)
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.3, os_login="project") as twin:
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider(**twin.provider_kwargs())
        offers = {o.id: o for o in provider.offers()}
        offer = offers["g2-standard-4@us-central1-a:spot"]
        provider.check_permission(offer)
        host_key = new_host_key()
        alloc = provider.launch(offer, allocation_id="alloc-1", ssh_public_key=public, host_key=host_key,
                                env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-42"})
        assert alloc.details["host_key"] == host_key[1] and "PRIVATE KEY" not in json.dumps(alloc.to_json())

        status = wait_reachable(provider, alloc)
        assert status.ssh is not None and (status.ssh.port, status.ssh.user) == (22, "ubuntu")
        vm = twin.vms[alloc.ref].resource
        assert vm.labels[ALLOCATION_LABEL] == "alloc-1" and vm.labels[WORKSPACE_LABEL] == "ws-42"
        metadata = {item.key: item.value for item in vm.metadata.items}
        assert metadata["ssh-keys"] == f"ubuntu:{public}" and metadata["enable-oslogin"] == "FALSE"
        assert "set_host_keys = false" in metadata["user-data"]  # the guest agent keeps the pinned key

        out = ssh(key, status, pinned(tmp_path, "kh", status, host_key[1]),
                  "echo $TWIN_MACHINE; nvidia-smi --query-gpu=name --format=csv,noheader")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [alloc.ref.split("/")[1], "NVIDIA L4"]
        wrong = ssh(key, status, pinned(tmp_path, "kh-wrong", status, new_host_key()[1]), "true")
        assert wrong.returncode == 255 and "Host key verification failed" in wrong.stderr

        provider.terminate(alloc)
        assert machine_gone(twin, alloc.ref) and twin.running() == []
        assert provider.status(alloc).state == "terminated"
        assert twin.errors == []


def test_gcp_where_an_organization_requires_os_login_the_refused_login_is_named_and_the_vm_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.compute.acquire import acquire
    from jupyter_portable.core.errors import NoCapacity
    from jupyter_portable.core.offers import Requirements

    key = keygen(tmp_path / "user_ed25519")
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1, os_login="required") as twin:
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        for name, value in {**twin.env(), "JUPYTER_PORTABLE_SSH_KEY": str(key),
                            "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh-state")}.items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider(**twin.provider_kwargs())
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        with pytest.raises(NoCapacity) as failed:
            acquire([offer], {"gcp": provider}, Requirements(), allocation_id_factory=lambda: "al-oslogin1",
                    ssh_public_key=key.with_suffix(".pub").read_text(), boot_timeout_s=120, poll_interval_s=0.2,
                    poll_max_s=0.5)
        [attempt] = failed.value.context["attempts"]
        assert "refused the login" in attempt.reason and "constraints/compute.requireOsLogin" in attempt.reason, \
            attempt.reason
        assert twin.running() == [] and twin.errors == []  # the VM that no key could log in to was released


def test_gcp_guest_agent_replaces_the_pinned_host_key_unless_the_user_data_told_it_not_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the twin, as on Google's images, the guest agent runs after cloud-init and generates new host
    keys on a VM's first boot: the pin holds only because the launch's user data writes the agent's
    ``set_host_keys = false`` before it runs. A launch whose user data leaves it on gets the agent's key
    (published as a guest attribute), and the pinned login refuses that machine."""
    from jupyter_portable.compute import gcp

    key = keygen(tmp_path / "user_ed25519")
    public = key.with_suffix(".pub").read_text().strip()
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.2) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider()
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        mine = new_host_key()
        kept = provider.launch(offer, allocation_id="alloc-kept", ssh_public_key=public, host_key=mine)
        # the same launch, but the agent's configuration left as the image has it (host keys on)
        monkeypatch.setattr(gcp, "_GUEST_AGENT_CONFIG", {**gcp._GUEST_AGENT_CONFIG,
                                                          "content": "[InstanceSetup]\nset_host_keys = true\n"})
        theirs = new_host_key()
        replaced = provider.launch(offer, allocation_id="alloc-replaced", ssh_public_key=public, host_key=theirs)
        s1, s2 = wait_reachable(provider, kept), wait_reachable(provider, replaced)

        assert ssh(key, s1, pinned(tmp_path, "kh1", s1, mine[1]), "true").returncode == 0
        assert twin.vms[kept.ref].guest_attributes == {}  # the agent left the keys alone
        refused = ssh(key, s2, pinned(tmp_path, "kh2", s2, theirs[1]), "true")
        assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
        published = twin.vms[replaced.ref].guest_attributes["hostkeys/ssh-ed25519"]
        assert published != theirs[1].split()[1]
        agents = ssh(key, s2, pinned(tmp_path, "kh3", s2, f"ssh-ed25519 {published}"), "true")
        assert agents.returncode == 0, agents.stderr  # the machine presents the agent's key
        for alloc in (kept, replaced):
            provider.terminate(alloc)
        assert twin.errors == []


def test_gcp_preemption_is_lost_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider()
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        alloc = provider.launch(offer, allocation_id="alloc-9", ssh_public_key=keygen(tmp_path / "k").with_suffix(
            ".pub").read_text())
        wait_reachable(provider, alloc)
        twin.kill(alloc.ref, "Instance was preempted.")
        lost = provider.status(alloc)
        assert lost.state == "lost" and "preempted" in (lost.reason or "") and machine_gone(twin, alloc.ref)
        assert twin.running() == []


def test_aws_twin_lists_permits_and_runs_out_like_ec2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.core.errors import NoCapacity

    with AwsTwin(tmp_path / "aws", offers={"g5.xlarge": {"gpu": "NVIDIA A10G", "memory_mb": 24576, "stock": 0}},
                 boot_delay_s=0.1) as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = AwsProvider(caller_address=never_asked)
        offer = {o.id: o for o in provider.offers()}["g5.xlarge@us-east-1a"]
        provider.check_permission(offer)  # EC2's DryRunOperation
        with pytest.raises(NoCapacity):
            provider.launch(offer, allocation_id="alloc-1",
                            ssh_public_key=keygen(tmp_path / "k").with_suffix(".pub").read_text())
        assert twin.running() == []


# -- the machines: the image's Python, the image's user ---------------------------------------------

def python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                          text=True, check=True).stdout.strip()


WHO = ("id -un; sudo -n id -un 2>/dev/null || echo no-sudo; "
       "python3 -c 'import platform; print(platform.python_version())'")


def test_an_aws_machine_has_its_amis_python_and_logs_in_as_ubuntu(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    python = require_python("3.10")
    key = keygen(tmp_path / "user_ed25519")
    offer = Offer(provider="aws", id="g5.xlarge@us-east-1a:spot", gpu="A10G", gpu_count=1, gpu_memory_gb=24,
                  price_per_hour=0.41, region="us-east-1", spot=True)
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.3, images={DLAMI_IMAGE: python}) as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = AwsProvider(caller_address=never_asked, **twin.provider_kwargs())
        host_key = new_host_key()
        alloc = provider.launch(offer, allocation_id="alloc-1", ssh_public_key=key.with_suffix(".pub").read_text(),
                                host_key=host_key)
        status = wait_reachable(provider, alloc)
        assert status.ssh is not None and status.ssh.user == CLOUD_USER  # the provider's default: no override
        out = ssh(key, status, pinned(tmp_path, "kh", status, host_key[1]), WHO)
        assert out.returncode == 0, out.stderr
        sudo = "root" if shutil.which("sudo") else "no-sudo"
        assert out.stdout.split() == [CLOUD_USER, sudo, python_version(python)]
        assert twin.errors == []


def test_a_gcp_machine_has_its_offers_python_and_logs_in_as_ubuntu(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    python = require_python("3.10")
    key = keygen(tmp_path / "user_ed25519")
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.3, offers=[GcpOffer(python=python)],
                 images={DLVM_IMAGE: "/nonexistent/python3"}) as twin:  # launched with another image than this
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider(**twin.provider_kwargs())
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        host_key = new_host_key()
        alloc = provider.launch(offer, allocation_id="alloc-1", ssh_public_key=key.with_suffix(".pub").read_text(),
                                host_key=host_key, image="projects/team/global/images/trainer")
        status = wait_reachable(provider, alloc)
        assert status.ssh is not None and status.ssh.user == CLOUD_USER
        out = ssh(key, status, pinned(tmp_path, "kh", status, host_key[1]), WHO)
        assert out.returncode == 0, out.stderr
        sudo = "root" if shutil.which("sudo") else "no-sudo"
        assert out.stdout.split() == [CLOUD_USER, sudo, python_version(python)]
        assert twin.errors == []
