"""The change journal (engine/journal) and the snapshots that trust it: real inotify on this
Linux, a real store. The journal is a hint: a snapshot that trusts it publishes exactly the
tree a full walk of the same folder publishes, and anything that could hide a change makes
the next snapshot walk the whole tree."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_portable import Workspace
from jupyter_portable.engine.journal import ChangeJournal, available
from jupyter_portable.engine.listing import Lister
from jupyter_portable.engine.snapshot import SnapshotResult

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no change journal here: {available()}")


class Clock:
    """Seconds passed in as ``now``; tests move it by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _root_tree(ws: Workspace) -> str:
    head, _ = ws.store.read_head(ws.workspace_id)
    tree = ws.store.read_manifest(ws.workspace_id, head.version).tree
    assert tree is not None
    return tree


def _snap(ws: Workspace, journal: ChangeJournal, clock: Clock, *, force: bool = False) -> SnapshotResult:
    return ws.snapshot(progress=None, journal=journal.cut(now=clock()), force=force)


def _journal_and_full(ws: Workspace, journal: ChangeJournal, clock: Clock) -> SnapshotResult:
    """A journal snapshot, then a full walk that reads every file again (force: the stat cache
    is not trusted); both must publish the same tree. The full walk takes a cut too, so the
    journal goes on being trusted after it."""
    by_journal = _snap(ws, journal, clock)
    tree = _root_tree(ws)
    full = _snap(ws, journal, clock, force=True)
    assert full.walk == "full"
    assert _root_tree(ws) == tree, f"the journal snapshot ({by_journal.walk}) published another tree than a full walk"
    return by_journal


@pytest.fixture
def workspace(tmp_path: Path):  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "x.txt").write_text("x")
    (src / "c").mkdir()
    (src / "c" / "y.txt").write_text("y")
    ws = Workspace.init(src, str(tmp_path / "store"))
    with ChangeJournal(src) as journal:
        clock = Clock()
        first = _snap(ws, journal, clock)
        assert first.walk == "full" and first.walk_reason == "the watcher has just started"
        yield src, ws, journal, clock


def test_a_one_file_change_lists_only_the_folders_on_the_way(workspace, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    listed: list[str] = []
    real_list, real_quick = Lister.list, Lister.quick
    monkeypatch.setattr(Lister, "list", lambda self, rel, path: listed.append(rel) or real_list(self, rel, path))
    monkeypatch.setattr(Lister, "quick", lambda self, rel, path: listed.append(rel) or real_quick(self, rel, path))
    (src / "a" / "b" / "x.txt").write_text("changed")
    res = _snap(ws, journal, clock)
    assert res.changed and res.walk == "journal" and res.hashed == 1
    assert set(listed) == {"", "a", "a/b"}, "folder c was looked at though nothing in it changed"
    listed.clear()
    res = _snap(ws, journal, clock)
    assert not res.changed and res.walk == "journal"
    assert listed == [], "a no-change journal snapshot looks at no folder"


def test_a_snapshot_without_the_journal_in_between_makes_the_next_one_walk(workspace) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    (src / "c" / "y.txt").write_text("y2")
    ws.snapshot(progress=None)  # e.g. `jupyter portable snapshot` from a terminal
    res = _snap(ws, journal, clock)
    assert res.walk == "full" and "previous cut" in (res.walk_reason or "")
    assert _snap(ws, journal, clock).walk == "journal"


def test_a_new_watcher_is_not_trusted_until_it_has_cut_once(workspace) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    with ChangeJournal(src) as other:  # a restart: the old watcher's changes are not the new one's
        (src / "c" / "y.txt").write_text("y3")
        assert _snap(ws, other, clock).walk == "full"
        (src / "c" / "z.txt").write_text("z")
        res = _snap(ws, other, clock)
        assert res.walk == "journal" and res.changed
    res = _snap(ws, journal, clock)  # the first watcher's cuts no longer match the stat cache
    assert res.walk == "full"


def test_a_full_walk_runs_on_the_schedule(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("f")
    ws = Workspace.init(src, str(tmp_path / "store"))
    clock = Clock()
    with ChangeJournal(src, full_every_s=600) as journal:
        assert _snap(ws, journal, clock).walk == "full"
        clock.t += 599
        assert _snap(ws, journal, clock).walk == "journal"
        clock.t += 1
        res = _snap(ws, journal, clock)
        assert res.walk == "full" and "full walk is due" in (res.walk_reason or "")
        clock.t += 1
        assert _snap(ws, journal, clock).walk == "journal"


def test_an_overflowed_event_queue_makes_the_next_snapshot_walk(workspace) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    many = src / "many"
    many.mkdir()
    _snap(ws, journal, clock)
    with journal._lock:  # the reader held up, as a busy machine would: the kernel's queue fills
        for i in range(limit // 2 + 100):
            (many / f"f{i}").write_bytes(b"")  # a CREATE and a CLOSE_WRITE each
    res = _snap(ws, journal, clock)
    assert res.walk == "full" and "IN_Q_OVERFLOW" in (res.walk_reason or "")
    assert res.files == 2 + limit // 2 + 100
    (many / "f0").write_text("after")  # watched again after the overflow
    res = _journal_and_full(ws, journal, clock)
    assert res.walk == "journal" and res.changed


def test_a_folder_that_cannot_be_watched_makes_every_snapshot_walk_until_it_can(  # type: ignore[no-untyped-def]
        workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    import inotify_simple

    src, ws, journal, clock = workspace
    real = inotify_simple.INotify.add_watch

    def at_the_limit(self, path, mask):  # type: ignore[no-untyped-def]
        if os.path.basename(path) == "new":  # fs.inotify.max_user_watches reached by this folder
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, path, mask)

    monkeypatch.setattr(inotify_simple.INotify, "add_watch", at_the_limit)
    (src / "c" / "new").mkdir()
    (src / "c" / "new" / "f").write_text("f")
    res = _snap(ws, journal, clock)
    assert res.walk == "full" and "max_user_watches" in (res.walk_reason or "") and res.files == 3
    (src / "c" / "new" / "f").write_text("unwatched")  # no journal could see this
    res = _snap(ws, journal, clock)
    assert res.walk == "full" and res.changed, "watching afresh at the cut failed again: still a full walk"
    monkeypatch.undo()
    assert _snap(ws, journal, clock).walk == "full"  # the cut that watched everything again
    (src / "c" / "new" / "f").write_text("watched")
    res = _journal_and_full(ws, journal, clock)
    assert res.walk == "journal" and res.changed


def test_changed_ignore_rules_make_the_next_snapshot_walk(workspace) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    (src / ".portableignore").write_text("c/\n")
    res = _snap(ws, journal, clock)
    assert res.walk == "full" and ".portableignore" in (res.walk_reason or "")
    assert res.files == 2  # a/b/x.txt and the ignore file; c/ is left out


def test_a_folder_no_longer_ignored_is_watched_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "y.txt").write_text("y")
    (src / ".portableignore").write_text("c/\n")
    ws = Workspace.init(src, str(tmp_path / "store"))
    clock = Clock()
    with ChangeJournal(src) as journal:  # started while c/ is ignored: c/ is not watched
        assert _snap(ws, journal, clock).files == 1
        (src / ".portableignore").unlink()
        res = _snap(ws, journal, clock)
        assert res.walk == "full" and res.files == 1
        (src / "c" / "y.txt").write_text("watched now")
        res = _journal_and_full(ws, journal, clock)
        assert res.walk == "journal" and res.changed and res.hashed == 1


def test_a_new_folder_is_watched_and_walked_whole(workspace) -> None:  # type: ignore[no-untyped-def]
    src, ws, journal, clock = workspace
    outside = Path(tempfile.mkdtemp())
    try:
        (outside / "moved" / "deep").mkdir(parents=True)
        (outside / "moved" / "deep" / "w.txt").write_text("w")
        shutil.move(str(outside / "moved"), str(src / "a" / "moved"))  # files never reported one by one
        res = _journal_and_full(ws, journal, clock)
        assert res.walk == "journal" and res.files == 3
        (src / "a" / "moved" / "deep" / "w.txt").write_text("w2")  # its folders are watched now
        res = _journal_and_full(ws, journal, clock)
        assert res.walk == "journal" and res.changed and res.hashed == 1
        shutil.move(str(src / "a" / "moved"), str(outside / "back"))  # moved out: no longer watched
        (outside / "back" / "deep" / "w.txt").write_text("outside")
        res = _journal_and_full(ws, journal, clock)
        assert res.walk == "journal" and res.files == 2
        assert journal.watches == 4  # src, a, a/b, c
    finally:
        shutil.rmtree(outside)


def test_deleting_the_last_file_of_a_folder_is_published_without_a_journal_too(tmp_path: Path) -> None:
    """Found by the property below: the folder above, vouched for by its signature, kept its
    old tree (the deleted file in it) because the emptied folder forgot itself first."""
    src = tmp_path / "src"
    (src / "sd" / "pd").mkdir(parents=True)
    (src / "sd" / "pd" / "q").write_text("q")
    (src / "r").write_text("r")
    for p in (src / "sd" / "pd" / "q", src / "r"):
        os.utime(p, (1_700_000_000, 1_700_000_000))  # not too fresh: signatures are kept
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    (src / "sd" / "pd" / "q").unlink()
    res = ws.snapshot(progress=None)
    assert res.changed and res.files == 1
    assert [f.path for f in ws.store.read_manifest(ws.workspace_id, res.version).files] == ["r"]


def test_the_kernels_auto_snapshots_keep_a_journal(tmp_path: Path) -> None:
    """Where the kernel runs, its auto-snapshots (and %workspace snapshot) read only what changed:
    the first walks the tree (the watcher has just started), the next ones trust the journal."""
    from kernel import Kernel

    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "old.txt").write_text("old")
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    k = Kernel(root, env={"JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0.01"})
    wait = ("import importlib, time\n"
            "auto = importlib.import_module('jupyter_portable.interfaces.kernel.autosnapshot')\n"
            "for _ in range(600):\n    time.sleep(0.05)\n"
            "    if auto.STATE.last_version == {v}: break\n"
            "print(auto.describe())")
    try:
        assert k.run("%load_ext jupyter_portable").error is None
        first = k.run(wait.format(v=1)).stdout
        assert "version 1" in first and "last walk: full (the watcher has just started)" in first, first
        k.run("open('notes.txt', 'w').write('one cell later')")
        second = k.run(wait.format(v=2)).stdout
        assert "version 2" in second and "last walk: journal" in second, second
        assert "2 folders watched of 2 found by the last full walk" in second, second
        k.run("open('data/old.txt', 'w').write('new')")
        assert k.run('%workspace snapshot -m "by hand"').error is None
        assert k.run("%workspace autosnapshot 600").error is None  # a fresh watcher, no auto-snapshot for long
        assert k.run('%workspace snapshot -m "by hand too"').error is None
        shown = k.run("%workspace autosnapshot").stdout
        assert "last walk: full" in shown, f"a snapshot by hand is not shown: {shown}"
    finally:
        k.close()
    latest = ws.manifest(3)
    assert latest.message == "by hand" and latest.by_path()["data/old.txt"].size == 3
    assert "notes.txt" in latest.by_path()


# -- the property: after any sequence of changes, a journal snapshot publishes what a full walk does --

_NAMES = ("p", "q", "r")
_OPS = st.tuples(
    st.sampled_from(["create", "write", "truncate", "rename", "rename_dir", "delete", "delete_dir", "chmod",
                     "symlink", "hardlink", "mkdir", "dir_to_file", "file_to_dir", "dir_link", "link_out",
                     "out_and_back", "exchange", "same_size", "link_write_unlink"]),
    st.integers(0, 50), st.integers(0, 50), st.binary(max_size=40))


def _files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".portable")
        out += [Path(dirpath) / n for n in sorted(filenames) + sorted(
            d for d in os.listdir(dirpath) if os.path.islink(os.path.join(dirpath, d)) and d not in filenames)]
    return [p for p in out if ".portable" not in p.relative_to(root).parts]


def _dirs(root: Path) -> list[Path]:
    out = [root]
    for dirpath, dirnames, _f in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) == root and d == ".portable")
                             and not os.path.islink(os.path.join(dirpath, d)))
        out += [Path(dirpath) / d for d in dirnames]
    return out


def _exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): two names swap what they name, in one step."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2)  # AT_FDCWD; EINVAL where unsupported


def _apply(root: Path, op: tuple[str, int, int, bytes]) -> None:
    kind, i, j, data = op
    files, dirs = _files(root), _dirs(root)
    folder = dirs[i % len(dirs)]
    name = folder / _NAMES[j % len(_NAMES)]
    some = files[i % len(files)] if files else None
    if kind == "create" and not name.exists() and not name.is_symlink():
        name.write_bytes(data)
    elif kind == "write" and some is not None and some.is_file() and not some.is_symlink():
        with open(some, "ab") as fh:
            fh.write(data or b"+")
    elif kind == "truncate" and some is not None and some.is_file() and not some.is_symlink():
        os.truncate(some, len(data) % 3)
    elif kind == "rename" and some is not None and not name.is_dir():
        os.rename(some, name)
    elif kind == "rename_dir" and folder != root:
        target = dirs[j % len(dirs)] / (_NAMES[i % len(_NAMES)] + "d")
        if not target.exists() and not str(target).startswith(str(folder) + os.sep):
            os.rename(folder, target)
    elif kind == "delete" and some is not None:
        some.unlink()
    elif kind == "delete_dir" and folder != root:
        shutil.rmtree(folder)
    elif kind == "chmod" and some is not None and not some.is_symlink():
        os.chmod(some, 0o600 if j % 2 else 0o755)
    elif kind == "symlink" and some is not None and not name.exists() and not name.is_symlink():
        os.symlink(os.path.relpath(some, name.parent), name)
    elif kind == "hardlink" and some is not None and not some.is_symlink() and not name.exists() \
            and not name.is_symlink():
        os.link(some, name)
    elif kind == "mkdir" and len(name.relative_to(root).parts) < 4:
        new = name.parent / (name.name + "d")
        if not new.exists() and not new.is_symlink():
            new.mkdir()
    elif kind == "dir_to_file" and folder != root:  # a folder replaced by a file of its name
        shutil.rmtree(folder)
        folder.write_bytes(data)
    elif kind == "file_to_dir" and some is not None and some.is_file() and not some.is_symlink():
        some.unlink()
        some.mkdir()
        (some / "p").write_bytes(data)
    elif kind == "dir_link" and not name.exists() and not name.is_symlink():  # a symlink to a folder
        os.symlink(os.path.relpath(dirs[j % len(dirs)], name.parent), name)
    elif kind == "link_out" and not name.exists() and not name.is_symlink():  # leads outside: not recorded
        os.symlink("../" * len(name.relative_to(root).parts) + "outside", name)
    elif kind == "out_and_back" and folder != root:  # moved out of the workspace and back, then edited
        away = root.parent / "away"
        os.rename(folder, away)
        os.rename(away, folder)
        inside = folder / _NAMES[j % len(_NAMES)]
        if not inside.is_dir() and not inside.is_symlink():
            inside.write_bytes(data + b"!")
    elif kind == "exchange":
        others = files + dirs[1:]
        if others and folder != root:
            other = others[j % len(others)]
            if other != folder and not str(other).startswith(str(folder) + os.sep) \
                    and not str(folder).startswith(str(other) + os.sep):
                _exchange(folder, other)
    elif kind == "link_write_unlink" and some is not None and some.is_file() and not some.is_symlink() \
            and not name.exists() and not name.is_symlink():  # written through another name, gone before the cut
        os.link(some, name)
        with open(name, "ab") as fh:
            fh.write(data or b"+")
        name.unlink()
    elif kind == "same_size" and some is not None and some.is_file() and not some.is_symlink():
        st = os.lstat(some)  # a rewrite in place that puts the mtime back: only the ctime moves
        with open(some, "r+b") as fh:
            fh.write(bytes((b + 1) % 256 for b in some.read_bytes()))
        os.utime(some, ns=(st.st_atime_ns, st.st_mtime_ns))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_OPS, min_size=1, max_size=10))
def test_a_journal_snapshot_publishes_the_tree_a_full_walk_does(ops: list[tuple[str, int, int, bytes]]) -> None:
    tmp = Path(tempfile.mkdtemp())
    try:
        src = tmp / "src"
        (src / "sd" / "pd").mkdir(parents=True)
        (src / "sd" / "p").write_bytes(b"one")
        (src / "sd" / "pd" / "q").write_bytes(b"two")
        (src / "r").write_bytes(b"three")
        ws = Workspace.init(src, str(tmp / "store"))
        clock = Clock()
        with ChangeJournal(src) as journal:
            _snap(ws, journal, clock)
            for op in ops:
                _apply(src, op)
                res = _journal_and_full(ws, journal, clock)
                # the journal was trusted unless a file with other hard links changed, or two
                # folders were exchanged (the events cannot tell an exchange from a rename over)
                assert res.walk == "journal" or any(
                    why in (res.walk_reason or "") for why in ("hard links", "exchanged")), res.walk_reason
    finally:
        shutil.rmtree(tmp)
