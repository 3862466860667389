"""Objects written together (``write_batch``): all readable when it returns, and a process
killed at any step leaves no object under its name whose bytes are not whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hooks_site.portable_faults import fault_env

from jupyter_portable.store.backend import LocalBackend
from jupyter_portable.store.repo import digest, object_key

_WRITER = """
import sys
from jupyter_portable.store.backend import LocalBackend
from jupyter_portable.store.repo import object_key, digest
bodies = [bytes([i]) * (100_000 + i) for i in range(3)]
LocalBackend(sys.argv[1]).write_batch([(object_key(digest(b)), b) for b in bodies])
print("done")
"""


def _objects(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if not name.startswith(".tmp-"):
                out[name] = (Path(dirpath) / name).read_bytes()
    return out


def test_a_batch_is_readable_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path))
    bodies = [os.urandom(n) for n in (0, 10, 70_000)]
    items = [(object_key(digest(b)), b) for b in bodies]
    backend.write_batch(items)
    backend.write_batch(items)  # the same objects again: harmless
    for key, body in items:
        assert backend.read(key) == body
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_a_kill_at_any_step_leaves_only_whole_objects(tmp_path: Path) -> None:
    steps = 0
    for n in range(1, 40):
        root = tmp_path / f"kill{n}"
        env = fault_env(JUPYTER_PORTABLE_KILL_AT=str(n))
        proc = subprocess.run([sys.executable, "-c", _WRITER, str(root)], env=env, capture_output=True, text=True,
                              timeout=120)
        for name, data in _objects(root).items():
            assert digest(data) == name, f"kill at step {n}: object {name[:12]} holds other bytes"
        if proc.returncode == 0:
            assert "done" in proc.stdout and len(_objects(root)) == 3
            break
        assert proc.returncode == -9, proc.stderr
        steps += 1
    assert steps >= 9, f"only {steps} kill points (temp, fsynced and renamed of each object)"
