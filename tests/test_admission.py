"""Admission refuses a machine that is not what the work pins, before any work runs; acquire
then tries the next route. Probes run the real nvidia-smi code path against the local market."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_local_market import MarketFactory, alive, market_factory, offer, wait_for

from jupyter_portable.compute.acquire import acquire
from jupyter_portable.compute.admission import (
    MachineFacts,
    Runner,
    admit,
    local_runner,
    probe_machine,
    refusals,
)
from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.gpus import Gpu
from jupyter_portable.core.errors import AdmissionRefused, NoCapacity
from jupyter_portable.core.offers import Requirements
from jupyter_portable.demo.fake_nvidia_smi import write_fake_nvidia_smi

H100 = Gpu(name="NVIDIA H100 80GB HBM3", driver="580.95.05", memory_mb=81559, uuid="GPU-1", index=0)


def facts(*gpus: Gpu, cuda: str | None = "13.0", note: str | None = None, image: str | None = None) -> MachineFacts:
    return MachineFacts(gpus=gpus, driver=gpus[0].driver if gpus else None, cuda_driver=cuda, gpu_note=note,
                        image=image)


@pytest.fixture
def make_market(tmp_path: Path) -> Iterator[MarketFactory]:
    with market_factory(tmp_path) as make:
        yield make


def ids() -> Any:
    counter = itertools.count(1)
    return lambda: f"alloc-{next(counter)}"


# --- the decision, as a pure function -------------------------------------------------------

def test_a_machine_that_meets_the_requirements_is_admitted() -> None:
    req = Requirements(gpus=("H100",), gpu_count=1, min_gpu_memory_gb=80, driver="580.95.05", min_cuda="12.4")
    assert refusals(req, facts(H100)) == {}
    admit(req, facts(H100), provider="local", offer="h100")
    admit(Requirements(gpu_count=0), facts(note="no GPU: nvidia-smi not found"))


def test_a_different_driver_than_the_pinned_one_is_refused() -> None:
    other = Gpu(name=H100.name, driver="580.105.08", memory_mb=81559, uuid="GPU-2", index=0)
    with pytest.raises(AdmissionRefused) as info:
        admit(Requirements(driver="580.95.05"), facts(other), provider="local", offer="h100")
    exc = info.value
    assert str(exc) == "admission refused local/h100: machine reports driver 580.105.08, 580.95.05 is pinned"
    assert (exc.provider, exc.offer) == ("local", "h100")
    assert exc.context["refusals"] == {"driver": "machine reports driver 580.105.08, 580.95.05 is pinned"}


def test_every_mismatch_is_listed() -> None:
    l4 = Gpu(name="NVIDIA L4", driver="550.54.15", memory_mb=23034, uuid="GPU-3", index=0)
    req = Requirements(gpus=("L4",), gpu_count=2, min_gpu_memory_gb=40, driver="580.95.05", min_cuda="12.8",
                       container_image="pytorch:2.4")
    assert refusals(req, facts(l4, cuda="12.4")) == {
        "gpu_count": "machine has 1 such GPU(s), 2 needed",
        "gpu_memory": "GPU 0 has 23034 MiB (24.2 GB), 40 GB needed",
        "driver": "machine reports driver 550.54.15, 580.95.05 is pinned",
        "cuda": "driver supports CUDA 12.4, at least 12.8 needed",
        "image": "machine does not say its image, pytorch:2.4 is required",
    }
    assert refusals(Requirements(gpus=("H100", "A100")), facts(l4)) == {
        "gpu": "machine has NVIDIA L4, not one of H100, A100"}
    # "24 GB" as listed is what a 23034 MiB L4 has: listings count 10^9 bytes, nvidia-smi MiB
    assert refusals(Requirements(min_gpu_memory_gb=24), facts(l4)) == {}


def test_a_machine_without_a_gpu_is_refused_with_the_probe_note() -> None:
    no_gpu = facts(cuda=None, note="no GPU: no devices were found")
    with pytest.raises(AdmissionRefused, match="no GPU: no devices were found"):
        admit(Requirements(), no_gpu, provider="local", offer="x")


# --- the probe, on a machine -----------------------------------------------------------------

def _allocation(folder: Path, bin_dir: Path, image: str | None = None) -> Allocation:
    return Allocation(allocation_id="m", provider="local", offer_id="x", ref="0", started="2030-01-01T00:00:00Z",
                      details={"dir": str(folder), "bin": str(bin_dir), "work": str(folder), "image": image,
                               "local": True})


def test_probe_reads_gpus_driver_cuda_and_image_from_the_machine(tmp_path: Path) -> None:
    write_fake_nvidia_smi(tmp_path / "bin", gpu="NVIDIA A100-SXM4-80GB", count=2, memory_mb=81920,
                          driver="580.105.08", cuda="13.0", uuid_seed="m")
    found = probe_machine(local_runner(_allocation(tmp_path, tmp_path / "bin", image="pytorch:2.4")))
    assert [(g.name, g.memory_mb) for g in found.gpus] == [("NVIDIA A100-SXM4-80GB", 81920)] * 2
    assert (found.driver, found.cuda_driver, found.gpu_note, found.image) == ("580.105.08", "13.0", None,
                                                                              "pytorch:2.4")


def test_probe_of_a_machine_without_nvidia_smi_notes_no_gpu(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()

    def bare(argv: list[str]) -> tuple[int, str, str]:
        # a real subprocess on a machine whose PATH has no nvidia-smi at all
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env={"PATH": str(empty)}, timeout=30)
        except FileNotFoundError as exc:
            return 127, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    runner: Runner = bare
    found = probe_machine(runner)
    assert found.gpus == () and found.driver is None
    assert found.gpu_note is not None and found.gpu_note.startswith("no GPU: nvidia-smi not found")
    with pytest.raises(AdmissionRefused, match="no GPU: nvidia-smi not found"):
        admit(Requirements(), found)


# --- acquire: the next route after a refusal ---------------------------------------------------

def test_acceptance_a_machine_reporting_another_driver_is_refused_and_the_next_route_used(
        make_market: MarketFactory) -> None:
    market = make_market([offer("stale-listing", gpu="NVIDIA A100-SXM4-80GB", driver="580.95.05",
                                actual_driver="580.105.08"),
                          offer("h100", driver="580.95.05")])
    events: list[dict[str, Any]] = []
    req = Requirements(driver="580.95.05")
    allocation, attempts = acquire(market.offers(), {"local": market}, req, allocation_id_factory=ids(),
                                   on_event=events.append, boot_timeout_s=20, poll_interval_s=0.05)
    try:
        assert len(attempts) == 1
        refused = attempts[0]
        assert (refused.offer_key, refused.stage, refused.error) == ("local/stale-listing", "admission",
                                                                     "AdmissionRefused")
        assert refused.environment_fault
        assert "580.105.08" in refused.reason and "580.95.05" in refused.reason
        assert refused.checks.to_json() == {"listed": True, "permitted": True, "capacity": True, "launched": True}
        assert (allocation.offer_id, allocation.allocation_id) == ("h100", "alloc-2")
        assert market.status(allocation).state in ("running", "reachable")
        assert wait_for(lambda: market.status(allocation).state == "reachable")
        # the refused machine was released: its worker is gone and the market says so
        first = market.allocation(refused.allocation_id or "")
        assert not alive(first.details["pid"])
        assert market.status(first).state == "terminated"
        assert [(e["state"], e["offer"]) for e in events] == [
            ("ACQUIRING", "local/stale-listing"), ("PROBING", "local/stale-listing"),
            ("REFUSED", "local/stale-listing"), ("ACQUIRING", "local/h100"), ("PROBING", "local/h100"),
            ("ACQUIRED", "local/h100")]
        assert events[2]["environment_fault"] is True and events[2]["released"] is True
        assert "580.105.08" in events[2]["reason"]
    finally:
        market.terminate(allocation)


def test_when_every_route_fails_each_reason_is_given(make_market: MarketFactory) -> None:
    market = make_market([offer("sold-out", capacity=0), offer("flaky", launch_failure_rate=1.0),
                          offer("stale", actual_driver="580.105.08"), offer("slow", boot_seconds=30)])
    events: list[dict[str, Any]] = []
    with pytest.raises(NoCapacity) as info:
        acquire(market.offers(), {"local": market}, Requirements(driver="580.95.05"), allocation_id_factory=ids(),
                on_event=events.append, boot_timeout_s=0.5, poll_interval_s=0.05)
    message = str(info.value)
    assert message.startswith("every route failed: ")
    for key in ("local/sold-out", "local/flaky", "local/stale", "local/slow"):
        assert key in message
    attempts = info.value.context["attempts"]
    assert [(a.stage, a.error, a.environment_fault) for a in attempts] == [
        ("capacity", "NoCapacity", False), ("launch", "LaunchFailed", False),
        ("admission", "AdmissionRefused", True), ("boot", "Timeout", False)]
    assert [a.checks.to_json() for a in attempts] == [
        {"listed": True, "permitted": True, "capacity": False, "launched": None},
        {"listed": True, "permitted": True, "capacity": True, "launched": False},
        {"listed": True, "permitted": True, "capacity": True, "launched": True},
        {"listed": True, "permitted": True, "capacity": True, "launched": False}]
    assert "still pending after 0.5s" in attempts[3].reason
    # nothing launched is left running
    assert {r["state"] for r in market.list_allocations()} == {"terminated"}
    assert all(not alive(r["pid"]) for r in market.list_allocations())
    assert [e["state"] for e in events].count("FAILED") == 3
    assert [e["state"] for e in events].count("REFUSED") == 1


def test_a_route_whose_provider_is_not_configured_is_skipped(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")])
    (listed,) = market.offers()
    elsewhere = replace(listed, provider="runpod")
    allocation, attempts = acquire([elsewhere, listed], {"local": market}, Requirements(),
                                   allocation_id_factory=ids(), poll_interval_s=0.05)
    try:
        assert [(a.offer_key, a.stage, a.error) for a in attempts] == [("runpod/h100", "provider",
                                                                         "ProviderUnavailable")]
        assert allocation.offer_id == "h100"
        assert os.path.isdir(allocation.details["work"])
    finally:
        market.terminate(allocation)
