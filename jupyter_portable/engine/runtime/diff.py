"""What changed between two runtime records: the answer to "why does my notebook behave differently"."""

from __future__ import annotations

from collections import Counter
from typing import Any

from jupyter_portable.engine.runtime.lockfile import parse_lockfile


def _pair(x: Any, y: Any) -> list[Any] | None:
    return [x, y] if x != y else None


def _python(rec: dict[str, Any]) -> str | None:
    version, impl = rec.get("python"), rec.get("implementation")
    return version if impl in (None, "cpython") else f"{impl} {version}"


def _driver(rec: dict[str, Any]) -> str | None:
    return ", ".join(sorted({g["driver"] for g in rec.get("gpus") or []})) or None


def _gpu_kinds(rec: dict[str, Any]) -> Counter[tuple[str, int]]:
    # UUIDs and indexes differ on every machine; the model and its memory are what a notebook feels.
    return Counter((g["name"], g["memory_mb"]) for g in rec.get("gpus") or [])


def diff_runtime(a: dict[str, Any], b: dict[str, Any], lock_a: bytes | None, lock_b: bytes | None) -> dict[str, Any]:
    """Changes from record ``a`` to record ``b``; None marks "unchanged", ``packages`` is None without both locks."""
    packages = None
    if lock_a is not None and lock_b is not None:
        pa, pb = parse_lockfile(lock_a), parse_lockfile(lock_b)
        packages = {
            "added": {n: pb[n] for n in sorted(pb.keys() - pa.keys())},
            "removed": {n: pa[n] for n in sorted(pa.keys() - pb.keys())},
            "changed": {n: [pa[n], pb[n]] for n in sorted(pa.keys() & pb.keys()) if pa[n] != pb[n]},
        }
    return {
        "python": _pair(_python(a), _python(b)),
        "platform": _pair(a.get("platform"), b.get("platform")),
        "image": _pair(a.get("image"), b.get("image")),
        "cuda_runtime": _pair(a.get("cuda_runtime"), b.get("cuda_runtime")),
        "cuda_driver": _pair(a.get("cuda_driver"), b.get("cuda_driver")),
        "gpus": {"a": list(a.get("gpus") or []), "b": list(b.get("gpus") or [])}
        if _gpu_kinds(a) != _gpu_kinds(b) else None,
        "driver": _pair(_driver(a), _driver(b)),
        "packages": packages,
    }


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict):  # an image
        return value.get("name") or f"unnamed container ({value.get('source')})"
    return str(value)


def _show_gpus(gpus: list[dict[str, Any]]) -> str:
    kinds = Counter((g["name"], g["memory_mb"]) for g in gpus)
    return ", ".join(f"{n}x {name} ({mem} MiB)" for (name, mem), n in sorted(kinds.items())) or "none"


def format_diff(d: dict[str, Any]) -> str:
    """One change a line, for a terminal; ``no runtime changes`` when there are none."""
    lines = []
    for key, label in (("python", "python"), ("platform", "platform"), ("image", "image"),
                       ("cuda_runtime", "CUDA runtime"), ("cuda_driver", "CUDA supported by driver"),
                       ("driver", "NVIDIA driver")):
        if d.get(key):
            lines.append(f"{label}: {_show(d[key][0])} -> {_show(d[key][1])}")
    if d.get("gpus"):
        lines.append(f"gpus: {_show_gpus(d['gpus']['a'])} -> {_show_gpus(d['gpus']['b'])}")
    packages = d.get("packages") or {}
    lines += [f"+ {line}" for line in (packages.get("added") or {}).values()]
    lines += [f"- {line}" for line in (packages.get("removed") or {}).values()]
    lines += [f"~ {name}: {old} -> {new}" for name, (old, new) in (packages.get("changed") or {}).items()]
    return "\n".join(lines) if lines else "no runtime changes"


__all__ = ["diff_runtime", "format_diff"]
