"""End to end, with real parts: a Jupyter server with the extension (pytest-jupyter, every
request authenticated), the notebook's kernel on a local-market worker, the market taking
the machine back, Continue through every state to READY, and the same kernel id running
the next cell on the new worker on files and a checkpoint read back with equal hashes."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jupyter_e2e import (  # noqa: F401 - fixtures
    EventStream,
    KernelSocket,
    env,
    is_state,
    jp_root_dir,
    make_workspace,
    portable_env,
    release_all,
    start_session,
)

pytest_plugins = ["pytest_jupyter.jupyter_server"]
# where the server's calendar starts (c.Portable.now, JUPYTER_PORTABLE_NOW)
CALENDAR_NOW = datetime(2027, 3, 1, 9, 20, tzinfo=timezone.utc)
SCHEMAS = Path(__file__).resolve().parents[1] / "jupyter_portable" / "interfaces" / "serverext" / "schemas"
STATE_SCHEMA = json.loads((SCHEMAS / "state.json").read_text())


def _schema_registry() -> Any:
    """Every committed schema by its file name, so a ``$ref`` to a sibling (``orphans.json``) resolves."""
    from referencing import Registry, Resource

    return Registry().with_resources(  # type: ignore[call-arg]
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json"))
pytestmark = pytest.mark.timeout(300)


# the server's calendar starts at a date the tests chose (c.Portable.now): bookings are placed
# from it, never from a read of the wall clock
SERVER_ENV = {"JUPYTER_PORTABLE_NOW": CALENDAR_NOW.isoformat()}


async def _events(jp_ws_fetch: Any) -> EventStream:
    return EventStream(await jp_ws_fetch("api", "events", "subscribe"))


async def _state(jp_fetch: Any) -> dict[str, Any]:
    return json.loads((await jp_fetch("portable", "api", "state")).body)


async def test_notebook_survives_a_lost_gpu(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                            jp_root_dir: Path, env: dict[str, Path]) -> None:
    from jupyter_portable.demo.market import lose_allocation

    events = await _events(jp_ws_fetch)
    # The main flow: a notebook session on the portable kernel starts the first machine.
    kernel_id = await start_session(jp_fetch)
    # the first machine, started for the kernel, is told on the event bus like any Continue
    first_active = await events.wait_for(is_state("ACTIVE"), timeout=60)
    state = await _state(jp_fetch)
    assert state["lifecycle"]["state"] == "ACTIVE" and state["lifecycle"]["verified"] is True
    worker_a = state["lifecycle"]["allocation_id"]
    assert first_active["allocation_id"] == worker_a
    assert state["allocation"]["provider"] == "local" and state["allocation"]["allocation_id"] == worker_a
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION'], os.getcwd())")
    assert status == "ok", out
    assert out.split()[0] == worker_a
    assert Path(out.split()[1]) == env["market"] / "allocations" / worker_a / "work"
    status, out = await kernel.run(
        "import torch\n"
        "torch.manual_seed(0)\n"
        "torch.save({'w': torch.randn(64, 64)}, 'ckpt.pt')\n"
        "open('results.txt', 'w').write('loss 0.125\\n')\n")
    assert status == "ok", out
    status, out = await kernel.run("%workspace checkpoint ckpt.pt --step 7 --settle 0.2 --wait")
    assert status == "ok" and "verified" in out, out
    # a version published on the worker is news for the sidebar too
    published = await events.wait_for(lambda e: e.get("step") == "snapshot" and "checkpoint" in e["message"],
                                      timeout=30)
    assert published["done"] >= 2
    cps = json.loads((await jp_fetch("portable", "api", "checkpoints")).body)
    assert cps["latest"]["path"] == "ckpt.pt" and cps["latest"]["step"] == 7 and cps["latest"]["verified"]
    recorded_hash = cps["latest"]["hash"]

    # Loss: the market takes worker A back; the monitor sees it and says why.
    lose_allocation(env["market"], worker_a)
    lost = await events.wait_for(is_state("LOST"), timeout=60)
    assert lost["allocation_id"] == worker_a and "preempted" in lost["reason"]
    state = await _state(jp_fetch)
    assert state["lifecycle"]["state"] == "LOST" and "preempted" in state["lost"]["reason"]

    # Continue: through each state to READY, then the kernel moves.
    mark = len(events.seen)
    resp = await jp_fetch("portable", "api", "continue", method="POST", body="{}")
    assert resp.code == 202
    await events.wait_for(is_state("ACTIVE"), timeout=120, after=mark)
    states = events.states()
    after_loss = states[states.index("LOST") + 1:]
    for step in ("ROUTING", "ACQUIRING", "PROBING", "MATERIALIZING", "VERIFYING", "READY", "ACTIVE"):
        assert step in after_loss, (step, after_loss)
    ready = next(e for e in events.seen[mark:] if e.get("state") == "READY")
    assert ready["verified"] is True and set(ready["detail"]["matched"]) == {"version", "checkpoints", "runtime",
                                                                               "path"}
    assert ready["detail"]["checkpoints"]["ckpt.pt"] == recorded_hash
    state = await _state(jp_fetch)
    worker_b = state["lifecycle"]["allocation_id"]
    assert worker_b != worker_a and state["lifecycle"]["state"] == "ACTIVE"

    # The same kernel id, now on worker B, reached through the websocket the notebook kept open.
    kernels = json.loads((await jp_fetch("api", "kernels")).body)
    assert [k["id"] for k in kernels] == [kernel_id]
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await _run_retrying(kernel, "import os, blake3\n"
                                      "print(os.environ['JUPYTER_PORTABLE_ALLOCATION'])\n"
                                      "print(open('results.txt').read().strip())\n"
                                      "print(blake3.blake3(open('ckpt.pt','rb').read()).hexdigest())\n")
    assert status == "ok", out
    lines = out.strip().splitlines()
    assert lines[0] == worker_b
    assert lines[1] == "loss 0.125"
    assert lines[2] == recorded_hash
    status, out = await kernel.run("%workspace latest")
    assert status == "ok" and "ckpt.pt" in out, out

    # The old worker is fenced: its epoch can never publish again.
    from jupyter_portable import Workspace

    ws = Workspace.find(jp_root_dir)
    history = ws.manifest(ws.store.read_head(ws.workspace_id)[0].version).allocations
    by_id = {a["allocation_id"]: a for a in history}
    assert by_id[worker_a]["state"] == "lost" and "preempted" in by_id[worker_a]["stop_reason"]
    assert by_id[worker_b]["state"] == "active"


async def _run_retrying(kernel: KernelSocket, code: str) -> tuple[str, str]:
    """The first message after a restart can race the new channels' connect; a notebook retries too."""
    import asyncio

    last: Exception | None = None
    for _ in range(3):
        try:
            return await kernel.run(code, timeout=40)
        except TimeoutError as exc:
            last = exc
            await asyncio.sleep(1)
    raise AssertionError(f"the kernel never answered after the move: {last}")


async def test_every_endpoint_refuses_unauthenticated_requests(jp_serverapp: Any, jp_fetch: Any,
                                                               jp_root_dir: Path) -> None:
    from tornado.httpclient import HTTPClientError

    for method, path, body in (("GET", "state", None), ("GET", "routes", None), ("POST", "continue", "{}"),
                               ("POST", "stop", "{}"), ("POST", "snapshot", "{}"), ("GET", "checkpoints", None),
                               ("GET", "reservations", None), ("POST", "reservations", "{}"),
                               ("DELETE", "reservations/res-1", None), ("POST", "cancel", "{}"),
                               ("GET", "files", None)):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("portable", "api", *path.split("/"), method=method, body=body,
                           headers={"Authorization": ""})
        assert info.value.code == 403, (method, path, info.value.code)


async def test_bad_requests_get_a_400_with_a_message(jp_serverapp: Any, jp_fetch: Any, jp_root_dir: Path) -> None:
    from tornado.httpclient import HTTPClientError

    for path, body in (("continue", "{not json"), ("continue", '{"route": 5}'), ("continue", '{"bogus": 1}'),
                       ("continue", '{"route": "r-0000000000"}'), ("snapshot", "[1]"),
                       ("reservations", '{"offer": "local/a100", "start": "tomorrow", "hours": 1}'),
                       ("reservations", '{"offer": "nope", "start": "2030-01-01T10:00Z", "hours": 1}')):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("portable", "api", path, method="POST", body=body)
        assert info.value.code == 400, (path, body, info.value.code)
        assert json.loads(info.value.response.body)["error"], (path, body)
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("portable", "api", "no-such-thing")
    assert info.value.code == 404 and "unknown endpoint" in json.loads(info.value.response.body)["error"]
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("portable", "api", "settings", method="PUT", body='{"driver": "' + "x" * 100_000 + '"}')
    assert info.value.code == 413 and "larger than" in json.loads(info.value.response.body)["error"]
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("portable", "api", "routes", params={"hours": "many"})
    assert info.value.code == 400


async def test_routes_reservations_and_admission_failover(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                                          jp_root_dir: Path) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.settings import update_settings

    ws = Workspace.find(jp_root_dir)
    update_settings(ws, driver="550.54.15")  # pinned: the stale listing's machine will be refused
    routes = json.loads((await jp_fetch("portable", "api", "routes")).body)
    assert routes["routes"][0]["offer"] == "cheap-stale" and routes["best"] == routes["routes"][0]["id"]
    assert set(routes["routes"][0]["cost"]) >= {"gpu", "egress", "storage", "queue", "risk", "total"}

    # book and cancel a reservation
    start = datetime(2027, 3, 31, 10, 0, tzinfo=timezone.utc)  # 30 days after the server's now
    booked = await jp_fetch("portable", "api", "reservations", method="POST", body=json.dumps(
        {"offer": "local/a100", "start": start.isoformat(), "hours": 2, "charge": "before"}))  # within a year
    assert booked.code == 201
    rid = json.loads(booked.body)["reservation_id"]
    listing = json.loads((await jp_fetch("portable", "api", "reservations")).body)
    assert [b["reservation_id"] for b in listing["reservations"]] == [rid] and listing["calendar"]
    # the calendar starts at the hour of the server's now, the date the test set
    assert listing["calendar"]["start"].startswith("2027-03-01T09:00"), listing["calendar"]["start"]
    cancelled = json.loads((await jp_fetch("portable", "api", "reservations", rid, method="DELETE")).body)
    assert cancelled["status"] == "cancelled"

    # Continue: route 1 (wrong driver on the machine) is refused by admission, route 2 is used
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    await jp_fetch("portable", "api", "continue", method="POST", body=json.dumps({"route": routes["best"]}))
    await events.wait_for(is_state("ACTIVE"), timeout=120)
    state = await _state(jp_fetch)
    assert state["allocation"]["offer"] == "a100"
    attempts = state["lifecycle"]["attempts"]
    assert attempts[0]["offer"] == "local/cheap-stale" and attempts[0]["environment_fault"] is True
    assert "535.104.05" in attempts[0]["reason"]
    failover = [e for e in events.seen if e.get("state") == "ACQUIRING" and e.get("reason")]
    assert failover and "cheap-stale" in failover[0]["reason"]
    history = ws.manifest(ws.store.read_head(ws.workspace_id)[0].version).allocations
    refused = [a for a in history if a["state"] == "refused"]
    assert refused and refused[0]["stop_reason"].startswith("environment fault")

    # stop: seal, read back, release
    stopped = json.loads((await jp_fetch("portable", "api", "stop", method="POST", body="{}")).body)
    assert stopped["state"] == "RELEASED"
    head = ws.store.read_head(ws.workspace_id)[0]
    assert head.version >= stopped["sealed_version"]


async def test_files_both_ways_and_conflicts_shown(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                                   jp_root_dir: Path, env: dict[str, Path]) -> None:
    events = await _events(jp_ws_fetch)
    kernel_id = await start_session(jp_fetch)
    state = await _state(jp_fetch)
    worker = env["market"] / "allocations" / state["lifecycle"]["allocation_id"] / "work"
    # an edit saved in JupyterLab reaches the worker's copy
    await jp_fetch("api", "contents", "train.py", method="PUT", body=json.dumps(
        {"type": "file", "format": "text", "content": "print('edited in lab')\n"}))
    assert (worker / "train.py").read_text() == "print('edited in lab')\n"
    # the lab's copy holds still, so the edit below is made on the train.py it had before the kernel
    # wrote one (with the follower on, a pull may come first and the save is then no conflict: test_follow)
    jp_serverapp.web_app.settings["portable_follow"].paused = True
    # what the kernel writes there reaches the store at the next snapshot, and is listed
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("open('made-by-kernel.txt','w').write('42')\n"
                                   "open('train.py','w').write('print(\"edited by the kernel\")\\n')\n"
                                   "import os; os.symlink('/etc/hostname', 'leads-out')")
    assert status == "ok", out
    snap = json.loads((await jp_fetch("portable", "api", "snapshot", method="POST", body="{}")).body)
    assert snap["skipped"] == ["leads-out"]  # not backed up, and the sidebar's answer says so
    listed = json.loads((await jp_fetch("portable", "api", "files")).body)
    assert listed["version"] == snap["version"]
    assert "made-by-kernel.txt" in {f["path"] for f in listed["files"]}
    # both sides changed train.py: the worker's version is kept, the lab's is kept beside it, and it is shown
    await jp_fetch("api", "contents", "train.py", method="PUT", body=json.dumps(
        {"type": "file", "format": "text", "content": "print('edited in lab again')\n"}))
    assert (worker / "train.py").read_text() == 'print("edited by the kernel")\n'
    kept = list(worker.glob("train.py.conflict-lab-*"))
    assert len(kept) == 1 and kept[0].read_text() == "print('edited in lab again')\n"
    notice = await events.wait_for(lambda e: e.get("kind") == "conflict", timeout=30)
    assert "train.py" in notice["message"]
    conflicts = (await _state(jp_fetch))["conflicts"]
    assert conflicts and conflicts[0]["path"] == "train.py"


async def test_a_reservation_start_triggers_continue(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                                     jp_root_dir: Path) -> None:
    start = datetime(2027, 3, 1, 11, 0, tzinfo=timezone.utc)  # two hours after the server's now
    booked = json.loads((await jp_fetch("portable", "api", "reservations", method="POST", body=json.dumps(
        {"offer": "local/a100", "start": start.isoformat(), "hours": 1, "charge": "now"}))).body)
    events = await _events(jp_ws_fetch)
    service = jp_serverapp.web_app.settings["portable_service"]
    assert service.start_due_reservation(now=start - timedelta(minutes=5)) is None  # not yet
    assert service.start_due_reservation(now=start + timedelta(minutes=1)) == booked["reservation_id"]
    await events.wait_for(is_state("ACTIVE"), timeout=120)
    state = await _state(jp_fetch)
    assert state["allocation"]["offer"] == "a100"


async def test_settings_read_and_changed(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                         jp_root_dir: Path) -> None:
    from tornado.httpclient import HTTPClientError

    before = json.loads((await jp_fetch("portable", "api", "settings")).body)
    assert before["requirements"]["driver"] is None
    after = json.loads((await jp_fetch("portable", "api", "settings", method="PUT", body=json.dumps(
        {"driver": "550.54.15", "budget_total": 25, "hours": 4}))).body)
    assert after["requirements"]["driver"] == "550.54.15" and after["budget"]["total"] == 25 and after["hours"] == 4
    state = await _state(jp_fetch)
    assert state["budget"]["cap"] == 25
    for body in ('{"driver": 5}', '{"nope": 1}', '{"hours": "many"}'):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("portable", "api", "settings", method="PUT", body=body)
        assert info.value.code == 400, body
    cleared = json.loads((await jp_fetch("portable", "api", "settings", method="PUT", body='{"driver": ""}')).body)
    assert cleared["requirements"]["driver"] is None
    # the auto-snapshot interval reaches the kernel on the next machine
    auto = json.loads((await jp_fetch("portable", "api", "settings", method="PUT",
                                      body='{"autosnapshot_minutes": 0.5}')).body)
    assert auto["autosnapshot_minutes"] == 0.5
    kernel_id = await start_session(jp_fetch)
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES'])")
    assert status == "ok" and out.strip() == "0.5", out


async def test_an_executed_cell_causes_no_provider_call(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                                        jp_root_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sidebar asks for the state after every cell: that answer is built from what the loss
    check last saw, so a notebook's cells never turn into cloud API calls."""
    from jupyter_portable.compute.base import Provider

    events = await _events(jp_ws_fetch)
    kernel_id = await start_session(jp_fetch)
    await events.wait_for(is_state("ACTIVE"), timeout=60)
    service = jp_serverapp.web_app.settings["portable_service"]
    service.pause_monitor()  # the periodic loss check is the one place that asks the provider
    calls: list[str] = []

    def counted(provider: Provider, name: str) -> Any:
        real = getattr(provider, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"{provider.name}.{name}")
            return real(*args, **kwargs)
        return call

    # this server's own provider objects (another test's server threads may still be winding down)
    for provider in service.orchestrator().providers.values():
        for name in ("offers", "check_permission", "check_capacity", "launch", "status", "terminate"):
            monkeypatch.setattr(provider, name, counted(provider, name))
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    builds = service.view.builds
    for i in range(5):
        status, out = await kernel.run(f"x = {i} * 2\nprint(x)")
        assert status == "ok" and out.strip() == str(i * 2), out
        state = await _state(jp_fetch)  # what the sidebar does when a cell ends
        # the shape labextension/src/types.ts is generated from
        jsonschema.validate(state, STATE_SCHEMA, registry=_schema_registry())
        assert state["lifecycle"]["state"] == "ACTIVE" and state["allocation"]["spend"] is not None
        assert state["can_continue"] is False and state["can_cancel"] is False
    assert calls == []
    assert service.view.builds - builds <= 1  # nothing changed: built at most once for five answers


async def test_a_stop_made_in_a_terminal_is_told_like_the_servers_own(jp_serverapp: Any, jp_fetch: Any,
                                                                      jp_ws_fetch: Any, jp_root_dir: Path,
                                                                      cli: Any) -> None:
    """`jupyter portable stop` in a terminal changes the lifecycle behind the server's back: the
    server's next look tells each change as a state event (the toolbar and the sidebar listen
    to those), once each, in order."""
    import asyncio
    import os

    events = await _events(jp_ws_fetch)
    await start_session(jp_fetch)
    await events.wait_for(is_state("ACTIVE"), timeout=60)
    mark = len(events.seen)
    ours = {k: v for k, v in os.environ.items() if k.startswith("JUPYTER_PORTABLE_")}
    # in a thread: this server runs on the test's event loop and must go on while the CLI works
    await asyncio.to_thread(cli, "stop", cwd=jp_root_dir, extra_env=ours)
    released = await events.wait_for(is_state("RELEASED"), timeout=120, after=mark)
    told = [e for e in events.seen[mark:] if "seq" in e and "state" in e]
    assert [e["state"] for e in told] == ["DRAINING", "SEALED", "RELEASED"], told
    assert [e["seq"] for e in told] == sorted({e["seq"] for e in told})  # in order, once each
    assert released["previous"] == "SEALED" and (await _state(jp_fetch))["lifecycle"]["state"] == "RELEASED"
    # told RELEASED, the server moves the notebook's kernel off the machine to its placeholder: that
    # move ends before the server does (a kernel still starting cannot be shut down cleanly)
    km = jp_serverapp.kernel_manager
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while True:
        moving = [kid for kid in km.list_kernel_ids()
                  if getattr(km.get_kernel(kid).provisioner, "allocation_id", None) is not None
                  or not km.get_kernel(kid).ready.done()]
        if not moving:
            break
        assert loop.time() < deadline, f"kernels still on the released machine or starting: {moving}"
        await asyncio.sleep(0.2)
