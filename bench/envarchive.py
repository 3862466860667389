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

Each machine is a new filesystem too (``--fs fresh``, the default as root: ``freshfs``, an ext4
image loop-mounted), as a new machine's is: on this machine's root ext4, files made where many
were just deleted are slowed by that deletion, which no new machine has.

Target (issue 32 item 5): the archive build at most 1.5 s (median of ``--reps``). Each build
prints its phases (fetch, venv, unpack or install). Needs the package index once.

    .venv/bin/python bench/envarchive.py [--reps 5] [--fs fresh|same]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import freshfs

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "bench" / "env-lock.txt"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--fs", choices=("fresh", "same"), default="fresh" if freshfs.available() else "same",
                        help="fresh: each machine on a new loop-mounted ext4 (needs root); same: folders under /tmp")
    args = parser.parse_args()
    if args.fs == "fresh" and not freshfs.available():
        print("error: --fs fresh needs root, mkfs.ext4 and mount", file=sys.stderr)
        return 2
    mounts = freshfs.Mounts()
    with tempfile.TemporaryDirectory(prefix="jp-bench-envarchive-") as tmp_name:
        try:
            return _run(args.reps, Path(tmp_name), mounts if args.fs == "fresh" else None)
        finally:
            mounts.release_all()


def _run(reps: int, tmp: Path, mounts: freshfs.Mounts | None) -> int:
    from jupyter_portable.store.repo import Store
    from jupyter_portable.worker.envcache import build_env
    from jupyter_portable.worker.envprep import prepare_index
    from jupyter_portable.worker.interpreter import local_target
    from jupyter_portable.worker.wheelindex import WheelIndex, env_tag
    from jupyter_portable.worker.wheelset import index_sources

    def new_machine(folder: Path) -> Path:
        """A new machine's disk: a fresh filesystem mounted at ``folder`` (a folder on it), or ``folder``."""
        folder.mkdir()
        return mounts.make(folder, 4 << 30, 200_000) if mounts is not None else folder

    lock = LOCK.read_bytes()
    packages = sum(1 for line in lock.decode().splitlines() if "==" in line)
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
          f"archive {index.archive.size / 2**20:.0f} MiB; prepared on the user's side in {prepare_s:.1f} s; "
          f"each machine on {'a new ext4' if mounts is not None else 'this filesystem'}", flush=True)
    kinds = ("archive", "wheels")
    runs: dict[str, list[float]] = {k: [] for k in (*kinds, "again")}
    phases: dict[str, list[dict[str, float]]] = {k: [] for k in (*kinds, "again")}
    stores = {"archive": store, "wheels": plain}
    for i in range(reps):
        machines: dict[str, Path] = {}
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            machines[kind] = new_machine(tmp / f"machine-{kind}-{i}")
            built = build_env(stores[kind], lock, machines[kind] / "venv", python=sys.executable)
            assert built.installed_from == kind, built.installed_from
            runs[kind].append(built.seconds)
            phases[kind].append(dict(built.phases))
            print(f"  {kind:8} {built.seconds:6.2f} s: "
                  + ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in built.phases), flush=True)
        again = build_env(plain, lock, machines["wheels"] / "venv-again", python=sys.executable)
        runs["again"].append(again.seconds)
        phases["again"].append(dict(again.phases))
        for kind in kinds:
            if mounts is not None:
                mounts.release(tmp / f"machine-{kind}-{i}")
            shutil.rmtree(tmp / f"machine-{kind}-{i}", ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n{packages}-package environment on a new machine from the store, medians of {reps}:\n")
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
