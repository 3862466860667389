"""AWS (moto EC2) and GCP (Compute Engine twin) list the machines they hold for us by their tags
and labels, with the workspace and allocation ids, and forget them once terminated. (That AWS
sends the allocation id as ClientToken is checked under the Stubber in test_provider_aws.py:
moto does not implement ClientToken idempotency.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from sshd import keygen, unavailable
from twins.aws import AwsTwin
from twins.gcp import GcpTwin

from jupyter_portable.compute.aws import AwsProvider
from jupyter_portable.compute.gcp import GcpProvider

ENV = {"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-machines-test"}


@pytest.fixture(autouse=True)
def _sshd() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)


def test_aws_lists_its_tagged_instances(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, ssh_cidr="127.0.0.1/32") as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = AwsProvider(caller_address=lambda: "127.0.0.1")
        offer = {o.id: o for o in provider.offers()}["g5.xlarge@us-east-1a"]
        key = keygen(tmp_path / "k").with_suffix(".pub").read_text()
        first = provider.launch(offer, allocation_id="al-aws000000001", ssh_public_key=key, env=ENV)
        [listed] = provider.list_machines()
        assert (listed.ref, listed.allocation_id, listed.workspace_id) == (first.ref, "al-aws000000001",
                                                                           "ws-machines-test")
        assert listed.uptime_s is not None and listed.spend is not None and listed.spend_source == "estimate"
        provider.terminate(first)
        assert provider.list_machines() == []


def test_gcp_lists_its_labelled_vms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider()
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        alloc = provider.launch(offer, allocation_id="al-gcp000000001",
                                ssh_public_key=keygen(tmp_path / "k").with_suffix(".pub").read_text(), env=ENV)
        [listed] = provider.list_machines()
        assert (listed.ref, listed.allocation_id, listed.workspace_id) == (alloc.ref, "al-gcp000000001",
                                                                           "ws-machines-test")
        assert listed.spend_source == "estimate" and listed.spend is not None
        assert provider.find_machines(allocation_id="al-gcp000000001")[0].ref == alloc.ref
        provider.terminate(alloc)
        assert [m for m in provider.list_machines() if m.state != "terminated"] == []
