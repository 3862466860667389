#!/usr/bin/env python3
"""Benchmark: idle machine-minutes billed while the user side is away (issue 42 item 2).

Each run: Continue onto a twin's machine (RunPod, then Vast.ai; each machine a real sshd on
loopback, its worker this package's Python), the machine's kernel writes the workspace's files
(``--mb`` of them, so the final version has something to publish), and then the user side goes
silent, as a laptop that sleeps: nothing asks the worker anything more. The machine's guardian
waits out the absent grace and the idle window, seals (the final version published and read
back), records why, and stops itself with its own key.

Measured on the provider's own books (the twin's wall clock): from the last use (the cell's end,
the worker's own ``idle_since``) to the moment the provider stopped billing the GPU (the pod's or
instance's stop). The goal is the idle window plus the final version's time (the seal: from the
guardian's decision to its record), so the figure's excess over the goal is what the guardian
itself adds (its tick, the record, the provider's call). Baseline, in the same run: what the same
machine bills with no guardian, which is until someone comes back: every second of the absence.

    .venv/bin/python bench/guardian.py                  # 2 runs per provider, ~2 minutes
    .venv/bin/python bench/guardian.py --idle-s 30 --mb 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the twins and the workspace helper are test infrastructure

H100 = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
        "driver": "550.90.07", "cuda": "12.4", "stock": 1, "region": "US-TX-3"}


def _twin(provider: str, root: Path) -> Any:
    if provider == "runpod":
        from twins.runpod import RunPodTwin

        return RunPodTwin(root, offers=[H100], boot_delay_s=0.3)
    from twins.vastai import VastTwin

    return VastTwin(root, offers=[H100], boot_delay_s=0.3)


def _parse(text: str) -> datetime:
    from jupyter_portable.core.times import parse_iso

    return parse_iso(text, "time")


def one_run(provider: str, folder: Path, *, idle_s: float, grace_s: float, mb: int) -> dict[str, float]:
    from jupyter_client import BlockingKernelClient
    from jupyter_e2e import make_workspace

    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.settings import update_settings
    from jupyter_portable.store.repo import Store

    with _twin(provider, folder / "twin") as twin:
        env = {**twin.env(), "JUPYTER_PORTABLE_PROVIDERS": provider, "JUPYTER_PORTABLE_SSH_STATE": str(folder / "ssh"),
               "JUPYTER_PORTABLE_MARKET_DIR": str(folder / "market"), "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
               "JUPYTER_PORTABLE_ABSENT_GRACE": str(grace_s), "JUPYTER_PORTABLE_ENVIRONMENT": "image",
               "JUPYTER_PORTABLE_GUARDIAN_IDLE_MINUTES": str(idle_s / 60),
               "JUPYTER_PORTABLE_REMOTE_PYTHON": sys.executable}
        os.environ.update(env)
        ws = make_workspace(folder / "ws", folder / "store")
        update_settings(ws, idle_minutes=60)
        orch = Orchestrator(ws)
        try:
            aid = orch.continue_()["allocation_id"]
            [ref] = twin.running()
            client = orch.client(aid)
            info = client.start_kernel("k-bench")
            kc = BlockingKernelClient()
            kc.load_connection_info({**info, **client.forward_kernel(info), "ip": "127.0.0.1"})
            kc.hb_channel.time_to_dead = 30.0
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            # the run's output: files the final version publishes
            code = (f"import os\nos.makedirs('out', exist_ok=True)\nfor i in range({mb}):\n"
                    "    open(f'out/part-{i:04d}.bin', 'wb').write(os.urandom(1 << 20))\n")
            reply = kc.execute_interactive(code, timeout=600)
            assert reply["content"]["status"] == "ok", reply["content"]
            kc.stop_channels()
            away = time.monotonic()  # from here on, nothing asks the worker anything
            deadline = away + idle_s + grace_s + 600
            rental = twin.rentals[ref]
            while rental.killed_at is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if rental.killed_at is None:
                raise RuntimeError(f"{provider}: the machine never stopped itself")
            store = Store.open(ws.config.store)
            head, _ = store.read_head(ws.workspace_id)
            record = next(a for a in reversed(store.read_manifest(ws.workspace_id, head.version).allocations)
                          if a["allocation_id"] == aid)
            released = record["released_by"]
            idle_since, at = _parse(released["idle_since"]), _parse(released["at"])
            window = max(idle_s, grace_s)  # the guardian acts once both have passed
            seal_s = max(0.0, (at - idle_since).total_seconds() - window)
            billed_s = (rental.killed_at - idle_since).total_seconds()
            absent_s = time.monotonic() - away  # what the machine would have billed so far with no guardian
        finally:
            orch.close()
    return {"billed_s": billed_s, "goal_s": window + seal_s, "seal_s": seal_s, "absent_s": absent_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0, help="the idle window (seconds)")
    parser.add_argument("--grace-s", type=float, default=3.0, help="the absent grace (seconds)")
    parser.add_argument("--mb", type=int, default=64, help="MB the run writes before the user side goes away")
    args = parser.parse_args()
    from twins.machines import unavailable

    if unavailable():
        print(f"skipped: {unavailable()}")
        return 0
    print(f"idle window {args.idle_s:g} s, absent grace {args.grace_s:g} s, {args.mb} MB written by the run, "
          f"{args.runs} run(s) per provider\n")
    print("| provider | idle time billed (median) | goal: idle window + final version | final version (seal) "
          "| over the goal | with no guardian |")
    print("|---|---|---|---|---|---|")
    for provider in ("runpod", "vastai"):
        runs = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix=f"bench-guardian-{provider}-{i}-") as tmp:
                runs.append(one_run(provider, Path(tmp), idle_s=args.idle_s, grace_s=args.grace_s, mb=args.mb))
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {provider} | {med['billed_s']:.1f} s | {med['goal_s']:.1f} s | {med['seal_s']:.1f} s "
              f"| {med['billed_s'] - med['goal_s']:+.1f} s | until the user side comes back "
              f"(>= {med['absent_s']:.0f} s here) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
