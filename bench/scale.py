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

The change journal (issue 32): one long-lived process, as the kernel's auto-snapshot is,
keeps a journal (``engine/journal``) of the tree and snapshots in-process: a no-change full
walk there first (the same process, no journal), then the journal's first cut (a full
walk), a no-change snapshot and a one-file change with the journal; then it sits idle
while its CPU time is counted (`--journal-idle S`, 20 s), and last puts the changed file back
as it was and snapshots it, untimed, so restore and verify find the tree every tool last saw.
Its rows are printed beside the walk-based ones, and its targets as ratios against the `lstat`
walk of the same run.

What each tool does for each row:

| row | ours | restic | rclone |
|---|---|---|---|
| cold snapshot | `snapshot` into a new `file://` store | `backup` into a new repo | `sync` into an empty folder |
| no change | `snapshot` again | `backup` again (parent snapshot) | `sync` again |
| one file changed | `snapshot` | `backup` | `sync` |
| restore | `restore` into an empty folder | `restore latest --target` | (none: its copy is the folder) |
| verify | `verify`: every file hashed against the version | `check --read-data` | `check`: both sides hashed |

Restore's floor (issue 32): GNU `tar -xf` of the same tree into an empty folder, from a tar
made untimed just before; the target is ours <= 1.5x of it. Each timed restore (tar's, ours,
restic's) writes into a filesystem of its own: a new ext4 image, made untimed (inode tables
and journal written at mkfs, so no lazy initialisation runs beside it) and loop-mounted
(`--restore-fs fresh`, the default as root with mkfs.ext4). How a filesystem was used before
moves these rows threefold on this machine: ext4 without a journal (this machine's root)
skips recently freed inodes one by one when it makes a file. `--restore-fs settle` restores
into the work folder instead, each restore starting at least 65 s after the run last removed
a tree, its writes synced (see SETTLE_S). `--restore-rounds N` times the restores N times,
interleaved (tar, ours, restic, tar, ...), each on a fresh filesystem, prints every round,
and takes the medians for the restore row.
`--verify-rounds N` times verify N times each, interleaved (ours, restic, ours, restic, ...),
prints every round, and takes the medians for the verify row; the target is ours <= restic in
every round. The restored copy is read once, untimed, before verify, as the source tree is
before the first row. Every row shows its CPU split (user / system seconds, helper processes
included) next to its wall time, and `--phases` runs our restore and verify once more, untimed,
under cProfile and prints where their main process spends its time (work in helper processes
shows there as waiting).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import freshfs

MB = 1024 * 1024
TOOLS = ("ours", "restic", "rclone")
ROWS = ("cold snapshot", "no change", "one file changed", "restore", "verify")


TIME = "/usr/bin/time"  # GNU time: the peak RSS of the command alone
# ext4 without a journal (this machine's root) skips an inode freed less than 60 s ago (360 s
# while its inode table block is dirty) when it makes a file, and pays a look-up for each one it
# skips: right after a million files are deleted, every file made costs a scan past them (perf:
# recently_deleted, find_inode_bit). tar took 45 s or 125 s for the same files depending on it.
SETTLE_S = 65.0
LAST_REMOVAL = [float("-inf")]  # time.monotonic() of the last remove_tree


def remove_tree(path: Path) -> None:
    """Remove a folder the run made, and note when (see SETTLE_S)."""
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
        LAST_REMOVAL[0] = time.monotonic()


def settle() -> None:
    """Before a timed restore: every restore starts with no inode freed within ext4's window of
    'recently deleted' (SETTLE_S), the dirty inode tables written out first."""
    os.sync()
    wait = LAST_REMOVAL[0] + SETTLE_S - time.monotonic()
    if wait > 0:
        log(f"waiting {wait:.0f} s: files were removed just before (ext4 skips recently freed inodes)")
        time.sleep(wait)
LAST_CPU: dict[str, float] = {}  # user and system CPU seconds of the last run_rss command, children included


def run_rss(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Seconds, peak RSS in MB, and stdout of one command (which must succeed); its CPU in LAST_CPU.

    A child's ru_maxrss starts at its parent's peak (Linux keeps the high-water mark across
    fork and exec), so this process's own size would be a floor under every number; GNU
    time, small itself, reports the command's own peak."""
    timed = os.path.exists(TIME)
    full = [TIME, "-f", "RSS_KB %M CPU %U %S", *cmd] if timed else cmd
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
        LAST_CPU.update(user=usage.ru_utime, sys=usage.ru_stime)
        if timed:
            last = [line.split() for line in errors.splitlines() if line.startswith("RSS_KB ")]
            if last:  # RSS_KB kb CPU user sys: the command's own, not GNU time's
                rss = int(last[-1][1]) / 1024
                LAST_CPU.update(user=float(last[-1][3]), sys=float(last[-1][4]))
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


def read_all(root: Path) -> None:
    """Read every file under ``root`` once, so that the next command finds them in the page cache."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                fh.read()


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def journal_child(src: Path) -> int:
    """The long-lived process of the journal rows: commands on stdin, one JSON line each on stdout."""
    from jupyter_portable.engine.journal import ChangeJournal
    from jupyter_portable.engine.workspace import Workspace

    ws = Workspace.find(src)
    before = _rss_mb()
    t0 = time.perf_counter()
    journal = ChangeJournal(ws.copy.root, full_every_s=0)
    journal.start()
    print(json.dumps({"setup_s": time.perf_counter() - t0, "rss_before": before, "rss": _rss_mb(),
                      "watches": journal.watches}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] in ("walk", "snap"):
            t0 = time.perf_counter()
            cut = journal.cut(now=time.monotonic()) if cmd[0] == "snap" else None
            res = ws.snapshot(progress=None, journal=cut)
            print(json.dumps({"s": time.perf_counter() - t0, "walk": res.walk, "reason": res.walk_reason,
                              "changed": res.changed, "hashed": res.hashed, "rss": _rss_mb()}), flush=True)
        elif cmd[0] == "scrub":  # one auto-snapshot's scrub at its defaults, every 10 minutes (engine/scrub)
            from jupyter_portable.engine.scrub import DEFAULT_BUDGET, files_for

            t0 = time.perf_counter()
            got = ws.scrub(DEFAULT_BUDGET, files_for(int(cmd[1]), 600))  # cmd[1]: the tree's files
            print(json.dumps({"s": time.perf_counter() - t0, "walk": "scrub", "files": got.files, "bytes": got.bytes,
                              "mismatched": len(got.mismatched), "rss": _rss_mb()}), flush=True)
        elif cmd[0] == "idle":
            cpu0, t0 = time.process_time(), time.perf_counter()
            time.sleep(float(cmd[1]))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            print(json.dumps({"cpu_s": cpu, "wall_s": wall, "rss": _rss_mb(), "events": journal.events}), flush=True)
    journal.close()
    return 0


def phase_spans(prof: Path, most: int = 10) -> list[str]:
    """The functions of our package (and the waits and system calls under them) with the most
    cumulative time in a cProfile dump, one line each, outermost first; the wrappers that hold
    nearly all of it (the CLI's main) are left out."""
    import pstats

    stats: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    total = max((ct for _cc, _nc, _tt, ct, _callers in stats.values()), default=0.0)
    picked = []
    for (path, line, name), (_cc, calls, tt, ct, _callers) in stats.items():
        ours = "jupyter_portable" in path
        waits = name in ("<method 'acquire' of '_thread.lock' objects>", "<built-in method posix.waitpid>",
                         "<method 'poll' of 'select.poll' objects>", "<built-in method select.select>")
        syscall = name.startswith("<built-in method posix.") or "sqlite3" in name
        if (ours and ct < 0.9 * total) or waits or (syscall and tt > 0.02 * total):
            where = f"{Path(path).parent.name}/{Path(path).name}:{line} {name}" if ours else name
            picked.append((ct, tt, calls, where))
    picked.sort(reverse=True)
    return [f"  {ct:8.2f} s ({tt:6.2f} s in itself) {calls:>9,} calls  {where}"
            for ct, tt, calls, where in picked[:most]]


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
        self.with_journal, self.restore = True, True
        self.journal_idle_s = 20.0  # how long the journal's process sits idle while its CPU is counted
        self.cells: dict[tuple[str, str], dict[str, float]] = {}  # (row, tool) -> s, rss
        self.written: dict[str, int] = {}
        self.env = dict(os.environ, RESTIC_PASSWORD="bench-scale", RESTIC_CACHE_DIR=str(work / "restic-cache"),
                        RCLONE_CONFIG=str(work / "rclone.conf"))
        (work / "rclone.conf").touch()
        self.cli = [sys.executable, "-m", "jupyter_portable"]
        self.restic = ["restic", "-q", "-r", str(work / "restic-repo")]
        self.journal: dict[str, dict[str, Any]] = {}  # the journal process's answers, by row
        self.verify_rounds, self.phases = 1, False
        self.rounds: list[dict[str, float]] = []  # verify's seconds by tool, a round each
        self.restore_rounds = 1
        self.restore_log: list[dict[str, float]] = []  # restore's seconds by tool, a round each
        self.fresh_fs = False  # each timed restore into a new loop-mounted ext4 (see prepare_dest)
        self.mounts = freshfs.Mounts()
        self.restored = work / "restored"  # our last restore: the copy verify reads
        self.phase_lines: dict[str, list[str]] = {}  # row -> the cProfile pass's lines

    def time(self, row: str, tool: str, cmd: list[str], cwd: Path | None = None) -> dict[str, float]:
        """Run one timed command; its cell (seconds, peak RSS, CPU) is the row's for the tool."""
        log(f"{tool}: {row}")
        s, rss, _out = run_rss(cmd, cwd=cwd, env=self.env)
        cell = self.cells[(row, tool)] = {"s": s, "rss": rss, **LAST_CPU}
        log(f"{tool}: {row}: {s:.2f} s, {rss:.0f} MB, CPU {LAST_CPU['user']:.1f} s user {LAST_CPU['sys']:.1f} s sys")
        return cell

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
            remove_tree(self.src)
            build(self.src, self.files, self.per_dir)
            (self.src / ".built").touch()
            log(f"built {self.files:,} files in {time.perf_counter() - t0:.1f} s under {self.src}")
        # Every tool reads the tree from the page cache: the first one timed would otherwise
        # pay for the disk alone.
        t0 = time.perf_counter()
        read_all(self.src)
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
        if "ours" in self.tools and self.with_journal:
            self.journal_rows(self.journal_idle_s)
        if self.restore:
            self.restore_rows()
        self.verify_rows()
        if "ours" in self.tools and self.restore and self.phases:
            self.profile_phases()

    def restore_cmd(self, dest: Path) -> list[str]:
        ws = json.loads((self.src / ".portable" / "workspace.json").read_text())["workspace_id"]
        return self.cli + ["restore", "--store", f"file://{self.work / 'store'}", "--workspace", ws, str(dest)]

    def prepare_dest(self, name: str) -> Path:
        """An empty folder for one timed restore. With ``fresh_fs``, the folder ``tree`` on a new
        ext4 filesystem mounted at WORK/name (made untimed and written out first); else WORK/name
        itself, once no tree was removed within SETTLE_S."""
        mnt = self.work / name
        self.release(mnt)
        remove_tree(mnt)
        mnt.mkdir()
        if not self.fresh_fs:
            settle()
            return mnt
        return self.mounts.make(mnt, self.files * 8192 + 1024 * MB, self.files * 5 // 4 + 100_000)

    def release(self, mnt: Path) -> None:
        self.mounts.release(mnt)

    def release_all(self) -> None:
        self.mounts.release_all()

    def restore_rows(self) -> None:
        """The restore row: tar's floor, ours and restic's, ``restore_rounds`` times interleaved,
        each into its own fresh filesystem (or after settle()); the row holds the medians.

        The floor is GNU `tar -xf` of the same files from a tar made untimed: the files a restore
        writes, with their modes and times, and no store to read, no hashes."""
        tar = self.work / "src.tar"
        run_rss(["tar", "-cf", str(tar), "--exclude=./.portable", "--exclude=./.built", "-C", str(self.src), "."])
        samples: dict[str, list[dict[str, float]]] = {}
        for i in range(max(1, self.restore_rounds)):
            got: dict[str, float] = {}
            dest = self.prepare_dest("tar-restored")
            samples.setdefault("tar -x", []).append(self.time("restore", "tar -x", ["tar", "-xf", str(tar), "-C",
                                                                                    str(dest)]))
            self.release(self.work / "tar-restored")
            remove_tree(self.work / "tar-restored")  # its inodes are not left for the restores that follow
            got["tar -x"] = samples["tar -x"][-1]["s"]
            if "ours" in self.tools:
                self.restored = self.prepare_dest("restored")
                samples.setdefault("ours", []).append(self.time("restore", "ours", self.restore_cmd(self.restored)))
                got["ours"] = samples["ours"][-1]["s"]
            if "restic" in self.tools:
                dest = self.prepare_dest("restic-restored")
                samples.setdefault("restic", []).append(self.time("restore", "restic", self.restic + [
                    "restore", "latest", "--target", str(dest)]))
                self.release(self.work / "restic-restored")
                got["restic"] = samples["restic"][-1]["s"]
            self.restore_log.append(got)
            if self.restore_rounds > 1 and "ours" in got:
                log(f"restore round {i + 1}: ours {got['ours']:.2f} s, tar -x {got['tar -x']:.2f} s, "
                    f"{got['ours'] / got['tar -x']:.2f}x")
        tar.unlink()
        self.keep_medians("restore", samples)

    def keep_medians(self, row: str, samples: dict[str, list[dict[str, float]]]) -> None:
        """The row's cell for each tool: the round whose time is the median (the lower of two
        middle ones), with its CPU and RSS."""
        for tool, cells in samples.items():
            middle = statistics.median_low(c["s"] for c in cells)
            self.cells[(row, tool)] = next(c for c in cells if c["s"] == middle)

    def verify_rows(self) -> None:
        """The verify row: once each, or ``verify_rounds`` interleaved rounds (ours, restic, ours, ...)
        with the medians in the row and each round kept in ``self.rounds``."""
        ours = self.cli + ["verify", "--json"]
        restic = self.restic + ["check", "--read-data"]
        with_ours = "ours" in self.tools and self.restore
        if with_ours:
            # Untimed, as the source tree is before the first row: restic's restore just wrote a
            # million files of its own, which pushed our copy's inodes out of the kernel's cache,
            # while restic's check reads a few hundred packs (2026-12-03: ours 3.27x, 1.92x, 0.95x
            # over three rounds as the copy came back in).
            t0 = time.perf_counter()
            read_all(self.restored)
            log(f"read the restored copy once (untimed): {time.perf_counter() - t0:.1f} s")
        samples: dict[str, list[dict[str, float]]] = {}  # each tool's cells, a round each
        for i in range(max(1, self.verify_rounds)):
            got: dict[str, float] = {}
            if with_ours:
                samples.setdefault("ours", []).append(self.time("verify", "ours", ours, cwd=self.restored))
                got["ours"] = samples["ours"][-1]["s"]
            if "restic" in self.tools:
                samples.setdefault("restic", []).append(self.time("verify", "restic", restic))
                got["restic"] = samples["restic"][-1]["s"]
            self.rounds.append(got)
            if self.verify_rounds > 1 and len(got) == 2:
                log(f"verify round {i + 1}: ours {got['ours']:.2f} s, restic {got['restic']:.2f} s, "
                    f"{got['ours'] / got['restic']:.2f}x")
        self.keep_medians("verify", samples)
        if "rclone" in self.tools:
            self.time("verify", "rclone", ["rclone", "check", str(self.src), str(self.work / "rclone-dest"),
                                           "--exclude", "/.portable/**"])

    def profile_phases(self) -> None:
        """Our restore and verify once more, untimed, under cProfile: the main process's biggest spans."""
        dest = self.work / "restored-profiled"
        remove_tree(dest)
        for row, cmd, cwd in (("restore", self.restore_cmd(dest), None),
                              ("verify", self.cli + ["verify", "--json"], self.restored)):
            out = self.work / f"{row}.prof"
            log(f"ours: {row} under cProfile (untimed)")
            wall, _rss, _out = run_rss([sys.executable, "-m", "cProfile", "-o", str(out), *cmd[1:]],
                                       cwd=cwd, env=self.env)
            self.phase_lines[row] = [f"{row}, once more under cProfile: {wall:.2f} s wall (profiling slows "
                                     f"Python code), CPU {LAST_CPU['user']:.1f} s user {LAST_CPU['sys']:.1f} s "
                                     "sys (helpers included); the main process's biggest spans:"]
            self.phase_lines[row] += phase_spans(out)
            out.unlink()
        remove_tree(dest)

    def journal_rows(self, idle_s: float = 20.0) -> None:
        """The journal's rows, from one long-lived process (see the module's docstring)."""
        log("ours: the journal process")
        proc = subprocess.Popen([sys.executable, __file__, "--journal-child", str(self.src)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=self.env)
        assert proc.stdin is not None and proc.stdout is not None

        def ask(row: str, cmd: str) -> dict[str, Any]:
            if cmd:
                proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
            got: dict[str, Any] = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            self.journal[row] = got
            log(f"ours: {row}: {got}")
            return got

        try:
            ask("watcher start", "")
            ask("no change, full walk", "walk")
            ask("journal: first cut (full walk)", "snap")
            ask("journal: no change", "snap")
            victim = self.src / "shard00001" / f"f{self.per_dir:07d}.txt"
            data, st = victim.read_bytes(), victim.lstat()
            victim.write_bytes(b"changed again " + data)
            ask("journal: one file changed", "snap")
            ask("scrub, one auto-snapshot's (default budget)", f"scrub {self.files}")
            ask("watcher idle", f"idle {idle_s}")
            # The peers last saw the tree before this change: put the file back as it was (bytes and
            # times) and take one more snapshot, untimed, so that the restore and verify rows of every
            # tool (rclone's check compares its copy with this tree) are of the same tree.
            victim.write_bytes(data)
            os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
            if not ask("journal: put back (untimed)", "snap")["changed"]:
                raise SystemExit(f"the journal's snapshot did not see {victim} put back: ours would restore "
                                 "another tree than restic's")
            proc.stdin.write("quit\n")
            proc.stdin.flush()
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)

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
              f"{f['s']:.2f} s ({f['rss']:.0f} MB)")
        t = self.cells.get(("restore", "tar -x"))
        if t:
            print(f"restore's floor, `tar -xf` of the same files into an empty folder: {t['s']:.2f} s "
                  f"({t['rss']:.0f} MB)")
            print("every timed restore wrote into " + ("a new ext4 filesystem of its own (loop-mounted)"
                                                       if self.fresh_fs else
                                                       f"the work folder, {SETTLE_S:.0f} s after the last removal"))
        print()
        if len(self.restore_log) > 1:
            print(f"restore, {len(self.restore_log)} interleaved rounds (the row above holds the medians):\n")
            for i, r in enumerate(self.restore_log, 1):
                ratio = f", ours {r['ours'] / r['tar -x']:.2f}x tar" if "ours" in r else ""
                print(f"  round {i}: " + ", ".join(f"{tool} {sec:.2f} s" for tool, sec in r.items()) + ratio)
            print()
        if len(self.rounds) > 1:
            print(f"verify, {len(self.rounds)} interleaved rounds (ours, then restic `check --read-data`; the row "
                  "above holds the medians):\n")
            for i, r in enumerate(self.rounds, 1):
                ratio = f", {r['ours'] / r['restic']:.2f}x" if "ours" in r and "restic" in r else ""
                print(f"  round {i}: " + ", ".join(f"{tool} {sec:.2f} s" for tool, sec in r.items()) + ratio)
            print()
        spent = [(row, tool, c) for (row, tool), c in self.cells.items()
                 if row in ("restore", "verify") and "user" in c]
        if spent:
            print("Where the time goes: wall against CPU (user / system, helper processes included; verify: its "
                  "median round):\n")
            for row, tool, c in spent:
                print(f"  {row}, {tool}: {c['s']:.2f} s wall, {c['user']:.2f} s user, {c['sys']:.2f} s system")
            print()
        for lines in self.phase_lines.values():
            print("\n".join(lines) + "\n")
        if self.journal:
            j = self.journal
            start = j["watcher start"]
            print(f"The change journal, in one long-lived process ({start['watches']:,} folders watched, set up in "
                  f"{start['setup_s']:.2f} s; no interpreter start-up in these rows, unlike the rows above):\n")
            print("| | ours, in-process | walk | the `lstat` walk |")
            print("|---|---|---|---|")
            for row in ("no change, full walk", "journal: first cut (full walk)", "journal: no change",
                        "journal: one file changed", "scrub, one auto-snapshot's (default budget)"):
                c = j[row]
                print(f"| {row} | {c['s']:.3f} s | {c['walk']} | {c['s'] / f['s']:.3f}x |")
            scrub = j["scrub, one auto-snapshot's (default budget)"]
            print(f"\nthe scrub read {scrub['files']:,} unchanged files ({scrub['bytes'] / 2**20:.1f} MiB) and found "
                  f"{scrub['mismatched']} changed where stat could not see; it runs after each auto-snapshot")
            idle = j["watcher idle"]
            print(f"\nwatcher process: {start['rss']:.0f} MB resident after it started watching "
                  f"({start['rss'] - start['rss_before']:.1f} MB of it for the watches), idle {idle['wall_s']:.0f} s: "
                  f"{idle['cpu_s']:.3f} s of CPU\n")
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
        ratio("restore <= 1.5x tar -xf of the same files" + (", medians" if len(self.restore_log) > 1 else ""),
              s("restore", "ours"), s("restore", "tar -x"), 1.5, "tar -x")
        both = [r for r in self.restore_log if "ours" in r]
        if len(both) > 1:
            won = sum(r["ours"] <= 1.5 * r["tar -x"] for r in both)
            out.append((f"restore <= 1.5x tar -xf in {len(both)} of {len(both)} interleaved rounds", won == len(both),
                        f"{won} of {len(both)} (" + ", ".join(f"{r['ours'] / r['tar -x']:.2f}x" for r in both) + ")"))
        ratio("verify <= restic (check --read-data)" + (", medians" if len(self.rounds) > 1 else ""),
              s("verify", "ours"), s("verify", "restic"), 1.0, "restic")
        both = [r for r in self.rounds if "ours" in r and "restic" in r]
        if len(both) > 1:
            won = sum(r["ours"] <= r["restic"] for r in both)
            out.append((f"verify <= restic in {len(both)} of {len(both)} interleaved rounds", won == len(both),
                        f"{won} of {len(both)} (" + ", ".join(f"{r['ours'] / r['restic']:.2f}x" for r in both) + ")"))
        if self.journal:
            j = self.journal
            walk = s("stat walk", "find")
            for row, limit in (("journal: one file changed", 0.1), ("journal: no change", 0.05)):
                ok = j[row]["walk"] == "journal"
                ratio(f"{row} <= {limit:g}x the lstat walk" + ("" if ok else " (the journal was not used!)"),
                      j[row]["s"] if ok else None, walk, limit, "the journal")
            start, idle = j["watcher start"], j["watcher idle"]
            out.append(("watcher memory <= 100 MB", start["rss"] <= 100,
                        f"{start['rss']:.0f} MB resident (the process), {start['rss'] - start['rss_before']:.1f} MB "
                        f"added by watching {start['watches']:,} folders"))
            frac = idle["cpu_s"] / idle["wall_s"]
            out.append(("watcher CPU < 1% of a core while idle", frac < 0.01,
                        f"{100 * frac:.3f}% ({idle['cpu_s']:.3f} s of CPU in {idle['wall_s']:.0f} s)"))
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
    ap.add_argument("--tools", default=",".join(TOOLS),
                    help="the tools to run, comma-separated (default: %(default)s); ours is always run")
    ap.add_argument("--json-out", type=Path, default=None, help="the cells, bytes written and targets as JSON")
    ap.add_argument("--no-journal", action="store_true", help="skip the change journal's rows (issue 32)")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore and verify rows")
    ap.add_argument("--journal-idle", type=float, default=20.0, metavar="S",
                    help="seconds the journal's process sits idle while its CPU is counted (default: %(default)s)")
    ap.add_argument("--verify-rounds", type=int, default=1, metavar="N",
                    help="time verify N times each, interleaved (ours, restic, ours, ...); the row holds the medians")
    ap.add_argument("--restore-rounds", type=int, default=1, metavar="N",
                    help="time the restores N times each, interleaved (tar, ours, restic, tar, ...); the row holds "
                         "the medians")
    fresh_ok = freshfs.available()
    ap.add_argument("--restore-fs", choices=("fresh", "settle"), default="fresh" if fresh_ok else "settle",
                    help="fresh: each timed restore into a new loop-mounted ext4 (needs root and mkfs.ext4); "
                         "settle: into the work folder, 65 s after the last removal (default: %(default)s)")
    ap.add_argument("--phases", action="store_true",
                    help="run our restore and verify once more, untimed, under cProfile and print their biggest spans")
    ap.add_argument("--journal-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.journal_child is not None:
        return journal_child(args.journal_child)
    asked = {t.strip() for t in args.tools.split(",") if t.strip()}
    if asked - set(TOOLS):
        print(f"error: --tools: unknown {', '.join(sorted(asked - set(TOOLS)))} (known: {', '.join(TOOLS)})",
              file=sys.stderr)
        return 2
    tools = ("ours",) if args.ours_only else tuple(t for t in TOOLS if t in asked or t == "ours")
    missing = [t for t in tools if t != "ours" and shutil.which(t) is None]
    if missing:
        print(f"error: not on PATH: {' '.join(missing)}; run scripts/bench-tools.sh (or pass --ours-only)",
              file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="portable-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("store", "restic-repo", "restic-cache", "rclone-dest", "restored", "restic-restored",
                 "tar-restored"):
        if os.path.ismount(work / name):  # left by a run that was killed
            subprocess.run(["umount", str(work / name)], check=True)
        (work / f"{name}.ext4").unlink(missing_ok=True)
        remove_tree(work / name)
    remove_tree(work / "src" / ".portable")
    bench = Bench(work, args.files, args.per_dir, tools)
    bench.with_journal, bench.restore = not args.no_journal, not args.no_restore
    bench.journal_idle_s = args.journal_idle
    if args.verify_rounds < 1 or args.restore_rounds < 1:
        print("error: --verify-rounds and --restore-rounds must be 1 or more", file=sys.stderr)
        return 2
    if args.restore_fs == "fresh" and not fresh_ok:
        print("error: --restore-fs fresh needs root, mkfs.ext4 and mount", file=sys.stderr)
        return 2
    bench.verify_rounds, bench.phases = args.verify_rounds, args.phases
    bench.restore_rounds, bench.fresh_fs = args.restore_rounds, args.restore_fs == "fresh"
    try:
        bench.run()
    finally:
        bench.release_all()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    targets = bench.report()
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "files": args.files, "per_dir": args.per_dir,
            "cells": [{"row": r, "tool": t, **c} for (r, t), c in bench.cells.items()],
            "written": bench.written, "journal": bench.journal, "verify_rounds": bench.rounds,
            "restore_rounds": bench.restore_log, "restore_fs": args.restore_fs,
            "phases": bench.phase_lines,
            "targets": [{"target": n, "met": ok, "value": v} for n, ok, v in targets]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
