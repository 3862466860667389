"""The helper processes of snapshot, verify and restore live as long as the process that
made their pool, not as long as the thread that happened to start them, and end when that
process ends, however it ends."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jupyter_portable.engine.hashproc import helper_pool

ROOT = Path(__file__).resolve().parents[1]


def test_helpers_started_by_a_thread_that_ended_still_work() -> None:
    pool = helper_pool(most=2, spare_one=False)
    if pool is None:
        pytest.skip("no helper process can be started here")
    try:
        started: list[int] = []
        # the first submits start the processes, in this thread; then it ends (as a restore's
        # writer thread does before the restore is done with its helpers)
        t = threading.Thread(target=lambda: started.extend(f.result() for f in
                                                           [pool.submit(os.getpid) for _ in range(4)]))
        t.start()
        t.join()
        assert started and os.getpid() not in started
        assert sorted(pool.map(abs, range(-50, 0))) == list(range(1, 51))
    finally:
        pool.shutdown(wait=True)  # returns: no helper is left waiting on a lock a killed one held


SCRIPT = """
import os, sys
from jupyter_portable.engine.hashproc import helper_pool
pool = helper_pool(most=1, spare_one=False)
print(pool.submit(os.getpid).result() if pool else 0, flush=True)
sys.stdin.read()
"""


def test_a_helper_ends_when_the_process_that_made_it_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            cwd=ROOT, text=True)
    try:
        assert proc.stdout is not None
        helper = int(proc.stdout.readline())
        if helper == 0:
            pytest.skip("no helper process can be started here")
        fd = os.pidfd_open(helper)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        select.select([fd], [], [])  # readable once the helper has ended (pytest's timeout bounds the wait)
    finally:
        os.close(fd)


UNGUARDED = """
import os
from concurrent.futures.process import BrokenProcessPool
from jupyter_portable.engine.hashproc import helper_pool
# no `if __name__ == "__main__":` here: each spawned helper imports this file, runs this again and fails
pool = helper_pool(most=1, spare_one=False)
if pool is not None:
    try:
        print("helped by", pool.submit(os.getpid).result(), flush=True)
    except BrokenProcessPool:
        print("went on here", flush=True)
    pool.shutdown(wait=True)
    pool.shutdown(wait=True)
"""


def test_helpers_that_break_are_told_once_with_the_usual_cause(tmp_path: Path) -> None:
    script = tmp_path / "analysis.py"
    script.write_text(UNGUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if not proc.stdout:
        pytest.skip("no helper process can be started here")
    assert proc.stdout.strip() == "went on here", proc.stderr[-2000:]
    told = [line for line in proc.stderr.splitlines() if line.startswith("helper processes stopped")]
    assert len(told) == 1, proc.stderr[-2000:]
    assert 'if __name__ == "__main__":' in told[0] and "ran in this process" in told[0]


def test_a_pool_that_worked_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    pool = helper_pool(most=1, spare_one=False)
    if pool is None:
        pytest.skip("no helper process can be started here")
    with caplog.at_level("WARNING", logger="jupyter_portable.engine"):
        assert pool.submit(abs, -3).result() == 3
        pool.shutdown(wait=True)
    assert not [r for r in caplog.records if "helper processes stopped" in r.getMessage()]
