"""No paid machine is leaked (issue 13, acceptance), against the HTTP twins (RunPod, Vast, Lambda), and
(issue 27, item 3) against the AWS and Google Cloud twins when a machine's first delete fails.

``jupyter portable continue`` (a real subprocess) is SIGKILLed just after it records each state
(``JUPYTER_PORTABLE_KILL_IN_STATE``: the write-ahead ACQUIRING, LAUNCHED when the launch answered,
PROBING, MATERIALIZING, READY); then ``machines --orphans --terminate`` (before the machine was
handed to a worker) or the next ``continue`` (after) leaves no machine running on the twin but the
one now ACTIVE, which Stop then deletes. Also with the twin at 2 requests/s, and when the first
delete of each machine fails with a 5xx. A launch whose answer is lost is found by its name, never
rented twice. A session on a twin with a known price records the provider's figure as its spend, and
where it came from (RunPod: its bill).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hooks_site.portable_faults import fault_env
from jupyter_e2e import make_workspace
from twins.machines import unavailable

pytestmark = pytest.mark.timeout(300)

HTTP = ("runpod", "vastai", "lambda")
JP = str(Path(sys.executable).parent / "jupyter-portable")
# a price that makes a cent about ten seconds
OFFER = {"gpu": "NVIDIA H100 80GB HBM3", "model": "H100 SXM", "memory_mb": 81559, "count": 1, "price": 3.6,
         "driver": "550.90.07", "cuda": "12.4", "stock": 4, "region": "US-TX-3"}
CONDITIONS: dict[str, dict[str, Any]] = {"plain": {},
                                         "rate-2-and-first-delete-fails": {"rate": 2.0, "fail_first_delete": True},
                                         "first-delete-fails": {"fail_first_delete": True}}


@contextlib.contextmanager
def twin_for(provider: str, root: Path, **kw: Any) -> Iterator[Any]:
    if provider == "runpod":
        from twins.runpod import RunPodTwin

        with RunPodTwin(root, offers=[OFFER], boot_delay_s=0.3, **kw) as twin:
            yield twin
    elif provider == "vastai":
        from twins.vastai import VastTwin

        with VastTwin(root, offers=[OFFER], boot_delay_s=0.3, **kw) as twin:
            yield twin
    elif provider == "aws":
        from twins.aws import AwsTwin

        with AwsTwin(root, offers={"g5.xlarge": {"gpu": "NVIDIA A10G", "memory_mb": 24576, "count": 1}},
                     boot_delay_s=0.3, **kw) as twin:
            yield twin
    elif provider == "gcp":
        from twins.gcp import GcpTwin

        with GcpTwin(root, boot_delay_s=0.3, **kw) as twin:
            yield twin
    else:
        from twins.lambdalabs import LambdaTwin
        from twins.lambdalabs import unavailable as lambda_unavailable

        reason = lambda_unavailable()
        if reason:
            pytest.skip(reason)
        with LambdaTwin(root, offers=[{**OFFER, "region": "us-east-1"}], boot_delay_s=0.3, **kw) as twin:
            yield twin


@contextlib.contextmanager
def cloud(provider: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Iterator[tuple[Any, Path]]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with twin_for(provider, tmp_path / "twin", **kw) as twin:
        for key, value in twin.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", provider)
        monkeypatch.setenv("JUPYTER_PORTABLE_SSH_STATE", str(tmp_path / "ssh-state"))
        monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
        monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
        monkeypatch.setenv("JUPYTER_PORTABLE_ENVIRONMENT", "image")
        monkeypatch.setenv("JUPYTER_PORTABLE_BOOT_TIMEOUT", "60")
        monkeypatch.delenv("JUPYTER_PORTABLE_REMOTE_PYTHON", raising=False)
        monkeypatch.delenv("JUPYTER_PORTABLE_SSH_KEY", raising=False)
        monkeypatch.delenv("JUPYTER_PORTABLE_KILL_IN_STATE", raising=False)
        root = tmp_path / "workspace"
        if getattr(twin, "login_user", "root") != "root":
            # its worker logs in as ubuntu: a folder of the tests' (mode 700) is no store for it, an S3 bucket is
            from conftest import make_bucket

            for key, value in S3_ENV.items():
                monkeypatch.setenv(key, value)
            monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_endpoint())
            monkeypatch.delenv("AWS_PROFILE", raising=False)
            make_workspace(root, f"s3://{make_bucket()}/leaks")
        else:
            make_workspace(root, tmp_path / "store")
        yield twin, root


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
_MOTO: list[Any] = []


def _moto_endpoint() -> str:
    """A moto S3 server for this test process, started on first use (tests/conftest.py starts its own per session
    for fixtures; a context manager cannot ask for one)."""
    if not _MOTO:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        _MOTO.append(server)
    host, port = _MOTO[0].get_host_and_port()
    return f"http://{host}:{port}"


def cli(root: Path, *args: str, kill_at: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = fault_env(**({"JUPYTER_PORTABLE_KILL_IN_STATE": kill_at} if kill_at else {}))
    return subprocess.run([JP, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def lifecycle(root: Path) -> Any:
    from jupyter_portable import Workspace
    from jupyter_portable.workdir import lifecycle_file

    return lifecycle_file.load(Workspace.find(root).copy)


# -- killed before a worker ran: `machines --orphans --terminate` cleans up ----------------------

# killed in the write-ahead ACQUIRING nothing was launched yet, whatever the provider: once is enough
CHEAP = [("runpod", "ACQUIRING:2", "plain")] + [(p, at, "plain") for p in HTTP for at in ("LAUNCHED", "PROBING")] \
    + [(p, "LAUNCHED", "rate-2-and-first-delete-fails") for p in HTTP] \
    + [(p, "LAUNCHED", "first-delete-fails") for p in ("aws", "gcp")]


@pytest.mark.parametrize(("provider", "kill_at", "condition"), CHEAP)
def test_a_continue_killed_before_the_worker_leaves_nothing_after_machines_orphans_terminate(
        provider: str, kill_at: str, condition: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cloud(provider, tmp_path, monkeypatch, **CONDITIONS[condition]) as (twin, root):
        killed = cli(root, "continue", "--json", kill_at=kill_at)
        assert killed.returncode == -9, killed.stderr[-2000:]
        # killed just after the write-ahead record: nothing launched yet; after it, the machine runs
        assert len(twin.running()) == (0 if kill_at.startswith("ACQUIRING") else 1)
        if twin.running():
            from jupyter_portable import Workspace
            from jupyter_portable.worker.client import load_allocation

            lc_aid = lifecycle(root).allocation_id
            saved = load_allocation(Workspace.find(root).copy, lc_aid)
            assert saved is not None and saved.ref == twin.running()[0]  # the machine id, recorded at once
            listed = json.loads(cli(root, "machines", "--json").stdout)
            [row] = listed["machines"]
            assert (row["allocation_id"], row["workspace_id"], row["orphan"]) == (
                lc_aid, Workspace.find(root).workspace_id, True), row
        done = cli(root, "machines", "--orphans", "--terminate", "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        assert twin.running() == [], (twin.running(), done.stdout)
        if provider in ("aws", "gcp"):  # its first delete answered 503, the next one was accepted
            assert list((twin.terminates if provider == "aws" else twin.deletes).values()) == [2]
        assert json.loads(cli(root, "machines", "--json").stdout)["machines"] == []


# -- killed once the worker was on it: the next `continue` finishes, Stop deletes it -------------

LATE = [("runpod", "MATERIALIZING"), ("lambda", "READY")]


@pytest.mark.parametrize(("provider", "kill_at"), LATE)
def test_a_continue_killed_on_the_machine_is_finished_by_the_next_and_stop_deletes_it(
        provider: str, kill_at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheelhouse: Path) -> None:
    with cloud(provider, tmp_path, monkeypatch) as (twin, root):
        killed = cli(root, "continue", "--json", kill_at=kill_at)
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert len(twin.running()) == 1
        again = cli(root, "continue", "--json")
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)["state"] == "ACTIVE"
        active = lifecycle(root).allocation_id
        # nothing else runs: the one machine is the ACTIVE allocation's, not an orphan
        rows = json.loads(cli(root, "machines", "--json").stdout)["machines"]
        assert [(r["allocation_id"], r["orphan"]) for r in rows] == [(active, False)]
        assert len(twin.running()) == 1
        [ref] = twin.running()
        time.sleep(2)
        stopped = cli(root, "stop", "--json")
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        assert twin.running() == []
        assert_spend_recorded(root, twin, ref, measured=provider != "lambda")


def assert_spend_recorded(root: Path, twin: Any, ref: str, *, measured: bool) -> None:
    """The released session's recorded spend is the provider's figure within a cent, and the
    budget counts it (measured where the provider's own figures gave it)."""
    from jupyter_portable import Workspace

    billed = twin.rentals[ref].billed()
    ws = Workspace.find(root)
    head, _ = ws.store.read_head(ws.workspace_id)
    [record] = [a for a in ws.store.read_manifest(ws.workspace_id, head.version).allocations if a.get("ref") == ref]
    assert record["state"] == "released" and record["spend"] > 0
    # a bill is the provider's own figure: within a cent. An estimate is the price times the
    # time we held the machine, from our launch answer to our delete answer, where the provider
    # counts from its create to its delete: each end may lag by a request's time on a loaded
    # machine, a minute at most at the machine's price
    rental = twin.rentals[ref]
    slack = 0.01 if record["spend_source"] == "bill" else 0.01 + rental.offer.price * 60 / 3600
    assert abs(record["spend"] - billed) < slack, (record["spend"], billed, record.get("started"),
                                                   record.get("stopped"), rental.created_at, rental.deleted_at)
    # RunPod's is its bill (billing records), read after the delete; Lambda's an estimate
    assert record["spend_source"] == ("bill" if twin.provider == "runpod" else "estimate"), record
    spend = json.loads(cli(root, "spend", "--json").stdout)
    assert spend["spent"] >= record["spend"] - 1e-3  # the report rounds to 4 places
    assert (spend["measured"] if measured else spend["estimated"]) >= record["spend"] - 1e-3, spend
    assert spend["by_source"][record["spend_source"]] >= record["spend"] - 1e-3, spend


# -- a lost launch answer is looked up, not relaunched --------------------------------------------

@pytest.mark.parametrize("provider", HTTP)
def test_a_launch_whose_answer_was_lost_is_found_by_its_name(provider: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.compute.registry import make_provider
    from jupyter_portable.core.offers import Requirements

    with cloud(provider, tmp_path, monkeypatch, lose_answers=1) as (twin, _root):
        p = make_provider(provider)
        offer = p.offers(Requirements())[0]
        key = (tmp_path / "k.pub")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
        allocation = p.launch(offer, allocation_id="al-lost0000001", ssh_public_key=key.read_text(),
                              env={"JUPYTER_PORTABLE_WORKSPACE_ID": "ws-leaktest"})
        launches = [r for r in twin.requests if r["op"] in twin.launch_ops]
        assert len(launches) == 1 and launches[0].get("lost") is True  # sent once, its answer dropped
        assert twin.running() == [allocation.ref]
        [found] = p.list_machines()
        assert (found.ref, found.allocation_id, found.workspace_id) == (allocation.ref, "al-lost0000001",
                                                                          "ws-leaktest")
        p.terminate(allocation)
        assert twin.running() == []


def test_a_continue_killed_before_the_launch_answered_is_cleaned_up_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write-ahead record names the allocation, the provider has the machine, this copy never
    learnt its id: the next Continue's resume finds it by its name and terminates it."""
    from jupyter_portable import Workspace
    from jupyter_portable.compute.runpod import RunPodProvider
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.core.times import now_iso
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.workdir import lifecycle_file

    with cloud("runpod", tmp_path, monkeypatch) as (twin, root):
        ws = Workspace.find(root)
        epoch = ws.store.claim_epoch(ws.workspace_id)
        lifecycle_file.update(ws.copy, lambda cur: L.transition(cur, L.ROUTING, at=now_iso()))
        lifecycle_file.update(ws.copy, lambda cur: L.transition(cur, L.ACQUIRING, at=now_iso(), route="r-1",
                                                                allocation_id="al-unanswered1", epoch=epoch))
        provider = RunPodProvider()
        provider.launch(provider.offers()[0], allocation_id="al-unanswered1",
                        env={"JUPYTER_PORTABLE_WORKSPACE_ID": ws.workspace_id})
        assert len(twin.running()) == 1
        summary = Orchestrator(ws, providers={"runpod": provider}).resume()
        assert summary["state"] == L.ROUTING and twin.running() == []
