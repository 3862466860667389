#!/usr/bin/env python3
"""Benchmark: the notebook's environment (``bench/env-lock.txt``, 40 packages) on a new machine, from the store alone.

The user's side prepares the lockfile's index for this interpreter once (``envprep.prepare_index``:
wheels from the package index, the environment laid out once as one archive). Then each
repetition is a new machine: a fresh folder, so uv's cache beside the venvs is empty, and the
worker's warm build (``envcache.build_env``) from the store:

- **archive**: the index names the archive; the machine unpacks it into a fresh venv;
- **wheels** (the baseline, the same run, interleaved): the same wheels under an index without an
  archive, in a second store: the machine fetches each wheel and uv installs them (what every
  build did before issue 32);
- **wheels, same machine again**: the baseline once more in the first baseline's folder, uv's
  cache filled (reported, not a target).

Target (issue 32 item 5): the archive build at most 1.5 s (median of ``--reps``). Each build
prints its phases (fetch, venv, unpack or install). Needs the package index once.

    .venv/bin/python bench/envarchive.py [--reps 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "bench" / "env-lock.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    from jupyter_portable.store.repo import Store
    from jupyter_portable.worker.bootstrap import index_sources, local_target
    from jupyter_portable.worker.envcache import WheelIndex, build_env, env_tag
    from jupyter_portable.worker.envprep import prepare_index

    lock = LOCK.read_bytes()
    packages = sum(1 for line in lock.decode().splitlines() if "==" in line)
    with tempfile.TemporaryDirectory(prefix="jp-bench-envarchive-") as tmp_name:
        tmp = Path(tmp_name)
        store = Store.open(f"file://{tmp / 'store'}")
        target = local_target()
        env = env_tag(sys.executable)
        started = time.monotonic()
        prepared = prepare_index(store, lock, env, target.wheel_platform(), image={},
                                 sources=index_sources(None, None, None))
        prepare_s = time.monotonic() - started
        index = prepared.index
        if index.archive is None:
            print("no archive was laid out for this environment")
            return 2
        # the baseline: the same wheels, an index without the archive, in a store of its own
        plain = Store.open(f"file://{tmp / 'store-plain'}")
        for w in index.wheels:
            plain.put_object(store.get_object(w.hash), w.hash)
        bare = WheelIndex(index.lockfile, index.env, index.wheels, index.requirements, index.changes, None)
        plain.backend.write_new(bare.key, bare.to_bytes())
        print(f"{packages} packages, {len(index.wheels)} wheels ({sum(w.size for w in index.wheels) / 2**20:.0f} MiB), "
              f"archive {index.archive.size / 2**20:.0f} MiB; prepared on the user's side in {prepare_s:.1f} s",
              flush=True)
        runs: dict[str, list[float]] = {"archive": [], "wheels": [], "again": []}
        phases: dict[str, list[dict[str, float]]] = {"archive": [], "wheels": [], "again": []}
        for i in range(args.reps):
            for kind, st in (("archive", store), ("wheels", plain)) if i % 2 == 0 else \
                    (("wheels", plain), ("archive", store)):
                machine = tmp / f"machine-{kind}-{i}"
                built = build_env(st, lock, machine / "venv", python=sys.executable)
                assert built.installed_from == kind, built.installed_from
                runs[kind].append(built.seconds)
                phases[kind].append(dict(built.phases))
                print(f"  {kind:8} {built.seconds:6.2f} s: "
                      + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in built.phases), flush=True)
            again = build_env(plain, lock, tmp / f"machine-wheels-{i}" / "venv-again", python=sys.executable)
            runs["again"].append(again.seconds)
            phases["again"].append(dict(again.phases))
            for kind in ("archive", "wheels"):
                shutil.rmtree(tmp / f"machine-{kind}-{i}", ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n{packages}-package environment on a new machine from the store, medians of {args.reps}:\n")
    print(f"{'build':44}{'median':>8}  {'/ wheels':>8}  runs")
    for label, key in (("archive (one tar, unpacked)", "archive"), ("wheels (baseline: uv installs each)", "wheels"),
                       ("wheels, the same machine again (uv cache)", "again")):
        print(f"{label:44}{med[key]:>7.2f}s  {med[key] / med['wheels']:>7.2f}x  "
              + ", ".join(f"{x:.2f}" for x in runs[key]))
        keys = list(dict.fromkeys(k for p in phases[key] for k in p))
        print("    " + ", ".join(f"{k.removesuffix('_s')} {statistics.median(p.get(k, 0.0) for p in phases[key]):.2f}"
                                for k in keys))
    ok = med["archive"] <= 1.5
    print(f"\ntarget: archive <= 1.5 s: {'met' if ok else 'MISSED'} ({med['archive']:.2f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
