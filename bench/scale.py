"""Million-file workspaces (issue 15): cold snapshot, no change, one file changed, restore and
verify, each with its peak RSS, and the bytes a one-file change writes to the store; restic
and rclone on the same tree when they are installed, and the `find` walk floor.

    .venv/bin/python bench/scale.py                 # 1,000,000 files
    .venv/bin/python bench/scale.py --files 100000  # quicker

Each command runs in its own process (peak RSS from wait4). Nothing is downloaded: restic
and rclone are used only if they are already on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MB = 1024 * 1024


def run_rss(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        dt = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err.read().decode()[-2000:]}")
        return dt, usage.ru_maxrss / 1024, out.read().decode()


def build(root: Path, n: int, per_dir: int) -> None:
    for i in range(0, n, per_dir):
        d = root / f"shard{i // per_dir:05d}"
        d.mkdir(parents=True, exist_ok=True)
        for j in range(i, min(n, i + per_dir)):
            with open(d / f"f{j:07d}.txt", "wb") as fh:
                fh.write(b"sample %d " % j + b"x" * (j % 200) + b"\n")
    old = time.time() - 3600  # old enough for the stat cache to trust
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))


def store_bytes(store: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(store):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--per-dir", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp folder, removed)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="portable-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    src, store, dest = work / "src", work / "store", work / "restored"
    cli = [sys.executable, "-m", "jupyter_portable"]
    env = dict(os.environ)
    rows: dict[str, dict[str, Any]] = {}
    try:
        t0 = time.perf_counter()
        build(src, args.files, args.per_dir)
        print(f"built {args.files} files in {time.perf_counter() - t0:.1f} s under {src}", file=sys.stderr)
        rows["find walk"] = dict(zip(("s", "rss"), run_rss(["find", str(src), "-type", "f"])[:2], strict=True))
        run_rss(cli + ["init", "--store", f"file://{store}"], cwd=src, env=env)
        for label in ("cold snapshot", "no change"):
            s, rss, _ = run_rss(cli + ["snapshot", "--json"], cwd=src, env=env)
            rows[label] = {"s": s, "rss": rss}
        victim = next((src / "shard00000").iterdir())
        victim.write_bytes(b"changed\n")
        before = store_bytes(store)
        s, rss, out = run_rss(cli + ["snapshot", "--json"], cwd=src, env=env)
        rows["one file changed"] = {"s": s, "rss": rss, "written": store_bytes(store) - before}
        ws = json.loads((src / ".portable" / "workspace.json").read_text())["workspace_id"]
        s, rss, _ = run_rss(cli + ["restore", "--store", f"file://{store}", "--workspace", ws, str(dest)], env=env)
        rows["restore"] = {"s": s, "rss": rss}
        s, rss, _ = run_rss(cli + ["verify", "--json"], cwd=dest, env=env)
        rows["verify"] = {"s": s, "rss": rss}
        others = {}
        for tool in ("restic", "rclone"):
            others[tool] = shutil.which(tool)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\n{args.files:,} files, {args.per_dir} per folder\n")
    print(f"| {'':18} | {'seconds':>8} | {'peak RSS MB':>11} |")
    print(f"|{'-' * 20}|{'-' * 10}|{'-' * 13}|")
    for label, r in rows.items():
        print(f"| {label:18} | {r['s']:8.2f} | {r['rss']:11.0f} |")
    written = rows["one file changed"]["written"]
    print(f"\nwritten to the store for one changed file: {written:,} bytes")
    for tool, path in others.items():
        if path is None:
            print(f"{tool}: not on PATH; not measured (this bench downloads nothing)")
    nc, one, walk = rows["no change"]["s"], rows["one file changed"]["s"], rows["find walk"]["s"]
    targets = [
        ("one file changed <= 1.5x no change", one <= 1.5 * nc, f"{one / nc:.2f}x"),
        ("one file changed writes <= 1 MB", written <= MB, f"{written / MB:.3f} MB"),
        ("no change <= 1.5x the find walk", nc <= 1.5 * walk, f"{nc / walk:.2f}x"),
        ("peak RSS <= 250 MB for every command", all(r["rss"] <= 250 for k, r in rows.items() if k != "find walk"),
         f"max {max(r['rss'] for k, r in rows.items() if k != 'find walk'):.0f} MB"),
    ]
    print()
    for name, ok, value in targets:
        print(f"{'met   ' if ok else 'MISSED'} {name}: {value}")
    print("not measured: cold snapshot / no change / restore / verify against restic and rclone "
          "(not installed)" if not any(others.values()) else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
