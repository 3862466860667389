"""A small static table of cloud GPU machine shapes and their typical on-demand prices.

Approximate public list prices, Nov 2026 (AWS us-east-1, Google Cloud us-central1), in
US dollars per hour for the whole machine. They are a routing estimate, not a bill: the
provider's own API says where a shape is offered (and, for AWS spot, what it costs now),
this table says what it is and what it roughly costs. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_AS_OF = "approximate public list prices, Nov 2026"

# Spot and preemptible machines can be taken back at short notice. Neither cloud's API
# gives an interruption rate (AWS's Spot Advisor buckets are a web page), so routing gets
# a deliberately rough prior instead of a false 1.0.
SPOT_RELIABILITY = 0.9


@dataclass(frozen=True)
class MachineShape:
    """One machine type: its GPUs and its typical price.

    ``accelerator`` is Google's accelerator type name; ``attach`` says the accelerator
    must be attached explicitly (N1), where A2/A3/G2 machine types come with theirs.
    ``quota_metric`` is Google's regional GPU quota metric. ``reservable`` marks AWS types
    sold as Capacity Blocks.
    """

    machine: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float
    price_per_hour: float
    spot_price_per_hour: float | None = None
    accelerator: str | None = None
    attach: bool = False
    quota_metric: str | None = None
    reservable: bool = False


def _table(*shapes: MachineShape) -> dict[str, MachineShape]:
    return {s.machine: s for s in shapes}


AWS: dict[str, MachineShape] = _table(
    MachineShape("g4dn.xlarge", "T4", 1, 16, 0.526),
    MachineShape("g4dn.12xlarge", "T4", 4, 16, 3.912),
    MachineShape("g5.xlarge", "A10G", 1, 24, 1.006),
    MachineShape("g5.12xlarge", "A10G", 4, 24, 5.672),
    MachineShape("g5.48xlarge", "A10G", 8, 24, 16.288),
    MachineShape("g6.xlarge", "L4", 1, 24, 0.805),
    MachineShape("g6.12xlarge", "L4", 4, 24, 4.602),
    MachineShape("g6e.xlarge", "L40S", 1, 48, 1.861),
    MachineShape("g6e.12xlarge", "L40S", 4, 48, 10.493),
    MachineShape("p3.2xlarge", "V100", 1, 16, 3.06),
    MachineShape("p4d.24xlarge", "A100", 8, 40, 21.96, reservable=True),
    MachineShape("p5.48xlarge", "H100", 8, 80, 55.04, reservable=True),
)

# Spot prices here are Google's published spot list prices (they move at most monthly);
# AWS spot prices come from the API instead.
GCP: dict[str, MachineShape] = _table(
    MachineShape("n1-standard-8", "T4", 1, 16, 0.73, 0.23, "nvidia-tesla-t4", attach=True,
                 quota_metric="NVIDIA_T4_GPUS"),
    MachineShape("g2-standard-4", "L4", 1, 24, 0.71, 0.28, "nvidia-l4", quota_metric="NVIDIA_L4_GPUS"),
    MachineShape("g2-standard-8", "L4", 1, 24, 0.85, 0.34, "nvidia-l4", quota_metric="NVIDIA_L4_GPUS"),
    MachineShape("g2-standard-24", "L4", 2, 24, 2.00, 0.80, "nvidia-l4", quota_metric="NVIDIA_L4_GPUS"),
    MachineShape("a2-highgpu-1g", "A100", 1, 40, 3.67, 1.15, "nvidia-tesla-a100", quota_metric="NVIDIA_A100_GPUS"),
    MachineShape("a2-highgpu-8g", "A100", 8, 40, 29.39, 9.20, "nvidia-tesla-a100", quota_metric="NVIDIA_A100_GPUS"),
    MachineShape("a2-ultragpu-1g", "A100-80GB", 1, 80, 5.07, 1.60, "nvidia-a100-80gb",
                 quota_metric="NVIDIA_A100_80GB_GPUS"),
    MachineShape("a3-highgpu-8g", "H100", 8, 80, 88.25, 24.0, "nvidia-h100-80gb", quota_metric="NVIDIA_H100_GPUS"),
)


def shapes_for(table: dict[str, MachineShape], gpus: tuple[str, ...] = (), gpu_count: int = 0,
               min_gpu_memory_gb: float = 0.0) -> list[MachineShape]:
    """The shapes that could meet a requirement, so a provider asks its API only about those."""
    out = []
    for shape in table.values():
        if gpus and not any(g.lower() in shape.gpu.lower() for g in gpus):
            continue
        if shape.gpu_count < gpu_count or shape.gpu_memory_gb < min_gpu_memory_gb:
            continue
        out.append(shape)
    return out
