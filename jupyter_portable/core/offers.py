"""Offers, requirements and the four checks: plain data, no I/O.

A GPU is a coordinate, not a shelf: provider, region, model, memory, driver, price,
capacity, time. "Listed", "permitted", "capacity now" and "launched" are four separate
checks; :class:`Checks` records which were done and what they said.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.images import CONTAINER_IMAGE_PROVIDERS, legacy_image

_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}\Z")


@dataclass(frozen=True)
class Offer:
    """Something a provider says it can rent now or later.

    ``capacity`` is the provider's own signal of how many can start now (None: it does not
    say). ``egress_per_gb`` is what moving data *into* this offer's region from elsewhere
    costs on the provider's side (most GPU clouds charge nothing for ingress; the store's
    egress is priced separately by routing). ``reliability`` (0-1) and
    ``launch_failure_rate`` (0-1) feed the risk term. ``extra`` keeps provider fields that
    a launch needs (an instance type, a bundle id) and nothing secret.
    """

    provider: str
    id: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float
    price_per_hour: float
    region: str
    driver: str | None = None
    cuda: str | None = None
    capacity: int | None = None
    boot_seconds: float = 120.0
    launch_failure_rate: float = 0.0
    reliability: float = 1.0
    bandwidth_mbps: float = 1000.0
    egress_per_gb: float = 0.0
    spot: bool = False
    reservable: bool = False
    images: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if not self.provider or not _ID.match(self.id):
            problems.append(f"bad id {self.id!r}")
        if not self.gpu:
            problems.append("no GPU model")
        if self.gpu_count < 0 or self.gpu_memory_gb < 0:
            problems.append("negative GPU count or memory")
        if not (self.price_per_hour >= 0):  # also refuses NaN
            problems.append(f"bad price {self.price_per_hour!r}")
        if not (0 <= self.launch_failure_rate <= 1) or not (0 <= self.reliability <= 1):
            problems.append("launch_failure_rate and reliability must be within 0..1")
        if self.capacity is not None and self.capacity < 0:
            problems.append("negative capacity")
        if self.boot_seconds < 0 or self.bandwidth_mbps <= 0 or self.egress_per_gb < 0:
            problems.append("boot_seconds, bandwidth_mbps and egress_per_gb must be positive")
        if problems:
            raise UsageError(f"offer {self.provider}/{self.id}: " + "; ".join(problems))

    @property
    def key(self) -> str:
        """``provider/id``: unique across providers."""
        return f"{self.provider}/{self.id}"

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out["images"] = list(self.images)
        out["key"] = self.key
        return out


@dataclass(frozen=True)
class Requirements:
    """What the work needs. Every field is optional; an empty Requirements admits anything.

    ``container_image`` is what RunPod, Vast.ai and the local market start; ``machine_image``
    what AWS or Google Cloud boots (an AMI or a GCP image: the one cloud of its form). Each
    provider gets only its own kind (:func:`~jupyter_portable.core.images.image_for`)."""

    gpus: tuple[str, ...] = ()  # acceptable models, matched case-insensitively as substrings
    gpu_count: int = 1
    min_gpu_memory_gb: float = 0.0
    driver: str | None = None  # an exact driver version, e.g. "550.54.15"
    min_cuda: str | None = None  # e.g. "12.1"
    container_image: str | None = None
    machine_image: str | None = None
    max_price_per_hour: float | None = None
    regions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "gpu_count": self.gpu_count, "min_gpu_memory_gb": self.min_gpu_memory_gb,
                "driver": self.driver, "min_cuda": self.min_cuda, "container_image": self.container_image,
                "machine_image": self.machine_image, "max_price_per_hour": self.max_price_per_hour,
                "regions": list(self.regions)}

    def for_provider(self, provider: str) -> "Requirements":
        """These requirements as a machine of ``provider`` is held to them: the container image only
        where the provider starts containers (a VM or an ssh host runs none, so none is asked of it)."""
        if provider in CONTAINER_IMAGE_PROVIDERS or self.container_image is None:
            return self
        return replace(self, container_image=None)

    @classmethod
    def from_json(cls, obj: object) -> "Requirements":
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise UsageError("requirements must be an object")
        known = {f.name for f in fields(cls)}
        obj = dict(obj)
        if obj.get("image"):  # the single image of before: by its form, one of the two
            setting, value = legacy_image(str(obj.pop("image")))
            obj.setdefault(setting, value)
        obj.pop("image", None)
        extra = set(obj) - known
        if extra:
            raise UsageError(f"unknown requirement(s): {', '.join(sorted(extra))}")
        try:
            req = cls(gpus=tuple(str(g) for g in obj.get("gpus") or ()), gpu_count=int(obj.get("gpu_count", 1)),
                      min_gpu_memory_gb=float(obj.get("min_gpu_memory_gb", 0)),
                      driver=obj.get("driver") or None, min_cuda=obj.get("min_cuda") or None,
                      container_image=obj.get("container_image") or None,
                      machine_image=obj.get("machine_image") or None,
                      max_price_per_hour=None if obj.get("max_price_per_hour") is None
                      else float(obj["max_price_per_hour"]),
                      regions=tuple(str(r) for r in obj.get("regions") or ()))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"bad requirements: {exc}") from exc
        if req.gpu_count < 0 or req.min_gpu_memory_gb < 0:
            raise UsageError("gpu_count and min_gpu_memory_gb must not be negative")
        return req


def version_tuple(text: str) -> tuple[int, ...]:
    """"12.4" -> (12, 4); non-numeric parts are dropped."""
    return tuple(int(p) for p in re.findall(r"\d+", text))


def unmet(offer: Offer, req: Requirements) -> dict[str, str]:
    """``{requirement: reason}`` for every requirement the offer's *listing* fails."""
    out: dict[str, str] = {}
    if req.gpus and not any(g.lower() in offer.gpu.lower() for g in req.gpus):
        out["gpu"] = f"{offer.gpu} is not one of {', '.join(req.gpus)}"
    if offer.gpu_count < req.gpu_count:
        out["gpu_count"] = f"{offer.gpu_count} GPU(s), {req.gpu_count} needed"
    if offer.gpu_memory_gb < req.min_gpu_memory_gb:
        out["gpu_memory"] = f"{offer.gpu_memory_gb:g} GB per GPU, {req.min_gpu_memory_gb:g} GB needed"
    if req.driver and offer.driver and offer.driver != req.driver:
        out["driver"] = f"lists driver {offer.driver}, {req.driver} is pinned"
    if req.driver and not offer.driver:
        out["driver"] = f"does not list its driver; {req.driver} is pinned"
    if req.min_cuda and (not offer.cuda or version_tuple(offer.cuda) < version_tuple(req.min_cuda)):
        out["cuda"] = f"CUDA {offer.cuda or 'unknown'}, at least {req.min_cuda} needed"
    if req.container_image and offer.images and req.container_image not in offer.images:
        out["image"] = f"image {req.container_image} is not offered"
    if req.regions and offer.region not in req.regions:
        out["region"] = f"{offer.region} is not one of {', '.join(req.regions)}"
    if req.max_price_per_hour is not None and offer.price_per_hour > req.max_price_per_hour:
        out["price"] = f"${offer.price_per_hour:.2f}/h is over the cap of ${req.max_price_per_hour:.2f}/h"
    return out


@dataclass
class Checks:
    """The four separate checks. ``None``: not done; ``True``/``False``: done, with the answer."""

    listed: bool = True
    permitted: bool | None = None
    capacity: bool | None = None
    launched: bool | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"listed": self.listed, "permitted": self.permitted, "capacity": self.capacity,
                "launched": self.launched}
