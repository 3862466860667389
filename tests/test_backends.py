"""The Backend contract (its docstrings), checked against every backend: a local folder
and S3 on a moto server. A new backend gets every test by joining the fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_bucket

from jupyter_portable.core.errors import ConflictError, ObjectMissing, PortableError, StoreError
from jupyter_portable.store import open_backend
from jupyter_portable.store.backend import Backend


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "file":
        return open_backend(f"file://{tmp_path}/store")
    request.getfixturevalue("aws_env")
    return open_backend(f"s3://{make_bucket()}/some/prefix")


def test_missing_objects_are_reported_as_missing(backend: Backend) -> None:
    for call in (lambda: backend.read("objects/aa/nope"), lambda: backend.read_range("objects/aa/nope", 0, 3),
                 lambda: backend.size("objects/aa/nope")):
        with pytest.raises(ObjectMissing, match="missing"):
            call()
    assert backend.exists("objects/aa/nope") is False
    assert backend.read_versioned("objects/aa/nope") is None
    assert backend.list("objects") == []


def test_write_read_range_size_list(backend: Backend) -> None:
    backend.write("objects/ab/one", b"0123456789")
    backend.write("objects/ab/one", b"0123456789")  # rewriting identical bytes is harmless
    backend.write("objects/cd/two", b"")
    backend.write("index/ab/one.json", b"{}")
    assert backend.read("objects/ab/one") == b"0123456789"
    assert backend.read_range("objects/ab/one", 2, 5) == b"234"
    assert backend.size("objects/ab/one") == 10 and backend.size("objects/cd/two") == 0
    assert backend.exists("objects/ab/one")
    assert backend.list("objects") == ["objects/ab/one", "objects/cd/two"]
    backend.delete("objects/cd/two")
    backend.delete("objects/cd/two")
    assert backend.list("objects") == ["objects/ab/one"]


def test_write_new_is_create_only(backend: Backend) -> None:
    backend.write_new("workspaces/w/manifests/m.json", b"first")
    with pytest.raises(ConflictError):
        backend.write_new("workspaces/w/manifests/m.json", b"second")
    assert backend.read("workspaces/w/manifests/m.json") == b"first"


def test_swap_is_compare_and_swap(backend: Backend) -> None:
    backend.swap("workspaces/w/HEAD", b"v0", None)
    with pytest.raises(ConflictError):
        backend.swap("workspaces/w/HEAD", b"again", None)  # exists already
    data, token = backend.read_versioned("workspaces/w/HEAD")
    assert data == b"v0"
    backend.swap("workspaces/w/HEAD", b"v1", token)
    with pytest.raises(ConflictError):
        backend.swap("workspaces/w/HEAD", b"v2", token)  # stale token
    data, token2 = backend.read_versioned("workspaces/w/HEAD")
    assert data == b"v1" and token2 != token
    assert backend.list("workspaces") == ["workspaces/w/HEAD"]


def test_unreachable_or_refused_stores_raise_store_errors(tmp_path: Path, aws_env: dict) -> None:
    missing_bucket = open_backend("s3://no-such-bucket-here/p")
    with pytest.raises(StoreError) as info:
        missing_bucket.write("objects/aa/x", b"x")
    assert isinstance(info.value, PortableError) and "no-such-bucket-here" in str(info.value)
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        import os
        if os.geteuid() != 0:  # root ignores permissions
            with pytest.raises(StoreError, match="cannot"):
                open_backend(f"file://{readonly}").write("objects/aa/x", b"x")
    finally:
        readonly.chmod(0o700)
    # A file where a folder is needed.
    (tmp_path / "blocker").write_text("x")
    with pytest.raises(StoreError):
        open_backend(f"file://{tmp_path}/blocker").write("objects/aa/x", b"x")


def test_unknown_schemes_are_refused_with_a_hint() -> None:
    with pytest.raises(StoreError) as info:
        open_backend("gopher://x/y")
    assert "s3://" in (info.value.hint or "")


def test_workspace_documents_update_by_compare_and_swap(store_url: str, tmp_path: Path) -> None:
    import threading

    from jupyter_portable.store.repo import Store

    store = Store.open(store_url)
    store.create_workspace("ws-docs")
    assert store.read_doc("ws-docs", "reservations") is None

    def add(i: int) -> None:
        store_i = Store.open(store_url)
        store_i.update_doc("ws-docs", "reservations", lambda cur: (cur or []) + [i], tries=50)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(store.read_doc("ws-docs", "reservations")) == list(range(6)), "no update was lost"
    with pytest.raises(PortableError):
        store.read_doc("ws-docs", "../HEAD")


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in root.rglob("*") if p.is_file()
            and not p.name.endswith(".lock")}


def test_a_private_file_snapshotted_to_a_file_store_is_not_readable_by_others_there(tmp_path: Path) -> None:
    """Issue 40: a file:// store's objects took the process umask (0644), so a 0600 source (a key, a
    token file) was readable by every user of the machine in the store. Now every file of a store is
    written 0600, and 0660 (less the umask) for the group of a team's store folder (group-writable or
    setgid)."""
    import os

    from conftest import write_tree

    from jupyter_portable import Workspace

    old = os.umask(0o022)
    try:
        src = tmp_path / "w"
        write_tree(src, {"train.py": "pass\n", "notes.txt": "n" * 5000})
        secret = src / "service-account.json"
        secret.write_text('{"private_key": "p"}\n')
        secret.chmod(0o600)
        ws = Workspace.init(src, f"file://{tmp_path}/store")
        ws.snapshot("with the key", progress=None)
        modes = _modes(tmp_path / "store")
        assert modes and all(m == 0o600 for m in modes.values()), modes

        team = tmp_path / "team-store"
        team.mkdir()
        team.chmod(0o2770)
        write_tree(tmp_path / "w2", {"a.py": "1\n"})
        Workspace.init(tmp_path / "w2", f"file://{team}").snapshot("shared", progress=None)
        modes = _modes(team)  # 0660 less the umask's 022: the group reads, others never
        assert modes and all(m == 0o640 for m in modes.values()), modes
    finally:
        os.umask(old)
