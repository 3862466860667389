"""Restore reads a pack's files with a few ranges, not one request per file, when the
version needs less than half of the pack (the rest belongs to older versions)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from conftest import read_tree, write_tree

from jupyter_portable import IntegrityError, Workspace
from jupyter_portable.core.manifest import FileEntry, PackRef
from jupyter_portable.engine.restore import pack_spans, restore
from jupyter_portable.store.backend import LocalBackend
from jupyter_portable.store.repo import Store


class RangeCounting(LocalBackend):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ranges: list[tuple[str, int, int]] = []

    def read_range(self, key: str, start: int, end: int) -> bytes:
        self.ranges.append((key, start, end))
        return super().read_range(key, start, end)


def _at(offset: int, length: int, name: str = "f") -> FileEntry:
    return FileEntry(name, length, 0o644, "0" * 64, 0, PackRef("a" * 64, offset, length))


def test_neighbours_share_a_range_and_far_ones_do_not() -> None:
    entries = [_at(5000, 10, "c"), _at(0, 100, "a"), _at(100, 50, "b"), _at(5000, 10, "c2")]
    spans = pack_spans(entries, gap=1000, most=10_000)
    assert [(s, e, [m.path for m in ms]) for s, e, ms in spans] == [(0, 150, ["a", "b"]), (5000, 5010, ["c", "c2"])]
    # a gap of exactly `gap` bytes starts a new range; a range never passes `most` bytes
    assert [(s, e) for s, e, _ in pack_spans([_at(0, 10), _at(1010, 10)], gap=1000)] == [(0, 10), (1010, 1020)]
    spans = pack_spans([_at(i * 100, 100) for i in range(10)], gap=1000, most=300)
    assert [(s, e) for s, e, _ in spans] == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert [(s, e) for s, e, _ in pack_spans([_at(0, 500)], gap=10, most=100)] == [(0, 500)]  # larger than most


def test_every_entry_lands_in_exactly_one_range_that_holds_it() -> None:
    rnd = random.Random(15)
    entries = [_at(rnd.randrange(0, 1 << 22), rnd.randrange(0, 5000), f"f{i}") for i in range(2000)]
    spans = pack_spans(entries, gap=4096, most=1 << 16)
    seen = [m.path for _s, _e, ms in spans for m in ms]
    assert sorted(seen) == sorted(e.path for e in entries)
    for start, end, members in spans:
        assert all(start <= m.pack.offset and m.pack.offset + m.pack.length <= end for m in members if m.pack)
    assert [s for s, _e, _m in spans] == sorted(s for s, _e, _m in spans)


def _workspace_keeping_a_fifth(tmp_path: Path) -> tuple[Workspace, dict[str, bytes]]:
    src = tmp_path / "src"
    files = {f"d{i % 7}/f{i:04d}.bin": os.urandom(700) for i in range(400)}
    write_tree(src, files)
    ws = Workspace.init(src, str(tmp_path / "store"))
    ws.snapshot(progress=None)
    kept = {}
    for i, (rel, data) in enumerate(files.items()):
        if i % 5:
            (src / rel).unlink()
        else:
            kept[rel] = data
    assert ws.snapshot(progress=None).version == 2  # the same pack, a fifth of it still needed
    return ws, kept


def test_a_version_needing_a_fifth_of_a_pack_reads_it_in_one_range(tmp_path: Path) -> None:
    ws, kept = _workspace_keeping_a_fifth(tmp_path)
    backend = RangeCounting(str(tmp_path / "store"))
    dest = tmp_path / "out"
    res = restore(Store(backend), ws.workspace_id, dest)
    assert res.files == len(kept) == 80
    assert read_tree(dest) == {rel: (data, 0o644) for rel, data in kept.items()}
    packs = {k for k, _s, _e in backend.ranges}
    assert len(backend.ranges) == len(packs) == 1, backend.ranges  # one request, not 80
    (_key, start, end), = backend.ranges
    assert res.fetched_bytes == end - start < 400 * 700


def test_a_short_range_from_a_damaged_pack_is_refused_and_leaves_no_wrong_file(tmp_path: Path) -> None:
    ws, kept = _workspace_keeping_a_fifth(tmp_path)

    class Truncating(RangeCounting):
        def read_range(self, key: str, start: int, end: int) -> bytes:
            return super().read_range(key, start, end)[: (end - start) // 2]

    dest = tmp_path / "out"
    with pytest.raises(IntegrityError, match="do not match its hash"):
        restore(Store(Truncating(str(tmp_path / "store"))), ws.workspace_id, dest)
    # what is there is whole and right; nothing half-written took a file's name
    for rel, (data, _mode) in read_tree(dest).items():
        assert kept[rel] == data
