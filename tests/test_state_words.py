"""One vocabulary of states (issue 30, item 5): the REST state, `jupyter portable status` and a
cell's error on the placeholder kernel say a state in the same words (core/state_words.py), as
the workspace is now, never as it was when the kernel started; and after a release a cell asks
before renting, as for the first machine."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import env, jp_root_dir  # noqa: F401 - fixtures
from test_continue_experience import _control, _reply_to, _traceback

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core import state_words
from jupyter_portable.orchestration.provisioner import NO_MACHINE_ENV

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(120)
AT = "2026-12-03T09:00:00Z"
ROUTE = "local/l4"


def _released(root: Path, *, lose: bool = False) -> L.Lifecycle:
    """Take the workspace's lifecycle through a whole Continue, then a seal and a release (or a loss)."""
    from jupyter_portable import Workspace
    from jupyter_portable.workdir import lifecycle_file

    def walk(lc: L.Lifecycle) -> L.Lifecycle:
        lc = L.transition(lc, L.ROUTING, at=AT)
        lc = L.transition(lc, L.ACQUIRING, at=AT, route=ROUTE, allocation_id="al-words1", epoch=lc.epoch + 1)
        for state in (L.PROBING, L.MATERIALIZING, L.VERIFYING):
            lc = L.transition(lc, state, at=AT)
        lc = L.transition(lc, L.READY, at=AT, verified=True, detail={"matched": list(L.READ_BACK_CHECKS)})
        lc = L.transition(lc, L.ACTIVE, at=AT)
        if lose:
            return L.transition(lc, L.LOST, at=AT, reason="the market took the machine back")
        lc = L.transition(lc, L.DRAINING, at=AT, reason="idle")
        lc = L.transition(lc, L.SEALED, at=AT, version=lc.version + 1)
        return L.transition(lc, L.RELEASED, at=AT)

    ws = Workspace.find(root)
    ws.snapshot("second", progress=None)
    return lifecycle_file.update(ws.copy, walk)


def _status(root: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "jupyter_portable", "status"], cwd=root, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def kernel(request: pytest.FixtureRequest, tmp_path: Path, jp_root_dir: Path) -> Iterator[Any]:
    """The placeholder kernel in the workspace, started with ``request.param`` (what the server
    knew when it started it: the machine was still being sealed)."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    facts = request.param
    fname, _ = write_connection_file(str(tmp_path / "kernel.json"), ip="127.0.0.1", key=b"k" * 32)
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_portable.interfaces.kernel.placeholder", "-f", fname],
                            cwd=jp_root_dir, env={**_environ(), NO_MACHINE_ENV: json.dumps(facts),
                                                  "JUPYTER_PORTABLE_WORKSPACE": str(jp_root_dir)})
    client = BlockingKernelClient(connection_file=fname)
    client.load_connection_file()
    client.start_channels()
    try:
        client.kernel_info(reply=True, timeout=60)
        yield client
    finally:
        client.stop_channels()
        proc.kill()
        proc.wait()


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


SEALING = {"state": "DRAINING", "reason": "idle", "first": False, "ask": False, "route": None}
SEALING_ASKS = {**SEALING, "ask": True}


@pytest.mark.parametrize("kernel", [SEALING], indirect=True, ids=["started-while-sealing"])
@pytest.mark.parametrize("lose", [False, True], ids=["released", "lost"])
async def test_the_rest_state_the_cli_and_a_cell_error_say_a_state_in_the_same_words(
        jp_fetch: Any, jp_root_dir: Path, kernel: Any, lose: bool) -> None:
    lc = _released(jp_root_dir, lose=lose)
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert state["lifecycle"]["state"] == lc.state == (L.LOST if lose else L.RELEASED)
    # the server sends the one table; the sidebar and the toolbar read their words from it
    assert state["states"] == state_words.table()
    words = state["states"][lc.state]
    line = state_words.state_line(lc.state, lc.version)
    assert line == f"{lc.state} at version {lc.version}: {words['meaning']}"
    # the CLI
    assert f"machine: {line}; {words['action']}" in _status(jp_root_dir).splitlines()
    # a cell's error: the state now, not the DRAINING the kernel was started in
    msg_id = kernel.execute("print(1)")
    reply = _reply_to(kernel, msg_id, 30)
    assert reply is not None and reply["content"]["ename"] == "NoGPUMachine"
    text = _traceback(reply)
    assert f"The workspace is {line}" in text
    assert "DRAINING" not in text


@pytest.mark.parametrize("kernel", [SEALING_ASKS], indirect=True, ids=["notebooks-ask"])
async def test_after_a_release_a_cell_is_held_while_the_notebook_asks_as_for_the_first_machine(
        jp_root_dir: Path, kernel: Any) -> None:
    _released(jp_root_dir)
    assert _control(kernel, {"asker": True})["content"]["asker"] is True
    msg_id = kernel.execute("print(1)", stop_on_error=False)
    assert _reply_to(kernel, msg_id, 1.5) is None  # held: the question is open, not an error
    _control(kernel, {"answer": "cancel"})
    reply = _reply_to(kernel, msg_id, 30)
    assert reply is not None and reply["content"]["ename"] == "NoGPUMachine"
    text = _traceback(reply)
    # no machine existed to be cancelled: the question was (no route told here: it names none)
    assert "Nothing was rented: the question was cancelled, and the workspace stays RELEASED" in text
    assert "new machine" not in text


def test_every_state_has_its_words_and_only_states_without_a_machine_ask() -> None:
    assert set(state_words.WORDS) == set(L.STATES)
    assert {s for s, w in state_words.WORDS.items() if w.ask} == {L.IDLE, L.RELEASED}
    assert all(not w.machine for s, w in state_words.WORDS.items() if w.ask)
    with pytest.raises(KeyError, match="is not a lifecycle state"):
        state_words.words("PAUSED")
