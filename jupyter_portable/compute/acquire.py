"""ACQUIRING and PROBING: get one admitted machine from routes in rank order.

For each route: permitted? capacity now? launch, wait until it runs, probe it on the
machine, admit it. Any refusal or failure releases what was launched, is recorded as an
:class:`Attempt` with its reason and the four checks as far as they went, and the next
route is tried. Listed is not available, and launched is not admitted: the record says
which of these the route got through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from jupyter_portable.compute.admission import Runner, admit, local_runner, probe_machine
from jupyter_portable.compute.base import Allocation, Provider
from jupyter_portable.core.errors import (
    AdmissionRefused,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    PortableError,
    ProviderUnavailable,
)
from jupyter_portable.core.images import CONTAINER_IMAGE_PROVIDERS, image_for
from jupyter_portable.core.offers import Checks, Offer, Requirements
from jupyter_portable.core.spend import settled_spend

EventSink = Callable[[dict[str, Any]], None]
_UP = ("running", "reachable")
_DOWN = ("lost", "terminated", "stopped")
# the check a failure at each stage answers "no" to
_CHECK_OF_STAGE = {"permission": "permitted", "capacity": "capacity", "launch": "launched", "boot": "launched"}


@dataclass(frozen=True)
class Attempt:
    """One route tried and given up. ``stage``: provider, permission, capacity, launch, boot,
    probe or admission. ``environment_fault``: the machine was wrong, the work never ran. A machine
    that was launched is paid for even so: ``spend`` (dollars) and ``spend_source`` (one of
    :data:`~jupyter_portable.core.spend.SPEND_SOURCES`) say what it cost; None when none was launched."""

    offer_key: str
    stage: str
    error: str  # the error's class name, or "Timeout"
    reason: str
    checks: Checks
    environment_fault: bool = False
    allocation_id: str | None = None
    spend: float | None = None
    spend_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"offer": self.offer_key, "stage": self.stage, "error": self.error, "reason": self.reason,
                "checks": self.checks.to_json(), "environment_fault": self.environment_fault,
                "allocation_id": self.allocation_id, "spend": self.spend, "spend_source": self.spend_source}


class _BootTimeout(LaunchFailed):
    """Internal: the machine did not come up in time (recorded as error "Timeout")."""


REMOTE_PYTHON_ENV = "JUPYTER_PORTABLE_REMOTE_PYTHON"
REMOTE_WORKDIR_ENV = "JUPYTER_PORTABLE_REMOTE_WORKDIR"


def cloud_ssh(allocation: Allocation, key: str | None = None) -> tuple[Any, Allocation]:
    """A cloud machine reached the same way as an ``ssh`` host: an :class:`~.sshlink.SshLink` for
    its endpoint alone, held strictly to the host key pinned for this allocation (:mod:`.keys`),
    and the allocation as that link knows it. The key is the user's (:func:`.keys.user_key`);
    the Python is ``details["python"]`` (the bootstrapped worker's), else ``c.PortableRemote.python``
    (``JUPYTER_PORTABLE_REMOTE_PYTHON``), else ``python3`` (the image's); allocations go under
    ``c.PortableRemote.workdir`` (``JUPYTER_PORTABLE_REMOTE_WORKDIR``, else ``~/.jupyter-portable``)."""
    from dataclasses import replace
    from pathlib import Path

    from jupyter_portable.compute.hosts import Host
    from jupyter_portable.compute.keys import require_pinned, user_key
    from jupyter_portable.compute.sshlink import SshLink, default_state_dir
    from jupyter_portable.core.envconfig import PortableRemote

    if allocation.ssh is None:
        raise NotSupported(f"{allocation.provider} gave no SSH endpoint for {allocation.allocation_id}",
                           provider=allocation.provider, offer=allocation.offer_id)
    key_path = Path(key).expanduser() if key else user_key().private
    python = allocation.details.get("python")
    remote = PortableRemote.current()
    host = Host(name=allocation.allocation_id, host=allocation.ssh.host, port=allocation.ssh.port,
                user=allocation.ssh.user, key=key_path if key_path.exists() else None, proxy=allocation.ssh.proxy,
                python=python if isinstance(python, str) and python else
                remote.python or "python3", workdir=remote.workdir)
    return (SshLink([host], state_dir=default_state_dir(), known_hosts=require_pinned(allocation.allocation_id),
                    multiplex=True),
            replace(allocation, offer_id=host.name))


def cloud_ssh_run(allocation: Allocation, key: str | None = None) -> Callable[..., tuple[int, str, str]]:
    """Run commands on a cloud machine the same way as on an ``ssh`` host (see :func:`cloud_ssh`)."""
    ssh, shim = cloud_ssh(allocation, key)

    def run(target: Allocation, argv: list[str]) -> tuple[int, str, str]:
        return ssh.run(shim, argv)  # type: ignore[no-any-return]

    return run


def default_runner(provider: Provider, allocation: Allocation) -> Runner:
    """How to run commands on ``allocation``: a subprocess for the local market, else the
    provider's own ``run(allocation, argv)`` (the SSH providers have one)."""
    if allocation.details.get("local"):
        return local_runner(allocation)
    run = getattr(provider, "run", None)
    if not callable(run) and allocation.ssh is not None:
        run = cloud_ssh_run(allocation)
    if not callable(run):
        raise NotSupported(f"cannot run commands on {allocation.provider} machines, so cannot probe them",
                           provider=allocation.provider, offer=allocation.offer_id)

    def runner(argv: list[str]) -> tuple[int, str, str]:
        try:
            return run(allocation, argv)
        except PortableError as exc:  # a Runner never raises; 255 is what ssh answers when it fails
            return 255, "", exc.one_line()

    return runner


def poll_intervals(first_s: float, max_s: float, factor: float = 1.5) -> Iterator[float]:
    """The waits between status polls: ``first_s``, growing by ``factor``, never over ``max_s``."""
    wait = max(0.0, first_s)
    while True:
        yield min(wait, max_s)
        wait *= factor


def _needs_ssh(provider: Provider, allocation: Allocation) -> bool:
    """A cloud machine: reached over SSH at the endpoint its provider gives (not the local
    market's processes, not an ``ssh`` host, which runs commands itself)."""
    return not allocation.details.get("local") and not callable(getattr(provider, "run", None))


def _ssh_ready(allocation: Allocation, st: Any) -> str | None:
    """None once the machine can be reached: an endpoint, sshd answering, its host key pinned
    for this allocation. Otherwise what it is still waiting for."""
    from jupyter_portable.compute.keys import pin_host_key, scan_host_key

    if st.ssh is None:
        return "running, but no SSH endpoint yet"
    presented = scan_host_key(st.ssh.host, st.ssh.port, proxy=st.ssh.proxy)
    if presented is None:
        return f"running at {st.ssh.host}:{st.ssh.port}, but sshd does not answer yet"
    sent = allocation.details.get("host_key")
    if isinstance(sent, str) and sent.split()[:2] != presented.split()[:2]:
        # cloud-init installs the key it was sent before sshd serves; until then, keep waiting
        return "sshd answers with a host key other than the one sent at launch"
    allocation.ssh = st.ssh
    allocation.details["host_key_fingerprint"] = pin_host_key(allocation.allocation_id, st.ssh.host, st.ssh.port,
                                                              sent if isinstance(sent, str) else presented)
    allocation.details["host_key_source"] = "user data" if isinstance(sent, str) else "first use"
    return None


def follow_endpoint(allocation: Allocation, st: Any) -> bool:
    """Whether the machine's SSH endpoint moved and the allocation now follows it. A host-side
    restart or a stop and start may map SSH to another port (Vast) or address: when ``st`` (a
    reachable status) names an endpoint other than the allocation's, and sshd there presents the host
    key pinned for this allocation, the allocation takes the new endpoint and the key is pinned there.
    Another key there is refused (LaunchFailed): that is not this machine."""
    from jupyter_portable.compute.keys import pin_host_key, pinned_key, scan_host_key

    new, old = st.ssh, allocation.ssh
    if new is None or old is None or (new.host, new.port, new.user) == (old.host, old.port, old.user):
        return False
    pinned = pinned_key(allocation.allocation_id)
    presented = scan_host_key(new.host, new.port)
    if pinned is None or presented is None:
        return False  # nothing to hold it to yet, or sshd is not up there yet: look again next time
    if presented.split()[:2] != pinned.split()[:2]:
        raise LaunchFailed(f"{allocation.provider} now maps {allocation.allocation_id}'s SSH to "
                           f"{new.host}:{new.port}, where sshd presents another host key than the one pinned for it",
                           provider=allocation.provider, offer=allocation.offer_id,
                           hint="the machine is not trusted there; release it")
    pin_host_key(allocation.allocation_id, new.host, new.port, pinned)
    allocation.ssh = new
    return True


def attempt_spend(provider: Provider, allocation: Allocation, price_per_hour: float,
                  held_s: float) -> tuple[float, str]:
    """What a launched machine given up on cost: its provider's figure (asked once it is released,
    so a bill covers all of it), else ``price_per_hour`` x ``held_s`` as an estimate."""
    try:
        billed = provider.spend(allocation)
    except PortableError:
        billed = None
    return settled_spend(billed, None, price_per_hour, held_s)


# how often sshd is knocked on once the provider says running and names an endpoint: that is a
# connection to the machine, not a request to the provider's API, so its rate limit does not apply
SSHD_PROBE_S = 0.5


def _wait_up(provider: Provider, allocation: Allocation, timeout_s: float, intervals: Iterator[float], *,
             clock: Callable[[], float], sleep: Callable[[float], None],
             on_wait: Callable[[float, str], None] | None = None, sshd_probe_s: float = SSHD_PROBE_S) -> None:
    """Poll until the machine is up. For a cloud machine "up" means the provider says running,
    an SSH endpoint exists, and sshd answers (its host key is then pinned, see :mod:`.keys`).

    The provider is asked at ``intervals`` (never faster than its ``min_poll_interval_s``). Between
    two of its answers that say running at an endpoint where sshd is not up yet (a container or
    cloud-init still starting it, often for tens of seconds), sshd itself is tried every
    ``sshd_probe_s``, so a machine is taken the moment it answers rather than up to one backed-off
    provider poll later."""
    # a provider's documented rate is a floor on every wait, even the last before the deadline
    floor = float(getattr(provider, "min_poll_interval_s", 0.0) or 0.0)
    started = clock()
    deadline = started + timeout_s
    needs_ssh = _needs_ssh(provider, allocation)
    while True:
        st = provider.status(allocation)
        waiting = st.state
        if st.state in _UP:
            pending = _ssh_ready(allocation, st) if needs_ssh else None
            if pending is None:
                if st.ssh is not None and allocation.ssh is None:
                    allocation.ssh = st.ssh
                return
            waiting = pending
        if st.state in _DOWN or st.state == "unknown":
            # unknown while booting (Vast's unknown/offline host) does not reach running: its docs
            raise LaunchFailed(f"the machine was {st.state} while booting" + (f": {st.reason}" if st.reason else ""),
                               provider=provider.name, offer=allocation.offer_id)
        now = clock()
        if now >= deadline:
            raise _BootTimeout(f"still {waiting} after {timeout_s:g}s", provider=provider.name,
                               offer=allocation.offer_id)
        if on_wait is not None:
            on_wait(now - started, waiting)
        wait = max(floor, min(next(intervals), deadline - now))
        if not (st.state in _UP and st.ssh is not None and sshd_probe_s > 0):
            sleep(wait)
            continue
        # the endpoint is known, sshd is not up: knock on it until the provider's next poll is due,
        # by the clock (a knock on a port that drops packets takes seconds) or by the waits summed
        # (so a clock that stands still ends it too)
        slept, due = 0.0, now + wait
        while slept < wait:
            step = min(sshd_probe_s, wait - slept)
            sleep(step)
            slept += step
            if slept >= wait or clock() >= min(due, deadline):
                break  # the provider is asked next: the deadline, or whether it still says running
            if _ssh_ready(allocation, st) is None:
                return


def acquire(offers_in_rank_order: list[Offer], providers: dict[str, Provider], requirements: Requirements, *,
            allocation_id_factory: Callable[[], str], on_event: EventSink | None = None, boot_timeout_s: float = 120,
            poll_interval_s: float = 1.0, poll_max_s: float = 10.0,
            runner_for: Callable[[Provider, Allocation], Runner] = default_runner,
            ssh_public_key: str | None = None, launch_env: dict[str, str] | None = None,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
            boot_timeouts: dict[str, float] | None = None,
            on_launched: Callable[[Allocation], None] | None = None) -> tuple[Allocation, list[Attempt]]:
    """The first admitted allocation, and every attempt given up on the way.

    Raises NoCapacity("every route failed: ...") naming each route's reason when none is
    admitted (``exc.context["attempts"]`` holds them). A launch whose answer was lost and whose
    machine could not be confirmed absent (``may_be_running``) ends it there, with that error: no
    other route is launched while a machine may run unseen. Events, one dict each, go to
    ``on_event``: ``{"state": "ACQUIRING" | "WARNING" | "PROBING" | "REFUSED" | "FAILED" | "ACQUIRED",
    "offer": key, "reason": ..., "checks": {...}, ...}``. While a machine boots its status is
    polled every ``poll_interval_s``, backing off to ``poll_max_s`` (never faster than the
    provider's ``min_poll_interval_s``), on ``clock`` and ``sleep``, for ``boot_timeouts[provider]``
    seconds (else ``boot_timeout_s``); ``{"state": "BOOTING", "waited_s": ..., "reason": ...}`` says
    what it still waits for. A provider that takes user data (``accepts_host_key``) is sent a fresh
    host key for the machine, which is then the only one it is trusted with. ``on_launched`` gets
    each allocation the moment its provider accepted it, before the boot wait (to record its id).
    """
    attempts: list[Attempt] = []

    def emit(state: str, offer: Offer, checks: Checks, **extra: Any) -> None:
        if on_event is not None:
            on_event({"state": state, "offer": offer.key, "reason": None, "checks": checks.to_json(), **extra})

    for offer in offers_in_rank_order:
        checks = Checks()
        emit("ACQUIRING", offer, checks)
        provider = providers.get(offer.provider)
        stage = "provider"
        allocation: Allocation | None = None
        launched_at = clock()
        try:
            if provider is None:
                raise ProviderUnavailable(f"no provider {offer.provider!r} is configured", provider=offer.provider,
                                          offer=offer.id)
            stage = "permission"
            provider.check_permission(offer)
            checks.permitted = True
            stage = "capacity"
            free = provider.check_capacity(offer)
            if free is not None and free <= 0:
                raise NoCapacity(f"{offer.key}: none free now", provider=provider.name, offer=offer.id)
            checks.capacity = None if free is None else True
            checks.notes["capacity"] = "the provider cannot say before launching" if free is None else f"{free} free"
            stage = "launch"
            launch_kw: dict[str, Any] = {}
            if getattr(provider, "accepts_host_key", False):
                from jupyter_portable.compute.keys import host_key_pair

                launch_kw["host_key"] = host_key_pair()
            launched_at = clock()
            # each provider gets only its own kind of image (core/images): never an AMI as a container
            image = image_for(provider.name, requirements.container_image, requirements.machine_image)
            # what the provider can say against the image before anything is rented (RunPod: a custom image)
            image_warning = getattr(provider, "image_warning", None)
            warning = image_warning(image) if callable(image_warning) else None
            if warning:
                checks.notes["image"] = warning
                emit("WARNING", offer, checks, reason=warning)
            allocation = provider.launch(offer, allocation_id=allocation_id_factory(), image=image,
                                         ssh_public_key=ssh_public_key, env=launch_env, **launch_kw)
            launch_kw.clear()  # the private host key lives in the machine's user data only
            if on_launched is not None:
                on_launched(allocation)
            stage = "boot"

            def waiting(waited: float, why: str, offer: Offer = offer, checks: Checks = checks,
                        aid: str = allocation.allocation_id) -> None:
                emit("BOOTING", offer, checks, reason=why, waited_s=round(waited, 1), allocation_id=aid)

            _wait_up(provider, allocation, (boot_timeouts or {}).get(provider.name, boot_timeout_s),
                     poll_intervals(poll_interval_s, poll_max_s), clock=clock, sleep=sleep, on_wait=waiting)
            checks.launched = True
            stage = "probe"
            emit("PROBING", offer, checks, allocation_id=allocation.allocation_id)
            facts = probe_machine(runner_for(provider, allocation))
            launched_image = allocation.details.get("image")
            if facts.image is None and provider.name in CONTAINER_IMAGE_PROVIDERS and launched_image:
                # an SSH session into a container does not see the container's env: the image is the
                # one the provider accepted at launch (RunPod's pod, Vast's instance)
                facts = replace(facts, image=str(launched_image))
            stage = "admission"
            admit(requirements.for_provider(provider.name), facts, provider=provider.name, offer=offer.id)
        except ComputeError as exc:
            if stage in _CHECK_OF_STAGE:
                setattr(checks, _CHECK_OF_STAGE[stage], False)
            if isinstance(exc, NoCapacity) and stage == "launch":
                checks.capacity = False  # the launch itself found none: the capacity answer was wrong
            reason = str(exc)
            if isinstance(exc, _BootTimeout) and checks.notes.get("image"):
                reason += f" ({checks.notes['image']})"  # the likely why, said before the launch too
            refused_hint = getattr(provider, "login_refused_hint", None)
            if refused_hint and stage in ("boot", "probe", "admission") and "refused the login" in reason:
                reason += f" ({refused_hint})"  # the provider's own reason a key may not log in
            fault = isinstance(exc, AdmissionRefused)
            if fault:
                checks.notes["admission"] = reason
            released = None
            spend: tuple[float | None, str | None] = (None, None)
            if allocation is not None and provider is not None:
                try:
                    provider.terminate(allocation)
                    released = True
                except ComputeError as term_exc:
                    released = False
                    reason += f" (and releasing the machine failed: {term_exc})"
                spend = attempt_spend(provider, allocation, offer.price_per_hour, clock() - launched_at)
            attempt = Attempt(offer_key=offer.key, stage=stage,
                              error="Timeout" if isinstance(exc, _BootTimeout) else type(exc).__name__,
                              reason=reason, checks=checks, environment_fault=fault,
                              allocation_id=allocation.allocation_id if allocation else None,
                              spend=spend[0], spend_source=spend[1])
            attempts.append(attempt)
            emit("REFUSED" if fault else "FAILED", offer, checks, reason=reason, stage=stage, error=attempt.error,
                 environment_fault=fault, allocation_id=attempt.allocation_id, released=released)
            if stage == "launch" and allocation is None and exc.context.get("may_be_running"):
                # a launch whose answer was lost, and whose machine could not be confirmed absent: it may
                # be running and billed. Nothing else is launched until it is known (issue 42 item 3)
                exc.context["attempts"] = attempts
                exc.hint = exc.hint or ("look for it with `jupyter portable machines` and terminate it there, "
                                        "then Continue again")
                raise exc
            continue
        except BaseException:
            # a bug or an interrupt must not leave a rented machine running
            if allocation is not None and provider is not None:
                try:
                    provider.terminate(allocation)
                except ComputeError:
                    pass  # the original error is the one to see; this one is secondary
            raise
        assert allocation is not None  # the try either launched one or continued
        emit("ACQUIRED", offer, checks, allocation_id=allocation.allocation_id)
        return allocation, attempts

    if not attempts:
        raise NoCapacity("no route to try", provider="", hint="relax the requirements, or book a reservation",
                         attempts=attempts)
    raise NoCapacity("every route failed: " + "; ".join(f"{a.offer_key}: {a.reason}" for a in attempts),
                     provider="", attempts=attempts)


__all__ = ["Attempt", "EventSink", "acquire", "attempt_spend", "default_runner", "follow_endpoint",
           "poll_intervals"]
