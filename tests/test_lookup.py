"""Lost answers are looked up until they are known (issue 42 item 3): after a launch answered with a
5xx or a timeout, the machine is looked for by its name with backoff for a bounded time, on the clock
and sleep given; only a machine confirmed absent lets the next route start."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_portable.compute.acquire import acquire
from jupyter_portable.compute.base import MachineInfo, Provider, look_up_until_known
from jupyter_portable.core.errors import ProviderUnavailable
from jupyter_portable.core.offers import Offer, Requirements


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def machine(state: str = "pending") -> MachineInfo:
    return MachineInfo(provider="p", ref="m-1", allocation_id="al-1", workspace_id=None, state=state)


def answers(*seq: Any) -> Any:
    """A listing answering each of ``seq`` in turn (then the last again): [] (absent), a machine, or an error."""
    calls: list[int] = []

    def find() -> list[MachineInfo]:
        item = seq[min(len(calls), len(seq) - 1)]
        calls.append(1)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[no-any-return]
    find.calls = calls  # type: ignore[attr-defined]
    return find


def test_a_machine_listed_late_is_found_after_backing_off() -> None:
    clock = Clock()
    find = answers([], [], [], [machine()])
    assert look_up_until_known(find, budget_s=180, clock=clock, sleep=clock.sleep) == machine()
    assert len(find.calls) == 4 and clock.slept == [2.0, 4.0, 8.0]


def test_absent_at_every_look_for_the_budget_is_confirmed_absent() -> None:
    clock = Clock()
    find = answers([])
    assert look_up_until_known(find, budget_s=60, clock=clock, sleep=clock.sleep) is None
    assert len(find.calls) >= 4 and sum(clock.slept) <= 60  # bounded, and never sleeps past it


def test_a_terminated_machine_is_not_the_one_the_launch_made() -> None:
    clock = Clock()
    assert look_up_until_known(answers([machine("terminated")]), budget_s=10, clock=clock,
                               sleep=clock.sleep) is None


def test_a_listing_that_fails_to_the_end_says_the_machine_may_be_running() -> None:
    clock = Clock()
    err = ProviderUnavailable("listing failed", provider="p")
    with pytest.raises(ProviderUnavailable) as info:
        look_up_until_known(answers([], err), budget_s=30, clock=clock, sleep=clock.sleep)
    assert info.value.context.get("may_be_running") is True


def test_a_listing_that_fails_then_answers_absent_is_absent() -> None:
    clock = Clock()
    err = ProviderUnavailable("listing failed", provider="p")
    assert look_up_until_known(answers(err, err, []), budget_s=30, clock=clock, sleep=clock.sleep) is None


class Unsure(Provider):
    """A launch answered 5xx whose machine could not be looked up: it may be running."""

    name = "unsure"

    def __init__(self) -> None:
        self.launches = 0

    def check_permission(self, offer: Offer) -> None:
        return None

    def check_capacity(self, offer: Offer) -> int | None:
        return None

    def launch(self, offer: Offer, **kw: Any) -> Any:
        self.launches += 1
        raise ProviderUnavailable("launch answered 500; looking it up by its name failed too: machine al-x may be "
                                  "running", provider=self.name, status=500, may_be_running=True)


def _offer(i: int) -> Offer:
    return Offer(provider="unsure", id=f"o{i}", gpu="NVIDIA H100 80GB HBM3", gpu_count=1, gpu_memory_gb=80,
                 price_per_hour=1.0 + i, region="r")


def test_no_other_route_is_launched_while_a_lost_launch_may_be_running() -> None:
    provider = Unsure()
    events: list[dict[str, Any]] = []
    with pytest.raises(ProviderUnavailable, match="may be running") as info:
        acquire([_offer(1), _offer(2)], {"unsure": provider}, Requirements(), allocation_id_factory=lambda: "al-x",
                on_event=events.append)
    assert provider.launches == 1  # the second route was never launched
    assert [a.offer_key for a in info.value.context["attempts"]] == ["unsure/o1"]
    assert info.value.hint
