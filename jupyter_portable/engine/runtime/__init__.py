"""The runtime record of a kernel's environment: Python, packages, image, CUDA and GPUs.

Nothing here imports Jupyter or a network library; everything is learnt from local processes
(the kernel's interpreter, ``nvidia-smi``, ``conda``) and files.
"""

from __future__ import annotations

from jupyter_portable.compute.gpus import Gpu, parse_cuda_version, parse_query_csv, query_gpus
from jupyter_portable.engine.runtime.diff import diff_runtime, format_diff
from jupyter_portable.engine.runtime.lockfile import conda_explicit, lock_environment, parse_lockfile, rebuild_commands
from jupyter_portable.engine.runtime.probe import RUNTIME_SCHEMA, RuntimeProbe, probe_runtime, validate_runtime

__all__ = [
    "RUNTIME_SCHEMA",
    "Gpu",
    "RuntimeProbe",
    "conda_explicit",
    "diff_runtime",
    "format_diff",
    "lock_environment",
    "parse_cuda_version",
    "parse_lockfile",
    "parse_query_csv",
    "probe_runtime",
    "query_gpus",
    "rebuild_commands",
    "validate_runtime",
]
