"""Racing writers: one wins, the other gets a clear conflict, history stays linear.
Epoch fencing: a copy whose allocation lost its lease can never publish again."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import ConflictError, FencedError, Workspace
from jupyter_portable.core.manifest import ParentRef
from jupyter_portable.store.repo import Store


def _linear(store: Store, ws: str) -> list[int]:
    history = store.history(ws)
    versions = [m.version for m in history]
    assert versions == list(range(len(versions), 0, -1)), versions
    for newer, older in zip(history, history[1:], strict=False):
        assert newer.parent is not None and newer.parent.version == older.version
    return versions


def _race(store_url: str, candidates: list, expected: int) -> list[object]:
    """Publish every candidate at once from its own thread; each result or ConflictError."""
    barrier = threading.Barrier(len(candidates))
    results: list[object] = [None] * len(candidates)

    def publish(i: int) -> None:
        barrier.wait()
        try:
            results[i] = Store.open(store_url).publish(candidates[i], expected_version=expected, epoch=0)
        except ConflictError as exc:
            results[i] = exc

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(candidates))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_publishes_of_one_version_one_wins(store_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a"})
    ws = Workspace.init(src, store_url)
    ws.snapshot(progress=None)
    store, wsid = Store.open(store_url), ws.workspace_id
    for round_ in range(3):
        head, _ = store.read_head(wsid)
        base = store.read_manifest(wsid)
        candidates = [replace(base, version=head.version + 1, message=f"writer {i}",
                              parent=ParentRef(head.version, head.manifest or ""))
                      for i in range(6)]
        results = _race(store_url, candidates, head.version)
        wins = [r for r in results if isinstance(r, str)]
        losses = [r for r in results if isinstance(r, ConflictError)]
        assert len(wins) == 1 and len(losses) == len(candidates) - 1, results
        assert all("first" in str(e) or "moved" in str(e) or "changed" in str(e) for e in losses)
        assert _linear(store, wsid)[0] == round_ + 2


def test_two_copies_snapshot_at_once(cli, store_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_tree(src, {"a.txt": "a"})
    ws = Workspace.init(src, store_url)
    ws.snapshot(progress=None)
    copies = []
    for name in ("left", "right"):
        dest = tmp_path / name
        Workspace.restore(store_url, ws.workspace_id, dest, progress=None)
        (dest / f"{name}.txt").write_text(name)
        copies.append(dest)
    procs = [subprocess.Popen([sys.executable, "-m", "jupyter_portable", "snapshot", "--json", "-q"],
                              cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for d in copies]
    outs = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    codes = sorted(o[2] for o in outs)
    assert codes == [0, 1], outs
    winner = next(o for o in outs if o[2] == 0)
    loser = next(o for o in outs if o[2] == 1)
    assert json.loads(winner[0])["version"] == 2
    assert loser[1].startswith("error: ") and ("version 2" in loser[1] or "first" in loser[1])
    assert _linear(Store.open(store_url), ws.workspace_id) == [2, 1]


def test_fenced_copy_can_never_publish(store_url: str, tmp_path: Path, cli) -> None:
    src = tmp_path / "old-allocation"
    write_tree(src, {"a.txt": "a"})
    ws = Workspace.init(src, store_url)
    ws.snapshot(progress=None)
    # A new allocation claims the workspace (Continue elsewhere): the epoch moves on.
    store = Store.open(store_url)
    assert store.claim_epoch(ws.workspace_id) == 1
    new = tmp_path / "new-allocation"
    Workspace.restore(store_url, ws.workspace_id, new, progress=None)
    # The old worker comes back from the dead and tries to publish.
    (src / "a.txt").write_text("stale work")
    with pytest.raises(FencedError):
        ws.snapshot(progress=None)
    with pytest.raises(FencedError):
        ws.snapshot(force=True, progress=None)
    proc = cli("snapshot", cwd=src, check=False)
    assert proc.returncode == 1 and "newer allocation" in proc.stderr
    assert cli.json("status", cwd=src)["fenced"] is True
    # The new allocation publishes normally.
    (new / "b.txt").write_text("fresh")
    assert Workspace.find(new).snapshot(progress=None).version == 2
    assert _linear(store, ws.workspace_id) == [2, 1]


def test_writer_that_read_the_head_before_a_claim_cannot_publish(file_store: str, tmp_path: Path) -> None:
    src = tmp_path / "w"
    write_tree(src, {"a.txt": "a"})
    ws = Workspace.init(src, file_store)
    ws.snapshot(progress=None)
    store = Store.open(file_store)
    head, token = store.read_head(ws.workspace_id)
    store.claim_epoch(ws.workspace_id)  # happens between the read and the swap
    base = store.read_manifest(ws.workspace_id)
    stale = replace(base, version=2, parent=ParentRef(1, head.manifest or ""))
    with pytest.raises(FencedError):
        store.publish(stale, expected_version=1, epoch=0)
    with pytest.raises(ConflictError):
        store.backend.swap(f"workspaces/{ws.workspace_id}/HEAD", head.to_bytes(), token)


def test_claiming_an_epoch_while_another_writer_moves_the_head_retries_and_fences_it(tmp_path: Path) -> None:
    """A Continue claims the epoch as the server records the lost machine (seen on S3 under load):
    the claim reads the head again and lands above it, instead of failing the Continue."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    ws = Workspace.init(root, f"file://{tmp_path / 'store'}")
    ws.snapshot("first", progress=None)
    store, wsid = ws.store, ws.workspace_id
    before = store.read_head(wsid)[0].epoch
    swap = store.backend.swap
    moved: list[int] = []

    def racing_swap(key: str, data: bytes, token: object) -> object:
        if not moved:  # the other writer gets there first, once: a real swap of the same head
            head, other = store.read_head(wsid)
            moved.append(head.epoch + 1)
            swap(key, replace(head, epoch=head.epoch + 1).to_bytes(), other)
        return swap(key, data, token)

    store.backend.swap = racing_swap  # type: ignore[method-assign]
    try:
        epoch = store.claim_epoch(wsid)
    finally:
        store.backend.swap = swap  # type: ignore[method-assign]
    assert moved == [before + 1] and epoch == before + 2 == store.read_head(wsid)[0].epoch
    # the writer that lost is fenced from here on
    with pytest.raises(FencedError):
        ws.record_allocation({"allocation_id": "al-old"}, epoch=moved[0])
