"""A partition is not a loss (issue 42, item 1), end to end: the acceptance items "a 90 s SSH
partition during a running cell" and "Vast ``unknown`` for 60 s mid-session": no LOST, no machine
terminated, the cell's output arrives, the sidebar showed "unreachable" and then the machine again.

What is real and what is simulated:

- **Real**: the machine (a real sshd on loopback, tests/partition.py; on Vast, the twin's machine),
  the worker and its kernel, reached only through the provider's SSH port forwards; the partition
  (the machine's sshd and every connection it holds frozen with SIGSTOP, as when packets are
  dropped: tests/sshd.py ``partitioned``); the forwards dying of it (ssh's ServerAlive) and being
  started again on the same local ports (compute/sshlink.py); the loss checks asking the provider
  and the worker, and failing for real; the cell printing on through it; the CLI (another process,
  its own check); the sidebar's state (``StateView``, validated against state.json; through a real
  Jupyter server: tests/test_partition_websocket.py).
- **Simulated**: the elapsed time. The grace decision reads the time it is given (``check(now=)``):
  the looks are at T0 + 5 s, 50 s and 95 s (Vast: 5 s, 35 s, 65 s), so the rule sees a 90 s (60 s)
  silence, while the real partition lasts only as long as the forwards' deaths, the looks and the
  CLI's check take (about 10 s). The SSH settings are scaled down (ServerAlive 1 s x 2 instead of
  10 s x 3; connect timeout 1 s for the test's ssh provider, 2 s for the CLI's and Vast's links,
  instead of 10 s), so that the forwards die within those seconds, as a real 90 s partition kills
  them at 30 s, and a look that cannot connect gives up in seconds. On Vast the
  machine's Python is the tests' own (``JUPYTER_PORTABLE_REMOTE_PYTHON``, an image that has this
  package): the bootstrap of a bare machine is tests/test_cloud_e2e.py's.

The line the cell prints while the forwards are down arrives too, once, every line in order (the
worker's record of the kernel's IOPub, worker/catchup.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import make_workspace
from partition import CELL, READER_STOPPED, Cut, alive, forwards, gpu_sshd, in_order, partition, ssh_env, until
from sshd import Sshd, unavailable

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

T0 = datetime(2026, 12, 6, 14, 2, tzinfo=timezone.utc)
SCHEMAS = Path(__file__).resolve().parents[1] / "jupyter_portable" / "interfaces" / "serverext" / "schemas"


def sidebar_state(ws: Any, orch: Any) -> dict[str, Any]:
    """The sidebar's state (``GET /portable/api/state``, built by StateView), checked against state.json."""
    import json

    import jsonschema
    from referencing import Registry, Resource

    from jupyter_portable.orchestration.state_view import StateView

    state = StateView(ws, lambda: orch, clock=lambda: T0).state(continuing=False, conflicts=[])
    registry = Registry().with_resources(  # type: ignore[call-arg]
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json"))
    jsonschema.validate(state, json.loads((SCHEMAS / "state.json").read_text()), registry=registry)
    return state


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    with gpu_sshd(tmp_path) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sshd: Sshd) -> Iterator[dict[str, str]]:
    values = ssh_env(sshd, tmp_path, environment="image", ssh_connect_timeout="2")  # the CLI's (10 s by default)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("JUPYTER_PORTABLE_UNREACHABLE_GRACE", raising=False)  # the default grace
    yield values
    from jupyter_e2e import release_all

    release_all(("ssh",))


def running_cell(record: Any, provider: Any, code: str) -> tuple[Any, Any, list[str]]:
    """A kernel on the worker, reached through the provider's port forwards, running ``code``: the
    worker's client, the kernel's, and the stream output so far (a thread reads the IOPub into it)."""
    import threading

    from jupyter_client import BlockingKernelClient

    from jupyter_portable.worker.catchup import CatchUp
    from jupyter_portable.worker.client import AgentClient

    client = AgentClient(record, provider)
    info = client.start_kernel("k-partition")
    kc = BlockingKernelClient()
    kc.load_connection_info({**info, **client.forward_kernel(info), "ip": "127.0.0.1"})
    kc.hb_channel.time_to_dead = 30.0  # heartbeats cross the forward, which the partition stops
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    output: list[str] = []
    # what the kernel published while a forward was down comes from the worker's record, once, in
    # order (worker/catchup.py, as the server's kernel websocket passes its messages on)
    catchup = CatchUp(client.iopub_after, client.forward_restarts)

    def read() -> None:
        while kc.channels_running:
            try:
                live = kc.get_iopub_msg(timeout=0.5)
            except Exception:
                continue
            try:
                for frames in catchup.passing(live["header"]["msg_id"]):
                    msg = live if frames is None else kc.session.deserialize(kc.session.feed_identities(frames)[1])
                    if msg["msg_type"] == "stream":
                        output.append(msg["content"]["text"])
            except Exception as exc:  # e.g. "Duplicate Signature": a message this client read was passed on again
                output.append(f"\n{READER_STOPPED}: {exc!r}\n")
                return

    kc.execute(code)
    threading.Thread(target=read, daemon=True).start()
    return client, kc, output


def test_a_90_s_ssh_partition_is_unreachable_not_lost_and_the_session_goes_on(
        tmp_path: Path, env: dict[str, str], sshd: Sshd, cli: Any) -> None:
    from jupyter_portable.compute.ssh import SshProvider
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.core.errors import PortableError
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    provider = SshProvider(connect_timeout=1, keepalive=(1, 2))

    def wall() -> datetime:
        raise AssertionError("the loss check read the wall clock although it was given now")

    orch = Orchestrator(ws, providers={"ssh": provider}, wall=wall)
    try:
        assert orch.continue_()["state"] == L.ACTIVE
        rec = orch.record()
        assert rec is not None
        pid = int(rec.allocation.details["pid"])
        assert orch.check(now=T0)["alive"] is True
        flag = tmp_path / "go-on"
        worker, kc, output = running_cell(rec, provider, CELL.format(flag=str(flag), pause=0.3))
        assert until(lambda: "tick" in "".join(output), 60), output  # the cell runs, its output arrives
        with partition(sshd, forwards(provider, rec.allocation_id)) as cut:
            # the CLI (another process: the wall's time, c.PortableSsh.connect_timeout 2 s) looks while
            # the rest of the test does, and ends within the partition
            state_cli = subprocess.Popen([str(Path(sys.executable).parent / "jupyter"), "portable", "state"],
                                         cwd=ws.root, env=cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)
            # every port forward (the worker's HTTP, the kernel's five ports) dies and is started again
            cut.restarted()
            # the cell prints while no forward reaches it: that line must arrive all the same, once
            Path(f"{flag}.during").write_text("")
            assert until(Path(f"{flag}.said").exists, 30)
            looks = [orch.check(now=T0 + timedelta(seconds=s)) for s in (5, 50, 95)]
            assert [(a["state"], a["alive"]) for a in looks] == [(L.ACTIVE, False)] * 3, looks
            # the silence began at the first look that found no path, and every look says so
            assert {a["unreachable_since"] for a in looks} == {"2026-12-06T14:02:05Z"}
            assert looks[-1]["unreachable"] == "unreachable since 14:02Z"
            # the sidebar's state says it in the same words, with the machine still held
            shown = sidebar_state(ws, orch)
            assert shown["lifecycle"]["state"] == L.ACTIVE and shown["allocation"] is not None
            assert shown["unreachable"]["line"] == "unreachable since 14:02Z", shown["unreachable"]
            assert shown["unreachable"]["since"] == "2026-12-06T14:02:05Z"
            assert alive(pid)  # nothing was terminated: the worker runs on
            assert orch.lifecycle().state == L.ACTIVE
            # a Stop (the user's, idle's, the budget's) cannot seal an unreachable machine: it is not a loss
            with pytest.raises(PortableError):
                orch.stop()
            assert orch.lifecycle().state == L.ACTIVE and alive(pid)
            assert "does not answer" in (orch.lifecycle().events[-1].reason or "")
            said, err = state_cli.communicate(timeout=120)
            assert state_cli.returncode == 0, err
            assert "ACTIVE" in said and "unreachable since" in said, said  # in the words every view uses
        back = orch.check(now=T0 + timedelta(seconds=100))
        assert (back["state"], back["alive"], back["unreachable_since"]) == (L.ACTIVE, True, None), back
        assert sidebar_state(ws, orch)["unreachable"] is None  # and then the machine again
        assert orch.record() is not None and orch.record().allocation_id == rec.allocation_id  # type: ignore[union-attr]
        assert [e.state for e in orch.lifecycle().events if e.state == L.LOST] == []
        # the tunnels are back on the same local ports: the running cell's output arrives again, and
        # its end and its reply after the test lets it finish
        before = len(output)
        assert until(lambda: "tick" in "".join(output[before:]), 60), "no output from the cell after the partition"
        flag.write_text("")
        reply = kc.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        assert until(lambda: "after the partition" in "".join(output), 30), output
        # and what it printed while the forwards were down arrived too: every line once, in order
        in_order("".join(output))
        kc.stop_channels()
        worker.close()
        # the same worker answers: the session seals and releases as if nothing had happened
        stopped = orch.stop()
        assert orch.lifecycle().state == L.RELEASED, stopped
    finally:
        orch.close()


@pytest.fixture
def vast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from twins.machines import require_python
    from twins.vastai import VastTwin

    offer = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
             "driver": "550.90.07", "cuda": "12.4", "stock": 2, "region": "US-TX-3",
             "python": require_python("3.11.2")}  # the work's Python (3.11), as Debian has it
    with VastTwin(tmp_path / "twin", offers=[offer], boot_delay_s=0.5) as twin:
        for key, value in {**twin.env(), "JUPYTER_PORTABLE_PROVIDERS": "vastai",
                           "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh-state"),
                           "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"),
                           "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
                           "JUPYTER_PORTABLE_ENVIRONMENT": "image",
                           # an image whose Python has this package (the tests' own): no bootstrap
                           "JUPYTER_PORTABLE_REMOTE_PYTHON": sys.executable}.items():
            monkeypatch.setenv(key, value)
        for name in ("JUPYTER_PORTABLE_SSH_KEY", "JUPYTER_PORTABLE_UNREACHABLE_GRACE"):
            monkeypatch.delenv(name, raising=False)
        # a cloud machine's SSH links with the SSH test's scaled-down settings (connect timeout 2 s,
        # ServerAlive 1 s x 2): the forwards die within the silence's few wall seconds, as a real
        # 60 s one kills them at 30 s, and a look that cannot connect gives up in 2 s, not 10 s
        from jupyter_portable.compute import sshlink

        class ScaledDown(sshlink.SshLink):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **{"connect_timeout": 2.0, "keepalive": (1, 2), **kwargs})

        monkeypatch.setattr(sshlink, "SshLink", ScaledDown)
        yield twin


def test_vast_unknown_for_a_while_mid_session_is_unreachable_not_lost(tmp_path: Path, vast: Any) -> None:
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp_path / "ws", tmp_path / "store")

    def wall() -> datetime:
        raise AssertionError("the loss check read the wall clock although it was given now")

    orch = Orchestrator(ws, wall=wall)
    try:
        assert orch.continue_()["state"] == L.ACTIVE
        [ref] = vast.running()
        assert orch.check(now=T0)["alive"] is True
        rec = orch.record()
        flag = tmp_path / "go-on"
        worker, kc, output = running_cell(rec, orch.providers["vastai"], CELL.format(flag=str(flag), pause=0.3))
        assert until(lambda: "tick" in "".join(output), 60), output
        tunnels = [close.__self__ for close in worker._closers]  # the cell's forwards: HTTP, the kernel's
        with vast.host_silent(ref):
            Cut([], tunnels).restarted()  # each died of the silence and was started again
            Path(f"{flag}.during").write_text("")  # printed while nothing reaches the machine
            assert until(Path(f"{flag}.said").exists, 30)
            looks = [orch.check(now=T0 + timedelta(seconds=s)) for s in (5, 35, 65)]
            assert [(a["state"], a["alive"]) for a in looks] == [(L.ACTIVE, False)] * 3, looks
            assert looks[-1]["unreachable"] == "unreachable since 14:02Z"
            assert sidebar_state(ws, orch)["unreachable"]["line"] == "unreachable since 14:02Z"
            assert "no recent heartbeat" in (looks[-1]["unreachable_reason"] or "")
            assert orch.observed[looks[-1]["allocation_id"]].state == "unknown"  # what Vast said, as shown
        back = orch.check(now=T0 + timedelta(seconds=70))
        assert (back["state"], back["alive"], back["unreachable_since"]) == (L.ACTIVE, True, None), back
        assert sidebar_state(ws, orch)["unreachable"] is None  # and then the machine again
        # the cell ran on through it: its output arrives, then its end and its reply
        before = len(output)
        assert until(lambda: "tick" in "".join(output[before:]), 60), "no output from the cell after the silence"
        flag.write_text("")
        assert kc.get_shell_msg(timeout=60)["content"]["status"] == "ok"
        assert until(lambda: "after the partition" in "".join(output), 30), output
        in_order("".join(output))  # what it printed meanwhile too: every line once, in order
        kc.stop_channels()
        worker.close()
        # nothing was destroyed while Vast could not say, and the same instance serves on
        assert vast.running() == [ref]
        assert [r for r in vast.requests if r["op"] == "destroyInstance"] == []
        assert [e.state for e in orch.lifecycle().events if e.state == L.LOST] == []
        orch.stop()
        assert orch.lifecycle().state == L.RELEASED and vast.running() == []
    finally:
        orch.close()


def test_the_server_tells_once_when_the_machine_stops_answering_and_when_it_answers_again() -> None:
    from types import SimpleNamespace

    from jupyter_portable.orchestration.monitor import PortableService

    told: list[tuple[str, str]] = []
    service = PortableService.__new__(PortableService)  # only what _tell_reachability reads
    service.ws = SimpleNamespace(workspace_id="ws-1")  # type: ignore[assignment]
    service.notice = lambda kind, message: told.append((kind, message))  # type: ignore[method-assign]
    lc = SimpleNamespace(state="ACTIVE", allocation_id="al-1")
    service.orchestrator = lambda: SimpleNamespace(lifecycle=lambda: lc)  # type: ignore[method-assign]
    silent = {"allocation_id": "al-1", "since": "2026-12-06T14:02:05Z", "line": "unreachable since 14:02Z",
              "reason": "ssh host does not answer"}
    service._tell_reachability(None, None)
    service._tell_reachability(None, silent)
    service._tell_reachability(silent, silent)  # still silent: told once
    service._tell_reachability(silent, None)
    assert [k for k, _ in told] == ["unreachable", "reachable"]
    assert "unreachable since 14:02Z" in told[0][1] and "nothing is released" in told[0][1]
    assert "answers again" in told[1][1] and "nothing was lost" in told[1][1]
    lc.state = "LOST"  # lost meanwhile: no "answers again"
    service._tell_reachability(silent, None)
    assert len(told) == 2


def test_the_ssh_connect_timeout_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """How long one look at an ssh host that does not answer takes (the CLI's, the server's)."""
    from jupyter_portable.compute.config import provider_kwargs
    from jupyter_portable.core.errors import UsageError

    monkeypatch.delenv("JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT", raising=False)
    assert provider_kwargs("ssh")["connect_timeout"] == 10.0
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT", "2")
    assert provider_kwargs("ssh")["connect_timeout"] == 2.0
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT", "0")
    with pytest.raises(UsageError, match="JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT must be seconds from 1 to 600"):
        provider_kwargs("ssh")
