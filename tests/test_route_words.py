"""What the sidebar says about routes and money, from the pure core and a real file store: the
cap message quotes the Total column, a recent loss raises an offer's risk and says so, one spend
figure, every machine of the workspace newest first, and a booking held to the budget."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from jupyter_portable import Workspace
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.routing import INCIDENT_WINDOW_S, Caps, Incident, Signals, WorkspaceFacts, rank_routes
from jupyter_portable.core.spend import money, spend_line
from jupyter_portable.demo.market import LocalMarket

FIXTURE = Path(__file__).resolve().parents[1] / "labextension" / "src" / "__tests__" / "routes50.json"
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)


def _offer(i: int) -> Offer:
    # 50 offers: prices with awkward cents, some far from the store, some unreliable
    return Offer(provider=("aws", "runpod", "vastai", "lambda", "gcp")[i % 5], id=f"o{i}",
                 gpu=("NVIDIA A100 80GB", "NVIDIA H100 80GB", "NVIDIA L4")[i % 3], gpu_count=1 + i % 2,
                 gpu_memory_gb=80, driver="550.54.15", cuda="12.4", price_per_hour=0.125 + i * 0.3137,
                 region=("us-east-1", "eu-west-1", "us-west-2")[i % 3], capacity=None if i % 4 else 1,
                 boot_seconds=60 + 7 * i, launch_failure_rate=(i % 7) / 50, reliability=1 - (i % 5) / 40,
                 bandwidth_mbps=1000 + 100 * i, egress_per_gb=0.01 * (i % 3))


def fifty_routes() -> list[dict[str, object]]:
    facts = WorkspaceFacts(bytes_to_move=37_500_000_000, store_region="us-east-1", store_provider="aws",
                           store_egress_per_gb=0.09, workspace_bytes=37_500_000_000)
    routes = rank_routes(facts, [_offer(i) for i in range(50)], hours=7.5, caps=Caps(budget_left=41.37))
    return [r.to_json() for r in routes]


def test_the_cap_message_and_the_total_column_agree_for_every_route_of_fifty() -> None:
    routes = fifty_routes()
    blocked = [r for r in routes if "budget" in r["reasons"]]  # type: ignore[operator]
    assert 10 < len(blocked) < 50, "the fixture blocks some routes and not others"
    for r in routes:
        total = r["cost"]["total"]  # type: ignore[index]
        over = r["reasons"].get("budget")  # type: ignore[attr-defined]
        # blocked exactly when the figure the table shows is over what is left
        assert (over is not None) == (total > 41.37), r["id"]
        if over:
            assert over.startswith(f"{money(total)} total for 7.5 h is over the $41.37 left"), over
    # the sidebar's own check (labextension/src/__tests__/routes.test.ts) reads the same routes:
    # fmt.money(cost.total) must be the figure each cap message quotes
    assert json.loads(FIXTURE.read_text()) == routes, "regenerate routes50.json: python tests/test_route_words.py"


def test_money_rounds_as_the_sidebar_does() -> None:
    # JavaScript's toFixed(2) on the same double: exact ties go up, 1.005 is just under
    assert [money(x) for x in (0.125, 1.005, 0.004, 0.0, 2.5, 1234.5)] == [
        "$0.13", "$1.00", "<$0.01", "$0.00", "$2.50", "$1234.50"]


def test_a_recent_preemption_raises_the_risk_at_once_and_fades() -> None:
    o = _offer(3)
    facts = WorkspaceFacts(bytes_to_move=10**9, store_region="us-east-1", store_provider="aws",
                           store_egress_per_gb=0.09, workspace_bytes=10**9)
    plain = rank_routes(facts, [o], hours=2)[0]
    hit = rank_routes(facts, [o], hours=2, signals=Signals(incidents={o.key: (Incident("preempted", 240),)}))[0]
    assert hit.risk is not None and plain.risk is not None
    # a preemption adds to the chance the machine is lost, not to the chance its launch fails
    assert hit.risk.p_lost == pytest.approx(plain.risk.p_lost + 0.30 * (1 - 240 / INCIDENT_WINDOW_S))
    assert hit.risk.p_launch == pytest.approx(plain.risk.p_launch)
    assert hit.p_fail == pytest.approx(1 - (1 - hit.risk.p_launch) * (1 - hit.risk.p_lost))
    assert hit.cost.risk > plain.cost.risk and hit.cost.total > plain.cost.total
    assert hit.history == ("preempted 4 min ago",)
    assert hit.words["risk"].startswith(
        f"Risk: {hit.p_fail:.0%} chance of a failed launch or a lost machine in the 2 planned h:"
        f" {hit.risk.hours:.1f} h lost, {money(hit.cost.risk)} expected (preempted 4 min ago)")
    assert "preempted 4 min ago" in hit.words["risk"]
    gone = rank_routes(facts, [o], hours=2,
                       signals=Signals(incidents={o.key: (Incident("preempted", INCIDENT_WINDOW_S),)}))[0]
    assert gone.p_fail == pytest.approx(plain.p_fail) and gone.history == ()
    with pytest.raises(UsageError, match="incident kind"):
        Incident("bad luck", 1)


def test_every_cost_term_has_a_definition_in_plain_words() -> None:
    r = rank_routes(WorkspaceFacts(0, None, None, 0.0), [_offer(5)], hours=8)[0]
    assert set(r.words) == {"gpu", "egress", "storage", "queue", "risk", "total"}
    assert r.words["queue"] == ("Queue: about 5 min of waiting (capacity unknown, default wait), "
                                "priced at this GPU's rate")
    assert r.words["gpu"] == f"GPU: {money(r.offer.price_per_hour)}/h for the 8 planned h"


def test_one_spend_figure() -> None:
    assert spend_line(0.04, 0.03) == "$0.04 so far: $0.03 on this machine, $0.01 before"
    assert spend_line(0.0, None) == "Nothing spent yet"
    assert spend_line(1.5, None) == "$1.50 so far, on earlier machines"


def _workspace(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    ws = Workspace.init(root, f"file://{tmp_path / 'store'}")
    ws.snapshot("first", progress=None)
    return ws


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_a_loss_in_the_history_raises_that_offers_risk_for_a_while(tmp_path: Path) -> None:
    from jupyter_portable.orchestration.routes import signals_from_history

    ws = _workspace(tmp_path)
    ws.record_allocation({"allocation_id": "al-aaaaaaaaaaaa", "provider": "local", "offer": "a100", "gpu": "A100",
                          "region": "local-a", "price_per_hour": 1.5, "started": _iso(T0), "stopped":
                          _iso(T0 + timedelta(minutes=30)), "state": "lost", "stop_reason": "preempted by the market",
                          "spend": 0.75, "currency": "USD"})
    ws.record_allocation({"allocation_id": "al-bbbbbbbbbbbb", "provider": "local", "offer": "l4", "gpu": "L4",
                          "started": _iso(T0), "stopped": _iso(T0 + timedelta(minutes=30)), "state": "released",
                          "stop_reason": "stopped by the user", "spend": 0.2, "currency": "USD"})
    soon = signals_from_history(ws, now=T0 + timedelta(minutes=34))
    assert soon.incidents == {"local/a100": (Incident("preempted", 240.0),)}, "a planned stop is no incident"
    later = signals_from_history(ws, now=T0 + timedelta(minutes=30) + timedelta(seconds=INCIDENT_WINDOW_S))
    assert later.incidents == {}


def test_the_work_a_loss_throws_away_follows_the_workspaces_checkpoint_cadence(tmp_path: Path) -> None:
    from jupyter_portable.orchestration.routes import checkpoint_cadence_s, workspace_facts

    def ckpt(minute: float, status: str = "verified") -> dict[str, object]:
        return {"status": status, "created": _iso(T0 + timedelta(minutes=minute))}

    # gaps of 10, 30 and 20 min between verified ones (the rejected one is no checkpoint): median 20 min
    assert checkpoint_cadence_s([ckpt(0), ckpt(10), ckpt(25, "rejected"), ckpt(40), ckpt(60)]) == 1200
    assert checkpoint_cadence_s([ckpt(0)]) is None, "one checkpoint is no cadence"
    assert checkpoint_cadence_s([]) is None
    ws = _workspace(tmp_path)
    assert workspace_facts(ws, {}).checkpoint_every_s is None
    (ws.root / "a.txt").write_text("b")
    ws.checkpoint(ws.root / "a.txt", step=1, quiet_s=0.1, progress=None)
    (ws.root / "a.txt").write_text("c")
    ws.checkpoint(ws.root / "a.txt", step=2, quiet_s=0.1, progress=None)
    every = workspace_facts(ws, {}).checkpoint_every_s
    assert every is not None and every > 0


def test_the_machines_are_listed_newest_first_with_reasons_and_costs(tmp_path: Path) -> None:
    from jupyter_portable.orchestration.state_view import machines_view

    ws = _workspace(tmp_path)
    ws.record_allocation({"allocation_id": "al-first0000000", "provider": "local", "offer": "l4", "gpu": "L4",
                          "region": "local-a", "price_per_hour": 0.4, "started": _iso(T0), "state": "active",
                          "spend": 0.0, "currency": "USD"})
    ws.record_allocation({"allocation_id": "al-first0000000", "provider": "local", "offer": "l4", "gpu": "L4",
                          "region": "local-a", "price_per_hour": 0.4, "started": _iso(T0),
                          "stopped": _iso(T0 + timedelta(hours=1)), "state": "lost",
                          "stop_reason": "preempted by the market", "spend": 0.4, "currency": "USD"})
    ws.record_allocation({"allocation_id": "al-second000000", "provider": "local", "offer": "a100",
                          "gpu": "A100", "region": "local-a", "price_per_hour": 1.5,
                          "started": _iso(T0 + timedelta(hours=1, minutes=1)), "state": "active", "spend": 0.0,
                          "currency": "USD"})
    head, _ = ws.store.read_head(ws.workspace_id)
    manifest = ws.store.read_manifest(ws.workspace_id, head.version)
    rows = machines_view(manifest, current="al-second000000", current_spend=0.03,
                         now=T0 + timedelta(hours=2))
    assert [(m["allocation_id"], m["state"], m["reason"], m["cost"], m["current"]) for m in rows] == [
        ("al-second000000", "active", None, 0.03, True),
        ("al-first0000000", "lost", "preempted by the market", 0.4, False)]
    # without the provider's figure, an active machine costs price x time to now
    rows = machines_view(manifest, current=None, current_spend=None, now=T0 + timedelta(hours=2, minutes=1))
    assert rows[0]["cost"] == pytest.approx(1.5)


def test_a_booking_over_the_budget_is_refused_in_a_routes_words(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.orchestration.reservations import reservations, reserve
    from jupyter_portable.orchestration.settings import update_settings

    catalog = tmp_path / "catalog.toml"
    catalog.write_text("""version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "a100"
gpu = "NVIDIA A100"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.49
region = "local-a"
capacity = 2
boot_seconds = 0
launch_failure_rate = 0
reliability = 1.0
bandwidth_mbps = 10000
reservable = true
""")
    market = LocalMarket(catalog, tmp_path / "market")
    ws = _workspace(tmp_path)
    update_settings(ws, budget_total=5)
    start = _iso(T0 + timedelta(days=1))
    with pytest.raises(UsageError) as err:
        reserve(ws, "local/a100", start, 5, providers={"local": market}, now=T0)
    assert str(err.value) == f"cannot book local/a100 at {start} for 5 h: $7.45 total for 5 h is over the $5.00 left " \
                             "of the budget"
    assert reservations(ws) == [], "nothing is stored"
    update_settings(ws, budget_max_price_per_hour=1.0)
    with pytest.raises(UsageError, match=r"\$1.49/h is over the cap of \$1.00/h"):
        reserve(ws, "local/a100", start, 1, providers={"local": market}, now=T0)
    update_settings(ws, budget_max_price_per_hour="")
    booked = reserve(ws, "local/a100", start, 3, providers={"local": market}, now=T0)
    assert booked.price == pytest.approx(4.47)
    with pytest.raises(UsageError, match=r"\$1.49 total for 1 h is over the \$0.53 left of the budget"):
        reserve(ws, "local/a100", _iso(T0 + timedelta(days=2)), 1, providers={"local": market}, now=T0)


if __name__ == "__main__":  # regenerate the fixture the sidebar's test reads
    FIXTURE.write_text(json.dumps(fifty_routes(), indent=1) + "\n")
