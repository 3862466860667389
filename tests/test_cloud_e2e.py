"""Continue onto a rented cloud GPU, end to end, on every provider (issue 12, item 5).

Each provider is pointed at its twin by the environment alone (``RUNPOD_API_URL``,
``VAST_API_URL``, ``LAMBDA_API_URL``, ``AWS_ENDPOINT_URL_EC2``, ``JUPYTER_PORTABLE_GCP_ENDPOINT``),
and every machine the twin rents is a real sshd on loopback with a bare Python. The flow:
routes -> Continue -> ACTIVE -> the portable kernel runs a cell on the machine -> ``%workspace
checkpoint`` -> the twin takes the machine back -> LOST with the provider's reason -> Continue to
a new machine -> the same files and checkpoint hash -> Stop -> the machine is deleted.

The worker is installed by the bootstrap (the machine's Python lacks the package, and the
allocation records the venv it made), never found on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_e2e import EventStream, KernelSocket, is_state, make_workspace, start_session
from twins.machines import unavailable
from userenv import publish_lockfile, user_lockfile

pytest_plugins = ["pytest_jupyter.jupyter_server"]
pytestmark = pytest.mark.timeout(420)

PROVIDERS = ("runpod", "vastai", "lambda", "aws", "gcp")
# each provider's machines run another Python than the tests' (pyenv's 3.11.7): every interpreter at least once
MACHINE_PYTHON = {"runpod": "3.11.2", "vastai": "3.10", "lambda": "3.12", "aws": "3.13", "gcp": "3.10"}
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 2.69,
        "driver": "550.90.07", "cuda": "12.4", "stock": 3, "region": "US-TX-3"}


ANSWERED_500 = {"gateway_errors": 1, "gateway_status": 500}


def launches(twin: Any) -> list[int]:
    """The status each create the twin was sent answered, in order (GCP's twin keeps no status: 0)."""
    if hasattr(twin, "launch_ops"):  # the HTTP providers' twins
        return [r["status"] for r in twin.requests if r["op"] in twin.launch_ops]
    if hasattr(twin, "actions"):  # AWS; its dry runs answer 412 (DryRunOperation)
        return [status for action, status in twin.actions if action == "RunInstances" and status != 412]
    return [0 for method, path in twin.requests if method == "POST" and path.endswith("/instances")]


@contextlib.contextmanager
def twin_for(provider: str, root: Path) -> Iterator[Any]:
    """The provider's twin. Its first create is carried out and answered 500 (issue 42: the machine
    exists, the answer says it failed): the Continue must find that machine and use it."""
    from twins.machines import require_python

    python = require_python(MACHINE_PYTHON[provider])
    if provider == "runpod":
        from twins.runpod import RunPodTwin

        with RunPodTwin(root, offers=[{**H100, "python": python}], boot_delay_s=0.5, **ANSWERED_500) as twin:
            yield twin
    elif provider == "vastai":
        from twins.vastai import VastTwin

        with VastTwin(root, offers=[{**H100, "python": python}], boot_delay_s=0.5, **ANSWERED_500) as twin:
            yield twin
    elif provider == "lambda":
        from twins.lambdalabs import LambdaTwin
        from twins.lambdalabs import unavailable as lambda_unavailable

        reason = lambda_unavailable()
        if reason:
            pytest.skip(reason)
        with LambdaTwin(root, offers=[{**H100, "region": "us-east-1", "python": python}], boot_delay_s=0.5,
                        **ANSWERED_500) as twin:
            yield twin
    elif provider == "aws":
        from twins.aws import AwsTwin

        with AwsTwin(root, offers={"g5.xlarge": {"gpu": "NVIDIA A10G", "memory_mb": 24576, "count": 1,
                                                 "driver": "550.54.15", "cuda": "12.4", "stock": None,
                                                 "python": python}},
                     boot_delay_s=0.5, ssh_cidr="127.0.0.1/32", python=python, **ANSWERED_500) as twin:
            yield twin
    else:
        from twins.gcp import GcpOffer, GcpTwin

        # a spot VM: Compute Engine's preemption is what takes it back (on demand, it would be "stopped")
        with GcpTwin(root, offers=[GcpOffer(machine_type="g2-standard-4", zone="us-central1-a", python=python)],
                     boot_delay_s=0.5, **ANSWERED_500) as twin:
            yield twin


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for every provider's workspace: the worker's wheels are fetched into it once (cold,
    from the local wheelhouse), and every later machine is warm."""
    return tmp_path_factory.mktemp("cloud-store")


# where a machine logs in as ubuntu, not root, the store is S3 (a moto server): a folder of this
# computer's is not a store a rented machine could reach, and here not one its user could write
S3_STORE_PROVIDERS = ("lambda", "aws", "gcp")
_BUCKETS: dict[str, str] = {}


@pytest.fixture(params=PROVIDERS)
def cloud(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          wheelhouse: Path) -> Iterator[tuple[str, Any]]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    provider = request.param
    if provider in S3_STORE_PROVIDERS:
        request.getfixturevalue("aws_env")
    with twin_for(provider, tmp_path / "twin") as twin:
        for key, value in twin.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", provider)
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
        monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
        monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
        monkeypatch.setenv("JUPYTER_PORTABLE_FIRST_MACHINE", "open")  # the session opened rents the first machine
        # default settings: the notebook's environment is the workspace's lockfile, fitted to the machine's Python
        monkeypatch.delenv("JUPYTER_PORTABLE_ENVIRONMENT", raising=False)
        monkeypatch.delenv("JUPYTER_PORTABLE_REMOTE_PYTHON", raising=False)
        monkeypatch.delenv("JUPYTER_PORTABLE_SSH_KEY", raising=False)
        yield provider, twin


@pytest.fixture(scope="module")
def lockfile(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The researcher's environment, made on the tests' Python (3.11.7): ipython 9 and friends."""
    folder = Path(__file__).resolve().parents[1] / ".wheelhouse"
    return user_lockfile(tmp_path_factory.mktemp("user-env"), folder)


@pytest.fixture
def jp_root_dir(tmp_path: Path, cloud: tuple[str, Any], store: Path, lockfile: bytes) -> Path:
    root = tmp_path / "workspace"
    url: Path | str = store
    if cloud[0] in S3_STORE_PROVIDERS:
        from conftest import make_bucket

        # one bucket for the module, as the file store is one folder: later machines of a kind are warm
        url = f"s3://{_BUCKETS.setdefault('cloud', make_bucket())}/cloud"
    publish_lockfile(make_workspace(root, url), lockfile)
    return root


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_portable": True}, "allow_unauthenticated_access": False},
            "Portable": {"check_interval_s": 1.0}}


async def _state(jp_fetch: Any) -> dict[str, Any]:
    return json.loads((await jp_fetch("portable", "api", "state")).body)


def _state_of(root: Path) -> dict[str, Any]:
    """What ``jupyter portable state --json`` reports, read the way it builds it (the orchestrator's summary)."""
    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    orch = Orchestrator(Workspace.find(root), providers={})
    try:
        return orch.summary()
    finally:
        orch.close()


def _allocation(root: Path, allocation_id: str) -> Any:
    from jupyter_portable import Workspace
    from jupyter_portable.worker.client import load_allocation

    return load_allocation(Workspace.find(root).copy, allocation_id)


async def test_continue_onto_a_bare_cloud_machine(jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any,
                                                  jp_root_dir: Path, cloud: tuple[str, Any], store: Path) -> None:
    provider, twin = cloud
    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)
    await events.wait_for(is_state("ACTIVE"), timeout=240)
    state = await _state(jp_fetch)
    assert state["lifecycle"]["state"] == "ACTIVE" and state["allocation"]["provider"] == provider
    first = state["lifecycle"]["allocation_id"]
    alloc = _allocation(jp_root_dir, first)
    assert alloc.ref in twin.machines, (alloc.ref, list(twin.machines))
    # its create was answered 500 although the machine was made: that machine, the only one, is the
    # one in use (the HTTP providers sent the create once; botocore sends EC2's again, and its
    # ClientToken makes EC2 answer the same instance)
    assert twin.gateway_errors == 0 and twin.running() == [alloc.ref], (launches(twin), twin.running())
    assert launches(twin) == [500] if hasattr(twin, "launch_ops") else 500 in launches(twin) or provider == "gcp"
    machine = twin.machines[alloc.ref]
    # the worker was installed by the bootstrap into the machine's own home, not found there
    assert alloc.details["python"].startswith(str(machine.home)), alloc.details["python"]
    assert alloc.details["bootstrap"]["sent"] > 0
    # reached at the provider's endpoint, its host key pinned for this allocation alone
    assert alloc.ssh is not None and alloc.details["host_key_fingerprint"] == machine.host_key_fingerprint()
    assert alloc.details["host_key_source"] == ("user data" if provider in ("aws", "gcp") else "first use")

    # default settings: the workspace's lockfile (made on 3.11.7) rebuilt for the machine's Python
    first_ready = next(e for e in events.seen if e.get("state") == "READY")
    env = first_ready["detail"]["environment"]
    machine_py = MACHINE_PYTHON[provider]
    assert env["mode"] == "lockfile" and env["python"]["recorded"].startswith("3.11."), env
    assert env["python"]["installed"].startswith(machine_py), env
    changed = {c["name"]: c for c in env["changes"]}
    if machine_py == "3.10":  # ipython 9 needs Python >= 3.11: the nearest one that runs, and why
        assert changed["ipython"]["why"] == "requires-python" and changed["ipython"]["installed"] < "9", changed
    assert env["summary"].startswith(f"Python {env['python']['recorded']} -> {env['python']['installed']}")
    cli_state = _state_of(jp_root_dir)
    assert cli_state["environment"]["summary"] == env["summary"]
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import sys, IPython; print('%d.%d' % sys.version_info[:2], IPython.__version__)")
    assert status == "ok", out
    assert machine_py.startswith(out.split()[0]) and out.split()[1] == (changed.get("ipython") or {}).get(
        "installed", out.split()[1]), out
    status, out = await kernel.run("import os, sys; open('made-on-cloud.txt', 'w').write('from the cloud');"
                                   "open('ckpt.bin', 'wb').write(bytes(range(256)) * 64);"
                                   "print(os.environ['JUPYTER_PORTABLE_ALLOCATION'], os.getcwd())")
    assert status == "ok", out
    assert out.split()[0] == first and out.split()[1].startswith(str(machine.home))
    status, out = await kernel.run("%workspace checkpoint ckpt.bin --step 3 --settle 0.2 --wait")
    assert status == "ok" and "verified" in out, out
    cps = json.loads((await jp_fetch("portable", "api", "checkpoints")).body)
    recorded = cps["latest"]["hash"]

    # the provider takes the machine back: LOST within 30 s, with the provider's reason
    mark = len(events.seen)
    twin.kill(alloc.ref, "host maintenance")
    # the server looks every second (check_interval_s): 30 s is the bound, with a wide margin
    lost = await events.wait_for(is_state("LOST"), timeout=30, after=mark)
    assert lost["allocation_id"] == first and lost["reason"] and "heartbeats" not in lost["reason"], lost

    mark = len(events.seen)
    await jp_fetch("portable", "api", "continue", method="POST", body="{}")
    await events.wait_for(is_state("ACTIVE"), timeout=240, after=mark)
    ready = next(e for e in events.seen[mark:] if e.get("state") == "READY")
    assert ready["verified"] is True and ready["detail"]["checkpoints"]["ckpt.bin"] == recorded
    # the notebook's environment came with it, fitted to the machine's Python, and says how
    env = ready["detail"]["environment"]
    assert env["mode"] == "lockfile", env
    state = await _state(jp_fetch)
    second = state["lifecycle"]["allocation_id"]
    assert second != first and state["allocation"]["provider"] == provider
    again = _allocation(jp_root_dir, second)
    assert again.details["bootstrap"]["warm"] is True  # every wheel from the store, no index asked
    try:
        await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    except TimeoutError as exc:  # what the server knew of the kernel then, for whoever reads the failure
        k = jp_serverapp.kernel_manager.get_kernel(kernel_id)
        raise AssertionError(f"{exc}; the server's kernel: {k.execution_state}, ports {k.ports}, on "
                             f"{getattr(k.provisioner, 'allocation_id', None)} (the new machine is {second})") from exc
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION']);"
                                   "print(open('made-on-cloud.txt').read())", timeout=60)
    assert status == "ok", out
    assert out.split() == [second, "from", "the", "cloud"]

    await jp_fetch("portable", "api", "stop", method="POST", body="{}")
    await events.wait_for(is_state("RELEASED"), timeout=120)
    assert again.ref not in twin.running() and alloc.ref not in twin.running(), twin.running()
    # with no machine the notebook's kernel is parked on the local placeholder: wait for it, so the
    # server's teardown never meets that restart half done
    km = jp_serverapp.kernel_manager
    for _ in range(240):
        k = km.get_kernel(kernel_id)
        if k.ready.done() and getattr(k.provisioner, "is_placeholder", False):
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError("the kernel was not parked on the placeholder after the stop")


def _twin_env(tmp_path: Path, twin: Any) -> dict[str, str]:
    return {**twin.env(), "JUPYTER_PORTABLE_PROVIDERS": "runpod", "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh"),
            "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"), "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0"}


def test_the_cli_continues_onto_a_twin_and_shows_the_machine(tmp_path: Path, wheelhouse: Path, store: Path,
                                                             cli: Any, lockfile: bytes) -> None:
    from twins.runpod import RunPodTwin

    if unavailable():
        pytest.skip(unavailable())
    root = tmp_path / "ws"
    publish_lockfile(make_workspace(root, store), lockfile)
    with RunPodTwin(tmp_path / "twin", offers=[H100], boot_delay_s=0.5) as twin:
        env = {**_twin_env(tmp_path, twin), "JUPYTER_PORTABLE_WHEEL_FIND_LINKS": str(wheelhouse),
               "JUPYTER_PORTABLE_NO_INDEX": "1"}
        out = cli.json("continue", cwd=root, extra_env=env, timeout=300)
        assert out["state"] == "ACTIVE" and out["provider"] == "runpod", out
        [ref] = twin.running()
        machine = twin.machines[ref]
        state = cli.json("state", cwd=root, extra_env=env)
        # the environment, as continue --json and state --json both say it (Debian's 3.11.2, not 3.11.7)
        assert out["environment"]["mode"] == "lockfile" and state["environment"] == out["environment"]
        assert out["environment"]["python"] == {"recorded": out["environment"]["python"]["recorded"],
                                                "installed": "3.11.2"}, out["environment"]
        assert state["machine"]["ssh"] == {"host": machine.host, "port": machine.port, "user": "root"}
        assert state["machine"]["host_key_fingerprint"] == machine.host_key_fingerprint()
        assert state["machine"]["host_key_source"] == "first use"
        cli("stop", cwd=root, extra_env=env, timeout=180)
        assert twin.running() == []
        # the private key stayed on this side: nothing of it in the store
        private = (tmp_path / "ssh" / "id_ed25519").read_bytes()
        assert private.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
        body = private.split(b"\n")[1]
        assert not any(body in p.read_bytes() for p in store.rglob("*") if p.is_file())


def test_the_exact_environment_refuses_a_machine_of_another_python_with_the_list(
        tmp_path: Path, wheelhouse: Path, store: Path, cli: Any, lockfile: bytes) -> None:
    from twins.machines import require_python
    from twins.runpod import RunPodTwin

    if unavailable():
        pytest.skip(unavailable())
    root = tmp_path / "ws"
    publish_lockfile(make_workspace(root, store), lockfile)
    python310 = require_python("3.10")
    with RunPodTwin(tmp_path / "twin", offers=[{**H100, "python": python310}], boot_delay_s=0.5) as twin:
        env = {**_twin_env(tmp_path, twin), "JUPYTER_PORTABLE_WHEEL_FIND_LINKS": str(wheelhouse),
               "JUPYTER_PORTABLE_NO_INDEX": "1"}
        proc = cli("continue", "--environment", "exact", cwd=root, extra_env=env, timeout=300, check=False)
        assert proc.returncode != 0, proc.stdout
        reason = proc.stderr.strip().splitlines()[-1]
        assert "the work ran on Python 3.11" in reason and "python3 is 3.10" in reason, proc.stderr
        assert "ipython" in reason and "(requires-python)" in reason, proc.stderr
        assert twin.running() == []  # refused and released
        state = cli.json("state", cwd=root, extra_env=env)
        assert state["state"] == "FAILED"


def test_a_request_the_published_schema_refuses_fails_the_continue(tmp_path: Path, wheelhouse: Path, store: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """RunPod v2 renamed ``containerDiskInGb`` to ``disk``: sending the old name is refused by the twin as by
    RunPod, and the Continue fails on that route (it does not pass by accident)."""
    from twins.runpod import RunPodTwin

    from jupyter_portable.compute.runpod import RunPodProvider
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.core.errors import NoCapacity
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    if unavailable():
        pytest.skip(unavailable())
    ws = make_workspace(tmp_path / "ws", store)
    with RunPodTwin(tmp_path / "twin", offers=[H100], boot_delay_s=0.5) as twin:
        for key, value in _twin_env(tmp_path, twin).items():
            monkeypatch.setenv(key, value)
        provider = RunPodProvider()
        request = provider._api.request

        def old_names(method: str, path: str, **kw: Any) -> Any:
            body = kw.get("json_body")
            if method == "POST" and path == "/v2/pods" and isinstance(body, dict):
                kw["json_body"] = {("containerDiskInGb" if k == "disk" else k): v for k, v in body.items()}
            return request(method, path, **kw)

        monkeypatch.setattr(provider._api, "request", old_names)
        orch = Orchestrator(ws, providers={"runpod": provider})
        try:
            with pytest.raises(NoCapacity, match="422"):
                orch.continue_()
        finally:
            orch.close()
        assert orch.lifecycle().state == L.FAILED
        assert twin.violations and "containerDiskInGb" in twin.violations[0]
        assert twin.running() == []


@pytest.mark.parametrize(("text", "expected"), [
    ("", {"*": 900.0}), ("600", {"*": 600.0}), ("runpod=300, aws=1200", {"*": 900.0, "runpod": 300.0, "aws": 1200.0}),
    ("runpod=300,120", {"*": 120.0, "runpod": 300.0})])
def test_boot_timeouts_per_provider(text: str, expected: dict[str, float]) -> None:
    from jupyter_portable.orchestration.orchestrator import boot_timeouts

    assert boot_timeouts(text) == expected


@pytest.mark.parametrize("text", ["soon", "runpod=", "runpod=0", "run pod=60", "aws=1e9"])
def test_a_bad_boot_timeout_names_the_setting(text: str) -> None:
    from jupyter_portable.core.errors import UsageError
    from jupyter_portable.orchestration.orchestrator import boot_timeouts

    with pytest.raises(UsageError, match="JUPYTER_PORTABLE_BOOT_TIMEOUT"):
        boot_timeouts(text)
