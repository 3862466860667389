"""Honest estimates (issue 16, item 6): each Continue's allocation record holds what its route
predicted and what was measured; recent measured boots replace the catalog's guess."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jupyter_portable.core.errors import ManifestError, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.records import check_allocation
from jupyter_portable.core.routing import (
    BOOT_SAMPLES,
    BOOT_WINDOW_S,
    BootSample,
    Signals,
    WorkspaceFacts,
    learn_boots,
    rank_routes,
)
from jupyter_portable.engine.workspace import Workspace

T0 = datetime(2026, 11, 3, 9, 0, tzinfo=timezone.utc)
OLD = {"allocation_id": "al-000000000001", "provider": "local", "offer": "a100", "gpu": "A100", "region": "local-a",
       "started": "2026-11-03T09:00:00Z", "stopped": "2026-11-03T10:00:00Z", "state": "released",
       "stop_reason": "stopped by the user", "spend": 1.5, "currency": "USD", "failures": []}
PREDICTED = {"time_to_ready_s": 35.0, "boot_s": 30.0, "catalog_boot_s": 30.0, "boot_basis": "catalog",
             "transfer_s": 5.0, "queue_s": 0.0, "bytes": 625_000_000, "cost": 3.0, "total": 3.1, "hours": 2.0}
MEASURED = {"time_to_ready_s": 41.0, "up_s": 12.0, "boot_s": 37.5, "transfer_s": 3.5, "environment_s": 1.0,
            "verify_s": 0.4, "spend": 1.5, "hours": 1.0, "cost": 3.0}


# -- the record ----------------------------------------------------------------------------------

def test_an_old_record_without_estimates_still_reads() -> None:
    assert check_allocation(dict(OLD)) == OLD


def test_a_record_with_predicted_and_measured_reads() -> None:
    record = {**OLD, "predicted": PREDICTED, "measured": MEASURED}
    assert check_allocation(record)["measured"]["time_to_ready_s"] == 41.0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("predicted", [35], "allocation predicted must be an object"),
    ("predicted", {**PREDICTED, "eta": 3}, "predicted has unknown field"),
    ("predicted", {**PREDICTED, "time_to_ready_s": -1}, "predicted.time_to_ready_s must be at least 0"),
    ("predicted", {**PREDICTED, "boot_s": "30"}, "predicted.boot_s must be a number"),
    ("predicted", {**PREDICTED, "boot_basis": "guess"}, "boot_basis must be one of"),
    ("measured", {**MEASURED, "boot_basis": "catalog"}, "measured has unknown field"),
    ("measured", {**MEASURED, "transfer_s": float("nan")}, "must be a finite number"),
    ("measured", {**MEASURED, "spend": True}, "measured.spend must be a number"),
])
def test_a_bad_estimate_is_refused_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        check_allocation({**OLD, field: value})


def test_a_bad_estimate_is_never_published(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    before = ws.store.read_head(ws.workspace_id)[0].version
    with pytest.raises(ManifestError):
        ws.record_allocation({**OLD, "measured": {"time_to_ready_s": -3}})
    assert ws.store.read_head(ws.workspace_id)[0].version == before


# -- the learning --------------------------------------------------------------------------------

def _offer(id: str, boot: float, provider: str = "local") -> Offer:
    return Offer(provider=provider, id=id, gpu="A100", gpu_count=1, gpu_memory_gb=80, price_per_hour=1.5,
                 region="local-a", capacity=1, boot_seconds=boot, bandwidth_mbps=800)


FACTS = WorkspaceFacts(bytes_to_move=100_000_000, store_region="local-a", store_provider=None,
                       store_egress_per_gb=0.0)


def test_an_offers_recent_measured_boots_replace_the_catalogs_guess() -> None:
    a = _offer("a100", boot=2)
    guessed = rank_routes(FACTS, [a], hours=1)[0]
    assert guessed.boot_s == 2 and guessed.boot_basis == "catalog"
    boots, excess = learn_boots([BootSample("local/a100", 9.0, 2.0, 60), BootSample("local/a100", 11.0, 2.0, 600),
                                 BootSample("local/a100", 10.0, 2.0, 30)])
    assert boots == {"local/a100": 10.0} and excess == {"local": 8.0}
    learnt = rank_routes(FACTS, [a], hours=1, signals=Signals(boot_seconds=boots, boot_excess=excess))[0]
    assert learnt.boot_s == 10.0 and learnt.boot_basis == "measured"
    assert learnt.time_to_ready_s == pytest.approx(10.0 + 1.0)  # + 100 MB at 800 Mbit/s
    assert "boot 10 s (measured recently)" in learnt.breakdown[-1]
    assert learnt.predicted()["boot_basis"] == "measured" and learnt.predicted()["catalog_boot_s"] == 2


def test_a_never_measured_offer_gets_its_providers_recent_excess() -> None:
    boots, excess = learn_boots([BootSample("local/a100", 9.0, 2.0, 60)])
    other, elsewhere = _offer("h100", boot=20), _offer("x", boot=20, provider="runpod")
    routes = {r.offer.key: r for r in rank_routes(FACTS, [other, elsewhere], hours=1,
                                                  signals=Signals(boot_seconds=boots, boot_excess=excess))}
    assert routes["local/h100"].boot_s == 27.0 and routes["local/h100"].boot_basis == "provider"
    assert routes["runpod/x"].boot_s == 20.0 and routes["runpod/x"].boot_basis == "catalog"


def test_only_recent_boots_count_and_only_the_newest_few() -> None:
    stale = BootSample("local/a100", 99.0, 2.0, BOOT_WINDOW_S)
    assert learn_boots([stale]) == ({}, {})
    newest = [BootSample("local/a100", 5.0, 2.0, float(i)) for i in range(BOOT_SAMPLES)]
    older = [BootSample("local/a100", 50.0, 2.0, 1000.0 + i) for i in range(BOOT_SAMPLES)]
    assert learn_boots(older + newest)[0] == {"local/a100": 5.0}, "the newest samples outvote the older"


def test_bad_boot_samples_and_signals_are_refused() -> None:
    with pytest.raises(UsageError, match="boot sample boot_s"):
        BootSample("local/a100", -1.0, 2.0, 0)
    with pytest.raises(UsageError, match="boot_seconds"):
        Signals(boot_seconds={"local/a100": -1.0})


def test_the_history_feeds_the_boots_as_of_the_time_passed_in(tmp_path: Path) -> None:
    from jupyter_portable.orchestration.routes import signals_from_history

    ws = _workspace(tmp_path)
    ws.record_allocation({**OLD, "predicted": PREDICTED, "measured": MEASURED})
    soon = signals_from_history(ws, now=T0 + timedelta(hours=2))
    assert soon.boot_seconds == {"local/a100": 37.5} and soon.boot_excess == {"local": 7.5}
    later = signals_from_history(ws, now=T0 + timedelta(hours=1) + timedelta(seconds=BOOT_WINDOW_S))
    assert later.boot_seconds == {} and later.boot_excess == {}


def _workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    ws = Workspace.init(root, f"file://{tmp_path / 'store'}")
    ws.snapshot("first", progress=None)
    return ws


# -- a real Continue on the local market ---------------------------------------------------------

CATALOG = """
version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "slow-boot"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "local-a"
capacity = 2
boot_seconds = 1.5
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 100
"""


@pytest.mark.timeout(300)
def test_a_continue_records_what_its_route_predicted_and_what_happened(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_e2e import make_workspace, portable_env, release_all

    from jupyter_portable.core.times import parse_iso
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.routes import history_records, signals_from_history
    from jupyter_portable.orchestration.state_view import StateView, head_manifest

    env = portable_env(tmp_path, monkeypatch, catalog=CATALOG)
    ws = make_workspace(tmp_path / "ws", env["store"])
    (ws.root / "data" / "blob.bin").write_bytes(b"x" * 2_000_000)
    ws.snapshot("with a blob", progress=None)
    orch = Orchestrator(ws)
    try:
        done = orch.continue_()
        aid = done["allocation_id"]
        active = next(a for a in history_records(head_manifest(ws)) if a["allocation_id"] == aid)
        predicted = active["predicted"]
        assert predicted["boot_s"] == 1.5 and predicted["boot_basis"] == "catalog"
        assert predicted["bytes"] >= 2_000_000
        assert predicted["transfer_s"] == pytest.approx(predicted["bytes"] * 8 / 100e6, rel=1e-3)
        assert predicted["time_to_ready_s"] == pytest.approx(predicted["boot_s"] + predicted["transfer_s"], abs=0.01)
        assert predicted["cost"] == pytest.approx(1.5 * predicted["hours"], rel=1e-3)
        # the sidebar's state shows both while the machine serves
        state = StateView(ws, lambda: orch).state(continuing=False, conflicts=[])
        estimate = state["allocation"]["estimate"]
        assert estimate["predicted"]["time_to_ready_s"] == predicted["time_to_ready_s"]
        measured = estimate["measured"]
        # the machine stays pending for its boot_seconds: up after at least that, Ready later still
        assert 1.5 <= measured["up_s"] <= measured["time_to_ready_s"] < 240
        assert 0 <= measured["transfer_s"] < measured["time_to_ready_s"]
        assert measured["boot_s"] == pytest.approx(measured["time_to_ready_s"] - measured["transfer_s"], abs=0.01)
        orch.stop()
        closed = next(a for a in history_records(head_manifest(ws)) if a["allocation_id"] == aid)
        assert closed["state"] == "released" and closed["predicted"] == predicted
        assert closed["measured"]["time_to_ready_s"] == measured["time_to_ready_s"]
        assert closed["measured"]["spend"] == closed["spend"] and closed["measured"]["hours"] > 0
        # and the next route to that offer expects the boot that was measured, not the catalog's
        signals = signals_from_history(ws, now=parse_iso(closed["stopped"], "stopped") + timedelta(minutes=1))
        assert signals.boot_seconds == {"local/slow-boot": measured["boot_s"]}
    finally:
        orch.close()
        release_all()
