#!/usr/bin/env python3
"""Benchmark: a bare machine that reaches no package index, from Continue to an executed cell.

Each run rents a fresh machine from the RunPod twin (a real loopback sshd with a bare Python of
its own version, after the twin's boot delay, and no package index reachable from it) and
Continues onto it with default settings: the worker is installed by the bootstrap and the
notebook's environment, the workspace's lockfile made on this interpreter, is rebuilt for the
machine's Python from the store. Then a kernel runs one cell there.

For each machine Python (pyenv's 3.10 and Debian's 3.11.2, both other than this one):

- **cold**: a fresh store: the user's side resolves and fetches the worker's and the
  environment's wheels for that Python (from the package index, or ``.wheelhouse`` with
  ``--offline``), stores them, and the machine installs them;
- **warm**: the same store again, a fresh machine of the same kind: every wheel from the store.

Each warm run is made twice, interleaved: with the venv archive (the default: one archive laid
out on the user's side, unpacked on the machine) and, as the baseline, with each wheel installed
by uv on the machine (``JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE=0``). Every run prints where its
seconds went: the machine coming up (the boot delay), the bootstrap (its own phases on this side
and on the machine), the environment and the worker until READY (the worker's timings), the
kernel's start and the cell.

Targets: the warm Continue to an executed cell within 5 s of the twin's boot delay (median of
``--runs``, 5; issue 32), the cold run and the wheels baseline reported beside it. One more
row: a lockfile of at least 150 packages made on this interpreter (a closure of this venv's packages), rebuilt on a 3.10
machine from the store, warm: its environment build within 15 s (median of ``--runs``); its
cold run fetches from the package index (or is skipped with ``--offline``). Needs root.

    .venv/bin/python bench/bootstrap.py             # ~10 minutes (the 150-package cold fetch included)
    .venv/bin/python bench/bootstrap.py --offline   # the wheels from .wheelhouse; no 150-package row
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import freshfs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the twins are test infrastructure

BOOT_DELAY_S = 2.0
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
        "driver": "550.90.07", "cuda": "12.4", "stock": 100, "region": "US-TX-3"}
PYTHONS = ("3.10", "3.11.2")
# the big lockfile: the closure of these (installed here), in this order, until it holds 150 packages
BIG_ROOTS = ("jupyterlab", "ipywidgets", "s3fs", "boto3", "gcsfs", "adlfs", "huggingface-hub", "hypothesis",
             "moto", "playwright", "pytest", "mypy", "ruff", "import-linter")


def closure(roots: tuple[str, ...], at_least: int) -> set[str]:
    """Normalised names of the installed packages ``roots`` need, root by root until ``at_least``."""
    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    seen: set[str] = set()
    for root in roots:
        todo = [root]
        while todo:
            name = norm(todo.pop())
            if name in seen:
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            seen.add(name)
            for raw in dist.requires or []:
                req = Requirement(raw)
                if req.marker is None or req.marker.evaluate({"extra": ""}):
                    todo.append(req.name)
        if len(seen) >= at_least:
            break
    return seen


def big_lockfile() -> tuple[bytes, int]:
    from jupyter_portable.engine.runtime.lockfile import lock_environment, parse_lockfile

    full = lock_environment(sys.executable)
    names = closure(BIG_ROOTS, 150)
    lines = [line for name, line in sorted(parse_lockfile(full).items()) if name in names and "==" in line]
    return ("\n".join(lines) + "\n").encode(), len(lines)


MOUNTS: freshfs.Mounts | None = None  # --fs fresh: each machine's disk a new filesystem, mounted under DISKS
DISKS = Path()


def one_run(tmp: Path, store: Path, name: str, lock: bytes, *, archive: bool = True) -> dict[str, Any]:
    """Seconds from Continue to the first cell's answer on a fresh machine, and where they went."""
    from jupyter_client import BlockingKernelClient
    from jupyter_e2e import make_workspace
    from twins.machines import put_disks_in
    from userenv import publish_lockfile

    from jupyter_portable.orchestration.orchestrator import Orchestrator

    if MOUNTS is not None:  # a new machine has a new filesystem, not one where the last machine was deleted
        (DISKS / name).mkdir()
        put_disks_in(MOUNTS.make(DISKS / name, 8 << 30, 400_000))
    ws = make_workspace(tmp / name, store)
    publish_lockfile(ws, lock)
    marks: dict[str, float] = {}

    def mark(ev: dict[str, Any]) -> None:
        msg, now = str(ev.get("message") or ""), time.monotonic()
        if ev.get("step") == "probe":
            marks.setdefault("up", now)
        elif msg.startswith("starting the worker"):
            marks.setdefault("admitted", now)
        elif msg.startswith("the worker is installed"):
            marks.setdefault("installed", now)
        elif ev.get("step") == "verify":
            marks.setdefault("verified", now)

    os.environ["JUPYTER_PORTABLE_BOOTSTRAP_ARCHIVE"] = "1" if archive else "0"
    orch = Orchestrator(ws, on_progress=mark)
    started = time.monotonic()
    try:
        orch.continue_()
        marks["ready"] = time.monotonic()
        client = orch.client()
        timings = client.status().get("timings") or {}
        boot = client.record.allocation.details.get("bootstrap") or {}
        info = client.start_kernel("k-" + re.sub(r"[^A-Za-z0-9]", "", name))
        kc = BlockingKernelClient()
        kc.load_connection_info({**info, **client.forward_kernel(info),
                                 "ip": "127.0.0.1"})
        # heartbeats cross an SSH port forward: on a loaded machine a late one is not a dead kernel
        kc.hb_channel.time_to_dead = 30.0
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        marks["kernel"] = time.monotonic()
        reply = kc.execute_interactive("x = 1 + 1", timeout=120)
        took = time.monotonic() - started
        marks["cell"] = time.monotonic()
        kc.stop_channels()
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the cell failed: {reply['content']}")
        phases = phases_of(started, marks, boot, timings)
        print(f"  {name}: {took:.1f} s ({boot.get('installed_from') or '?'}): "
              + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
        return {"cell_s": took, "environment_s": float(timings.get("environment_s") or 0.0), "phases": phases}
    finally:
        try:
            orch.stop("benchmark run over")
        finally:
            orch.close()


def phases_of(started: float, marks: dict[str, float], boot: dict[str, Any],
              timings: dict[str, Any]) -> dict[str, float]:
    """Where a run's seconds went, in order; the bootstrap's and the worker's own phases inside theirs."""
    out: dict[str, float] = {}
    last = started
    for key, label in (("up", "machine up"), ("admitted", "probe+admission"), ("installed", "bootstrap"),
                       ("verified", "env+worker to READY"), ("ready", "verify"), ("kernel", "kernel start"),
                       ("cell", "cell")):
        if key in marks:
            out[label] = marks[key] - last
            last = marks[key]
        if key == "installed":
            out.update({f"  bootstrap.{k.removesuffix('_s')}": float(v)
                        for k, v in (boot.get("phases") or {}).items()})
        if key == "verified":
            out.update({f"  worker.{k.removesuffix('_s')}": float(v) for k, v in timings.items()
                        if k in ("environment_s", "materialize_s", "verify_s") and isinstance(v, (int, float))})
    return out


def phase_table(runs: list[dict[str, Any]]) -> list[str]:
    """The median of every phase over ``runs``."""
    keys = list(dict.fromkeys(k for r in runs for k in r["phases"]))
    return [f"    {k:40}{statistics.median(r['phases'].get(k, 0.0) for r in runs):>7.2f}s" for k in keys]


def row(label: str, values: list[float]) -> str:
    return f"{label:44}{statistics.median(values):>9.1f}s   {', '.join(f'{x:.1f}' for x in values)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="warm runs per kind of machine (default 5)")
    parser.add_argument("--offline", action="store_true",
                        help="cold runs fetch from .wheelhouse, not the index (no 150-package row)")
    parser.add_argument("--fs", choices=("fresh", "same"), default="fresh" if freshfs.available() else "same",
                        help="fresh: each machine's disk on a new loop-mounted ext4 (as root); same: all under /tmp")
    parser.add_argument("--python", action="append", choices=PYTHONS,
                        help=f"only machines of this Python (default: {', '.join(PYTHONS)})")
    args = parser.parse_args()
    from twins.machines import python_missing, unavailable

    if unavailable():
        print(f"cannot run: {unavailable()}")
        return 2
    pythons = tuple(args.python or PYTHONS)
    missing = [v for v in pythons if python_missing(v)]
    if missing:
        print(f"cannot run: {python_missing(missing[0])}")
        return 2
    global MOUNTS, DISKS
    if args.fs == "fresh" and not freshfs.available():
        print("cannot run: --fs fresh needs root, mkfs.ext4 and mount")
        return 2
    if args.fs == "fresh":
        MOUNTS, DISKS = freshfs.Mounts(), Path(tempfile.mkdtemp(prefix="jp-bench-boot-disks-"))
        DISKS.chmod(0o711)  # a login user that is not root passes through to its disk
    try:
        return _main(args, pythons)
    finally:
        if MOUNTS is not None:
            MOUNTS.release_all()
            shutil.rmtree(DISKS, ignore_errors=True)


def _main(args: argparse.Namespace, pythons: tuple[str, ...]) -> int:
    from twins.machines import PYTHONS as MACHINE_PYTHONS
    from twins.runpod import RunPodTwin
    from userenv import user_lockfile

    lines: list[str] = []
    met: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="jp-bench-boot-") as tmp_name:
        tmp = Path(tmp_name)
        small = user_lockfile(tmp, REPO / ".wheelhouse")
        base = {"JUPYTER_PORTABLE_PROVIDERS": "runpod", "JUPYTER_PORTABLE_SSH_STATE": str(tmp / "ssh"),
                "JUPYTER_PORTABLE_MARKET_DIR": str(tmp / "market"), "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0"}
        os.environ.pop("JUPYTER_PORTABLE_ENVIRONMENT", None)  # default settings
        offline = {"JUPYTER_PORTABLE_WHEEL_FIND_LINKS": str(REPO / ".wheelhouse"), "JUPYTER_PORTABLE_NO_INDEX": "1"}
        for version in pythons:
            offer = {**H100, "python": MACHINE_PYTHONS[version]}
            with RunPodTwin(tmp / f"twin-{version}", offers=[offer], boot_delay_s=BOOT_DELAY_S) as twin:
                os.environ.update({**twin.env(), **base, **(offline if args.offline else {})})
                store = tmp / f"store-{version}"
                os.environ.update(PIP_NO_CACHE_DIR="1", UV_NO_CACHE="1")  # a first time: no cache helps
                try:
                    cold = one_run(tmp, store, f"cold-{version}", small)
                finally:
                    os.environ.pop("PIP_NO_CACHE_DIR", None)
                    os.environ.pop("UV_NO_CACHE", None)
                warm: list[dict[str, Any]] = []
                baseline: list[dict[str, Any]] = []
                for i in range(args.runs):  # interleaved: the archive and the baseline see the same machine load
                    warm.append(one_run(tmp, store, f"warm-{version}-{i}", small))
                    baseline.append(one_run(tmp, store, f"wheels-{version}-{i}", small, archive=False))
                w, b = [r["cell_s"] for r in warm], [r["cell_s"] for r in baseline]
                print(f"Python {version}: cold {cold['cell_s']:.1f} s, warm {', '.join(f'{x:.1f}' for x in w)} s, "
                      f"baseline {', '.join(f'{x:.1f}' for x in b)} s", flush=True)
                lines.append(row(f"Python {version} machine, cold", [cold["cell_s"]]))
                lines.append(row(f"Python {version} machine, warm", w))
                lines.append(row(f"Python {version}, warm, each wheel (baseline)", b))
                beyond = statistics.median(w) - BOOT_DELAY_S
                lines.append(f"  warm beyond the boot delay: {beyond:.1f} s (target <= 5 s): "
                             f"{'met' if beyond <= 5 else 'MISSED'}; warm / baseline "
                             f"{statistics.median(w) / statistics.median(b):.2f}x; warm / cold "
                             f"{statistics.median(w) / cold['cell_s']:.2f}x")
                lines.append("  where the warm runs' seconds went (medians; the baseline's after):")
                lines.extend(phase_table(warm))
                lines.append("  baseline (each wheel installed by uv on the machine):")
                lines.extend(phase_table(baseline))
                met.append(beyond <= 5)
        if not args.offline:
            lock, count = big_lockfile()
            with RunPodTwin(tmp / "twin-big", offers=[{**H100, "python": MACHINE_PYTHONS["3.10"]}],
                            boot_delay_s=BOOT_DELAY_S) as twin:
                os.environ.update({**twin.env(), **base})
                for key in offline:
                    os.environ.pop(key, None)
                store = tmp / "store-big"
                cold = one_run(tmp, store, "big-cold", lock)
                warm = [one_run(tmp, store, f"big-warm-{i}", lock) for i in range(args.runs)]
                env_s = [r["environment_s"] for r in warm]
                print(f"{count} packages on 3.10: cold env {cold['environment_s']:.1f} s, warm env "
                      f"{', '.join(f'{x:.1f}' for x in env_s)} s", flush=True)
                lines.append(row(f"{count}-package lockfile on 3.10, cold cell", [cold["cell_s"]]))
                lines.append(row(f"{count}-package lockfile on 3.10, cold env", [cold["environment_s"]]))
                lines.append(row(f"{count}-package lockfile on 3.10, warm env", env_s))
                lines.append(row(f"{count}-package lockfile on 3.10, warm cell", [r["cell_s"] for r in warm]))
                ok = statistics.median(env_s) <= 15
                lines.append(f"  warm environment build: {statistics.median(env_s):.1f} s (target <= 15 s): "
                             f"{'met' if ok else 'MISSED'}")
                met.append(ok)
    print()
    print(f"{'':44}{'median':>10}   runs")
    print("\n".join(lines))
    print(f"\ntwin boot delay {BOOT_DELAY_S:g} s; machines reach no package index")
    return 0 if all(met) else 1


if __name__ == "__main__":
    sys.exit(main())
