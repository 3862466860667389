"""No paid machine is left behind by a lost answer (issue 27, item 3), on each provider's twin: a
launch the provider carried out but answered with a gateway's 503 is looked up by its name, label
or tags before anything else is tried, and is the allocation; nothing is rented twice. A delete
answered 503 is tried again until the provider accepts it (Google Cloud, AWS; the HTTP providers'
are in test_leaks), and one never accepted names the machine that may still run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sshd import unavailable
from test_twins import CLASSES, H100, TWINS, FakeClock
from twins import lambdalabs
from twins.server import TwinOffer

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


@pytest.mark.parametrize("name", ["runpod", "vastai", "lambda"])
def test_a_launch_answered_503_after_it_was_carried_out_is_found_not_rented_again(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "lambda" and lambdalabs.unavailable():
        pytest.skip(lambdalabs.unavailable() or "")
    clock = FakeClock()
    with TWINS[name](tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 2})], clock=clock,
                     boot_delay_s=5.0, gateway_errors=1) as twin:
        monkeypatch.delenv("LAMBDA_SSH_KEY_NAMES", raising=False)
        for key, value in twin.env().items():
            monkeypatch.setenv(key, value)
        provider = CLASSES[name](sleep=clock.sleep, clock=clock)
        offer = next(o for o in provider.offers() if o.capacity)
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOth laptop"
        allocation = provider.launch(offer, allocation_id="al-gateway0001", ssh_public_key=key,
                                     env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-lost"})
        launches = [r for r in twin.requests if r["op"] in twin.launch_ops]
        assert [r["status"] for r in launches] == [503]  # sent once; its answer was the gateway's
        assert twin.running() == [allocation.ref]  # the machine it made is the allocation
        provider.terminate(allocation)
        assert twin.running() == []


@pytest.mark.parametrize("name", ["runpod", "vastai", "lambda"])
def test_a_create_answered_500_whose_machine_is_listed_late_is_looked_up_until_found_and_used(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 42 item 3: the twin did create the machine, answered 500, and lists it only 40 s later;
    # the provider keeps looking (backoff, on the injected clock) and the machine it made is the one used
    if name == "lambda" and lambdalabs.unavailable():
        pytest.skip(lambdalabs.unavailable() or "")
    clock = FakeClock()
    with TWINS[name](tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 2})], clock=clock,
                     boot_delay_s=5.0, gateway_errors=1, gateway_status=500, listing_lag_s=40.0) as twin:
        monkeypatch.delenv("LAMBDA_SSH_KEY_NAMES", raising=False)
        for key, value in twin.env().items():
            monkeypatch.setenv(key, value)
        provider = CLASSES[name](sleep=clock.sleep, clock=clock)
        offer = next(o for o in provider.offers() if o.capacity)
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOth laptop"
        started = clock()
        allocation = provider.launch(offer, allocation_id="al-late00001", ssh_public_key=key,
                                     env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-late"})
        launches = [r for r in twin.requests if r["op"] in twin.launch_ops]
        assert [r["status"] for r in launches] == [500]  # sent once; never sent again
        assert twin.running() == [allocation.ref]  # exactly one machine, and it is the allocation
        assert clock() - started >= 40.0  # it waited for the listing rather than give up on the first look
        provider.terminate(allocation)
        assert twin.running() == []


@pytest.mark.parametrize("status", [503, 500])
def test_a_gcp_insert_answered_5xx_is_found_by_its_name_and_its_request_id_makes_it_once(
        status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.gcp import GcpTwin

    from jupyter_portable.compute.gcp import GcpProvider, instance_name, request_id

    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1, gateway_errors=1, gateway_status=status) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider(sleep=lambda s: None)
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        allocation = provider.launch(offer, allocation_id="al-gateway0002")
        inserts = [r for r in twin.requests if r[0] == "POST" and r[1].endswith("/instances")]
        assert len(inserts) == 1 and twin.gateway_errors == 0  # sent once; the twin answered 5xx
        assert allocation.ref == f"us-central1-a/{instance_name('al-gateway0002')}"
        assert twin.running() == [allocation.ref]
        assert list(twin.request_ids) == [request_id("al-gateway0002")]
        provider.terminate(allocation)
        assert twin.running() == []


def test_a_gcp_insert_whose_answer_never_came_is_found_by_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.gcp import GcpTwin

    from jupyter_portable.compute.gcp import GcpProvider, instance_name

    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1, lose_answers=1) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider(sleep=lambda s: None, request_timeout=1.0)
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        allocation = provider.launch(offer, allocation_id="al-timeout0002")
        inserts = [r for r in twin.requests if r[0] == "POST" and r[1].endswith("/instances")]
        assert len(inserts) == 1 and twin.lose_answers == 0  # sent once; its answer never came
        assert allocation.ref == f"us-central1-a/{instance_name('al-timeout0002')}"
        assert twin.running() == [allocation.ref]
        provider.terminate(allocation)
        assert twin.running() == []


def test_a_gcp_delete_answered_503_is_tried_again_until_compute_engine_accepts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.gcp import GcpTwin

    from jupyter_portable.compute.gcp import GcpProvider

    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.1, fail_first_delete=True) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        waits: list[float] = []
        provider = GcpProvider(sleep=waits.append)
        offer = {o.id: o for o in provider.offers()}["g2-standard-4@us-central1-a:spot"]
        allocation = provider.launch(offer, allocation_id="al-delete00001")
        provider.terminate(allocation)
        assert twin.deletes[allocation.ref] == 2 and waits == [0.5]  # the 503, a wait, then accepted
        # accepted is not done: terminate followed the delete's operation until the VM was gone
        assert ("GET", f"/compute/v1/projects/{twin.project}/zones/us-central1-a/operations/") in \
            {(m, p.rsplit("/", 1)[0] + "/") for m, p in twin.requests}
        assert twin.running() == []


# -- AWS: the moto twin's front end answers 503 where EC2's may ----------------------------------

def _aws(twin: object, monkeypatch: pytest.MonkeyPatch, *, resend: bool, read_timeout: float = 60,
         **kw: object) -> object:
    """A provider on the AWS twin whose client sends each call once (``resend``: botocore's own
    retries, as shipped), so that what the provider itself does after a 503 shows."""
    import boto3
    from botocore.config import Config

    from jupyter_portable.compute.aws import AwsProvider

    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for name, value in twin.env().items():  # type: ignore[attr-defined]
        monkeypatch.setenv(name, value)
    client = None if resend else boto3.client("ec2", config=Config(retries={"total_max_attempts": 1,
                                                                             "mode": "standard"},
                                                                    read_timeout=read_timeout))
    return AwsProvider(client=client, caller_address=lambda: "198.51.100.7", **kw)


AWS_OFFER_ID = "g5.xlarge@us-east-1a:spot"


def _aws_offer() -> object:
    from jupyter_portable.core.offers import Offer

    return Offer(provider="aws", id=AWS_OFFER_ID, gpu="A10G", gpu_count=1, gpu_memory_gb=24, price_per_hour=0.41,
                 region="us-east-1", spot=True)


@pytest.mark.parametrize("status", [503, 500])
def test_an_aws_launch_answered_5xx_after_it_was_carried_out_is_found_by_its_tag(
        status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.aws import AwsTwin

    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, gateway_errors=1, gateway_status=status) as twin:
        provider: Any = _aws(twin, monkeypatch, resend=False)
        allocation = provider.launch(_aws_offer(), allocation_id="al-gateway0003",
                                     env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-lost"})
        assert [a for a in twin.actions if a[0] == "RunInstances"] == [("RunInstances", status)]  # sent once
        assert twin.running() == [allocation.ref]  # the instance it made is the allocation
        [found] = provider.list_machines()
        assert (found.ref, found.allocation_id, found.workspace_id) == (allocation.ref, "al-gateway0003", "ws-lost")
        provider.terminate(allocation)
        assert twin.running() == []


def test_an_aws_launch_whose_answer_never_came_is_found_by_its_tag(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.aws import AwsTwin

    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, lose_answers=1) as twin:
        provider: Any = _aws(twin, monkeypatch, resend=False, read_timeout=1)
        allocation = provider.launch(_aws_offer(), allocation_id="al-timeout0001")
        assert [a for a in twin.actions if a[0] == "RunInstances"] == [("RunInstances", -1)]  # its answer lost
        assert twin.running() == [allocation.ref]
        provider.terminate(allocation)
        assert twin.running() == []


def test_an_aws_launch_sent_again_after_a_503_starts_one_instance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore sends a launch answered 503 again; its ClientToken (the allocation id) makes EC2 answer
    the first launch's instance instead of starting a second."""
    from twins.aws import AwsTwin

    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, gateway_errors=1) as twin:
        provider: Any = _aws(twin, monkeypatch, resend=True)
        allocation = provider.launch(_aws_offer(), allocation_id="al-gateway0004")
        assert [a for a in twin.actions if a[0] == "RunInstances"] == [("RunInstances", 503), ("RunInstances", 200)]
        assert twin.running() == [allocation.ref]
        provider.terminate(allocation)
        assert twin.running() == []


def test_an_aws_terminate_answered_503_is_tried_again_until_ec2_accepts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twins.aws import AwsTwin

    with AwsTwin(tmp_path / "aws", boot_delay_s=0.1, fail_first_delete=True) as twin:
        waits: list[float] = []
        provider: Any = _aws(twin, monkeypatch, resend=False, sleep=waits.append)
        allocation = provider.launch(_aws_offer(), allocation_id="al-delete00002")
        provider.terminate(allocation)
        assert twin.terminates[allocation.ref] == 2 and waits == [0.5]  # the 503, a wait, then accepted
        assert twin.running() == []
        # never accepted: the error names the instance that may still run
        again = provider.launch(_aws_offer(), allocation_id="al-delete00003")
        twin.fail_first_delete = False
        stubborn: Any = _aws(twin, monkeypatch, resend=False, sleep=waits.append, terminate_attempts=1)
        twin.fail_first_delete = True
        twin.terminates.pop(again.ref, None)
        with pytest.raises(Exception) as err:
            stubborn.terminate(again)
        assert again.ref in str(err.value) and "may still be running" in str(err.value)
        assert err.value.context["may_be_running"] is True  # type: ignore[attr-defined]
        assert twin.running() == [again.ref]
        provider.terminate(again)
        assert twin.running() == []
