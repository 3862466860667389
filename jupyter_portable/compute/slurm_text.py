"""What the Slurm commands write, read and checked (for :mod:`.slurm`): ``sinfo``'s partitions,
``sbatch --test-only``'s expected start, ``squeue --json``'s jobs and how each end of a job is said.
Output that is not what Slurm writes is refused with ProviderUnavailable naming the command."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jupyter_portable.core.errors import ProviderUnavailable

_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_JOB_ID = re.compile(r"\A[0-9]{1,12}\Z")
_TEST_ONLY = re.compile(r"Job (\d+) to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d) using")
_CLOCK = re.compile(r"\Anow (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\Z")
_GRES_GPU = re.compile(r"\Agpu(?::([A-Za-z0-9._-]+))?:(\d+)(?:\(.*\))?\Z")
_UP_NODES = {"idle", "mixed", "allocated", "completing", "planned"}
_SUFFIXES = "*~#!%$@^-+"  # sinfo's marks after a state (not responding, powered down, ...)

# GPU memory by GRES type, where the cluster names its GPUs the usual way; set gpu_memory to add.
GPU_MEMORY_GB: dict[str, float] = {"a100": 80.0, "a100-40gb": 40.0, "a100-80gb": 80.0, "h100": 80.0, "h200": 141.0,
                                   "v100": 32.0, "a40": 48.0, "a10": 24.0, "l40": 48.0, "l40s": 48.0, "l4": 24.0,
                                   "t4": 16.0, "rtx6000": 24.0, "rtx8000": 48.0, "a6000": 48.0}

# Slurm's final states, and how each is said to the user
_ENDED = {"TIMEOUT": "time limit reached", "NODE_FAIL": "node failure", "BOOT_FAIL": "the node failed to boot",
          "DEADLINE": "deadline reached", "OUT_OF_MEMORY": "out of memory", "FAILED": "the job failed",
          "COMPLETED": "the job ended", "SPECIAL_EXIT": "the job ended (special exit)"}
_RUNNING = {"RUNNING", "CONFIGURING", "RESIZING", "SIGNALING", "STAGE_OUT"}
_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}


def _bad(command: str, what: str, text: str = "") -> ProviderUnavailable:
    shown = text.strip().splitlines()[0][:200] if text.strip() else ""
    return ProviderUnavailable(f"slurm: `{command}` answered {what}" + (f": {shown!r}" if shown else ""),
                               provider="slurm", hint="check that the login node runs Slurm's own commands "
                                                      "(sinfo, sbatch, squeue) and nothing wraps their output")


def parse_time_limit(text: str) -> int | None:
    """Seconds of a Slurm time (``[days-]hours:minutes:seconds``, ``minutes:seconds``, ``minutes``);
    None for ``infinite``/``UNLIMITED``. ValueError for anything else."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, a, b, c = m.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:
        return int(a) * 60 + int(b)
    return int(a) * 60


def slurm_minutes(seconds: int) -> str:
    """``--time`` as Slurm takes it: whole minutes, at least one."""
    return str(max(1, math.ceil(seconds / 60)))


@dataclass(frozen=True)
class Partition:
    """One partition's GPUs as sinfo lists them: GRES type -> the most GPUs of it on one usable node."""

    name: str
    up: bool
    time_limit_s: int | None
    gpus: dict[str, int]
    usable_nodes: int
    nodes: int


def parse_sinfo(text: str) -> list[Partition]:
    """``sinfo -h -N -o '%R|%a|%l|%T|%G|%N'`` (a line a node and partition) as partitions."""
    parts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.strip().split("|")
        if len(fields) != 6 or not _ID.match(fields[0]):
            raise _bad("sinfo", "a line that is not partition|avail|timelimit|state|gres|node", line)
        name, avail, limit, state, gres, _node = fields
        try:
            limit_s = parse_time_limit(limit)
        except ValueError:
            raise _bad("sinfo", "a time limit that is not a Slurm time", line) from None
        p = parts.setdefault(name, {"up": avail == "up", "limit": limit_s, "gpus": {}, "usable": 0, "nodes": 0})
        p["nodes"] += 1
        if state.rstrip(_SUFFIXES).lower() not in _UP_NODES or state.endswith(("*", "~", "#", "!", "%")):
            continue  # down, drained, not responding, powered off: no job starts there now
        p["usable"] += 1
        for item in (gres.split(",") if gres not in ("", "(null)") else []):
            m = _GRES_GPU.match(item.strip())
            if item.strip().startswith("gpu") and not m:
                raise _bad("sinfo", "a GPU GRES that is not gpu[:type]:count", line)
            if m:
                kind = m.group(1) or "gpu"
                p["gpus"][kind] = max(p["gpus"].get(kind, 0), int(m.group(2)))
    return [Partition(name, p["up"], p["limit"], p["gpus"], p["usable"], p["nodes"]) for name, p in parts.items()]


def parse_test_only(text: str, now_line: str) -> float:
    """Seconds until ``sbatch --test-only``'s expected start, by the cluster's own clock (``now_line``:
    ``now <its local time>``, taken in the same command, so no time zone is guessed). ValueError if
    either is not what Slurm and ``date`` write."""
    m, clock = _TEST_ONLY.search(text), _CLOCK.match(now_line.strip())
    if not m or not clock:
        raise ValueError(text.strip()[:200] or "no answer")
    start = datetime.fromisoformat(m.group(2))
    now = datetime.fromisoformat(clock.group(1))
    return max(0.0, (start - now).total_seconds())


def loss_reason(job: dict[str, Any], *, preemptor: str | None = None) -> str | None:
    """What ended ``job`` (one of ``squeue --json``'s jobs) in the user's words; None while it
    pends or runs. ``preemptor``: the partition whose job took its node."""
    state = job["job_state"]
    if state == "PREEMPTED":
        return f"preempted by partition {preemptor}" if preemptor else "preempted by a higher-priority partition"
    if state == "CANCELLED":
        return "cancelled outside jupyter-portable (by an admin, or scancel)"
    if state in _ENDED:
        words = _ENDED[state]
        code = job.get("exit_code")
        return f"{words} (exit {code})" if state in ("FAILED", "COMPLETED") and code not in (None, 0) else words
    if state == "COMPLETING" and _ended_for_good(job):
        # Slurm says the job has ended and is cleaning up (seconds, before its final state): its end is
        # Slurm's word already. A preemption or a requeue waits for its own state, and its own words.
        start, end, limit = int(job.get("start_time") or 0), int(job.get("end_time") or 0), job.get("time_limit")
        # Slurm's own reason first: a job whose EndTime was moved (scontrol update) keeps its time_limit,
        # so its end can fall short of start + limit and still be Slurm's time limit (state_reason TimeLimit)
        if job.get("state_reason") == "TimeLimit" or (
                isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 and end >= start + limit * 60):
            return "time limit reached"
        return "the job ended (Slurm is completing it)"
    if state in _PENDING and int(job.get("restart_cnt") or 0) > 0:
        return f"requeued by Slurm (restart {job['restart_cnt']}): the job went back to the queue"
    return None


def _ended_for_good(job: dict[str, Any]) -> bool:
    """A COMPLETING job that ran, cannot come back (not requeueable, never requeued) and was not
    preempted: whatever its final state, it has ended."""
    return int(job.get("start_time") or 0) > 0 and 0 < int(job.get("end_time") or 0) \
        and job.get("requeue") is False and not int(job.get("restart_cnt") or 0) \
        and not int(job.get("preempt_time") or 0)


def check_job(obj: object, job_id: str) -> dict[str, Any]:
    """The one job ``job_id`` of ``squeue --json``'s answer ``obj``, its fields checked; ProviderUnavailable
    if the answer is not squeue's."""
    jobs = obj.get("jobs") if isinstance(obj, dict) else None
    if not isinstance(jobs, list):
        raise _bad("squeue --json", "no jobs list")
    for job in jobs:
        if not isinstance(job, dict) or str(job.get("job_id")) != job_id:
            continue
        if not isinstance(job.get("job_state"), str) or not isinstance(job.get("name"), str) \
                or not isinstance(job.get("partition"), str):
            raise _bad("squeue --json", f"job {job_id} without its state, name or partition")
        for key in ("start_time", "end_time", "preempt_time", "restart_cnt"):
            if not isinstance(job.get(key, 0), int) or isinstance(job.get(key), bool):
                raise _bad("squeue --json", f"job {job_id}'s {key} that is not a number")
        return job
    raise KeyError(job_id)


__all__ = ["GPU_MEMORY_GB", "Partition", "check_job", "loss_reason", "parse_sinfo", "parse_test_only",
           "parse_time_limit", "slurm_minutes"]
