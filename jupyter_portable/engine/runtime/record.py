"""The runtime record taken at each published version: probed when the environment
changed, reused otherwise, its lockfile stored as a content-addressed object."""

from __future__ import annotations

import json
import os
import platform
import site
import sys
from typing import Any

import blake3

from jupyter_portable.core.errors import ManifestError, PortableError
from jupyter_portable.core.manifest import Manifest
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.files import atomic_write
from jupyter_portable.workdir.workcopy import WorkspaceCopy

_MARKERS = (".dist-info", ".egg-info", ".egg-link", ".pth")


def env_fingerprint() -> str:
    """A cheap name for this interpreter's installed set: what its site folders list.

    Installing, upgrading or removing a distribution renames a ``*.dist-info`` folder,
    so the fingerprint changes without reading any metadata.
    """
    h = blake3.blake3(f"{sys.executable}\0{platform.python_version()}\0".encode())
    folders = list(dict.fromkeys([*site.getsitepackages(), site.getusersitepackages()]))
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
    """Callable for :class:`Extras.runtime`: the record of this interpreter's environment."""

    def __init__(self, copy: WorkspaceCopy, store: Store, fingerprint: str) -> None:
        self.copy = copy
        self.store = store
        self.fingerprint = fingerprint

    @property
    def _cache(self) -> Any:
        return self.copy.meta / "runtime.json"

    def _cached(self) -> dict[str, Any] | None:
        from jupyter_portable.engine.runtime.probe import validate_runtime

        try:
            obj = json.loads(self._cache.read_bytes())
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
            probe = probe_runtime()
        except PortableError as exc:
            print(f"warning: the runtime could not be recorded: {exc.one_line()}", file=sys.stderr)
            return base.runtime if base else None
        record = dict(probe.record)
        record["lockfile"] = self.store.put_object(probe.lockfile) if probe.lockfile else None
        record["conda"] = self.store.put_object(probe.conda) if probe.conda else None
        record = validate_runtime(record)
        atomic_write(self._cache, json.dumps({"fingerprint": self.fingerprint, "record": record}).encode())
        return record
