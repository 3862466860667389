#!/usr/bin/env python3
"""Benchmark: a bare machine on the RunPod twin, from Continue to an executed cell.

Each run rents a fresh machine from the twin (a real loopback sshd with a bare Python, after
the twin's boot delay), Continues onto it (the worker is installed by the bootstrap), starts
a kernel there and runs one cell. Two kinds of run, measured in the same sitting:

- **cold**: a fresh store: the worker's wheels are resolved by uv and fetched from the package
  index (pip's own configuration, without pip's or uv's cache: a first time), stored, and sent
  to the machine;
- **warm**: the store already holds the wheel set: every wheel comes from the store.

Prints the median of ``--runs`` (3) of each, and the ratios against the targets: warm at most
10 s beyond the twin's boot delay, and warm at most 0.3x cold. Needs root (the twin's sshd).

    .venv/bin/python bench/bootstrap.py             # ~2-4 minutes
    .venv/bin/python bench/bootstrap.py --offline   # the wheels from .wheelhouse, not the index
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the twins are test infrastructure

BOOT_DELAY_S = 2.0
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
        "driver": "550.90.07", "cuda": "12.4", "stock": 100, "region": "US-TX-3"}


def one_run(tmp: Path, store: Path, twin: object, name: str) -> float:
    """Seconds from Continue to the first cell's answer on a fresh machine."""
    from jupyter_client import BlockingKernelClient
    from jupyter_e2e import make_workspace

    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp / name, store)
    orch = Orchestrator(ws)
    started = time.monotonic()
    try:
        orch.continue_()
        client = orch.client()
        info = client.start_kernel(f"k-{name}")
        kc = BlockingKernelClient()
        kc.load_connection_info({**info, **{p: client.forward(int(info[p])) for p in
                                            ("shell_port", "iopub_port", "stdin_port", "hb_port", "control_port")},
                                 "ip": "127.0.0.1"})
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive("x = 1 + 1", timeout=120)
        took = time.monotonic() - started
        kc.stop_channels()
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the cell failed: {reply['content']}")
        return took
    finally:
        try:
            orch.stop("benchmark run over")
        finally:
            orch.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--offline", action="store_true", help="cold runs fetch from .wheelhouse, not the index")
    args = parser.parse_args()
    from twins.machines import unavailable
    from twins.runpod import RunPodTwin

    if unavailable():
        print(f"cannot run: {unavailable()}")
        return 2
    cold: list[float] = []
    warm: list[float] = []
    with tempfile.TemporaryDirectory(prefix="jp-bench-boot-") as tmp_name:
        tmp = Path(tmp_name)
        with RunPodTwin(tmp / "twin", offers=[H100], boot_delay_s=BOOT_DELAY_S) as twin:
            os.environ.update(twin.env())
            os.environ.update({"JUPYTER_PORTABLE_PROVIDERS": "runpod", "JUPYTER_PORTABLE_SSH_STATE": str(tmp / "ssh"),
                               "JUPYTER_PORTABLE_MARKET_DIR": str(tmp / "market"),
                               "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0", "JUPYTER_PORTABLE_ENVIRONMENT": "image"})
            if args.offline:
                os.environ.update({"JUPYTER_PORTABLE_WHEEL_FIND_LINKS": str(REPO / ".wheelhouse"),
                                   "JUPYTER_PORTABLE_NO_INDEX": "1"})
            for i in range(args.runs):
                store = tmp / f"store-{i}"  # a fresh store: the wheels are fetched once (cold)
                # as on a user's first time: no pip or uv cache of earlier runs helps the cold fetch
                os.environ.update(PIP_NO_CACHE_DIR="1", UV_NO_CACHE="1")
                try:
                    cold.append(one_run(tmp, store, twin, f"cold-{i}"))
                finally:
                    os.environ.pop("PIP_NO_CACHE_DIR", None)
                    os.environ.pop("UV_NO_CACHE", None)
                warm.append(one_run(tmp, store, twin, f"warm-{i}"))  # the same store: every wheel from it
                print(f"run {i + 1}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s", flush=True)
    c, w = statistics.median(cold), statistics.median(warm)
    beyond = w - BOOT_DELAY_S
    print()
    print(f"{'':28}{'median':>10}   runs")
    print(f"{'cold (wheels from the index)':28}{c:>9.1f}s   {', '.join(f'{x:.1f}' for x in cold)}")
    print(f"{'warm (wheels from the store)':28}{w:>9.1f}s   {', '.join(f'{x:.1f}' for x in warm)}")
    print()
    print(f"twin boot delay {BOOT_DELAY_S:g} s")
    print(f"warm beyond the boot delay: {beyond:.1f} s (target <= 10 s): {'met' if beyond <= 10 else 'MISSED'}")
    print(f"warm / cold: {w / c:.2f}x (target <= 0.30x): {'met' if w / c <= 0.3 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
