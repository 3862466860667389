"""What the worker sees of its machine's use, for idle autostop (``core/idle``): when the kernel
last ran a cell (from the kernel's own iopub status messages, so nothing in the kernel has to
cooperate), whether one is running, the last "Keep running", and the GPUs' utilization as
``nvidia-smi`` reports it. ``/status`` carries it as ``activity``; the monitor decides."""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jupyter_portable.core.envconfig import PortableWorker
from jupyter_portable.core.idle import gpu_busy
from jupyter_portable.core.times import from_timestamp_iso
from jupyter_portable.worker.iopub_log import IOPubLog

log = logging.getLogger("jupyter_portable.worker")

GPU_SAMPLE_ENV = "JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS"  # c.PortableWorker.gpu_sample_seconds
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
        # the iopub port the kernel watcher is subscribed to (a message came through it), for
        # ``wait_watched``; None while it follows no kernel, or has not heard from it yet
        self.watched = threading.Condition()
        self.watched_port: int | None = None
        self.watcher_running = False

    def watching(self, port: int | None) -> None:
        with self.watched:
            self.watched_port = port
            self.watched.notify_all()

    def wait_watched(self, port: int, alive: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until the watcher hears the kernel on iopub ``port``, so that no cell sent after
        this returns goes unseen; False (and no wait) when no watcher runs, or when the kernel ends
        or ``timeout_s`` passes first."""
        if not self.watcher_running:
            return False
        deadline = time.monotonic() + timeout_s
        with self.watched:
            # asked again every 0.1 s: a kernel's end is no notice on the condition
            while self.watched_port != port and alive() and time.monotonic() < deadline:
                self.watched.wait(0.1)
            return self.watched_port == port

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
        interval_s = PortableWorker.current().gpu_sample_seconds
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
    records each cell's busy and idle.

    A SUB socket hears only what is published after its subscription reaches the kernel, so a
    kernel counts as watched (``Activity.watching``) only once a message has come through: the
    kernel's ``iopub_welcome`` (ipykernel 7), else the status of a ``kernel_info_request`` sent
    on its shell channel once connected. ``POST /kernel`` waits for that (``Activity.wait_watched``):
    the notebook's first cell after a start or a restart is never missed."""
    import zmq
    from jupyter_client.session import Session

    ctx: Any = zmq.Context.instance()
    sock: Any = None
    followed: tuple[Any, Any] = (None, None)  # the kernel process and connection that sock hears
    session: Any = None
    activity: Activity = state.activity
    activity.watcher_running = True
    while True:
        k, info = state.kernel, state.kernel_info
        alive = k is not None and k.poll() is None and bool(info)
        if not alive or followed[0] is not k or followed[1] is not info:
            if sock is not None:
                sock.close(linger=0)
                sock, followed = None, (None, None)
                activity.watching(None)
                activity.kernel_gone()
            if not alive:
                time.sleep(0.1)
                continue
            assert info is not None
            session = Session(key=str(info["key"]).encode(), signature_scheme=info.get("signature_scheme")
                              or "hmac-sha256")
            state.iopub_log.follow(f"{info['iopub_port']}:{k.pid}")  # what the user side may ask again
            sock = _subscribe(ctx, state, k, info, session)
            if sock is None:
                time.sleep(0.05)  # the kernel ended or changed before it was heard
                continue
            followed = (k, info)
            activity.watching(int(info["iopub_port"]))
        try:
            if not sock.poll(100):
                continue
            _read(sock, session, activity, state.iopub_log)
        except (zmq.ZMQError, ValueError, KeyError, TypeError) as exc:
            log.debug("iopub message not read: %s", exc)


def _read(sock: Any, session: Any, activity: Activity, log: IOPubLog) -> None:
    frames = sock.recv_multipart()
    _idents, parts = session.feed_identities(frames, copy=True)
    msg = session.deserialize(parts, content=True)
    log.add(str(msg["header"].get("msg_id") or ""), frames)
    activity.saw_message(msg)


def _subscribe(ctx: Any, state: Any, kernel: Any, info: dict[str, Any], session: Any) -> Any:
    """A SUB socket on the kernel's iopub that has heard a message from it; None if the kernel
    ends or is replaced first."""
    import zmq

    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RECONNECT_IVL, 20)  # a kernel still starting binds soon: connect then, not 100 ms on
    sock.connect(f"tcp://127.0.0.1:{int(info['iopub_port'])}")
    shell = ctx.socket(zmq.DEALER)
    shell.setsockopt(zmq.LINGER, 0)
    shell.setsockopt(zmq.IMMEDIATE, 1)  # a request goes only to a kernel that is listening, never queued
    shell.setsockopt(zmq.RECONNECT_IVL, 20)
    shell.connect(f"tcp://127.0.0.1:{int(info['shell_port'])}")
    try:
        while state.kernel is kernel and state.kernel_info is info and kernel.poll() is None:
            if sock.poll(250):
                try:
                    _read(sock, session, state.activity, state.iopub_log)
                except (ValueError, KeyError, TypeError) as exc:  # a message came, even one that did not read
                    log.debug("iopub message not read: %s", exc)
                return sock
            if shell.poll(0, zmq.POLLOUT):
                with contextlib.suppress(zmq.Again):
                    session.send(shell, "kernel_info_request", {})
            while shell.poll(0):
                shell.recv_multipart()  # the replies themselves are not needed
    except zmq.ZMQError as exc:
        log.info("kernel on iopub %s not heard: %s", info.get("iopub_port"), exc)
    finally:
        shell.close(linger=0)
    sock.close(linger=0)
    return None


def start_watchers(state: Any) -> None:
    threading.Thread(target=watch_kernel, args=(state,), daemon=True, name="kernel-activity").start()
    # c.PortableWorker.gpu_sample_seconds, read (and a bad value refused, naming it) before the thread starts
    interval = PortableWorker.current().gpu_sample_seconds
    threading.Thread(target=sample_gpus, args=(state.activity, interval), daemon=True,
                     name="gpu-utilization").start()


__all__ = ["Activity", "GPU_SAMPLE_ENV", "parse_utilization", "sample_gpus", "start_watchers", "watch_kernel"]
