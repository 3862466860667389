"""Admission: ask the machine itself what it is, and refuse it before any work runs.

A listing is a claim; ``nvidia-smi`` on the machine is the fact. Markets list a driver and
then hand out a host that was upgraded since, or a pod that came back without its GPU.
:func:`probe_machine` runs on the allocation through a :data:`Runner` (a subprocess for the
local market, SSH for remote hosts); :func:`refusals` compares the facts with the
requirements as a pure function; :func:`admit` raises :class:`AdmissionRefused`, an
environment fault: the work did not run, so it is not the work's failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.gpus import QUERY_ARGS, Gpu, parse_cuda_version, parse_query_csv
from jupyter_portable.core.errors import AdmissionRefused
from jupyter_portable.core.offers import Requirements, version_tuple
from jupyter_portable.core.secretenv import scrubbed

Runner = Callable[[list[str]], tuple[int, str, str]]
"""Runs argv on the allocation; returns (exit status, stdout, stderr). Never raises: a
command that cannot start answers 127, one that does not finish 124."""

IMAGE_ENV = "JUPYTER_PORTABLE_IMAGE"
_NO_DEVICES = "no devices were found"
# Listings say GB (10^9 bytes) and nvidia-smi says MiB (2^20 bytes); a "24 GB" L4 reports
# 23034 MiB, which is 24.15 GB, so comparing in GB admits what the listing promised.
_MIB_PER_GB = 1e9 / 2**20


@dataclass(frozen=True)
class MachineFacts:
    """What the machine says about itself. ``gpu_note`` says why ``gpus`` is empty."""

    gpus: tuple[Gpu, ...]
    driver: str | None
    cuda_driver: str | None  # the highest CUDA the driver supports
    gpu_note: str | None
    image: str | None

    def to_json(self) -> dict[str, Any]:
        return {"gpus": [g.to_record() for g in self.gpus], "driver": self.driver, "cuda_driver": self.cuda_driver,
                "gpu_note": self.gpu_note, "image": self.image}


def local_runner(allocation: Allocation, timeout: float = 30) -> Runner:
    """A runner for a local-market allocation: its ``bin`` first on PATH, its ``work`` as cwd."""
    bin_dir = str(allocation.details["bin"])
    work = allocation.details.get("work") or allocation.details["dir"]
    env = scrubbed(os.environ)  # the machine's program: only what a machine's process may have (3.4)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    image = allocation.details.get("image")
    if image:
        env[IMAGE_ENV] = str(image)
    else:
        # the server's own environment must not pass for the machine's
        env.pop(IMAGE_ENV, None)

    def run(argv: list[str]) -> tuple[int, str, str]:
        exe = shutil.which(argv[0], path=env["PATH"]) if argv else None
        if not exe:
            return 127, "", f"{argv[0] if argv else '(nothing)'}: command not found"
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env,
                                  cwd=work, stdin=subprocess.DEVNULL, errors="replace")
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} did not answer within {timeout:g}s"
        except OSError as exc:
            return 127, "", f"cannot run {argv[0]}: {exc.strerror or exc}"
        return proc.returncode, proc.stdout, proc.stderr

    return run


def _first_line(rc: int, out: str, err: str) -> str:
    for stream in (out, err):  # nvidia-smi prints its failures on stdout
        for line in stream.splitlines():
            if line.strip():
                return line.strip()
    return f"nvidia-smi exited {rc} without output"


def _probe_gpus(runner: Runner) -> tuple[list[Gpu], str | None, str | None]:
    """(GPUs, CUDA, note): :func:`~jupyter_portable.compute.gpus.query_gpus`'s rules, through a runner."""
    rc, out, err = runner(["nvidia-smi", *QUERY_ARGS])
    if rc == 127:
        return [], None, f"no GPU: nvidia-smi not found ({_first_line(rc, out, err)})"
    if rc == 124:
        return [], None, f"no GPU: {_first_line(rc, out, err)}"
    if _NO_DEVICES in (out + err).lower():
        return [], None, "no GPU: no devices were found"
    if rc != 0:
        return [], None, f"no GPU: {_first_line(rc, out, err)}"
    try:
        gpus = parse_query_csv(out)
    except ValueError as exc:
        return [], None, f"no GPU: nvidia-smi output not understood ({exc})"
    if not gpus:
        return [], None, "no GPU: no devices were found"
    cuda = None
    for args in ([], ["-q"]):  # CUDA is only in the human outputs
        rc, out, _ = runner(["nvidia-smi", *args])
        if rc == 0 and (cuda := parse_cuda_version(out)):
            break
    return gpus, cuda, None


def probe_machine(runner: Runner) -> MachineFacts:
    """Ask the machine for its GPUs, driver, CUDA and image; absence is a fact, not an error."""
    gpus, cuda, note = _probe_gpus(runner)
    rc, out, _ = runner(["printenv", IMAGE_ENV])
    image = (out.strip() or None) if rc == 0 else None
    return MachineFacts(gpus=tuple(gpus), driver=gpus[0].driver if gpus else None, cuda_driver=cuda,
                        gpu_note=note, image=image)


def refusals(requirements: Requirements, facts: MachineFacts) -> dict[str, str]:
    """``{requirement: reason}`` for every requirement the machine fails; empty when admitted."""
    req = requirements
    out: dict[str, str] = {}
    gpus = list(facts.gpus)
    if not gpus:
        if req.gpu_count > 0 or req.gpus or req.driver or req.min_cuda:
            out["gpu"] = facts.gpu_note or "no GPU: the machine reports none"
    else:
        matching = [g for g in gpus if any(w.lower() in g.name.lower() for w in req.gpus)] if req.gpus else gpus
        if not matching:
            names = ", ".join(sorted({g.name for g in gpus}))
            out["gpu"] = f"machine has {names}, not one of {', '.join(req.gpus)}"
        elif len(matching) < req.gpu_count:
            out["gpu_count"] = f"machine has {len(matching)} such GPU(s), {req.gpu_count} needed"
        smallest = min(matching or gpus, key=lambda g: g.memory_mb)
        if smallest.memory_mb / _MIB_PER_GB < req.min_gpu_memory_gb:
            out["gpu_memory"] = (f"GPU {smallest.index} has {smallest.memory_mb} MiB "
                                 f"({smallest.memory_mb / _MIB_PER_GB:.1f} GB), {req.min_gpu_memory_gb:g} GB needed")
        drivers = sorted({g.driver for g in gpus})
        if req.driver and drivers != [req.driver]:
            out["driver"] = f"machine reports driver {', '.join(drivers)}, {req.driver} is pinned"
        if req.min_cuda and (not facts.cuda_driver or version_tuple(facts.cuda_driver) < version_tuple(req.min_cuda)):
            have = f"supports CUDA {facts.cuda_driver}" if facts.cuda_driver else "does not say its CUDA version"
            out["cuda"] = f"driver {have}, at least {req.min_cuda} needed"
    if req.container_image and facts.image != req.container_image:
        out["image"] = (f"machine runs image {facts.image}, {req.container_image} is required" if facts.image
                        else f"machine does not say its image, {req.container_image} is required")
    return out


def admit(requirements: Requirements, facts: MachineFacts, *, provider: str = "", offer: str | None = None) -> None:
    """Return when the machine meets ``requirements``; else raise AdmissionRefused listing every mismatch."""
    found = refusals(requirements, facts)
    if found:
        where = f"{provider}/{offer}" if offer else provider or "the machine"
        raise AdmissionRefused(f"admission refused {where}: " + "; ".join(found.values()), provider=provider,
                               offer=offer, hint="the work did not run; try another route, or relax the requirement",
                               refusals=found, facts=facts.to_json())


__all__ = ["IMAGE_ENV", "MachineFacts", "Runner", "admit", "local_runner", "probe_machine", "refusals"]
