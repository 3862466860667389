"""The provider interface. Its docstrings are the contract; ``tests/test_providers_contract.py``
runs one suite against every provider (local, ssh, and each cloud's fixtures).

Every method raises only :mod:`jupyter_portable.core.errors` (``NoCapacity``, ``QuotaExceeded``,
``AuthError``, ``LaunchFailed``, ``ProviderUnavailable``, ``NotSupported``); foreign errors
(httpx, botocore, google-api-core, OpenSSH) are translated where they enter. Credentials
come from the environment or configuration and never appear in a message, an event or
a log line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.core.errors import NotSupported, ProviderUnavailable
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.spend import SPEND_SOURCES  # noqa: F401 (the sources a figure names)
from jupyter_portable.core.times import parse_iso_or_none

# "unknown": the provider answered but cannot say whether the machine runs (Vast's ``unknown`` and
# ``offline``: no recent heartbeat from its host), or the host itself did not answer (an SSH host): not
# evidence of a loss (core.reachability decides, the same for every provider)
STATES = ("pending", "running", "reachable", "stopped", "lost", "terminated", "unknown")

# How every rented machine is found again: its provider name (RunPod pod name, Vast label,
# Lambda name, GCP/AWS "Name") is ``jupyter-portable.<allocation>.<workspace>``, and where the
# provider has tags or labels they carry both ids under these keys (AWS tags, Lambda tags;
# GCP labels use ``jupyter-portable-allocation``/``-workspace``, its keys admit no ":").
NAME_PREFIX = "jupyter-portable"
ALLOCATION_TAG = "jupyter-portable:allocation"
WORKSPACE_TAG = "jupyter-portable:workspace"
WORKSPACE_ENV = "JUPYTER_PORTABLE_WORKSPACE_ID"
ALLOCATION_ENV = "JUPYTER_PORTABLE_ALLOCATION_ID"


def machine_name(allocation_id: str, workspace_id: str | None = None, *, limit: int | None = None) -> str:
    """``jupyter-portable.<allocation>.<workspace>``; the workspace is left out when it would pass
    ``limit`` characters (the provider's tags still carry it)."""
    base = f"{NAME_PREFIX}.{allocation_id}"
    full = f"{base}.{workspace_id}" if workspace_id else base
    return full if limit is None or len(full) <= limit else base[:limit]


def parse_machine_name(name: object) -> tuple[str, str | None] | None:
    """``(allocation_id, workspace_id or None)`` from a :func:`machine_name`, else None."""
    if not isinstance(name, str) or not name.startswith(NAME_PREFIX + "."):
        return None
    parts = name[len(NAME_PREFIX) + 1:].split(".", 1)
    if not parts[0]:
        return None
    return parts[0], (parts[1] if len(parts) > 1 and parts[1] else None)


def delete_until_confirmed(delete: Callable[[], None], *, attempts: int, sleep: Callable[[float], None],
                           machine: str, ref: str, allocation_id: str, verb: str, hint: str) -> None:
    """Call ``delete`` until it returns: it raises ProviderUnavailable on a 5xx or a lost answer,
    and is tried again (up to ``attempts``, waits from 0.5 s doubling to 30 s). Unconfirmed, the
    error says ``machine`` (its id ``ref``) may still be running and carries ``hint``."""
    wait = 0.5
    for attempt in range(1, attempts + 1):
        try:
            delete()
            return
        except ProviderUnavailable as exc:
            if attempt == attempts:
                exc.args = (f"{machine} (allocation {allocation_id}) may still be running: {verb} it was not "
                            f"confirmed after {attempt} attempts: {exc}",)
                exc.context.update(may_be_running=True, machine=ref,
                                   allocation_id=allocation_id, attempts=attempt)
                exc.hint = hint
                raise
            sleep(wait)
            wait = min(30.0, wait * 2)


# How long a launch whose answer was lost (a 5xx, a timeout) is looked for by its name before the
# machine counts as never made: a provider's listing may lag its launch by tens of seconds (issue 42)
LOOKUP_BUDGET_S = 180.0


class _NotYet(Exception):
    """The listing answered without the machine: ask again until the budget is spent."""


def look_up_until_known(find: Callable[[], list[MachineInfo]], *, budget_s: float = LOOKUP_BUDGET_S,
                        clock: Callable[[], float], sleep: Callable[[float], None], first_wait_s: float = 2.0,
                        max_wait_s: float = 20.0) -> MachineInfo | None:
    """The machine a launch with a lost answer made, looked up with ``find`` (its name, label or tags)
    until it is known: found (returned at once), or confirmed absent (None: every listing for
    ``budget_s`` seconds of ``clock`` answered without it, the last one included). A listing that fails
    is asked again; one failing at the end raises its error, with ``may_be_running`` in its context:
    the machine may exist, and nothing else may be launched until someone looks. Waits start at
    ``first_wait_s`` and double up to ``max_wait_s``, on ``sleep`` (tenacity)."""
    import tenacity

    from jupyter_portable.core.errors import ComputeError

    started = clock()

    def once() -> MachineInfo:
        found = [m for m in find() if m.state != "terminated"]
        if not found:
            raise _NotYet()
        return found[0]

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type((_NotYet, ComputeError)),
        wait=tenacity.wait_exponential(multiplier=first_wait_s, min=first_wait_s, max=max_wait_s),
        stop=lambda rs: clock() - started + (rs.upcoming_sleep or 0.0) > budget_s,
        sleep=sleep, reraise=True)
    try:
        return retrying(once)
    except _NotYet:
        return None
    except ComputeError as exc:
        exc.context.update(may_be_running=True)
        raise


def spend_since(price_per_hour: float | None, started: object, now: datetime) -> tuple[float | None, float | None]:
    """``(uptime seconds, dollars)`` at ``price_per_hour`` from ``started`` (an ISO time or a
    datetime) to ``now``; ``(None, None)`` when either is unknown."""
    begin = started if isinstance(started, datetime) else parse_iso_or_none(started)
    if begin is None:
        return None, None
    if begin.tzinfo is None:
        begin = begin.replace(tzinfo=timezone.utc)
    seconds = max(0.0, (now - begin).total_seconds())
    if price_per_hour is None or not (0 <= price_per_hour < float("inf")):
        return seconds, None
    return seconds, float(price_per_hour) * seconds / 3600




@dataclass
class SshEndpoint:
    """How the worker on an allocation is reached: every remote worker the same way."""

    host: str
    port: int = 22
    user: str = "root"
    # how ssh reaches the host through another (a Slurm compute node through its login node): an ssh
    # ProxyCommand the provider made, held to the other host's pinned key; None: directly
    proxy: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user,
                **({"proxy": self.proxy} if self.proxy else {})}


@dataclass
class Allocation:
    """One rented machine serving a workspace for a while."""

    allocation_id: str
    provider: str
    offer_id: str
    ref: str  # the provider's own id (pod id, instance id, PID...)
    started: str
    ssh: SshEndpoint | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"allocation_id": self.allocation_id, "provider": self.provider, "offer_id": self.offer_id,
                "ref": self.ref, "started": self.started, "ssh": self.ssh.to_json() if self.ssh else None,
                "details": self.details}


@dataclass
class AllocationStatus:
    """``state`` is one of STATES. ``reachable`` means the SSH endpoint answers (for RunPod,
    RUNNING alone is not enough). ``spend`` so far, where the status gives one (None: it cannot say,
    as after a pod exited), with its ``spend_source``, one of SPEND_SOURCES."""

    state: str
    ssh: SshEndpoint | None = None
    reason: str | None = None
    spend: float | None = None
    spend_source: str | None = None  # one of SPEND_SOURCES when spend is set
    ends_at: str | None = None  # when the provider ends it by itself (a Slurm job's walltime), ISO UTC


@dataclass
class MachineInfo:
    """One machine a provider holds with our name or labels (see :func:`machine_name`).
    ``state`` is one of STATES; ``spend`` so far in USD with its ``spend_source``."""

    provider: str
    ref: str
    allocation_id: str | None
    workspace_id: str | None
    state: str
    name: str = ""
    started: str | None = None
    uptime_s: float | None = None
    price_per_hour: float | None = None
    spend: float | None = None
    spend_source: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def allocation(self) -> Allocation:
        """An :class:`Allocation` good enough to ask for its status or terminate it."""
        return Allocation(allocation_id=self.allocation_id or self.ref, provider=self.provider,
                          offer_id=str(self.details.get("offer_id") or ""), ref=self.ref, started=self.started or "",
                          details=dict(self.details))

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "ref": self.ref, "allocation_id": self.allocation_id,
                "workspace_id": self.workspace_id, "state": self.state, "name": self.name, "started": self.started,
                "uptime_s": None if self.uptime_s is None else round(self.uptime_s, 1),
                "price_per_hour": self.price_per_hour,
                "spend": None if self.spend is None else round(self.spend, 6), "spend_source": self.spend_source}


@dataclass
class Reservation:
    """A booked slot. ``guarantee``: "provider" (the provider sold it, e.g. AWS Capacity
    Blocks), "capacity-checked" (the local market held capacity), or "best-effort"."""

    reservation_id: str
    provider: str
    offer_id: str
    start: str
    hours: float
    guarantee: str
    price: float
    details: dict[str, Any] = field(default_factory=dict)


class Provider:
    """One source of GPUs. Subclasses set ``name`` and implement the methods below."""

    name: str = ""

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """What the provider lists (check 1, "listed"). May pre-filter by ``requirements``
        where the API can; callers still apply :func:`~jupyter_portable.core.offers.unmet`."""
        raise NotImplementedError

    def check_permission(self, offer: Offer) -> None:
        """Check 2, "permitted": the credentials work and quota allows one more of ``offer``.
        Raises AuthError or QuotaExceeded; returns None when permitted."""
        raise NotImplementedError

    def check_capacity(self, offer: Offer) -> int | None:
        """Check 3, "capacity now": how many can start now (None: the provider cannot say
        without launching). Raises NoCapacity when the answer is none."""
        raise NotImplementedError

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Check 4, "launched": start one machine. Raises NoCapacity, QuotaExceeded or
        LaunchFailed. Returns as soon as the provider accepted it; poll :meth:`status`.

        ``image`` is this provider's own kind (:mod:`jupyter_portable.core.images`): a container
        image for RunPod, Vast.ai and the local market, a machine image of this cloud's form for
        AWS or Google Cloud; None: the provider's default. Acquiring never sends another kind."""
        raise NotImplementedError

    def status(self, allocation: Allocation) -> AllocationStatus:
        """Where the allocation stands now; ``lost`` when the provider took it back (evidence: gone,
        preempted, restarted without its GPUs), ``unknown`` when it cannot say (never ``lost`` for
        that: :mod:`jupyter_portable.core.reachability` decides when silence becomes a loss)."""
        raise NotImplementedError

    def terminate(self, allocation: Allocation) -> None:
        """Release the machine. Terminating one that is already gone is not an error."""
        raise NotImplementedError

    def queue_next(self, allocation: Allocation) -> str | None:
        """Queue the machine that takes over when ``allocation`` ends by itself (a Slurm job's walltime):
        it waits while this one runs, and :meth:`launch` with the same offer and workspace takes it up.
        Its provider's id, or None where the provider queues nothing ahead (the default, and a
        provider whose setting for it is off)."""
        return None

    def queued_offer(self, allocation: Allocation, ref: str) -> Offer | None:
        """The offer of the machine ``ref`` queued ahead to take over from ``allocation``
        (:meth:`queue_next`), built from what ``allocation`` records, with nothing asked of the
        provider: a Continue onto it ranks that one route and skips the capacity check (the machine is
        already asked for; its launch, probe and admission run as always). None (the default): the
        Continue lists and checks offers as usual."""
        return None

    def admit_caller(self, allocation: Allocation) -> bool:
        """Let SSH in to ``allocation`` from where this computer is now, where the provider's firewall
        admits addresses (AWS: the security group). True when access had to change: a heartbeat that
        just failed may pass now. Default: nothing to change."""
        return False

    def spend(self, allocation: Allocation) -> tuple[float | None, str | None]:
        """What the allocation has cost so far, and where that figure comes from (one of
        SPEND_SOURCES): the provider's bill where it publishes one (asked also after the machine is
        released: it covers everything up to then), else what :meth:`status` says. ``(None, None)``
        when the provider cannot say; callers then keep the last figure they saw, or estimate."""
        st = self.status(allocation)
        return (st.spend, st.spend_source) if st.spend is not None else (None, None)

    def list_machines(self) -> list[MachineInfo]:
        """Every machine the account holds that carries our name or labels (terminated ones
        left out), with state, uptime and spend so far. NotSupported where it cannot list."""
        raise NotSupported(f"{self.name} cannot list its machines", provider=self.name)

    def find_machines(self, *, allocation_id: str | None = None,
                      workspace_id: str | None = None) -> list[MachineInfo]:
        """The listed machines of ``allocation_id`` and/or ``workspace_id``."""
        return [m for m in self.list_machines()
                if (allocation_id is None or m.allocation_id == allocation_id)
                and (workspace_id is None or m.workspace_id == workspace_id)]

    def quote_reservation(self, offer: Offer, *, start: str, hours: float) -> Reservation | None:
        """What booking ``offer`` for the slot would cost, as the provider charges it (its price and
        the hours it sells, which may be more than asked), without buying; None where the provider
        sells no reservations of its own. A provider that quotes takes the quote back in
        ``reserve(..., quote=)`` and buys exactly that."""
        return None

    def reserve(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """Book ``offer`` for a slot, where the provider sells reservations."""
        raise NotSupported(f"{self.name} does not sell reservations", provider=self.name, offer=offer.id)

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Cancel under the provider's rules."""
        raise NotSupported(f"{self.name} does not sell reservations", provider=self.name)
