"""Configuration, the Jupyter way: ``c.Portable.<name>`` in ``jupyter_server_config.py`` (or
``jupyter_portable_config.py``) in any Jupyter config directory, read by the server extension
and by ``jupyter portable``. Each setting's environment variable, where it has one, overrides
the file; ``jupyter portable --help-all`` lists them with their help.

Example (``~/.jupyter/jupyter_server_config.py``)::

    c.Portable.providers = ["local", "runpod"]
    c.Portable.catalog = "/home/me/gpus.toml"
    c.Portable.check_interval_s = 5.0
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from traitlets import Float, List, Unicode, default, validate
from traitlets.config import Config, Configurable

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.registry import PROVIDERS, make_provider, provider_names
from jupyter_portable.core.errors import UsageError

CONFIG_FILES = ("jupyter_server_config", "jupyter_portable_config")
# the environment variable that overrides each setting, where it has one
ENV = {"providers": "JUPYTER_PORTABLE_PROVIDERS", "catalog": "JUPYTER_PORTABLE_CATALOG",
       "market_dir": "JUPYTER_PORTABLE_MARKET_DIR", "hosts_file": "JUPYTER_PORTABLE_HOSTS",
       "ssh_state_dir": "JUPYTER_PORTABLE_SSH_STATE"}


class Portable(Configurable):  # type: ignore[misc]
    """jupyter-portable: where GPUs come from, and how the server watches them."""

    providers = List(Unicode(), help="""Which providers are asked for GPUs, in order: any of
        local, ssh, runpod, vastai, lambda, aws, gcp. Cloud providers are opt-in, so no cloud
        API is called unless named here. Default: local, plus ssh when a hosts file exists.
        Environment: JUPYTER_PORTABLE_PROVIDERS (comma-separated). Example:
        c.Portable.providers = ["local", "runpod"]""").tag(config=True)

    catalog = Unicode(help="""The local market's catalog of offers (TOML, docs/catalog.md).
        Default: the demo catalog shipped with the package. Environment: JUPYTER_PORTABLE_CATALOG.
        Example: c.Portable.catalog = "/home/me/gpus.toml" """).tag(config=True)

    market_dir = Unicode(help="""Where the local market keeps its machines' state. Default:
        <jupyter data dir>/portable/market. Environment: JUPYTER_PORTABLE_MARKET_DIR.""").tag(config=True)

    hosts_file = Unicode(help="""The ssh provider's hosts (TOML). Default:
        <jupyter config dir>/portable/hosts.toml. Environment: JUPYTER_PORTABLE_HOSTS.""").tag(config=True)

    ssh_state_dir = Unicode(help="""Where the ssh provider records which host serves which
        allocation. Default: <jupyter data dir>/portable/ssh. Environment:
        JUPYTER_PORTABLE_SSH_STATE.""").tag(config=True)

    check_interval_s = Float(2.0, help="""Seconds between two looks at the active machine (its
        provider's status and the worker's heartbeat): how soon a lost GPU shows in the sidebar.
        Each look is one provider API call.""").tag(config=True)

    reservation_interval_s = Float(30.0, help="""Seconds between two looks at the calendar for a
        reservation whose slot has begun (its Continue then starts).""").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name, var in ENV.items():
            value = os.environ.get(var, "").strip()
            if value and name not in kwargs:
                setattr(self, name, [n.strip() for n in value.split(",") if n.strip()] if name == "providers"
                        else value)

    @default("providers")
    def _providers_default(self) -> list[str]:
        return provider_names()

    @validate("providers")
    def _check_providers(self, proposal: Any) -> list[str]:
        names = list(proposal["value"])
        unknown = [n for n in names if n not in PROVIDERS]
        if unknown:
            raise UsageError(f"unknown provider(s) in c.Portable.providers: {', '.join(unknown)}",
                             hint=f"choose from {', '.join(PROVIDERS)}")
        return names

    @default("catalog")
    def _catalog_default(self) -> str:
        from jupyter_portable.compute.catalog import default_catalog_path

        return str(default_catalog_path())

    @default("market_dir")
    def _market_dir_default(self) -> str:
        from jupyter_portable.compute.local import default_market_dir

        return str(default_market_dir())

    @default("hosts_file")
    def _hosts_file_default(self) -> str:
        from jupyter_portable.compute.hosts import default_hosts_path

        return str(default_hosts_path())

    @default("ssh_state_dir")
    def _ssh_state_default(self) -> str:
        from jupyter_portable.compute.ssh import default_state_dir

        return str(default_state_dir())

    @validate("check_interval_s", "reservation_interval_s")
    def _check_interval(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not 0.1 <= value <= 3600:
            raise UsageError(f"c.Portable.{proposal['trait'].name} must be within 0.1..3600 seconds, got {value}")
        return value

    def make_providers(self) -> dict[str, Provider]:
        """One provider object per configured name, built with the configured paths."""
        kwargs: dict[str, dict[str, Any]] = {
            "local": {"catalog_path": self.catalog, "state_dir": self.market_dir},
            "ssh": {"hosts_file": self.hosts_file, "state_dir": self.ssh_state_dir},
        }
        return {name: make_provider(name, **kwargs.get(name, {})) for name in self.providers}


def load_config(extra_dirs: tuple[str, ...] = ()) -> Config:
    """``c.Portable`` from the Jupyter config files (``CONFIG_FILES`` in ``jupyter_config_path()``
    and ``extra_dirs``), the same files the server reads."""
    from jupyter_core.paths import jupyter_config_path
    from traitlets.config.loader import JSONFileConfigLoader, PyFileConfigLoader

    merged = Config()
    for directory in [*reversed(jupyter_config_path()), *extra_dirs]:
        for base in CONFIG_FILES:
            for loader in (JSONFileConfigLoader(base + ".json", directory),
                           PyFileConfigLoader(base + ".py", directory)):
                if not Path(directory, loader.filename).is_file():
                    continue
                try:
                    merged.merge(loader.load_config())
                except Exception as exc:  # a broken file of the user's: say which
                    raise UsageError(f"cannot read {Path(directory, loader.filename)}: {exc}") from exc
    return Config({"Portable": merged.get("Portable", Config())})


def help_all() -> str:
    """Every setting of ``c.Portable``, with its help and default (``jupyter portable --help-all``)."""
    return Portable.class_get_help()


__all__ = ["Portable", "help_all", "load_config"]
