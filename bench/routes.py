#!/usr/bin/env python3
"""Benchmark route ranking: `rank_routes` over 1,000 synthetic offers against a plain sort by $/h.

The baseline is what most tools do (sort offers by price); it is measured in the same run on
the same offers, and the table reports medians of 20 runs and the ratio. The target is that
whole-route ranking of 1,000 offers stays well under 100 ms.

    .venv/bin/python bench/routes.py              # a few seconds
    .venv/bin/python bench/routes.py --offers 5000 --runs 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from jupyter_portable.core.offers import Checks, Offer, Requirements  # noqa: E402
from jupyter_portable.core.routing import Caps, Signals, WorkspaceFacts, rank_routes  # noqa: E402

TARGET_S = 0.100
PROVIDERS = {  # provider -> regions it lists offers in
    "aws": ("us-east-1", "us-west-2", "eu-west-1"),
    "gcp": ("us-central1-a", "europe-west4-b"),
    "runpod": ("CA-MTL-1", "EU-RO-1", "US-TX-3"),
    "vastai": ("US", "EU", "Asia"),
    "lambda": ("us-west-1", "us-east-1"),
    "local": ("local",),
}
GPUS = (("H100", 80, 2.5), ("A100", 80, 1.6), ("A100", 40, 1.2), ("L40S", 48, 0.9), ("RTX 4090", 24, 0.4))
DRIVERS = ("535.183.01", "550.54.15", "560.35.03")


def synthetic_offers(n: int, seed: int) -> list[Offer]:
    """``n`` offers spread over providers, regions, GPUs and capacity signals, the same for one seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        provider = rng.choice(list(PROVIDERS))
        gpu, memory, base = rng.choice(GPUS)
        count = rng.choice((1, 1, 1, 2, 4, 8))
        out.append(Offer(provider=provider, id=f"o{i:05d}", gpu=gpu, gpu_count=count, gpu_memory_gb=memory,
                         price_per_hour=round(base * count * rng.uniform(0.6, 1.8), 3),
                         region=rng.choice(PROVIDERS[provider]), driver=rng.choice(DRIVERS), cuda="12.4",
                         capacity=rng.choice((None, 0, 1, 3, 8)), boot_seconds=rng.uniform(30, 600),
                         launch_failure_rate=rng.choice((0.0, 0.02, 0.1)), reliability=rng.uniform(0.9, 1.0),
                         bandwidth_mbps=rng.choice((500.0, 1000.0, 10000.0)),
                         egress_per_gb=0.02 if provider == "vastai" else 0.0, spot=rng.random() < 0.3))
    return out


def median_s(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of ``runs`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    offers = synthetic_offers(args.offers, args.seed)
    rng = random.Random(args.seed + 1)
    keys = [o.key for o in offers]
    # A realistic call: a 200 GB workspace on S3, pinned driver, caps, some history and checks.
    facts = WorkspaceFacts(bytes_to_move=200 * 10**9, store_region="us-east-1", store_provider="aws",
                           store_egress_per_gb=0.09, workspace_bytes=250 * 10**9)
    req = Requirements(gpus=("H100", "A100"), min_gpu_memory_gb=40, driver="550.54.15")
    signals = Signals(recent_launch_failures={k: 1 for k in rng.sample(keys, len(keys) // 20)},
                      driver_mismatches={k: 1 for k in rng.sample(keys, len(keys) // 50)},
                      queue_seconds={k: rng.uniform(0, 1800) for k in rng.sample(keys, len(keys) // 10)})
    checks = {k: Checks(permitted=True, capacity=rng.random() < 0.8) for k in rng.sample(keys, len(keys) // 10)}
    caps = Caps(max_price_per_hour=20.0, budget_left=500.0)

    def ranked() -> object:
        return rank_routes(facts, offers, req, hours=8, caps=caps, signals=signals, checks=checks)

    def baseline() -> object:
        return sorted(offers, key=lambda o: o.price_per_hour)

    routes = rank_routes(facts, offers, req, hours=8, caps=caps, signals=signals, checks=checks)
    blocked = sum(r.blocked is not None for r in routes)
    t_rank = median_s(ranked, args.runs)
    t_sort = median_s(baseline, args.runs)

    print(f"{args.offers} offers (seed {args.seed}), {blocked} blocked; median of {args.runs} runs")
    print(f"{'what':<40} {'median':>10} {'ratio':>8}")
    print(f"{'sorted(offers, key=price)  [baseline]':<40} {t_sort * 1e3:>8.3f} ms {1.0:>7.1f}x")
    print(f"{'rank_routes (whole-route cost)':<40} {t_rank * 1e3:>8.3f} ms {t_rank / t_sort:>7.1f}x")
    holds = t_rank < TARGET_S
    print(f"rank_routes < {TARGET_S * 1e3:.0f} ms: {'yes' if holds else 'NO'}")
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
