"""The provider interface. Its docstrings are the contract; ``tests/test_providers_contract.py``
runs one suite against every provider (local, ssh, and each cloud's fixtures).

Every method raises only :mod:`jupyter_portable.core.errors` (``NoCapacity``, ``QuotaExceeded``,
``AuthError``, ``LaunchFailed``, ``ProviderUnavailable``, ``NotSupported``); foreign errors
(httpx, botocore, google-api-core, OpenSSH) are translated where they enter. Credentials
come from the environment or configuration and never appear in a message, an event or
a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.errors import NotSupported
from jupyter_portable.core.offers import Offer, Requirements

STATES = ("pending", "running", "reachable", "stopped", "lost", "terminated")


@dataclass
class SshEndpoint:
    """How the worker on an allocation is reached: every remote worker the same way."""

    host: str
    port: int = 22
    user: str = "root"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "user": self.user}


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
    RUNNING alone is not enough). ``spend`` is the provider's own figure where it gives one."""

    state: str
    ssh: SshEndpoint | None = None
    reason: str | None = None
    spend: float | None = None


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
        LaunchFailed. Returns as soon as the provider accepted it; poll :meth:`status`."""
        raise NotImplementedError

    def status(self, allocation: Allocation) -> AllocationStatus:
        """Where the allocation stands now; ``lost`` when the provider took it back."""
        raise NotImplementedError

    def terminate(self, allocation: Allocation) -> None:
        """Release the machine. Terminating one that is already gone is not an error."""
        raise NotImplementedError

    def reserve(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """Book ``offer`` for a slot, where the provider sells reservations."""
        raise NotSupported(f"{self.name} does not sell reservations", provider=self.name, offer=offer.id)

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Cancel under the provider's rules."""
        raise NotSupported(f"{self.name} does not sell reservations", provider=self.name)
