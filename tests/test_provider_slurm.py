"""The ``slurm`` provider against a real one-node Slurm cluster (tests/slurm_cluster.py), reached as a
user reaches one: the Slurm commands on a login node over SSH (a real sshd on loopback whose sessions
see the cluster). The node is this machine, so the compute node's sshd is the login node's too."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, running_cluster
from slurm_cluster import unavailable as slurm_unavailable
from sshd import Sshd, start_sshd
from sshd import unavailable as sshd_unavailable

from jupyter_portable.compute.base import WORKSPACE_ENV, Allocation, parse_machine_name
from jupyter_portable.compute.slurm import (
    SlurmProvider,
    check_job,
    loss_reason,
    parse_sinfo,
    parse_test_only,
    parse_time_limit,
)
from jupyter_portable.core.errors import NotSupported, ProviderUnavailable, UsageError

pytest_plugins = ["pytest_jupyter.jupyter_server"]  # the walltime's end, end to end, through a real server

_NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)  # history is read as of a time the test gives

# -- what the provider reads, checked without a cluster ----------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("2:00:00", 7200), ("1-00:00:00", 86400), ("1-2", 93600),
                                               ("30:00", 1800), ("5", 300), ("infinite", None), ("UNLIMITED", None)])
def test_slurm_times_are_read_as_slurm_writes_them(text: str, seconds: int | None) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "2h", "-1", "1:2:3:4", "soon"])
def test_a_time_that_is_not_slurms_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_time_limit(text)


def test_sinfo_lines_become_partitions_and_down_nodes_do_not_count() -> None:
    parts = parse_sinfo("gpu|up|2:00:00|idle|gpu:a100:4(S:0-1)|n1\ngpu|up|2:00:00|down*|gpu:a100:8|n2\n"
                        "cpu|up|infinite|idle|(null)|n3\nold|down|1:00:00|idle|gpu:2|n4\n")
    by = {p.name: p for p in parts}
    assert by["gpu"].gpus == {"a100": 4} and by["gpu"].usable_nodes == 1 and by["gpu"].nodes == 2
    assert by["cpu"].gpus == {} and by["cpu"].time_limit_s is None
    assert by["old"].up is False and by["old"].gpus == {"gpu": 2}


@pytest.mark.parametrize("text", ["gpu|up|2:00:00|idle|gpu:a100:4", "gpu|up|two hours|idle|gpu:1|n1",
                                  "gpu|up|1:00|idle|gpu:a100:many|n1", "<html>|||||"])
def test_sinfo_output_that_is_not_sinfos_is_refused_with_the_command_named(text: str) -> None:
    with pytest.raises(ProviderUnavailable, match="sinfo"):
        parse_sinfo(text)


def test_the_queue_wait_is_slurms_expected_start_by_the_clusters_own_clock() -> None:
    text = "sbatch: Job 3 to start at 2026-12-06T17:41:20 using 1 processors on nodes n1 in partition batch"
    assert parse_test_only(text, "now 2026-12-06T15:41:20") == 7200
    assert parse_test_only(text, "now 2026-12-06T18:00:00") == 0  # started already: no wait
    for bad_text, now in [("sbatch: error: Batch job submission failed", "now 2026-12-06T15:41:20"),
                          (text, "Sun Dec  6 15:41:20 UTC 2026")]:
        with pytest.raises(ValueError):
            parse_test_only(bad_text, now)


@pytest.mark.parametrize(("job", "words"), [
    ({"job_state": "TIMEOUT"}, "time limit reached"),
    ({"job_state": "PREEMPTED"}, "preempted by partition urgent"),
    ({"job_state": "NODE_FAIL"}, "node failure"),
    ({"job_state": "CANCELLED"}, "cancelled outside jupyter-portable (by an admin, or scancel)"),
    ({"job_state": "PENDING", "restart_cnt": 1}, "requeued by Slurm (restart 1): the job went back to the queue"),
    ({"job_state": "RUNNING"}, None), ({"job_state": "PENDING", "restart_cnt": 0}, None),
    # COMPLETING: Slurm says a job that ran has ended, seconds before its final state
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 400, "time_limit": 5, "requeue": False},
     "time limit reached"),
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 130, "time_limit": 5, "requeue": False},
     "the job ended (Slurm is completing it)"),
    # an end moved earlier (scontrol update EndTime): short of the limit, but Slurm's reason is its time limit
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 157, "time_limit": 2, "requeue": False,
      "state_reason": "TimeLimit"}, "time limit reached"),
    # ... but a preemption, a requeue or a job that may come back waits for its own state and words
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 130, "preempt_time": 130, "requeue": False}, None),
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 130, "requeue": True}, None),
    ({"job_state": "COMPLETING", "start_time": 100, "end_time": 130, "requeue": False, "restart_cnt": 1}, None),
    ({"job_state": "COMPLETING", "start_time": 0, "end_time": 130, "requeue": False}, None)])
def test_each_end_of_a_job_is_said_in_the_users_words(job: dict, words: str | None) -> None:
    assert loss_reason(job, preemptor="urgent") == words


def test_a_squeue_answer_that_is_not_squeues_is_refused() -> None:
    good = {"job_id": 7, "job_state": "RUNNING", "name": "x", "partition": "batch", "start_time": 1}
    assert check_job({"jobs": [good]}, "7")["job_state"] == "RUNNING"
    for bad in [{"jobs": "none"}, [], {"jobs": [{**good, "job_state": None}]},
                {"jobs": [{**good, "start_time": "noon"}]}]:
        with pytest.raises(ProviderUnavailable, match="squeue"):
            check_job(bad, "7")


def test_the_way_through_the_login_node_is_one_ssh_command_with_no_token_of_ours(tmp_path: Path) -> None:
    provider = SlurmProvider("login.hpc.example.edu", login_port=2222, login_user="alice",
                             key=tmp_path / "100%" / "id_ed25519", state_dir=tmp_path / "state")
    proxy = provider.through_login()
    assert proxy is not None and proxy.startswith("ssh -p 2222 -l alice -o BatchMode=yes")
    assert f"-i {tmp_path}/100%%/id_ed25519" in proxy  # ssh would expand a % of ours as a token
    assert proxy.endswith("-W %h:%p -- login.hpc.example.edu")


def test_a_provider_without_a_login_node_or_with_a_bad_rate_is_refused() -> None:
    with pytest.raises(UsageError, match="login node"):
        SlurmProvider("")
    with pytest.raises(UsageError, match="gpu_hour_rate"):
        SlurmProvider("login", gpu_hour_rate=-1)
    with pytest.raises(UsageError, match="workdir"):
        SlurmProvider("login", workdir="~/a;rm -rf ~")


def test_the_provider_is_built_from_its_settings_and_bad_ones_name_where_they_were_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.compute.config import PortableSlurm, provider_kwargs
    from jupyter_portable.compute.registry import make_provider

    monkeypatch.setenv("JUPYTER_PORTABLE_SLURM_LOGIN", "login.hpc.example.edu")
    monkeypatch.setenv("JUPYTER_PORTABLE_SLURM_GPU_HOUR_RATE", "0.5")
    kw = provider_kwargs("slurm")
    assert (kw["login_host"], kw["gpu_hour_rate"], kw["time_limit_s"], kw["login_port"]) == (
        "login.hpc.example.edu", 0.5, 0, 22)
    provider = make_provider("slurm", **kw)
    assert isinstance(provider, SlurmProvider) and provider.time_limit_s is None and provider.gpu_hour_rate == 0.5
    monkeypatch.setenv("JUPYTER_PORTABLE_SLURM_GPU_HOUR_RATE", "-1")
    with pytest.raises(UsageError, match="JUPYTER_PORTABLE_SLURM_GPU_HOUR_RATE"):
        PortableSlurm()


# -- a real cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = slurm_unavailable() or sshd_unavailable()
    if reason:
        pytest.skip(reason)
    with running_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture(scope="session")
def login(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """The login node: a real sshd whose sessions reach the cluster (SLURM_CONF, as a site's profile sets it)."""
    from fakegpu import install_fake_nvidia_smi

    # the node's GPUs as its driver shows them (the node is this machine: one sshd serves login and node)
    bin_dir = tmp_path_factory.mktemp("node-bin")
    install_fake_nvidia_smi(bin_dir, [{"name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920}] * 2, "550.54.15", "12.4")
    sshd = start_sshd(tmp_path_factory.mktemp("login"), env=cluster.env, path_prefix=[bin_dir])
    yield sshd
    sshd.stop()


@pytest.fixture(scope="session")
def node_home(login: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's home folder for the end-to-end tests (c.PortableRemote.workdir), shared as a
    cluster's shared filesystem is: the worker's venv the first job's bootstrap built is there for the next."""
    return tmp_path_factory.mktemp("node-home")


@pytest.fixture
def make_provider(cluster: SlurmCluster, login: Sshd, tmp_path: Path) -> Iterator[Callable[..., SlurmProvider]]:
    def make(**kw: object) -> SlurmProvider:
        return SlurmProvider("127.0.0.1", login_port=login.port, login_user=login.user, key=login.client_key,
                             node_ssh_port=login.port, workdir=str(tmp_path / "cluster-home"),
                             state_dir=tmp_path / "state", **kw)  # type: ignore[arg-type]

    yield make
    cluster.run("scancel", "-u", "root", check=False)  # nothing of one test is left to the next
    _until(lambda: not cluster.run("squeue", "-h", "-t", "PD,R,CG", check=False).stdout.strip(), "the queue empties")


def _until(predicate: Callable[[], object], what: str, tries: int = 240, pause: float = 0.5) -> object:
    """Wait for a condition by polling (the test reads no clock): its first true value."""
    for _ in range(tries):
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"never happened: {what}")


def _offer(provider: SlurmProvider, offer_id: str):  # type: ignore[no-untyped-def]
    return {o.id: o for o in provider.offers()}[offer_id]


def _job(cluster: SlurmCluster, job_id: str) -> dict:
    """The job as the admin sees it (``squeue --json`` of Slurm 22.05 lists every job, whatever -j says)."""
    return check_job(json.loads(cluster.run("squeue", "--json", "-t", "all").stdout), job_id)


def _blocker(cluster: SlurmCluster, minutes: int = 10) -> str:
    """Another user's job holding both GPUs of the batch partition."""
    out = cluster.run("sbatch", "--parsable", "-p", "batch", "--gres=gpu:a100:2", f"--time={minutes}",
                      "-o", "/dev/null", "--wrap=sleep 3000").stdout.strip()
    _until(lambda: "RUNNING" in cluster.run("squeue", "-h", "-j", out, "-o", "%T").stdout, "the blocker runs")
    return out


def test_offers_are_the_clusters_partitions_free_and_ready_now(make_provider: Callable[..., SlurmProvider]) -> None:
    offers = {o.id: o for o in make_provider().offers()}
    assert set(offers) == {"batch.a100x1", "batch.a100x2", "urgent.a100x1", "urgent.a100x2"}
    two = offers["batch.a100x2"]
    assert (two.gpu, two.gpu_count, two.gpu_memory_gb, two.price_per_hour, two.region) == ("A100", 2, 80.0, 0.0,
                                                                                            "batch")
    assert two.extra["queue_s"] == 0 and two.extra["time_limit_s"] == 7200 and two.capacity is None
    rated = {o.id: o for o in make_provider(gpu_hour_rate=0.5, partitions=["urgent"]).offers()}
    assert set(rated) == {"urgent.a100x1", "urgent.a100x2"}
    assert rated["urgent.a100x2"].price_per_hour == 1.0


def test_routes_put_the_clusters_queue_wait_beside_another_providers_gpu_now(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import write_tree

    from jupyter_portable import Workspace
    from jupyter_portable.demo.market import LocalMarket
    from jupyter_portable.orchestration.routes import compute_routes

    _blocker(cluster, minutes=120)
    slurm = make_provider()
    offers = {o.id: o for o in slurm.offers()}
    # Slurm's forecast: the batch GPUs free when the blocker's two hours end; urgent preempts, so now
    assert 7100 <= offers["batch.a100x1"].extra["queue_s"] <= 7200
    assert offers["urgent.a100x1"].extra["queue_s"] <= 5

    catalog = tmp_path / "catalog.toml"
    catalog.write_text('version = 1\n[store]\nregion = "near"\negress_per_gb = 0.09\n'
                       '[[offer]]\nid = "cloud-a100"\ngpu = "NVIDIA A100"\ngpu_count = 1\ngpu_memory_gb = 80\n'
                       'price_per_hour = 2.0\nregion = "near"\ncapacity = 1\nboot_seconds = 60\ndriver = "550.54.15"\n'
                       'cuda = "12.4"\nlaunch_failure_rate = 0.0\nreliability = 1.0\nbandwidth_mbps = 10000\n')
    root = tmp_path / "w"
    write_tree(root, {"a.txt": "a"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    ws.snapshot(progress=None)
    routes, errors = compute_routes(ws, hours=1.0, providers={
        "slurm": slurm, "local": LocalMarket(catalog, tmp_path / "market")})
    assert errors == {}
    by = {r.offer.key: r for r in routes}
    assert {"slurm/batch.a100x1", "slurm/urgent.a100x1", "local/cloud-a100"} <= set(by)
    queued, now, cloud = by["slurm/batch.a100x1"], by["slurm/urgent.a100x1"], by["local/cloud-a100"]
    assert 7100 <= queued.queue_s <= 7200 and now.queue_s <= 5 and cloud.queue_s == 0
    assert queued.cost.gpu == 0 and cloud.cost.gpu == 2.0
    assert queued.words["queue"].startswith("Queue: about") and cloud.words["queue"].startswith("Queue: no wait")
    assert queued.predicted()["time_to_ready_s"] >= 7100 + offers["batch.a100x1"].boot_seconds

    # ranked in the same whole-route terms: the 2 h wait priced at what the researcher's time is worth
    from jupyter_portable.core.routing import rank_routes
    from jupyter_portable.orchestration.routes import signals_from_history, with_forecast_waits, workspace_facts

    batch_and_cloud = [offers["batch.a100x1"], cloud.offer]
    signals = with_forecast_waits(signals_from_history(ws, now=_NOW), batch_and_cloud)

    def first(value_of_time: float) -> str:
        ranked = rank_routes(workspace_facts(ws, {"slurm": slurm}), batch_and_cloud, hours=1.0, signals=signals,
                             value_of_time_per_hour=value_of_time)
        return ranked[0].offer.key

    assert first(0.5) == "slurm/batch.a100x1"  # waiting 2 h is worth $1: the free GPU later
    assert first(5.0) == "local/cloud-a100"  # waiting 2 h is worth $10: the $2 GPU now


def test_a_launch_is_a_batch_job_that_runs_on_the_node_and_is_reached_over_ssh(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster, login: Sshd, tmp_path: Path) -> None:
    provider = make_provider()
    offer = _offer(provider, "batch.a100x1")
    with pytest.raises(NotSupported):
        provider.launch(offer, allocation_id="a-img", image="ubuntu:24.04")
    alloc = provider.launch(offer, allocation_id="a-1", env={WORKSPACE_ENV: "ws-1"})
    st = _until(lambda: (s := provider.status(alloc)).state == "running" and s, "the job runs")
    assert st.ssh is not None and (st.ssh.host, st.ssh.port) == ("127.0.0.1", login.port)  # type: ignore[union-attr]
    # the node is reached through the login node (ProxyJump), held to the login node's pinned key; its
    # own host key, read through it, is the one its sshd presents
    from jupyter_portable.compute.keys import scan_host_key

    proxy = st.ssh.proxy  # type: ignore[union-attr]
    assert proxy == provider.through_login() and proxy.endswith("-W %h:%p -- 127.0.0.1")
    assert "StrictHostKeyChecking=yes" in proxy and f"-p {login.port}" in proxy
    assert scan_host_key("127.0.0.1", login.port, proxy=proxy) == scan_host_key("127.0.0.1", login.port) is not None
    assert make_provider(proxy_jump=False).through_login() is None
    job = _job(cluster, alloc.ref)
    assert alloc.details["ends_at"] == datetime.fromtimestamp(job["end_time"], timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ") and job["end_time"] - job["start_time"] == 7200  # the partition's time limit
    assert parse_machine_name(job["name"]) == ("a-1", "ws-1")
    assert job["requeue"] is False and job["tres_per_node"] == "gres:gpu:a100:1"
    folder = tmp_path / "cluster-home" / "allocations" / "a-1"
    _until(lambda: (folder / "heartbeat").exists(), "the job beats on the node")
    assert (folder / "job").read_text().strip() == alloc.ref
    assert [m.allocation_id for m in provider.list_machines()] == ["a-1"]
    provider.terminate(alloc)
    assert _until(lambda: (s := provider.status(alloc)).state == "terminated" and s, "terminated")
    provider.terminate(alloc)  # gone already is fine


def test_a_rated_cluster_counts_gpu_hours_at_its_rate_and_a_free_one_counts_none(
        make_provider: Callable[..., SlurmProvider]) -> None:
    rated = make_provider(gpu_hour_rate=3600.0)  # $1 a GPU-second, so a few seconds show
    alloc = rated.launch(_offer(rated, "batch.a100x2"), allocation_id="a-rate")
    assert alloc.details["price_per_hour"] == 7200.0
    st = _until(lambda: (s := rated.status(alloc)).spend and s.spend >= 2 and s, "two GPUs bill a second")
    assert st.spend_source == "provider-rate"  # type: ignore[union-attr]
    free = make_provider()
    other = free.launch(_offer(free, "urgent.a100x1"), allocation_id="a-free")
    _until(lambda: free.status(other).state == "running", "the job runs")
    assert free.status(other).spend == 0.0


def test_a_job_preempted_by_the_urgent_partition_is_lost_with_that_reason(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster) -> None:
    provider = make_provider()
    alloc = provider.launch(_offer(provider, "batch.a100x2"), allocation_id="a-pre")
    _until(lambda: provider.status(alloc).state == "running", "the job runs")
    urgent = cluster.run("sbatch", "--parsable", "-p", "urgent", "--gres=gpu:a100:1", "--time=5", "-o", "/dev/null",
                         "--wrap=sleep 300").stdout.strip()
    st = _until(lambda: (s := provider.status(alloc)).state == "lost" and s, "the job is preempted")
    assert st.reason == f"job {alloc.ref}: preempted by partition urgent"  # type: ignore[union-attr]
    assert "RUNNING" in cluster.run("squeue", "-h", "-j", urgent, "-o", "%T").stdout


def test_a_job_cancelled_by_an_admin_is_lost_not_terminated(make_provider: Callable[..., SlurmProvider],
                                                           cluster: SlurmCluster) -> None:
    provider = make_provider()
    alloc = provider.launch(_offer(provider, "batch.a100x1"), allocation_id="a-adm")
    _until(lambda: provider.status(alloc).state == "running", "the job runs")
    cluster.run("scancel", alloc.ref)
    st = _until(lambda: (s := provider.status(alloc)).state == "lost" and s, "the job is cancelled")
    assert "cancelled outside jupyter-portable" in st.reason  # type: ignore[union-attr]


def test_our_jobs_cannot_be_requeued_and_a_requeued_job_is_lost_as_requeued(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster) -> None:
    """A job of ours runs --no-requeue: the work must not start again unseen under the same allocation.
    A job that Slurm did put back in the queue (one submitted requeueable) is a loss, said so."""
    provider = make_provider()
    alloc = provider.launch(_offer(provider, "batch.a100x1"), allocation_id="a-rq")
    _until(lambda: provider.status(alloc).state == "running", "the job runs")
    refused = cluster.run("scontrol", "requeue", alloc.ref, check=False)
    assert refused.returncode != 0 and "disabled" in refused.stderr
    other = cluster.run("sbatch", "--parsable", "--requeue", "-p", "batch", "--gres=gpu:a100:1", "--time=5",
                        "-o", "/dev/null", "--wrap=sleep 300").stdout.strip()
    _until(lambda: _job(cluster, other)["job_state"] == "RUNNING", "the requeueable job runs")
    cluster.run("scontrol", "requeue", other)
    theirs = Allocation("a-other", "slurm", "batch.a100x1", other, "2026-01-01T00:00:00Z")
    st = _until(lambda: (s := provider.status(theirs)).state == "lost" and s, "the requeue is seen")
    assert st.reason == f"job {other}: requeued by Slurm (restart 1): the job went back to the queue"  # type: ignore


def test_a_job_that_waits_in_the_queue_is_pending_with_slurms_reason(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster) -> None:
    _blocker(cluster)
    provider = make_provider()
    alloc = provider.launch(_offer(provider, "batch.a100x1"), allocation_id="a-wait")
    st = _until(lambda: (s := provider.status(alloc)).state == "pending" and s, "the job is queued")
    assert st.reason is not None and st.reason.startswith("queued in batch")  # type: ignore[union-attr]
    assert st.spend == 0.0  # type: ignore[union-attr]


def test_a_job_asks_for_its_walltime_and_is_warned_at_most_half_of_it_before(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster) -> None:
    provider = make_provider(time_limit_s=60, signal_lead_s=40)
    offer = _offer(provider, "batch.a100x1")
    assert offer.extra["time_limit_s"] == 60
    alloc = provider.launch(offer, allocation_id="a-wall")
    assert alloc.details["walltime_s"] == 60 and alloc.details["signal_lead_s"] == 30  # at most half the walltime
    job = _job(cluster, alloc.ref)
    assert job["time_limit"] == 1
    st = _until(lambda: (s := provider.status(alloc)).state == "running" and s, "the job runs")
    assert st.ends_at == datetime.fromtimestamp(_job(cluster, alloc.ref)["end_time"], timezone.utc).strftime(  # type: ignore
        "%Y-%m-%dT%H:%M:%SZ")


def test_the_next_job_queues_behind_this_one_and_a_launch_for_the_workspace_takes_it_up(
        make_provider: Callable[..., SlurmProvider], cluster: SlurmCluster, tmp_path: Path) -> None:
    """c.PortableSlurm.queue_next: the successor waits on this job (afterany) while it runs, starts when
    it ends, whatever ended it, and the next launch of the same shape for the workspace is that job."""
    assert make_provider().queue_next(Allocation("a-x", "slurm", "batch.a100x1", "1", "")) is None  # off
    provider = make_provider(queue_next_job=True)
    offer = _offer(provider, "batch.a100x1")
    first = provider.launch(offer, allocation_id="a-first", env={WORKSPACE_ENV: "ws-q"})
    _until(lambda: provider.status(first).state == "running", "the first job runs")
    nxt = provider.queue_next(first)
    assert nxt is not None and nxt != first.ref
    job = _job(cluster, nxt)
    assert job["job_state"] == "PENDING" and job["state_reason"] == "Dependency", job
    assert parse_machine_name(job["name"]) == ("next-a-first", "ws-q") and job["requeue"] is False
    assert job["tres_per_node"] == "gres:gpu:a100:1"
    # a launch for another workspace, or of another shape, is a job of its own
    other = provider.launch(offer, allocation_id="a-other", env={WORKSPACE_ENV: "ws-other"})
    assert other.ref not in (first.ref, nxt)
    provider.terminate(other)
    # the take-over's offer, from the first allocation's record alone: that shape, no wait, not asked again
    queued = provider.queued_offer(first, nxt)
    assert queued is not None and queued.key == offer.key and queued.gpu_count == 1
    assert {k: queued.extra[k] for k in ("partition", "gres", "queue_s", "queued_ahead")} == {
        "partition": "batch", "gres": "gpu:a100:1", "queue_s": 0.0, "queued_ahead": nxt}
    assert provider.check_capacity(queued) is None
    assert provider.queued_offer(first, "not-a-job") is None
    cluster.run("scancel", first.ref)  # ended by an admin here; a walltime's end is the end-to-end test's
    # lost at once, COMPLETING or CANCELLED: Slurm says the job ended
    assert provider.status(first).state == "lost"
    assert _until(lambda: _job(cluster, nxt)["job_state"] == "RUNNING", "the next job starts", tries=200)
    taken = provider.launch(queued, allocation_id="a-second", env={WORKSPACE_ENV: "ws-q"})
    assert taken.ref == nxt and taken.details["queued_ahead_as"] == "next-a-first"
    assert parse_machine_name(_job(cluster, nxt)["name"]) == ("a-second", "ws-q")
    assert provider.status(taken).state == "running"
    assert (tmp_path / "cluster-home" / "allocations" / "next-a-first" / "agent").resolve() == \
        tmp_path / "cluster-home" / "allocations" / "a-second" / "agent"
    assert [m.allocation_id for m in provider.list_machines() if m.state == "running"] == ["a-second"]


def test_malformed_answers_from_the_login_node_are_refused(make_provider: Callable[..., SlurmProvider],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    provider = make_provider()
    alloc = Allocation("a-x", "slurm", "batch.a100x1", "12", "2026-01-01T00:00:00Z")
    monkeypatch.setattr(provider, "_command", lambda script, what, **kw: (0, "Welcome to the cluster!\n", ""))
    with pytest.raises(ProviderUnavailable, match="sinfo"):
        provider.offers()
    with pytest.raises(ProviderUnavailable, match="squeue --json"):
        provider.status(alloc)
    monkeypatch.setattr(provider, "_command", lambda script, what, **kw: (0, "Submitted batch job 12\n", ""))
    with pytest.raises(ProviderUnavailable, match="sbatch --parsable"):
        provider.launch(_offer_of("batch.a100x1"), allocation_id="a-x")


def _offer_of(offer_id: str):  # type: ignore[no-untyped-def]
    from jupyter_portable.core.offers import Offer

    return Offer(provider="slurm", id=offer_id, gpu="A100", gpu_count=1, gpu_memory_gb=80, price_per_hour=0,
                 region="batch", extra={"partition": "batch", "gres": "gpu:a100:1", "time_limit_s": 600})


def test_the_slurm_provider_keeps_the_contract(make_provider: Callable[..., SlurmProvider]) -> None:
    from test_providers_contract import _lifecycle

    provider = make_provider()
    _lifecycle(provider, _offer(provider, "urgent.a100x1"))


def test_continue_puts_the_workspace_on_a_slurm_job_and_a_preemption_loses_it_with_its_reason(
        cluster: SlurmCluster, login: Sshd, node_home: Path, tmp_path: Path, wheelhouse: Path, cli: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole way, by the CLI: routes list the partitions, Continue submits the job, pins the node's
    host key, bootstraps the worker there from the store and reads the workspace back (READY, ACTIVE);
    a cell runs there; the urgent partition then takes the node, and the state says so in Slurm's words."""
    from jupyter_e2e import make_workspace

    root = tmp_path / "ws"
    make_workspace(root, tmp_path / "store")
    env = {"JUPYTER_PORTABLE_PROVIDERS": "slurm", "JUPYTER_PORTABLE_SLURM_LOGIN": "127.0.0.1",
           "JUPYTER_PORTABLE_SLURM_PORT": str(login.port), "JUPYTER_PORTABLE_SLURM_USER": login.user,
           "JUPYTER_PORTABLE_SLURM_NODE_SSH_PORT": str(login.port), "JUPYTER_PORTABLE_SSH_KEY": str(login.client_key),
           "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh"),
           "JUPYTER_PORTABLE_REMOTE_WORKDIR": str(node_home),
           "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0", "JUPYTER_PORTABLE_ENVIRONMENT": "image",
           "JUPYTER_PORTABLE_WHEEL_FIND_LINKS": str(wheelhouse), "JUPYTER_PORTABLE_NO_INDEX": "1"}
    try:
        routes = cli.json("routes", cwd=root, extra_env=env, timeout=120)
        keys = [f"{r['provider']}/{r['offer']}" for r in routes["routes"]]
        assert "slurm/batch.a100x2" in keys and "slurm/urgent.a100x1" in keys, keys
        out = cli.json("continue", "--route", next(r["id"] for r in routes["routes"]
                                                   if r["offer"] == "batch.a100x2"),
                       cwd=root, extra_env=env, timeout=300)
        assert out["state"] == "ACTIVE" and out["provider"] == "slurm", out
        state = cli.json("state", cwd=root, extra_env=env)
        assert state["machine"]["ssh"]["port"] == login.port and state["machine"]["host_key_source"] == "first use"
        job = _job(cluster, state["machine"]["ref"])  # the countdown's end, as the CLI says it: the job's walltime
        assert state["machine"]["ends_at"] == datetime.fromtimestamp(job["end_time"], timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ") and state["machine"]["next"] is None  # nothing queued ahead: the setting is off
        # a cell runs on the job's node, in a kernel the worker there starts, on the files read back
        from test_env_any_python import run_cell

        from jupyter_portable import Workspace
        from jupyter_portable.compute.config import provider_kwargs
        from jupyter_portable.compute.registry import make_provider
        from jupyter_portable.worker.client import AgentClient, load_record

        for name, value in env.items():
            monkeypatch.setenv(name, value)
        rec = load_record(Workspace.find(root).copy, out["allocation_id"])
        assert rec is not None
        client = AgentClient(rec, make_provider("slurm", **provider_kwargs("slurm")))
        try:
            assert run_cell(client, "print(open('data/small.csv').read().split()[1], 6 * 7)") == ["1,2", "42"]
        finally:
            client.close()
        cluster.run("sbatch", "-p", "urgent", "--gres=gpu:a100:1", "--time=5", "-o", "/dev/null", "--wrap=sleep 300")
        lost = _until(lambda: (s := cli.json("state", "--events", cwd=root, extra_env=env))["state"] == "LOST" and s,
                      "the preemption is seen", tries=120)
        [event] = [e for e in lost["events"] if e["state"] == "LOST"]  # type: ignore[index]
        assert event["reason"].endswith("preempted by partition urgent"), event
        # Continue puts the work on the next route: a new job, the same files read back
        again = cli.json("continue", cwd=root, extra_env=env, timeout=300)
        assert again["state"] == "ACTIVE" and again["provider"] == "slurm", again
        assert again["allocation_id"] != out["allocation_id"]
        rec = load_record(Workspace.find(root).copy, again["allocation_id"])
        assert rec is not None and rec.allocation.ref != out.get("ref")
        client = AgentClient(rec, make_provider("slurm", **provider_kwargs("slurm")))
        try:
            assert run_cell(client, "print(open('train.py').read())") == ["print('training')"]
        finally:
            client.shutdown()
            client.close()
    finally:
        cluster.run("scancel", "-u", "root", check=False)
        # the worker was started over SSH, outside the job (no pam_slurm_adopt here): it does not end with it
        from conftest import kill_worker_group

        for agent_json in node_home.glob("allocations/*/agent/agent.json"):
            kill_worker_group(agent_json)


# -- the walltime's end, end to end: a real server, a real kernel, the job queued ahead ---------------


def _node_env(login: Sshd, node_home: Path, tmp_path: Path) -> dict[str, str]:
    return {"JUPYTER_PORTABLE_PROVIDERS": "slurm", "JUPYTER_PORTABLE_SLURM_LOGIN": "127.0.0.1",
            "JUPYTER_PORTABLE_SLURM_PORT": str(login.port), "JUPYTER_PORTABLE_SLURM_USER": login.user,
            "JUPYTER_PORTABLE_SLURM_NODE_SSH_PORT": str(login.port), "JUPYTER_PORTABLE_SSH_KEY": str(login.client_key),
            "JUPYTER_PORTABLE_SSH_STATE": str(tmp_path / "ssh"),
            "JUPYTER_PORTABLE_REMOTE_WORKDIR": str(node_home),
            "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0", "JUPYTER_PORTABLE_ENVIRONMENT": "image"}


@pytest.fixture
def queue_next_server(cluster: SlurmCluster, login: Sshd, node_home: Path, tmp_path: Path, wheelhouse: Path,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A server's environment: the cluster as its one provider, with the next job queued ahead; the
    session opened rents the first job. Every job and worker is gone after the test."""
    for name, value in {**_node_env(login, node_home, tmp_path), "JUPYTER_PORTABLE_SLURM_QUEUE_NEXT": "1",
                        "JUPYTER_PORTABLE_FIRST_MACHINE": "open"}.items():
        monkeypatch.setenv(name, value)
    yield tmp_path
    cluster.run("scancel", "-u", "root", check=False)
    from conftest import kill_worker_group

    for agent_json in node_home.glob("allocations/*/agent/agent.json"):
        kill_worker_group(agent_json)


@pytest.fixture
def jp_root_dir(tmp_path: Path, queue_next_server: Path) -> Path:
    from jupyter_e2e import make_workspace

    root = tmp_path / "workspace"
    make_workspace(root, tmp_path / "store")
    return root


@pytest.mark.timeout(360)
async def test_a_notebook_whose_job_hits_its_walltime_goes_on_by_itself_on_the_job_queued_ahead(
        jp_serverapp: Any, jp_fetch: Any, jp_ws_fetch: Any, jp_root_dir: Path, cluster: SlurmCluster) -> None:
    """c.PortableSlurm.queue_next on: the next job queues behind the notebook's; the state counts down to
    the job's end; at Slurm's warning the worker publishes a version and reads it back; at the walltime
    (TIMEOUT) the workspace is lost with that reason and Continue happens by itself onto the queued job:
    the same kernel id runs its next cell there, on the same files and the last checkpoint."""
    from jupyter_e2e import EventStream, KernelSocket, is_state, start_session

    from jupyter_portable import Workspace
    from jupyter_portable.worker.client import load_allocation
    from jupyter_portable.worker.warning import MESSAGE

    async def state() -> dict[str, Any]:
        return json.loads((await jp_fetch("portable", "api", "state")).body)  # type: ignore[no-any-return]

    events = EventStream(await jp_ws_fetch("api", "events", "subscribe"))
    kernel_id = await start_session(jp_fetch)
    await events.wait_for(is_state("ACTIVE"), timeout=180)
    first = (await state())["allocation"]
    kernel = KernelSocket(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("open('results.txt', 'w').write('loss 0.125\\n'); open('step.txt', 'w').write('7')")
    assert status == "ok", out
    status, out = await kernel.run("%workspace checkpoint step.txt --step 7 --settle 0.2 --wait")
    assert status == "ok" and "verified" in out, out
    cps = json.loads((await jp_fetch("portable", "api", "checkpoints")).body)
    recorded = cps["latest"]["hash"]
    status, out = await kernel.run("open('progress.txt', 'w').write('epoch 8')")  # only the warning publishes it
    assert status == "ok", out

    # the next job is queued behind this one, and the state says when this one ends
    queued = await events.wait_for(lambda e: e.get("kind") == "walltime" and "queued" in e["message"], timeout=60)
    seen = (await state())["allocation"]
    job = seen.get("next_job")
    assert job and job in queued["message"] and seen["ends_at"], seen
    ws = Workspace.find(jp_root_dir)
    held = load_allocation(ws.copy, first["allocation_id"])
    assert held is not None
    ref = held.ref
    pending = _job(cluster, job)
    assert pending["job_state"] == "PENDING" and pending["dependency"] == f"afterany:{ref}(unfulfilled)", pending

    # the admin moves the job's end: the countdown follows it
    cluster.run("scontrol", "update", f"JobId={ref}", "EndTime=now+600")
    end = datetime.fromtimestamp(_job(cluster, ref)["end_time"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for _ in range(60):
        if (await state())["allocation"].get("ends_at") == end:
            break
        await asyncio.sleep(0.5)
    assert (await state())["allocation"]["ends_at"] == end
    # Slurm's warning, as --signal=B:USR1@<lead> sends it to the job's shell (sent now rather than on
    # Slurm's own 30 s tick): the worker publishes what the kernel wrote since, and reads it back
    cluster.run("scancel", "--batch", "--signal=USR1", ref)
    head, _ = ws.store.read_head(ws.workspace_id)
    for _ in range(120):
        head, _ = ws.store.read_head(ws.workspace_id)
        if ws.store.read_manifest(ws.workspace_id, head.version).message == MESSAGE:
            break
        await asyncio.sleep(0.5)
    assert ws.store.read_manifest(ws.workspace_id, head.version).message == MESSAGE
    assert "progress.txt" in {f.path for f in ws.store.read_manifest(ws.workspace_id, head.version).files}

    # the walltime: the job's end moved to now, Slurm ends it on its next tick (TIMEOUT)
    mark = len(events.seen)
    cluster.run("scontrol", "update", f"JobId={ref}", "EndTime=now")
    lost = await events.wait_for(is_state("LOST"), timeout=120, after=mark)
    assert lost["allocation_id"] == first["allocation_id"] and lost["reason"] == f"job {ref}: time limit reached"
    # no click: Continue by itself, onto the job queued ahead
    ready = await events.wait_for(is_state("READY"), timeout=180, after=mark)
    await events.wait_for(is_state("ACTIVE"), timeout=120, after=mark)
    # onto that job's one route: no ranking of every partition, its capacity not asked again
    said = [e["message"] for e in events.seen[mark:] if e.get("step") == "acquire"]
    assert any(m.startswith("taking over slurm/") for m in said) and "ranking routes" not in said, said
    now = await state()
    second = now["lifecycle"]["allocation_id"]
    assert second != first["allocation_id"] and now["allocation"]["provider"] == "slurm"
    taken = load_allocation(ws.copy, second)
    assert taken is not None and taken.ref == job
    assert ready["verified"] is True and ready["detail"]["checkpoints"]["step.txt"] == recorded
    assert [k["id"] for k in json.loads((await jp_fetch("api", "kernels")).body)] == [kernel_id]
    await kernel.follow_restart(lambda: jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    status, out = await kernel.run("import os; print(os.environ['JUPYTER_PORTABLE_ALLOCATION']);"
                                   "print(open('results.txt').read().strip()); print(open('progress.txt').read())",
                                   timeout=120)
    assert status == "ok", out
    assert out.split("\n")[:3] == [second, "loss 0.125", "epoch 8"], out


# -- a machine its guardian released: nothing queued ahead is left behind (issue 45's leftover) -------


def test_a_job_its_guardian_released_leaves_no_job_queued_ahead(
        cluster: SlurmCluster, login: Sshd, node_home: Path, tmp_path: Path, wheelhouse: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook's job runs with its successor queued ahead (afterany); its guardian sealed and
    recorded its release while the user side was away. The user side, back, takes the release in and
    cancels the job queued ahead as Stop does: no job of the workspace is left pending, none an orphan."""
    from jupyter_e2e import make_workspace

    from jupyter_portable.core import guardian as G
    from jupyter_portable.core import lifecycle as L
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.walltime import JobEnd, next_of

    for name, value in {**_node_env(login, node_home, tmp_path), "JUPYTER_PORTABLE_SLURM_QUEUE_NEXT": "1"}.items():
        monkeypatch.setenv(name, value)
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    orch = Orchestrator(ws)
    try:
        aid = orch.continue_()["allocation_id"]
        orch.check(now=_NOW)  # the job's end, read from Slurm and kept with the allocation
        notices: list[str] = []
        JobEnd(lambda _kind, message: notices.append(message)).look(orch, _NOW)  # the server's monitor does this
        rec = orch.record()
        assert rec is not None
        nxt = next_of(rec.allocation)
        assert nxt is not None and f"Job {nxt['ref']} is queued" in notices[0], notices
        assert _job(cluster, nxt["ref"])["dependency"] == f"afterany:{rec.allocation.ref}(unfulfilled)"
        # what the guardian does on a job (no provider means to end it: it says so): seal, record the release
        sealed = orch.client(aid).seal("sealed by the machine: 30 min idle while the user side was away")
        head = ws.store.read_manifest(ws.workspace_id, ws.store.read_head(ws.workspace_id)[0].version)
        record = next(a for a in reversed(head.allocations) if a["allocation_id"] == aid)
        policy = G.GuardianPolicy(provider="slurm", means=None, idle_minutes=30.0, absent_grace_s=600.0,
                                  price_per_hour=0.0)
        released = G.release_record(G.GuardianDecision(G.STOP, "idle", absent_since=_NOW, idle_since=_NOW), policy,
                                    at=_NOW, version=sealed["version"], error="no means to end the billing (None)")
        ws.record_allocation({**record, "released_by": released}, epoch=orch.lifecycle().epoch)
        assert orch.check(now=_NOW)["state"] == L.RELEASED
        # both jobs are gone, the one queued ahead too; a sweep of the cluster finds nothing of ours
        gone = ("CANCELLED", "COMPLETED", "COMPLETING")
        assert _until(lambda: _job(cluster, nxt["ref"])["job_state"] in gone, "the queued job is cancelled")
        assert _until(lambda: _job(cluster, rec.allocation.ref)["job_state"] in gone, "the job ends")
        provider = orch.provider_of(rec.allocation)
        assert [m.ref for m in provider.list_machines() if m.state in ("pending", "running")] == []
    finally:
        orch.close()
        cluster.run("scancel", "-u", "root", check=False)
        from conftest import kill_worker_group

        for agent_json in node_home.glob("allocations/*/agent/agent.json"):
            kill_worker_group(agent_json)
