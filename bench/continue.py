#!/usr/bin/env python3
"""Benchmark Continue: from `Orchestrator.continue_()` to a cell executed on the new worker's kernel.

The local market (worker processes on this computer) serves a workspace of 200 small files, a
large data file (default 2 GiB) and a registered torch checkpoint (default 200 MiB), all random
bytes so nothing dedups. A first Continue starts worker A; each timed run then has the market take
the current worker back (`lose_allocation`), and times

    Continue -> READY -> ACTIVE -> kernel started through the agent -> kernel answers
             -> a cell that reads the checkpoint's first bytes replies

in two modes: **eager** (lazy threshold above every file: all bytes land before READY) and
**lazy** (the agent's default 64 MiB threshold: the data file arrives in the background after
READY; checkpoints are always fetched before READY). For lazy runs it also records whether READY
came while the data file was still pending, and when it finished arriving.

Baselines, measured in the same run from the same store and page cache (interleaved with the
Continues): `restore()` of the same version with the same lazy threshold and the checkpoint eager
and no background fetcher, i.e. copying exactly the bytes a lazy worker needs before READY (the
target: lazy Continue-to-cell <= 2x it); a full eager `restore()` (info, for eager Continue); and a
plain Python copy of the small files and the checkpoint from the source folder (a floor, info).

It also times the worker environment's cold and warm build (`bench/envtiming.time_cold_and_warm`) of a
lockfile of two tiny hand-made wheels from a find-links folder, offline.

    .venv/bin/python bench/continue.py --quick      # 200 MiB data, 20 MiB checkpoint: ~1 min
    .venv/bin/python bench/continue.py              # 2 GiB data, 200 MiB checkpoint, 3 reps: ~2 min

See bench/README.md ("Continue benchmark") for the method and the numbers measured.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

MiB = 2**20
STATES = ("ACQUIRING", "PROBING", "MATERIALIZING", "VERIFYING", "READY")
EAGER_THRESHOLD = 2**62  # above any file: everything is materialized before READY
CKPT = "ckpt/model.pt"
DATA = "data/train.bin"
CELL = ("import os\n"
        "print(os.environ.get('JUPYTER_PORTABLE_ALLOCATION'))\n"
        f"print(open({CKPT!r}, 'rb').read(64).hex())\n")
CATALOG = """
version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "bench"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "local-a"
capacity = 4
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
"""
BASE_LAZY = "restore: small files + checkpoint (lazy)"
BASE_FULL = "restore: everything (eager)"
BASE_COPY = "plain copy: small files + checkpoint"
LOCK_FILE = Path(__file__).resolve().parent / "env-lock.txt"
LOCK = b"# two tiny wheels made by bench/continue.py\ntiny-dep==2.0\ntinypkg==1.0\n"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Layout:
    small_files: int
    data_mib: int
    ckpt_mib: int
    lazy_threshold_mib: int
    seed: int


# -- the workspace ------------------------------------------------------------------------------

def write_random(path: Path, nbytes: int, rng: random.Random, chunk: int = 64 * MiB) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = nbytes
        while left:
            n = min(chunk, left)
            fh.write(rng.randbytes(n))
            left -= n


def write_checkpoint(path: Path, nbytes: int, rng: random.Random) -> None:
    """A real checkpoint format (the write check parses it): torch.save of a uint8 tensor, else safetensors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = bytearray(rng.randbytes(nbytes))
    try:
        import torch

        torch.save({"weights": torch.frombuffer(raw, dtype=torch.uint8)}, path)
    except ImportError:
        import numpy as np
        from safetensors.numpy import save_file

        path.unlink(missing_ok=True)
        save_file({"weights": np.frombuffer(bytes(raw), dtype=np.uint8)}, str(path))


def build_workspace(root: Path, store_url: str, layout: Layout) -> Any:
    from jupyter_portable import Workspace

    rng = random.Random(layout.seed)
    (root / "train.py").parent.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('training')\n")
    for i in range(layout.small_files - 1):
        write_random(root / "src" / f"d{i % 10:02d}" / f"f{i:04d}.bin", rng.randint(1024, 16 * 1024), rng)
    write_random(root / DATA, layout.data_mib * MiB, rng)
    write_checkpoint(root / CKPT, layout.ckpt_mib * MiB, rng)
    ws = Workspace.init(root, store_url)
    ws.snapshot("the benchmark's workspace", progress=None)
    rec = ws.checkpoint(root / CKPT, step=1, quiet_s=0.2, progress=None)
    if not rec.verified:
        raise RuntimeError(f"the checkpoint was not registered: {rec.reason}")
    return ws


# -- one Continue -------------------------------------------------------------------------------

class Bench:
    def __init__(self, ws: Any, root: Path, work: Path, layout: Layout) -> None:
        from jupyter_portable.demo.market import LocalMarket

        self.ws = ws
        self.root = root  # the source folder (the user's copy)
        self.work = work
        self.market_dir = work / "market"
        self.market = LocalMarket(work / "catalog.toml", self.market_dir)
        self.layout = layout
        self.samples: dict[str, list[float]] = {}
        self.runs: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.ckpt_head = (root / CKPT).read_bytes()[:64].hex()

    def add(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def median(self, name: str) -> float | None:
        xs = self.samples.get(name)
        return statistics.median(xs) if xs else None

    def orchestrator(self, threshold: int, on_state: Callable[[dict[str, Any]], None] | None = None) -> Any:
        from jupyter_portable.orchestration.orchestrator import Orchestrator

        return Orchestrator(self.ws, providers={"local": self.market}, on_state=on_state, lazy_threshold=threshold)

    def lose_current(self) -> None:
        """The market takes the active worker back; wait until its agent is gone, then drop its folder."""
        from jupyter_portable.demo.market import lose_allocation

        orch = self.orchestrator(EAGER_THRESHOLD)
        try:
            lc = orch.lifecycle()
            if lc.state != "ACTIVE":
                return
            rec = orch.record(lc.allocation_id)
            lose_allocation(self.market_dir, lc.allocation_id)
            deadline = time.monotonic() + 30
            while orch.check()["state"] != "LOST":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the loss of {lc.allocation_id} was never noticed")
                time.sleep(0.1)
            if rec is not None:  # the agent stops itself within a second of its machine going
                wait_gone(rec.pid, 15)
            shutil.rmtree(self.market_dir / "allocations" / str(lc.allocation_id) / "work", ignore_errors=True)
        finally:
            orch.close()

    def continue_to_cell(self, mode: str, threshold: int) -> dict[str, Any]:
        """One timed Continue, kernel start and cell; every mark in seconds from the call to continue_()."""
        from jupyter_client import BlockingKernelClient

        marks: dict[str, Any] = {}

        def on_state(ev: dict[str, Any]) -> None:
            marks.setdefault(str(ev.get("state")), time.perf_counter())
            if ev.get("state") == "READY":
                marks["pending_at_ready"] = list((ev.get("detail") or {}).get("pending") or [])

        orch = self.orchestrator(threshold, on_state)
        os.sync()  # nobody pays for the write-back the previous step left dirty
        t0, wall0 = time.perf_counter(), time.time()
        try:
            orch.continue_()
            t_active = time.perf_counter()
            client = orch.client()
            conn = client.start_kernel(f"bench-{uuid.uuid4().hex[:12]}")
            t_kernel = time.perf_counter()
            kc = BlockingKernelClient()
            kc.load_connection_info(conn)
            kc.start_channels()
            out: list[str] = []

            def hook(msg: dict[str, Any]) -> None:
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                elif msg["msg_type"] == "error":
                    out.append("\n".join(msg["content"].get("traceback") or []))

            try:
                kc.wait_for_ready(timeout=120)
                t_answers = time.perf_counter()
                reply = kc.execute_interactive(CELL, timeout=120, output_hook=hook)
                t_cell = time.perf_counter()
                # the one-line resume cell (issue 16): the latest verified checkpoint into a variable
                resume = kc.execute_interactive("%workspace latest --load model", timeout=300)
                t_resume = time.perf_counter()
                if resume["content"]["status"] != "ok":
                    raise RuntimeError(f"{mode}: the resume cell failed: {resume['content']}")
            finally:
                kc.stop_channels()
            st = client.status()
            pending_after_cell = list(st.get("pending") or [])
            deadline = time.monotonic() + 1800
            while st.get("pending"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"still pending after 30 min: {st['pending']}")
                time.sleep(0.05)
                st = client.status()
            # the data file's ctime is when it was renamed into place: its arrival, without polling
            # the agent while the kernel starts (which would take CPU from it)
            rec = orch.record()
            assert rec is not None
            data_arrived = (Path(rec.workdir) / DATA).stat().st_ctime - wall0
            aid = rec.allocation_id
        finally:
            orch.close()
        lines = "".join(out).split()
        if reply["content"]["status"] != "ok" or lines != [aid, self.ckpt_head]:
            raise RuntimeError(f"{mode}: the cell did not read the checkpoint on {aid}: {reply['content']} {out}")
        pending_at_ready = marks.get("pending_at_ready", [])
        sample = {
            "mode": mode, "allocation_id": aid,
            **{f"{st.lower()}_s": marks[st] - t0 for st in STATES if st in marks},
            "active_s": t_active - t0, "kernel_started_s": t_kernel - t0,
            "kernel_answers_s": t_answers - t0, "cell_s": t_cell - t0, "resume_s": t_resume - t_cell,
            "data_arrived_s": data_arrived,
            "pending_at_ready": pending_at_ready, "pending_after_cell": pending_after_cell,
            "ready_before_data": bool(pending_at_ready) and marks["READY"] - t0 < data_arrived,
            "agent_timings": st.get("timings") or {},
        }
        for key, value in sample.items():
            if key.endswith("_s"):
                self.add(f"{mode}:{key}", value)
        for key, value in sample["agent_timings"].items():
            self.add(f"{mode}:agent {key}", float(value))
        self.runs.append(sample)
        return sample

    # -- baselines --

    def baseline_restore(self, name: str, *, lazy: bool, threshold: int) -> None:
        from jupyter_portable.engine.progress import Progress
        from jupyter_portable.engine.restore import restore

        store, wsid = self.ws.store, self.ws.workspace_id
        version = store.read_head(wsid)[0].version
        dest = self.work / f"baseline-{uuid.uuid4().hex[:8]}"
        os.sync()
        t0 = time.perf_counter()
        res = restore(store, wsid, dest, version=version, lazy=lazy, lazy_threshold=threshold, eager=[CKPT],
                      start_fetcher=False, progress=Progress("restore", stream=None))
        self.add(name, time.perf_counter() - t0)
        want = [DATA] if lazy and self.layout.data_mib * MiB >= threshold else []
        if res.pending != want:
            self.problems.append(f"{name}: expected {want} pending, got {res.pending}")
        shutil.rmtree(dest, ignore_errors=True)

    def baseline_copy(self) -> None:
        """A plain copy of what a cell needs (small files and the checkpoint) from the source folder."""
        dest = self.work / f"copy-{uuid.uuid4().hex[:8]}"
        skip = shutil.ignore_patterns(".portable", Path(DATA).parts[0])
        os.sync()
        t0 = time.perf_counter()
        shutil.copytree(self.root, dest, ignore=skip)
        self.add(BASE_COPY, time.perf_counter() - t0)
        shutil.rmtree(dest, ignore_errors=True)

    def stop(self) -> None:
        orch = self.orchestrator(EAGER_THRESHOLD)
        try:
            lc = orch.lifecycle()
            if lc.state == "ACTIVE":
                rec = orch.record(lc.allocation_id)
                orch.stop("the benchmark is done")
                if rec is not None:  # the agent outlives its machine by up to a second; let it go first
                    wait_gone(rec.pid, 15)
        finally:
            orch.close()
            for a in self.market.list_allocations():  # whatever an aborted run left: this market's only
                if a["state"] not in ("lost", "terminated"):
                    self.market.terminate(self.market.allocation(a["allocation_id"]))


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        except OSError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        else:
            if stat.rpartition(")")[2].split()[:1] == ["Z"]:
                return True
        time.sleep(0.05)
    return False


# -- the environment's cold and warm build ------------------------------------------------------

def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal PEP 427 wheel holding one module ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def sha(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},{sha(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(p, d)
        zf.writestr(f"{info}/RECORD", record)
    return path


def env_builds(work: Path, reps: int) -> dict[str, list[float]]:
    from envtiming import time_cold_and_warm

    from jupyter_portable.store.repo import Store

    links = work / "find-links"
    make_wheel(links, "tinypkg", "1.0")
    make_wheel(links, "tiny-dep", "2.0")
    empty_index = work / "empty-index"
    empty_index.mkdir(exist_ok=True)
    # pip as on a bare machine, offline: no configuration, no retries, an index with nothing in it
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        del os.environ[key]
    os.environ.update(PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0", PIP_TIMEOUT="3")
    out: dict[str, list[float]] = {"cold_s": [], "warm_s": [], "speedup": [], "venv_s": []}
    for i in range(reps):
        # the floor both builds share: a bare `python -m venv` (with pip, as build_env makes it)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(work / f"venv-floor-{i}")], check=True,
                       capture_output=True)
        out["venv_s"].append(time.perf_counter() - t0)
        shutil.rmtree(work / f"venv-floor-{i}", ignore_errors=True)
        store = Store.open(f"file://{work}/env-store-{i}")
        r = time_cold_and_warm(store, LOCK, work / f"env-{i}", [str(links)], index_url=empty_index.as_uri())
        for key in ("cold_s", "warm_s", "speedup"):
            out[key].append(float(r[key]))
        shutil.rmtree(work / f"env-{i}", ignore_errors=True)
    return out


def env_builds_lockfile(work: Path, reps: int, lock: Path) -> dict[str, list[float]]:
    """Cold (wheels from the package index, pip's own configuration) and warm (from the store, uv)
    builds of a real lockfile (bench/env-lock.txt: numpy, pandas, scipy, matplotlib, ipykernel and
    safetensors, resolved by uv)."""
    from envtiming import time_cold_and_warm

    from jupyter_portable.store.repo import Store
    from jupyter_portable.worker.envcache import build_env

    out: dict[str, list[float]] = {"cold_s": [], "warm_s": [], "speedup": [], "again_s": []}
    for i in range(reps):
        store = Store.open(f"file://{work}/lock-store-{i}")
        r = time_cold_and_warm(store, lock.read_bytes(), work / f"lock-env-{i}", None)
        for key in ("cold_s", "warm_s", "speedup"):
            out[key].append(float(r[key]))
        # the same lockfile again on this machine: uv's cache of the store's wheels is filled
        out["again_s"].append(build_env(store, lock.read_bytes(), work / f"lock-env-{i}" / "venv-again").seconds)
        shutil.rmtree(work / f"lock-env-{i}", ignore_errors=True)
    return out


# -- the report ---------------------------------------------------------------------------------

def fmt(x: float | str | None, spec: str = ".3f") -> str:
    return "-" if x is None else x if isinstance(x, str) else format(x, spec)


def print_table(head: tuple[str, ...], lines: list[tuple[str, ...]]) -> None:
    rows = [head, *lines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _report_lock_env(lock_env: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in lock_env.items()}
    packages = sum(1 for line in LOCK_FILE.read_text().splitlines() if "==" in line)
    print(f"\nworker environment from bench/env-lock.txt ({packages} packages), medians of "
          f"{len(lock_env['cold_s'])}:\n")
    print_table(("build", "median s", "/ cold", "<= 1.5 s", "<= 0.25x cold"),
                [(label, fmt(med[key]), fmt(med[key] / med["cold_s"], ".2f"),
                  "met" if med[key] <= 1.5 else "MISSED", "met" if med[key] <= 0.25 * med["cold_s"] else "MISSED")
                 for label, key in (("cold (package index)", "cold_s"),
                                    ("warm, a new machine (store only)", "warm_s"),
                                    ("warm, this machine again (uv cache)", "again_s"))])


def report(b: Bench | None, env: dict[str, list[float]] | None, reps: int,
           lock_env: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    if lock_env is not None:
        _report_lock_env(lock_env)
    if b is None:
        return []
    m = b.median
    base_lazy, base_full, base_copy = BASE_LAZY, BASE_FULL, BASE_COPY
    spec = [
        ("Continue -> cell (lazy)", "lazy:cell_s", base_lazy, "<= 2x", lambda o, x: o <= 2 * x),
        ("Continue -> cell (lazy)", "lazy:cell_s", base_copy, "floor", None),
        ("Continue -> cell (eager)", "eager:cell_s", base_full, "info", None),
        ("Continue -> cell (eager)", "eager:cell_s", base_lazy, "info", None),
    ]
    table: list[dict[str, Any]] = []
    for op, ours, base, target, pred in spec:
        o, x = m(ours), m(base)
        verdict = "n/a" if o is None or x is None else "-" if pred is None else "met" if pred(o, x) else "MISSED"
        table.append({"operation": op, "ours_s": o, "baseline": base, "baseline_s": x,
                      "ratio": o / x if o is not None and x else None, "target": target, "verdict": verdict})
    lazy_runs = [r for r in b.runs if r["mode"] == "lazy"]
    before = sum(r["ready_before_data"] for r in lazy_runs)
    lazy_applies = b.layout.data_mib >= b.layout.lazy_threshold_mib
    verdict = "n/a" if not lazy_runs or not lazy_applies else "met" if before == len(lazy_runs) else "MISSED"
    table.append({"operation": "READY before the data file arrived (lazy)", "ours_s": None,
                  "baseline": f"{before} of {len(lazy_runs)} runs", "baseline_s": None, "ratio": None,
                  "target": "every run", "verdict": verdict})
    print(f"\n{b.layout}, medians of {reps}\n")
    print_table(("operation", "ours s", "baseline", "base s", "ours/base", "target", ""),
                [(d["operation"], fmt(d["ours_s"]), d["baseline"], fmt(d["baseline_s"]), fmt(d["ratio"], ".2f"),
                  d["target"], d["verdict"]) for d in table])

    print("\nwhere the time goes (median seconds from the call to continue_()):\n")
    marks = [("ACQUIRING (routes ranked)", "acquiring_s"), ("PROBING (machine launched)", "probing_s"),
             ("MATERIALIZING (admitted, version recorded)", "materializing_s"),
             ("VERIFYING (as polled, every 0.1 s)", "verifying_s"), ("READY", "ready_s"),
             ("ACTIVE (continue_ returned)", "active_s"),
             ("kernel started (agent POST /kernel)", "kernel_started_s"),
             ("kernel answers (kernel_info)", "kernel_answers_s"), ("cell replied", "cell_s"),
             ("resume cell: %workspace latest --load (its own s)", "resume_s"),
             ("data file in place (its ctime)", "data_arrived_s"),
             ("agent: materialize", "agent materialize_s"), ("agent: verify", "agent verify_s"),
             ("agent: environment known (its own s)", "agent environment_s"),
             ("agent: kernel started, from its work's start (own s)", "agent kernel_start_s")]
    print_table(("mark", "eager", "lazy"), [(label, fmt(m(f"eager:{k}")), fmt(m(f"lazy:{k}"))) for label, k in marks])

    if env is not None:
        print(f"\nworker environment from a lockfile of 2 tiny wheels (envtiming.time_cold_and_warm), "
              f"medians of {len(env['cold_s'])}:\n")
        med = {k: statistics.median(v) for k, v in env.items()}
        print_table(("cold s", "warm s", "cold/warm", "floor: python -m venv s"),
                    [(fmt(med["cold_s"]), fmt(med["warm_s"]), fmt(med["speedup"], ".2f"), fmt(med["venv_s"]))])

    print("\nall samples (median, then each run; seconds):")
    for name, xs in {**b.samples, **{f"env {k}": v for k, v in (env or {}).items()}}.items():
        print(f"  {name:42s} {statistics.median(xs):9.3f}   [{', '.join(f'{x:.3f}' for x in xs)}]")
    print("\nper run: pending at READY -> after the cell")
    for r in b.runs:
        print(f"  {r['mode']:5s} {r['allocation_id']}  {r['pending_at_ready']} -> {r['pending_after_cell']}")
    return table


# -- main ---------------------------------------------------------------------------------------

def measure(b: Bench, reps: int, lazy_threshold: int) -> None:
    """``reps`` rounds of both Continues and the three baselines, each round in a rotated order."""
    def timed_continue(mode: str, threshold: int, rep: int) -> None:
        b.lose_current()
        s = b.continue_to_cell(mode, threshold)
        log(f"   {mode} {rep + 1}/{reps}: READY {s['ready_s']:.2f} s, cell {s['cell_s']:.2f} s, "
            f"data in place {s['data_arrived_s']:.2f} s, pending at READY {s['pending_at_ready']}")

    steps: list[Callable[[int], None]] = [
        lambda rep: timed_continue("eager", EAGER_THRESHOLD, rep),
        lambda rep: timed_continue("lazy", lazy_threshold, rep),
        lambda rep: b.baseline_restore(BASE_LAZY, lazy=True, threshold=lazy_threshold),
        lambda rep: b.baseline_restore(BASE_FULL, lazy=False, threshold=lazy_threshold),
        lambda rep: b.baseline_copy(),
    ]
    for rep in range(reps):
        shift = rep % len(steps)  # each step follows a different one in each round (the disk remembers)
        for step in steps[shift:] + steps[:shift]:
            step(rep)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200 MiB data file and 20 MiB checkpoint")
    ap.add_argument("--data-mb", type=int, help="the large data file in MiB (default 2048; 200 with --quick)")
    ap.add_argument("--ckpt-mb", type=int, help="the checkpoint in MiB (default 200; 20 with --quick)")
    ap.add_argument("--small-files", type=int, default=200, help="small files (1-16 KiB) in the workspace")
    ap.add_argument("--lazy-threshold-mb", type=int, default=64,
                    help="the lazy runs' threshold in MiB (default 64, the agent's own default)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each measurement")
    ap.add_argument("--env-reps", type=int, help="repetitions of the environment builds (default: --reps)")
    ap.add_argument("--no-env", action="store_true", help="skip the environment's cold and warm build")
    ap.add_argument("--no-env-lock", action="store_true",
                    help="skip the cold (package index) and warm builds of bench/env-lock.txt")
    ap.add_argument("--env-only", action="store_true", help="only the environment builds, no Continue")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path, help="where the workspace, store and market go (default: a temp dir)")
    ap.add_argument("--json-out", type=Path, help="write every sample, run and the table here")
    return ap.parse_args(argv)


class _EnvOnly(Exception):
    """--env-only: stop after the environment builds."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    layout = Layout(small_files=args.small_files,
                    data_mib=args.data_mb if args.data_mb is not None else (200 if args.quick else 2048),
                    ckpt_mib=args.ckpt_mb if args.ckpt_mb is not None else (20 if args.quick else 200),
                    lazy_threshold_mib=args.lazy_threshold_mb, seed=args.seed)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="portable-continue-", dir=args.work))
    (work / "catalog.toml").write_text(CATALOG)
    os.environ.update(JUPYTER_PORTABLE_CATALOG=str(work / "catalog.toml"),
                      JUPYTER_PORTABLE_MARKET_DIR=str(work / "market"),
                      JUPYTER_PORTABLE_SSH_STATE=str(work / "ssh-state"),
                      JUPYTER_PORTABLE_PROVIDERS="local", JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES="0")
    lazy_threshold = layout.lazy_threshold_mib * MiB
    started = time.perf_counter()
    b: Bench | None = None
    env: dict[str, list[float]] | None = None
    lock_env: dict[str, list[float]] | None = None
    problems: list[str] = []
    try:
        if not args.no_env_lock:  # first: env_builds below takes pip's configuration away
            log("== environment: cold and warm build of bench/env-lock.txt")
            lock_env = env_builds_lockfile(work, args.env_reps or args.reps, LOCK_FILE)
        if args.env_only:
            raise _EnvOnly
        log(f"== building the workspace: {layout}")
        ws = build_workspace(work / "ws", f"file://{work}/store", layout)
        b = Bench(ws, work / "ws", work, layout)
        log("== first Continue (worker A), untimed")
        b.continue_to_cell("warm-up", EAGER_THRESHOLD)
        b.runs.clear()
        b.samples.clear()
        measure(b, args.reps, lazy_threshold)
        b.stop()
        if not args.no_env:
            log("== environment: cold and warm build")
            env = env_builds(work, args.env_reps or args.reps)
    except _EnvOnly:
        pass
    except Exception as exc:  # keep what was measured so far
        problems.append(f"aborted: {exc!r}")
        log(traceback.format_exc())
        if b is not None:
            with contextlib.suppress(Exception):
                b.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    table: list[dict[str, Any]] = []
    if b is not None or lock_env is not None:
        table = report(b, env, args.reps, lock_env)
        problems = (b.problems if b else []) + problems
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.json_out:
        result = {"layout": asdict(layout), "reps": args.reps, "samples": b.samples if b else {},
                  "runs": b.runs if b else [], "env": env, "table": table, "problems": problems}
        args.json_out.write_text(json.dumps(result, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
