"""The runtime record taken at each published version: probed when the environment
changed, reused otherwise, its lockfile stored as a content-addressed object."""

from __future__ import annotations

import json
import os
import platform
import site
import subprocess
import sys
from typing import Any

import blake3

from jupyter_portable.core.errors import ManifestError, PortableError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.workcopy import WorkspaceCopy

_MARKERS = (".dist-info", ".egg-info", ".egg-link", ".pth")


def _site_folders(python: str | None) -> tuple[str, list[str]]:
    """The version and site folders of interpreter ``python`` (default: this one). Another
    interpreter is asked once per process: a snapshot names its environment often."""
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return platform.python_version(), list(dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()]))
    key = os.path.abspath(python)
    if key not in _ASKED:
        code = ("import json, platform, site; print(json.dumps([platform.python_version(), "
                "site.getsitepackages() + [site.getusersitepackages()]]))")
        try:
            out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
            version, folders = json.loads(out.stdout)
            _ASKED[key] = (str(version), [str(f) for f in folders])
        except (OSError, subprocess.SubprocessError, ValueError):
            return "?", []  # not remembered: asked again; the runtime probe says what is wrong
    return _ASKED[key]


_ASKED: dict[str, tuple[str, list[str]]] = {}


def env_fingerprint(python: str | None = None) -> str:
    """A cheap name for interpreter ``python``'s installed set (default: this one's): what its
    site folders list.

    Installing, upgrading or removing a distribution renames a ``*.dist-info`` folder,
    so the fingerprint changes without reading any metadata.
    """
    version, folders = _site_folders(python)
    h = blake3.blake3(f"{python or sys.executable}\0{version}\0".encode())
    for folder in folders:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(_MARKERS))
        except OSError:
            continue
        h.update(folder.encode() + b"\0" + "\0".join(names).encode() + b"\n")
    nvidia = os.environ.get("PATH", "")
    h.update(nvidia.encode())  # a different PATH may mean a different nvidia-smi
    return h.hexdigest()


class RuntimeRecorder:
    """Callable for :class:`Extras.runtime`: the record of the notebook's environment, that is
    interpreter ``python`` (default: this one; the worker names its kernel's)."""

    def __init__(self, copy: WorkspaceCopy, store: Store, fingerprint: str, python: str | None = None) -> None:
        self.copy = copy
        self.store = store
        self.fingerprint = fingerprint
        self.python = python

    def _cached(self) -> dict[str, Any] | None:
        from jupyter_portable.engine.runtime.probe import validate_runtime

        try:
            obj = json.loads(self.copy.runtime_bytes() or b"null")
            if obj.get("fingerprint") != self.fingerprint:
                return None
            record = validate_runtime(obj.get("record"))
        except (OSError, ValueError, AttributeError, ManifestError):
            return None
        if record.get("lockfile") and not self.store.has_object(record["lockfile"]):
            return None  # another store, or a lost object: probe again
        return record

    def __call__(self, base: Manifest | None) -> dict[str, Any] | None:
        from jupyter_portable.engine.runtime.probe import probe_runtime, validate_runtime

        record = self._cached()
        if record is not None:
            return record
        try:
            probe = probe_runtime(self.python)
        except PortableError as exc:
            print(f"warning: the runtime could not be recorded: {exc.one_line()}", file=sys.stderr)
            return base.runtime if base else None
        record = dict(probe.record)
        record["lockfile"] = self.store.put_object(probe.lockfile) if probe.lockfile else None
        record["conda"] = self.store.put_object(probe.conda) if probe.conda else None
        record = validate_runtime(record)
        self.copy.write_runtime(json.dumps({"fingerprint": self.fingerprint, "record": record}).encode())
        return record
