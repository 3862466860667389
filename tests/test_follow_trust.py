"""The follow loop trusts no path from the worker (issue 28, item 2). A real worker agent
process answers ``GET /tree`` and ``POST /read``, changed as the rented machine's root could
change it: its listing names files outside the workspace (``../``, absolute, through a symlink
of the user's copy, under ``.portable/``) with the hashes of what is there, then drops them, as
if the kernel had deleted them. The user's side (orchestration/follow.py) reads, writes and
deletes none of them, and deletes only a file it received from the worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.compute.base import Allocation
from jupyter_portable.core import lifecycle as L
from jupyter_portable.orchestration.follow import Follower
from jupyter_portable.store.repo import digest
from jupyter_portable.worker.client import AgentClient, AgentRecord
from jupyter_portable.worker.protocol import READY_PREFIX

pytestmark = pytest.mark.timeout(180)

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

# The worker as the machine's root may change it: its listing and its reads add what a JSON file says.
HOSTILE = r'''
import base64, json, os, runpy
from jupyter_portable.store.repo import digest
from jupyter_portable.worker import api, follow
EXTRA = os.environ["HOSTILE_LISTING"]  # read now: the worker keeps only the variables it allows
def extra():
    with open(EXTRA) as fh:
        return json.load(fh)
real_tree, real_read = follow.FileHashes.tree, api.read_file
def tree(self, state):
    out = real_tree(self, state)
    out["files"] += extra()["files"]
    return out
def read_file(state, rel):
    served = extra()["serve"]
    if rel not in served:
        return real_read(state, rel)
    data = served[rel].encode()
    return {"path": rel, "hash": digest(data), "size": len(data), "content": base64.b64encode(data).decode()}
follow.FileHashes.tree, api.read_file = tree, read_file
runpy.run_module("jupyter_portable.worker", run_name="__main__", alter_sys=True)
'''


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[SimpleNamespace]:
    home = tmp_path / "home"
    write_tree(home, {"secret.txt": "top secret\n", "empty": "", "laptop/train.py": "print('training')\n"})
    ws = Workspace.init(home / "laptop", f"file://{tmp_path}/store")
    ws.snapshot("first", progress=None)
    epoch = ws.store.claim_epoch(ws.workspace_id)
    work, listing = tmp_path / "machine" / "work", tmp_path / "hostile.json"
    listing.write_text(json.dumps({"files": [], "serve": {}}))
    config = {"store": ws.config.store, "workspace_id": ws.workspace_id, "allocation_id": "al-hostile",
              "version": 1, "epoch": epoch, "workdir": str(work), "state_dir": str(tmp_path / "machine" / "agent")}
    proc = subprocess.Popen([sys.executable, "-c", HOSTILE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "HOSTILE_LISTING": str(listing)})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()
    line = proc.stdout.readline()
    assert line.startswith(READY_PREFIX), line
    ready = json.loads(line[len(READY_PREFIX):])
    allocation = Allocation("al-hostile", "local", "hostile", str(proc.pid), "2030-01-02T03:04:05Z")
    client = AgentClient(AgentRecord(allocation, int(ready["port"]), proc.pid, str(ready["token"]), str(work)))
    try:
        for _ in range(600):
            if client.request("GET", "/status")["phase"] in ("ready", "failed"):
                break
            time.sleep(0.1)
        lc = SimpleNamespace(state=L.ACTIVE, allocation_id="al-hostile", events=[], version=1)
        orch = SimpleNamespace(lifecycle=lambda: lc, client=lambda: client)
        follower = Follower(ws, lambda: orch, synced={}, clock=lambda: T0)
        yield SimpleNamespace(home=home, root=home / "laptop", work=work, listing=listing, follower=follower)
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_paths_from_the_worker_outside_the_copy_are_never_read_written_or_deleted(setup: SimpleNamespace) -> None:
    home, root = setup.home, setup.root
    (root / "escape").symlink_to(home)  # the user's own link out of the copy, not in any version
    config = (root / ".portable" / "workspace.json").read_bytes()
    secret, empty = digest(b"top secret\n"), digest(b"")
    hostile = [("../secret.txt", secret), (str(home / "empty"), empty), ("escape/secret.txt", secret),
               (".portable/workspace.json", digest(config)), ("./empty", empty), ("../planted.py", digest(b"pwned")),
               ("escape/planted.py", digest(b"pwned"))]
    setup.listing.write_text(json.dumps({
        "files": [{"path": p, "size": 1, "hash": h} for p, h in hostile],
        "serve": {"../planted.py": "pwned", "escape/planted.py": "pwned"}}))
    (setup.work / "made.txt").write_text("made on the machine\n")  # a file the kernel wrote there

    first = setup.follower.tick(T0)
    assert first.pulled == ["made.txt"] and first.removed == [], first
    assert len(first.errors) == len(hostile), first.errors
    for path, _ in hostile:
        assert any(path in e for e in first.errors), (path, first.errors)
    assert (root / "made.txt").read_text() == "made on the machine\n"

    # the worker drops them all, and the two files the copies share
    setup.listing.write_text(json.dumps({"files": [], "serve": {}}))
    (setup.work / "made.txt").unlink()
    (setup.work / "train.py").unlink()
    second = setup.follower.tick(T0)
    assert second.removed == ["made.txt"], second  # the one file this copy received from the worker
    assert not (root / "made.txt").exists()
    assert (home / "secret.txt").read_text() == "top secret\n" and (home / "empty").exists()
    assert (root / ".portable" / "workspace.json").read_bytes() == config
    # a file the user's side had on its own stays, though it has the content the worker listed
    assert (root / "train.py").read_text() == "print('training')\n"
    assert not (home / "planted.py").exists() and not (root / "planted.py").exists()
    assert sorted(p.name for p in home.iterdir()) == ["empty", "laptop", "secret.txt"]
