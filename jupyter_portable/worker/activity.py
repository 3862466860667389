"""What the worker sees of its machine's use, for idle autostop (``core/idle``): when the kernel
last ran a cell (from the kernel's own iopub status messages, so nothing in the kernel has to
cooperate), whether one is running, the last "Keep running", and the GPUs' utilization as
``nvidia-smi`` reports it. ``/status`` carries it as ``activity``; the monitor decides."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jupyter_portable.core.idle import gpu_busy
from jupyter_portable.core.times import from_timestamp_iso

log = logging.getLogger("jupyter_portable.worker")

GPU_SAMPLE_ENV = "JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS"
DEFAULT_GPU_SAMPLE_S = 10.0
UTILIZATION_ARGS = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
# a cell, or a widget's message to the kernel: what a person does with a notebook
_USE = ("execute_request", "comm_msg")
_KEPT_SAMPLES = 12


def _iso(ts: float | None) -> str | None:
    return from_timestamp_iso(ts, "milliseconds") if ts is not None else None


class Activity:
    """The record the watchers keep and ``/status`` reports; times are this machine's clock."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.ready_at: float | None = None
        self.last_execution: float | None = None
        self.kernel_busy = False
        self.kept_at: float | None = None
        self.samples: deque[tuple[float, float]] = deque(maxlen=_KEPT_SAMPLES)
        self.last_busy: tuple[float, float] | None = None  # kept however old: the idle clock may start there

    def ready(self) -> None:
        with self.lock:
            self.ready_at = self.clock()

    def keep(self) -> str:
        """"Keep running": the idle clock starts again now."""
        with self.lock:
            self.kept_at = self.clock()
            return str(_iso(self.kept_at))

    def saw_message(self, msg: dict[str, Any]) -> None:
        """One iopub message of the kernel: a busy/idle status of a cell moves the clock."""
        if msg.get("msg_type") != "status" or (msg.get("parent_header") or {}).get("msg_type") not in _USE:
            return
        st = (msg.get("content") or {}).get("execution_state")
        if st not in ("busy", "idle"):
            return
        with self.lock:
            self.kernel_busy = st == "busy"
            self.last_execution = self.clock()

    def kernel_gone(self) -> None:
        with self.lock:
            if self.kernel_busy:
                self.kernel_busy = False
                self.last_execution = self.clock()

    def sample(self, utilization: float) -> None:
        with self.lock:
            at = self.clock()
            self.samples.append((at, utilization))
            if gpu_busy(utilization):
                self.last_busy = (at, utilization)

    def to_json(self) -> dict[str, Any]:
        with self.lock:
            return {"now": _iso(self.clock()), "ready_at": _iso(self.ready_at),
                    "last_execution": _iso(self.last_execution), "kernel_busy": self.kernel_busy,
                    "kept_at": _iso(self.kept_at),
                    "gpu": {"samples": [[_iso(t), u] for t, u in self.samples],
                            "last_busy": [_iso(self.last_busy[0]), self.last_busy[1]] if self.last_busy else None}}


def parse_utilization(text: str) -> float | None:
    """The busiest GPU's percent from ``utilization.gpu`` CSV (None: no GPU answered a number)."""
    values = []
    for line in text.splitlines():
        word = line.strip().removesuffix("%").strip()
        with contextlib.suppress(ValueError):
            values.append(float(word))
    return max(values) if values else None


def sample_gpus(activity: Activity, interval_s: float | None = None) -> None:
    """The sampler thread: ``nvidia-smi``'s utilization every ``interval_s``; a machine without
    one has no GPU samples (its kernel alone says whether it is used)."""
    if interval_s is None:
        try:
            interval_s = max(0.5, float(os.environ.get(GPU_SAMPLE_ENV) or DEFAULT_GPU_SAMPLE_S))
        except ValueError:
            interval_s = DEFAULT_GPU_SAMPLE_S
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return
    while True:
        try:
            done = subprocess.run([exe, *UTILIZATION_ARGS], capture_output=True, text=True, timeout=20)
            value = parse_utilization(done.stdout) if done.returncode == 0 else None
            if value is not None:
                activity.sample(value)
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("nvidia-smi utilization: %s", exc)
        time.sleep(interval_s)


def watch_kernel(state: Any) -> None:
    """The iopub watcher: follows the worker's current kernel (a restart has new ports) and
    records each cell's busy and idle."""
    import zmq
    from jupyter_client.session import Session

    ctx: Any = zmq.Context.instance()
    sock: Any = None
    port: int | None = None
    session: Any = None
    activity: Activity = state.activity
    while True:
        k, info = state.kernel, state.kernel_info
        alive = k is not None and k.poll() is None and bool(info)
        if not alive or (info or {}).get("iopub_port") != port:
            if sock is not None:
                sock.close(linger=0)
                sock, port = None, None
                activity.kernel_gone()
            if not alive:
                time.sleep(0.5)
                continue
            assert info is not None
            port = int(info["iopub_port"])
            session = Session(key=str(info["key"]).encode(), signature_scheme=info.get("signature_scheme")
                              or "hmac-sha256")
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.connect(f"tcp://127.0.0.1:{port}")
        try:
            if not sock.poll(500):
                continue
            _idents, parts = session.feed_identities(sock.recv_multipart(), copy=True)
            activity.saw_message(session.deserialize(parts, content=True))
        except (zmq.ZMQError, ValueError, KeyError, TypeError) as exc:
            log.debug("iopub message not read: %s", exc)


def start_watchers(state: Any) -> None:
    threading.Thread(target=watch_kernel, args=(state,), daemon=True, name="kernel-activity").start()
    threading.Thread(target=sample_gpus, args=(state.activity,), daemon=True, name="gpu-utilization").start()


__all__ = ["Activity", "GPU_SAMPLE_ENV", "parse_utilization", "sample_gpus", "start_watchers", "watch_kernel"]
