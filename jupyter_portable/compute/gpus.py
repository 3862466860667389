"""What GPUs a machine has and what CUDA its driver supports, as ``nvidia-smi`` reports them.

``nvidia-smi`` is the one tool every NVIDIA driver install ships; asking it avoids importing a
framework (slow) or linking NVML (a native dependency). Its failures are facts worth recording
(a stopped RunPod pod restarts with zero GPUs; a host with a broken driver answers exit 9), so
:func:`query_gpus` turns them into a note instead of raising.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

QUERY_FIELDS = ("index", "name", "driver_version", "memory.total", "uuid")
QUERY_ARGS = [f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits"]
# Header of the default table ("CUDA Version: 12.4") and the line of ``nvidia-smi -q``
# ("CUDA Version                          : 12.4"); the driver prints N/A when it has none.
_CUDA = re.compile(r"CUDA Version\s*:\s*(\d+\.\d+)")
_NO_DEVICES = "no devices were found"
_DRIVER = re.compile(r"\A\d{1,5}(?:\.\d{1,5}){0,3}\Z")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver names it; ``memory_mb`` is MiB, as nvidia-smi counts."""

    name: str
    driver: str
    memory_mb: int
    uuid: str
    index: int

    def to_record(self) -> dict[str, Any]:
        """The JSON-safe form stored in a runtime record."""
        rec = asdict(self)
        return {k: rec[k] for k in ("index", "name", "driver", "memory_mb", "uuid")}


def parse_query_csv(text: str) -> list[Gpu]:
    """GPUs from ``--query-gpu=index,name,driver_version,memory.total,uuid --format=csv,noheader,nounits``.

    Raises ValueError naming the first line that does not have five fields with integer index
    and memory.
    """
    gpus = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(QUERY_FIELDS):
            raise ValueError(f"line {number} has {len(fields)} fields, expected {len(QUERY_FIELDS)}: {line[:120]!r}")
        index, name, driver, memory, uuid = fields
        if not index.isdigit() or not memory.isdigit():
            raise ValueError(f"line {number}: index and memory.total must be integers: {line[:120]!r}")
        if not name or not driver or not uuid:
            raise ValueError(f"line {number} has an empty field: {line[:120]!r}")
        if not _DRIVER.match(driver):  # "nan", "N/A": no version a pin or a route could compare
            raise ValueError(f"line {number}: driver_version {driver[:40]!r} is not a version such as 550.54.15")
        gpus.append(Gpu(name=name, driver=driver, memory_mb=int(memory), uuid=uuid, index=int(index)))
    return gpus


def parse_cuda_version(text: str) -> str | None:
    """The highest CUDA the driver supports, from ``nvidia-smi`` or ``nvidia-smi -q`` output."""
    m = _CUDA.search(text)
    return m.group(1) if m else None


def _first_line(proc: subprocess.CompletedProcess[str]) -> str:
    # nvidia-smi prints its failures on stdout; other tools use stderr.
    for stream in (proc.stdout, proc.stderr):
        for line in stream.splitlines():
            if line.strip():
                return line.strip()
    return f"nvidia-smi exited {proc.returncode} without output"


def _run(exe: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str] | str:
    """The finished process, or a note saying why there is none."""
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return f"no GPU: nvidia-smi did not answer within {timeout:g}s"
    except OSError as exc:
        return f"no GPU: cannot run nvidia-smi: {exc.strerror or exc}"


def query_gpus(nvidia_smi: str = "nvidia-smi", timeout: float = 10) -> tuple[list[Gpu], str | None, str | None]:
    """(GPUs, the driver's max CUDA version, a note when there are no usable answers); never raises for absence."""
    exe = nvidia_smi if os.sep in nvidia_smi else shutil.which(nvidia_smi)
    if not exe or not os.path.exists(exe):
        return [], None, "no GPU: nvidia-smi not found"
    proc = _run(exe, QUERY_ARGS, timeout)
    if isinstance(proc, str):
        return [], None, proc
    if _NO_DEVICES in (proc.stdout + proc.stderr).lower():
        return [], None, "no GPU: no devices were found"
    if proc.returncode != 0:
        return [], None, f"no GPU: {_first_line(proc)}"
    try:
        gpus = parse_query_csv(proc.stdout)
    except ValueError as exc:
        return [], None, f"no GPU: nvidia-smi output not understood ({exc})"
    if not gpus:
        return [], None, "no GPU: no devices were found"
    # The CUDA version is only in the human outputs; a failure here loses that one fact only.
    cuda = None
    for args in ([], ["-q"]):
        out = _run(exe, args, timeout)
        if not isinstance(out, str) and out.returncode == 0 and (cuda := parse_cuda_version(out.stdout)):
            break
    return gpus, cuda, None


__all__ = ["Gpu", "QUERY_ARGS", "parse_cuda_version", "parse_query_csv", "query_gpus"]
