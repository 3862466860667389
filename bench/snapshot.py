#!/usr/bin/env python3
"""Benchmark `jupyter portable` snapshot/restore/verify against rclone, restic and plain I/O.

Every measured operation is a whole process (start-up included), timed with a wall clock and
repeated; the table reports medians and ratios against baselines measured in the same run on
the same tree.  See bench/README.md for the methodology.

    .venv/bin/python bench/snapshot.py --small --no-s3       # smoke run, ~15 s
    .venv/bin/python bench/snapshot.py --root /tmp/pbench    # full run (~1.1 GB, 55,001 files)
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
import traceback
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CLI = REPO / ".venv" / "bin" / "jupyter-portable"
CHANGED_FILE = "small/d00/f0000.bin"  # the file rewritten by the "one file changed" runs
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


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Layout:
    seed: int
    big_mb: int
    small_files: int  # 1-16 KiB each, spread over small_dirs
    small_dirs: int
    tree_dirs: int  # leaf dirs of the nested tree, two levels deep
    tree_files: int  # files per leaf dir, 200 B - 4 KiB each

    @classmethod
    def make(cls, seed: int, small: bool, big_mb: int | None) -> Layout:
        if small:
            return cls(seed, 51 if big_mb is None else big_mb, 250, 10, 50, 50)
        return cls(seed, 1024 if big_mb is None else big_mb, 5000, 50, 500, 100)

    @property
    def files(self) -> int:
        return 1 + self.small_files + self.tree_dirs * self.tree_files

    def small_paths(self) -> list[str]:
        return [f"small/d{i % self.small_dirs:02d}/f{i:04d}.bin" for i in range(self.small_files)]

    def tree_paths(self) -> list[str]:
        return [
            f"tree/a{d // 25:02d}/b{d % 25:02d}/f{j:03d}.txt"
            for d in range(self.tree_dirs)
            for j in range(self.tree_files)
        ]


def file_bytes(seed: int, rel: str) -> bytes:
    """Deterministic content of one small file: a function of (seed, path) only."""
    rng = random.Random(f"{seed}:{rel}")
    return rng.randbytes(rng.randint(1024, 16384) if rel.startswith("small/") else rng.randint(200, 4096))


def write_file(root: Path, rel: str, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def mutate(ws: Path) -> None:
    write_file(ws, CHANGED_FILE, random.randbytes(4096))


def build(root: Path, layout: Layout) -> tuple[Path, Path]:
    """Build, or reuse, root/ws (the whole workspace) and root/small5k (the small files only)."""
    ws, small_ws, marker = root / "ws", root / "small5k", root / "layout.json"
    for d in (ws, small_ws):  # leftovers of an interrupted run
        shutil.rmtree(d / ".portable", ignore_errors=True)
    if marker.exists() and json.loads(marker.read_text()) == asdict(layout):
        log(f"reusing the tree in {root}")
        write_file(ws, CHANGED_FILE, file_bytes(layout.seed, CHANGED_FILE))
        return ws, small_ws
    log(f"building the tree in {root}: {layout}")
    marker.unlink(missing_ok=True)
    for d in (ws, small_ws):
        shutil.rmtree(d, ignore_errors=True)
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
        keys = dict(aws_access_key_id="testing", aws_secret_access_key="testing")
        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **keys)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")).read()
        self.s3.create_bucket(Bucket=BUCKET)


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


def ours_json(out: str, *keys: str) -> dict[str, Any]:
    obj = json.loads(out)
    if not isinstance(obj, dict) or not set(keys) <= obj.keys():
        raise BenchError(f"expected one JSON object with keys {sorted(keys)}, got {out[:300]!r}")
    return obj


class Bench:
    """Runs whole processes, times them and keeps every sample by name."""

    def __init__(self, args: argparse.Namespace, layout: Layout, cli: list[str] | None, work: Path) -> None:
        self.args, self.layout, self.cli, self.work = args, layout, cli, work
        self.reps: int = args.reps if args.reps is not None else (1 if args.small else 3)
        self.cold: int = args.cold_reps if args.cold_reps is not None else self.reps
        # --store: the user's own credentials and endpoints reach the store untouched
        self.env = dict(os.environ) if args.store else make_env(work)
        self.moto: Moto | None = None
        self.samples: dict[str, list[float]] = {}
        self.problems: list[str] = []

    def run(self, cmd: list[str], cwd: Path | None = None) -> str:
        """Run untimed; return stdout; raise BenchError on failure."""
        p = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, check=False)
        if p.returncode != 0:
            raise BenchError(f"`{shlex.join(cmd)}` (cwd={cwd}) exited {p.returncode}\n{p.stderr[-3000:]}")
        return p.stdout

    def measure(
        self,
        name: str,
        reps: int,
        cmd: list[str],
        prepare: Callable[[], object] | None = None,
        cwd: Path | None = None,
        check: Callable[[str], object] | None = None,
    ) -> None:
        """Time `cmd` `reps` times; prepare() runs untimed before each rep, check(stdout) after."""
        for i in range(reps):
            try:
                if prepare is not None:
                    prepare()
                os.sync()  # write back what the previous step left dirty, so it does not bill this one
                if self.args.drop_caches:
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                t0 = time.perf_counter()
                out = self.run(cmd, cwd)
                secs = time.perf_counter() - t0
                if check is not None:
                    check(out)
            except (BenchError, ValueError, KeyError, TypeError) as e:
                self.problems.append(f"{name}: {e}")
                log(f"  FAILED {name}: {e}")
                return
            self.samples.setdefault(name, []).append(secs)
            log(f"  {name} [{i + 1}/{reps}] {secs:.3f} s")
            if secs > self.args.long and i + 1 < reps:
                log(f"  (over {self.args.long:.0f} s: not repeated)")
                return

    def median(self, name: str) -> float | None:
        xs = self.samples.get(name)
        return statistics.median(xs) if xs else None

    def reset_store(self, where: str) -> None:
        """Empty a local store/repo directory, or the whole moto server."""
        local = where.removeprefix("file://")
        if local.startswith("/"):
            shutil.rmtree(local, ignore_errors=True)
        elif self.moto is not None:
            self.moto.reset()

    def plain(self, ws: Path) -> None:
        log("== plain baselines")
        py = sys.executable
        self.measure("find stat walk", self.reps, ["find", str(ws), "-printf", "%s %T@\\n"])
        self.measure("os.walk+stat", self.reps, [py, "-c", WALK_STAT, str(ws)])
        self.measure("read every file once", self.reps, [py, "-c", READ_ONCE, str(ws)])
        dest = self.work / "cp-dest"
        self.measure(
            "cp -a (copy every file once)",
            self.cold,
            ["cp", "-a", str(ws), str(dest)],
            lambda: self.reset_store(str(dest)),
        )
        shutil.rmtree(dest, ignore_errors=True)

    def rclone(self, ws: Path, dest: str, tag: str) -> None:
        log(f"== rclone {tag}")
        sync = ["rclone", "sync", str(ws), dest]
        self.measure(f"rclone sync cold ({tag})", self.cold, sync, lambda: self.reset_store(dest))
        self.measure(f"rclone sync no-change ({tag})", self.reps, sync)
        if tag == "moto":  # rclone's documented way to avoid one HEAD per object on S3
            fast = [*sync, "--fast-list", "--update", "--use-server-modtime"]
            self.measure(f"rclone sync no-change --update ({tag})", self.reps, fast)
        self.measure(f"rclone sync one-changed ({tag})", self.reps, sync, lambda: mutate(ws))

    def restic(self, ws: Path, repo: str, tag: str) -> None:
        log(f"== restic {tag}")
        restic = ["restic", "-q", "-r", repo]
        backup, target = [*restic, "backup", str(ws)], self.work / f"restic-restore-{tag}"

        def prep_cold() -> None:
            self.reset_store(repo.removeprefix("s3:"))
            self.run([*restic, "init"])

        self.measure(f"restic backup cold ({tag})", self.cold, backup, prep_cold)
        self.measure(f"restic backup no-change ({tag})", self.reps, backup)
        self.measure(f"restic backup one-changed ({tag})", self.reps, backup, lambda: mutate(ws))
        restore = [*restic, "restore", "latest", "--target", str(target)]
        self.measure(f"restic restore ({tag})", self.reps, restore, lambda: shutil.rmtree(target, ignore_errors=True))
        shutil.rmtree(target, ignore_errors=True)
        self.measure(f"restic check --read-data ({tag})", self.cold, [*restic, "check", "--read-data"])

    def ours(self, ws: Path, store: str, tag: str) -> None:
        assert self.cli is not None
        log(f"== ours {tag}")
        cli, nfiles, target = self.cli, self.layout.files, self.work / f"ours-restore-{tag}"
        ids: list[str] = []

        def prep_cold() -> None:
            shutil.rmtree(ws / ".portable", ignore_errors=True)
            self.reset_store(store)
            out = self.run([*cli, "init", str(ws), "--store", store, "--json"], ws)
            ids.append(str(ours_json(out, "workspace_id")["workspace_id"]))

        def check_counts(out: str, *keys: str) -> None:
            obj = ours_json(out, "workspace_id", "version", "files", "bytes", *keys)
            if obj["files"] != nfiles or obj.get("pending", 0):
                raise BenchError(f"expected {nfiles} files and nothing pending, got {obj}")

        def check_snap(out: str) -> None:
            check_counts(out, "new_bytes")

        if tag == "local":
            self.measure("ours start-up (--help)", self.reps, [*cli, "--help"])
        snap = [*cli, "snapshot", "--json"]
        self.measure(f"ours snapshot cold ({tag})", self.cold, snap, prep_cold, ws, check_snap)
        if not ids:
            return
        self.measure(f"ours snapshot no-change ({tag})", self.reps, snap, None, ws, check_snap)
        self.measure(f"ours snapshot one-changed ({tag})", self.reps, snap, lambda: mutate(ws), ws, check_snap)
        restore = [*cli, "restore", "--store", store, "--workspace", ids[-1], str(target), "--json"]

        def prep_restore() -> None:
            shutil.rmtree(target, ignore_errors=True)

        def check_restore(out: str) -> None:
            check_counts(out, "pending")

        self.measure(f"ours restore ({tag})", self.reps, restore, prep_restore, self.work, check_restore)

        def check_verify(out: str) -> None:
            obj = ours_json(out, "ok", "version", "mismatches")
            if obj["ok"] is not True:
                raise BenchError(f"verify says not ok: {obj['mismatches'][:5]}")

        if target.exists():
            self.measure(f"ours verify ({tag})", self.reps, [*cli, "verify", "--json"], None, target, check_verify)
            cmp = ["diff", "-rq", "--exclude=.portable", str(ws), str(target)]
            diff = subprocess.run(cmp, capture_output=True, text=True, check=False)
            if diff.returncode != 0:  # an independent check of the restored bytes, untimed
                self.problems.append(f"ours restore ({tag}): tree differs from the source:\n{diff.stdout[:2000]}")
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(ws / ".portable", ignore_errors=True)

    def ours_at(self, ws: Path, url: str) -> None:
        """Cold and no-change snapshots into any store URL (gs://, az://, s3:// on SeaweedFS...):
        each cold run in a fresh prefix under it, since a remote store cannot be wiped here."""
        assert self.cli is not None
        log(f"== ours at {url}")
        cli, nfiles = self.cli, self.layout.files

        def prep_cold() -> None:
            shutil.rmtree(ws / ".portable", ignore_errors=True)
            store = f"{url.rstrip('/')}/bench-{os.urandom(6).hex()}"
            self.run([*cli, "init", str(ws), "--store", store, "--json"], ws)

        def check_snap(out: str) -> None:
            obj = ours_json(out, "workspace_id", "version", "files", "bytes", "new_bytes")
            if obj["files"] != nfiles:
                raise BenchError(f"expected {nfiles} files, got {obj}")

        snap = [*cli, "snapshot", "--json"]
        self.measure("ours snapshot cold (store)", self.cold, snap, prep_cold, ws, check_snap)
        self.measure("ours snapshot no-change (store)", self.reps, snap, None, ws, check_snap)
        shutil.rmtree(ws / ".portable", ignore_errors=True)

    def small_to_moto(self, small_ws: Path) -> None:
        log("== small files to moto")
        assert self.moto is not None
        moto = self.moto

        def prep() -> None:
            shutil.rmtree(small_ws / ".portable", ignore_errors=True)
            moto.reset()

        put = [sys.executable, "-c", PUT_EACH, str(small_ws), BUCKET, "put/"]
        self.measure("boto3 put_object per file (moto)", self.reps, put, prep)
        if self.cli is None:
            return
        cli, store = self.cli, f"s3://{BUCKET}/small"

        def prep_ours() -> None:
            prep()
            self.run([*cli, "init", str(small_ws), "--store", store, "--json"], small_ws)

        def check(out: str) -> None:
            if ours_json(out, "files")["files"] != self.layout.small_files:
                raise BenchError(f"expected {self.layout.small_files} files: {out[:300]}")

        snap = [*cli, "snapshot", "--json"]
        self.measure("ours snapshot small files (moto)", self.reps, snap, prep_ours, small_ws, check)
        shutil.rmtree(small_ws / ".portable", ignore_errors=True)


Pred = Callable[[float, float], bool] | None  # (ours, baseline) -> target met; None for info rows


def faster(o: float, b: float) -> bool:
    return o < b


def rows(tag: str, small_files: int) -> list[tuple[str, str, str, str, Pred]]:
    if tag == "store":  # --store URL: ours against the plain floors measured in the same run
        return [("cold snapshot (store)", "ours snapshot cold (store)", "read every file once", "info", None),
                ("no-change snapshot (store)", "ours snapshot no-change (store)", "os.walk+stat", "info", None)]
    cold, same, one = (f"{op} snapshot ({tag})" for op in ("cold", "no-change", "one-changed"))
    ours_cold, ours_same, ours_one = (f"ours snapshot {op} ({tag})" for op in ("cold", "no-change", "one-changed"))
    spec: list[tuple[str, str, str, str, Pred]] = [
        (cold, ours_cold, "read every file once", "<= 1.5x", lambda o, b: o <= 1.5 * b),
        *([(cold, ours_cold, "cp -a (copy every file once)", "info", None)] if tag == "local" else []),
        (cold, ours_cold, f"restic backup cold ({tag})", "< 1x", faster),
        (cold, ours_cold, f"rclone sync cold ({tag})", "< 1x", faster),
        (same, ours_same, f"rclone sync no-change ({tag})", "< 1 s and < 1x", lambda o, b: o < 1.0 and o < b),
        (same, ours_same, f"rclone sync no-change --update ({tag})", "info", None),
        (same, ours_same, f"restic backup no-change ({tag})", "info", None),
        (same, ours_same, "find stat walk", "floor", None),
        (same, ours_same, "os.walk+stat", "floor", None),
        (same, ours_same, "ours start-up (--help)", "info", None),
        (one, ours_one, f"rclone sync one-changed ({tag})", "info", None),
        (one, ours_one, f"restic backup one-changed ({tag})", "info", None),
        (f"restore ({tag})", f"ours restore ({tag})", f"restic restore ({tag})", "< 1x", faster),
        (f"verify ({tag})", f"ours verify ({tag})", f"restic check --read-data ({tag})", "info", None),
    ]
    if tag == "local":
        spec = [row for row in spec if "--update" not in row[2]]
    else:
        small = ("ours snapshot small files (moto)", "boto3 put_object per file (moto)")
        spec.append((f"{small_files:,} small files to moto", *small, ">= 5x faster", lambda o, b: 5 * o <= b))
    return spec


COLUMNS = ("operation", "ours_s", "baseline", "baseline_s", "ratio", "target", "verdict")


def fmt(x: str | float | None, spec: str) -> str:
    return "-" if x is None else x if isinstance(x, str) else format(x, spec)


def report(b: Bench, tags: list[str]) -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = []
    for op, ours_name, base_name, target, pred in (row for tag in tags for row in rows(tag, b.layout.small_files)):
        o, base = b.median(ours_name), b.median(base_name)
        verdict = "n/a" if o is None or base is None else "-" if pred is None else "met" if pred(o, base) else "MISSED"
        ratio = o / base if o is not None and base else None
        table.append(dict(zip(COLUMNS, (op, o, base_name, base, ratio, target, verdict), strict=True)))
    head = ("operation", "ours s", "baseline", "base s", "ours/base", "target", "")
    lines = [head] + [tuple(fmt(d[k], ".2f" if k == "ratio" else ".3f") for k in COLUMNS) for d in table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    print()
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    print("\nall samples (median, then each run; seconds):")
    for name, xs in b.samples.items():
        print(f"  {name:42s} {statistics.median(xs):9.3f}   [{', '.join(f'{x:.3f}' for x in xs)}]")
    return table


def find_cli(explicit: str | None) -> list[str] | None:
    for c in [explicit] if explicit else [str(DEFAULT_CLI), shutil.which("jupyter-portable")]:
        if c and Path(c).exists():
            p = subprocess.run([c, "--help"], capture_output=True, text=True, check=False)
            if p.returncode == 0:
                return [c]
            log(f"`{c} --help` exited {p.returncode}: {p.stderr[-500:]}")
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, help="build/reuse the tree here and keep it (default: a temp dir, removed)")
    ap.add_argument("--work", type=Path, help="where stores, repos and restores go (default ROOT/work; try tmpfs)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--big-mb", type=int, help="size of the big file in MiB (default 1024; 51 with --small)")
    ap.add_argument("--small", action="store_true", help="scale the tree down ~20x for a smoke run")
    ap.add_argument("--reps", type=int, help="repetitions of each operation (default 3; 1 with --small)")
    ap.add_argument("--cold-reps", type=int, help="repetitions of cold backups and full checks (default: --reps)")
    ap.add_argument("--long", type=float, default=60.0, help="do not repeat an operation whose first run took longer")
    ap.add_argument("--no-s3", action="store_true", help="skip everything against moto")
    ap.add_argument("--store", metavar="URL", help="only the cold and no-change snapshot into this store "
                    "(any backend: gs://, az://, s3:// with AWS_ENDPOINT_URL...), against the plain floors")
    ap.add_argument("--skip-ours", action="store_true", help="baselines only")
    ap.add_argument("--cli", help=f"the jupyter-portable executable (default {DEFAULT_CLI}, then PATH)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache before every timed run (root)")
    ap.add_argument("--json-out", type=Path, help="write every sample and the table here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli = None if args.skip_ours else find_cli(args.cli)
    if cli is None and not args.skip_ours:
        tried = args.cli or f"{DEFAULT_CLI} and PATH"
        log(f"error: no working jupyter-portable CLI (tried {tried}); pass --cli PATH, or --skip-ours")
        return 2
    tools = ("find", "diff", "cp") if args.store else ("restic", "rclone", "find", "diff", "cp")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        log(f"error: not on PATH: {' '.join(missing)} (apt-get install -y restic rclone)")
        return 2
    layout = Layout.make(args.seed, args.small, args.big_mb)
    root = args.root or Path(tempfile.mkdtemp(prefix="portable-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    ws, small_ws = build(root, layout)
    if args.work:  # a fresh folder inside it, removed at the end
        args.work.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="portable-bench-", dir=args.work))
    else:
        work = root / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    b = Bench(args, layout, cli, work)
    t0 = time.perf_counter()
    try:
        if not args.drop_caches:
            log("== warm-up: read every file once, untimed, so every run below starts with a warm page cache")
            b.run([sys.executable, "-c", READ_ONCE, str(ws)])
            b.run([sys.executable, "-c", READ_ONCE, str(small_ws)])
        b.plain(ws)
        if args.store:
            if cli:
                b.ours_at(ws, args.store)
        else:
            b.rclone(ws, str(work / "rclone-dest"), "local")
            b.restic(ws, str(work / "restic-repo"), "local")
            if cli:
                b.ours(ws, (work / "store").as_uri(), "local")
            if not args.no_s3:
                b.moto = Moto()
                b.env["AWS_ENDPOINT_URL"] = b.env["RCLONE_CONFIG_MOTO_ENDPOINT"] = b.moto.endpoint
                b.rclone(ws, f"moto:{BUCKET}/rclone", "moto")
                b.restic(ws, f"s3:{b.moto.endpoint}/{BUCKET}/restic", "moto")
                if cli:
                    b.ours(ws, f"s3://{BUCKET}/ours", "moto")
                b.small_to_moto(small_ws)
    except Exception as e:  # keep what was measured so far
        b.problems.append(f"aborted: {e!r}")
        log(traceback.format_exc())
    finally:
        if b.moto is not None:
            b.moto.server.stop()
        write_file(ws, CHANGED_FILE, file_bytes(layout.seed, CHANGED_FILE))
        shutil.rmtree(work, ignore_errors=True)
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{layout}, {layout.files} files, reps={b.reps}, cold reps={b.cold}, {time.perf_counter() - t0:.0f} s in all")
    table = report(b, ["store"] if args.store else ["local"] + ([] if args.no_s3 else ["moto"]))
    for p in b.problems:
        print(f"PROBLEM: {p}")
    if args.json_out:
        result = dict(layout=asdict(layout), reps=b.reps, cold_reps=b.cold, samples=b.samples, table=table)
        args.json_out.write_text(json.dumps(dict(result, problems=b.problems), indent=2))
    return 1 if b.problems else 0


if __name__ == "__main__":
    sys.exit(main())
