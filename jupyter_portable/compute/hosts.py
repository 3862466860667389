"""The user's own SSH hosts, read from a TOML file and validated on the way in.

The file is ``$JUPYTER_PORTABLE_HOSTS`` or ``<jupyter config dir>/portable/hosts.toml``::

    [[host]]
    name = "lab-a100"              # the offer id: letters, digits, . _ -
    host = "gpu1.example.org"      # name or address sshd answers on
    port = 22                      # optional, default 22
    user = "alice"                 # optional, default: the local user name
    key = "~/.ssh/id_ed25519"      # optional private key path; absent: ssh's agent and default keys
    python = "python3"             # optional, the interpreter that runs the worker there
    workdir = "~/.jupyter-portable"  # optional, allocations go under <workdir>/allocations/<id>/

    [host.labels]                  # what the host has; nothing here is probed
    gpu = "NVIDIA A100-SXM4-80GB"  # required
    gpu_memory_gb = 80             # required, per GPU
    gpu_count = 1                  # default 1
    driver = "550.54.15"           # optional, the exact driver version
    cuda = "12.4"                  # optional
    region = "home-lab"            # default "self-hosted"
    price_per_hour = 0.0           # default 0: what an hour of it costs you

The key file is only ever named (to ``ssh -i``); its contents are never read here. A
relative key path is taken relative to the hosts file's folder.
"""

from __future__ import annotations

import getpass
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Offer

ENV_HOSTS = "JUPYTER_PORTABLE_HOSTS"
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# A host name or address as ssh takes it; refusing a leading "-" keeps it from being read as an option.
_HOSTNAME = re.compile(r"\A[A-Za-z0-9_.:%\[\]-]{1,253}\Z")
_USER = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,63}\Z")
_HOST_KEYS = {"name", "host", "port", "user", "key", "python", "workdir", "labels"}
_LABEL_KEYS = {"gpu", "gpu_count", "gpu_memory_gb", "driver", "cuda", "region", "price_per_hour"}


@dataclass(frozen=True)
class Host:
    """One configured SSH host. ``key`` is a path; the file is never opened by this package."""

    name: str
    host: str
    port: int = 22
    user: str = ""
    key: Path | None = None
    python: str = "python3"
    workdir: str = "~/.jupyter-portable"
    gpu: str = ""
    gpu_count: int = 1
    gpu_memory_gb: float = 0.0
    driver: str | None = None
    cuda: str | None = None
    region: str = "self-hosted"
    price_per_hour: float = 0.0
    proxy: str | None = None  # an ssh ProxyCommand that reaches it through another host (base.SshEndpoint)

    def offer(self, capacity: int) -> Offer:
        """This host as an offer of the ``ssh`` provider; ``capacity`` is 1 when free, 0 when in use."""
        return Offer(provider="ssh", id=self.name, gpu=self.gpu, gpu_count=self.gpu_count,
                     gpu_memory_gb=self.gpu_memory_gb, price_per_hour=self.price_per_hour, region=self.region,
                     driver=self.driver, cuda=self.cuda, capacity=capacity,
                     # the machine is already up: "boot" is starting the worker over SSH
                     boot_seconds=5.0,
                     extra={"host": self.host, "port": self.port, "user": self.user})


def default_hosts_path() -> Path:
    """``$JUPYTER_PORTABLE_HOSTS``, else ``<jupyter config dir>/portable/hosts.toml`` (compute.config)."""
    from jupyter_portable.compute.config import PortableSsh

    return Path(PortableSsh().hosts_file).expanduser()


def load_hosts(path: Path | str | None = None) -> list[Host]:
    """The hosts in ``path`` (default :func:`default_hosts_path`), validated.

    A missing default file means no hosts; a missing file that was named explicitly (argument
    or environment) is a UsageError, as is anything malformed.
    """
    from jupyter_portable.compute.config import PortableSsh

    section = PortableSsh()
    explicit = path is not None or section.names_hosts_file()
    file = Path(path).expanduser() if path is not None else Path(section.hosts_file).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise UsageError(f"hosts file {file} does not exist",
                             hint=f"create it (see `jupyter_portable.compute.hosts`) or unset {ENV_HOSTS}") from None
        return []
    except OSError as exc:
        raise UsageError(f"cannot read hosts file {file}: {exc.strerror or exc}") from exc
    return parse_hosts(text, source=str(file), base=file.parent)


def parse_hosts(text: str, *, source: str = "hosts.toml", base: Path | None = None) -> list[Host]:
    """Hosts from TOML text; ``base`` resolves relative key paths."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{source}: not valid TOML: {exc}") from exc
    unknown = set(data) - {"host"}
    if unknown:
        raise UsageError(f"{source}: unknown top-level key(s): {', '.join(sorted(unknown))}",
                         hint="each host is a [[host]] table")
    entries = data.get("host", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UsageError(f"{source}: `host` must be an array of tables ([[host]])")
    hosts: list[Host] = []
    seen: set[str] = set()
    for number, entry in enumerate(entries, 1):
        host = _host(entry, f"{source}: host #{number}", base)
        if host.name in seen:
            raise UsageError(f"{source}: host name {host.name!r} is used twice", hint="names must be unique")
        seen.add(host.name)
        hosts.append(host)
    return hosts


def _host(entry: Mapping[str, Any], where: str, base: Path | None) -> Host:
    unknown = set(entry) - _HOST_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown key(s): {', '.join(sorted(unknown))}",
                         hint=f"known keys: {', '.join(sorted(_HOST_KEYS))}")
    name = _str(entry, "name", where, required=True)
    where = f"{where} ({name!r})"
    if not _NAME.match(name):
        raise UsageError(f"{where}: name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                         "or digit")
    address = _str(entry, "host", where, required=True)
    if not _HOSTNAME.match(address) or address.startswith("-"):
        raise UsageError(f"{where}: host {address!r} is not a host name or address")
    port = _int(entry, "port", where, default=22)
    if not 1 <= port <= 65535:
        raise UsageError(f"{where}: port {port} is not within 1..65535")
    user = _str(entry, "user", where) or getpass.getuser()
    if not _USER.match(user):
        raise UsageError(f"{where}: user {user!r} is not a user name")
    key: Path | None = None
    key_text = _str(entry, "key", where)
    if key_text:
        key = Path(key_text).expanduser()
        if not key.is_absolute() and base is not None:
            key = base / key
        # Only the path is checked; the file's contents are ssh's business.
        if not key.is_file():
            raise UsageError(f"{where}: key file {key} does not exist", hint="set `key` to a private key file")
    python = _str(entry, "python", where) or "python3"
    workdir = _str(entry, "workdir", where) or "~/.jupyter-portable"
    if "\n" in python or "\n" in workdir or "\0" in workdir:
        raise UsageError(f"{where}: python and workdir must be single lines")
    labels = entry.get("labels")
    if not isinstance(labels, dict):
        raise UsageError(f"{where}: a [host.labels] table is needed (at least gpu and gpu_memory_gb)")
    unknown = set(labels) - _LABEL_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown label(s): {', '.join(sorted(unknown))}",
                         hint=f"known labels: {', '.join(sorted(_LABEL_KEYS))}")
    lw = f"{where} labels"
    gpu_count = _int(labels, "gpu_count", lw, default=1)
    memory = _float(labels, "gpu_memory_gb", lw, required=True)
    price = _float(labels, "price_per_hour", lw, default=0.0)
    if gpu_count < 0 or memory < 0 or price < 0:
        raise UsageError(f"{lw}: gpu_count, gpu_memory_gb and price_per_hour must not be negative")
    return Host(name=name, host=address, port=port, user=user, key=key, python=python, workdir=workdir,
                gpu=_str(labels, "gpu", lw, required=True), gpu_count=gpu_count, gpu_memory_gb=memory,
                driver=_str(labels, "driver", lw) or None, cuda=_str(labels, "cuda", lw) or None,
                region=_str(labels, "region", lw) or "self-hosted", price_per_hour=price)


def _str(table: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = table.get(key)
    if value is None:
        if required:
            raise UsageError(f"{where}: `{key}` is required")
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise UsageError(f"{where}: `{key}` must be a non-empty string, not {value!r}")
    return value.strip()


def _int(table: Mapping[str, Any], key: str, where: str, *, default: int) -> int:
    value = table.get(key, default)
    # TOML booleans are Python bools, which are ints: refuse them explicitly.
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{where}: `{key}` must be an integer, not {value!r}")
    return value


def _float(table: Mapping[str, Any], key: str, where: str, *, default: float | None = None,
           required: bool = False) -> float:
    if key not in table and required:
        raise UsageError(f"{where}: `{key}` is required")
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where}: `{key}` must be a number, not {value!r}")
    return float(value)


__all__ = ["ENV_HOSTS", "Host", "default_hosts_path", "load_hosts", "parse_hosts"]
