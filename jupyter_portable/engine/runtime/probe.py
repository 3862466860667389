"""The runtime record: what Python, packages, image, CUDA and GPUs a kernel's environment has.

A record (schema 1) is a JSON object::

    {"schema": 1, "python": "3.11.7", "implementation": "cpython", "executable": "/opt/venv/bin/python",
     "platform": "Linux-6.5.0-x86_64-with-glibc2.35", "machine": "x86_64", "packages": 143,
     "image": {"name": "nvcr.io/nvidia/pytorch:24.01-py3", "source": "env NVIDIA_PYTORCH_VERSION ...",
               "in_container": true},
     "cuda_runtime": "12.1", "cuda_driver": "12.4",
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15", "memory_mb": 81559,
               "uuid": "GPU-..."}],
     "gpu_note": null}

The snapshot code adds ``"lockfile"`` and ``"conda"`` (hashes of the stored bytes, conda may
be null) once it has stored them. Any other schema is refused.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_portable.compute.gpus import query_gpus
from jupyter_portable.core.errors import ManifestError
from jupyter_portable.engine.runtime.lockfile import (
    conda_explicit,
    format_lockfile,
    inspect_environment,
    parse_lockfile,
)

RUNTIME_SCHEMA = 1
_KEYS = frozenset({"schema", "python", "implementation", "executable", "platform", "machine", "packages",
                   "image", "cuda_runtime", "cuda_driver", "gpus", "gpu_note"})
_ADDED_LATER = frozenset({"lockfile", "conda"})
_GPU_KEYS = frozenset({"index", "name", "driver", "memory_mb", "uuid"})
_IMAGE_KEYS = frozenset({"name", "source", "in_container"})
_PY_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)?\S*")
_CUDA = re.compile(r"\d+\.\d+")
# Images that say which NGC container they are only by a version variable; their tags follow YY.MM-py3.
_NGC = (("NVIDIA_PYTORCH_VERSION", "nvcr.io/nvidia/pytorch"),
        ("NVIDIA_TENSORFLOW_VERSION", "nvcr.io/nvidia/tensorflow"))
# Platforms that run every workload in a container but do not tell it which image it is.
_PLATFORMS = (("RUNPOD_POD_ID", "RunPod"), ("VAST_CONTAINERLABEL", "Vast.ai"),
              ("KUBERNETES_SERVICE_HOST", "Kubernetes"))
_CGROUP_HINTS = ("docker", "kubepods", "containerd", "libpod", "lxc")


@dataclass
class RuntimeProbe:
    """A record plus the bytes it will point at once stored."""

    record: dict[str, Any]
    lockfile: bytes
    conda: bytes | None


def _read(path: Path, limit: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def detect_image(environ: Mapping[str, str] | None = None, root: str | os.PathLike[str] = "/") -> dict[str, Any] | None:
    """The container image, from what the platform left in the environment and filesystem; no network."""
    env = os.environ if environ is None else environ
    base = Path(root)
    name: str | None = None
    named_by: str | None = None
    for var in ("CONTAINER_IMAGE", "IMAGE_NAME", "DOCKER_IMAGE"):
        if env.get(var, "").strip():
            name, named_by = env[var].strip(), f"env {var}"
            break
    evidence: list[str] = []
    containerenv = base / "run" / ".containerenv"
    if containerenv.exists():
        evidence.append("/run/.containerenv")
        # Podman writes image="..." into this file; Docker has no equivalent.
        m = re.search(r'^image="([^"\n]+)"', _read(containerenv), re.MULTILINE)
        if m and name is None:
            name, named_by = m.group(1), "/run/.containerenv"
    for var, repo in _NGC:
        version = env.get(var, "").strip()
        if version and name is None and re.fullmatch(r"[0-9][0-9.]*", version):
            name, named_by = f"{repo}:{version}-py3", f"env {var}={version} (NGC tag inferred)"
    if (base / ".dockerenv").exists():
        evidence.append("/.dockerenv")
    for var, platform in _PLATFORMS:
        if env.get(var):
            evidence.append(f"env {var} ({platform}; it does not expose the image)")
    hints = [h for h in _CGROUP_HINTS if h in _read(base / "proc" / "1" / "cgroup")]
    if hints:
        evidence.append(f"/proc/1/cgroup ({', '.join(hints)})")
    if env.get("container"):
        evidence.append(f"env container={env['container']}")  # systemd's convention for container managers
    if name is None and env.get("CUDA_VERSION") and env.get("NVIDIA_REQUIRE_CUDA"):
        evidence.append(f"env CUDA_VERSION={env['CUDA_VERSION']} (an nvidia/cuda-based image)")
    if name is None and not evidence:
        return None
    return {"name": name[:300] if name else None, "source": named_by or "; ".join(evidence),
            "in_container": bool(evidence)}


def _major_minor(version: str) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def cuda_runtime_from(packages: Mapping[str, str], environ: Mapping[str, str] | None = None) -> str | None:
    """The CUDA runtime the environment's frameworks use, as MAJOR.MINOR, without importing any of them."""
    for name in sorted(packages):
        if re.fullmatch(r"nvidia-cuda-runtime(?:-cu\d+)?", name):
            m = re.search(r"==(\S+)", packages[name])
            if m and (found := _major_minor(m.group(1))):
                return found
    # torch wheels from download.pytorch.org carry the CUDA they were built with: 2.3.0+cu121.
    m = re.search(r"(?:\+|%2B)cu(\d+)(\d)(?!\d)", packages.get("torch", ""), re.IGNORECASE)
    if m:
        return f"{int(m.group(1))}.{m.group(2)}"
    env = os.environ if environ is None else environ
    return _major_minor(env.get("CUDA_VERSION", ""))


def _canonical_executable(exe: str) -> str:
    """``bin/python3`` and ``bin/python`` of one environment are one interpreter: name it one way,
    so that a script whose shebang says the other does not record a runtime change."""
    plain = os.path.join(os.path.dirname(exe), "python")
    try:
        if plain != exe and os.path.samefile(plain, exe):
            return plain
    except OSError:
        pass
    return exe


def probe_runtime(python: str | None = None, nvidia_smi: str = "nvidia-smi") -> RuntimeProbe:
    """Record the runtime of interpreter ``python`` (default: this one) on this machine."""
    info = inspect_environment(python)
    lockfile = format_lockfile(info)
    packages = parse_lockfile(lockfile)
    gpus, cuda_driver, note = query_gpus(nvidia_smi)
    record: dict[str, Any] = {
        "schema": RUNTIME_SCHEMA,
        "python": str(info.get("python")),
        "implementation": str(info.get("implementation")),
        "executable": _canonical_executable(str(info.get("executable"))),
        "platform": str(info.get("platform")),
        "machine": str(info.get("machine")),
        "packages": len(packages),
        "image": detect_image(),
        "cuda_runtime": cuda_runtime_from(packages),
        "cuda_driver": cuda_driver,
        "gpus": [g.to_record() for g in gpus],
        "gpu_note": note,
    }
    prefix = info.get("prefix")
    return RuntimeProbe(record=validate_runtime(record), lockfile=lockfile,
                        conda=conda_explicit(prefix if isinstance(prefix, str) else None))


def _fail(what: str) -> ManifestError:
    return ManifestError(f"runtime record: {what}", hint="the manifest was written by another tool or altered")


def _is_int(value: object) -> bool:
    return type(value) is int and value >= 0  # bool is an int subclass; JSON true is not a count


def _opt_str(record: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None = None) -> None:
    value = record[key]
    if value is not None and (not isinstance(value, str) or (pattern and not pattern.fullmatch(value))):
        raise _fail(f"{key} must be null or a string{' like 12.4' if pattern else ''}, not {value!r}")


def validate_runtime(record: object) -> dict[str, Any]:
    """A checked copy of a runtime record; :class:`ManifestError` when anything is off."""
    if not isinstance(record, dict):
        raise _fail(f"expected an object, got {type(record).__name__}")
    schema = record.get("schema")
    if not _is_int(schema) or schema != RUNTIME_SCHEMA:
        raise ManifestError(f"runtime record schema {schema!r} is not supported (this version reads {RUNTIME_SCHEMA})",
                            hint="upgrade jupyter-portable to read newer workspaces")
    missing, unknown = _KEYS - record.keys(), record.keys() - _KEYS - _ADDED_LATER
    if missing or unknown:
        raise _fail(f"missing keys {sorted(missing)}, unknown keys {sorted(map(str, unknown))}")
    for key in ("implementation", "executable", "platform", "machine"):
        if not isinstance(record[key], str) or not record[key]:
            raise _fail(f"{key} must be a non-empty string")
    if not isinstance(record["python"], str) or not _PY_VERSION.fullmatch(record["python"]):
        raise _fail(f"python must be a version like 3.11.7, not {record['python']!r}")
    if not _is_int(record["packages"]):
        raise _fail("packages must be a count")
    image = record["image"]
    if image is not None:
        if not isinstance(image, dict) or image.keys() != _IMAGE_KEYS or not isinstance(image["source"], str) \
                or not isinstance(image["in_container"], bool):
            raise _fail(f"image must be null or {{name, source, in_container}}, not {image!r}")
        _opt_str(image, "name")
    _opt_str(record, "cuda_runtime", _CUDA)
    _opt_str(record, "cuda_driver", _CUDA)
    _opt_str(record, "gpu_note")
    for key in _ADDED_LATER & record.keys():
        _opt_str(record, key)
    if not isinstance(record["gpus"], list):
        raise _fail("gpus must be a list")
    for gpu in record["gpus"]:
        if not isinstance(gpu, dict) or gpu.keys() != _GPU_KEYS or not _is_int(gpu["index"]) \
                or not _is_int(gpu["memory_mb"]) \
                or not all(isinstance(gpu[k], str) and gpu[k] for k in ("name", "driver", "uuid")):
            raise _fail(f"malformed GPU entry {gpu!r}")
    return copy.deepcopy(record)


__all__ = ["RUNTIME_SCHEMA", "RuntimeProbe", "cuda_runtime_from", "detect_image", "probe_runtime",
           "validate_runtime"]
