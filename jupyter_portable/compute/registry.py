"""Which providers this installation asks, and how each is made: a name maps to the module
and class that implement it, imported only when asked for. ``JUPYTER_PORTABLE_PROVIDERS``
(comma-separated; default ``local``, plus ``ssh`` when a hosts file exists) chooses them;
cloud providers are opt-in, so no API is called unless asked for.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from jupyter_portable.compute.base import Provider
from jupyter_portable.core.errors import ComputeError, PortableError, UsageError

PROVIDERS: dict[str, tuple[str, str]] = {
    "local": ("jupyter_portable.compute.local", "LocalMarket"),
    "ssh": ("jupyter_portable.compute.ssh", "SshProvider"),
    "runpod": ("jupyter_portable.compute.runpod", "RunPodProvider"),
    "vastai": ("jupyter_portable.compute.vastai", "VastProvider"),
    "lambda": ("jupyter_portable.compute.lambdalabs", "LambdaProvider"),
    "aws": ("jupyter_portable.compute.aws", "AwsProvider"),
    "gcp": ("jupyter_portable.compute.gcp", "GcpProvider"),
}


def provider_names(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if env is None else env
    raw = env.get("JUPYTER_PORTABLE_PROVIDERS", "").strip()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
        unknown = [n for n in names if n not in PROVIDERS]
        if unknown:
            raise UsageError(f"unknown provider(s) in JUPYTER_PORTABLE_PROVIDERS: {', '.join(unknown)}",
                             hint=f"choose from {', '.join(PROVIDERS)}")
        return names
    names = ["local"]
    try:
        from jupyter_portable.compute.hosts import default_hosts_path

        if default_hosts_path().is_file():
            names.append("ssh")
    except (ImportError, PortableError):
        pass
    return names


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


def enabled_providers(env: dict[str, str] | None = None) -> dict[str, Provider]:
    return {name: make_provider(name) for name in provider_names(env)}
