#!/usr/bin/env python3
"""Benchmark `jupyter portable` snapshot/restore/verify against rclone, restic and plain I/O.

Every measured operation is a whole process (start-up included), timed with a wall clock,
repeated N times; the table reports medians and ratios against baselines measured in the
same run on the same tree.  See bench/README.md for the methodology.

    .venv/bin/python bench/snapshot.py --small            # smoke run, well under a minute
    .venv/bin/python bench/snapshot.py --root /tmp/pbench  # full run (~1.1 GB, 55,001 files)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CLI = REPO / ".venv" / "bin" / "jupyter-portable"
CHANGED_FILE = "small/d00/f0000.bin"  # the file modified by the "one file changed" runs
BUCKET = "bench"

READ_ONCE = """
import os, sys
n = 0
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        with open(os.path.join(d, f), "rb", buffering=0) as fh:
            while chunk := fh.read(1 << 20):
                n += len(chunk)
print(n)
"""
WALK_STAT = """
import os, sys
n = 0
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        n += os.stat(os.path.join(d, f)).st_size
print(n)
"""
PUT_EACH = """
import os, sys, boto3
root, bucket, prefix = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for d, _, files in os.walk(root):
    for f in files:
        p = os.path.join(d, f)
        with open(p, "rb") as fh:
            s3.put_object(Bucket=bucket, Key=prefix + os.path.relpath(p, root), Body=fh.read())
"""


class BenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Layout:
    seed: int
    big_mb: int
    small_files: int  # 1-16 KiB each
    small_dirs: int
    tree_dirs: int  # leaf dirs of the nested tree, two levels deep
    tree_files: int  # files per leaf dir, 200 B - 4 KiB each

    @classmethod
    def make(cls, seed: int, small: bool, big_mb: int | None) -> Layout:
        if small:
            return cls(seed, big_mb if big_mb is not None else 51, 250, 10, 50, 50)
        return cls(seed, big_mb if big_mb is not None else 1024, 5000, 50, 500, 100)

    def small_paths(self) -> list[str]:
        return [
            f"small/d{i % self.small_dirs:02d}/f{i:04d}.bin" for i in range(self.small_files)
        ]

    def tree_paths(self) -> list[str]:
        return [
            f"tree/a{d // 25:02d}/b{d % 25:02d}/f{j:03d}.txt"
            for d in range(self.tree_dirs)
            for j in range(self.tree_files)
        ]


def file_bytes(seed: int, rel: str) -> bytes:
    """Deterministic content of one small file, a function of (seed, path) only."""
    rng = random.Random(f"{seed}:{rel}")
    size = rng.randint(1024, 16384) if rel.startswith("small/") else rng.randint(200, 4096)
    return rng.randbytes(size)


def write_file(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def build(root: Path, layout: Layout) -> tuple[Path, Path]:
    """Build (or reuse) root/ws (whole workspace) and root/small5k (small files only)."""
    ws, small_ws, marker = root / "ws", root / "small5k", root / "layout.json"
    for d in (ws, small_ws):  # leftovers of an interrupted run
        shutil.rmtree(d / ".portable", ignore_errors=True)
    if marker.exists() and json.loads(marker.read_text()) == asdict(layout):
        log(f"reusing workspace in {root}")
        write_file(ws, CHANGED_FILE, file_bytes(layout.seed, CHANGED_FILE))
        return ws, small_ws
    log(f"building workspace in {root} ({layout})")
    marker.unlink(missing_ok=True)
    shutil.rmtree(ws, ignore_errors=True)
    shutil.rmtree(small_ws, ignore_errors=True)
    (ws / "big").mkdir(parents=True)
    with open(ws / "big" / "big.bin", "wb") as fh:
        for i in range(layout.big_mb):
            fh.write(random.Random(f"{layout.seed}:big:{i}").randbytes(1 << 20))
    for rel in layout.small_paths():
        data = file_bytes(layout.seed, rel)
        write_file(ws, rel, data)
        write_file(small_ws, rel, data)
    for rel in layout.tree_paths():
        write_file(ws, rel, file_bytes(layout.seed, rel))
    marker.write_text(json.dumps(asdict(layout)))
    return ws, small_ws


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class Runner:
    """Runs whole processes, times them and keeps every sample by name."""

    def __init__(self, env: dict[str, str], drop_caches: bool) -> None:
        self.env = env
        self.drop_caches = drop_caches
        self.samples: dict[str, list[float]] = {}
        self.problems: list[str] = []
        self.moto: Moto | None = None

    def reset_store(self, path: str) -> None:
        """Empty a local store/repo directory, or the whole moto server."""
        local = path.removeprefix("file://")
        if local.startswith("/"):
            shutil.rmtree(local, ignore_errors=True)
        elif self.moto is not None:
            self.moto.reset()
        else:
            raise BenchError(f"no moto server to reset for {path}")

    def run(self, cmd: list[str], cwd: Path | None = None, quiet: bool = True) -> str:
        """Run untimed; return stdout; raise BenchError on failure."""
        p = subprocess.run(
            cmd, cwd=cwd, env=self.env, capture_output=True, text=True, check=False
        )
        if p.returncode != 0:
            raise BenchError(
                f"`{shlex.join(cmd)}` (cwd={cwd}) exited {p.returncode}\n{p.stderr[-3000:]}"
            )
        return p.stdout

    def timed(self, cmd: list[str], cwd: Path | None = None) -> tuple[float, str]:
        os.sync()  # flush dirty pages left by the previous step so they do not bill this one
        if self.drop_caches:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
        t0 = time.perf_counter()
        out = self.run(cmd, cwd)
        return time.perf_counter() - t0, out

    def measure(
        self,
        name: str,
        reps: int,
        cmd: Callable[[int], list[str]],
        prepare: Callable[[int], None] | None = None,
        cwd: Callable[[int], Path] | Path | None = None,
        check: Callable[[str], None] | None = None,
    ) -> None:
        """prepare(i) runs untimed before rep i; check(stdout) validates the output."""
        for i in range(reps):
            if prepare is not None:
                prepare(i)
            where = cwd(i) if callable(cwd) else cwd
            try:
                secs, out = self.timed(cmd(i), where)
            except BenchError as e:
                self.problems.append(f"{name}: {e}")
                log(f"  FAILED {name}: {e}")
                return
            self.samples.setdefault(name, []).append(secs)
            log(f"  {name} [{i + 1}/{reps}] {secs:.3f} s")
            if check is not None:
                try:
                    check(out)
                except (BenchError, ValueError, KeyError) as e:
                    self.problems.append(f"{name}: bad output: {e}: {out[:500]!r}")

    def median(self, name: str) -> float | None:
        xs = self.samples.get(name)
        return statistics.median(xs) if xs else None


class Moto:
    """An in-process moto S3 server; reset() wipes every bucket and recreates ours."""

    def __init__(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request access log
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.s3 = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )

    def reset(self) -> None:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req).read()
        self.s3.create_bucket(Bucket=BUCKET)

    def stop(self) -> None:
        self.server.stop()


def make_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        RESTIC_PASSWORD="bench-password",
        RESTIC_CACHE_DIR=str(work / "restic-cache"),
        RCLONE_CONFIG_MOTO_TYPE="s3",
        RCLONE_CONFIG_MOTO_PROVIDER="Other",
        RCLONE_CONFIG_MOTO_ACCESS_KEY_ID="testing",
        RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY="testing",
        RCLONE_CONFIG_MOTO_REGION="us-east-1",
    )
    # AWS_CA_BUNDLE makes rclone 1.60 refuse to build its S3 client; moto is plain http anyway
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CA_BUNDLE", "RCLONE_CONFIG"):
        env.pop(k, None)
    return env


def set_endpoint(env: dict[str, str], endpoint: str) -> None:
    env["AWS_ENDPOINT_URL"] = endpoint
    env["RCLONE_CONFIG_MOTO_ENDPOINT"] = endpoint


def mutate(ws: Path, i: int) -> None:
    write_file(ws, CHANGED_FILE, random.Random(f"changed:{i}:{time.time()}").randbytes(4096))


def bench_plain(r: Runner, ws: Path, reps: int) -> None:
    log("== plain baselines")
    py = sys.executable
    r.measure("find stat walk", reps, lambda i: ["find", str(ws), "-printf", "%s %T@\\n"])
    r.measure("os.walk+stat", reps, lambda i: [py, "-c", WALK_STAT, str(ws)])
    r.measure("read every file once", reps, lambda i: [py, "-c", READ_ONCE, str(ws)])


def bench_rclone(r: Runner, ws: Path, dest: str, tag: str, reps: int, cold: int) -> None:
    log(f"== rclone {tag}")

    sync = ["rclone", "sync", str(ws), dest]
    r.measure(f"rclone sync cold ({tag})", cold, lambda i: sync, lambda i: r.reset_store(dest))
    r.measure(f"rclone sync no-change ({tag})", reps, lambda i: sync)
    r.measure(f"rclone sync one-changed ({tag})", reps, lambda i: sync, lambda i: mutate(ws, i))


def bench_restic(r: Runner, ws: Path, repo: str, tag: str, reps: int, cold: int) -> None:
    log(f"== restic {tag}")
    work = Path(r.env["RESTIC_CACHE_DIR"]).parent
    restic = ["restic", "-q", "-r", repo]

    def prep_cold(i: int) -> None:
        r.reset_store(repo.removeprefix("s3:"))
        r.run([*restic, "init"])

    backup = [*restic, "backup", str(ws)]
    r.measure(f"restic backup cold ({tag})", cold, lambda i: backup, prep_cold)
    r.measure(f"restic backup no-change ({tag})", reps, lambda i: backup)
    r.measure(f"restic backup one-changed ({tag})", reps, lambda i: backup, lambda i: mutate(ws, i))
    target = work / f"restic-restore-{tag}"
    r.measure(
        f"restic restore ({tag})",
        reps,
        lambda i: [*restic, "restore", "latest", "--target", str(target)],
        lambda i: shutil.rmtree(target, ignore_errors=True),
    )
    shutil.rmtree(target, ignore_errors=True)
    r.measure(f"restic check --read-data ({tag})", cold, lambda i: [*restic, "check", "--read-data"])


def expect(keys: set[str]) -> Callable[[str], dict[str, Any]]:
    def check(out: str) -> dict[str, Any]:
        obj = json.loads(out)
        if not isinstance(obj, dict) or not keys <= obj.keys():
            raise BenchError(f"expected JSON object with keys {sorted(keys)}")
        return obj

    return check


SNAP_KEYS = {"workspace_id", "version", "files", "bytes", "new_bytes"}
RESTORE_KEYS = {"workspace_id", "version", "files", "bytes", "pending"}


def bench_ours(
    r: Runner, cli: list[str], ws: Path, store: str, tag: str, reps: int, cold: int, nfiles: int
) -> None:
    log(f"== ours {tag}")
    work = Path(r.env["RESTIC_CACHE_DIR"]).parent
    state: dict[str, str] = {}

    def prep_cold(i: int) -> None:
        shutil.rmtree(ws / ".portable", ignore_errors=True)
        r.reset_store(store)
        out = r.run([*cli, "init", str(ws), "--store", store, "--json"], cwd=ws)
        state["id"] = str(expect({"workspace_id", "store"})(out)["workspace_id"])

    def check_snap(out: str) -> None:
        obj = expect(SNAP_KEYS)(out)
        if obj["files"] != nfiles:
            raise BenchError(f"snapshot reports {obj['files']} files, expected {nfiles}")

    snap = [*cli, "snapshot", "--json"]
    r.measure(f"ours snapshot cold ({tag})", cold, lambda i: snap, prep_cold, ws, check_snap)
    if "id" not in state:
        return
    r.measure(f"ours snapshot no-change ({tag})", reps, lambda i: snap, cwd=ws, check=check_snap)
    r.measure(
        f"ours snapshot one-changed ({tag})", reps, lambda i: snap, lambda i: mutate(ws, i), ws,
        check_snap,
    )
    target = work / f"ours-restore-{tag}"

    def check_restore(out: str) -> None:
        obj = expect(RESTORE_KEYS)(out)
        if obj["files"] != nfiles:
            raise BenchError(f"restore reports {obj['files']} files, expected {nfiles}")

    restore = [*cli, "restore", "--store", store, "--workspace", state["id"], str(target), "--json"]
    r.measure(
        f"ours restore ({tag})", reps, lambda i: restore,
        lambda i: shutil.rmtree(target, ignore_errors=True), work, check_restore,
    )

    def check_verify(out: str) -> None:
        obj = expect({"ok", "version", "mismatches"})(out)
        if obj["ok"] is not True:
            raise BenchError(f"verify not ok: {obj['mismatches'][:5]}")

    if target.exists():
        r.measure(f"ours verify ({tag})", reps, lambda i: [*cli, "verify", "--json"], cwd=target,
                  check=check_verify)
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(ws / ".portable", ignore_errors=True)


def bench_small_to_moto(
    r: Runner, moto: Moto, cli: list[str] | None, small_ws: Path, reps: int, nfiles: int
) -> None:
    log("== small files to moto")

    def prep(i: int) -> None:
        shutil.rmtree(small_ws / ".portable", ignore_errors=True)
        moto.reset()

    r.measure(
        "boto3 put_object per file (moto)", reps,
        lambda i: [sys.executable, "-c", PUT_EACH, str(small_ws), BUCKET, "put/"], prep,
    )
    if cli is None:
        return
    store = f"s3://{BUCKET}/small"

    def prep_ours(i: int) -> None:
        prep(i)
        r.run([*cli, "init", str(small_ws), "--store", store, "--json"], cwd=small_ws)

    def check(out: str) -> None:
        if expect(SNAP_KEYS)(out)["files"] != nfiles:
            raise BenchError(f"expected {nfiles} files")

    r.measure(
        "ours snapshot small files (moto)", reps, lambda i: [*cli, "snapshot", "--json"],
        prep_ours, small_ws, check,
    )
    shutil.rmtree(small_ws / ".portable", ignore_errors=True)


# (operation, ours, baseline, target label, predicate(ours, baseline) or None for info rows)
Pred = Callable[[float, float], bool] | None
FASTER: Pred = lambda o, b: o < b  # noqa: E731


def rows(tag: str) -> list[tuple[str, str, str, str, Pred]]:
    ours = f"ours snapshot %s ({tag})"
    return [
        (f"cold snapshot ({tag})", ours % "cold", "read every file once", "<= 1.5x",
         lambda o, b: o <= 1.5 * b),
        (f"cold snapshot ({tag})", ours % "cold", f"restic backup cold ({tag})", "< 1x", FASTER),
        (f"cold snapshot ({tag})", ours % "cold", f"rclone sync cold ({tag})", "< 1x", FASTER),
        (f"no-change snapshot ({tag})", ours % "no-change", f"rclone sync no-change ({tag})",
         "< 1 s and < 1x", lambda o, b: o < 1.0 and o < b),
        (f"no-change snapshot ({tag})", ours % "no-change", f"restic backup no-change ({tag})",
         "info", None),
        (f"no-change snapshot ({tag})", ours % "no-change", "find stat walk", "floor", None),
        (f"no-change snapshot ({tag})", ours % "no-change", "os.walk+stat", "floor", None),
        (f"one-changed snapshot ({tag})", ours % "one-changed",
         f"rclone sync one-changed ({tag})", "info", None),
        (f"one-changed snapshot ({tag})", ours % "one-changed",
         f"restic backup one-changed ({tag})", "info", None),
        (f"restore ({tag})", f"ours restore ({tag})", f"restic restore ({tag})", "< 1x", FASTER),
        (f"verify ({tag})", f"ours verify ({tag})", f"restic check --read-data ({tag})", "info",
         None),
    ]


def report(r: Runner, tags: list[str]) -> list[dict[str, Any]]:
    spec = [row for tag in tags for row in rows(tag)]
    if "moto" in tags:
        spec.append(("5,000 small files to moto", "ours snapshot small files (moto)",
                     "boto3 put_object per file (moto)", ">= 5x faster", lambda o, b: o * 5 <= b))
    out: list[dict[str, Any]] = []
    for op, ours_name, base_name, target, pred in spec:
        o, b = r.median(ours_name), r.median(base_name)
        ratio = o / b if o is not None and b else None
        if o is None or b is None:
            verdict = "n/a"
        elif pred is None:
            verdict = "-"
        else:
            verdict = "met" if pred(o, b) else "MISSED"
        out.append(dict(operation=op, ours=o, baseline=base_name, baseline_s=b, ratio=ratio,
                        target=target, verdict=verdict))

    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    head = ("operation", "ours s", "baseline", "base s", "ours/base", "target", "")
    table = [head] + [
        (d["operation"], f(d["ours"], ".3f"), d["baseline"], f(d["baseline_s"], ".3f"),
         f(d["ratio"], ".2f"), d["target"], d["verdict"]) for d in out
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    print()
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print("\nall medians (s):")
    for name, xs in r.samples.items():
        print(f"  {name:42s} {statistics.median(xs):9.3f}   n={len(xs)}")
    return out


def find_cli(explicit: str | None) -> list[str] | None:
    candidates = [explicit] if explicit else [str(DEFAULT_CLI), shutil.which("jupyter-portable")]
    for c in candidates:
        if c and Path(c).exists():
            p = subprocess.run([c, "--help"], capture_output=True, check=False)
            if p.returncode == 0:
                return [c]
            log(f"`{c} --help` exited {p.returncode}: {p.stderr.decode()[-500:]}")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", type=Path, help="where to build/reuse the tree (default: temp dir)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--big-mb", type=int, help="size of the big file (default 1024; 51 --small)")
    ap.add_argument("--small", action="store_true", help="scale everything down ~20x")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of quick operations")
    ap.add_argument("--cold-reps", type=int, help="repetitions of cold/full-data operations "
                    "(default 1; 3 with --small)")
    ap.add_argument("--no-s3", action="store_true", help="skip everything against moto")
    ap.add_argument("--skip-ours", action="store_true", help="baselines only")
    ap.add_argument("--cli", help=f"path to the jupyter-portable CLI (default {DEFAULT_CLI})")
    ap.add_argument("--drop-caches", action="store_true",
                    help="drop the page cache before every timed run (needs root)")
    ap.add_argument("--json-out", type=Path, help="write all samples and the table here")
    args = ap.parse_args(argv)

    cli = None if args.skip_ours else find_cli(args.cli)
    if cli is None and not args.skip_ours:
        log(f"error: the jupyter-portable CLI was not found or `--help` failed "
            f"(looked at {args.cli or DEFAULT_CLI} and PATH); pass --cli PATH or --skip-ours")
        return 2
    for tool in ("restic", "rclone", "find"):
        if shutil.which(tool) is None:
            log(f"error: `{tool}` is not on PATH (apt-get install -y restic rclone)")
            return 2

    layout = Layout.make(args.seed, args.small, args.big_mb)
    cold = args.cold_reps or (args.reps if args.small else 1)
    nfiles = 1 + layout.small_files + layout.tree_dirs * layout.tree_files
    root = args.root or Path(tempfile.mkdtemp(prefix="portable-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    ws, small_ws = build(root, layout)
    work = fresh(root / "work")
    r = Runner(make_env(work), args.drop_caches)
    moto: Moto | None = None
    t0 = time.perf_counter()
    try:
        log("== warm-up: read every file once (untimed in the table)")
        r.run([sys.executable, "-c", READ_ONCE, str(ws)])
        r.run([sys.executable, "-c", READ_ONCE, str(small_ws)])
        bench_plain(r, ws, args.reps)
        bench_rclone(r, ws, str(work / "rclone-dest"), "local", args.reps, cold)
        bench_restic(r, ws, str(work / "restic-repo"), "local", args.reps, cold)
        if cli:
            bench_ours(r, cli, ws, (work / "store").as_uri(), "local", args.reps, cold, nfiles)
        if not args.no_s3:
            moto = Moto()
            r.moto = moto
            set_endpoint(r.env, moto.endpoint)
            moto.reset()
            bench_rclone(r, ws, f"moto:{BUCKET}/rclone", "moto", args.reps, cold)
            bench_restic(r, ws, f"s3:{moto.endpoint}/{BUCKET}/restic", "moto", args.reps, cold)
            if cli:
                bench_ours(r, cli, ws, f"s3://{BUCKET}/ours", "moto", args.reps, cold, nfiles)
            bench_small_to_moto(r, moto, cli, small_ws, args.reps, layout.small_files)
    finally:
        if moto is not None:
            moto.stop()
        write_file(ws, CHANGED_FILE, file_bytes(layout.seed, CHANGED_FILE))
        shutil.rmtree(work, ignore_errors=True)
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"layout: {layout}, files={nfiles}, reps={args.reps}, cold reps={cold}, "
          f"total {time.perf_counter() - t0:.0f} s")
    table = report(r, ["local"] + ([] if args.no_s3 else ["moto"]))
    for p in r.problems:
        print(f"PROBLEM: {p}")
    if args.json_out:
        args.json_out.write_text(json.dumps(
            dict(layout=asdict(layout), reps=args.reps, cold_reps=cold, samples=r.samples,
                 table=table, problems=r.problems), indent=2))
    return 1 if r.problems else 0


if __name__ == "__main__":
    sys.exit(main())
