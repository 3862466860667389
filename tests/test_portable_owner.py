"""The copy is the one owner of ``.portable/``: what it keeps there is its table (``KEPT_FILES``),
under the names existing workspaces hold, and nothing above ``workdir/`` builds a path into it.

Crash safety of those writes is checked in tests/test_crash.py (a kill inside the copy's writer)."""

from __future__ import annotations

import fnmatch
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from jupyter_portable.core.errors import ConflictError, UnsafePath
from jupyter_portable.core.lifecycle import ROUTING, transition
from jupyter_portable.core.manifest import FileEntry
from jupyter_portable.workdir import conflicts, follow_record, lifecycle_file, next_action, pending
from jupyter_portable.workdir.workcopy import KEPT_FILES, CopyConfig, WorkspaceCopy

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_portable"
# a path built into .portable/ (``root / ".portable"``, ``".portable" / x``), or the copy's folder itself
_REACHES_IN = re.compile(r"""/\s*["']\.portable["']|["']\.portable/?["']\s*/|\bcopy\._?meta\b|\bPORTABLE_DIR\b""")


def test_nothing_above_workdir_builds_a_path_into_portable() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "workdir":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _REACHES_IN.search(line.split("#")[0]):
                found.append(f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}")
    assert not found, "write these through a named method of WorkspaceCopy:\n" + "\n".join(found)


def _every_file(copy: WorkspaceCopy) -> dict[str, int]:
    meta = copy.root / ".portable"
    return {p.relative_to(meta).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in meta.rglob("*") if p.is_file()}


def test_what_the_copy_keeps_is_its_table_under_the_names_on_disk(tmp_path: Path) -> None:
    copy = WorkspaceCopy(tmp_path)
    copy.write_config(CopyConfig("ws-owner", f"file://{tmp_path / 'store'}"))
    lifecycle_file.update(copy, lambda lc: transition(lc, ROUTING, at="2026-05-01T10:00:01Z"))
    with copy.continue_lock():
        with pytest.raises(ConflictError, match="already running"):
            with copy.continue_lock(busy="a Continue or Stop of this workspace is already running"):
                pass
    copy.write_agent("alloc-1", b'{"token": "t"}')
    copy.write_agent_allocation("alloc-1", b"{}")
    copy.write_unrecorded_reservations(b"[]")
    entry = FileEntry("big.bin", size=1, hash="ab" * 32, parts=(("ab" * 32, 1),))
    pending.write_pending(copy, 1, [entry])
    with copy.pending_lock(), copy.fetch_lock(entry.hash), copy.fetcher_lock():
        copy.open_fetcher_log().close()
    conflicts.add_conflict(copy, "a.txt", "2026-01-01T00:00:00Z", "a.conflict.txt")
    follow_record.write_agreed(copy, "alloc-1", {"a.txt": "h"})
    next_action.update_next_action(copy, text="train")
    copy.write_inbound_allow([".venv/"])
    copy.write_runtime(b"{}")
    copy.write_inflight("123-1-1", b"{}")
    copy.write_intent(1, "ab" * 32)
    copy.write_restoring("ws-owner")
    copy.tmp_dir.mkdir()
    (copy.tmp_dir / "restore-1").write_bytes(b"")
    with copy.statcache() as cache:
        cache.set_version(1)

    files = _every_file(copy)
    for name in files:
        assert any(fnmatch.fnmatchcase(name, k.name) for k in KEPT_FILES), f"{name} is not in KEPT_FILES"
    for kept in KEPT_FILES:
        if kept.name != "statcache.sqlite-*":  # sqlite's journal comes and goes
            assert any(fnmatch.fnmatchcase(name, kept.name) for name in files), f"nothing wrote {kept.name}"
    # the names existing workspaces hold
    assert {"workspace.json", "lifecycle.json", "lifecycle.lock", "continue.lock", "pending.json", "pending.lock",
            "fetcher.lock", "lazy.log", "conflicts.json", "follow.json", "next_action.json", "runtime.json",
            "publishing.json", "restoring.json", "unrecorded-reservations.json", "statcache.sqlite",
            "agents/alloc-1.json", "agents/alloc-1.allocation.json", f"locks/{entry.hash}.lock"} <= set(files)
    # what holds a token or a paid booking is the user's alone
    assert files["agents/alloc-1.json"] == 0o600 and files["unrecorded-reservations.json"] == 0o600
    assert stat.S_IMODE((copy.root / ".portable" / "agents").stat().st_mode) == 0o700
    assert copy.agent_bytes("alloc-1") == b'{"token": "t"}' and copy.agent_bytes("alloc-2") is None
    copy.forget_agent("alloc-1")
    assert copy.agent_bytes("alloc-1") is None and copy.agent_allocation_bytes("alloc-1") is None
    assert pending.read_pending(copy) == (1, [entry])
    copy.clear_pending()
    assert pending.read_pending(copy) == (0, [])


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".."])
def test_a_name_that_leads_out_of_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    copy = WorkspaceCopy(tmp_path)
    with pytest.raises(UnsafePath):
        copy.write_agent(name, b"{}")
    with pytest.raises(UnsafePath):
        copy.fetch_lock(name)
    assert not (tmp_path / "escape").exists() and not (tmp_path / ".portable" / "agents" / "a").exists()


def _add_conflicts(root: str, who: int, count: int, start: Any) -> None:
    copy = WorkspaceCopy(Path(root))
    start.wait()
    for i in range(count):
        conflicts.add_conflict(copy, f"w{who}-{i}.txt", "2026-01-01T00:00:00Z", f"w{who}-{i}.conflict.txt")


def test_two_writers_of_the_conflicts_each_keep_theirs(tmp_path: Path) -> None:
    """The server's monitor and its follow loop both add conflicts: a read and write under the
    copy's conflicts lock, so neither loses the other's entry (without it, entries went missing)."""
    import multiprocessing

    copy = WorkspaceCopy(tmp_path)
    copy.write_config(CopyConfig("ws-owner", f"file://{tmp_path / 'store'}"))
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_add_conflicts, args=(str(tmp_path), who, 45, start)) for who in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    paths = [c["path"] for c in conflicts.read_conflicts(copy)]
    assert sorted(paths) == sorted(f"w{who}-{i}.txt" for who in range(2) for i in range(45))
