"""Spend is the bill (issue 27, item 2): RunPod's ``/v2/billing/pods``, Vast's ``/api/v0/charges``,
each figure with its source (bill, provider-rate, estimate); the last figure seen is kept when a
pod that exited reads $0; a lost machine's spend is never $0; a launched attempt given up on is
charged. Against the twins, on one fake clock: the twin's calendar (its records and bills) and the
provider's ``now`` both follow it, so nothing reads the real time.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sshd import unavailable
from twins.runpod import DISK_PER_GB_MONTH, RunPodTwin
from twins.server import TwinOffer
from twins.vastai import DOWN_PER_GB, STORAGE_PER_GB_MONTH, UP_PER_GB, VastTwin

from jupyter_portable.compute.acquire import acquire
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider
from jupyter_portable.compute.runpod import RunPodProvider
from jupyter_portable.compute.vastai import VastProvider
from jupyter_portable.core.errors import NoCapacity, ProviderUnavailable
from jupyter_portable.core.offers import Requirements
from jupyter_portable.core.spend import settled_spend, spend_line, spend_source
from jupyter_portable.orchestration.budget import settle

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
OFFER = TwinOffer(gpu="NVIDIA H100 80GB HBM3", model="H100 SXM", memory_mb=81559, price=3.6, driver="550.90.07",
                  cuda="12.4", stock=2, region="US-TX-3")
HOUR = 3600.0


class Clock:
    """The test's one clock: seconds for the twin's boot and the provider's waits, and the calendar
    date both sides stamp records with."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def date(self) -> datetime:
        return T0 + timedelta(seconds=self.now)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def needs_machines() -> None:
    if unavailable():
        pytest.skip(unavailable() or "")


def wait_up(provider: Provider, allocation: Allocation, clock: Clock) -> AllocationStatus:
    for _ in range(400):
        status = provider.status(allocation)
        if status.state == "reachable":
            return status
        subprocess.run(["sleep", "0.05"], check=True)  # the machine's sshd starts in real time
    raise AssertionError(f"never reachable: {status}")


# -- the rule --------------------------------------------------------------------------------

def test_an_ended_machines_spend_is_the_bill_else_the_last_figure_else_an_estimate_never_zero() -> None:
    assert settled_spend((4.2, "bill"), (3.0, "provider-rate"), 3.6, HOUR) == (4.2, "bill")
    # a pod that exited reads $0: the last figure seen while it ran stands
    assert settled_spend((0.0, "provider-rate"), (3.0, "provider-rate"), 3.6, HOUR) == (3.0, "provider-rate")
    assert settled_spend((None, None), (2.5, "provider"), 3.6, HOUR) == (2.5, "provider-rate")  # an old name
    # nothing from the provider, nothing seen: its price for the time it was held, marked an estimate
    assert settled_spend(None, None, 3.6, HOUR / 2) == (pytest.approx(1.8), "estimate")
    assert settled_spend(None, (0.0, "provider-rate"), 3.6, 60) == (pytest.approx(0.06), "estimate")
    assert settled_spend(None, None, None, HOUR) == (0.0, "estimate")  # no price known: nothing to say
    assert [spend_source(s) for s in ("bill", "provider", "estimate", "guess", None)] == [
        "bill", "provider-rate", "estimate", "estimate", "estimate"]


def test_the_spend_line_says_how_much_of_it_is_an_estimate() -> None:
    assert spend_line(3.0, 1.0) == "$3.00 so far: $1.00 on this machine, $2.00 before"
    assert spend_line(3.0, 1.0, estimated=0.5) == "$3.00 so far: $1.00 on this machine, $2.00 before ($0.50 of it " \
                                                  "estimated)"
    assert spend_line(3.0, None, estimated=3.0) == "$3.00 so far, on earlier machines (all estimated)"


class Lost(Provider):
    """A provider that no longer answers for its machine."""

    name = "runpod"

    def spend(self, allocation: Allocation) -> tuple[float | None, str | None]:
        raise ProviderUnavailable("runpod did not answer", provider="runpod")


def test_a_lost_machine_whose_provider_says_nothing_is_charged_its_rate_up_to_the_loss() -> None:
    lost = Allocation("al-1", "runpod", "o", "pod-1", T0.isoformat())
    spend, source = settle(Lost(), lost, until=T0 + timedelta(minutes=90), price_per_hour=2.0, started=T0.isoformat())
    assert (spend, source) == (pytest.approx(3.0), "estimate")
    spend, source = settle(Lost(), lost, until=T0 + timedelta(minutes=90), price_per_hour=2.0,
                           started=T0.isoformat(), seen=(2.75, "provider-rate"))
    assert (spend, source) == (2.75, "provider-rate")


# -- RunPod ----------------------------------------------------------------------------------

def runpod(tmp_path: Path, clock: Clock, **kw: Any) -> RunPodTwin:
    return RunPodTwin(tmp_path / "machines", offers=[TwinOffer(**vars(OFFER))], clock=clock, wall=clock.date, **kw)


def test_runpod_spend_is_its_billing_records_for_the_pod(tmp_path: Path, clock: Clock) -> None:
    needs_machines()
    with runpod(tmp_path, clock, boot_delay_s=10) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock, now=clock.date)
        offer = next(o for o in p.offers() if not o.spot)
        allocation = p.launch(offer, allocation_id="al-bill0000001")
        assert allocation.started == clock.date().isoformat(timespec="seconds").replace("+00:00", "Z")
        clock.sleep(2.5 * HOUR)
        spend, source = p.spend(allocation)
        assert source == "bill"
        disk = 50 * DISK_PER_GB_MONTH / 720
        assert spend == pytest.approx(2.5 * (3.6 + disk))  # GPU and disk, as RunPod bills them
        [billing] = [r for r in twin.requests if r["op"] == "listPodBilling"]
        assert dict(billing["query"])["podId"] == allocation.ref and dict(billing["query"])["bucketSize"] == "hour"
        p.terminate(allocation)
        clock.sleep(HOUR)
        assert p.spend(allocation) == (pytest.approx(2.5 * (3.6 + disk)), "bill")  # nothing after the delete
        assert twin.violations == []


def test_an_exited_runpod_pod_reads_zero_so_its_status_says_nothing_and_the_bill_still_counts(
        tmp_path: Path, clock: Clock) -> None:
    needs_machines()
    with runpod(tmp_path, clock, boot_delay_s=10) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), include_spot=True, sleep=clock.sleep, clock=clock, now=clock.date)
        offer = next(o for o in p.offers() if o.spot)
        allocation = p.launch(offer, allocation_id="al-spot0000001")
        assert allocation.started == clock.date().isoformat(timespec="seconds").replace("+00:00", "Z")
        clock.sleep(HOUR)
        seen = p.status(allocation)
        bid = offer.price_per_hour  # a spot pod costs its bid (0.6 x the on-demand 3.6 by default)
        assert seen.spend == pytest.approx(bid) and bid == pytest.approx(0.6 * 3.6)
        assert seen.spend_source == "provider-rate"
        twin.kill(allocation.ref, "outbid")
        clock.sleep(HOUR)
        gone = p.status(allocation)
        assert gone.state == "lost" and gone.spend is None  # its cost reads 0.0 once EXITED: no figure
        spend, source = settle(p, allocation, until=clock.date(), price_per_hour=offer.price_per_hour,
                               started=allocation.started, seen=(gone.spend, gone.spend_source))
        assert source == "bill" and spend == pytest.approx(bid + 2 * 50 * DISK_PER_GB_MONTH / 720)  # GPU to the exit
        p.terminate(allocation)
        assert twin.violations == []


def test_a_boot_that_timed_out_is_charged_what_it_ran(tmp_path: Path, clock: Clock) -> None:
    needs_machines()
    with runpod(tmp_path, clock, boot_delay_s=100_000) as twin:
        p = RunPodProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock, now=clock.date)
        offer = next(o for o in p.offers() if not o.spot)
        with pytest.raises(NoCapacity) as info:
            acquire([offer], {"runpod": p}, Requirements(), allocation_id_factory=lambda: "al-slow0000001",
                    boot_timeout_s=600, clock=clock, sleep=clock.sleep)
        [attempt] = info.value.context["attempts"]  # type: ignore[index]
        assert attempt.error == "Timeout" and twin.running() == []
        assert attempt.spend_source == "bill" and attempt.spend == pytest.approx(600 / HOUR * 3.6, rel=0.05)
        assert attempt.to_json()["spend"] == attempt.spend

        from jupyter_portable.orchestration.routes import record_attempt

        recorded: list[dict[str, Any]] = []

        class Ws:
            def record_allocation(self, record: dict[str, Any], epoch: int | None = None) -> None:
                recorded.append(record)

        record_attempt(Ws(), attempt)  # type: ignore[arg-type]
        assert (recorded[0]["state"], recorded[0]["spend_source"]) == ("failed", "bill")
        assert recorded[0]["spend"] == pytest.approx(attempt.spend)
        assert twin.violations == []


# -- Vast.ai ---------------------------------------------------------------------------------

def vast(tmp_path: Path, clock: Clock, **kw: Any) -> VastTwin:
    return VastTwin(tmp_path / "machines", offers=[TwinOffer(**vars(OFFER))], clock=clock, wall=clock.date, **kw)


def test_vast_spend_is_its_charges_gpu_disk_and_bandwidth_from_when_it_ran(tmp_path: Path, clock: Clock) -> None:
    needs_machines()
    with vast(tmp_path, clock, boot_delay_s=HOUR / 2) as twin:
        p = VastProvider(**twin.provider_kwargs(), sleep=clock.sleep, clock=clock, now=clock.date)
        allocation = p.launch(p.offers()[0], allocation_id="al-vast0000001")
        assert allocation.started == clock.date().isoformat(timespec="seconds").replace("+00:00", "Z")
        assert p.spend(allocation)[1] == "provider-rate"  # not running yet: no charges, its rate stands in
        clock.sleep(HOUR / 2)  # half an hour loading: not charged
        wait_up(p, allocation, clock)
        clock.sleep(HOUR)
        twin.transfer(allocation.ref, up_gb=20.0, down_gb=5.0)  # snapshots go up; Vast bills bytes
        spend, source = p.spend(allocation)
        expected = 3.6 + 50 * STORAGE_PER_GB_MONTH / 720 + 20 * UP_PER_GB + 5 * DOWN_PER_GB
        assert source == "bill" and spend == pytest.approx(expected, abs=0.002)  # rounded to 3 places, as Vast does
        rate = p.status(allocation)
        assert rate.spend_source == "provider-rate" and rate.spend == pytest.approx(1.5 * 3.6)  # from start_date
        [charges] = [r for r in twin.requests if r["op"] == "showCharges"][-1:]
        assert '"type":{"in":["instance"]}' in dict(charges["query"])["select_filters"]
        p.terminate(allocation)
        clock.sleep(HOUR)
        assert p.spend(allocation) == (pytest.approx(expected, abs=0.002), "bill")  # the record stays, ended
        assert twin.violations == []
