"""The liveness process on every machine: the demo market's and each rented one, over SSH.

Stdlib only, so it runs on any host with Python 3 (it is streamed to ``python3 -`` over
SSH, or run locally as ``python -m jupyter_portable.compute.agent_stub``). It writes its
PID, then a heartbeat (a UNIX time) every second into ``--dir``, and exits cleanly on
SIGTERM. Loss is what happens when the heartbeat stops.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="jupyter-portable worker stub")
    parser.add_argument("--dir", required=True, help="the allocation's folder")
    parser.add_argument("--allocation", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    running = True

    def stop(_signum: int, _frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(os.path.join(args.dir, "agent.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "allocation_id": args.allocation, "python": sys.version.split()[0],
                   "started": time.time()}, fh)
    beat = os.path.join(args.dir, "heartbeat")
    while running:
        tmp = beat + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{time.time():.3f}\n")
        os.replace(tmp, beat)
        time.sleep(args.interval)
    with open(os.path.join(args.dir, "stopped"), "w") as fh:
        fh.write(f"{time.time():.3f}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
