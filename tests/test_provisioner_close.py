"""A server stopping while a kernel moves to its placeholder: the shutdown's cleanup waits for
the placeholder being started, then stops it and removes its folder; the start does not fail."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.timeout(120)
def test_cleanup_during_a_placeholder_start_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import jupyter_client.connect as connect

    from jupyter_portable.orchestration.provisioner import PortableProvisioner

    prov = PortableProvisioner(kernel_id="k-1", kernel_spec=None)
    prov._workspace_root = str(tmp_path)
    prov._no_machine = {"state": "LOST", "reason": "test", "first": False}
    writing, go_on = threading.Event(), threading.Event()
    real = connect.write_connection_file

    folders: list[str] = []

    def slow_write(fname: str, **kwargs: Any) -> Any:
        folders.append(os.path.dirname(fname))
        writing.set()
        assert go_on.wait(60)
        return real(fname, **kwargs)

    monkeypatch.setattr(connect, "write_connection_file", slow_write)
    started: dict[str, Any] = {}

    def launch() -> None:
        try:
            started["conn"] = prov._launch_placeholder("k-1")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            started["error"] = exc

    launcher = threading.Thread(target=launch)
    launcher.start()
    assert writing.wait(60), "the start reached its connection file"
    closer = threading.Thread(target=prov._close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "the cleanup waits for the start in progress"
    go_on.set()
    launcher.join(60)
    closer.join(60)
    assert "error" not in started, started.get("error")
    assert "conn" in started
    assert prov._placeholder is None and prov._placeholder_dir is None, "the cleanup stopped what was started"
    assert folders and not os.path.exists(folders[0]), "its folder is removed"


@pytest.mark.timeout(120)
def test_a_stop_during_a_launch_lets_the_launch_finish_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jupyter_client asserts the kernel is up right after the launch returns: a server stop that
    overlaps a kernel's move to its placeholder must not kill it before that."""
    import asyncio

    import jupyter_client.connect as connect

    from jupyter_portable.orchestration.provisioner import PortableProvisioner

    prov = PortableProvisioner(kernel_id="k-2", kernel_spec=None)
    prov._workspace_root = str(tmp_path)
    prov._no_machine = {"state": "LOST", "reason": "test", "first": False}
    writing, go_on = threading.Event(), threading.Event()
    real = connect.write_connection_file

    def slow_write(fname: str, **kwargs: Any) -> Any:
        writing.set()
        assert go_on.wait(60)
        return real(fname, **kwargs)

    monkeypatch.setattr(connect, "write_connection_file", slow_write)
    seen: list[bool] = []

    async def scenario() -> None:
        async def launch() -> None:
            await prov.launch_kernel([], kernel_id="k-2")
            seen.append(prov.has_process)  # what jupyter_client asserts at once

        task = asyncio.create_task(launch())
        while not writing.is_set():
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(prov.kill())
        await asyncio.sleep(0.2)
        assert not stopping.done(), "the stop waits for the launch"
        go_on.set()
        await task
        await stopping
        await prov.cleanup()

    asyncio.run(scenario())
    assert seen == [True]
    assert prov._placeholder is None and prov._placeholder_dir is None
