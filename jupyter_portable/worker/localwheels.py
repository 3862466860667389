"""What is not on a package index travels too: editable, local-path and git installs, as wheels.

A researcher's environment often holds their own repository (``pip install -e .``), a package
from a local folder, or one from a git URL. No index has them, so the lockfile's exact pins
cannot bring them back. On the user's side, where the sources are, each is built into a wheel
(``pip wheel --no-deps``), stored content-addressed like every other object, and named in the
worker's configuration: the machine fetches it from the store (hash-checked) and installs it
after the lockfile's wheels. They are rebuilt at every Continue (an editable install changes
with its sources), and a wheel that only fits the user's platform (a compiled extension built
on a Mac) is left out with a note instead of failing the Continue.

Each travels as ``{"name", "version", "filename", "size", "hash", "source"}``; ``source`` is the
lockfile's URL with any ``user:password@`` removed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from jupyter_portable.core.envplan import EnvChange
from jupyter_portable.core.errors import ManifestError
from jupyter_portable.core.validate import check_hash
from jupyter_portable.store.repo import Store
from jupyter_portable.worker.resolve import normalise, redact

Progress = Callable[[str], None]
_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*(?:-[A-Za-z0-9_.+!]+){4,5}\.whl")
_FIELDS = frozenset({"name", "version", "filename", "size", "hash", "source"})


@dataclass(frozen=True)
class LocalWheel:
    """A wheel built on the user's side from a package no index has."""

    name: str
    version: str
    filename: str
    size: int
    hash: str
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "filename": self.filename, "size": self.size,
                "hash": self.hash, "source": self.source}

    @classmethod
    def from_json(cls, obj: Any) -> "LocalWheel":
        """Validated on the machine before anything is fetched: a config is input like any other."""
        if not isinstance(obj, dict) or set(obj) != _FIELDS:
            raise ManifestError(f"a built wheel needs exactly {', '.join(sorted(_FIELDS))}")
        ok = isinstance(obj["name"], str) and re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,199}", obj["name"]) \
            and isinstance(obj["version"], str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}", obj["version"]) \
            and isinstance(obj["filename"], str) and _WHEEL_NAME.fullmatch(obj["filename"]) \
            and isinstance(obj["size"], int) and not isinstance(obj["size"], bool) and obj["size"] >= 0 \
            and isinstance(obj["source"], str) and len(obj["source"]) <= 2000
        if not ok:
            raise ManifestError(f"malformed built wheel {obj!r:.200}")
        return cls(obj["name"], obj["version"], obj["filename"], obj["size"], check_hash(obj["hash"], "wheel hash"),
                   obj["source"])

    def change(self) -> EnvChange:
        return EnvChange(self.name, self.version, self.version, "built", "built", self.source)


def source_of(line: str) -> str:
    """The pip requirement to build from a lockfile line (``-e URL`` or ``NAME @ URL``)."""
    url = line[3:].strip() if line.startswith("-e ") else line.split(" @ ", 1)[1].strip()
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return unquote(parsed.path)  # a folder or an archive on this computer
    return url  # git+https://...@commit, https://.../pkg.tar.gz#sha256=...


def fits(filename: str, python_version: str, machine: str) -> bool:
    """Whether a wheel's tags admit CPython ``python_version`` on glibc Linux ``machine``."""
    parts = filename[:-4].split("-")
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    major, minor = (int(p) for p in python_version.split(".")[:2])
    cp = f"cp{major}{minor}"
    abi3 = "abi3" in abi.split(".")

    def py_fits(tag: str) -> bool:
        if tag in ("py3", cp, f"py{major}{minor}"):
            return True
        # an abi3 wheel built for 3.9 runs on every later CPython 3
        m = re.fullmatch(r"cp3(\d+)", tag)
        return abi3 and m is not None and int(m.group(1)) <= minor

    py_ok = any(py_fits(t) for t in py.split("."))
    abi_ok = any(t in ("none", "abi3", cp) for t in abi.split("."))
    plat_ok = any(t == "any" or (t.startswith(("manylinux", "linux")) and t.endswith(machine)) for t in plat.split("."))
    return py_ok and abi_ok and plat_ok


def build_local(lines: Mapping[str, str], store: Store, *, python_version: str, machine: str,
                progress: Progress | None = None) -> tuple[list[LocalWheel], list[EnvChange]]:
    """Build each of ``lines`` (name -> lockfile line) into a wheel here and store it; a wheel that
    cannot be built or does not fit the machine is left out, with its reason."""
    say: Progress = progress or (lambda _line: None)
    built: list[LocalWheel] = []
    left: list[EnvChange] = []
    for name, line in sorted(lines.items()):
        source = source_of(line)
        shown = redact(source)
        recorded = line.split("==", 1)[1] if "==" in line else None
        say(f"building {name} from {shown} into a wheel (no package index has it)")
        with tempfile.TemporaryDirectory(prefix="jp-local-wheel-") as tmp:
            ok, why = _pip_wheel(source, Path(tmp))
            wheels = sorted(Path(tmp).glob("*.whl"))
            if not ok or len(wheels) != 1 or not _WHEEL_NAME.fullmatch(wheels[0].name):
                left.append(EnvChange(name, recorded, None, "not-found", "left-out",
                                      f"could not build a wheel from {shown}: {why}"[:2000]))
                continue
            path = wheels[0]
            if not fits(path.name, python_version, machine):
                left.append(EnvChange(name, recorded, None, "no-wheel", "left-out",
                                      f"the wheel built from {shown} ({path.name}) fits only this computer"))
                continue
            data = path.read_bytes()
        wheel_name, version = path.name.split("-")[:2]
        if normalise(wheel_name) != name:
            left.append(EnvChange(name, recorded, None, "not-found", "left-out",
                                  f"{shown} built {path.name}, not {name}"))
            continue
        built.append(LocalWheel(name, version, path.name, len(data), store.put_object(data), shown))
    return built, left


def _pip_wheel(source: str, dest: Path) -> tuple[bool, str]:
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--no-input",
            "--quiet", "--wheel-dir", str(dest), source]
    proc = subprocess.run(base, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        # no index for the build backend: build with the one installed here
        proc = subprocess.run([*base[:-1], "--no-build-isolation", source], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "no output")
    return proc.returncode == 0, redact(last)[-300:]


def fetch_local(store: Store, wheels: Iterable[LocalWheel], dest: Path) -> list[Path]:
    """On the machine: each built wheel from the store, hashed on the way in, into ``dest``."""
    out = []
    dest.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        data = store.get_object(w.hash, what=f"the wheel built from {w.source}")  # hash-checked
        if len(data) != w.size:
            raise ManifestError(f"the wheel {w.filename} has {len(data)} bytes, its record says {w.size}")
        path = dest / w.filename
        path.write_bytes(data)
        out.append(path)
    return out


__all__ = ["LocalWheel", "build_local", "fetch_local", "fits", "source_of"]
