"""Vast.ai as it really answers (issue 27, item 1), through the real provider and its twin.

The twin takes what Vast's guide and its official client (``vastai`` 1.9.x) send and refuses
what the document's looser types would let through: the launch's ``env`` is an object, the
driver is filtered as the client's zero-padded number, a host without direct ports cannot serve
``ssh_direct``, and a container its runtime cannot start stays ``created`` with the error in
``status_msg``. A host-side restart maps another SSH port. Time is the twin's and the provider's
shared fake clock (see ``tests/test_twins.py``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from sshd import keygen, unavailable
from test_twins import BOOT_S, H100, FakeClock, ssh, wait_reachable
from twins.server import TwinOffer
from twins.vastai import VastTwin

from jupyter_portable.compute.acquire import acquire, follow_endpoint
from jupyter_portable.compute.base import SshEndpoint
from jupyter_portable.compute.keys import host_key_pair as new_host_key
from jupyter_portable.compute.keys import known_hosts_path, pin_host_key, scan_host_key
from jupyter_portable.compute.vastai import VastProvider
from jupyter_portable.core.errors import LaunchFailed, NoCapacity
from jupyter_portable.core.offers import Requirements

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

RTX = TwinOffer(gpu="NVIDIA GeForce RTX 4090", model="RTX 4090", memory_mb=24564, price=0.69, driver="550.54.15",
                cuda="12.4", stock=1, region="US-CA")
V100 = TwinOffer(gpu="Tesla V100-SXM2-32GB", model="Tesla V100", memory_mb=32768, price=0.25, driver="580.65.06",
                 cuda="13.0", stock=1, region="US-NV")
RUNTIME_ERROR = ("OCI runtime create failed: nvidia-container-cli: requirement error: unsatisfied condition: "
                 "cuda>=12.8, please update your driver to a newer version")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def twin(tmp_path: Path, clock: FakeClock, offers: list[TwinOffer] | None = None, **kw: Any) -> VastTwin:
    return VastTwin(tmp_path / "machines", clock=clock, boot_delay_s=BOOT_S,
                    offers=[TwinOffer(**vars(o)) for o in (offers or [H100])], **kw)


def strict_ssh(endpoint: SshEndpoint, key: Path, known_hosts: Path, command: str) -> subprocess.CompletedProcess[str]:
    """ssh that trusts only the host key in ``known_hosts``."""
    options = ["IdentitiesOnly=yes", "BatchMode=yes", "StrictHostKeyChecking=yes", f"UserKnownHostsFile={known_hosts}",
               "GlobalKnownHostsFile=/dev/null", "LogLevel=ERROR", "ConnectTimeout=10"]
    return subprocess.run(["ssh", "-p", str(endpoint.port), "-i", str(key), *(a for o in options for a in ("-o", o)),
                           f"{endpoint.user}@{endpoint.host}", command], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def provider(t: VastTwin, clock: FakeClock) -> VastProvider:
    return VastProvider(**t.provider_kwargs(), sleep=clock.sleep, clock=clock)


def test_the_launch_sends_env_as_an_object_and_values_arrive_exactly(tmp_path: Path, clock: FakeClock) -> None:
    with twin(tmp_path, clock) as t:
        p = provider(t, clock)
        odd = "a value with spaces, 'quotes' and $HOME"
        allocation = p.launch(p.offers()[0], allocation_id="al-env0000001",
                              env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-1", "NOTE": odd})
        assert t.violations == []
        assert t.rentals[allocation.ref].extra["env"] == {"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-1", "NOTE": odd,
                                                          "JUPYTER_PORTABLE_ALLOCATION_ID": "al-env0000001"}
        p.terminate(allocation)


def test_a_docker_flag_string_env_is_refused_as_vast_refuses_it(tmp_path: Path, clock: FakeClock) -> None:
    import httpx

    with twin(tmp_path, clock) as t:
        [ask] = t.asks
        answer = httpx.put(f"{t.url}/api/v0/asks/{ask}/", headers={"Authorization": f"Bearer {t.api_key}"},
                           json={"image": "vastai/base-image:@vastai-automatic-tag", "env": "-e A=1"})
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_args"
        assert t.running() == [] and len(t.violations) == 1


def test_a_pinned_driver_is_searched_as_the_clients_zero_padded_number(tmp_path: Path, clock: FakeClock) -> None:
    with twin(tmp_path, clock, offers=[H100, RTX]) as t:
        p = provider(t, clock)
        [offer] = p.offers(Requirements(driver="550.90.07"))
        assert (offer.gpu, offer.driver) == (H100.model, "550.90.07")
        assert p.search_query(Requirements(driver="550.90.07"))["driver_version"] == {"eq": 550090007}
        assert t.violations == []


def test_ssh_direct_is_searched_on_hosts_with_direct_ports(tmp_path: Path, clock: FakeClock) -> None:
    with twin(tmp_path, clock, offers=[H100, RTX], direct_ports={"H100 SXM": 0}) as t:
        p = provider(t, clock)
        assert [o.gpu for o in p.offers()] == [RTX.model]  # the H100's host has no direct port to give
        assert p.search_query()["direct_port_count"] == {"gte": 1}
        assert t.violations == []


def test_a_cuda_floor_asks_for_gpus_that_cuda_version_supports(tmp_path: Path, clock: FakeClock) -> None:
    # a Volta on a new driver lists CUDA 13, but CUDA 13 builds nothing for compute capability 7.0
    with twin(tmp_path, clock, offers=[V100, TwinOffer(**{**vars(H100), "cuda": "13.0"})]) as t:
        p = provider(t, clock)
        assert [o.gpu for o in p.offers(Requirements(min_cuda="13.0"))] == [H100.model]
        assert p.search_query(Requirements(min_cuda="13.0"))["compute_cap"] == {"gte": 750}
        assert [o.gpu for o in p.offers(Requirements(min_cuda="12.4"))] == [V100.model, H100.model]
        offer = p.offers(Requirements(min_cuda="12.4"))[0]
        assert offer.extra["compute_cap"] == 700
        assert t.violations == []


def test_a_container_that_stays_created_with_a_runtime_error_is_a_failed_launch_released_at_once(
        tmp_path: Path, clock: FakeClock) -> None:
    with twin(tmp_path, clock, broken_hosts={H100.model: RUNTIME_ERROR}) as t:
        p = provider(t, clock)
        started = clock()
        with pytest.raises(NoCapacity) as info:
            acquire(p.offers(), {"vastai": p}, Requirements(), allocation_id_factory=lambda: "al-broken00001",
                    boot_timeout_s=900, clock=clock, sleep=clock.sleep)
        [attempt] = info.value.context["attempts"]  # type: ignore[index]
        assert attempt.stage == "boot" and "unsatisfied condition: cuda>=12.8" in attempt.reason
        assert clock() - started < 60  # not the 900 s a machine still booting would get
        assert t.running() == []  # released
        assert t.violations == []


def test_while_booting_created_without_an_error_is_pending(tmp_path: Path, clock: FakeClock) -> None:
    with twin(tmp_path, clock) as t:
        p = provider(t, clock)
        allocation = p.launch(p.offers()[0], allocation_id="al-boot000001")
        clock.sleep(BOOT_S * 0.75)  # past "loading", into "created"
        status = p.status(allocation)
        assert status.state == "pending"
        p.terminate(allocation)


def test_after_a_host_side_restart_the_ssh_endpoint_is_read_again_and_followed(
        tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
    key = keygen(tmp_path / "launch_ed25519")
    with twin(tmp_path, clock) as t:
        p = provider(t, clock)
        allocation = p.launch(p.offers()[0], allocation_id="al-restart0001",
                              ssh_public_key=key.with_suffix(".pub").read_text())
        before = wait_reachable(p, allocation, clock)[-1].ssh
        assert before is not None
        presented = scan_host_key(before.host, before.port)
        assert presented is not None
        pin_host_key(allocation.allocation_id, before.host, before.port, presented)  # as acquire pins it
        allocation.ssh = before
        assert ssh(before, key, "echo kept > mark").returncode == 0

        t.restart(allocation.ref)
        assert p.status(allocation).state == "pending"  # booting again: no endpoint to use
        status = wait_reachable(p, allocation, clock)[-1]
        after = status.ssh
        assert after is not None and after.port != before.port == allocation.ssh.port
        assert after.port == t.machines[allocation.ref].port
        assert follow_endpoint(allocation, status) is True  # the same host key answers there
        assert allocation.ssh == after and follow_endpoint(allocation, status) is False
        known = known_hosts_path(allocation.allocation_id)
        out = strict_ssh(after, key, known, "cat mark")
        assert out.returncode == 0 and out.stdout.strip() == "kept", out.stderr  # the same disk, held to the key

        pin_host_key(allocation.allocation_id, before.host, before.port, new_host_key()[1])
        allocation.ssh = before
        with pytest.raises(LaunchFailed, match="another host key"):
            follow_endpoint(allocation, status)  # a key other than the pinned one there: not this machine
        p.terminate(allocation)
        assert t.running() == [] and t.violations == []
