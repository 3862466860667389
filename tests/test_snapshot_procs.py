"""Small files read and hashed in other processes (a large snapshot's path) publish exactly
what the threads publish, see a file that changed while listed, and fall back to threads."""

from __future__ import annotations

import json
import os
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from conftest import read_tree, write_tree

from jupyter_portable import Workspace
from jupyter_portable.engine.hashproc import read_small
from jupyter_portable.engine.listing import Found
from jupyter_portable.engine.snapshot import file_saver, options, scanner, uploader, walk
from jupyter_portable.store.repo import digest


def _layout() -> dict[str, str]:
    files = {f"d{i}/sub/f{j:03d}.txt": f"file {i} {j}\n" * (j + 1) for i in range(4) for j in range(50)}
    files["d0/same-a.txt"] = files["d0/same-b.txt"] = "one blob twice\n"
    files["empty.txt"] = ""
    files["d1/sub/again.txt"] = files["d2/sub/again.txt"] = "one blob in two folders\n"
    return files


def _snapshot(tmp_path: Path, name: str) -> tuple[Path, Workspace]:
    src = tmp_path / name
    write_tree(src, _layout())
    for dirpath, _dirs, names in os.walk(src):
        for n in names:
            os.utime(os.path.join(dirpath, n), (1_700_000_000, 1_700_000_000))
    ws = Workspace.init(src, str(tmp_path / f"store-{name}"))
    return src, ws


def test_processes_publish_the_same_version_as_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _src_t, by_threads = _snapshot(tmp_path, "threads")
    res_t = by_threads.snapshot(progress=None)
    monkeypatch.setattr(options, "DEFAULT", options.Options(process_min=0))
    spawned: list[object] = []
    real = file_saver.FileSaver.process_pool

    def watching(self: file_saver.FileSaver):  # type: ignore[no-untyped-def]
        got = real(self)
        spawned.append(got)
        return got

    monkeypatch.setattr(file_saver.FileSaver, "process_pool", watching)
    listed: list[str] = []
    real_listing = scanner.Scanner._listing

    def listing(self: scanner.Scanner, rel: str, abs_dir: str, whole: bool):  # type: ignore[no-untyped-def]
        got = real_listing(self, rel, abs_dir, whole)
        if got[2] is not None:
            listed.append(rel)
        return got

    monkeypatch.setattr(scanner.Scanner, "_listing", listing)
    joined: list[bool] = []
    real_add = uploader.Uploader.add_fragment

    def add_fragment(self: uploader.Uploader, frag: uploader.Frag) -> bool:
        joined.append(real_add(self, frag))
        return joined[-1]

    monkeypatch.setattr(uploader.Uploader, "add_fragment", add_fragment)
    src_p, by_procs = _snapshot(tmp_path, "procs")
    res_p = by_procs.snapshot(progress=None)
    assert spawned and spawned[0] is not None, "the snapshot used other processes"
    assert "d3/sub" in listed, "folders were listed and read ahead by another process"
    assert True in joined and False in joined, "a folder's blob stored already: its files taken one by one"
    assert (res_p.files, res_p.bytes, res_p.hashed) == (res_t.files, res_t.bytes, res_t.hashed)
    tree_t = by_threads.store.read_manifest(by_threads.workspace_id, 1).tree
    tree_p = by_procs.store.read_manifest(by_procs.workspace_id, 1).tree
    assert tree_p == tree_t, "the same trees, byte for byte"
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store-procs"), by_procs.workspace_id, out, progress=None)
    assert read_tree(out) == read_tree(src_p)
    assert not by_procs.snapshot(progress=None).changed
    with by_procs.copy.statcache() as cache:  # every packed blob recorded, by the cache's own thread
        reader = cache.blob_reader()
        assert reader is not None
        try:
            for path, text in _layout().items():
                if text:
                    got = reader.get(digest(text.encode()))
                    assert got is not None and got[2] == len(text.encode()), path
        finally:
            reader.close()
    # the stat cache lost: folders are listed (and read) ahead again, but each file is then
    # compared with the version's entry one by one: the same version, nothing stored again
    for suffix in ("", "-wal", "-shm"):
        Path(f"{by_procs.copy.statcache_path}{suffix}").unlink(missing_ok=True)
    joined.clear()
    again = by_procs.snapshot(progress=None)
    assert not again.changed and again.new_bytes == 0 and again.hashed == res_p.hashed
    assert not joined, "no folder's files were taken whole"


def test_a_folder_listed_elsewhere_is_what_the_walk_lists(tmp_path: Path) -> None:
    from jupyter_portable.engine.hashproc import list_and_pack
    from jupyter_portable.engine.listing import Lister

    write_tree(tmp_path, {"a/x.txt": "x", "a/big.bin": "b" * 300, "a/skip.tmp": "ignored", "a/sub/y.txt": "y",
                          "a/cache/z.txt": "z", "a/.ipynb_checkpoints/c.txt": "c", ".portableignore": "*.tmp\ncache/\n",
                          "plain.txt": "p"})
    (tmp_path / ".portable").mkdir()
    lister = Lister(tmp_path)
    for rel in ("a", ""):
        own = lister.list(rel, str(tmp_path / rel) if rel else str(tmp_path))
        got = lister.plain(rel, str(tmp_path / rel) if rel else str(tmp_path), 100)
        assert got is not None
        files, dirs, sig = got
        assert sorted(dirs) == sorted(own.dirs) and sig == own.sig
        prefix = f"{rel}/" if rel else ""
        assert sorted((prefix + n, *st) for n, *st in files) == sorted(
            (f.path, f.st.st_mode, f.st.st_size, f.st.st_mtime_ns, f.st.st_ctime_ns, f.st.st_ino) for f in own.files)
    assert lister.plain("a", str(tmp_path / "a"), 2) is None, "more files than asked for: the walk lists it"
    # read with the listing, as far as the budget goes: out of the listing, into a fragment
    got2 = list_and_pack(str(tmp_path), lister.salt, "a", 100, 200, 1_000, 2**63)
    assert got2 is not None
    (rest, _dirs, _sig), frag = got2
    assert [t[0] for t in rest] == ["big.bin"], "big.bin is not small; skip.tmp is ignored"
    assert [t[0] for t in frag.files] == ["x.txt"] and frag.body == b"x"
    assert frag.blobs == [(digest(b"x"), 0, 1)] and frag.blob_of == [0]
    x = (tmp_path / "a" / "x.txt").stat()
    head, _i, tail = frag.texts[0][1:]
    entry = {"name": "x.txt", "type": "file", "size": 1, "mode": x.st_mode & 0o777, "hash": digest(b"x"),
             "mtime_ns": x.st_mtime_ns, "pack": {"id": "P", "offset": 7, "length": 1}}
    assert head + '{"id":"P","length":1,"offset":7}' + tail == json.dumps(entry, separators=(",", ":"), sort_keys=True)
    assert frag.rows == [("x.txt", 1, x.st_mtime_ns, x.st_ctime_ns, x.st_ino, None)] and frag.sound
    fresh = list_and_pack(str(tmp_path), lister.salt, "a", 100, 200, 1_000, x.st_mtime_ns)
    assert fresh is not None and fresh[1].rows == [("x.txt", None, None, None, None, None)] and not fresh[1].sound, \
        "a file too fresh to trust has an unknown row, and the folder's signature is not kept"
    none_read = list_and_pack(str(tmp_path), lister.salt, "a", 100, 1_000, 0, 2**63)
    assert none_read is not None and not none_read[1].files and len(none_read[0][0]) == 2
    assert list_and_pack(str(tmp_path), b"other rules", "a", 100, 200, 1_000, 2**63) is None
    # anything but regular files and folders is left to the walk (which warns and records it)
    os.symlink("x.txt", tmp_path / "a" / "link")
    assert lister.plain("a", str(tmp_path / "a"), 100) is None
    os.unlink(tmp_path / "a" / "link")
    os.mkfifo(tmp_path / "a" / "pipe")
    assert lister.plain("a", str(tmp_path / "a"), 100) is None
    os.unlink(tmp_path / "a" / "pipe")
    (tmp_path / "a" / "back\\slash.txt").write_text("odd")
    assert lister.plain("a", str(tmp_path / "a"), 100) is None
    assert lister.plain("gone", str(tmp_path / "gone"), 100) is None


def test_a_listing_whose_helper_died_is_made_by_the_walk(tmp_path: Path) -> None:
    src, ws = _snapshot(tmp_path, "src")
    from jupyter_portable.engine.progress import Progress
    from jupyter_portable.engine.trees import BaseTree
    with ws.copy.statcache() as cache:
        up = uploader.Uploader(ws.store, 1, Progress("t"))
        run = walk.Walk(ws.copy, cache, False, BaseTree(ws.store, None), up, Progress("t"), 0, {})
        try:
            cases = (("d0", MemoryError(), ["d0/same-a.txt", "d0/same-b.txt"]),
                     ("d1", BrokenProcessPool("killed"), []))
            for rel, error, files in cases:
                dead: Future[object] = Future()
                dead.set_exception(error)
                run.scanner.listed[rel] = dead  # type: ignore[assignment]
                listing, reads, frag = run.scanner._listing(rel, str(src / rel), True)
                assert reads is None and frag is None and rel not in run.scanner.listed
                assert sorted(f.path for f in listing.files) == files
                assert [n for n, _p in listing.dirs] == ["sub"] and listing.sig is not None
        finally:
            run.files.shutdown()
            up.pool.shutdown()
    assert run.files.procs_failed, "no more folders are sent to processes"


def test_read_small_returns_nothing_for_a_file_that_moved_on(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"hello")
    st = os.lstat(tmp_path / "a.txt")
    m, c, i = st.st_mtime_ns, st.st_ctime_ns, st.st_ino
    got = read_small(str(tmp_path), [("a.txt", 5, m, c, i), ("a.txt", 4, m, c, i), ("a.txt", 5, m + 1, c, i),
                                     ("a.txt", 5, m, c + 1, i), ("a.txt", 5, m, c, i + 1), ("gone.txt", 3, 0, 0, 0)])
    assert got == [(digest(b"hello"), b"hello"), None, None, None, None, None], "size, mtime, ctime, inode"
    (tmp_path / "a.txt").write_bytes(b"hello, longer now")
    os.utime(tmp_path / "a.txt", ns=(st.st_mtime_ns, st.st_mtime_ns))
    assert read_small(str(tmp_path), [("a.txt", 5, m, c, i)]) == [None], "a file that grew is seen"


def test_a_dead_helper_process_leaves_the_batch_to_the_threads(tmp_path: Path) -> None:
    src, ws = _snapshot(tmp_path, "src")
    copy = ws.copy
    from jupyter_portable.engine.progress import Progress
    from jupyter_portable.engine.trees import BaseTree
    with copy.statcache() as cache:
        up = uploader.Uploader(ws.store, 1, Progress("t"))
        run = walk.Walk(copy, cache, False, BaseTree(ws.store, None), up, Progress("t"), 0, {})
        try:
            st = os.lstat(src / "empty.txt")
            batch: list[tuple[Found, None]] = [(Found("empty.txt", st), None)]
            dead: Future[list[tuple[str, bytes] | None]] = Future()
            dead.set_exception(BrokenProcessPool("killed"))
            out = run.files.take_read(batch, dead)
        finally:
            run.files.shutdown()
            up.pool.shutdown()
    assert run.files.procs_failed, "no more batches are sent to processes"
    assert len(out) == 1 and out[0][1] is not None and out[0][1]["hash"] == digest(b"")


def test_verify_in_other_processes_reports_what_threads_report(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.engine import verify as ver

    src, ws = _snapshot(tmp_path, "src")
    ws.snapshot(progress=None)
    (src / "d1" / "sub" / "f007.txt").write_bytes(b"tampered, same length?")
    (src / "d2" / "sub" / "f010.txt").unlink()
    os.chmod(src / "d3" / "sub" / "f001.txt", 0o600)
    (src / "d0" / "sub" / "f002.txt").write_bytes((src / "d0" / "sub" / "f002.txt").read_bytes()[::-1])
    by_threads = ws.verify()
    monkeypatch.setattr(ver, "PROCESS_MIN", 0)
    used: list[object] = []
    real = ver._Helpers.get

    def watching(self: ver._Helpers, seen: int):  # type: ignore[no-untyped-def]
        got = real(self, seen)
        used.append(got)
        return got

    monkeypatch.setattr(ver._Helpers, "get", watching)
    by_procs = ws.verify()
    assert any(u is not None for u in used), "other processes checked files"
    assert not by_procs.ok
    assert by_procs.to_json() == by_threads.to_json()
    reasons = {m["path"]: m["reason"] for m in by_procs.mismatches}
    assert reasons["d2/sub/f010.txt"] == "missing"
    assert reasons["d0/sub/f002.txt"] == "content differs (hash mismatch)"
    assert reasons["d3/sub/f001.txt"].startswith("mode ")
    assert "d1/sub/f007.txt" in reasons


def test_folders_statted_ahead_by_another_process_see_each_change(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src, ws = _snapshot(tmp_path, "src")
    first = ws.snapshot(progress=None)
    monkeypatch.setattr(options, "DEFAULT", options.Options(ahead_min=0, ahead_chunk=20))  # a batch per folder or two
    taken: list[tuple[str, bool]] = []
    real = scanner.Ahead.take

    def watching(self: scanner.Ahead, rel: str):  # type: ignore[no-untyped-def]
        got = real(self, rel)
        taken.append((rel, got[0]))
        return got

    monkeypatch.setattr(scanner.Ahead, "take", watching)
    assert not ws.snapshot(progress=None).changed
    assert taken, "the walk asked the look-ahead"
    # the far end of the walk was statted by the other process (the walk met it there)
    for _ in range(20):
        taken.clear()
        assert not ws.snapshot(progress=None).changed
        if any(by_helper for _rel, by_helper in taken):
            break
    assert any(by_helper for _rel, by_helper in taken), taken
    # a change anywhere is seen, in a folder of either end
    (src / "d0/sub/f001.txt").write_text("changed at the near end\n")
    (src / "d3/sub/f049.txt").write_text("changed at the far end, same size?\n")
    os.unlink(src / "d2/sub/f010.txt")
    res = ws.snapshot(progress=None)
    assert res.changed and res.version == first.version + 1 and res.files == first.files - 1
    out = tmp_path / "out"
    Workspace.restore(str(tmp_path / "store-src"), ws.workspace_id, out, progress=None)
    assert read_tree(out) == read_tree(src)


def test_quick_folders_refuses_other_ignore_rules_and_reports_a_gone_folder(tmp_path: Path) -> None:
    from jupyter_portable.engine.hashproc import quick_folders
    from jupyter_portable.engine.listing import Lister

    write_tree(tmp_path, {"a/x.txt": "x", "a/b/y.txt": "y"})
    lister = Lister(tmp_path)
    got = quick_folders(str(tmp_path), lister.salt, ["a", "gone"])
    assert got is not None and got[0] == lister.quick("a", str(tmp_path / "a")) and got[1] is None
    assert quick_folders(str(tmp_path), b"another salt", ["a"]) is None


def test_the_stat_cache_lists_signed_folders_in_walk_order_with_their_own_files(tmp_path: Path) -> None:
    src, ws = _snapshot(tmp_path, "src")
    ws.snapshot(progress=None)
    with ws.copy.statcache() as cache:
        folders = cache.signed_folders()
    paths = [p for p, _n in folders]
    assert paths == sorted(paths, key=lambda p: p.split("/")) and paths[0] == ""
    own = dict(folders)
    assert own["d1/sub"] == 51 and own["d0"] == 2 and own["d1"] == 0 and own[""] == 1


@pytest.mark.timeout(120)
def test_a_look_ahead_whose_helper_died_leaves_every_folder_to_the_walk(tmp_path: Path) -> None:
    import signal

    from jupyter_portable.engine.hashproc import helper_pool
    from jupyter_portable.engine.listing import Lister

    write_tree(tmp_path, {f"d{i:02d}/f.txt": str(i) for i in range(40)})
    folders = [("", 0)] + [(f"d{i:02d}", 1) for i in range(40)]
    lister = Lister(tmp_path)
    procs = helper_pool()
    if procs is None:
        pytest.skip("one core: no helper processes here")
    try:
        ahead = scanner.Ahead(procs, str(tmp_path), lister.salt, folders, options.Options(ahead_chunk=1))
        assert len(ahead.sent) == options.DEFAULT.ahead_in_flight
        # the helper is up and answered the far end (taking it here would move the walk there)
        assert ahead.sent[0].result(timeout=60) == [lister.quick("d39", str(tmp_path / "d39"))]
        for pid in list(procs._processes):  # the helper dies (OOM killer, say)
            os.kill(pid, signal.SIGKILL)
        # once the pool has seen it (the batches in flight may all have been answered before
        # the kill, so that no take would wait on the dead helper)
        with pytest.raises(BrokenProcessPool):
            procs.submit(abs, -1).result()
        taken = [ahead.take(rel) for rel, _n in folders]  # in the walk's order
        assert ahead.broken and all(t == (False, None) for t in taken[:30]), taken
    finally:
        procs.shutdown(wait=True, cancel_futures=True)
