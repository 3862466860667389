"""The machine's interpreter, as the worker's wheels must fit it: asked once over SSH by a probe
that runs on any ``python3`` (stdlib only), or described without asking (:func:`target_for`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_portable.core.errors import LaunchFailed
from jupyter_portable.worker.resolve import (
    Platform,
    pick_hint,
    supported,
)

# runs on the machine's own python3, whatever its version: stdlib only, syntax Python 3.6 still parses
_PROBE = r'''
import json, platform, sys, sysconfig
libc = platform.libc_ver()
packages = {}
try:
    from importlib import metadata
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and dist.version:
            packages[name.lower().replace("_", "-").replace(".", "-")] = dist.version
except Exception:
    pass
print(json.dumps({"python": sys.executable, "version": "%d.%d" % sys.version_info[:2],
                  "full_version": platform.python_version(),
                  "implementation": sys.implementation.name, "abiflags": getattr(sys, "abiflags", ""),
                  "platform": sysconfig.get_platform(), "machine": platform.machine(),
                  "libc": libc[0], "libc_version": libc[1], "packages": packages}))
'''

# the probe, and what an earlier bootstrap left in the workdir (argv[2]: {"workdir": ...}): one round trip
PROBE_LIST = _PROBE.replace("print(json.dumps({", "out = dict(({", 1) + r'''
import os
root = os.path.expanduser(json.loads(sys.argv[2])["workdir"])
have, ready = {}, []
for name in (os.listdir(os.path.join(root, "wheels")) if os.path.isdir(os.path.join(root, "wheels")) else []):
    if name.endswith(".sha256"):
        with open(os.path.join(root, "wheels", name)) as fh:
            have[name[:-7]] = fh.read().strip()
for name in (os.listdir(os.path.join(root, "venvs")) if os.path.isdir(os.path.join(root, "venvs")) else []):
    if os.path.exists(os.path.join(root, "venvs", name, ".complete")):
        ready.append(name)
out.update(have=have, ready=ready, home=root)
print(json.dumps(out))
'''


@dataclass(frozen=True)
class Target:
    """The machine's interpreter, as wheels must fit it."""

    python: str
    version: str  # "3.11"
    implementation: str
    abiflags: str
    platform: str  # sysconfig's, e.g. linux-x86_64
    machine: str
    libc_version: str
    full_version: str = ""  # "3.11.2": requires-python tells 3.11.2 from 3.11.7
    packages: tuple[tuple[str, str], ...] = ()  # what the machine's Python already has (the image's torch...)

    @property
    def tag(self) -> str:
        """``cpython-3.11.2-linux-x86_64``: what a wheel set must fit, down to the micro version."""
        return f"{self.implementation}-{self.full_version or self.version}{self.abiflags}-{self.platform}".lower()

    def wheel_platform(self) -> Platform:
        return Platform(self.full_version or self.version, self.uv_platform(), tuple(self.pip_platforms()))

    @classmethod
    def from_json(cls, obj: Any) -> "Target":
        try:
            raw = obj.get("packages") or {}
            packages = tuple(sorted((str(k)[:200], str(v)[:100]) for k, v in raw.items()))[:5000] \
                if isinstance(raw, dict) else ()
            full = str(obj.get("full_version") or "")
            t = cls(python=str(obj["python"]), version=str(obj["version"]), implementation=str(obj["implementation"]),
                    abiflags=str(obj["abiflags"]), platform=str(obj["platform"]).replace(".", "_"),
                    machine=str(obj["machine"]), libc_version=str(obj.get("libc_version") or ""),
                    full_version=full if re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", full) else "", packages=packages)
        except (KeyError, TypeError, AttributeError) as exc:
            raise LaunchFailed(f"the machine's Python did not describe itself ({exc})", provider="") from None
        ok, why = supported(t.version)
        if not ok:
            raise LaunchFailed(f"{why}; nothing was installed on it", provider="", hint=pick_hint())
        if t.implementation != "cpython" or not t.platform.startswith("linux-"):
            raise LaunchFailed(f"the machine runs {t.implementation} on {t.platform}; the worker's wheels are "
                               "fetched for CPython on Linux", provider="")
        return t

    def pip_platforms(self) -> list[str]:
        """The wheel platform tags this machine takes, newest first (manylinux down to 2_17)."""
        arch = self.machine
        major, _, minor = self.libc_version.partition(".")
        top = int(minor) if major == "2" and minor.isdigit() else 17
        return [*(f"manylinux_2_{m}_{arch}" for m in range(top, 16, -1)), f"manylinux2014_{arch}", f"linux_{arch}"]

    def uv_platform(self) -> str:
        major, _, minor = self.libc_version.partition(".")
        return f"{self.machine}-manylinux_2_{minor if major == '2' and minor.isdigit() else 17}"


def probe_python(run_python: Callable[[str], str]) -> Target:
    """Ask the machine's ``python3`` what it is (``run_python(script) -> stdout``)."""
    out = run_python(_PROBE)
    try:
        return Target.from_json(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise LaunchFailed(f"the machine's python3 did not answer: {out.strip()[:200]!r}", provider="",
                           hint="the machine needs python3 >= 3.10 on its PATH") from None


def local_target() -> Target:
    """This interpreter, described as a machine's would be."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    return probe_python(lambda _script: out)


def target_for(version: str, machine: str = "x86_64", libc_version: str = "2.36") -> Target:
    """A machine described without asking it: CPython ``version`` ("3.10.13") on glibc Linux."""
    parts = version.split(".")
    return Target.from_json({"python": "python3", "version": ".".join(parts[:2]), "full_version": version,
                             "implementation": "cpython", "abiflags": "", "platform": f"linux-{machine}",
                             "machine": machine, "libc_version": libc_version})



__all__ = ["PROBE_LIST", "Target", "local_target", "probe_python", "target_for"]
