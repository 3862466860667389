"""bench/scale.py as `make bench-scale` runs it (every tool, the journal, restore, verify), at a
size that takes seconds: a change to the bench that breaks its end fails here, not an hour into a
million-file run. Not a timing: only that every row is there and every tool saw the same tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCALE = Path(__file__).resolve().parents[1] / "bench" / "scale.py"
ROWS = ("cold snapshot", "no change", "one file changed", "restore", "verify")
TOOLS = ("ours", "restic", "rclone")
NO_ROW = {("restore", "rclone")}  # rclone's copy is the folder itself: it has no restore


def tables(stdout: str) -> list[dict[str, list[str]]]:
    """The printed tables, in order, each {first cell: the other cells} (the header's under "")."""
    out: list[dict[str, list[str]]] = []
    previous = ""
    for line in stdout.splitlines():
        if line.startswith("| "):
            if not previous.startswith("|"):
                out.append({})
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[-1][cells[0]] = cells[1:]
        previous = line
    return out


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path, the bench's own (.portable, .built) left out."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".portable"]
        for name in files:
            path = Path(dirpath, name)
            if path.relative_to(root).as_posix() != ".built":
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def test_the_default_bench_runs_to_its_end_with_every_tool_on_one_tree(tmp_path: Path) -> None:
    missing = [tool for tool in ("restic", "rclone") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not on PATH: this test runs bench/scale.py with them. To fix: "
                    "scripts/bench-tools.sh (Debian's restic and rclone packages, through apt-get)")
    work, report = tmp_path / "work", tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(SCALE), "--files", "2000", "--per-dir", "100", "--journal-idle", "1",
                           "--work", str(work), "--json-out", str(report)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"bench/scale.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}"

    main, journal = tables(proc.stdout)
    assert main[""] == list(TOOLS)
    for row in ROWS:
        for tool, cell in zip(TOOLS, main[row], strict=True):
            if (row, tool) not in NO_ROW:
                assert cell.endswith(" MB)"), (row, tool, main[row])
    assert "restore's floor, `tar -xf`" in proc.stdout
    for row in ("journal: no change", "journal: one file changed"):
        assert journal[row][1] == "journal", (row, journal[row])
    got = json.loads(report.read_text())
    assert got["journal"]["journal: put back (untimed)"]["changed"] is True
    scrub = got["journal"]["scrub, one auto-snapshot's (default budget)"]  # issue 41: its cost is a row
    assert journal["scrub, one auto-snapshot's (default budget)"][1] == "scrub"
    assert scrub["files"] > 0 and scrub["mismatched"] == 0, scrub
    assert {t["target"] for t in got["targets"]} >= {"verify <= restic (check --read-data)",
                                                     "watcher CPU < 1% of a core while idle"}

    # the journal's rows changed a file after the peers' last snapshot and put it back: ours's last
    # snapshot, restic's and rclone's copy are all of the tree as it is now
    source = files_of(work / "src")
    assert len(source) == 2000
    env = dict(os.environ, RESTIC_PASSWORD="bench-scale", RESTIC_CACHE_DIR=str(work / "restic-cache"))
    ws = json.loads((work / "src" / ".portable" / "workspace.json").read_text())["workspace_id"]
    subprocess.run([sys.executable, "-m", "jupyter_portable", "restore", "--store", f"file://{work / 'store'}",
                    "--workspace", ws, str(tmp_path / "ours")], check=True, capture_output=True, env=env)
    subprocess.run(["restic", "-q", "-r", str(work / "restic-repo"), "restore", "latest", "--target",
                    str(tmp_path / "restic")], check=True, capture_output=True, env=env)
    for copy in (tmp_path / "ours", tmp_path / "restic", work / "rclone-dest"):
        seen = files_of(copy)
        differ = sorted(path for path in seen.keys() | source.keys() if seen.get(path) != source.get(path))
        assert not differ, f"{copy} is not the source tree: {differ[:5]}"
