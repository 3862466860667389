"""Settings the Jupyter way, for every layer: :class:`EnvConfigurable` (a traitlets ``Configurable``
whose traits tagged ``env="NAME"`` take ``$NAME`` as their default: a config file's value wins over
the variable, and a constructor argument over both), the configuration this process loaded
(:func:`use_config`, :meth:`EnvConfigurable.current`), and the sections for settings that belong to
no one provider but are read below the interfaces: how a continue runs and which workspace is served
(:class:`PortableRun`, the ``c.Portable`` settings orchestration reads), how a rented machine is
reached (:class:`PortableRemote`), where the worker's wheels come from (:class:`PortableWheels`) and
the store's scoped credentials (:class:`PortableS3`).

``interfaces.config.Portable`` hands its configuration (the config files, or the server's) to
:func:`use_config` when it is made; a section read here is then made from that configuration and
the environment each time, so a changed variable is seen at once. A process that loaded no
configuration (a kernel, a worker, a test) gets the environment and the defaults.

Secrets are never traits (docs/configuration.md). Nothing here reads a file or the network: only
the environment, and the configuration it was handed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from traitlets import Bool, Float, Int, List, TraitError, TraitType, Unicode, validate
from traitlets.config import Config, Configurable

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.guardian import DEFAULT_ABSENT_GRACE_S
from jupyter_portable.core.reachability import DEFAULT_GRACE_S
from jupyter_portable.core.secretenv import PASS_ENV, pass_names
from jupyter_portable.core.validate import short_repr

_CONFIG: list[Config] = []  # the configuration this process loaded: none, or one
Section = TypeVar("Section", bound="EnvConfigurable")


def use_config(config: Config | None) -> None:
    """Read every section from ``config`` from now on (None: the environment and the defaults only)."""
    _CONFIG[:] = [config] if config is not None else []


def _truthy(raw: str, where: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _names(raw: str, where: str) -> list[str]:
    return [n.strip() for n in raw.split(",") if n.strip()]


def _parse(trait: TraitType[Any, Any], raw: str, where: str) -> Any:
    """An environment variable's text as the trait's type (its own ``parse`` tag, where it has one)."""
    parse = trait.metadata.get("parse")
    if parse is not None:
        return parse(raw, where)
    if isinstance(trait, Bool):
        return _truthy(raw, where)
    if isinstance(trait, List):
        return _names(raw, where)
    if isinstance(trait, (Float, Int)):
        try:
            return float(raw) if isinstance(trait, Float) else int(raw)
        except ValueError:
            raise UsageError(f"{where} must be a {'number' if isinstance(trait, Float) else 'whole number'}, "
                             f"got {short_repr(raw)}") from None
    return raw


class EnvConfigurable(Configurable):  # type: ignore[misc]
    """A Configurable whose traits tagged ``env="NAME"`` read ``$NAME`` when it is set, as their
    default: the Jupyter order is an argument given to the constructor, then the configuration
    (``c.Class.trait``, as traitlets applies it: this class's section, its parent classes', its
    parent object's), then the variable, then the trait's own default. Validators name what the
    user set through :meth:`where`: the variable, or ``c.Class.trait``. ``environ`` stands for
    ``os.environ`` (a test's, or a subprocess's to be)."""

    # the section a config file names these traits under, where it is not the class's own name
    # (PortableRun's are c.Portable's)
    config_section: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        self._from_env: str | None = None
        self._set_by_env: dict[str, str] = {}  # trait -> the variable that set it
        environ: Mapping[str, str] | None = kwargs.pop("environ", None)
        env = os.environ if environ is None else environ
        try:
            super().__init__(**kwargs)
        except TraitError as exc:  # a value of the wrong type in a config file: one line, named
            raise UsageError(f"c.{self.section()}: {exc}",
                             hint="fix it in jupyter_server_config.py (jupyter portable --help-all lists "
                                  "each setting's type)") from None
        # what the configuration set, merged the way traitlets applied it (_load_config reads the same)
        configured = self._find_my_config(self.config)
        for name, trait in self.traits(config=True).items():
            var = str(trait.metadata.get("env") or "")
            raw = env.get(var, "").strip() if var else ""
            if not raw or name in kwargs or name in configured:
                continue
            self._from_env = var
            try:
                setattr(self, name, _parse(trait, raw, var))
                self._set_by_env[name] = var
            except TraitError as exc:
                raise UsageError(f"{var} (c.{self.section()}.{name}): {exc}") from None
            finally:
                self._from_env = None

    @classmethod
    def section(cls) -> str:
        """The section a config file sets this class's traits in (``c.<section>.trait``)."""
        return cls.config_section or cls.__name__

    @classmethod
    def current(cls: type[Section], environ: Mapping[str, str] | None = None) -> Section:
        """This section as the process's configuration (:func:`use_config`) and the environment set it."""
        if not _CONFIG:
            return cls(environ=environ)
        config = _CONFIG[0]
        if cls.section() != cls.__name__:  # a part of another class's section: only its own traits' keys
            mine = set(cls.class_trait_names(config=True))
            part = config[cls.section()] if cls.section() in config else Config()
            config = Config({cls.__name__: {k: v for k, v in part.items() if k in mine}})
        return cls(config=config, environ=environ)

    def where(self, name: str) -> str:
        """What the user set this trait's value through, for an error message."""
        return (getattr(self, "_from_env", None) or getattr(self, "_set_by_env", {}).get(name)
                or f"c.{self.section()}.{name}")

    def named(self, name: str) -> str:
        """The trait as the user set it, for an error message: ``VARIABLE (c.Class.trait)``, or
        ``c.Class.trait`` where the configuration set it."""
        var = getattr(self, "_from_env", None) or getattr(self, "_set_by_env", {}).get(name)
        return f"{var} (c.{self.section()}.{name})" if var else f"c.{self.section()}.{name}"

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """``{"c.Class.trait": "VARIABLE"}`` for each trait the environment can set."""
        return {f"c.{cls.section()}.{name}": trait.metadata["env"]
                for name, trait in cls.class_traits(config=True).items() if trait.metadata.get("env")}


def _paths(raw: str, where: str) -> list[str]:
    return [p for p in raw.split(os.pathsep) if p.strip()]


def _not_zero(raw: str, where: str) -> bool:
    return raw.strip() != "0"


def _set_unless_zero(raw: str, where: str) -> bool:
    return raw.strip() not in ("", "0")


ENVIRONMENT_MODES = ("auto", "exact", "lockfile", "image")
FIRST_MACHINE_MODES = ("first-cell", "open")
BOOT_TIMEOUT_ENV = "JUPYTER_PORTABLE_BOOT_TIMEOUT"
DEFAULT_CLOUD_BOOT_TIMEOUT_S = 900.0


def boot_timeouts(text: str, default: float | None = None, where: str = BOOT_TIMEOUT_ENV) -> dict[str, float]:
    """``{provider: seconds, "*": seconds}`` from ``"900"`` or ``"runpod=600,aws=1200[,900]"``;
    UsageError naming the setting (``where``) for anything else."""
    out = {"*": default if default is not None else DEFAULT_CLOUD_BOOT_TIMEOUT_S}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 1 <= seconds <= 86400 or (name and not name.isidentifier()):
            raise UsageError(f"{where}={text!r}: {part!r} is not SECONDS or PROVIDER=SECONDS "
                             "(1 to 86400 seconds)", hint=f"e.g. {where}=runpod=600,aws=1200,900")
        out[name or "*"] = seconds
    return out


def first_machine_mode(value: str, where: str) -> str:
    """``first-cell`` (empty: the default) or ``open``; UsageError naming ``where`` otherwise."""
    mode = value.strip() or "first-cell"
    if mode not in FIRST_MACHINE_MODES:
        raise UsageError(f"{where}={mode!r} is not 'first-cell' or 'open'",
                         hint=f"leave {where} unset (first-cell), or set it to open")
    return mode


def _pass_names(raw: str, where: str) -> list[str]:
    return list(pass_names(raw, where))


class PortableRun(EnvConfigurable):
    """How a continue runs and which workspace the server serves: settings of ``c.Portable``
    (``interfaces.config.Portable`` is one of these) that orchestration reads, defined and checked
    here so that the orchestrator, the kernel provisioner and the server read them alike."""

    config_section = "Portable"

    environment = Unicode("auto", help="""The notebook's Python on a rented machine. auto (the
        default): the machine's own Python when it already has every recorded package at its
        recorded version, else the workspace's lockfile resolved for the machine's Python, with
        your versions wherever they fit and the nearest compatible ones where they do not, each
        difference shown. exact: refuse a machine where any recorded version (or the Python
        version) does not fit, listing the differences. lockfile: always build the lockfile's
        environment. image: always the machine's own Python. Environment:
        JUPYTER_PORTABLE_ENVIRONMENT. Example: c.Portable.environment = "exact" """).tag(
        config=True, env="JUPYTER_PORTABLE_ENVIRONMENT")

    pass_env = List(Unicode(), help="""Environment variables a worker and its kernel on a rented
        machine get on purpose. Nothing else of your environment reaches them, and of the machine's
        own only what is known to hold no secret (PATH, the locale, CUDA's, proxies: docs/security.md).
        Each named variable's value here is sent to the worker over SSH (never on disk or a command
        line); one you do not have here keeps the machine's own value. Environment:
        JUPYTER_PORTABLE_PASS_ENV (names separated by commas or spaces). Example:
        c.Portable.pass_env = ["WANDB_API_KEY", "HF_TOKEN"]""").tag(config=True, env=PASS_ENV, parse=_pass_names)

    first_machine = Unicode("first-cell", help="""Who rents a notebook's first machine. first-cell
        (the default): its first executed cell, after the notebook asked (a notification naming
        the route and its $/h, Start or Cancel). open: opening the notebook rents it at once on the
        best route, and nothing asks. Environment: JUPYTER_PORTABLE_FIRST_MACHINE. Example:
        c.Portable.first_machine = "open" """).tag(config=True, env="JUPYTER_PORTABLE_FIRST_MACHINE")

    boot_timeout = Unicode("", help=f"""Seconds a rented cloud machine may take to come up before its
        Continue gives up on it and tries the next route: one number for every cloud, or per provider
        with a number for the rest. Default: {DEFAULT_CLOUD_BOOT_TIMEOUT_S:.0f}. Environment:
        {BOOT_TIMEOUT_ENV}. Example: c.Portable.boot_timeout = "runpod=600,aws=1200,900" """).tag(
        config=True, env=BOOT_TIMEOUT_ENV)

    unreachable_grace = Float(DEFAULT_GRACE_S, help=f"""Seconds a rented machine may go unanswered
        by every path (the worker's heartbeat and SSH) before it can be declared lost, and then only
        while its provider cannot say it runs (a provider that says it is gone, stopped or preempted
        is believed at once). Until then the state says "unreachable since HH:MM", nothing is
        released, and the machine answering again resumes the session with nothing lost.
        Default: {DEFAULT_GRACE_S:.0f}. Environment: JUPYTER_PORTABLE_UNREACHABLE_GRACE. Example:
        c.Portable.unreachable_grace = 600.0""").tag(config=True, env="JUPYTER_PORTABLE_UNREACHABLE_GRACE")

    absent_grace = Float(DEFAULT_ABSENT_GRACE_S, help=f"""Seconds a rented machine goes without a word
        from this server (a laptop asleep, JupyterLab closed) before the machine looks after itself:
        while a cell runs it keeps running; once idle for the workspace's idle minutes, or out of its
        budget, it publishes a final version, reads it back and ends its own billing where its
        provider gives it the means (docs/continue.md). Default: {DEFAULT_ABSENT_GRACE_S:.0f}.
        Environment: JUPYTER_PORTABLE_ABSENT_GRACE. Example: c.Portable.absent_grace = 1800.0""").tag(
        config=True, env="JUPYTER_PORTABLE_ABSENT_GRACE")

    workspace = Unicode("", help="""The workspace the server serves: a folder in it (its root or
        below). Default: the one holding JupyterLab's root folder. Environment:
        JUPYTER_PORTABLE_WORKSPACE. Example: c.Portable.workspace = "/home/me/project" """).tag(
        config=True, env="JUPYTER_PORTABLE_WORKSPACE")

    @validate("environment")
    def _check_environment(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value not in ENVIRONMENT_MODES:
            raise UsageError(f"{self.where('environment')} must be one of {', '.join(ENVIRONMENT_MODES)}, "
                             f"got {value!r}",
                             hint="auto (the default: the recorded environment, nearest compatible versions "
                                  "where the machine's Python differs), exact, lockfile or image")
        return value

    @validate("unreachable_grace")
    def _check_unreachable_grace(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not (0 <= value <= 7 * 24 * 3600):
            raise UsageError(f"{self.where('unreachable_grace')} must be seconds from 0 to a week, got {value!r}",
                             hint=f"a few minutes (the default is {DEFAULT_GRACE_S:.0f})")
        return value

    @validate("absent_grace")
    def _check_absent_grace(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not (0 <= value <= 7 * 24 * 3600):
            raise UsageError(f"{self.where('absent_grace')} must be seconds from 0 to a week, got {value!r}",
                             hint=f"some minutes (the default is {DEFAULT_ABSENT_GRACE_S:.0f})")
        return value

    @validate("first_machine")
    def _check_first_machine(self, proposal: Any) -> str:
        return first_machine_mode(str(proposal["value"]), self.where("first_machine"))

    @validate("boot_timeout")
    def _check_boot_timeout(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        boot_timeouts(value, where=self.where("boot_timeout"))
        return value

    @validate("pass_env")
    def _check_pass_env(self, proposal: Any) -> list[str]:
        return list(pass_names(proposal["value"], self.where("pass_env")))

    @validate("workspace")
    def _check_workspace(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if any(ord(c) < 32 for c in value):
            raise UsageError(f"{self.where('workspace')} must be a folder's path, got {short_repr(value)}",
                             hint="leave it unset for the workspace holding JupyterLab's root folder")
        return value


class PortableRemote(EnvConfigurable):
    """A rented cloud machine, reached over SSH: the key, and the Python and folder used there."""

    ssh_key = Unicode("", help="""The private key rented machines are reached with (its .pub beside
        it); only its path is a setting, the key stays in its file. Default: a key pair made for
        jupyter-portable on first use. Environment: JUPYTER_PORTABLE_SSH_KEY. Example:
        c.PortableRemote.ssh_key = "~/.ssh/id_ed25519" """).tag(config=True, env="JUPYTER_PORTABLE_SSH_KEY")

    python = Unicode("", help="""A Python on the machine's image that already has this package: the
        worker runs there and nothing is installed. Default: none (the worker is installed on a
        bare machine). Environment: JUPYTER_PORTABLE_REMOTE_PYTHON. Example:
        c.PortableRemote.python = "/opt/conda/bin/python" """).tag(config=True, env="JUPYTER_PORTABLE_REMOTE_PYTHON")

    workdir = Unicode("~/.jupyter-portable", help="""The folder the worker keeps its allocations
        in on the machine. Environment: JUPYTER_PORTABLE_REMOTE_WORKDIR.""").tag(
        config=True, env="JUPYTER_PORTABLE_REMOTE_WORKDIR")

    @validate("python", "workdir", "ssh_key")
    def _check_text(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        name = proposal["trait"].name
        if any(ord(c) < 32 for c in value):
            raise UsageError(f"{self.where(name)} must be a path, got {short_repr(value)}")
        if name == "workdir" and not value:
            raise UsageError(f"{self.where(name)} must name a folder on the machine",
                             hint="leave it unset for ~/.jupyter-portable")
        return value


class PortableWheels(EnvConfigurable):
    """The worker's and the notebook environment's wheels, fetched on your side for a new kind of
    machine, and the record of the wheel sets your side stored."""

    find_links = List(Unicode(), help="""Folders of wheels searched before (or, with no_index,
        instead of) the package index. Environment: JUPYTER_PORTABLE_WHEEL_FIND_LINKS (folders
        separated by the system's path separator, ':' on Linux and macOS). Example:
        c.PortableWheels.find_links = ["/srv/wheels"]""").tag(
        config=True, env="JUPYTER_PORTABLE_WHEEL_FIND_LINKS", parse=_paths)

    index_url = Unicode("", help="""The package index wheels come from. Default: uv's (PyPI, or
        UV_INDEX_URL). Environment: JUPYTER_PORTABLE_INDEX_URL.""").tag(config=True, env="JUPYTER_PORTABLE_INDEX_URL")

    no_index = Bool(False, help="""Never ask a package index: only the find_links folders.
        Environment: JUPYTER_PORTABLE_NO_INDEX (any value but 0).""").tag(
        config=True, env="JUPYTER_PORTABLE_NO_INDEX", parse=_set_unless_zero)

    archive = Bool(True, help="""A bare machine gets the worker's venv as one archive laid out on
        your side; False: uv installs each wheel on the machine instead (the benchmark's
        baseline). Environment: JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE (0 for False).""").tag(
        config=True, env="JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE", parse=_not_zero)

    trust_file = Unicode("", help="""Where your side records the digests of the wheel sets it
        stored, so a set is trusted only when this computer stored it. Default:
        <jupyter data dir>/portable/trusted-wheels.json. Environment: JUPYTER_PORTABLE_TRUST_FILE.""").tag(
        config=True, env="JUPYTER_PORTABLE_TRUST_FILE")

    @validate("index_url")
    def _check_url(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if value and "://" not in value:
            raise UsageError(f"{self.where('index_url')} must be a URL (https://...), got {short_repr(value)}")
        return value


# STS's bounds (AssumeRole's upper bound is the role's MaxSessionDuration, 1 h by default)
MIN_SESSION_S, MAX_SESSION_S, DEFAULT_SESSION_S = 900, 43200, 3600


def _whole_seconds(raw: str, where: str) -> int:
    if not raw.strip().isdigit():
        raise UsageError(f"{where}={raw!r} must be whole seconds from {MIN_SESSION_S} to {MAX_SESSION_S}")
    return int(raw)


class PortableS3(EnvConfigurable):
    """The scoped credentials a worker gets for an s3:// store (docs/security.md)."""

    role_arn = Unicode("", help="""An IAM role (arn:aws:iam::ACCOUNT:role/NAME) your side assumes
        to issue each worker's credentials, scoped to the workspace's prefix. Only its name is a
        setting; it is never passed to a machine. Default: none (GetFederationToken, which needs an
        IAM user's own keys). Environment: JUPYTER_PORTABLE_S3_ROLE_ARN.""").tag(
        config=True, env="JUPYTER_PORTABLE_S3_ROLE_ARN")

    session_seconds = Int(DEFAULT_SESSION_S, help=f"""How long a worker's credentials last before
        they are renewed, in seconds ({MIN_SESSION_S} to {MAX_SESSION_S}). Environment:
        JUPYTER_PORTABLE_S3_SESSION_SECONDS.""").tag(
        config=True, env="JUPYTER_PORTABLE_S3_SESSION_SECONDS", parse=_whole_seconds)

    @validate("role_arn")
    def _check_role(self, proposal: Any) -> str:
        import re

        value = str(proposal["value"]).strip()
        if value and not re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}", value):
            raise UsageError(f"{self.where('role_arn')} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
        return value

    @validate("session_seconds")
    def _check_seconds(self, proposal: Any) -> int:
        value = proposal["value"]
        if isinstance(value, bool) or not MIN_SESSION_S <= int(value) <= MAX_SESSION_S:
            raise UsageError(f"{self.where('session_seconds')}={value!r} must be whole seconds from "
                             f"{MIN_SESSION_S} to {MAX_SESSION_S}")
        return int(value)


DEFAULT_AUTOSNAPSHOT_MINUTES = 10.0
DEFAULT_FULL_WALK_MINUTES = 60.0
DEFAULT_SCRUB_MB = 64.0
DEFAULT_GPU_SAMPLE_S = 10.0
MIN_GPU_SAMPLE_S = 0.5


def _number_of(setting: str) -> Any:
    """A variable's text as a number, or a UsageError naming the variable and ``setting`` (c.Class.trait)."""
    def parse(raw: str, where: str) -> float:
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"{where} ({setting}) must be a number, got {short_repr(raw)}") from None

    return parse


class PortableKernel(EnvConfigurable):
    """A notebook kernel's own settings (``%load_ext jupyter_portable``). A kernel reads no Jupyter
    configuration: it takes these from its environment (a worker sets the first from the workspace's
    setting); a configuration file's values hold where the configuration is loaded (the CLI, the server)."""

    autosnapshot_minutes = Float(DEFAULT_AUTOSNAPSHOT_MINUTES, help=f"""Minutes between the kernel's
        automatic snapshots; 0 turns them off. Default: {DEFAULT_AUTOSNAPSHOT_MINUTES:g} (on a rented
        machine: the workspace's setting, jupyter portable settings --autosnapshot). Environment:
        JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES.""").tag(config=True, env="JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES",
        parse=_number_of("c.PortableKernel.autosnapshot_minutes"))

    full_walk_minutes = Float(DEFAULT_FULL_WALK_MINUTES, help=f"""Minutes between the snapshots
        that walk the whole tree although the change journal says what changed; 0: only when the
        journal cannot be trusted. Default: {DEFAULT_FULL_WALK_MINUTES:g}. Environment:
        JUPYTER_PORTABLE_FULL_WALK_MINUTES.""").tag(config=True, env="JUPYTER_PORTABLE_FULL_WALK_MINUTES",
        parse=_number_of("c.PortableKernel.full_walk_minutes"))

    scrub_mb = Float(DEFAULT_SCRUB_MB, help=f"""MiB the scrub after each automatic snapshot re-reads
        at least (more where a day of runs would not re-read every file once); 0 turns the scrub off.
        Default: {DEFAULT_SCRUB_MB:g}. Environment: JUPYTER_PORTABLE_SCRUB_MB.""").tag(
        config=True, env="JUPYTER_PORTABLE_SCRUB_MB",
        parse=_number_of("c.PortableKernel.scrub_mb"))

    @validate("autosnapshot_minutes", "full_walk_minutes", "scrub_mb")
    def _check_not_negative(self, proposal: Any) -> float:
        value, name = proposal["value"], proposal["trait"].name
        if not 0 <= value < float("inf"):
            raise UsageError(f"{self.named(name)} must be 0 (off) or more, got {short_repr(value)}")
        return float(value)


class PortableWorker(EnvConfigurable):
    """The worker agent's own settings, read from its environment on the machine."""

    gpu_sample_seconds = Float(DEFAULT_GPU_SAMPLE_S, help=f"""Seconds between the worker's samples of
        GPU use (what keeps a busy machine from being stopped as idle). Default: {DEFAULT_GPU_SAMPLE_S:g};
        at least {MIN_GPU_SAMPLE_S:g}. Environment: JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS.""").tag(
        config=True, env="JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS",
        parse=_number_of("c.PortableWorker.gpu_sample_seconds"))

    @validate("gpu_sample_seconds")
    def _check_interval(self, proposal: Any) -> float:
        value = proposal["value"]
        if not MIN_GPU_SAMPLE_S <= value < float("inf"):
            raise UsageError(f"{self.named('gpu_sample_seconds')} must be at least {MIN_GPU_SAMPLE_S:g} seconds, "
                             f"got {short_repr(value)}")
        return float(value)


SECTIONS: tuple[type[EnvConfigurable], ...] = (PortableRemote, PortableWheels, PortableS3, PortableKernel,
                                               PortableWorker)

__all__ = ["BOOT_TIMEOUT_ENV", "DEFAULT_CLOUD_BOOT_TIMEOUT_S", "ENVIRONMENT_MODES", "FIRST_MACHINE_MODES", "SECTIONS",
           "EnvConfigurable", "PortableKernel", "PortableRemote", "PortableRun", "PortableS3", "PortableWheels",
           "PortableWorker", "boot_timeouts", "first_machine_mode", "use_config"]
