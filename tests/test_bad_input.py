"""Bad input, the smaller cases of issue 28 (item 5), each through the real parts: the CLI as a
user runs it, the server's REST API, a store written by someone else."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.engine.snapshot import publish_records


def test_a_snapshot_message_a_terminal_acts_on_is_refused_and_log_escapes_one_already_stored(
        cli, tmp_path: Path) -> None:
    root = tmp_path / "w"
    write_tree(root, {"train.py": "pass\n"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot("first", progress=None)
    (root / "train.py").write_text("pass  # edited\n")
    proc = cli("snapshot", "-m", "\x1b]0;owned\x07\x1b[2Jdone", cwd=root, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "control character '\\x1b'" in proc.stderr and "\x1b" not in proc.stderr
    assert [v["version"] for v in ws.log()] == [1]  # nothing was published
    assert cli.json("snapshot", "-m", "two lines\n\tand a tab", cwd=root)["version"] == 2  # newlines and tabs are text

    # a version whose message was written raw into the store (a worker holds credentials that can)
    publish_records(ws.store, ws.workspace_id, epoch=ws.config.epoch, allocations=[],
                    message="\x1b]0;pwned\x07\x1b[31mred\r\n    4  fake version\x9b")
    out = cli("log", cwd=root).stdout
    assert not set(out) & {"\x1b", "\x07", "\x9b", "\r"}, repr(out)
    assert "\\x1b]0;pwned\\x07\\x1b[31mred\\r\\n    4  fake version\\x9b" in out
    assert len(out.splitlines()) == 3  # one line a version: a message cannot fake another
    assert "two lines\\n\\tand a tab" in out
    # --json keeps the message as it is stored (JSON escapes it)
    assert cli.json("log", cwd=root)["versions"][0]["message"].startswith("\x1b]0;pwned")


def test_restore_applies_the_umask_to_stored_modes_and_the_copy_still_verifies(cli, tmp_path: Path) -> None:
    import os
    import stat

    umask = os.umask(0o022)
    os.umask(umask)
    if not umask & 0o002:
        pytest.skip(f"this process's umask {umask:03o} lets world-writable files be made")
    src = tmp_path / "src"
    write_tree(src, {"open.sh": "echo\n", "shared.txt": "s\n", "private.key": "k\n"})
    for name, mode in (("open.sh", 0o777), ("shared.txt", 0o666), ("private.key", 0o600)):
        os.chmod(src / name, mode)
    ws = Workspace.init(src, f"file://{tmp_path}/store")
    ws.snapshot("modes", progress=None)
    stored = {e.path: e.mode & 0o777 for e in ws.store.read_manifest(ws.workspace_id).files}
    assert stored == {"open.sh": 0o777, "shared.txt": 0o666, "private.key": 0o600}

    dest = tmp_path / "dest"
    cli("restore", str(dest), "--store", f"file://{tmp_path}/store", "--workspace", ws.workspace_id)
    for name, mode in stored.items():
        assert stat.S_IMODE((dest / name).stat().st_mode) == mode & ~umask, name
    assert not any((dest / name).stat().st_mode & 0o002 for name in stored)
    assert cli.json("verify", cwd=dest)["ok"] is True  # what the umask took away is not a difference
    assert cli.json("snapshot", cwd=dest)["changed"] is False


def test_restore_force_delete_into_a_foreign_folder_keeps_what_it_deletes_as_orig(cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"train.py": "print('version')\n", "data/small.csv": "a,b\n"})
    ws = Workspace.init(src, f"file://{tmp_path}/store")
    ws.snapshot("one", progress=None)
    dest = tmp_path / "someones-folder"
    write_tree(dest, {"train.py": "print('theirs')\n", "notes.txt": "their notes\n", "sub/data.bin": "their data"})
    out = cli.json("restore", str(dest), "--store", f"file://{tmp_path}/store", "--workspace", ws.workspace_id,
                   "--force", "--delete")
    assert sorted(out["removed"]) == ["notes.txt", "sub/data.bin"]
    assert sorted(out["kept"]) == ["notes.txt", "sub/data.bin", "train.py"]
    for path, content in (("train.py", "print('theirs')\n"), ("notes.txt", "their notes\n"),
                          ("sub/data.bin", "their data")):
        aside = out["kept"][path]
        assert aside.startswith(f"{path}.orig-") and (dest / aside).read_text() == content
    assert (dest / "train.py").read_text() == "print('version')\n" and not (dest / "notes.txt").exists()

    # the copy is the workspace's now: --delete there deletes what the version does not have, as before
    (dest / "scratch.txt").write_text("made in the copy\n")
    again = cli.json("restore", str(dest), "--store", f"file://{tmp_path}/store", "--workspace", ws.workspace_id,
                     "--delete")
    assert "scratch.txt" in again["removed"] and not (dest / "scratch.txt").exists() and again["kept"] == {}


def test_a_provider_supplied_host_is_never_an_option_of_ssh_keyscan(tmp_path: Path) -> None:
    """A host such as ``-f FILE`` from a provider's answer would make ssh-keyscan read hosts from
    a file and return the key of a machine the provider never named; ``--`` keeps it a name."""
    from sshd import running_sshd, unavailable

    from jupyter_portable.compute.keys import scan_host_key

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with running_sshd(tmp_path / "sshd") as server:
        assert scan_host_key("127.0.0.1", server.port) is not None  # the scan itself works here
        listed = tmp_path / "hosts.txt"
        listed.write_text("127.0.0.1\n")
        assert scan_host_key(f"-f{listed}", server.port) is None


def test_nan_is_not_a_driver_version_a_machine_can_report(tmp_path: Path) -> None:
    """A machine whose nvidia-smi says its driver is "nan" (a hostile or broken one) presents no
    usable GPU, so exact-driver admission has nothing to compare it with and refuses it."""
    from fakegpu import H100, install_fake_nvidia_smi

    from jupyter_portable.compute.gpus import query_gpus

    for driver, usable in (("nan", False), ("NaN", False), ("550.54.15", True)):
        bin_dir = tmp_path / driver
        bin_dir.mkdir()
        exe = install_fake_nvidia_smi(bin_dir, [H100], driver=driver, cuda="12.4")
        gpus, _cuda, note = query_gpus(str(exe))
        assert bool(gpus) is usable, (driver, note)
        if not usable:
            assert note is not None and f"driver_version {driver!r} is not a version" in note
