"""The boot wait once a provider says running: sshd is knocked on between the provider's polls.

A real sshd comes up on the endpoint the fake provider names, part-way through a provider poll
interval; no test sleeps (the clock moves by the waits it is handed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sshd import Sshd, _free_port, start_sshd, unavailable

from jupyter_portable.compute.acquire import _wait_up, poll_intervals
from jupyter_portable.compute.base import Allocation, AllocationStatus, SshEndpoint
from jupyter_portable.compute.keys import pinned_key
from jupyter_portable.core.errors import ComputeError


class _Clock:
    """Moves on by each wait it is handed; ``on_sleep`` runs after each one."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 100.0
        self.waits: list[float] = []
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self)


class _Running:
    """A provider that says running at ``endpoint`` from its first answer (as RunPod does once
    the pod's port is mapped, before the container's sshd serves)."""

    name = "fakecloud"
    min_poll_interval_s = 1.0

    def __init__(self, endpoint: SshEndpoint, state: str = "running") -> None:
        self.endpoint = endpoint
        self.state = state
        self.polls = 0

    def status(self, allocation: Allocation) -> AllocationStatus:
        self.polls += 1
        return AllocationStatus(state=self.state, ssh=self.endpoint)


@pytest.fixture(name="ssh_state")
def _ssh_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "ssh-state"
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(state))
    return state


def _allocation() -> Allocation:
    return Allocation(allocation_id="a-probe", provider="fakecloud", offer_id="o", ref="r", started="now")


def test_sshd_that_comes_up_between_provider_polls_is_taken_at_once(tmp_path: Path, ssh_state: Path) -> None:
    port = _free_port()
    started: list[Sshd] = []

    def bring_up_sshd(clock: _Clock) -> None:
        if len(clock.waits) == 3 and not started:  # 1.5 s after the provider's first "running"
            started.append(start_sshd(tmp_path / "sshd", port=port))

    provider = _Running(SshEndpoint(host="127.0.0.1", port=port))
    clock = _Clock(bring_up_sshd)
    allocation = _allocation()
    try:
        _wait_up(provider, allocation, 600.0, poll_intervals(10.0, 10.0),  # type: ignore[arg-type]
                 clock=clock, sleep=clock.sleep, sshd_probe_s=0.5)
        assert started, "the wait ended before sshd was up"
        assert allocation.ssh == SshEndpoint(host="127.0.0.1", port=port)
        assert pinned_key(allocation.allocation_id) == " ".join(started[0].host_key_line().split()[1:3])
        assert provider.polls == 1  # sshd answered within the first 10 s interval: the API was asked once
        assert clock.waits == [0.5, 0.5, 0.5]  # taken at the first knock after it listened, not at 10 s
    finally:
        for server in started:
            server.stop()


def test_without_an_answer_the_provider_is_still_asked_at_its_own_pace(ssh_state: Path) -> None:
    """Nothing listens: sshd is knocked on every 0.5 s, the provider is asked only when its interval
    is up, and the boot timeout still ends the wait."""
    provider = _Running(SshEndpoint(host="127.0.0.1", port=_free_port()))
    clock = _Clock()
    with pytest.raises(ComputeError, match="sshd does not answer yet"):
        _wait_up(provider, _allocation(), 6.0, poll_intervals(2.0, 2.0),  # type: ignore[arg-type]
                 clock=clock, sleep=clock.sleep, sshd_probe_s=0.5)
    assert set(clock.waits) == {0.5}
    assert sum(clock.waits) == 6.0
    assert provider.polls == 4  # at 0, 2, 4 and 6 s: one every 2 s, never more often


def test_a_machine_without_an_endpoint_is_not_knocked_on(ssh_state: Path) -> None:
    """Booting, or running with no endpoint yet: only the provider is asked, at its intervals."""
    for state, endpoint in (("booting", SshEndpoint(host="127.0.0.1", port=_free_port())), ("running", None)):
        provider = _Running(endpoint, state=state)  # type: ignore[arg-type]
        clock = _Clock()
        with pytest.raises(ComputeError, match="still"):
            _wait_up(provider, _allocation(), 4.0, poll_intervals(1.0, 1.0),  # type: ignore[arg-type]
                     clock=clock, sleep=clock.sleep, sshd_probe_s=0.5)
        assert clock.waits == [1.0, 1.0, 1.0, 1.0], state
        assert provider.polls == 5


def test_a_slow_knock_does_not_put_off_the_providers_next_poll(ssh_state: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A knock that takes seconds (a firewall dropping packets: ssh-keyscan waits out its timeout)
    still lets the provider be asked when its interval is up, by the clock."""
    import jupyter_portable.compute.acquire as acquire_mod

    clock = _Clock()
    knocks: list[float] = []

    def slow_knock(allocation: Allocation, st: Any) -> str:
        knocks.append(clock.now)
        clock.now += 3.0  # the knock itself took 3 s
        return "running, but sshd does not answer yet"

    monkeypatch.setattr(acquire_mod, "_ssh_ready", slow_knock)
    provider = _Running(SshEndpoint(host="127.0.0.1", port=_free_port()))
    with pytest.raises(ComputeError, match="sshd does not answer yet"):
        _wait_up(provider, _allocation(), 20.0, poll_intervals(4.0, 4.0),  # type: ignore[arg-type]
                 clock=clock, sleep=clock.sleep, sshd_probe_s=0.5)
    # a poll's own knock (3 s), then one more before the 4 s are up: polls at 0, 7, 14 and 21 s; without
    # the clock, eight knocks (28 s) would pass between two polls
    assert provider.polls == 4
    assert len(knocks) == 4 + 3
