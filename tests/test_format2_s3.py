"""Format 2 on S3: a one-file change in a 100,000-file workspace writes kilobytes, counted as the
PUT bodies that reach the moto server through a proxy, not the whole file list."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_bucket
from s3_faults import FaultProxy

pytestmark = pytest.mark.timeout(900)

FOLDERS, PER_FOLDER = 100, 1000  # 100,000 files


@pytest.fixture
def proxy(moto_endpoint: str, aws_env: dict[str, str]) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_endpoint).start()  # rate 0: a counter, no faults
    yield p
    p.stop()


def test_a_one_file_change_in_100000_files_puts_kilobytes(proxy: FaultProxy, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable import Workspace

    root = tmp_path / "big"
    for d in range(FOLDERS):
        folder = root / "shards" / f"d{d:03d}"
        folder.mkdir(parents=True)
        for f in range(PER_FOLDER):
            (folder / f"f{f:04d}.txt").write_bytes(b"%d,%d\n" % (d, f))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    ws = Workspace.init(root, f"s3://{make_bucket()}/big")
    first = ws.snapshot("cold", progress=None)
    assert first.version == 1
    cold_bytes = proxy.counts.put_bytes

    proxy.counts.puts = proxy.counts.put_bytes = 0
    time.sleep(0.01)  # a new mtime for the edited file on coarse file systems
    (root / "shards" / "d042" / "f0007.txt").write_bytes(b"changed\n")
    second = ws.snapshot("one file", progress=None)
    assert second.version == 2 and second.changed
    one_file = proxy.counts.put_bytes
    # the file, one tree for its folder (1,000 entries) and one per level above, the root record
    assert one_file <= 1_000_000, (one_file, proxy.counts.puts)
    assert one_file * 20 < cold_bytes, (one_file, cold_bytes)

    proxy.counts.puts = proxy.counts.put_bytes = 0
    third = ws.snapshot("nothing", progress=None)
    assert not third.changed and proxy.counts.put_bytes == 0

    manifest = ws.store.read_manifest(ws.workspace_id, 2)
    assert len(manifest.files) == FOLDERS * PER_FOLDER
    assert json.loads(json.dumps(manifest.find("shards/d042/f0007.txt").to_json()))["size"] == 8
