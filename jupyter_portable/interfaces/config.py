"""Configuration, the Jupyter way: ``c.Portable.<name>`` in ``jupyter_server_config.py`` (or
``jupyter_portable_config.py``) in any Jupyter config directory, read by the server extension
and by ``jupyter portable``. ``c.Portable`` holds what is not one provider's; each provider has
a section of its own (``c.PortableRunPod``, ``c.PortableAws``, ...: ``compute.config``). Each
setting's environment variable, where it has one, is its default: a config file's value wins over
it, and a command's flag over both; ``jupyter portable --help-all`` lists them with their help.
Secrets (API keys, credentials) are never settings here: they stay in the environment and the
providers' credential files (docs/configuration.md).

Example (``~/.jupyter/jupyter_server_config.py``)::

    c.Portable.providers = ["local", "runpod"]
    c.PortableLocal.catalog = "/home/me/gpus.toml"
    c.PortableRunPod.spot = True
    c.Portable.check_interval_s = 5.0
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets import Float, Unicode, default, validate
from traitlets.config import Config

from jupyter_portable.compute.base import Provider
from jupyter_portable.compute.config import (
    SETTINGS_CLASSES,
    EnvConfigurable,
    PortableLocal,
    PortableSsh,
    ProviderChoice,
    provider_kwargs,
)
from jupyter_portable.compute.registry import make_provider
from jupyter_portable.core.envconfig import SECTIONS as GENERAL_SECTIONS
from jupyter_portable.core.envconfig import PortableRun, use_config
from jupyter_portable.core.errors import UsageError

CONFIG_FILES = ("jupyter_server_config", "jupyter_portable_config")


class Portable(ProviderChoice, PortableRun):
    """jupyter-portable: where GPUs come from, and how the server watches them. ``environment``,
    ``pass_env``, ``first_machine``, ``boot_timeout`` and ``workspace`` are defined and checked in
    ``core.envconfig.PortableRun``, where orchestration reads them too."""

    # The four paths below were c.Portable's before each provider had a section; they stay, for
    # the config files that set them, and win over the section's value. They take no variable of
    # their own: their default is the section's, which a config file sets over the variable.
    catalog = Unicode(help="""The local market's catalog of offers: c.PortableLocal.catalog
        (and its variable, JUPYTER_PORTABLE_CATALOG), which this overrides.""").tag(config=True)

    market_dir = Unicode(help="""Where the local market keeps its machines' state:
        c.PortableLocal.market_dir (and its variable, JUPYTER_PORTABLE_MARKET_DIR), which this
        overrides.""").tag(config=True)

    hosts_file = Unicode(help="""The ssh provider's hosts: c.PortableSsh.hosts_file (and its
        variable, JUPYTER_PORTABLE_HOSTS), which this overrides.""").tag(config=True)

    ssh_state_dir = Unicode(help="""Where the ssh provider records which host serves which
        allocation: c.PortableSsh.state_dir (and its variable, JUPYTER_PORTABLE_SSH_STATE), which
        this overrides.""").tag(config=True)

    check_interval_s = Float(2.0, help="""Seconds between two looks at the active machine (its
        provider's status and the worker's heartbeat): how soon a lost GPU shows in the sidebar.
        Each look is one provider API call.""").tag(config=True)

    reservation_interval_s = Float(30.0, help="""Seconds between two looks at the calendar for a
        reservation whose slot has begun (its Continue then starts).""").tag(config=True)

    now = Unicode("", help="""Start the calendar's clock at this instant (ISO 8601 with a zone,
        e.g. 2027-03-01T09:00Z) instead of the wall clock's now; it then runs on at the wall's
        rate. Bookings, the calendar and reservation starts go by it; heartbeats, timeouts and
        record stamps keep the real time. For tests and recorded demos. Default: empty (the wall
        clock). Environment: JUPYTER_PORTABLE_NOW.""").tag(config=True, env="JUPYTER_PORTABLE_NOW")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the sections read below the interfaces (core.envconfig: c.Portable's run settings for
        # orchestration, c.PortableRemote, c.PortableWheels, c.PortableS3) take this configuration
        # from now on, as the providers' sections do from here
        use_config(self.config)

    def providers_hosts_file(self) -> str | None:
        return str(self.hosts_file)  # c.Portable.hosts_file, where a config file still sets it

    @default("catalog")
    def _catalog_default(self) -> str:
        return str(PortableLocal(parent=self).catalog)

    @default("market_dir")
    def _market_dir_default(self) -> str:
        return str(PortableLocal(parent=self).market_dir)

    @default("hosts_file")
    def _hosts_file_default(self) -> str:
        return str(Path(PortableSsh(parent=self).hosts_file).expanduser())

    @default("ssh_state_dir")
    def _ssh_state_default(self) -> str:
        return str(Path(PortableSsh(parent=self).state_dir).expanduser())

    @validate("now")
    def _check_now(self, proposal: Any) -> str:
        from jupyter_portable.interfaces.clock import clock_from

        clock_from(proposal["value"])  # refused here, with the reason, not at the first booking
        return str(proposal["value"]).strip()

    def clock(self) -> Any:
        """The clock the calendar goes by (interfaces.clock): the wall's unless ``now`` is set."""
        from jupyter_portable.interfaces.clock import clock_from

        return clock_from(self.now)

    @validate("check_interval_s", "reservation_interval_s")
    def _check_interval(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not 0.1 <= value <= 3600:
            raise UsageError(f"c.Portable.{proposal['trait'].name} must be within 0.1..3600 seconds, got {value}")
        return value

    def make_providers(self) -> dict[str, Provider]:
        """One provider object per configured name, built from its section (``c.PortableRunPod``,
        ...) and the paths above."""
        paths: dict[str, dict[str, Any]] = {
            "local": {"catalog_path": self.catalog, "state_dir": self.market_dir},
            "ssh": {"hosts_file": self.hosts_file, "state_dir": self.ssh_state_dir},
        }
        return {name: make_provider(name, **{**provider_kwargs(name, parent=self), **paths.get(name, {})})
                for name in self.providers}


def load_config(extra_dirs: tuple[str, ...] = ()) -> Config:
    """``c.Portable`` and each provider's section from the Jupyter config files (``CONFIG_FILES``
    in ``jupyter_config_path()`` and ``extra_dirs``), the same files the server reads."""
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
    return Config({cls.__name__: merged.get(cls.__name__, Config()) for cls in CLASSES})


def help_all() -> str:
    """Every setting of ``c.Portable`` and of each provider's section, with its help and default
    (``jupyter portable --help-all``)."""
    return "\n\n".join(cls.class_get_help().rstrip("\n") for cls in CLASSES)


CLASSES: tuple[type[EnvConfigurable], ...] = (Portable, *SETTINGS_CLASSES, *GENERAL_SECTIONS)
# each setting the environment can set: {"c.Class.trait": "VARIABLE"}
ENV = {name: var for cls in CLASSES for name, var in cls.env_names().items()}

__all__ = ["CLASSES", "ENV", "Portable", "help_all", "load_config"]
