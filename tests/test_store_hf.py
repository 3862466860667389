"""The hf:// store against the Hub's twin (tests/hub_twin.py): what the Hub's commits give
beyond the conformance suite. huggingface_hub's own request code runs unchanged; only
HF_ENDPOINT points it at loopback."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
from conftest import read_tree, write_tree
from hub_twin import HubTwin, Repo, repo_url
from stores import HF_READ_TOKEN, HF_TEST_TOKEN, hf_env, hub_twin, make_hf_repo  # noqa: F401 - fixtures

from jupyter_portable import Workspace
from jupyter_portable.core.errors import ConflictError, StoreError, UnsupportedStore, UsageError
from jupyter_portable.engine.verify import fsck
from jupyter_portable.store import open_backend
from jupyter_portable.store.hf import HFBackend, parse_url
from jupyter_portable.store.repo import Store

pytestmark = pytest.mark.usefixtures("hf_env")


@pytest.fixture
def hub(hub_twin: HubTwin) -> HubTwin:  # noqa: F811 - the session's twin, by a shorter name
    return hub_twin


@pytest.fixture
def repo(hub: HubTwin) -> Repo:
    return hub.repos[("dataset", make_hf_repo(hub))]


def _backend(repo: Repo, prefix: str = "team/ws", branch: str = "main") -> HFBackend:
    backend = open_backend(repo_url(repo.repo_id, prefix, branch=branch))
    assert isinstance(backend, HFBackend)
    return backend


def _once(hub: HubTwin, action) -> None:  # type: ignore[no-untyped-def]
    """Run ``action(repo, branch)`` just before the next commit is checked: another writer
    whose commit lands between this writer's look at the tip and its own commit."""
    def hook(repo: Repo, branch: str) -> None:
        hub.before_commit = None
        action(repo, branch)

    hub.before_commit = hook


def _commits(hub: HubTwin, repo: Repo, branch: str = "main") -> list[str]:
    return [title for _sha, _parent, title in reversed(hub.history(repo, branch))]


def test_store_urls_name_a_repository_a_branch_and_a_prefix() -> None:
    assert parse_url("datasets/lab/store") == ("dataset", "lab/store", "main", "")
    assert parse_url("datasets/lab/store@portable/team/ws") == ("dataset", "lab/store", "portable", "team/ws")
    assert parse_url("lab/models-too/p") == ("model", "lab/models-too", "main", "p")
    assert parse_url("models/lab/m@refs%2Fheads%2Fdev") == ("model", "lab/m", "refs/heads/dev", "")
    for bad, words in (("hf://datasets/lab", "does not name a repository"),
                       ("hf://spaces/lab/app", "Space"),
                       ("hf://datasets/lab/store@" + "a" * 40, "not a branch name"),
                       ("hf://datasets/lab/st ore", "not a valid repository name"),
                       ("hf://datasets/-lab/store", "not a valid owner name")):
        with pytest.raises(UsageError, match=words) as info:
            open_backend(bad)
        assert "\n" not in str(info.value) and info.value.hint


def test_each_write_is_one_commit_on_the_branch_and_main_of_another_branch_is_untouched(
        hub: HubTwin, repo: Repo) -> None:
    main_before = repo.branches["main"]
    repo.branches["portable"] = main_before
    b = _backend(repo, branch="portable")
    b.write("objects/ab/one", b"1")
    b.write_new("workspaces/w/manifests/m.json", b"m")
    b.swap("workspaces/w/HEAD", b"h0", None)
    assert repo.branches["main"] == main_before
    titles = [t for t in _commits(hub, repo, "portable") if not t.startswith(("probe", "delete probe"))]
    assert titles == ["initial commit", "put objects/ab/one", "create workspaces/w/manifests/m.json",
                                "create workspaces/w/HEAD"]
    tree = hub.tree(repo, "portable")
    assert {"team/ws/objects/ab/one", "team/ws/workspaces/w/HEAD"} <= set(tree)
    with pytest.raises(StoreError, match="no branch 'gone'") as info:
        _backend(repo, branch="gone").read("config.json")
    assert "hf repo branch create" in (info.value.hint or "")


def test_a_commit_refused_because_the_branch_moved_is_tried_again_from_the_new_tip(
        hub: HubTwin, repo: Repo) -> None:
    b = _backend(repo)
    _once(hub, lambda r, br: hub.commit_file(r, br, "team/ws/objects/cd/other", b"x"))
    b.write_new("workspaces/w/manifests/m.json", b"mine")  # an unrelated key moved the branch: coarse, retried
    assert b.read("workspaces/w/manifests/m.json") == b"mine"
    commits = [p for m, p, _auth in hub.requests if m == "POST" and f"{repo.repo_id}/commit/" in p]
    assert len(commits) >= 2
    assert _commits(hub, repo)[-2:] == ["another writer", "create workspaces/w/manifests/m.json"]


def test_create_only_holds_when_another_writer_creates_the_key_between_the_check_and_the_commit(
        hub: HubTwin, repo: Repo) -> None:
    b = _backend(repo)
    key = "workspaces/w/manifests/0000000001-x.json"
    _once(hub, lambda r, br: hub.commit_file(r, br, f"team/ws/{key}", b"theirs"))
    with pytest.raises(ConflictError):
        b.write_new(key, b"mine")
    assert b.read(key) == b"theirs"


def test_a_head_swapped_by_another_writer_after_it_was_read_is_not_replaced(hub: HubTwin, repo: Repo) -> None:
    b = _backend(repo)
    b.swap("workspaces/w/HEAD", b"v0", None)
    _data, token = b.read_versioned("workspaces/w/HEAD") or (b"", "")
    _once(hub, lambda r, br: hub.commit_file(r, br, "team/ws/workspaces/w/HEAD", b"v1 theirs"))
    with pytest.raises(ConflictError):
        b.swap("workspaces/w/HEAD", b"v1 mine", token)
    assert b.read("workspaces/w/HEAD") == b"v1 theirs"


def test_a_commit_whose_answer_was_lost_counts_as_written_and_is_not_committed_twice(
        hub: HubTwin, repo: Repo) -> None:
    b = _backend(repo)
    b.swap("workspaces/w/HEAD", b"v0", None)
    _data, token = b.read_versioned("workspaces/w/HEAD") or (b"", "")
    before = len(hub.history(repo))
    hub.drop_commit_answers = 1
    b.swap("workspaces/w/HEAD", b"v1", token)  # landed, unanswered: read back, and it holds v1
    assert b.read("workspaces/w/HEAD") == b"v1"
    hub.drop_commit_answers = 1
    b.write_new("workspaces/w/manifests/m.json", b"m")
    assert b.read("workspaces/w/manifests/m.json") == b"m"
    assert len(hub.history(repo)) == before + 2


def test_large_objects_go_through_the_lfs_path_never_inline(hub: HubTwin, repo: Repo) -> None:
    b = _backend(repo)
    small, big = os.urandom(2 * 1024 * 1024), os.urandom(20 * 1024 * 1024 + 7)
    start = len(hub.requests)
    b.write("objects/aa/small", small)
    b.write("objects/bb/big", big)
    paths = [(m, p) for m, p, _auth in hub.requests[start:]]
    assert ("POST", f"/datasets/{repo.repo_id}.git/info/lfs/objects/batch") in paths
    assert sum(1 for m, p in paths if m == "PUT" and p.startswith("/_storage/put/")) == 1  # basic transfer
    assert sum(1 for m, p in paths if m == "PUT" and p.startswith("/_storage/part/")) == 2  # multipart: 16 MiB parts
    assert any(m == "POST" and p.startswith("/_storage/complete/") for m, p in paths)
    tree = hub.tree(repo, "main")
    assert tree["team/ws/objects/aa/small"].sha256 and tree["team/ws/objects/bb/big"].sha256
    assert b.read("objects/bb/big") == big and b.read_range("objects/aa/small", 10, 20) == small[10:20]
    assert b.size("objects/bb/big") == len(big)


def test_a_private_repository_needs_a_token_and_the_error_says_which(
        hub: HubTwin, repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(StoreError, match="private") as info:
        Store.open(repo_url(repo.repo_id, "team/ws")).check_store()
    assert "HF_TOKEN" in (info.value.hint or "")


def test_the_token_never_reaches_an_error_a_log_or_the_store(
        hub: HubTwin, repo: Repo, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    caplog.set_level(logging.DEBUG)
    url = repo_url(repo.repo_id, "team/ws")
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a\n", "big.bin": os.urandom(2 * 1024 * 1024)})
    ws = Workspace.init(src, url)
    ws.snapshot(progress=None)
    messages: list[str] = []
    for token, words in ((HF_READ_TOKEN, "access denied"), ("hf_wrong" + HF_TEST_TOKEN[-12:], "private")):
        monkeypatch.setenv("HF_TOKEN", token)
        with pytest.raises(StoreError, match=words) as info:
            open_backend(url).write("objects/ab/x", b"x")
        messages += [str(info.value), info.value.hint or "", repr(info.value)]
        assert all(token not in m for m in messages)
    logged = "\n".join(r.getMessage() for r in caplog.records) + caplog.text
    stored = [hub.content(repo, e) for e in hub.tree(repo, "main").values()]
    for secret in (HF_TEST_TOKEN, HF_READ_TOKEN):
        assert secret not in logged and all(secret not in m for m in messages)
        assert all(secret.encode() not in data for data in stored)
    assert all(auth for m, p, auth in hub.requests if f"/{repo.repo_id}/" in p), "every API call was authorized"


def test_init_refuses_a_hub_that_ignores_parent_commits_and_stores_no_workspace(
        hub: HubTwin, repo: Repo, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a"})
    hub.honour_parent = False
    try:
        with pytest.raises(UnsupportedStore, match="parentCommit"):
            Workspace.init(src, repo_url(repo.repo_id, "p"))
    finally:
        hub.honour_parent = True
    assert not (src / ".portable" / "workspace.json").exists()
    b = _backend(repo, "p")
    assert b.list("workspaces") == [] and b.list("probe") == []
    assert Workspace.init(src, repo_url(repo.repo_id, "p")).workspace_id


def test_two_copies_snapshot_at_once_one_publishes_each_version(hub: HubTwin, repo: Repo,
                                                                tmp_path: Path) -> None:
    url = repo_url(repo.repo_id, "team/ws")
    a = tmp_path / "a"
    write_tree(a, {"x.txt": "x"})
    ws = Workspace.init(a, url)
    ws.snapshot(progress=None)
    b = tmp_path / "b"
    Workspace.restore(url, ws.workspace_id, b, progress=None)
    write_tree(a, {"x.txt": "from a"})
    write_tree(b, {"x.txt": "from b"})
    copies = [Workspace.find(a), Workspace.find(b)]
    results: list[object] = [None, None]
    barrier = threading.Barrier(2)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = copies[i].snapshot(progress=None).version
        except ConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["ConflictError", "int"], results
    assert fsck(Store.open(url)).ok


def test_sigkill_at_every_step_of_a_snapshot_leaves_the_last_version_restorable(
        hub: HubTwin, tmp_path: Path) -> None:
    from test_crash import _check_after_crash, _snapshot_killed_at

    # test_crash's steps with smaller files: still LFS objects (over 1 MiB), fewer bytes per run
    base_id = make_hf_repo(hub)
    base_ws = tmp_path / "base-ws"
    write_tree(base_ws, {f"src/m{i}.py": f"print({i})\n" for i in range(12)} | {"data/big.bin": os.urandom(3 << 20)})
    Workspace.init(base_ws, repo_url(base_id, "p")).snapshot(progress=None)
    v1_tree = read_tree(base_ws)
    write_tree(base_ws, {f"src/new{i}.py": f"x = {i}\n" for i in range(10)} | {"data/more.bin": os.urandom(2 << 20)})
    (base_ws / "src" / "m0.py").unlink()
    with open(base_ws / "data" / "big.bin", "r+b") as fh:
        fh.write(b"changed!")
    base = hub.repos[("dataset", base_id)]
    step, kills, published = 0, 0, 0
    while True:
        step += 1
        assert step < 100, "the snapshot never completed"
        repo = hub.clone_repo(base, f"{base_id}-run{step}")  # the store as v1 left it
        url = repo_url(repo.repo_id, "p")
        root = tmp_path / f"ws{step}"
        shutil.copytree(base_ws, root, symlinks=True)
        cfg_path = root / ".portable" / "workspace.json"
        cfg = json.loads(cfg_path.read_text())
        cfg_path.write_text(json.dumps({**cfg, "store": url}))
        proc = _snapshot_killed_at(root, step)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        kills += 1
        published += _check_after_crash(url, cfg["workspace_id"], tmp_path / f"r{step}", v1_tree) == 2
        shutil.rmtree(root)
        shutil.rmtree(tmp_path / f"r{step}")
    assert kills >= 8 and published >= 1, (kills, published)
