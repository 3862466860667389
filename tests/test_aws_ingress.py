"""The SSH ingress follows the user (issue 27, item 5), against an AWS twin whose security groups
are enforced (item 7): a machine's port 22 lets a connection in only while one of its groups has a
rule covering the user's address, as EC2 does. When the user's address changes (a laptop on another
network), the security group gains the new address before the machine could be declared lost: a
heartbeat that fails right after the move is not a loss.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from sshd import keygen, unavailable
from test_twins_cloud import pinned, ssh, wait_reachable
from twins.aws import AwsTwin

from jupyter_portable.compute.aws import AwsProvider
from jupyter_portable.compute.aws_network import SSH_GROUP_NAME
from jupyter_portable.compute.keys import host_key_pair
from jupyter_portable.core.offers import Offer

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")

OFFER = Offer(provider="aws", id="g5.xlarge@us-east-1a:spot", gpu="A10G", gpu_count=1, gpu_memory_gb=24,
              price_per_hour=0.41, region="us-east-1", spot=True)
HOME = "198.51.100.7"  # the twin's user to begin with
CAFE = "203.0.113.50"  # the same user, later, on another network


@pytest.fixture
def twin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AwsTwin]:
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.2, ssh_cidr=f"{HOME}/32") as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        # the address follows checkip (the twin's), as it does where JUPYTER_PORTABLE_SSH_CIDR is unset
        monkeypatch.delenv("JUPYTER_PORTABLE_SSH_CIDR")
        yield twin
        assert twin.errors == []


def ssh_group(ec2: Any) -> dict[str, Any]:
    [group] = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [SSH_GROUP_NAME]}])[
        "SecurityGroups"]
    return dict(group)


def cidrs(group: dict[str, Any]) -> list[str]:
    return sorted(r["CidrIp"] for p in group["IpPermissions"] for r in p["IpRanges"])


def test_the_twin_lets_ssh_in_only_from_an_address_a_rule_covers(twin: AwsTwin, tmp_path: Path) -> None:
    key = keygen(tmp_path / "user")
    host_key = host_key_pair()
    provider = AwsProvider(caller_address=twin.checkip)
    alloc = provider.launch(OFFER, allocation_id="al-ingress1", ssh_public_key=key.with_suffix(".pub").read_text(),
                            host_key=host_key)
    status = wait_reachable(provider, alloc)
    known = pinned(tmp_path, "kh", status, host_key[1])
    assert ssh(key, status, known, "true").returncode == 0

    twin.move_user(CAFE)  # no rule covers the new address: nothing gets through, not even the banner
    refused = ssh(key, status, known, "true")
    assert refused.returncode == 255, refused
    assert twin.admits(alloc.ref) is False

    ec2 = boto3.client("ec2")
    group = ssh_group(ec2)
    ec2.authorize_security_group_ingress(GroupId=group["GroupId"], IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "203.0.113.0/24"}]}])
    assert ssh(key, status, known, "true").returncode == 0  # a wider range covers it too

    # a group of the user's own that does not open 22: no login at all
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    closed = ec2.create_security_group(GroupName="closed", Description="no ssh", VpcId=vpc)["GroupId"]
    shut = AwsProvider(caller_address=twin.checkip, security_group_ids=[closed])
    other = shut.launch(OFFER, allocation_id="al-ingress2", ssh_public_key=key.with_suffix(".pub").read_text(),
                        host_key=host_key)
    status2 = wait_reachable(shut, other)
    assert ssh(key, status2, pinned(tmp_path, "kh2", status2, host_key[1]), "true").returncode == 255
    assert shut.admit_caller(other) is False  # the user's own group is left as it is
    provider.terminate(alloc)
    shut.terminate(other)


def test_the_ingress_follows_the_user_to_a_new_address(twin: AwsTwin, tmp_path: Path) -> None:
    key = keygen(tmp_path / "user")
    host_key = host_key_pair()
    provider = AwsProvider(caller_address=twin.checkip)
    alloc = provider.launch(OFFER, allocation_id="al-follow1", ssh_public_key=key.with_suffix(".pub").read_text(),
                            host_key=host_key)
    status = wait_reachable(provider, alloc)
    known = pinned(tmp_path, "kh", status, host_key[1])
    ec2 = boto3.client("ec2")
    assert cidrs(ssh_group(ec2)) == [f"{HOME}/32"]
    assert provider.admit_caller(alloc) is False  # nothing moved: nothing to add

    twin.move_user(CAFE)
    assert ssh(key, status, known, "true").returncode == 255
    assert provider.admit_caller(alloc) is True
    # replaced, not added: the machine is reached from the new address now, and no one uses the old
    assert cidrs(ssh_group(ec2)) == [f"{CAFE}/32"]
    assert ssh(key, status, known, "true").returncode == 0
    assert provider.admit_caller(alloc) is False

    # the next launch asks checkip again: the user's address now, not the first one it learnt; the
    # first machine, still running, keeps the address it is reached from
    twin.move_user("192.0.2.77")
    later = provider.launch(OFFER, allocation_id="al-follow2", ssh_public_key=key.with_suffix(".pub").read_text())
    assert cidrs(ssh_group(ec2)) == ["192.0.2.77/32", f"{CAFE}/32"]
    provider.terminate(alloc)
    provider.terminate(later)


def test_the_ssh_rules_never_pile_up_as_the_user_moves(twin: AwsTwin, tmp_path: Path) -> None:
    """Issue 42, item 4: each move used to leave a /32 open on port 22 for good, until the group's
    rule quota made every launch fail. The group holds the user's address now and those running
    machines come from; a rule the user wrote by hand is left alone."""
    key = keygen(tmp_path / "user")
    provider = AwsProvider(caller_address=twin.checkip)
    alloc = provider.launch(OFFER, allocation_id="al-moves1", ssh_public_key=key.with_suffix(".pub").read_text(),
                            host_key=host_key_pair())
    status = wait_reachable(provider, alloc)
    ec2 = boto3.client("ec2")
    group_id = ssh_group(ec2)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "10.9.0.0/16"}]}])
    for n in range(1, 8):  # seven networks in a row: a café, a train, home again...
        twin.move_user(f"203.0.113.{n}")
        assert provider.admit_caller(alloc) is True
        assert cidrs(ssh_group(ec2)) == ["10.9.0.0/16", f"203.0.113.{n}/32"]
    assert status and twin.admits(alloc.ref) is True
    provider.terminate(alloc)
    # with no machine running, the next launch opens the address it comes from alone
    twin.move_user(HOME)
    later = provider.launch(OFFER, allocation_id="al-moves2", ssh_public_key=key.with_suffix(".pub").read_text())
    assert cidrs(ssh_group(ec2)) == ["10.9.0.0/16", f"{HOME}/32"]
    provider.terminate(later)


# -- through the loss check ------------------------------------------------------------------------

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def test_a_heartbeat_that_fails_right_after_the_user_moved_is_not_a_loss(
        twin: AwsTwin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> None:
    from conftest import make_bucket
    from jupyter_e2e import make_workspace
    from test_leaks import _moto_endpoint

    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    for name, value in {"JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh-state"),
                        "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"),
                        "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0", "JUPYTER_PORTABLE_ENVIRONMENT": "image",
                        "JUPYTER_PORTABLE_BOOT_TIMEOUT": "60", "JUPYTER_PORTABLE_PROVIDERS": "aws",
                        "AWS_ENDPOINT_URL": _moto_endpoint(), **S3_ENV}.items():
        monkeypatch.setenv(name, value)
    for name in ("JUPYTER_PORTABLE_REMOTE_PYTHON", "JUPYTER_PORTABLE_SSH_KEY", "JUPYTER_PORTABLE_KILL_IN_STATE"):
        monkeypatch.delenv(name, raising=False)
    # the worker's store is S3 on another moto server; EC2 stays the twin's
    assert os.environ["AWS_ENDPOINT_URL_EC2"] != os.environ["AWS_ENDPOINT_URL"]
    ws = make_workspace(tmp_path / "ws", f"s3://{make_bucket()}/ingress")
    provider = AwsProvider(caller_address=twin.checkip)
    # no silence is allowed at all: one failed heartbeat that nothing explains is a loss
    orch = Orchestrator(ws, providers={"aws": provider}, stale_after_s=0.0, clock=lambda: 0.0)
    try:
        assert orch.continue_()["state"] == L.ACTIVE
        assert orch.check(now=1.0)["alive"] is True
        twin.move_user(CAFE)
        after = orch.check(now=2.0)
        assert (after["state"], after["alive"]) == (L.ACTIVE, True), orch.lifecycle().events[-1]
        assert f"{CAFE}/32" in cidrs(ssh_group(boto3.client("ec2")))
        assert orch.check(now=3.0)["alive"] is True
        stopped = orch.stop()
        assert stopped["state"] != L.LOST, json.dumps(stopped)[:2000]
    finally:
        orch.close()
    assert twin.running() == []
