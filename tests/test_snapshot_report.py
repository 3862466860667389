"""A snapshot's report is honest: ``new_bytes`` is what was written to the store, and every file
not backed up is in ``skipped``, with its reason in ``special``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import write_tree


def test_a_renamed_large_file_is_not_new(tmp_path: Path, file_store: str, cli: Any) -> None:
    src = tmp_path / "src"
    write_tree(src, {"big.bin": os.urandom(20_000_000), "a.txt": "a\n"})
    cli("init", "--store", file_store, cwd=src)
    assert cli.json("snapshot", "-q", cwd=src)["new_bytes"] >= 20_000_000
    os.rename(src / "big.bin", src / "moved.bin")
    proc = cli("snapshot", "--json", cwd=src)
    out = json.loads(proc.stdout)
    assert out["changed"] and out["new_bytes"] == 0, out
    assert ", 0 B new" in proc.stderr, proc.stderr


def test_every_file_not_backed_up_is_skipped_with_its_reason(tmp_path: Path, file_store: str, cli: Any) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a\n", "back\\slash.txt": "b\n"})
    os.symlink("/etc/passwd", src / "absolute-link")
    os.symlink("../../outside", src / "escaping-link")
    os.symlink("a.txt", src / "fine-link")
    os.mkfifo(src / "pipe")
    cli("init", "--store", file_store, cwd=src)
    for run in range(2):  # the second snapshot changes nothing, and says the same
        proc = cli("snapshot", "--json", cwd=src)
        out = json.loads(proc.stdout)
        assert run == 1 or "; 4 not backed up" in proc.stderr, proc.stderr
        assert out["skipped"] == sorted(["absolute-link", "back\\slash.txt", "escaping-link", "pipe"]), out
        reasons = {s["path"]: s["kind"] for s in out["special"]}
        assert reasons == {"absolute-link": "symlink leading outside the workspace",
                           "escaping-link": "symlink leading outside the workspace",
                           "back\\slash.txt": "name with a backslash", "pipe": "FIFO"}, reasons
    restored = tmp_path / "dest"
    wsid = cli.json("status", cwd=src)["workspace_id"]
    cli("restore", "-q", "--store", file_store, "--workspace", wsid, str(restored))
    assert sorted(os.listdir(restored)) == [".portable", "a.txt", "fine-link"]
