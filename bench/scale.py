"""Million-file workspaces (issue 15): ours against restic and rclone on the same tree, in one run.

Cold snapshot, no change, one file changed, restore and verify, each with its peak RSS; the
bytes each tool writes to its store for the one-file change; and two `find` walks: names only,
and an lstat of every file (what a snapshot must do at least to see a change). Every
target of the issue is printed as met or missed, as a ratio of two numbers of this run.

    scripts/bench-tools.sh                          # restic and rclone (Debian packages)
    .venv/bin/python bench/scale.py                 # 1,000,000 files
    .venv/bin/python bench/scale.py --files 100000  # quicker

Each command runs in its own process (peak RSS from wait4). Nothing is downloaded here:
restic and rclone must be on PATH (`make bench-scale` installs them first), or `--ours-only`.

What each tool does for each row:

| row | ours | restic | rclone |
|---|---|---|---|
| cold snapshot | `snapshot` into a new `file://` store | `backup` into a new repo | `sync` into an empty folder |
| no change | `snapshot` again | `backup` again (parent snapshot) | `sync` again |
| one file changed | `snapshot` | `backup` | `sync` |
| restore | `restore` into an empty folder | `restore latest --target` | (none: its copy is the folder) |
| verify | `verify`: every file hashed against the version | `check --read-data` | `check`: both sides hashed |
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

MB = 1024 * 1024
TOOLS = ("ours", "restic", "rclone")
ROWS = ("cold snapshot", "no change", "one file changed", "restore", "verify")


TIME = "/usr/bin/time"  # GNU time: the peak RSS of the command alone


def run_rss(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Seconds, peak RSS in MB, and stdout of one command (which must succeed).

    A child's ru_maxrss starts at its parent's peak (Linux keeps the high-water mark across
    fork and exec), so this process's own size would be a floor under every number; GNU
    time, small itself, reports the command's own peak."""
    timed = os.path.exists(TIME)
    full = [TIME, "-f", "RSS_KB %M", *cmd] if timed else cmd
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(full, cwd=cwd, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        dt = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        errors = err.read().decode(errors="replace")
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {errors[-2000:]}")
        rss = usage.ru_maxrss / 1024
        if timed:
            last = [line for line in errors.splitlines() if line.startswith("RSS_KB ")]
            rss = int(last[-1].split()[1]) / 1024 if last else rss
        return dt, rss, out.read().decode(errors="replace")


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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, work: Path, files: int, per_dir: int, tools: tuple[str, ...]) -> None:
        self.work = work
        self.src = work / "src"
        self.files, self.per_dir, self.tools = files, per_dir, tools
        self.cells: dict[tuple[str, str], dict[str, float]] = {}  # (row, tool) -> s, rss
        self.written: dict[str, int] = {}
        self.env = dict(os.environ, RESTIC_PASSWORD="bench-scale", RESTIC_CACHE_DIR=str(work / "restic-cache"),
                        RCLONE_CONFIG=str(work / "rclone.conf"))
        (work / "rclone.conf").touch()
        self.cli = [sys.executable, "-m", "jupyter_portable"]
        self.restic = ["restic", "-q", "-r", str(work / "restic-repo")]

    def time(self, row: str, tool: str, cmd: list[str], cwd: Path | None = None) -> str:
        log(f"{tool}: {row}")
        s, rss, out = run_rss(cmd, cwd=cwd, env=self.env)
        self.cells[(row, tool)] = {"s": s, "rss": rss}
        log(f"{tool}: {row}: {s:.2f} s, {rss:.0f} MB")
        return out

    def snapshot_rows(self, rows: tuple[str, ...]) -> None:
        """Each tool's snapshot of the tree as it is now, under the names ``rows``."""
        for row in rows:
            stores = {"ours": self.work / "store", "restic": self.work / "restic-repo",
                      "rclone": self.work / "rclone-dest"}
            for tool in self.tools:
                before = store_bytes(stores[tool]) if row == "one file changed" else 0
                if tool == "ours":
                    self.time(row, tool, self.cli + ["snapshot", "--json"], cwd=self.src)
                elif tool == "restic":
                    self.time(row, tool, self.restic + ["backup", ".", "--exclude", ".portable"], cwd=self.src)
                else:
                    self.time(row, tool, ["rclone", "sync", str(self.src), str(stores[tool]),
                                          "--exclude", "/.portable/**"])
                if row == "one file changed":
                    self.written[tool] = store_bytes(stores[tool]) - before

    def floors(self) -> None:
        """The two `find` walks, timed just before the no-change row, in the same state of the
        kernel's caches as the no-change snapshots that follow: the cold snapshots wrote a copy
        of the tree (rclone's), which pushes the tree's inodes out of the cache, and a walk timed
        before them would be compared with snapshots timed after. One untimed walk first."""
        run_rss(["find", str(self.src), "-type", "f", "-printf", "%s %T@\\n"])
        # .built and .portable are in every tool's walk alike (a handful of entries)
        s, rss, _ = run_rss(["find", str(self.src), "-type", "f"])
        self.cells[("find walk", "find")] = {"s": s, "rss": rss}
        log(f"find walk (names): {s:.2f} s")
        # what a snapshot must do at least to see a change: one lstat per file (the issue's
        # "stat walk"); -type f alone reads the type from the listing and stats nothing
        s, rss, _ = run_rss(["find", str(self.src), "-type", "f", "-printf", "%s %T@\\n"])
        self.cells[("stat walk", "find")] = {"s": s, "rss": rss}
        log(f"find walk (lstat each file): {s:.2f} s")

    def run(self) -> None:
        t0 = time.perf_counter()
        if not (self.src / ".built").exists():
            shutil.rmtree(self.src, ignore_errors=True)
            build(self.src, self.files, self.per_dir)
            (self.src / ".built").touch()
            log(f"built {self.files:,} files in {time.perf_counter() - t0:.1f} s under {self.src}")
        # Every tool reads the tree from the page cache: the first one timed would otherwise
        # pay for the disk alone.
        t0 = time.perf_counter()
        for dirpath, _dirs, files in os.walk(self.src):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    fh.read()
        log(f"read every file once (untimed): {time.perf_counter() - t0:.1f} s")
        if "ours" in self.tools:
            run_rss(self.cli + ["init", "--store", f"file://{self.work / 'store'}"], cwd=self.src, env=self.env)
        if "restic" in self.tools:
            run_rss(self.restic + ["init"], env=self.env)
        self.snapshot_rows(("cold snapshot",))
        self.floors()
        self.snapshot_rows(("no change",))
        victim = self.src / "shard00000" / "f0000000.txt"
        victim.write_bytes(b"changed " + victim.read_bytes())
        self.snapshot_rows(("one file changed",))
        if "ours" in self.tools:
            ws = json.loads((self.src / ".portable" / "workspace.json").read_text())["workspace_id"]
            dest = self.work / "restored"
            self.time("restore", "ours", self.cli + ["restore", "--store", f"file://{self.work / 'store'}",
                                                     "--workspace", ws, str(dest)])
        if "restic" in self.tools:
            self.time("restore", "restic", self.restic + ["restore", "latest", "--target",
                                                          str(self.work / "restic-restored")])
        if "ours" in self.tools:
            self.time("verify", "ours", self.cli + ["verify", "--json"], cwd=self.work / "restored")
        if "restic" in self.tools:
            self.time("verify", "restic", self.restic + ["check", "--read-data"])
        if "rclone" in self.tools:
            self.time("verify", "rclone", ["rclone", "check", str(self.src), str(self.work / "rclone-dest"),
                                           "--exclude", "/.portable/**"])

    def report(self) -> list[tuple[str, bool | None, str]]:
        print(f"\n{self.files:,} files, {self.per_dir} per folder; seconds (peak RSS MB), one run each\n")
        print("| | " + " | ".join(t for t in self.tools) + " |")
        print("|---" * (len(self.tools) + 1) + "|")
        for row in ROWS:
            cells = []
            for tool in self.tools:
                c = self.cells.get((row, tool))
                cells.append(f"{c['s']:.2f} s ({c['rss']:.0f} MB)" if c else "-")
            print(f"| {row} | " + " | ".join(cells) + " |")
        print("| bytes written for one changed file | "
              + " | ".join(f"{self.written[t] / MB:.3f} MB" if t in self.written else "-" for t in self.tools) + " |")
        f = self.cells[("find walk", "find")]
        print(f"\n`find {self.src.name} -type f` walk (names only): {f['s']:.2f} s ({f['rss']:.0f} MB)")
        f = self.cells[("stat walk", "find")]
        print(f"`find {self.src.name} -type f -printf '%s %T@\\n'` walk (an lstat per file): "
              f"{f['s']:.2f} s ({f['rss']:.0f} MB)\n")
        return self.targets()

    def _s(self, row: str, tool: str) -> float | None:
        c = self.cells.get((row, tool))
        return c["s"] if c else None

    def targets(self) -> list[tuple[str, bool | None, str]]:
        out: list[tuple[str, bool | None, str]] = []

        def ratio(name: str, ours: float | None, base: float | None, limit: float, base_name: str) -> None:
            if ours is None or base is None:
                out.append((name, None, f"not measured ({base_name} not run)"))
                return
            r = ours / base if base > 0 else float("inf")
            out.append((name, r <= limit, f"{ours:.2f} s / {base:.2f} s = {r:.2f}x (target <= {limit:g}x)"))

        s = self._s
        ratio("one file changed <= 1.5x our no change", s("one file changed", "ours"), s("no change", "ours"),
              1.5, "ours")
        w = self.written.get("ours")
        out.append(("one file changed writes <= 1 MB", None if w is None else w <= MB,
                    "not measured" if w is None else f"{w / MB:.3f} MB"))
        ratio("no change faster than rclone", s("no change", "ours"), s("no change", "rclone"), 1.0, "rclone")
        ratio("no change <= 1.5x the find stat walk", s("no change", "ours"), s("stat walk", "find"), 1.5, "find")
        ratio("cold snapshot <= restic", s("cold snapshot", "ours"), s("cold snapshot", "restic"), 1.0, "restic")
        ratio("cold snapshot <= rclone", s("cold snapshot", "ours"), s("cold snapshot", "rclone"), 1.0, "rclone")
        ours_rss = {row: c["rss"] for (row, tool), c in self.cells.items() if tool == "ours"}
        if ours_rss:
            top = max(ours_rss, key=lambda r: ours_rss[r])
            out.append(("peak RSS <= 250 MB for every command", ours_rss[top] <= 250,
                        f"highest {ours_rss[top]:.0f} MB ({top})"))
        ratio("restore <= restic", s("restore", "ours"), s("restore", "restic"), 1.0, "restic")
        ratio("verify <= restic (check --read-data)", s("verify", "ours"), s("verify", "restic"), 1.0, "restic")
        for name, ok, value in out:
            mark = "met   " if ok else ("MISSED" if ok is False else "n/a   ")
            print(f"{mark} {name}: {value}")
        # not a target: the find walk is the stat walk (a snapshot must lstat every
        # file to see a change); the names-only walk is the floor of any walk at all
        ours, names = s("no change", "ours"), s("find walk", "find")
        if ours is not None and names:
            print(f"info   no change against the find name walk (stats nothing): {ours:.2f} s / {names:.2f} s "
                  f"= {ours / names:.2f}x")
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--per-dir", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch folder (default: a temp folder, removed); the tree in WORK/src is reused "
                         "when a run built it, everything else is made afresh")
    ap.add_argument("--ours-only", action="store_true", help="skip restic and rclone")
    ap.add_argument("--json-out", type=Path, default=None, help="the cells, bytes written and targets as JSON")
    args = ap.parse_args()
    tools = ("ours",) if args.ours_only else TOOLS
    missing = [t for t in tools if t != "ours" and shutil.which(t) is None]
    if missing:
        print(f"error: not on PATH: {' '.join(missing)}; run scripts/bench-tools.sh (or pass --ours-only)",
              file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="portable-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("store", "restic-repo", "restic-cache", "rclone-dest", "restored", "restic-restored"):
        shutil.rmtree(work / name, ignore_errors=True)
    shutil.rmtree(work / "src" / ".portable", ignore_errors=True)
    bench = Bench(work, args.files, args.per_dir, tools)
    try:
        bench.run()
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    targets = bench.report()
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "files": args.files, "per_dir": args.per_dir,
            "cells": [{"row": r, "tool": t, **c} for (r, t), c in bench.cells.items()],
            "written": bench.written,
            "targets": [{"target": n, "met": ok, "value": v} for n, ok, v in targets]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
