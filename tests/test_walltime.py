"""A machine that ends by itself (a Slurm job's walltime), the server's side (orchestration/walltime.py):
the next machine queued once, the user asked in time when none is, and the take-over's route once the
machine is lost. The provider is a stand-in here; tests/test_provider_slurm.py runs it against a real
cluster and server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jupyter_portable.compute.base import Allocation
from jupyter_portable.core import lifecycle as L
from jupyter_portable.core.errors import LaunchFailed
from jupyter_portable.core.routing import route_id
from jupyter_portable.orchestration.walltime import ASK_AHEAD_S, END_WINDOW_S, JobEnd, ask_now, release_next
from jupyter_portable.worker.client import AgentRecord, load_allocation, save_allocation, save_record

ENDS = datetime(2026, 12, 6, 14, 0, tzinfo=timezone.utc)


class Cluster:
    """Queues the next job (or says it queues none, or fails), and records what it is asked."""

    name = "slurm"

    def __init__(self, answer: str | None | Exception) -> None:
        self.answer = answer
        self.queued: list[str] = []
        self.terminated: list[str] = []

    def queue_next(self, allocation: Allocation) -> str | None:
        self.queued.append(allocation.allocation_id)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def terminate(self, allocation: Allocation) -> None:
        self.terminated.append(allocation.ref)

    def queued_offer(self, allocation: Allocation, ref: str) -> Any:
        """The queued job's offer, from the allocation's record (Provider.queued_offer): asks nothing."""
        return SimpleNamespace(key=f"slurm/{allocation.offer_id}", queued_ahead=ref)


def _setup(tmp_path: Path, provider: Cluster, *, ends_at: str | None = "2026-12-06T14:00:00Z") -> Any:
    from conftest import write_tree

    from jupyter_portable import Workspace

    root = tmp_path / "w"
    write_tree(root, {"a.txt": "a"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    details = {"signal_lead_s": 300, **({"ends_at": ends_at} if ends_at else {})}
    allocation = Allocation("al-1", "slurm", "batch.a100x1", "17", "2026-12-06T12:00:00Z", details=details)
    save_record(ws.copy, AgentRecord(allocation, 1, 1, "token", "/work"))
    save_allocation(ws.copy, allocation)
    state = {"lc": SimpleNamespace(state=L.ACTIVE, allocation_id="al-1", events=[])}
    return SimpleNamespace(ws=ws, lifecycle=lambda: state["lc"], provider_of=lambda a: provider, state=state)


def _lose(orch: Any, reason: str) -> None:
    orch.state["lc"] = SimpleNamespace(state=L.LOST, allocation_id="al-1", events=[SimpleNamespace(reason=reason)])


def test_the_user_is_asked_once_ten_minutes_before_the_warning() -> None:
    assert not ask_now(ENDS, 300, ENDS - timedelta(seconds=300 + ASK_AHEAD_S + 1))
    assert ask_now(ENDS, 300, ENDS - timedelta(seconds=300 + ASK_AHEAD_S))


def test_without_a_queued_job_the_user_is_asked_in_time_and_nothing_takes_over(tmp_path: Path) -> None:
    cluster = Cluster(None)  # c.PortableSlurm.queue_next off
    orch = _setup(tmp_path, cluster)
    told: list[tuple[str, str]] = []
    watch = JobEnd(lambda kind, message: told.append((kind, message)))
    assert watch.look(orch, ENDS - timedelta(hours=1)) is None
    assert told == [] and cluster.queued == ["al-1"]
    for minutes in (14, 13):  # the notice comes once, however many looks follow
        assert watch.look(orch, ENDS - timedelta(minutes=minutes)) is None
    assert cluster.queued == ["al-1"]  # the provider is asked once
    [(kind, message)] = told
    assert kind == "walltime" and message.startswith("Job 17 ends in 14 min (2026-12-06T14:00:00Z")
    _lose(orch, "job 17: time limit reached")
    assert watch.look(orch, ENDS) is None  # lost like any machine: the user Continues


def test_a_queued_job_is_recorded_and_taken_over_onto_once_the_machine_is_lost(tmp_path: Path) -> None:
    cluster = Cluster("18")
    orch = _setup(tmp_path, cluster)
    told: list[tuple[str, str]] = []
    watch = JobEnd(lambda kind, message: told.append((kind, message)))
    assert watch.look(orch, ENDS - timedelta(hours=1)) is None
    allocation = load_allocation(orch.ws.copy, "al-1")
    assert allocation is not None and allocation.details["next"]["ref"] == "18"
    assert allocation.details["next"]["allocation_id"] == "next-al-1"
    assert [k for k, _ in told] == ["walltime"] and "Job 18 is queued to take over when job 17 ends" in told[0][1]
    assert watch.look(orch, ENDS - timedelta(minutes=5)) is None  # queued: nobody is asked
    assert cluster.queued == ["al-1"] and len(told) == 1
    # its known end has come: the loss check looks more often, for a while (the loss is still Slurm's word)
    assert not watch.due(ENDS - timedelta(seconds=1)) and watch.due(ENDS)
    window = timedelta(seconds=END_WINDOW_S)
    assert watch.due(ENDS + window) and not watch.due(ENDS + window + timedelta(seconds=1))
    _lose(orch, "job 17: time limit reached")
    route = watch.look(orch, ENDS)
    assert route == route_id(SimpleNamespace(key="slurm/batch.a100x1"))  # type: ignore[arg-type]
    assert "goes on by itself on job 18" in told[-1][1]
    # the Continue's target is that job: its offer, so that only its route is ranked (no listing)
    assert watch.offer_for(route) == SimpleNamespace(key="slurm/batch.a100x1", queued_ahead="18")
    assert watch.offer_for(route) is None  # taken once
    assert watch.look(orch, ENDS) is None  # once
    assert not watch.due(ENDS)  # lost: nothing to look for more often
    release_next(cluster, allocation)  # type: ignore[arg-type]  # Stop: the queued job is cancelled
    assert cluster.terminated == ["18"]


def test_a_next_job_the_cluster_refuses_is_said_and_the_user_is_asked_in_time(tmp_path: Path) -> None:
    orch = _setup(tmp_path, Cluster(LaunchFailed("slurm: sbatch refused the next job: QOSMaxSubmitJobPerUserLimit")))
    told: list[tuple[str, str]] = []
    watch = JobEnd(lambda kind, message: told.append((kind, message)))
    watch.look(orch, ENDS - timedelta(minutes=5))
    assert [k for k, _ in told] == ["walltime", "walltime"]
    assert "could not be queued" in told[0][1] and "QOSMaxSubmitJobPerUserLimit" in told[0][1]
    assert told[1][1].startswith("Job 17 ends in 5 min")


@pytest.mark.parametrize("ends_at", [None, "soon"])
def test_a_machine_that_does_not_end_by_itself_is_left_alone(tmp_path: Path, ends_at: str | None) -> None:
    cluster = Cluster("18")
    orch = _setup(tmp_path, cluster, ends_at=ends_at)
    told: list[Any] = []
    watch = JobEnd(lambda *a: told.append(a))
    assert watch.look(orch, ENDS) is None
    assert told == [] and cluster.queued == [] and not watch.due(ENDS)
