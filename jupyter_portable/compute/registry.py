"""Which providers this installation asks, and how each is made: a name maps to the module
and class that implement it, imported only when asked for. ``c.Portable.providers`` (or
``JUPYTER_PORTABLE_PROVIDERS``; default ``local``, plus ``ssh`` when a hosts file exists) chooses
them; cloud providers are opt-in, so no API is called unless asked for. Names and each provider's
settings are read and checked in ``compute.config``.
"""

from __future__ import annotations

import importlib
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.config import env_provider_names, provider_kwargs
from jupyter_portable.core.errors import ComputeError, UsageError

PROVIDERS: dict[str, tuple[str, str]] = {
    "local": ("jupyter_portable.demo.market", "LocalMarket"),
    "ssh": ("jupyter_portable.compute.ssh", "SshProvider"),
    "runpod": ("jupyter_portable.compute.runpod", "RunPodProvider"),
    "vastai": ("jupyter_portable.compute.vastai", "VastProvider"),
    "lambda": ("jupyter_portable.compute.lambdalabs", "LambdaProvider"),
    "aws": ("jupyter_portable.compute.aws", "AwsProvider"),
    "gcp": ("jupyter_portable.compute.gcp", "GcpProvider"),
    "slurm": ("jupyter_portable.compute.slurm", "SlurmProvider"),
}
# each provider by the name its users know it by (the sidebar's words: a schema x-constant, routes.json)
PROVIDER_NAME: dict[str, str] = {
    "local": "Local market", "ssh": "SSH host", "runpod": "RunPod", "vastai": "Vast.ai", "lambda": "Lambda",
    "aws": "AWS", "gcp": "Google Cloud", "slurm": "Slurm",
}


def provider_names() -> list[str]:
    """The providers the environment names (``JUPYTER_PORTABLE_PROVIDERS``), else the default."""
    return env_provider_names()


def make_provider(name: str, **kwargs: Any) -> Provider:
    """The provider ``name``, built with ``kwargs`` (its class's own keyword arguments)."""
    if name not in PROVIDERS:
        raise UsageError(f"unknown provider {name!r}", hint=f"choose from {', '.join(PROVIDERS)}")
    module, cls = PROVIDERS[name]
    try:
        return getattr(importlib.import_module(module), cls)(**kwargs)  # type: ignore[no-any-return]
    except ComputeError:
        raise
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"provider {name} is not available in this installation: {exc}") from exc


def enabled_providers() -> dict[str, Provider]:
    """The providers of the environment alone (no config file), each built from its settings
    (``compute.config``): what orchestration asks when it is given none."""
    return {name: make_provider(name, **provider_kwargs(name)) for name in provider_names()}
