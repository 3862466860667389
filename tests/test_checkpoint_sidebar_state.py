"""Checkpoints in flight in the sidebar's state (issue 44 item 1): the server's state answer carries
each checkpoint on its way to verified (its phase, percent and rate, from the upload's real progress)
and then how it ended: verified and "latest", or why not. Real parts: a Jupyter server with the
extension (pytest-jupyter), a real kernel saving a real checkpoint whose upload the test holds at the
store (a pause after its first part), the store; once with the kernel on this computer, once on a
local-market worker, whose status reports what is in flight on its machine. The words are the ones
`%workspace checkpoints` and `jupyter portable status` print (core/state_words.py)."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jupyter_e2e import EventStream, KernelSocket, env, is_state, jp_root_dir, start_session  # noqa: F401

from jupyter_portable.core import state_words

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(180)
SCHEMAS = Path(__file__).resolve().parents[1] / "jupyter_portable" / "interfaces" / "serverext" / "schemas"
CHANGED = "https://events.jupyter-portable.org/changed/v1"
MIB = 2**20

# Run in the kernel: the store's objects of the next checkpoint go up one after a pause (so that
# its progress is recorded apart from the hashing before it), and every later one waits for the
# test's release file (a minute at most): the upload is held at a known point, mid-way.
HOLD = """
import os, pathlib, threading, time
from jupyter_portable.core import hooks
hooks._steps.clear()
_release, _lock, _seen = pathlib.Path({release!r}), threading.Lock(), [0]
def _hold(label):
    if not label.startswith("renamed ") or "/objects/" not in label:
        return
    with _lock:
        _seen[0] += 1
        first = _seen[0] == 1
    if first:
        time.sleep(0.5)
        return
    deadline = time.monotonic() + 60
    while not _release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
hooks.install(step=_hold)
pathlib.Path("ckpt").mkdir(exist_ok=True)
pathlib.Path("ckpt/step-{step}.bin").write_bytes(os.urandom({size}))
"""
SIZE = 48 * MIB  # three parts of the store's 16 MiB


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    # the server's check (which tells the sidebar that checkpoints moved) looks often
    return {"ServerApp": {"jpserver_extensions": {"jupyter_portable": True}, "allow_unauthenticated_access": False},
            "Portable": {"check_interval_s": 0.3}}


def _checked(state: dict[str, Any]) -> dict[str, Any]:
    """The state answer held to its schema (state.json, with its siblings)."""
    from referencing import Registry, Resource

    registry = Registry().with_resources(  # type: ignore[call-arg]
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json"))
    jsonschema.validate(state, json.loads((SCHEMAS / "state.json").read_text()), registry=registry)
    return state


async def _row(jp_fetch: Any, pred: Callable[[dict[str, Any]], bool], timeout: float = 60,
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first state answer with a checkpoints_in_flight row matching ``pred``; (state, row)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    rows: list[dict[str, Any]] = []
    while loop.time() < deadline:
        state = json.loads((await jp_fetch("portable", "api", "state")).body)
        rows = state.get("checkpoints_in_flight") or []
        hit = next((r for r in rows if pred(r)), None)
        if hit is not None:
            return _checked(state), hit
        await asyncio.sleep(0.1)
    raise AssertionError(f"no such row within {timeout}s; the last: {[r['line'] for r in rows]}")


def _uploading(step: int, machine: str | None = None) -> Callable[[dict[str, Any]], bool]:
    return lambda r: (r["step"] == step and r["state"] == "uploading" and r["machine"] == machine
                      and r["percent"] is not None and 0 < r["percent"] < 100)


def _latest(state: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in reversed(state["checkpoints"]) if c["verified"]), None)


def _assert_mid_upload(state: dict[str, Any], row: dict[str, Any], step: int) -> None:
    # the figures are the upload's own: one 16 MiB part of three is in the store, and the rate is
    # the bytes done over the time the phase has run
    assert row["total_bytes"] >= SIZE and row["percent"] == 100 * row["done_bytes"] // row["total_bytes"], row
    assert MIB <= row["done_bytes"] < SIZE and row["rate"] > 0, row
    assert row["phase"] == "uploading" and row["ended"] is None and not row["latest"]
    assert re.fullmatch(rf"step {step}: uploading {row['percent']}%, [\d.]+ (B|KB|MB|GB)/s", row["line"]), row
    assert row["line"] == state_words.checkpoint_line(row)  # the CLI's words, from the one table
    latest = _latest(state)
    assert latest is None or latest["step"] != step, "not latest before its read-back held"


async def test_a_local_kernels_checkpoint_is_in_the_state_while_it_uploads_then_verified_or_why_not(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, tmp_path: Path, cli: Any) -> None:
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    # a notebook's kernel on this computer (not the portable one): the server's own kernel manager
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(
        {"path": "local.ipynb", "type": "notebook", "name": "local.ipynb", "kernel": {"name": "python3"}}))).body)
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", session["kernel"]["id"], "channels"))
    await kernel.nudge()
    release = tmp_path / "release-1200"
    status, out = await kernel.run("import os; print(os.getcwd())")
    assert status == "ok" and Path(out.strip()) == jp_root_dir, out
    status, out = await kernel.run(HOLD.format(release=str(release), step=1200, size=SIZE)
                                   + "%load_ext jupyter_portable\n"
                                   + "%workspace checkpoint ckpt/step-1200.bin --step 1200 --settle 0\n")
    assert status == "ok" and "upload and read-back run in the background" in out, out

    state, row = await _row(jp_fetch, _uploading(1200))
    _assert_mid_upload(state, row, 1200)
    # the terminal says it in the same words (its rate to its own moment)
    said = (await asyncio.to_thread(cli, "status", cwd=jp_root_dir)).stdout
    assert f"in flight  ckpt/step-1200.bin: step 1200: uploading {row['percent']}%, " in said, said
    # the server's check told the sidebar (which fetches the state on it)
    await events.wait_for(lambda e: e.get("schema_id") == CHANGED and e.get("what") == "checkpoints", timeout=30)
    release.touch()
    state, row = await _row(jp_fetch, lambda r: r["step"] == 1200 and r["ended"] is not None)
    assert row["state"] == "verified" and row["latest"], row
    assert row["line"] == f"step 1200: verified, latest (version {row['version']})"
    assert row["version"] == state["snapshot"]["version"] == (_latest(state) or {}).get("version")
    assert (_latest(state) or {}).get("step") == 1200

    # the next one dies with its kernel mid-upload: the state says so, and latest stays where it was
    status, out = await kernel.run(HOLD.format(release=str(tmp_path / "never"), step=1300, size=SIZE)
                                   + "%workspace checkpoint ckpt/step-1300.bin --step 1300 --settle 0\n"
                                   + "print(os.getpid())\n")
    assert status == "ok", out
    pid = int(out.split()[-1])
    state, row = await _row(jp_fetch, _uploading(1300))
    _assert_mid_upload(state, row, 1300)
    os.kill(pid, signal.SIGKILL)
    state, row = await _row(jp_fetch, lambda r: r["step"] == 1300 and r["ended"] is not None)
    assert row["state"] == "failed" and not row["latest"], row
    assert row["line"] == (f"step 1300: failed: the process uploading it (pid {pid}) ended before it was "
                           "verified; latest stays on the last verified checkpoint")
    assert (_latest(state) or {}).get("step") == 1200
    assert [r["step"] for r in state["checkpoints_in_flight"]] == [1300, 1200], "newest end first"


async def test_a_checkpoint_on_the_machine_is_in_the_state_as_its_worker_reports_it(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, tmp_path: Path,
        env: dict[str, Path]) -> None:
    from jupyter_portable.demo.market import lose_allocation

    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)  # the notebook's kernel rents the first machine
    active = await events.wait_for(is_state("ACTIVE"), timeout=90)
    machine = active["allocation_id"]
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    release = tmp_path / "release-2400"
    status, out = await kernel.run(HOLD.format(release=str(release), step=2400, size=SIZE)
                                   + "%load_ext jupyter_portable\n"
                                   + "%workspace checkpoint ckpt/step-2400.bin --step 2400 --settle 0\n")
    assert status == "ok" and "upload and read-back run in the background" in out, out

    state, row = await _row(jp_fetch, _uploading(2400, machine))
    _assert_mid_upload(state, row, 2400)
    release.touch()
    state, row = await _row(jp_fetch, lambda r: r["step"] == 2400 and r["ended"] is not None)
    assert (row["state"], row["latest"], row["machine"]) == ("verified", True, machine), row
    assert row["line"] == f"step 2400: verified, latest (version {row['version']})"
    assert (_latest(state) or {}).get("step") == 2400

    # the machine is lost mid-upload of the next one: its worker cannot say it, the state does
    status, out = await kernel.run(HOLD.format(release=str(tmp_path / "never"), step=2500, size=SIZE)
                                   + "%workspace checkpoint ckpt/step-2500.bin --step 2500 --settle 0\n")
    assert status == "ok", out
    state, row = await _row(jp_fetch, _uploading(2500, machine))
    lose_allocation(env["market"], machine)
    state, row = await _row(jp_fetch, lambda r: r["step"] == 2500 and r["ended"] is not None)
    assert state["lifecycle"]["state"] == "LOST" and (row["state"], row["machine"]) == ("failed", machine), row
    assert row["line"].startswith("step 2500: failed: the machine was lost before it was verified (")
    assert row["line"].endswith("); latest stays on the last verified checkpoint")
    assert (_latest(state) or {}).get("step") == 2400
    # the notebook's kernel is parked on this computer (no machine): followed as JupyterLab does
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))


def test_the_states_of_a_checkpoint_in_the_schema_are_the_cores() -> None:
    defs = json.loads((SCHEMAS / "state.json").read_text())["definitions"]
    assert defs["CheckpointState"]["enum"] == list(state_words.CHECKPOINT_PHASES)
    assert set(state_words.CHECKPOINT_ENDED) | {"queued", "publishing", *state_words.CHECKPOINT_MOVING} == \
        set(state_words.CHECKPOINT_PHASES)


def test_the_rate_is_the_bytes_done_over_the_time_passed_and_a_machines_records_are_checked(tmp_path: Path) -> None:
    """The view's figures at a given moment (no clock read): an upload's rate is its bytes done over the
    time since its phase began, to the moment asked (a stalled one's falls); a machine's phases go by
    its own clock (the time of its answer); what a machine reports is checked before it is shown."""
    from datetime import datetime, timedelta, timezone

    from jupyter_portable.core.lifecycle import Lifecycle
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.orchestration.state_view import checkpoints_in_flight_view

    ws = Workspace.init(tmp_path / "ws", f"file://{tmp_path}/store")
    t0 = datetime(2026, 12, 6, 21, 0, tzinfo=timezone.utc)
    record = {"path": "ckpt/a.pt", "step": 1200, "state": "uploading", "size": 10**9, "done_bytes": 5 * 10**8,
              "total_bytes": 10**9, "rate": 123, "pid": os.getpid(), "key": f"{os.getpid()}-1-1",
              "reason": None, "version": None, "ended": None, "since": "2026-12-06T21:00:00.000Z"}
    ws.copy.write_inflight(record["key"], json.dumps(record).encode())
    lc = Lifecycle.new(ws.workspace_id, at="2026-12-06T20:00:00Z")
    (row,) = checkpoints_in_flight_view(ws, {}, lc, t0 + timedelta(seconds=0.5), [])
    assert (row["percent"], row["rate"], row["machine"]) == (50, 1e9, None)
    assert row["line"] == "step 1200: uploading 50%, 1.0 GB/s"
    (row,) = checkpoints_in_flight_view(ws, {}, lc, t0 + timedelta(seconds=10), [])
    assert row["line"] == "step 1200: uploading 50%, 50.0 MB/s", "a stalled upload's rate falls"

    # the machine's rows: by its clock, and only what holds up
    ws.copy.clear_inflight(record["key"])
    machine_lc = dataclasses.replace(lc, state="ACTIVE", allocation_id="al-1")
    bad = [{"state": "pwned", "path": "x", "key": "k1"}, {"state": "uploading", "path": 7, "key": "k2"},
           "not a record", {**record, "key": "k3", "done_bytes": -5, "rate": float("inf"), "since": None}]
    heard = {"al-1": {"heartbeat": (t0 + timedelta(seconds=2)).timestamp(),
                      "checkpoints": {"in_flight": [{**record, "key": "k0"}, *bad],
                                      "ended": [{**record, "key": "k4", "state": "failed", "ended":
                                                 "2026-12-06T21:00:01.000Z", "reason": "r" * 5000}]}}}
    rows = checkpoints_in_flight_view(ws, heard, machine_lc, t0 + timedelta(hours=3), [])
    assert [(r["key"], r["machine"]) for r in rows] == [("k0", "al-1"), ("k3", "al-1"), ("k4", "al-1")]
    assert rows[0]["line"] == "step 1200: uploading 50%, 250.0 MB/s"  # 500 MB in 2 s of the machine's time
    assert (rows[1]["done_bytes"], rows[1]["rate"], rows[1]["percent"]) == (0, 0.0, 0)
    assert rows[2]["state"] == "failed" and len(rows[2]["reason"]) == 500


async def test_a_stop_waits_for_the_machines_checkpoint_in_flight_and_says_so(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, tmp_path: Path,
        env: dict[str, Path]) -> None:
    """Stop on a machine whose kernel is uploading a checkpoint: the sidebar is told, before the seal
    starts, that it waits for that checkpoint (and which); the kernel is not stopped under it; once
    it is verified the seal goes on, says it waited, and the checkpoint is latest."""
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)
    machine = (await events.wait_for(is_state("ACTIVE"), timeout=90))["allocation_id"]
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    release = tmp_path / "release-3600"
    status, out = await kernel.run(HOLD.format(release=str(release), step=3600, size=SIZE)
                                   + "%load_ext jupyter_portable\n"
                                   + "%workspace checkpoint ckpt/step-3600.bin --step 3600 --settle 0\n")
    assert status == "ok" and "upload and read-back run in the background" in out, out
    await _row(jp_fetch, _uploading(3600, machine))
    stop = asyncio.ensure_future(jp_fetch("portable", "api", "stop", method="POST", body="{}", request_timeout=180))
    said = await events.wait_for(lambda e: e.get("step") == "seal" and "checkpoint(s) in flight" in str(
        e.get("message")), timeout=60)
    assert re.fullmatch(r"no new writes; waiting for 1 checkpoint\(s\) in flight before the kernel stops "
                        r"\(step 3600: uploading \d+%, [\d.]+ (B|KB|MB|GB)/s\), then publishing the final version",
                        said["message"]), said
    await asyncio.sleep(1.0)  # what a stop that did not wait would have done by now, it must not have
    assert not stop.done()
    release.touch()
    stopped = json.loads((await stop).body)
    assert stopped["state"] == "RELEASED", stopped
    waited = await events.wait_for(lambda e: e.get("step") == "seal" and str(e.get("message")).startswith(
        "waited for checkpoints in flight: "), timeout=30)
    assert "step 3600: " in waited["message"] and "given up" not in waited["message"], waited
    state = json.loads((await jp_fetch("portable", "api", "state")).body)
    assert (_latest(state) or {}).get("step") == 3600 and (_latest(state) or {}).get("verified")
    # the notebook's kernel goes on on this computer: followed as JupyterLab does
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
