"""The scrub's cost (issue 41): one auto-snapshot's scrub (``engine/scrub``) against reading
the same bytes plainly, in the same run.

Builds a tree of small and large files, snapshots it, then times, for the default budget
(64 MiB a run) and a budget that reads every file once: ``Workspace.scrub`` (stat, read, hash,
compare with the version's tree), and a plain ``read`` of the files it read (the floor of any
re-read). Also prints what a day of runs reads at the default interval, so the daily bound
(every file re-read at least once a day) is a number of this run.

    .venv/bin/python bench/scrub.py                   # 20,000 files, 2 GB
    .venv/bin/python bench/scrub.py --files 2000 --large-mb 16
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_portable import Workspace  # noqa: E402
from jupyter_portable.engine.scrub import DAY_S, DEFAULT_BUDGET, budget_for  # noqa: E402


def build(root: Path, files: int, large: int, large_mb: int) -> int:
    total = 0
    for i in range(files):
        d = root / f"d{i // 500:04d}"
        d.mkdir(parents=True, exist_ok=True)
        data = os.urandom(4096 + i % 8192)
        (d / f"f{i:06d}").write_bytes(data)
        total += len(data)
    for i in range(large):
        data = os.urandom(large_mb * 1024 * 1024)
        (root / f"large{i}.bin").write_bytes(data)
        total += len(data)
    old = time.time() - 3600  # not fresh: the stat cache keeps every row
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".portable"]
        for n in filenames:
            os.utime(os.path.join(dirpath, n), (old, old))
    return total


def plain_read(root: Path, budget: int) -> tuple[float, int]:
    """Read files in the stat cache's order until ``budget`` bytes: the floor of a re-read."""
    t = time.perf_counter()
    got = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".portable")
        for n in sorted(filenames):
            with open(os.path.join(dirpath, n), "rb") as fh:
                while chunk := fh.read(1 << 20):
                    got += len(chunk)
            if got >= budget:
                return time.perf_counter() - t, got
    return time.perf_counter() - t, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--large", type=int, default=4)
    ap.add_argument("--large-mb", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=10.0, help="the auto-snapshot interval")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-scrub-"))
    try:
        src = work / "src"
        total = build(src, args.files, args.large, args.large_mb)
        ws = Workspace.init(src, str(work / "store"))
        ws.snapshot(progress=None)
        print(f"{args.files} small + {args.large} large files, {total / 1e6:.0f} MB")
        print("| budget | scrub s | MB/s | plain read s | x plain read |")
        print("|---|---|---|---|---|")
        for name, budget in (("default (64 MiB)", DEFAULT_BUDGET), ("every file once", total)):
            t = time.perf_counter()
            got = ws.scrub(budget)
            took = time.perf_counter() - t
            floor, _n = plain_read(src, got.bytes)
            print(f"| {name} | {took:.3f} | {got.bytes / 1e6 / max(took, 1e-9):.0f} | {floor:.3f} | "
                  f"{took / max(floor, 1e-9):.2f}x |")
        daily = budget_for(total, args.minutes * 60) * DAY_S / (args.minutes * 60)
        print(f"a day of runs every {args.minutes:g} min reads {daily / 1e6:.0f} MB "
              f"({daily / total:.1f}x the workspace): every file at least once a day")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
