"""Files the walk cannot read, files that are not files, and folders a restore must not clobber.

The tests run as root, and root reads a ``chmod 000`` folder anyway (CAP_DAC_OVERRIDE). So
the unreadable-folder test runs the CLI under ``setpriv`` with CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH dropped: the kernel then refuses the listing with a real EACCES. An
EIO has no such switch, so that case makes ``os.scandir`` raise it for one folder in-process.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import PortableError, UsageError, Workspace
from jupyter_portable.engine.checkpoint.writecheck import check_checkpoint
from jupyter_portable.workdir.workcopy import WorkspaceCopy

pytestmark = pytest.mark.timeout(180)


def _published(ws: Workspace) -> dict[str, str]:
    """The head version's files: path -> hash."""
    return {e.path: e.hash or "" for e in ws.store.read_manifest(ws.workspace_id).files}


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    # AF_UNIX paths are limited to about 100 bytes; pytest's tmp_path can be longer.
    short = Path(f"/tmp/jp-sock-{os.getpid()}-{len(str(tmp_path))}")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(short))
    try:
        yield short
    finally:
        sock.close()
        short.unlink(missing_ok=True)


# -- a folder that cannot be read is never a deletion ---------------------------------------------


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and util-linux setpriv to drop CAP_DAC_OVERRIDE")
def test_a_folder_that_cannot_be_listed_fails_the_snapshot_and_deletes_nothing(cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n", "data/a.csv": "1,2\n", "data/b.csv": "3,4\n"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot(progress=None)
    before = _published(ws)
    (root / "train.py").write_text("pass  # edited\n")
    os.chmod(root / "data", 0)
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        jupyter = str(Path(cli.env["PATH"].split(os.pathsep)[0]) / "jupyter")
        proc = subprocess.run([*drop, jupyter, "portable", "snapshot", "--json"], cwd=root, env=cli.env,
                              capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(root / "data", 0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "cannot list folder 'data'" in proc.stderr and "Permission denied" in proc.stderr
    assert ".portableignore" in proc.stderr  # says how to fix it
    head, _ = ws.store.read_head(ws.workspace_id)
    assert head.version == 1 and _published(ws) == before
    # Readable again: the next snapshot publishes the edit and keeps data/.
    assert ws.snapshot(progress=None).version == 2
    assert set(_published(ws)) == {"train.py", "data/a.csv", "data/b.csv"}


def test_an_io_error_listing_a_folder_never_publishes_its_files_as_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n", "runs/1/log.txt": "epoch 1\n", "runs/2/log.txt": "epoch 2\n"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot(progress=None)
    before = _published(ws)
    (root / "train.py").write_text("pass  # edited\n")
    real_scandir = os.scandir
    broken = str(root / "runs" / "2")

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == broken:  # type: ignore[arg-type]
            raise OSError(errno.EIO, os.strerror(errno.EIO), broken)
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PortableError, match=r"cannot list folder 'runs/2'.*Input/output error") as info:
        ws.snapshot(progress=None)
    assert "runs/2/" in (info.value.hint or "")
    monkeypatch.setattr(os, "scandir", real_scandir)
    assert ws.store.read_head(ws.workspace_id)[0].version == 1 and _published(ws) == before
    assert ws.config.version == 1


# -- special files ----------------------------------------------------------------------------------


def test_snapshot_lists_the_fifos_and_sockets_it_skips(cli, tmp_path: Path, unix_socket: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n", "run/keep.txt": "x\n"})
    os.mkfifo(root / "run" / "pipe")
    os.rename(unix_socket, root / "run" / "sock")  # bound at a short path, moved into the workspace
    Workspace.init(root, f"file://{tmp_path}/store")
    proc = cli("snapshot", "--json", cwd=root, timeout=60)
    out = json.loads(proc.stdout)
    assert out["version"] == 1 and out["files"] == 2
    assert out["skipped"] == ["run/pipe", "run/sock"]
    assert out["special"] == [{"path": "run/pipe", "kind": "FIFO"}, {"path": "run/sock", "kind": "socket"}]
    assert "'run/pipe': a FIFO is not a file" in proc.stderr and "'run/sock': a socket" in proc.stderr
    # The no-change shortcut reports them too.
    again = cli.json("snapshot", cwd=root, timeout=60)
    assert again["changed"] is False and again["skipped"] == ["run/pipe", "run/sock"]


def test_checkpoint_on_a_fifo_is_refused_at_once(cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n", "ckpt/model.bin": b"\x01" * 64})
    os.mkfifo(root / "stream")
    os.mkfifo(root / "ckpt" / "feed")
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    # --settle 600: a refusal that only came after the quiet window (or a read of the FIFO,
    # which waits for a writer forever) would run into the 60 s limit of the command.
    for target, said in (("stream", "stream is a FIFO (named pipe)"),
                         ("ckpt", "'feed' in ")):
        proc = cli("checkpoint", target, "--settle", "600", "--timeout", "900", cwd=root, check=False, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and said in proc.stderr and "regular file" in proc.stderr
    assert ws.store.read_head(ws.workspace_id)[0].version == 0  # nothing was published
    # The write check alone refuses it too, without opening it.
    check = check_checkpoint(root / "ckpt", quiet_s=600, timeout_s=900)
    assert not check.ok and "FIFO" in (check.reason or "")


# -- restore into a folder that is not a copy of the workspace ------------------------------------


def _source(tmp_path: Path) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"notes.txt": "from the workspace\n", "same.txt": "identical\n", "data/x.csv": "1\n"})
    ws = Workspace.init(src, f"file://{tmp_path}/store")
    ws.snapshot(progress=None)
    return ws


def _foreign(dest: Path) -> None:
    write_tree(dest, {"notes.txt": "my own notes\n", "same.txt": "identical\n", "mine.txt": "untouched\n",
                      "data": "a file where the workspace has a folder\n"})


def test_restore_into_a_foreign_folder_is_refused_without_force(cli, tmp_path: Path) -> None:
    ws = _source(tmp_path)
    dest = tmp_path / "dest"
    _foreign(dest)
    proc = cli("restore", "--store", ws.config.store, "--workspace", ws.workspace_id, str(dest), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "is not empty and is not a copy of workspace" in proc.stderr and "--force" in proc.stderr
    assert (dest / "notes.txt").read_text() == "my own notes\n"
    assert sorted(p.name for p in dest.iterdir()) == ["data", "mine.txt", "notes.txt", "same.txt"]


def test_restore_with_force_keeps_each_differing_file_beside_it(cli, tmp_path: Path) -> None:
    ws = _source(tmp_path)
    dest = tmp_path / "dest"
    _foreign(dest)
    out = cli.json("restore", "--store", ws.config.store, "--workspace", ws.workspace_id, str(dest), "--force")
    kept = out["kept"]
    assert sorted(kept) == ["data", "notes.txt"]
    assert re.fullmatch(r"notes\.txt\.orig-\d{8}T\d{6}Z", kept["notes.txt"])
    assert re.fullmatch(r"data\.orig-\d{8}T\d{6}Z", kept["data"])
    assert (dest / kept["notes.txt"]).read_text() == "my own notes\n"
    assert (dest / kept["data"]).read_text() == "a file where the workspace has a folder\n"
    assert (dest / "notes.txt").read_text() == "from the workspace\n"
    assert (dest / "data" / "x.csv").read_text() == "1\n"
    assert (dest / "mine.txt").read_text() == "untouched\n"
    assert not list(dest.glob("same.txt.orig-*"))  # identical: nothing to keep
    assert WorkspaceCopy(dest).read_config().workspace_id == ws.workspace_id


def test_the_kept_name_carries_the_time_passed_in(tmp_path: Path) -> None:
    ws = _source(tmp_path)
    dest = tmp_path / "dest"
    _foreign(dest)
    (dest / "notes.txt.orig-20260102T030405Z").write_text("an older keep\n")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    res = Workspace.restore(ws.config.store, ws.workspace_id, dest, force=True, now=at, delete=True,
                            progress=None)
    assert res.kept == {"notes.txt": "notes.txt.orig-20260102T030405Z-2", "data": "data.orig-20260102T030405Z",
                        "mine.txt": "mine.txt.orig-20260102T030405Z"}
    assert (dest / "notes.txt.orig-20260102T030405Z-2").read_text() == "my own notes\n"
    # in a folder that was not a copy, --delete keeps what the version lacks aside too (issue 28),
    # and leaves a kept copy, this restore's or an older one, where it is
    assert res.removed == ["mine.txt"]
    assert (dest / "data.orig-20260102T030405Z").exists()
    assert (dest / "notes.txt.orig-20260102T030405Z").read_text() == "an older keep\n"


def test_force_moves_a_symlinked_folder_aside_and_never_writes_through_it(tmp_path: Path) -> None:
    ws = _source(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "data")
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    res = Workspace.restore(ws.config.store, ws.workspace_id, dest, force=True, now=at, progress=None)
    assert res.kept == {"data": "data.orig-20260102T030405Z"}
    assert os.readlink(dest / "data.orig-20260102T030405Z") == str(outside)
    assert (dest / "data" / "x.csv").read_text() == "1\n" and not (dest / "data").is_symlink()
    assert list(outside.iterdir()) == []


def test_a_restore_cut_short_runs_again_without_force(tmp_path: Path) -> None:
    ws = _source(tmp_path)
    dest = tmp_path / "dest"
    write_tree(dest, {"notes.txt": "from the workspace\n"})  # what the first try placed
    WorkspaceCopy(dest).write_restoring(ws.workspace_id)
    Workspace.restore(ws.config.store, ws.workspace_id, dest, progress=None)
    assert Workspace.find(dest).verify().ok
    assert not (dest / ".portable" / "restoring.json").exists()
    # A folder left by another workspace's restore is still foreign.
    other = tmp_path / "other"
    write_tree(other, {"notes.txt": "x\n"})
    WorkspaceCopy(other).write_restoring("ws-someone-else")
    with pytest.raises(UsageError, match="not a copy"):
        Workspace.restore(ws.config.store, ws.workspace_id, other, progress=None)


def test_an_empty_folder_and_a_copy_of_the_workspace_restore_as_before(tmp_path: Path) -> None:
    ws = _source(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    Workspace.restore(ws.config.store, ws.workspace_id, empty, progress=None)
    (empty / "notes.txt").write_text("edited in the copy\n")
    res = Workspace.restore(ws.config.store, ws.workspace_id, empty, progress=None)  # its own copy: no refusal
    assert res.kept == {} and (empty / "notes.txt").read_text() == "from the workspace\n"


# -- .portable/workspace.json ------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100_000, 5_000])
def test_a_deeply_nested_workspace_file_is_a_one_line_error(cli, tmp_path: Path, depth: int) -> None:
    root = tmp_path / "w"
    root.mkdir()
    Workspace.init(root, f"file://{tmp_path}/store")
    (root / ".portable" / "workspace.json").write_bytes(b"[" * depth + b"]" * depth)
    proc = cli("status", cwd=root, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "workspace.json" in proc.stderr and "to fix:" in proc.stderr
    assert stat.S_ISREG((root / ".portable" / "workspace.json").stat().st_mode)  # left as it was
