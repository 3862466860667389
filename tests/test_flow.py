"""The new user's path: init, snapshot, edit, snapshot, restore both versions, verify."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import read_tree, write_tree


def test_two_versions_restore_identically_and_verify(cli, store_url: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    big = os.urandom(3 * 1024 * 1024 + 17)  # above the pack threshold: stored in parts
    write_tree(work, {"train.py": "print('hi')\n", "data/a.csv": "x,y\n1,2\n",
                      "data/b.csv": "x,y\n3,4\n", "weights/model.bin": big, "empty.txt": b"",
                      "__pycache__/junk.pyc": b"ignored", ".ipynb_checkpoints/n.ipynb": "{}"})
    os.chmod(work / "train.py", 0o755)
    os.symlink("data/a.csv", work / "latest.csv")

    init = cli.json("init", str(work), "--store", store_url)
    ws = init["workspace_id"]
    assert init["store"].rstrip("/") == store_url.rstrip("/")
    assert (work / ".portable" / "workspace.json").is_file()

    v1 = cli.json("snapshot", "-m", "first", cwd=work)
    assert (v1["workspace_id"], v1["version"], v1["files"]) == (ws, 1, 6)
    assert v1["new_bytes"] >= len(big)
    before = read_tree(work)
    before.pop("__pycache__/junk.pyc")
    before.pop(".ipynb_checkpoints/n.ipynb")

    # Edit, add and delete files.
    (work / "train.py").write_text("print('hello')\n")
    (work / "data" / "b.csv").unlink()
    write_tree(work, {"data/c.csv": "x,y\n5,6\n", "notes/todo.md": "- more epochs\n"})
    v2 = cli.json("snapshot", "-m", "second", cwd=work)
    assert v2["version"] == 2 and v2["files"] == 7
    assert v2["new_bytes"] < 1000, "only the small changed files are uploaded"
    after = read_tree(work)
    after.pop("__pycache__/junk.pyc")
    after.pop(".ipynb_checkpoints/n.ipynb")

    log = cli.json("log", cwd=work)
    assert [v["version"] for v in log["versions"]] == [2, 1]
    assert [v["message"] for v in log["versions"]] == ["second", "first"]

    for version, expected in ((1, before), (2, after)):
        dest = tmp_path / f"restored-v{version}"
        res = cli.json("restore", "--store", store_url, "--workspace", ws, "--version", str(version), str(dest))
        assert (res["version"], res["pending"]) == (version, [])
        assert read_tree(dest) == expected
        assert cli.json("verify", cwd=dest) == {"ok": True, "version": version, "files": len(expected),
                                                "mismatches": []}
        st = cli.json("status", cwd=dest)
        assert (st["workspace_id"], st["version"], st["head_version"]) == (ws, version, 2)

    # Flip one byte: verify names the file and exits non-zero.
    dest = tmp_path / "restored-v2"
    target = dest / "data" / "c.csv"
    raw = bytearray(target.read_bytes())
    raw[0] ^= 0xFF
    target.write_bytes(bytes(raw))
    proc = cli("verify", "--json", cwd=dest, check=False)
    assert proc.returncode == 1
    import json

    out = json.loads(proc.stdout)
    assert out["ok"] is False
    assert out["mismatches"] == [{"path": "data/c.csv", "reason": "content differs (hash mismatch)"}]

    fsck = cli.json("fsck", "--store", store_url, "--read-data")
    assert fsck["ok"] is True and fsck["errors"] == [] and fsck["manifests"] == 2


def test_history_goes_on_from_a_restored_copy(cli, store_url: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    write_tree(work, {"a.txt": "one"})
    ws = cli.json("init", str(work), "--store", store_url)["workspace_id"]
    cli.json("snapshot", cwd=work)
    copy = tmp_path / "copy"
    cli.json("restore", "--store", store_url, "--workspace", ws, str(copy))
    (copy / "b.txt").write_text("from the copy")
    res = cli.json("snapshot", cwd=copy)
    assert res["version"] == 2
    # The original copy is now behind: it gets a clear conflict, not a fork.
    (work / "a.txt").write_text("changed here")
    proc = cli("snapshot", cwd=work, check=False)
    assert proc.returncode == 1
    assert "moved" in proc.stderr or "version 2" in proc.stderr
    assert proc.stderr.count("\n") == 1, "a failure is one line on stderr"
    assert "--force" in proc.stderr
    forced = cli.json("snapshot", "--force", cwd=work)
    assert forced["version"] == 3
    assert [v["version"] for v in cli.json("log", cwd=work)["versions"]] == [3, 2, 1]


def test_unchanged_files_are_never_reread(file_store: str, tmp_path: Path) -> None:
    from jupyter_portable import Workspace

    work = tmp_path / "w"
    write_tree(work, {f"d{i % 7}/f{i}.txt": f"file {i}" for i in range(200)})
    old = 1_600_000_000
    for p in work.rglob("*.txt"):
        os.utime(p, (old, old))
    ws = Workspace.init(work, file_store)
    first = ws.snapshot(progress=None)
    assert first.hashed == 200
    again = ws.snapshot(progress=None)
    assert (again.changed, again.hashed, again.version) == (False, 0, 1)
    (work / "d1" / "f1.txt").write_text("edited")
    third = ws.snapshot(progress=None)
    assert (third.changed, third.hashed, third.version) == (True, 1, 2)


def test_portableignore_and_defaults(file_store: str, tmp_path: Path) -> None:
    from jupyter_portable import Workspace

    work = tmp_path / "w"
    write_tree(work, {".portableignore": "*.log\nscratch/\n!keep.log\n", "a.log": "x", "keep.log": "k",
                      "scratch/tmp.bin": "s", "node_modules/x/index.js": "j", ".venv/bin/python": "p",
                      "src/__pycache__/m.pyc": "c", "src/m.py": "m"})
    ws = Workspace.init(work, file_store)
    ws.snapshot(progress=None)
    names = sorted(f.path for f in ws.store.read_manifest(ws.workspace_id).files)
    assert names == [".portableignore", "keep.log", "src/m.py"]


def test_cli_failures_are_one_line(cli, tmp_path: Path) -> None:
    proc = cli("snapshot", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert proc.stderr.startswith("error: no workspace at") and proc.stderr.count("\n") == 1
    proc = cli("restore", "--store", "gopher://x", "--workspace", "ws-abc", str(tmp_path / "d"), check=False)
    assert proc.returncode != 0 and "cannot publish atomically" in proc.stderr
    proc = cli("init", str(tmp_path / "z"), "--store", "s3://key:secret@bucket/p", check=False)
    assert proc.returncode != 0 and "credentials" in proc.stderr and "secret" not in proc.stderr


def test_a_file_being_written_waits_for_the_next_snapshot(file_store: str, tmp_path: Path) -> None:
    import threading
    import time

    from jupyter_portable import Workspace

    work = tmp_path / "w"
    write_tree(work, {"done.txt": "finished", "log.bin": os.urandom(8 * 1024 * 1024)})
    ws = Workspace.init(work, file_store)
    first = ws.snapshot(progress=None)
    before = ws.store.read_manifest(ws.workspace_id).by_path()["log.bin"].hash
    stop = threading.Event()

    def writer() -> None:
        with open(work / "log.bin", "ab") as fh:
            while not stop.is_set():
                fh.write(b"y" * 65536)
                fh.flush()
                time.sleep(0.0005)

    t = threading.Thread(target=writer)
    t.start()
    try:
        time.sleep(0.05)
        (work / "other.txt").write_text("new")
        second = ws.snapshot(progress=None)
    finally:
        stop.set()
        t.join()
    assert second.skipped == ["log.bin"]
    files = ws.store.read_manifest(ws.workspace_id).by_path()
    assert files["log.bin"].hash == before, "the previous version of the file stays"
    assert "other.txt" in files and second.version == first.version + 1
    third = ws.snapshot(progress=None)  # once the writer is done, the file is taken
    assert third.skipped == [] and ws.store.read_manifest(ws.workspace_id).by_path()["log.bin"].hash != before


def test_allocation_history_is_recorded_and_updated(file_store: str, tmp_path: Path) -> None:
    from jupyter_portable import Workspace

    work = tmp_path / "w"
    write_tree(work, {"a.txt": "a"})
    ws = Workspace.init(work, file_store)
    ws.snapshot(progress=None)
    ws.record_allocation({"allocation_id": "al-1", "provider": "local", "offer": "a100", "state": "active",
                          "started": "2026-11-30T10:00:00Z", "failures": []})
    ws.record_allocation({"allocation_id": "al-1", "provider": "local", "offer": "a100", "state": "released",
                          "started": "2026-11-30T10:00:00Z", "stopped": "2026-11-30T12:00:00Z",
                          "stop_reason": "sealed by the user", "spend": 3.78, "failures": []})
    history = ws.manifest().allocations
    assert len(history) == 1 and history[0]["state"] == "released" and history[0]["spend"] == 3.78
    assert ws.status()["allocation"]["stop_reason"] == "sealed by the user"
    assert [v["version"] for v in ws.log()] == [3, 2, 1]
    import pytest

    from jupyter_portable import ManifestError
    with pytest.raises(ManifestError):
        ws.record_allocation({"allocation_id": "al-2", "api_key": "nope"})
