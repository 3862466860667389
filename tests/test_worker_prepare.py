"""The worker's work thread (``agent.prepare``): when the kernel runs on the worker's own Python,
it is started before the workspace's files are fetched, from the manifest alone; when the
lockfile's environment must be built first, the files are fetched beside that build and the
kernel starts once its Python exists. Real store, real kernel process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace

from jupyter_portable.worker import agent
from jupyter_portable.worker.kernel import stop_kernel
from jupyter_portable.worker.state import AgentState

pytestmark = pytest.mark.timeout(120)


def _state(tmp_path: Path, ws: Any, version: int, environment: dict[str, Any]) -> AgentState:
    return AgentState({"workspace_id": ws.workspace_id, "allocation_id": "al-prepare", "store": ws.store.url,
                       "version": version, "epoch": 1, "workdir": str(tmp_path / "machine" / "work"),
                       "state_dir": str(tmp_path / "machine" / "state"), "environment": environment})


def _with_lockfile(ws: Any, lock: bytes) -> int:
    """Publish a version of ``ws`` that records ``lock`` as its lockfile; its number."""
    from jupyter_portable.core.manifest import ParentRef

    store = ws.store
    head, _ = store.read_head(ws.workspace_id)
    base = store.read_manifest(ws.workspace_id)
    runtime = {**(base.runtime or {}), "lockfile": store.put_object(lock)}
    store.publish(replace(base, version=base.version + 1, parent=ParentRef(base.version, head.manifest or ""),
                          runtime=runtime, message="lockfile"), expected_version=base.version, epoch=head.epoch)
    return int(base.version + 1)


@pytest.fixture
def states() -> Iterator[list[AgentState]]:
    made: list[AgentState] = []
    yield made
    for state in made:
        stop_kernel(state)


def _watch_materialize(monkeypatch: pytest.MonkeyPatch, hold: threading.Event | None = None) -> list[bool]:
    """Record, as the fetch begins, whether a kernel process was already running; with ``hold``,
    the fetch also waits until it is set."""
    seen: list[bool] = []
    real = agent.materialize

    def watched(state: AgentState) -> None:
        seen.append(state.kernel is not None and state.kernel.poll() is None)
        if hold is not None:
            assert hold.wait(60)
        real(state)

    monkeypatch.setattr(agent, "materialize", watched)
    return seen


@pytest.mark.parametrize("mode", ["image", "auto"])
def test_a_kernel_on_this_python_starts_before_the_files_are_fetched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: list[AgentState], mode: str) -> None:
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    # auto: the lockfile pins only what this Python has (pip, at the version installed here)
    from importlib.metadata import version

    number = _with_lockfile(ws, f"pip=={version('pip')}\n".encode())
    seen = _watch_materialize(monkeypatch)
    state = _state(tmp_path, ws, number, {"mode": mode})
    states.append(state)
    agent.prepare(state)
    assert state.phase == "ready", state.error
    assert seen == [True]  # the kernel was up when the fetch began
    assert state.env_build is not None and state.env_build["mode"] == "image"
    assert state.prestarted and state.kernel is not None and state.kernel.poll() is None
    assert (Path(state.workdir) / "train.py").read_text() == "print('training')\n"


def test_a_lockfile_environment_is_built_beside_the_fetch_and_the_kernel_starts_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: list[AgentState]) -> None:
    """auto on a Python that lacks a recorded package: no kernel before the build; the build and the
    fetch overlap (the fetch is held until the build ran); the kernel then runs on the built venv."""
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    number = _with_lockfile(ws, b"surely-not-installed-here==1.0\n")
    built = threading.Event()
    seen = _watch_materialize(monkeypatch, hold=built)
    venv_python = tmp_path / "venv-python"
    said: list[str] = []

    def build(state: AgentState, *, image: bool | None = None) -> None:
        assert image is False  # prepare decided already; the decision is not made twice
        said.append(state.progress["message"])
        state.kernel_python = str(venv_python)
        built.set()

    monkeypatch.setattr(agent, "build_environment", build)
    started: list[str] = []
    monkeypatch.setattr(agent, "prestart_kernel", lambda state: started.append(state.kernel_python))
    state = _state(tmp_path, ws, number, {"mode": "auto"})
    states.append(state)
    agent.prepare(state)
    assert state.phase == "ready", state.error
    assert seen == [False]  # no kernel on the wrong Python while the files were fetched
    assert started == [str(venv_python)]
    assert len(said) == 1 and "lacks 1 recorded package(s) (surely-not-installed-here==1.0" in said[0]


def test_a_bad_mode_fails_the_work_with_its_name(tmp_path: Path, states: list[AgentState]) -> None:
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    state = _state(tmp_path, ws, 1, {"mode": "conda"})
    states.append(state)
    agent.prepare(state)
    assert state.phase == "failed" and "unknown environment mode 'conda'" in (state.error or "")
    assert state.kernel is None
