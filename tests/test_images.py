"""The container image and the machine image are two settings (issue 27, item 4).

The container image (RunPod, Vast.ai, the local market) and the machine image (an AWS AMI, a
Google Cloud image) mean different things to different providers: a value of the wrong kind is
refused when it is set, naming the providers each setting affects, and each provider is sent only
its own kind. Through the real providers and their twins: EC2 refuses an ImageId that is not an
image id (``InvalidAMIID.Malformed``), as the AWS twin now does; RunPod starts the container it is
given; Compute Engine refuses a sourceImage that is no image URL, as the GCP twin now does.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from sshd import keygen, unavailable
from test_twins import BOOT_S, H100, FakeClock
from twins.aws import AwsTwin
from twins.gcp import GcpOffer, GcpTwin
from twins.runpod import RunPodTwin
from twins.server import TwinOffer

from jupyter_portable.compute.acquire import acquire
from jupyter_portable.compute.admission import Runner
from jupyter_portable.compute.aws import DLAMI_IMAGE, AwsProvider
from jupyter_portable.compute.base import Allocation, Provider
from jupyter_portable.compute.gcp import DLVM_IMAGE, GcpProvider
from jupyter_portable.compute.runpod import DEFAULT_IMAGE, RunPodProvider
from jupyter_portable.core.errors import LaunchFailed, UsageError
from jupyter_portable.core.images import image_for, machine_image_provider
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.settings import Settings, apply_changes

CONTAINER = "nvcr.io/nvidia/pytorch:24.05-py3"
AMI = "ami-0123456789abcdef0"
GCP_FAMILY = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"


# -- refused when set, naming the providers ----------------------------------------------------------

@pytest.mark.parametrize("value, kind", [(AMI, "an AWS machine image (AMI)"),
                                         ("resolve:ssm:/aws/service/deeplearning/ami/latest/ami-id",
                                          "an AWS machine image (AMI)"),
                                         (GCP_FAMILY, "a Google Cloud machine image")])
def test_a_machine_image_set_as_the_container_image_is_refused_naming_both_settings(value: str, kind: str) -> None:
    with pytest.raises(UsageError) as info:
        apply_changes(None, {"container_image": value})
    assert str(info.value) == (f"setting container_image is the container image RunPod, Vast.ai and the local market "
                               f"start; {value!r} is {kind}")
    assert info.value.hint == "set it as machine_image, the image AWS and Google Cloud boot"


def test_a_container_image_set_as_the_machine_image_is_refused_naming_both_settings() -> None:
    with pytest.raises(UsageError) as info:
        apply_changes(None, {"machine_image": CONTAINER})
    message = str(info.value)
    assert message.startswith("setting machine_image is the image AWS and Google Cloud boot")
    assert message.endswith(f"; {CONTAINER!r} is a container image")
    assert info.value.hint == "set it as container_image, the image RunPod, Vast.ai and the local market start"


@pytest.mark.parametrize("name, value", [("container_image", "My Image"), ("container_image", "a b:c"),
                                         ("machine_image", "ami-xyz"), ("machine_image", "ubuntu-2204"),
                                         ("container_image", "x" * 201), ("machine_image", 12)])
def test_a_value_of_neither_form_is_refused_with_the_rule(name: str, value: object) -> None:
    with pytest.raises(UsageError, match=f"setting {name} (must be|is) "):
        apply_changes(None, {name: value})


def test_the_old_single_image_setting_says_what_replaced_it() -> None:
    with pytest.raises(UsageError, match="image is two settings now: container_image .* and machine_image"):
        apply_changes(None, {"image": CONTAINER})


@pytest.mark.parametrize("value", [CONTAINER, "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404",
                                   "vastai/base-image:@vastai-automatic-tag", "localhost:5000/team/train",
                                   "team/train@sha256:" + "a" * 64, "python"])
def test_container_images_are_taken(value: str) -> None:
    assert apply_changes(None, {"container_image": value}).requirements.container_image == value


@pytest.mark.parametrize("value, cloud", [(AMI, "aws"), ("ami-0abc1234", "aws"), (DLAMI_IMAGE, "aws"),
                                          (GCP_FAMILY, "gcp"), ("global/images/family/my-team", "gcp"),
                                          ("https://www.googleapis.com/compute/v1/projects/p-123/global/images/x",
                                           "gcp")])
def test_machine_images_are_taken_for_the_cloud_of_their_form(value: str, cloud: str) -> None:
    assert apply_changes(None, {"machine_image": value}).requirements.machine_image == value
    assert machine_image_provider(value) == cloud
    assert image_for(cloud, None, value) == value
    assert image_for("gcp" if cloud == "aws" else "aws", None, value) is None  # the other cloud boots its default


def test_a_stored_single_image_is_read_as_the_setting_of_its_form() -> None:
    as_container = Settings.from_json({"requirements": {"image": CONTAINER}}).requirements
    as_machine = Settings.from_json({"requirements": {"image": AMI}}).requirements
    assert (as_container.container_image, as_container.machine_image) == (CONTAINER, None)
    assert (as_machine.container_image, as_machine.machine_image) == (None, AMI)
    assert "image" not in Settings.from_json({"requirements": {"image": AMI}}).to_json()["requirements"]


def test_each_provider_is_asked_for_its_own_kind_only() -> None:
    assert {p: image_for(p, CONTAINER, AMI) for p in ("runpod", "vastai", "local", "aws", "gcp", "lambda", "ssh")} == {
        "runpod": CONTAINER, "vastai": CONTAINER, "local": CONTAINER, "aws": AMI, "gcp": None, "lambda": None,
        "ssh": None}
    req = Requirements(container_image=CONTAINER, machine_image=AMI)
    assert req.for_provider("runpod") is req
    assert req.for_provider("aws").container_image is None  # a VM is never asked which container it runs


# -- through the twins -----------------------------------------------------------------------------

needs_machines = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


def ssh_runner(provider: Provider, allocation: Allocation, key: Path) -> Runner:
    """Commands on the twin's machine over SSH, as the user's side runs its probe."""
    status = provider.status(allocation)
    assert status.ssh is not None
    endpoint = status.ssh

    def run(argv: list[str]) -> tuple[int, str, str]:
        options = ["IdentitiesOnly=yes", "BatchMode=yes", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
                   "LogLevel=ERROR", "ConnectTimeout=10"]
        done = subprocess.run(["ssh", "-p", str(endpoint.port), "-i", str(key),
                               *(a for o in options for a in ("-o", o)), f"{endpoint.user}@{endpoint.host}",
                               " ".join(argv)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr

    return run


class Clock(FakeClock):
    """The twin's clock, which also gives the machine's sshd a moment of real time to start per wait."""

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        time.sleep(0.05)


def _acquire(offer: Offer, provider: Provider, requirements: Requirements, key: Path, clock: FakeClock | None,
             aid: str) -> Allocation:
    timing = {"clock": clock, "sleep": clock.sleep} if clock else {"clock": time.monotonic, "sleep": time.sleep}
    allocation, attempts = acquire([offer], {provider.name: provider}, requirements, allocation_id_factory=lambda: aid,
                                   runner_for=lambda p, a: ssh_runner(p, a, key),
                                   ssh_public_key=key.with_suffix(".pub").read_text(), boot_timeout_s=900,
                                   poll_interval_s=1.0, poll_max_s=1.0, **timing)  # type: ignore[arg-type]
    assert attempts == []
    return allocation


@needs_machines
def test_runpod_starts_the_container_image_and_is_admitted_on_it(tmp_path: Path) -> None:
    clock = Clock()
    key = keygen(tmp_path / "user")
    with RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 2})], clock=clock,
                    boot_delay_s=BOOT_S) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        [offer] = p.offers()
        pinned = _acquire(offer, p, Requirements(container_image=CONTAINER, machine_image=AMI), key, clock,
                          "al-container01")
        default = _acquire(offer, p, Requirements(machine_image=AMI), key, clock, "al-container02")
        sent = [r["body"]["image"] for r in twin.requests if r["op"] == "createPod"]
        assert sent == [CONTAINER, DEFAULT_IMAGE]  # never the AMI
        for allocation in (pinned, default):
            p.terminate(allocation)
        assert twin.violations == []


@needs_machines
def test_a_custom_runpod_image_is_warned_about_before_the_pod_and_named_when_its_ssh_never_answers(
        tmp_path: Path) -> None:
    """RunPod reaches a pod's SSH only in an image that follows its convention (issue 42): a custom
    image is warned about before the pod is rented, and when the pod never answers SSH the boot
    timeout's reason says why; RunPod's own images get no warning."""
    key = keygen(tmp_path / "user")
    custom = "ghcr.io/lab/trainer:3"

    class Started(Clock):
        """Each wait also lets the pods' machines start in real time (an upper bound, not a wait)."""

        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            for _ in range(200):
                if all(r.machine is not None or r.start_error for r in twin.rentals.values()):
                    break
                time.sleep(0.05)

    clock = Started()
    with RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 2})], clock=clock,
                    boot_delay_s=BOOT_S, sshless_images=[custom]) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock)
        assert p.image_warning(None) is None and p.image_warning(CONTAINER.replace("nvcr.io/nvidia", "runpod")) is None
        [offer] = p.offers()
        events: list[dict[str, Any]] = []
        with pytest.raises(Exception) as failed:
            acquire([offer], {"runpod": p}, Requirements(container_image=custom), allocation_id_factory=lambda: "al-x1",
                    on_event=events.append, ssh_public_key=key.with_suffix(".pub").read_text(), boot_timeout_s=30,
                    poll_interval_s=1.0, poll_max_s=1.0, clock=clock, sleep=clock.sleep)
        states = [e["state"] for e in events]
        assert states[:2] == ["ACQUIRING", "WARNING"] and "convention" in events[1]["reason"], events[:2]
        [attempt] = failed.value.context["attempts"]  # type: ignore[attr-defined]
        assert attempt.error == "Timeout" and "not one of RunPod's images" in attempt.reason, attempt.reason
        assert "no SSH endpoint" not in attempt.reason  # the pod ran with 22/tcp mapped: its sshd never answered
        assert twin.running() == [] and twin.violations == []  # the pod that never answered was released


@needs_machines
def test_aws_boots_the_machine_image_and_never_a_container_image(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    clock = None  # the AWS twin's machines boot on real time
    key = keygen(tmp_path / "user")
    offer = Offer(provider="aws", id="g5.xlarge@us-east-1a", gpu="A10G", gpu_count=1, gpu_memory_gb=24,
                  price_per_hour=1.01, region="us-east-1", extra={"instance_type": "g5.xlarge"})
    with AwsTwin(tmp_path / "aws", boot_delay_s=0.3) as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        p = AwsProvider(caller_address=lambda: "198.51.100.7")
        # a container image is RunPod's and Vast's: AWS boots its default and is not asked for it
        default = _acquire(offer, p, Requirements(container_image=CONTAINER), key, clock, "al-aws-image01")
        pinned = _acquire(offer, p, Requirements(container_image=CONTAINER, machine_image=AMI), key, clock,
                          "al-aws-image02")
        ec2 = boto3.client("ec2", region_name=twin.region)
        images = {a.allocation_id: ec2.describe_instances(InstanceIds=[a.ref])["Reservations"][0]["Instances"][0][
            "ImageId"] for a in (default, pinned)}
        assert images == {"al-aws-image01": DLAMI_IMAGE, "al-aws-image02": AMI}
        for allocation in (default, pinned):
            p.terminate(allocation)


# -- where the settings are set: the CLI and the REST API --------------------------------------------

def test_the_cli_refuses_a_wrong_kind_naming_the_providers_and_stores_nothing(cli: Any, tmp_path: Path) -> None:
    from jupyter_portable.engine.workspace import Workspace

    ws = Workspace.init(tmp_path / "ws", f"file://{tmp_path / 'store'}")
    refused = cli("settings", "--container-image", AMI, cwd=ws.root, check=False)
    assert refused.returncode != 0
    assert "container_image is the container image RunPod, Vast.ai and the local market start" in refused.stderr
    assert "set it as machine_image, the image AWS and Google Cloud boot" in refused.stderr
    old = cli("settings", "--image", CONTAINER, cwd=ws.root, check=False)
    assert old.returncode != 0 and "image is two settings now" in old.stderr
    both = cli.json("settings", "--container-image", CONTAINER, "--machine-image", GCP_FAMILY, cwd=ws.root)
    assert (both["requirements"]["container_image"], both["requirements"]["machine_image"]) == (CONTAINER, GCP_FAMILY)
    assert cli.json("settings", cwd=ws.root)["requirements"]["container_image"] == CONTAINER  # kept in the store


@needs_machines
def test_gcp_boots_its_own_machine_image_and_its_default_for_an_ami(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    key = keygen(tmp_path / "user")
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.3, offers=[GcpOffer(stock=2)]) as twin:
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        p = GcpProvider(**twin.provider_kwargs())
        offer = next(o for o in p.offers() if not o.spot)
        # an AMI is AWS's: Google Cloud boots its default and is not asked for it
        default = _acquire(offer, p, Requirements(container_image=CONTAINER, machine_image=AMI), key, None,
                           "al-gcp-image01")
        family = "projects/team-images/global/images/family/trainer"
        pinned = _acquire(offer, p, Requirements(machine_image=family), key, None, "al-gcp-image02")
        booted = {a.allocation_id: [d.initialize_params.source_image for d in twin.vms[a.ref].resource.disks
                                    if d.boot] for a in (default, pinned)}  # the twin keeps VMs as zone/name
        assert booted == {"al-gcp-image01": [DLVM_IMAGE], "al-gcp-image02": [family]}
        for allocation in (default, pinned):
            p.terminate(allocation)
        assert twin.errors == []


def test_the_gcp_twin_refuses_a_source_image_that_is_no_image_url(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.3) as twin:
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        p = GcpProvider(**twin.provider_kwargs())
        offer = next(o for o in p.offers() if not o.spot)
        with pytest.raises(LaunchFailed, match="sourceImage.*The URL is malformed"):
            p.launch(offer, allocation_id="al-gcp-bad0001", image=AMI,
                     ssh_public_key=keygen(tmp_path / "k").with_suffix(".pub").read_text())
        assert not [v for v in twin.vms.values() if not v.deleted]  # nothing was rented
