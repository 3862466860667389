"""The provider twins (``tests/twins/``), driven through the real providers.

Each twin is a stateful HTTP server on loopback that holds requests and answers to the
provider's published schemas, and rents out real machines (a loopback sshd each). Time is the
twin's and the provider's shared fake clock: boot delays, rate limits and retry waits pass on
it, never in real sleeps; only the machines' sshd start takes real time.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from sshd import keygen, unavailable
from twins import lambdalabs
from twins.lambdalabs import LambdaTwin
from twins.machines import CLOUD_USER, require_python
from twins.runpod import RunPodTwin
from twins.server import Twin, TwinOffer
from twins.vastai import VastTwin

from jupyter_portable.compute.base import Allocation, AllocationStatus, SshEndpoint
from jupyter_portable.compute.http import HttpProvider
from jupyter_portable.compute.lambdalabs import LambdaProvider
from jupyter_portable.compute.runpod import RunPodProvider
from jupyter_portable.compute.vastai import VastProvider
from jupyter_portable.core.errors import AuthError, LaunchFailed, NoCapacity
from jupyter_portable.core.offers import Offer

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

PROVIDERS = ("runpod", "vastai", "lambda")
TWINS: dict[str, type[Twin]] = {"runpod": RunPodTwin, "vastai": VastTwin, "lambda": LambdaTwin}
CLASSES: dict[str, type[HttpProvider]] = {"runpod": RunPodProvider, "vastai": VastProvider, "lambda": LambdaProvider}
H100 = TwinOffer(gpu="NVIDIA H100 80GB HBM3", model="H100 SXM", memory_mb=81559, price=2.69, driver="550.90.07",
                 cuda="12.4", stock=1, region="US-TX-3")
BOOT_S = 5.0  # on the fake clock
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherOtherOtherOtherOtherOtherOtherOth laptop"
POLLS = 400  # status polls before a test gives up (each also waits 0.05 s of real time for sshd)


class FakeClock:
    """One clock for the twin and the provider: the provider's sleeps advance it and are kept."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture(params=PROVIDERS)
def provider_name(request: pytest.FixtureRequest) -> str:
    if request.param == "lambda" and lambdalabs.unavailable():
        pytest.skip(lambdalabs.unavailable() or "")
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return keygen(tmp_path / "launch_ed25519")


def twin_for(name: str, tmp_path: Path, clock: FakeClock, **options: Any) -> Twin:
    options.setdefault("offers", [TwinOffer(**vars(H100))])
    options.setdefault("boot_delay_s", BOOT_S)
    return TWINS[name](tmp_path / "machines", clock=clock, **options)


def provider_for(twin: Twin, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> HttpProvider:
    """The provider as a user runs it, pointed at the twin by the environment alone."""
    monkeypatch.delenv("LAMBDA_SSH_KEY_NAMES", raising=False)
    for name, value in twin.env().items():
        monkeypatch.setenv(name, value)
    return CLASSES[twin.provider](sleep=clock.sleep, clock=clock, **kw)


def launch(provider: HttpProvider, key: Path) -> tuple[Offer, Allocation]:
    offer = next(o for o in provider.offers() if o.capacity)
    provider.check_permission(offer)
    assert provider.check_capacity(offer) == 1
    allocation = provider.launch(offer, allocation_id="alloc-0001", ssh_public_key=key.with_suffix(".pub").read_text())
    return offer, allocation


def wait_reachable(provider: HttpProvider, allocation: Allocation, clock: FakeClock) -> list[AllocationStatus]:
    """Poll as acquire does (one fake second apart) until reachable; the states seen."""
    seen = []
    for _ in range(POLLS):
        status = provider.status(allocation)
        seen.append(status)
        if status.state == "reachable":
            return seen
        clock.sleep(1.0)
        subprocess.run(["sleep", "0.05"], check=True)  # the machine's sshd starts in real time
    raise AssertionError(f"never reachable: {[s.state for s in seen[-5:]]}")


def ssh(endpoint: SshEndpoint, key: Path, command: str) -> subprocess.CompletedProcess[str]:
    options = ["IdentitiesOnly=yes", "BatchMode=yes", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
               "LogLevel=ERROR", "ConnectTimeout=10"]
    argv = ["ssh", "-p", str(endpoint.port), "-i", str(key), *(a for o in options for a in ("-o", o)),
            f"{endpoint.user}@{endpoint.host}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_each_provider_launches_reaches_and_terminates_a_bare_machine(provider_name: str, tmp_path: Path,
                                                                       clock: FakeClock, key: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        offer, allocation = launch(provider, key)
        assert offer.gpu_count == 1 and offer.price_per_hour == pytest.approx(2.69)
        seen = wait_reachable(provider, allocation, clock)
        assert seen[0].state == "pending" and seen[0].ssh is None
        assert all(s.ssh is None for s in seen[:-1])  # no endpoint until the sshd listens
        endpoint = seen[-1].ssh
        assert endpoint is not None
        machine = twin.machines[allocation.ref]
        if provider_name == "lambda":
            assert endpoint.port == 22 and endpoint.host != machine.host  # its own address, as Lambda gives
        else:
            assert (endpoint.host, endpoint.port) == (machine.host, machine.port)

        out = ssh(endpoint, key, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "
                                 "python3 -c 'import sys; print(sys.version_info >= (3, 10))'; "
                                 "python3 -c 'import jupyter_portable' 2>/dev/null || echo bare; "
                                 "nohup sleep 300 >/dev/null 2>&1 &")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:3] == ["NVIDIA H100 80GB HBM3, 550.90.07", "True", "bare"]
        assert machine.processes()  # the detached sleep runs on the machine

        provider.terminate(allocation)
        assert twin.running() == []
        assert not machine.alive() and machine.processes() == []
        assert not machine.home.exists()  # its disk went with it
        assert provider.status(allocation).state in ("terminated", "lost")
        assert twin.violations == []


def python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_a_machine_has_its_offers_python_and_its_images_login_user(provider_name: str, tmp_path: Path,
                                                                    clock: FakeClock, key: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    python = require_python("3.10")
    with twin_for(provider_name, tmp_path, clock, offers=[TwinOffer(**{**vars(H100), "python": python})]) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        _, allocation = launch(provider, key)
        endpoint = wait_reachable(provider, allocation, clock)[-1].ssh
        assert endpoint is not None
        # Lambda Stack logs in as ubuntu (the provider's default, no override), RunPod and Vast as root
        assert endpoint.user == (CLOUD_USER if provider_name == "lambda" else "root")
        out = ssh(endpoint, key, "id -un; python3 -c 'import platform; print(platform.python_version())'; "
                                 'test "$HOME" = "$(pwd)" && echo home')
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [endpoint.user, python_version(python), "home"]
        assert twin.violations == []


@pytest.mark.parametrize("name", ["runpod", "vastai"])
def test_a_machine_has_the_python_of_the_image_it_was_launched_with(name: str, tmp_path: Path, clock: FakeClock,
                                                                     key: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    python = require_python("3.10")
    image = "team/train:py310"
    with twin_for(name, tmp_path, clock, images={image: python}) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        offer = next(o for o in provider.offers() if o.capacity)
        allocation = provider.launch(offer, allocation_id="alloc-0001", image=image,
                                     ssh_public_key=key.with_suffix(".pub").read_text())
        endpoint = wait_reachable(provider, allocation, clock)[-1].ssh
        assert endpoint is not None
        out = ssh(endpoint, key, "python3 -c 'import platform; print(platform.python_version())'")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [python_version(python)]  # the offer's (Debian's 3.11.2) gave way
        assert twin.violations == []


def test_lambda_registers_the_launch_key_once_and_launches_with_that_one_name(tmp_path: Path, clock: FakeClock,
                                                                              key: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if lambdalabs.unavailable():
        pytest.skip(lambdalabs.unavailable() or "")
    with twin_for("lambda", tmp_path, clock, offers=[TwinOffer(**{**vars(H100), "stock": 2})],
                  ssh_keys={"laptop": OTHER_KEY}) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        launch(provider, key)
        launch(provider, key)  # the second finds ours registered
        assert isinstance(twin, LambdaTwin)
        ours = [n for n in twin.ssh_keys if n.startswith("jupyter-portable-")]
        assert len(ours) == 1 and twin.ssh_keys[ours[0]].split()[1] == key.with_suffix(".pub").read_text().split()[1]
        launches = [r for r in twin.requests if r["op"] == "launchInstance"]
        assert [r["status"] for r in twin.requests if r["op"] == "addSSHKey"] == [200]
        assert all(r["status"] == 200 for r in launches) and len(launches) == 2
        assert {tuple(twin.rentals[ref].extra["key_names"]) for ref in twin.running()} == {(ours[0],)}
        assert twin.violations == []


def test_a_sold_out_gpu_is_no_capacity(provider_name: str, tmp_path: Path, clock: FakeClock, key: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        offer, _ = launch(provider, key)  # the only one in stock
        with pytest.raises(NoCapacity):
            provider.check_capacity(offer)
        with pytest.raises(NoCapacity):  # the launch itself is refused the provider's way
            provider.launch(offer, allocation_id="alloc-0002", ssh_public_key=key.with_suffix(".pub").read_text())
        assert len(twin.running()) == 1
        assert twin.violations == []


RATE_LIMITED = {"runpod": {"Retry-After", "RateLimit"}, "vastai": set(), "lambda": set()}


def test_over_the_rate_the_twin_answers_429_and_the_providers_retry_gets_through(
        provider_name: str, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock, rate=1.0) as twin:
        provider = provider_for(twin, clock, monkeypatch, backoff=0.5)
        for _ in range(3):
            assert provider.offers()  # every call gets through, however many 429s it met
        limited = [r for r in twin.requests if r["status"] == 429]
        assert limited and all(RATE_LIMITED[provider_name] <= set(r["headers"]) for r in limited)
        assert clock.slept  # the provider waited (on the shared clock) before trying again
        if provider_name == "runpod":
            assert min(clock.slept) >= 1.0  # at least what Retry-After asked
        # a caller without retries sees the documented answer
        response = httpx.get(f"{twin.url}/nowhere", headers={"Authorization": f"Bearer {twin.api_key}"})
        assert response.status_code == 429
        assert twin.violations == []


def test_a_failed_first_delete_is_retried_and_the_machine_ends_up_deleted(
        provider_name: str, tmp_path: Path, clock: FakeClock, key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock, fail_first_delete=True) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        _, allocation = launch(provider, key)
        wait_reachable(provider, allocation, clock)
        machine = twin.machines[allocation.ref]
        provider.terminate(allocation)
        deletes = [r["status"] for r in twin.requests if r["op"] in ("deletePod", "destroyInstance",
                                                                      "terminateInstance")]
        assert deletes[0] >= 500 and 200 <= deletes[-1] < 300 and len(deletes) == 2
        assert twin.running() == [] and not machine.alive() and machine.processes() == []


REASON = {"runpod": "the pod is in ERROR", "vastai": "host taken back for maintenance",
          "lambda": "lambda preempted the instance"}


def test_a_killed_machine_is_lost_with_the_providers_reason(provider_name: str, tmp_path: Path, clock: FakeClock,
                                                            key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        _, allocation = launch(provider, key)
        endpoint = wait_reachable(provider, allocation, clock)[-1].ssh
        assert endpoint is not None
        assert ssh(endpoint, key, "nohup sleep 300 >/dev/null 2>&1 &").returncode == 0
        machine = twin.machines[allocation.ref]
        twin.kill(allocation.ref, "host taken back for maintenance")
        assert machine.processes() == [] and not machine.alive()
        status = provider.status(allocation)
        assert status.state == "lost" and REASON[provider_name] in (status.reason or "")
        assert ssh(endpoint, key, "true").returncode != 0
        assert twin.running() == [allocation.ref]  # killed, not deleted: the provider still bills it
        provider.terminate(allocation)
        assert twin.running() == []


def test_a_wrong_key_is_an_auth_error(provider_name: str, tmp_path: Path, clock: FakeClock,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for(provider_name, tmp_path, clock) as twin:
        provider = provider_for(twin, clock, monkeypatch, api_key="not-the-key")
        with pytest.raises(AuthError):
            provider.offers()
        assert {r["status"] for r in twin.requests} <= {401, 404}


def pod_body(**changes: Any) -> dict[str, Any]:
    body = {"name": "alloc-0001", "image": "runpod/base:1", "gpu": {"id": H100.gpu, "count": 1}, "cloud": "SECURE",
            "disk": 50, "env": {}, "ports": ["22/tcp"], "startSsh": True}
    body.update(changes)
    return body


def test_the_runpod_twin_refuses_a_renamed_field_as_runpod_v2_does(tmp_path: Path, clock: FakeClock) -> None:
    with twin_for("runpod", tmp_path, clock) as twin:
        headers = {"Authorization": f"Bearer {twin.api_key}"}
        good = httpx.post(f"{twin.url}/v2/pods", json=pod_body(), headers=headers)
        assert good.status_code == 201 and twin.violations == []
        old = pod_body()
        old["containerDiskInGb"] = old.pop("disk")  # the older API's name
        refused = httpx.post(f"{twin.url}/v2/pods", json=old, headers=headers)
        assert refused.status_code == 422
        assert refused.json()["title"] == "Unprocessable Entity" and refused.json()["status"] == 422
        assert len(twin.violations) == 1 and "containerDiskInGb" in twin.violations[0]
        assert len(twin.running()) == 1  # nothing was rented for it


def test_a_provider_sending_the_old_field_name_fails_its_launch(tmp_path: Path, clock: FakeClock, key: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with twin_for("runpod", tmp_path, clock) as twin:
        provider = provider_for(twin, clock, monkeypatch)
        assert isinstance(provider, RunPodProvider)
        request = provider._api.request

        def old_names(method: str, path: str, **kw: Any) -> Any:
            body = kw.get("json_body")
            if method == "POST" and path == "/v2/pods" and isinstance(body, dict):
                kw["json_body"] = {("containerDiskInGb" if k == "disk" else k): v for k, v in body.items()}
            return request(method, path, **kw)

        monkeypatch.setattr(provider._api, "request", old_names)
        with pytest.raises(LaunchFailed) as info:
            launch(provider, key)
        assert "422" in str(info.value)
        assert twin.violations and "containerDiskInGb" in twin.violations[0]
        assert twin.running() == []
