"""Lazy restore: large files come later, a file asked for comes first, status shows what is left."""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import read_tree, write_tree

from jupyter_portable import Workspace
from jupyter_portable.engine.restore import restore
from jupyter_portable.store.repo import Store


def _source(tmp_path: Path, store: str) -> tuple[Workspace, dict]:
    src = tmp_path / "src"
    write_tree(src, {"small.txt": "s", "ckpt/a.bin": os.urandom(3_000_000), "ckpt/b.bin": os.urandom(2_000_000),
                     "data/c.bin": os.urandom(1_500_000)})
    ws = Workspace.init(src, store)
    ws.snapshot(progress=None)
    return ws, read_tree(src)


def test_lazy_restore_pending_then_fetched_on_demand(store_url: str, tmp_path: Path, cli) -> None:
    ws, expected = _source(tmp_path, store_url)
    dest = tmp_path / "dest"
    res = restore(Store.open(store_url), ws.workspace_id, dest, lazy=True, lazy_threshold=1_000_000,
                  start_fetcher=False)
    assert res.pending == ["ckpt/a.bin", "ckpt/b.bin", "data/c.bin"]
    assert (dest / "small.txt").read_text() == "s"
    assert not (dest / "ckpt" / "a.bin").exists()
    st = cli.json("status", cwd=dest)
    assert st["pending"] == ["ckpt/a.bin", "ckpt/b.bin", "data/c.bin"]
    v = cli("verify", "--json", cwd=dest, check=False)
    assert v.returncode == 1 and "not fetched yet" in v.stdout
    # A snapshot while files are pending keeps them: nothing is lost, nothing changes.
    snap = cli.json("snapshot", cwd=dest)
    assert snap["changed"] is False and snap["files"] == 4
    # Asking for a file fetches it ahead of the queue.
    cli.json("fetch", "ckpt/b.bin", cwd=dest)
    assert (dest / "ckpt" / "b.bin").read_bytes() == expected["ckpt/b.bin"][0]
    assert cli.json("status", cwd=dest)["pending"] == ["ckpt/a.bin", "data/c.bin"]
    Workspace.find(dest).fetch("ckpt/a.bin")
    Workspace.find(dest).fetch("data/c.bin")
    assert cli.json("status", cwd=dest)["pending"] == []
    assert cli.json("verify", cwd=dest)["ok"] is True
    assert read_tree(dest) == expected


def test_background_fetch_completes(file_store: str, tmp_path: Path, cli) -> None:
    ws, expected = _source(tmp_path, file_store)
    dest = tmp_path / "dest"
    res = cli.json("restore", "--store", file_store, "--workspace", ws.workspace_id, "--lazy",
                   "--lazy-threshold", "1000000", str(dest))
    assert sorted(res["pending"]) == ["ckpt/a.bin", "ckpt/b.bin", "data/c.bin"]
    deadline = time.monotonic() + 60
    while cli.json("status", cwd=dest)["pending"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cli.json("status", cwd=dest)["pending"] == []
    assert cli.json("verify", cwd=dest)["ok"] is True
    assert read_tree(dest) == expected


def test_a_byte_range_reads_only_the_parts_that_hold_it(store_url: str, tmp_path: Path) -> None:
    from jupyter_portable.engine.snapshot import PART_SIZE

    src = tmp_path / "src"
    data = os.urandom(2 * PART_SIZE + 1000)
    write_tree(src, {"big.bin": data, "small.txt": "hello world"})
    ws = Workspace.init(src, store_url)
    ws.snapshot(progress=None)
    store = Store.open(store_url)
    files = store.read_manifest(ws.workspace_id).by_path()
    big = files["big.bin"]
    assert len(big.parts) == 3
    start = PART_SIZE + 10
    # Remove the first part: a read of the second part alone must still work.
    store.backend.delete(f"objects/{big.parts[0][0][:2]}/{big.parts[0][0]}")
    assert store.read_file_range(big, start, start + 100) == data[start:start + 100]
    assert store.read_file_range(big, 2 * PART_SIZE - 5, 2 * PART_SIZE + 5) == data[2 * PART_SIZE - 5:2 * PART_SIZE + 5]
    assert store.read_file_range(files["small.txt"], 6, 100) == b"world"
