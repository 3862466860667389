"""The worker's kernel watcher (``worker/activity.watch_kernel``), with real kernels: ``POST /kernel``
hands a kernel over only once the watcher hears it on iopub, so the first cell a notebook sends
after a start or a restart moves the idle clock (a SUB socket hears nothing published before its
subscription reaches the kernel, and a cell missed there is a machine stopped as idle mid-work)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking import BlockingKernelClient

from jupyter_portable.worker.activity import watch_kernel
from jupyter_portable.worker.kernel import start_watched_kernel, stop_kernel
from jupyter_portable.worker.state import AgentState

pytestmark = pytest.mark.timeout(180)


def _state(tmp_path: Path) -> AgentState:
    state = AgentState({"workspace_id": "ws-watch", "allocation_id": "al-watch", "store": str(tmp_path / "store"),
                        "version": 1, "epoch": 1, "workdir": str(tmp_path / "work"),
                        "state_dir": str(tmp_path / "state")})
    state.workdir.mkdir(parents=True)
    state.state_dir.mkdir(parents=True)
    return state


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[AgentState]:
    state = _state(tmp_path)
    threading.Thread(target=watch_kernel, args=(state,), daemon=True).start()
    while not state.activity.watcher_running:
        time.sleep(0.01)
    yield state
    stop_kernel(state)


def _run_cell(conn: dict[str, Any], code: str) -> None:
    """What a notebook does with a kernel it was just given: wait until it answers, then run a cell."""
    kc = BlockingKernelClient()
    kc.load_connection_info(conn)
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        reply = kc.execute_interactive(code, timeout=120, output_hook=lambda _msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()


def _counted_after(state: AgentState, before: float | None) -> None:
    """Wait (the test's timeout bounds it) until the watcher has seen a cell after ``before`` end."""
    act = state.activity
    while not (act.last_execution is not None and (before is None or act.last_execution > before)
               and not act.kernel_busy):
        time.sleep(0.02)


def test_a_kernel_is_handed_over_heard_and_its_first_cells_move_the_idle_clock(watched: AgentState) -> None:
    state = watched
    conn = start_watched_kernel(state, "first")
    # handed over only once the watcher is subscribed to this very kernel
    assert state.activity.watched_port == conn["iopub_port"]
    assert state.activity.last_execution is None  # the kernel's own start and the watcher's probe are no cells
    _run_cell(conn, "x = 1")
    _counted_after(state, None)
    first = state.activity.last_execution

    # a restart (the notebook's, or a move): new ports, heard again before it is handed over
    again = start_watched_kernel(state, "restarted")
    assert again["iopub_port"] != conn["iopub_port"]
    assert state.activity.watched_port == again["iopub_port"]
    _run_cell(again, "y = 2")
    _counted_after(state, first)


def test_a_kernel_that_ends_before_it_is_heard_is_not_waited_for(watched: AgentState) -> None:
    state = watched
    state.kernel_python = "/bin/false"  # exits at once, never listening
    conn = start_watched_kernel(state, "broken", timeout_s=3600)  # the test's timeout is far below
    assert state.kernel is not None and state.kernel.poll() is not None
    assert state.activity.watched_port != conn["iopub_port"]


def test_without_a_watcher_the_kernel_is_handed_over_at_once(tmp_path: Path) -> None:
    state = _state(tmp_path)
    try:
        conn = start_watched_kernel(state, "alone", timeout_s=3600)
        assert state.kernel is not None and conn["iopub_port"] and state.activity.watched_port is None
    finally:
        stop_kernel(state)
