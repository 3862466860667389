#!/usr/bin/env python3
"""Benchmark the route model's estimates: how far each Continue's predicted time to Ready was
from what happened.

One workspace on the local market (worker processes on this computer) is continued again and
again over catalog offers with different boot times and bandwidths, its data file resized
between runs (10 MB to 2 GB; with --quick 10 to 200 MB). Each run is

    Continue on the chosen offer's route -> READY -> ACTIVE -> (the data file is rewritten on the
    worker at the next size, published) -> Stop (seal, release)

and its allocation record (the store's history) holds what the route predicted and what was
measured (issue 16, item 6). The route model learns from that history as it goes: an offer's
recent measured boots replace the catalog's guess, and an offer never measured gets its
provider's recent excess over the catalog. Everything moves before Ready (eager), as the route
model assumes.

    .venv/bin/python bench/estimates.py --quick     # 8 Continues, 10-200 MB: ~1 min
    .venv/bin/python bench/estimates.py             # 20 Continues, 10 MB-2 GB: several minutes

It prints every run, then the median and worst error of the time to Ready (error = predicted /
measured - 1), over all runs and over the runs after the first (the first has only the catalog's
guesses). Target: median within +-20%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

MB = 10**6
EAGER = 2**62  # above any file: every byte lands before READY, as the route model assumes
DATA = "data/blob.bin"
# (id, boot_seconds, bandwidth_mbps): different boots and pipes on purpose
OFFERS = (("quick-boot", 0.5, 4000), ("slow-boot", 3.0, 1000), ("thin-pipe", 1.0, 400), ("mid", 2.0, 2000))
OFFER = """
[[offer]]
id = "{id}"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "local-a"
capacity = 2
boot_seconds = {boot}
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = {bw}
"""
QUICK_SIZES = (10, 50, 100, 200)
FULL_SIZES = (10, 50, 100, 200, 500, 1000, 2000)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_random(path: Path, nbytes: int, rng: random.Random) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = nbytes
        while left:
            n = min(64 * 2**20, left)
            fh.write(rng.randbytes(n))
            left -= n


def plan(runs: int, sizes: tuple[int, ...]) -> list[tuple[str, int]]:
    """(offer id, MB the workspace's data file has when it moves) per run: every offer, every size."""
    return [(OFFERS[i % len(OFFERS)][0], sizes[(i * 3 + i // len(OFFERS)) % len(sizes)]) for i in range(runs)]


def run(work: Path, runs: int, sizes: tuple[int, ...], seed: int) -> list[dict[str, Any]]:
    from jupyter_portable import Workspace
    from jupyter_portable.demo.market import LocalMarket
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.routes import compute_routes, history_records
    from jupyter_portable.orchestration.state_view import head_manifest

    rng = random.Random(seed)
    steps = plan(runs, sizes)
    root = work / "ws"
    (root / "train.py").parent.mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    write_random(root / DATA, steps[0][1] * MB, rng)
    ws = Workspace.init(root, f"file://{work}/store")
    ws.snapshot("the benchmark's workspace", progress=None)
    market = LocalMarket(work / "catalog.toml", work / "market")
    out: list[dict[str, Any]] = []
    for i, (offer_id, size) in enumerate(steps):
        orch = Orchestrator(ws, providers={"local": market}, lazy_threshold=EAGER)
        try:
            routes, _ = compute_routes(ws, providers={"local": market})
            route = next(r for r in routes if r.offer.id == offer_id)
            t0 = time.perf_counter()
            done = orch.continue_(route.id)
            wall = time.perf_counter() - t0
            aid = done["allocation_id"]
            nxt = steps[i + 1][1] if i + 1 < len(steps) else None
            if nxt is not None:  # the next run moves a workspace of the next size
                rec = orch.record(aid)
                assert rec is not None
                write_random(Path(rec.workdir) / DATA, nxt * MB, rng)
                orch.snapshot(f"{nxt} MB")
            orch.stop("the benchmark's run is done")
        finally:
            orch.close()
        closed = next(a for a in history_records(head_manifest(ws)) if a["allocation_id"] == aid)
        p, m = closed.get("predicted") or {}, closed.get("measured") or {}
        row = {"run": i + 1, "offer": offer_id, "mb": size, "basis": p.get("boot_basis"),
               "pred_s": p.get("time_to_ready_s"), "pred_boot_s": p.get("boot_s"), "pred_xfer_s": p.get("transfer_s"),
               "meas_s": m.get("time_to_ready_s"), "meas_boot_s": m.get("boot_s"), "meas_xfer_s": m.get("transfer_s"),
               "up_s": m.get("up_s"), "continue_s": round(wall, 3)}
        row["error"] = (row["pred_s"] / row["meas_s"] - 1) if row["pred_s"] is not None and row["meas_s"] else None
        out.append(row)
        log(f"run {i + 1}/{len(steps)}: {offer_id} {size} MB: predicted {row['pred_s']} s ({row['basis']}), "
            f"measured {row['meas_s']} s")
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(sel: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [r["error"] for r in sel if r["error"] is not None]
        if not errs:
            return {"n": 0, "median": None, "worst": None}
        return {"n": len(errs), "median": statistics.median(errs), "worst": max(errs, key=abs),
                "median_abs": statistics.median(abs(e) for e in errs)}

    return {"all": stats(rows), "after_first": stats(rows[1:]),
            "learnt": stats([r for r in rows if r["basis"] != "catalog"])}


def report(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    head = ("run", "offer", "MB", "boot basis", "pred s", "pred boot", "pred xfer", "meas s", "meas boot",
            "meas xfer", "error")
    lines = [tuple(str(x) for x in (r["run"], r["offer"], r["mb"], r["basis"], r["pred_s"], r["pred_boot_s"],
                                    r["pred_xfer_s"], r["meas_s"], r["meas_boot_s"], r["meas_xfer_s"],
                                    "-" if r["error"] is None else f"{r['error']:+.0%}")) for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    for line in (head, *lines):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
    print()
    for name, words in (("all", "all runs"), ("after_first", "after the first run"),
                        ("learnt", "runs whose boot was learnt")):
        st = s[name]
        if st["n"]:
            print(f"time to Ready error, {words} (n={st['n']}): median {st['median']:+.0%}, "
                  f"worst {st['worst']:+.0%}")
    target = s["after_first"]
    if target["n"]:
        ok = abs(target["median"]) <= 0.20
        print(f"target: median within +-20% (after the first run): {'met' if ok else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 Continues, workspaces of 10-200 MB")
    ap.add_argument("--runs", type=int, help="Continues to run (default 20, 8 with --quick)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", type=Path, help="folder for the temporary files (default: the system's)")
    ap.add_argument("--json", dest="json_out", type=Path, help="also write every run and the summary here")
    args = ap.parse_args(argv)
    runs = args.runs or (8 if args.quick else 20)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    if runs < 1:
        ap.error("--runs must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="portable-estimates-", dir=args.work))
    catalog = 'version = 1\n[store]\nregion = "local-a"\negress_per_gb = 0.0\n' + "".join(
        OFFER.format(id=i, boot=b, bw=bw) for i, b, bw in OFFERS)
    (work / "catalog.toml").write_text(catalog)
    os.environ.update(JUPYTER_PORTABLE_CATALOG=str(work / "catalog.toml"),
                      JUPYTER_PORTABLE_MARKET_DIR=str(work / "market"),
                      JUPYTER_PORTABLE_SSH_STATE=str(work / "ssh-state"),
                      JUPYTER_PORTABLE_PROVIDERS="local", JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES="0")
    started = time.perf_counter()
    try:
        rows = run(work, runs, sizes, args.seed)
    finally:
        from jupyter_portable.demo.market import LocalMarket

        market = LocalMarket(work / "catalog.toml", work / "market")
        for a in market.list_allocations():  # whatever an aborted run left: this market's only
            if a["state"] not in ("lost", "terminated"):
                market.terminate(market.allocation(a["allocation_id"]))
        shutil.rmtree(work, ignore_errors=True)
    s = summary(rows)
    print(f"{runs} Continues in {time.perf_counter() - started:.0f} s\n")
    report(rows, s)
    if args.json_out:
        args.json_out.write_text(json.dumps({"runs": rows, "summary": s}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
