"""The guardian on the machine (issue 42 item 2): what a worker does about its own machine while the
user side is away, as a table of decisions, and each provider's own means of ending the billing
against its twin: RunPod's pod-scoped key (its own pod only), a Vast instance's own key, and an AWS
instance's shutdown (terminated when launched with InstanceInitiatedShutdownBehavior=terminate).

The end-to-end flow on the RunPod, Vast.ai and AWS twins (a Jupyter server stopped past the idle
window, the worker's guardian releasing its machine by that provider's means, the server back) is
``tests/test_guardian_e2e.py``.
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import env, make_workspace  # noqa: F401 - env: the local market's fixture

from jupyter_portable.core import guardian as G
from jupyter_portable.core.errors import ManifestError, UsageError
from jupyter_portable.core.idle import Activity

T0 = datetime(2026, 12, 6, 3, 0, tzinfo=timezone.utc)


def _policy(**kw: Any) -> G.GuardianPolicy:
    base: dict[str, Any] = {"provider": "runpod", "means": G.POD_KEY, "idle_minutes": 30.0, "absent_grace_s": 600.0,
                            "price_per_hour": 2.0}
    return G.GuardianPolicy(**{**base, **kw})


def _act(last_s: float, *, busy: bool = False, gpu: tuple[tuple[float, float], ...] = ()) -> Activity:
    return Activity(last_activity=T0 + timedelta(seconds=last_s), kernel_busy=busy,
                    gpu_samples=tuple((T0 + timedelta(seconds=t), u) for t, u in gpu))


# (policy changes, user last seen (s after T0; None: never), activity, now (s after T0)) -> (state, reason)
TABLE = [
    ({}, 3500, _act(0), 3600, (G.PRESENT, None)),  # the user side asked 100 s ago: it decides
    ({}, 0, _act(0), 599, (G.PRESENT, None)),
    ({}, 0, _act(0, busy=True), 7200, (G.BUSY, None)),  # away for 2 h, a cell runs: it runs on
    ({}, 0, _act(0, gpu=((7190, 97.0),)), 7200, (G.BUSY, None)),  # a run on the GPU, no cell: on too
    ({}, 0, _act(0), 1700, (G.WAITING, None)),  # away, idle 28 min of 30
    ({}, 0, _act(0), 1800, (G.STOP, "idle")),  # idle 30 min, away for 30: sealed and released
    ({}, None, _act(0), 1800, (G.STOP, "idle")),  # never heard from since the start: away as long
    ({}, 0, _act(600, gpu=((900, 80.0), (960, 0.0))), 2690, (G.WAITING, None)),  # idle from the GPU's last work
    ({}, 0, _act(600, gpu=((900, 80.0), (960, 0.0))), 2700, (G.STOP, "idle")),
    ({"budget_left": 0.9}, 0, _act(0), 1700, (G.STOP, "budget")),  # $2/h for 27 min spends the $0.90 left
    ({"budget_left": 0.9}, 0, _act(0, busy=True), 7200, (G.BUSY, None)),  # out of money, a cell runs: after it
    ({"budget_left": 0.9}, 0, _act(0), 1600, (G.WAITING, None)),
    ({"idle_minutes": 0.0}, 0, _act(0), 86400, (G.WAITING, None)),  # no idle stop set: only the budget stops
    ({"means": None, "provider": "lambdalabs"}, 0, _act(0), 86400, (G.OFF, None)),  # no means: nothing to do
    ({}, 0, None, 7200, (G.WAITING, None)),  # not ready yet: no report of its use
]


@pytest.mark.parametrize(("changes", "seen", "activity", "now", "expected"), TABLE)
def test_what_the_guardian_decides(changes: dict[str, Any], seen: float | None, activity: Activity | None,
                                   now: float, expected: tuple[str, str | None]) -> None:
    d = G.decide(_policy(**changes), now=T0 + timedelta(seconds=now), started=T0,
                 user_seen=None if seen is None else T0 + timedelta(seconds=seen), activity=activity)
    assert (d.state, d.reason) == expected, d


def test_a_policy_is_checked_on_the_way_in() -> None:
    ok = G.GuardianPolicy.from_json(_policy(budget_left=12.5, api_url="https://api.runpod.io").to_json())
    assert ok.budget_left == 12.5 and ok.means == G.POD_KEY
    for bad, word in [({"idle_minutes": -1}, "idle_minutes"), ({"means": "magic"}, "means"),
                      ({"absent_grace_s": float("nan")}, "absent_grace_s"), ({"api_url": "file:///x"}, "api_url"),
                      ({"budget_left": True}, "budget_left"), ({"extra": 1}, "unknown"), ({"provider": ""}, "provider"),
                      ({"started": "yesterday"}, "started")]:
        with pytest.raises(UsageError, match=word):
            G.GuardianPolicy.from_json({**_policy().to_json(), **bad})


def test_the_record_and_the_words_the_user_side_shows() -> None:
    d = G.GuardianDecision(G.STOP, "idle", absent_since=T0 - timedelta(hours=2), idle_since=T0 - timedelta(minutes=42))
    rec = G.release_record(d, _policy(), at=T0 + timedelta(minutes=12), version=41)
    assert G.release_words(rec) == ("Released at 03:12Z after 30 min idle while you were away; saved as version 41; "
                                    "still billed: the stopped pod's disk, until you come back and it is removed")
    aws = G.release_record(d, _policy(provider="aws", means=G.SHUTDOWN_TERMINATE), at=T0, version=7)
    assert G.release_words(aws) == "Released at 03:00Z after 30 min idle while you were away; saved as version 7"
    failed = {**rec, "error": "the provider answered HTTP 403"}
    assert "could not end its own billing: the provider answered HTTP 403" in G.release_words(failed)
    budget = G.release_record(G.GuardianDecision(G.STOP, "budget"), _policy(), at=T0, version=3)
    assert "when the budget ran out" in G.release_words(budget)
    for bad in [{**rec, "by": "server"}, {**rec, "reason": "bored"}, {**rec, "version": 0}, {**rec, "at": "soon"},
                {**rec, "secret": "x"}]:
        with pytest.raises(ManifestError):
            G.check_release(bad)
    from jupyter_portable.core.records import check_allocation

    check_allocation({"allocation_id": "al-1", "state": "released", "released_by": rec})
    with pytest.raises(ManifestError):
        check_allocation({"allocation_id": "al-1", "released_by": {**rec, "reason": "bored"}})


def test_a_route_without_self_stop_says_so_with_the_cost_of_one_idle_night() -> None:
    assert G.no_self_stop_words("lambda", 2.49) == ("if this laptop sleeps, nothing can stop this machine: one "
                                                    "idle night (12 h) costs about $29.88")
    assert G.no_self_stop_words("ssh", None) == "if this laptop sleeps, nothing can stop this machine"
    assert [G.no_self_stop_words(p, 2.0) for p in ("runpod", "vastai", "aws", "gcp", "local", "slurm")] == [None] * 6
    # and the route says it, before anyone rents
    from jupyter_portable.core.offers import Offer
    from jupyter_portable.core.routing import Caps, Signals, WorkspaceFacts, rank_routes

    offers = [Offer(provider=p, id=f"o-{p}", gpu="NVIDIA H100 80GB", gpu_count=1, gpu_memory_gb=80, driver="550.54.15",
                    cuda="12.4", price_per_hour=2.49, region="us-east-1") for p in ("lambda", "runpod")]
    facts = WorkspaceFacts(0, None, None, 0.0)
    routes = {r.offer.provider: r for r in rank_routes(facts, offers, hours=1.0, caps=Caps(), signals=Signals())}
    assert routes["lambda"].to_json()["words"]["unattended"] == (
        "If this laptop sleeps, nothing can stop this machine: one idle night (12 h) costs about $29.88")
    assert "unattended" not in routes["runpod"].words


def test_the_machine_key_is_found_where_the_provider_puts_it(tmp_path: Path) -> None:
    from jupyter_portable.worker.guardian import find_machine_key

    assert find_machine_key(G.POD_KEY, {"RUNPOD_API_KEY": "k1", "RUNPOD_POD_ID": "p1"}) == {"key": "k1", "id": "p1"}
    # Vast keeps the instance's key in the container's first process; an SSH session has none of it
    first = tmp_path / "environ"
    first.write_bytes(b"PATH=/usr/bin\0CONTAINER_ID=4242\0CONTAINER_API_KEY=vk\0")
    assert find_machine_key(G.INSTANCE_KEY, {"PATH": "/bin"}, first) == {"key": "vk", "id": "4242"}
    assert find_machine_key(G.INSTANCE_KEY, {}, tmp_path / "none") is None
    assert find_machine_key(G.SHUTDOWN_TERMINATE, {"RUNPOD_API_KEY": "k1"}) is None


def test_a_shutdown_goes_through_sudo_for_a_login_user_that_is_not_root(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.worker.guardian import Guardian

    fake = tmp_path / "bin" / "shutdown"  # never the host's: PATH holds only this folder
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    ran: list[list[str]] = []

    def run(argv: list[str], **_kw: Any) -> Any:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 1 if len(ran) > 1 else 0, "", "sudo: a password is required")

    g = Guardian(None, _policy(provider="aws", means=G.SHUTDOWN_TERMINATE), None, run=run)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert g._end_billing() is None
    assert ran == [["sudo", "-n", str(fake), "-h", "now"]]
    assert "sudo: a password is required" in (g._end_billing() or "")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    g._end_billing()
    assert ran[-1] == [str(fake), "-h", "now"]


def test_a_shutdown_missing_from_the_workers_path_is_found_in_sbin(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A login user's PATH on Debian has no sbin: the image's shutdown is looked for there too, and a
    machine with none anywhere says where it looked (recorded with the release)."""
    from jupyter_portable.worker import guardian as WG

    sbin = tmp_path / "sbin"  # stands for /usr/sbin: never the host's
    sbin.mkdir()
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(WG, "SBIN", str(sbin))
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    ran: list[list[str]] = []

    def run(argv: list[str], **_kw: Any) -> Any:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    g = WG.Guardian(None, _policy(provider="aws", means=G.SHUTDOWN_TERMINATE), None, run=run)
    assert g._end_billing() == f"no shutdown command on this machine (looked on PATH and in {sbin})" and ran == []
    (sbin / "shutdown").write_text("#!/bin/sh\nexit 0\n")
    (sbin / "shutdown").chmod(0o755)
    assert g._end_billing() is None
    assert ran == [["sudo", "-n", str(sbin / "shutdown"), "-h", "now"]]


# -- each provider's means, against its twin ---------------------------------------------------------


def _machine_env(machine: Any) -> dict[str, str]:
    """The environment the machine's sshd gives every session (what the worker's start reads)."""
    line = next(x for x in (machine.sshd.dir / "sshd_config").read_text().splitlines() if x.startswith("SetEnv "))
    return dict(item.split("=", 1) for item in line.split()[1:])


def _wait_machines(twin: Any, refs: list[str]) -> None:
    for ref in refs:
        twin._wait_started(twin.rentals[ref])
        assert twin.rentals[ref].machine is not None, twin.rentals[ref].start_error


def _release(twin: Any, means: str, environ: dict[str, str]) -> str | None:
    from jupyter_portable.worker.guardian import Guardian, find_machine_key

    key = find_machine_key(means, environ, Path("/nonexistent"))
    assert key is not None
    return Guardian(None, _policy(means=means, api_url=twin.url), key)._end_billing()


def _gone(machine: Any) -> bool:
    import time

    for _ in range(200):  # the twin stops the machine once its answer is sent
        if not machine.alive() and not machine.processes():
            return True
        time.sleep(0.05)
    return False


def test_a_pod_stops_itself_with_its_own_key_and_that_key_stops_no_other_pod(tmp_path: Path) -> None:
    from twins.machines import unavailable
    from twins.runpod import RunPodTwin
    from twins.server import TwinOffer

    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.compute.runpod import RunPodProvider

    if unavailable():
        pytest.skip(unavailable())
    with RunPodTwin(tmp_path / "twin", offers=[TwinOffer(stock=2)], boot_delay_s=0.0) as twin:
        mine = twin.rent(twin.offers[0], twin.new_ref(), name="mine").ref
        other = twin.rent(twin.offers[0], twin.new_ref(), name="other").ref
        _wait_machines(twin, [mine, other])
        env_mine, env_other = _machine_env(twin.machines[mine]), _machine_env(twin.machines[other])
        assert env_mine["RUNPOD_POD_ID"] == mine and env_mine["RUNPOD_API_KEY"] != twin.api_key
        # the pod's key on the other pod: refused, and that pod runs on
        forged = {**env_mine, "RUNPOD_POD_ID": other}
        assert "HTTP 403" in (_release(twin, G.POD_KEY, forged) or "")
        provider = RunPodProvider(**twin.provider_kwargs())
        assert provider.status(Allocation("al-o", "runpod", "x", other, "")).state == "reachable"
        # its own pod: stopped, its container gone, the GPU no longer billed
        assert _release(twin, G.POD_KEY, env_mine) is None
        assert provider.status(Allocation("al-m", "runpod", "x", mine, "")).state == "stopped"
        assert _gone(twin.machines[mine]) and twin.machines[other].alive()
        assert [r["status"] for r in twin.requests if r["op"] == "podAction"] == [403, 200]
        # the key reaches nothing else of the account
        import httpx

        listed = httpx.get(f"{twin.url}/v2/pods", headers={"Authorization": f"Bearer {env_other['RUNPOD_API_KEY']}"})
        assert listed.status_code == 403
        assert twin.violations == []


def test_a_vast_instance_stops_itself_with_its_own_key(tmp_path: Path) -> None:
    from twins.machines import unavailable
    from twins.server import TwinOffer
    from twins.vastai import VastTwin

    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.compute.vastai import VastProvider

    if unavailable():
        pytest.skip(unavailable())
    with VastTwin(tmp_path / "twin", offers=[TwinOffer(stock=2)], boot_delay_s=0.0) as twin:
        ask = next(iter(twin.asks))
        mine = twin.rent(twin.offers[0], "7001", name="mine", ask=ask).ref  # Vast numbers its instances
        other = twin.rent(twin.offers[0], "7002", name="other", ask=ask).ref
        _wait_machines(twin, [mine, other])
        env_mine = _machine_env(twin.machines[mine])
        assert "HTTP 401" in (_release(twin, G.INSTANCE_KEY, {**env_mine, "CONTAINER_ID": other}) or "")
        assert _release(twin, G.INSTANCE_KEY, env_mine) is None
        provider = VastProvider(api_key=twin.api_key, base_url=twin.url)
        assert provider.status(Allocation("al-m", "vastai", "x", mine, "")).state == "stopped"
        assert provider.status(Allocation("al-o", "vastai", "x", other, "")).state == "reachable"
        assert _gone(twin.machines[mine]) and twin.machines[other].alive()
        assert twin.violations == []


def test_an_aws_instance_that_shuts_down_is_terminated_as_launched(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider launches with InstanceInitiatedShutdownBehavior=terminate: the machine's own
    shutdown (run on it, by its login user through sudo, as the guardian does) terminates it; an
    instance launched without it is only stopped (its disk still bills)."""
    import boto3
    from twins.aws import AwsTwin
    from twins.machines import unavailable

    if unavailable():
        pytest.skip(unavailable())
    with AwsTwin(tmp_path / "twin", boot_delay_s=0.0, ssh_cidr="127.0.0.1/32") as twin:
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        ec2 = boto3.client("ec2")
        ids = {}
        for behaviour in ("terminate", "stop"):
            ids[behaviour] = ec2.run_instances(ImageId="ami-12345678", InstanceType="g5.xlarge", MinCount=1,
                                               MaxCount=1, InstanceInitiatedShutdownBehavior=behaviour
                                               )["Instances"][0]["InstanceId"]
        import time

        for _ in range(400):
            if all(twin.booting[i].machine is not None for i in ids.values()):
                break
            time.sleep(0.05)
        for ref in ids.values():
            machine = twin.booting[ref].machine
            machine.authorize([machine.sshd.client_key.with_suffix(".pub").read_text()])
            # the login user itself may not power the machine off (systemd refuses it over SSH): nothing happens
            refused = subprocess.run(machine.sshd.ssh_argv("shutdown -h now"), capture_output=True, text=True,
                                     timeout=60)
            assert refused.returncode != 0 and "Interactive authentication required" in refused.stderr
            assert ref not in dict(twin.shutdowns) and twin.instance(ref)._state.name == "running"
            done = subprocess.run(machine.sshd.ssh_argv('sudo -n "$(command -v shutdown)" -h now'),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert (machine.home.parent / "shutdown.log").read_text() == (
                "shutdown -h now by root through sudo from ubuntu\n")
        states = {}
        for _ in range(200):
            found = ec2.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
            states = {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}
            if states[ids["terminate"]] == "terminated" and states[ids["stop"]] == "stopped":
                break
            time.sleep(0.05)
        assert (states[ids["terminate"]], states[ids["stop"]]) == ("terminated", "stopped"), states
        assert sorted(twin.shutdowns) == sorted([(ids["terminate"], "terminate"), (ids["stop"], "stop")])


def test_a_release_that_fails_leaves_the_machine_as_it_was_and_is_tried_again_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store does not answer the seal: nothing is stopped, the worker takes writes again, and the
    guardian tries again after RETRY_S, not at every tick."""
    from types import SimpleNamespace

    from jupyter_portable.core.errors import StoreError
    from jupyter_portable.worker import guardian as WG
    from jupyter_portable.worker.activity import Activity as Seen

    now = [1_000_000.0]
    seen = Seen(clock=lambda: now[0])
    seen.ready()
    state = SimpleNamespace(activity=seen, phase="ready", accepting=True, sealed=None)
    calls: list[str] = []

    def seal(st: Any, message: str) -> dict[str, Any]:
        calls.append(message)
        st.accepting, st.phase = False, "sealing"
        raise StoreError("the store did not answer")

    monkeypatch.setattr("jupyter_portable.worker.agent.seal", seal)
    g = WG.Guardian(state, _policy(idle_minutes=1.0, absent_grace_s=10.0), {"key": "pod-key-b7e1", "id": "p"},
                    clock=lambda: now[0])
    g.heard()
    now[0] += 61
    assert g.tick().state == G.STOP and len(calls) == 1
    assert (state.accepting, state.phase, g.released) == (True, "ready", None)
    assert "the store did not answer" in (g.failed or "") and g.view()["failed"] == g.failed
    now[0] += 1
    g.tick()
    assert len(calls) == 1  # not at every tick
    now[0] += WG.RETRY_S
    g.tick()
    assert len(calls) == 2
    assert "pod-key-b7e1" not in json.dumps(g.view()) and g.view()["key"] is True  # /status: only that it has one


def test_a_gcp_vm_that_shuts_down_is_stopped_and_its_disk_kept(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """GCP's means: a shutdown from the machine stops the VM (TERMINATED, not preempted: the provider
    says stopped), and its boot disk stays (what still bills, docs/continue.md)."""
    import time

    from test_twins_cloud import wait_reachable
    from twins.gcp import GcpTwin
    from twins.machines import unavailable

    from jupyter_portable.compute.gcp import GcpProvider
    from jupyter_portable.compute.keys import host_key_pair

    if unavailable():
        pytest.skip(unavailable())
    with GcpTwin(tmp_path / "gcp", boot_delay_s=0.0) as twin:
        for name, value in twin.env().items():
            monkeypatch.setenv(name, value)
        provider = GcpProvider()
        offer = next(o for o in provider.offers() if not o.spot)
        alloc = provider.launch(offer, allocation_id="alloc-gcp", host_key=host_key_pair())
        wait_reachable(provider, alloc)
        [ref] = twin.running()
        machine = twin.vms[ref].machine
        machine.authorize([machine.sshd.client_key.with_suffix(".pub").read_text()])
        done = subprocess.run(machine.sshd.ssh_argv('sudo -n "$(command -v shutdown)" -h now'),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for _ in range(200):
            if provider.status(alloc).state != "reachable":
                break
            time.sleep(0.05)
        assert provider.status(alloc).state == "stopped" and twin.shutdowns == [ref]
        assert not twin.vms[ref].deleted  # the VM and its disk are there until the user side deletes them


def test_a_machine_its_guardian_sealed_but_could_not_stop_is_released_when_the_user_side_is_back(
        env: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    """The guardian sealed and recorded, but its provider's means failed (a refused key): the worker
    still answers, sealed. The user side, back, takes the release in as its own, says why the machine
    could not stop itself, and releases it."""
    from datetime import datetime, timezone

    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.idle import idle_release
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    ws = make_workspace(tmp_path / "ws", env["store"])
    orch = Orchestrator(ws)
    try:
        aid = orch.continue_()["allocation_id"]
        rec = orch.record()
        assert rec is not None
        sealed = orch.client(aid).seal("sealed by the machine: 30 min idle while the user side was away")
        # what the guardian records when the provider refused its key (worker/guardian.release)
        head = ws.store.read_manifest(ws.workspace_id, ws.store.read_head(ws.workspace_id)[0].version)
        record = next(a for a in reversed(head.allocations) if a["allocation_id"] == aid)
        decision = G.GuardianDecision(G.STOP, "idle", absent_since=T0, idle_since=T0)
        released = {**G.release_record(decision, _policy(), at=datetime(2026, 12, 6, 3, 12, tzinfo=timezone.utc),
                                       version=sealed["version"]), "error": "the provider answered HTTP 403"}
        ws.record_allocation({**record, "released_by": released}, epoch=orch.lifecycle().epoch)  # the worker's
        out = orch.check(now=T0)
        assert out["state"] == L.RELEASED, out
        said = idle_release(orch.lifecycle())
        assert said is not None and said["message"] == (
            f"Released at 03:12Z after 30 min idle while you were away; saved as version {sealed['version']} "
            "(the machine could not end its own billing: the provider answered HTTP 403)")
        assert orch.lifecycle().version == sealed["version"]
        assert orch.provider_of(rec.allocation).status(rec.allocation).state in ("terminated", "lost")
    finally:
        orch.close()
