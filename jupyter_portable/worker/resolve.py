"""Resolving a set of packages for another machine's interpreter, preferring the versions recorded here.

``uv pip compile`` resolves for a Python version and platform that need not be this one
(``--python-version 3.10.13 --python-platform x86_64-manylinux_2_35``). The recorded versions go
in as *preferences* (the existing output file, which uv keeps where it can), so every version
that fits the machine is the recorded one and each that does not becomes the highest compatible
one below it. For each version that changed, one more resolve of that pin alone says why
(requires-python, no wheel for the platform, yanked, not on the index).

Used on the user's side for the worker's own wheels (:mod:`.bootstrap`) and the notebook's
environment (:mod:`.envcache`): the machine itself may reach no package index.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from jupyter_portable.core.errors import LaunchFailed

Progress = Callable[[str], None]
# the Python versions the worker runs on (pyproject's requires-python says the same)
SUPPORTED = ((3, 10), (3, 13))
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")
_PIN = re.compile(r"\A([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:;.*)?\Z")


def redact(text: str) -> str:
    return _CREDENTIALS.sub("***@", text)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def supported(version: str) -> tuple[bool, str]:
    """Whether the worker runs on Python ``version`` ("3.10" or "3.10.13"), and if not, why and what to pick."""
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return False, f"the machine's Python reported an unreadable version {version!r}"
    have = (int(parts[0]), int(parts[1]))
    lo, hi = SUPPORTED
    if lo <= have <= hi:
        return True, ""
    side = "too old" if have < lo else "newer than this release supports"
    return False, (f"the machine's python3 is {have[0]}.{have[1]}, {side}: the worker runs on Python "
                   f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}")


def pick_hint() -> str:
    lo, hi = SUPPORTED
    return (f"choose an image whose python3 is {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]} (for example an Ubuntu 22.04 "
            "image has 3.10, Ubuntu 24.04 has 3.12), or set JUPYTER_PORTABLE_REMOTE_PYTHON to such a Python "
            "on the machine")


@dataclass(frozen=True)
class Platform:
    """What wheels must fit: the interpreter version (full where known) and uv's platform name."""

    python_version: str  # "3.10.13" or "3.10"
    uv_platform: str  # "x86_64-manylinux_2_36"
    pip_platforms: tuple[str, ...]


def uv_bin() -> str:
    import uv

    return str(uv.find_uv_bin())


def source_args(find_links: list[str], index_url: str | None, no_index: bool) -> list[str]:
    args: list[str] = []
    for link in find_links:
        args += ["--find-links", link]
    if no_index:
        args.append("--no-index")
    elif index_url:
        args += ["--index-url", index_url]
    return args


def _compile(lines: list[str], platform: Platform, sources: list[str], *, prefs: Mapping[str, str] | None = None,
             no_deps: bool = False, only_binary: bool = True) -> tuple[int, str, str]:
    with tempfile.TemporaryDirectory(prefix="jp-resolve-") as tmp:
        out = Path(tmp) / "resolved.txt"
        if prefs:
            # uv keeps the versions of an existing output file where they fit: the recorded ones
            out.write_text("".join(f"{n}=={v}\n" for n, v in sorted(prefs.items())))
        cmd = [uv_bin(), "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate",
               "--python-version", platform.python_version, "--python-platform", platform.uv_platform,
               "-o", str(out), *sources]
        if no_deps:
            cmd.append("--no-deps")
        if only_binary:
            cmd += ["--only-binary", ":all:"]
        proc = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True,
                              env={**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never"})
        text = out.read_text() if out.exists() and proc.returncode == 0 else ""
    return proc.returncode, text, redact(proc.stderr)


def parse_pins(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if m:
            out[normalise(m.group(1))] = m.group(2)
    return out


def why_not(name: str, version: str, platform: Platform, sources: list[str]) -> tuple[str, str]:
    """Why ``name==version`` does not install on ``platform``: a key of ``core.envplan.WHY`` and uv's words."""
    # with its dependencies: uv checks requires-python only while resolving them
    rc, _text, err = _compile([f"{name}=={version}"], platform, sources)
    if rc == 0:
        return "dependency", ""
    words = " ".join(err.split())
    detail = words[-300:]
    low = words.lower()
    if "yanked" in low:
        return "yanked", detail
    if re.search(rf"{re.escape(name.lower())}[^ ]* requires python|requires-python|depends on python", low):
        return "requires-python", detail
    if "platform" in low or "wheel" in low or "abi" in low:
        return "no-wheel", detail
    return "not-found", detail


def resolve(names: list[str], prefs: Mapping[str, str], platform: Platform, sources: list[str], *,
            what: str, hint: str) -> dict[str, str]:
    """Resolve ``names`` for ``platform``, keeping the versions of ``prefs`` where they fit."""
    rc, text, err = _compile(sorted(names), platform, sources, prefs=prefs)
    if rc != 0:
        raise LaunchFailed(f"uv could not resolve {what} for Python {platform.python_version} on "
                           f"{platform.uv_platform}: {' '.join(err.split())[-600:]}", provider="", hint=hint)
    return parse_pins(text)


def download(pins: Mapping[str, str], platform: Platform, dest: Path, sources: list[str], *, what: str,
             python: str) -> list[Path]:
    """Exactly the wheels of ``pins`` for ``platform`` into ``dest`` (pip, with the user's pip configuration)."""
    if not pins:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in platform.pip_platforms for a in ("--platform", p)]
    cmd = [python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--dest", str(dest), "--python-version", platform.python_version,
           "--implementation", "cp", *platforms, *sources, *(f"{n}=={v}" for n, v in sorted(pins.items()))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LaunchFailed(f"{what} could not be downloaded for Python {platform.python_version}: "
                           f"{redact(proc.stderr.strip())[-600:]}", provider="")
    return sorted(dest.glob("*.whl"))


__all__ = ["SUPPORTED", "Platform", "download", "parse_pins", "pick_hint", "redact", "resolve", "source_args",
           "supported", "uv_bin", "why_not"]
