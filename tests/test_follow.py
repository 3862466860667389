"""The file browser follows the machine (issue 16, item 4), with real parts: a Jupyter server
with the extension, the notebook's kernel on a local-market worker writing files there, and
the server pulling them into the user's copy (orchestration/follow.py). Ticks are driven with
the test's own clock so each step is decided, not raced."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import KernelSocket, env, jp_root_dir, make_workspace, portable_env, release_all, start_session  # noqa: F401 - fixtures

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(300)

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


async def _setup(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, env: dict[str, Path]) -> tuple[Any, Any, Path]:
    kernel_id = await start_session(jp_fetch)
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert state["lifecycle"]["state"] == "ACTIVE"
    worker = env["market"] / "allocations" / state["lifecycle"]["allocation_id"] / "work"
    follower = jp_serverapp.web_app.settings["portable_follow"]
    follower.timer.stop()  # the test ticks it, with its own clock
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    return follower, kernel, worker


async def _tick(follower: Any, now: datetime) -> Any:
    return await asyncio.to_thread(follower.tick, now)


async def test_a_file_the_kernel_writes_reaches_the_copy_at_the_next_tick(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, env: dict[str, Path]) -> None:
    follower, kernel, worker = await _setup(jp_serverapp, jp_fetch, jp_ws_fetch, env)
    # the server ticks every 2 s: a write just after a tick is in the copy by the next one, well within 5 s
    assert follower.timer.callback_time <= 2000
    status, out = await kernel.run("import os; os.makedirs('out', exist_ok=True)\n"
                                   "open('out/made-by-kernel.txt','w').write('42')")
    assert status == "ok", out
    res = await _tick(follower, T0)
    assert "out/made-by-kernel.txt" in res.pulled, res
    assert (jp_root_dir / "out" / "made-by-kernel.txt").read_text() == "42"
    # JupyterLab's contents API (what the file browser lists) shows it
    listed = json.loads((await jp_fetch("api", "contents", "out")).body)
    assert "made-by-kernel.txt" in {c["name"] for c in listed["content"]}
    # a quiet tick moves nothing
    assert (await _tick(follower, T0 + timedelta(seconds=2))).pulled == []
    # a file the kernel deletes goes from the copy too, since the user had not changed it
    status, out = await kernel.run("os.remove('out/made-by-kernel.txt')")
    assert status == "ok", out
    res = await _tick(follower, T0 + timedelta(seconds=4))
    assert res.removed == ["out/made-by-kernel.txt"]
    assert not (jp_root_dir / "out" / "made-by-kernel.txt").exists()
    # the panel can say which version the worker's copy stands on
    assert follower.view()["allocation_id"] and follower.view()["worker_version"] is not None

    # with the server's own timer running, a new file arrives without the test ticking
    follower.timer.start()
    status, out = await kernel.run("open('out/second.txt','w').write('2')")
    assert status == "ok", out
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60  # generous for a loaded machine; the tick above shows the 2 s step
    while not (jp_root_dir / "out" / "second.txt").exists():
        assert loop.time() < deadline, "the server's timer never pulled out/second.txt"
        await asyncio.sleep(0.1)
    assert (jp_root_dir / "out" / "second.txt").read_text() == "2"


async def test_an_edit_in_between_is_kept_by_the_conflict_rule(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, env: dict[str, Path]) -> None:
    follower, kernel, worker = await _setup(jp_serverapp, jp_fetch, jp_ws_fetch, env)
    # 1. an edit the user made here but never saved through JupyterLab, on a file the kernel did not touch: kept
    (jp_root_dir / "notes.txt").write_text("mine\n")
    status, out = await kernel.run("open('log.txt','w').write('step 1\\n')")
    assert status == "ok", out
    res = await _tick(follower, T0)
    assert res.pulled == ["log.txt"] and res.conflicts == []
    assert (jp_root_dir / "notes.txt").read_text() == "mine\n"

    # 2. both changed data/small.csv (the user's edit never reached the worker): both are kept,
    # the worker's at the name, the user's beside it here only (the side where the conflict is
    # seen: nothing of the user's is sent to the machine by a tick), and it is announced
    (jp_root_dir / "data" / "small.csv").write_text("a,b\nuser,edit\n")
    status, out = await kernel.run("open('data/small.csv','w').write('a,b\\nkernel,edit\\n')")
    assert status == "ok", out
    res = await _tick(follower, T0 + timedelta(seconds=2))
    kept = "data/small.csv.conflict-lab-20300102-030407"
    assert res.conflicts == [{"path": "data/small.csv", "kept": kept}]
    assert (jp_root_dir / "data" / "small.csv").read_text() == "a,b\nkernel,edit\n"
    assert (jp_root_dir / kept).read_text() == "a,b\nuser,edit\n"
    assert not (worker / kept).exists()
    conflicts = json.loads((await jp_fetch("portable", "api", "state")).body)["conflicts"]
    assert [c["path"] for c in conflicts] == ["data/small.csv"]

    # 3. a save in JupyterLab after the kernel changed the file on the worker: today's rule, once
    status, out = await kernel.run("open('train.py','w').write('print(\"kernel\")\\n')")
    assert status == "ok", out
    await jp_fetch("api", "contents", "train.py", method="PUT", body=json.dumps(
        {"type": "file", "format": "text", "content": "print('lab')\n"}))
    assert (worker / "train.py").read_text() == 'print("kernel")\n'
    [lab_kept] = [p.name for p in worker.glob("train.py.conflict-lab-*")]
    res = await _tick(follower, T0 + timedelta(seconds=4))
    assert res.conflicts == []  # kept once, by the save; the pull does not keep it again
    assert (jp_root_dir / "train.py").read_text() == 'print("kernel")\n'
    assert (jp_root_dir / lab_kept).read_text() == "print('lab')\n"
    conflicts = json.loads((await jp_fetch("portable", "api", "state")).body)["conflicts"]
    assert [c["path"] for c in conflicts] == ["data/small.csv", "train.py"]

    # 4. a save on top of what was pulled is an ordinary edit: forwarded, no conflict; both sides
    # hold the same train.py again, so its conflict is resolved and no longer listed (issue 43)
    await jp_fetch("api", "contents", "train.py", method="PUT", body=json.dumps(
        {"type": "file", "format": "text", "content": "print('lab, after reading the kernel')\n"}))
    assert (worker / "train.py").read_text() == "print('lab, after reading the kernel')\n"
    res = await _tick(follower, T0 + timedelta(seconds=6))
    assert res.conflicts == [] and "train.py" not in res.pulled
    conflicts = json.loads((await jp_fetch("portable", "api", "state")).body)["conflicts"]
    assert [c["path"] for c in conflicts] == ["data/small.csv"]


def test_status_and_checkpoints_describe_the_head_and_name_the_copys_version(cli: Any, tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    from jupyter_portable import Workspace

    store = f"file://{tmp_path}/store"
    mine = tmp_path / "laptop"
    make_workspace(mine, tmp_path / "store")
    ws = Workspace.find(mine)
    # a worker's copy publishes a checkpoint: the head moves on, this copy stays on version 1
    Workspace.restore(store, ws.workspace_id, tmp_path / "worker", progress=None)
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(tmp_path / "worker" / "step7.safetensors"))
    rec = Workspace.find(tmp_path / "worker").checkpoint(tmp_path / "worker" / "step7.safetensors", step=7,
                                                          quiet_s=0.1, timeout_s=30)
    assert rec.verified and rec.version == 2

    st = cli.json("status", cwd=mine)
    assert (st["version"], st["copy_version"], st["head_version"]) == (1, 1, 2)
    assert st["latest_checkpoint"]["path"] == "step7.safetensors" and st["copy_latest_checkpoint"] is None
    text = cli("status", cwd=mine).stdout
    assert "workspace version 2 (head); this copy is on version 1" in text
    assert "latest verified checkpoint: step7.safetensors (step 7)" in text

    cps = cli.json("checkpoints", cwd=mine)
    assert (cps["version"], cps["copy_version"]) == (2, 1)
    assert [c["path"] for c in cps["checkpoints"]] == ["step7.safetensors"]
    text = cli("checkpoints", cwd=mine).stdout
    assert text.startswith("workspace version 2 (head); this copy is on version 1\n") and "#" in text


async def test_what_the_gate_refuses_is_announced_to_the_sidebar_not_written(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, env: dict[str, Path]) -> None:
    follower, kernel, worker = await _setup(jp_serverapp, jp_fetch, jp_ws_fetch, env)
    heard: list[dict[str, Any]] = []

    async def listen(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        heard.append(dict(data))

    jp_serverapp.event_logger.add_listener(schema_id="https://events.jupyter-portable.org/notice/v1",
                                           listener=listen)
    status, out = await kernel.run(
        "import os; os.makedirs('.venv/lib/python3.11/site-packages', exist_ok=True)\n"
        "open('.portableignore','a').write('\\n!.venv/\\n')\n"
        "open('.venv/lib/python3.11/site-packages/x.pth','w').write('import os\\n')")
    assert status == "ok", out
    res = await _tick(follower, T0)
    assert ".venv/lib/python3.11/site-packages/x.pth" in {r["path"] for r in res.refused}, res
    assert not (jp_root_dir / ".venv" / "lib").exists()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not any(e.get("kind") == "refused" for e in heard):
        assert loop.time() < deadline, heard
        await asyncio.sleep(0.05)
    [notice] = [e for e in heard if e["kind"] == "refused"]
    assert "x.pth" in notice["message"] and "runs or configures code" in notice["message"]


async def test_a_save_of_a_file_the_user_ignores_is_never_sent_to_the_machine(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, env: dict[str, Path]) -> None:
    follower, kernel, worker = await _setup(jp_serverapp, jp_fetch, jp_ws_fetch, env)
    with open(jp_root_dir / ".portableignore", "a") as fh:
        fh.write("\nsecrets.txt\n")  # (JupyterLab saves no hidden file such as .env unless told to)
    for name, text in (("secrets.txt", "OPENAI_API_KEY=sk-user-secret\n"), ("shared.txt", "shared\n")):
        await jp_fetch("api", "contents", name, method="PUT", body=json.dumps(
            {"type": "file", "format": "text", "content": text}))
    assert (worker / "shared.txt").read_text() == "shared\n"  # a save is forwarded...
    assert not (worker / "secrets.txt").exists()  # ...but not one of a file the user keeps out
    assert not any(b"sk-user-secret" in p.read_bytes() for p in worker.rglob("*") if p.is_file())
