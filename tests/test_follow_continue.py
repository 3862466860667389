"""Issue 43 item 2 at the server, with real parts (a Jupyter server with the extension, local-market
workers, the market taking the machine back): the notebook JupyterLab saves is the user's side.
A machine publishes a version with the notebook as saved then, a newer save reaches it, the machine
is lost, Continue: the next save is forwarded to the new machine, not refused as a conflict of the
notebook with itself, and nothing older is pulled over it. (ui-tests/test_no_conflict_with_yourself.py
does the same in a browser, three Continues.)"""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import (  # noqa: F401 - fixtures
    EventStream,
    KernelSocket,
    env,
    is_state,
    jp_root_dir,
    portable_env,
    release_all,
    start_session,
)

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)
T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _notebook(text: str) -> str:
    return json.dumps({"type": "notebook", "format": "json", "content": {
        "cells": [{"cell_type": "code", "source": "print(1)", "metadata": {}, "execution_count": 1,
                   "outputs": [{"output_type": "stream", "name": "stdout", "text": text}]}],
        "metadata": {"kernelspec": {"name": "portable", "display_name": "Python (portable)", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}})


async def _save(jp_fetch: Any, text: str) -> None:
    """What JupyterLab's Ctrl+S does: PUT the notebook through the contents API (its save hooks run)."""
    await jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=_notebook(text))


async def _state(jp_fetch: Any) -> dict[str, Any]:
    return json.loads((await jp_fetch("portable", "api", "state")).body)


async def test_a_save_after_a_continue_reaches_the_new_machine_and_is_no_conflict(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, env: dict[str, Path]) -> None:
    from jupyter_portable.demo.market import lose_allocation

    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)
    await events.wait_for(is_state("ACTIVE"), timeout=60)
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))  # the open notebook
    first = (await _state(jp_fetch))["lifecycle"]["allocation_id"]
    await _save(jp_fetch, "run 1\n")
    # the machine publishes a version holding the notebook as saved so far
    resp = await jp_fetch("portable", "api", "snapshot", method="POST", body=json.dumps({"message": "run 1"}))
    assert json.loads(resp.body)["version"] >= 2
    await _save(jp_fetch, "run 2\n")  # newer than any published version; it reached the machine
    assert "run 2" in (env["market"] / "allocations" / first / "work" / "nb.ipynb").read_text()

    lose_allocation(env["market"], first)
    await events.wait_for(is_state("LOST"), timeout=60)
    mark = len(events.seen)
    await jp_fetch("portable", "api", "continue", method="POST", body="{}")
    await events.wait_for(is_state("ACTIVE"), timeout=120, after=mark)
    # the notebook's kernel moved with it and answers there
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION'])")
    assert status == "ok", out
    second = (await _state(jp_fetch))["lifecycle"]["allocation_id"]
    assert second != first and out.strip() == second

    await _save(jp_fetch, "run 3\n")
    worker = env["market"] / "allocations" / second / "work"
    assert "run 3" in (worker / "nb.ipynb").read_text(), "the save reached the new machine"
    assert not list(worker.glob("nb.ipynb.conflict-*")) and not list(jp_root_dir.glob("nb.ipynb.conflict-*"))
    assert (await _state(jp_fetch))["conflicts"] == []
    # the follow loop's next ticks pull nothing older over the open notebook
    follower = jp_serverapp.web_app.settings["portable_follow"]
    res = await asyncio.to_thread(follower.tick, T0)
    assert "nb.ipynb" not in res.pulled and res.conflicts == [], res
    assert "run 3" in (jp_root_dir / "nb.ipynb").read_text()
