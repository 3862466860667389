#!/usr/bin/env python3
"""Benchmark: false losses in N injected network blips (issue 42; goal 0).

A real sshd on loopback is the machine (an ``ssh`` host with a fake ``nvidia-smi``:
``tests/partition.py``, as in ``tests/test_unreachable.py``); the workspace Continues onto it once,
and then each blip partitions the machine for real (``tests/partition.py``: its sshd and every
connection it holds frozen, as when packets are dropped) while the user's side does what the
server does: loss checks (``Orchestrator.check``), here at the start, the middle and the end of
a silence of a random length under the grace (``c.Portable.unreachable_grace``, 300 s: the time
the checks are given is injected, the partition itself lasts as long as the checks take). After
each blip the network comes back and one more check must find the machine again.

Counted: checks that decided LOST (false losses: the goal is 0), blips after which the machine
did not answer again, and whether the worker process survived every blip. The SSH keepalive is
scaled down (1 s x 2) so the port forwards die inside every blip and must come back, as a real
blip longer than 30 s kills them.

A control ends the run: a silence past the grace, while the provider cannot say the machine runs,
must be LOST (the rule's one loss by silence): it shows the counter counts.

    .venv/bin/python bench/blips.py              # 10 blips, ~3 minutes
    .venv/bin/python bench/blips.py --blips 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the sshd and the fake GPU are test infrastructure

GRACE_S = 300.0  # c.Portable.unreachable_grace's default
T0 = datetime(2026, 12, 6, 14, 0, tzinfo=timezone.utc)


def run(blips: int, seed: int) -> dict[str, Any]:
    from jupyter_e2e import make_workspace
    from partition import alive, gpu_sshd, partition, ssh_env
    from sshd import unavailable

    from jupyter_portable.compute.ssh import SshProvider
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    reason = unavailable()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    rng = random.Random(seed)
    # the control's worker, lost while partitioned, may write its last heartbeat as the folder goes
    with tempfile.TemporaryDirectory(prefix="blips-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        with gpu_sshd(root) as sshd:
            os.environ.update(ssh_env(sshd, root, environment="image"))
            os.environ.pop("JUPYTER_PORTABLE_UNREACHABLE_GRACE", None)
            ws = make_workspace(root / "ws", root / "store")
            provider = SshProvider(connect_timeout=2, keepalive=(1, 2))
            orch = Orchestrator(ws, providers={"ssh": provider})
            try:
                assert orch.continue_()["state"] == L.ACTIVE
                rec = orch.record()
                assert rec is not None
                pid = int(rec.allocation.details["pid"])
                false_losses = not_back = checks = 0
                silences: list[float] = []
                at = T0
                started = time.monotonic()
                for _ in range(blips):
                    silence = round(rng.uniform(10, GRACE_S - 10), 1)
                    silences.append(silence)
                    with partition(sshd):
                        for offset in (0.0, silence / 2, silence):
                            looked = orch.check(now=at + timedelta(seconds=offset))
                            checks += 1
                            false_losses += looked["state"] == L.LOST
                    at += timedelta(seconds=silence + 5)
                    back = orch.check(now=at)
                    checks += 1
                    false_losses += back["state"] == L.LOST
                    not_back += back["alive"] is not True
                    at += timedelta(seconds=60)
                blips_s = time.monotonic() - started
                worker_survived = alive(pid)
                # the control: a silence past the grace, the provider unable to say it runs, is LOST
                with partition(sshd):
                    orch.check(now=at)
                    control = orch.check(now=at + timedelta(seconds=GRACE_S + 1))["state"]
                return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "blips": blips,
                        "seed": seed, "checks": checks, "false_losses": false_losses, "not_back_after": not_back,
                        "worker_survived_every_blip": worker_survived, "silences_s": silences,
                        "wall_s_of_the_blips": round(blips_s, 1), "control_past_grace": control}
            finally:
                orch.close()
                from jupyter_e2e import release_all

                release_all(("ssh",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blips", type=int, default=10, help="how many blips to inject (default 10)")
    parser.add_argument("--seed", type=int, default=42, help="the silences' random seed")
    args = parser.parse_args()
    if args.blips < 1:
        parser.error("--blips must be at least 1")
    print(json.dumps(run(args.blips, args.seed), indent=1))


if __name__ == "__main__":
    main()
