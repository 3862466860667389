"""The market from a workspace, on the local market: routes, settings, reservations,
and a wrong driver refused at admission with the next route used."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import write_tree

from jupyter_portable import Workspace
from jupyter_portable.core.errors import NoCapacity, UsageError
from jupyter_portable.demo.market import LocalMarket

CATALOG = """
version = 1
[store]
region = "near"
egress_per_gb = 0.09

[[offer]]
id = "cheap-far"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.00
region = "far"
capacity = 2
boot_seconds = 0.5
launch_failure_rate = 0.0
reliability = 1.0
bandwidth_mbps = 10000

[[offer]]
id = "dear-near"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "near"
capacity = 1
boot_seconds = 0.5
launch_failure_rate = 0.0
reliability = 1.0
bandwidth_mbps = 10000
reservable = true

[[offer]]
id = "sold-out"
gpu = "NVIDIA H100 80GB HBM3"
gpu_count = 8
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 20.0
region = "near"
capacity = 0
boot_seconds = 0.5
launch_failure_rate = 0.0
reliability = 1.0
bandwidth_mbps = 10000
reservable = true
"""


@pytest.fixture
def market_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    env = {"JUPYTER_PORTABLE_CATALOG": str(catalog), "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market"),
           "JUPYTER_PORTABLE_PROVIDERS": "local"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield env
    market = LocalMarket(catalog, tmp_path / "market")
    for a in market.list_allocations():
        try:
            market.terminate(market.allocation(a["allocation_id"]))
        except Exception:  # noqa: BLE001 - cleanup must go on
            pass


def _workspace(tmp_path: Path, size_gb: float) -> Workspace:
    root = tmp_path / "w"
    write_tree(root, {"a.txt": "a"})
    ws = Workspace.init(root, f"file://{tmp_path}/store")
    if size_gb:
        with open(root / "data.bin", "wb") as fh:  # sparse: large, cheap to make, cheap to store (zeros dedup)
            fh.truncate(int(size_gb * 1e9))
    ws.snapshot(progress=None)
    return ws


def test_routes_json_on_the_demo_catalog(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
    monkeypatch.delenv("JUPYTER_PORTABLE_CATALOG", raising=False)
    ws = _workspace(tmp_path, 0)
    out = cli.json("routes", "--hours", "4", cwd=ws.root)
    routes = out["routes"]
    assert len(routes) >= 5
    for r in routes:
        assert {"id", "provider", "offer", "gpu", "region", "price_per_hour", "cost", "time_to_ready_s", "checks",
                "blocked"} <= r.keys()
        assert set(r["cost"]) == {"gpu", "egress", "storage", "queue", "risk", "total"}
        assert r["checks"]["listed"] is True and set(r["checks"]) == {"listed", "permitted", "capacity", "launched"}
        assert abs(sum(v for k, v in r["cost"].items() if k != "total") - r["cost"]["total"]) < 1e-6
    open_totals = [r["cost"]["total"] for r in routes if r["blocked"] is None]
    assert open_totals == sorted(open_totals), "open routes are ranked by whole cost"
    blocked = [r for r in routes if r["blocked"]]
    assert blocked and all(routes.index(b) > routes.index(o) for b in blocked for o in routes if not o["blocked"])
    assert any("no capacity" in r["blocked"] for r in blocked), "listed is not available"


def test_a_cheap_gpu_far_from_a_large_workspace_ranks_below_a_dear_one_near_it(market_env, tmp_path: Path) -> None:
    from jupyter_portable.orchestration.routes import compute_routes

    ws = _workspace(tmp_path, 2)  # 2 GB
    routes, _ = compute_routes(ws, hours=0.25)
    order = [r.offer.id for r in routes if not r.blocked]
    # far: $1.00 x 0.25 h = $0.25, plus 2 GB x $0.09 = $0.18 egress -> $0.43; near: $1.50 x 0.25 h = $0.375.
    assert order == ["dear-near", "cheap-far"]
    far = next(r for r in routes if r.offer.id == "cheap-far")
    assert round(far.cost.gpu, 2) == 0.25 and round(far.cost.egress, 2) == 0.18
    # With a tiny workspace the cheap GPU wins: egress no longer matters.
    small = _workspace(tmp_path / "small", 0)
    routes, _ = compute_routes(small, hours=0.25)
    assert [r.offer.id for r in routes if not r.blocked] == ["cheap-far", "dear-near"]


def test_settings_pin_a_driver_and_cap_the_price(cli, market_env, tmp_path: Path) -> None:
    ws = _workspace(tmp_path, 0)
    cli.json("settings", "--driver", "535.104.05", "--max-price", "1.2", cwd=ws.root, extra_env=market_env)
    routes = cli.json("routes", cwd=ws.root, extra_env=market_env)["routes"]
    assert all(r["blocked"] for r in routes)
    dear = next(r for r in routes if r["offer"] == "dear-near")
    assert "535.104.05 is pinned" in dear["blocked"] and "over the cap" in dear["blocked"]
    text = cli("routes", cwd=ws.root, extra_env=market_env).stdout
    assert "BLOCKED:" in text
    settings = cli.json("settings", "--driver", "", cwd=ws.root, extra_env=market_env)
    assert settings["requirements"]["driver"] is None and settings["budget"]["max_price_per_hour"] == 1.2
    # Settings live with the workspace: a restored copy elsewhere sees them.
    copy = tmp_path / "copy"
    Workspace.restore(ws.config.store, ws.workspace_id, copy, progress=None)
    assert cli.json("settings", cwd=copy, extra_env=market_env)["budget"]["max_price_per_hour"] == 1.2


def test_reservations_book_list_and_cancel(cli, market_env, tmp_path: Path) -> None:
    ws = _workspace(tmp_path, 0)
    # the CLI's calendar starts at a date the test chose (c.Portable.now): no wall clock read here
    market_env = {**market_env, "JUPYTER_PORTABLE_NOW": "2027-03-01T09:20:00Z"}
    start = datetime(2027, 3, 2, 9, 0, tzinfo=timezone.utc)
    iso = start.strftime("%Y-%m-%dT%H:%MZ")
    booked = cli.json("reserve", "local/dear-near", "--start", iso, "--hours", "3", "--charge", "before",
                      cwd=ws.root, extra_env=market_env)
    assert booked["guarantee"] == "capacity-checked" and booked["charge"] == "before"
    assert booked["price"] == 4.5 and booked["status"] == "booked"
    assert booked["charge_at"].startswith((start - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"))
    # Capacity 1: an overlapping slot cannot be booked.
    proc = cli("reserve", "local/dear-near", "--start", iso, "--hours", "1", cwd=ws.root, extra_env=market_env,
               check=False)
    assert proc.returncode == 1 and "cannot book" in proc.stderr
    # No capacity at all: refused.
    proc = cli("reserve", "local/sold-out", "--start", iso, "--hours", "1", cwd=ws.root, extra_env=market_env,
               check=False)
    assert proc.returncode == 1 and "no capacity" in proc.stderr.lower()
    now_booked = cli.json("reserve", "local/cheap-far", "--start", iso, "--hours", "2", "--charge", "now",
                          cwd=ws.root, extra_env=market_env)
    assert now_booked["guarantee"] == "best-effort" and now_booked["charge"] == "now"
    listing = cli.json("reservations", "--calendar", "2", cwd=ws.root, extra_env=market_env)
    assert [b["reservation_id"] for b in listing["reservations"]] == [booked["reservation_id"],
                                                                      now_booked["reservation_id"]]
    grid = listing["calendar"]["offers"]["local/dear-near"]["slots"]
    taken = [s for s in grid if s["mine"]]
    assert len(taken) == 3 and all(s["free"] == 0 for s in taken)
    cancelled = cli.json("reservations", "--cancel", booked["reservation_id"], cwd=ws.root, extra_env=market_env)
    assert cancelled["status"] == "cancelled"
    # Cancelled capacity is free again.
    again = cli.json("reserve", "local/dear-near", "--start", iso, "--hours", "1", cwd=ws.root, extra_env=market_env)
    assert again["status"] == "booked"
    with pytest.raises(UsageError):
        from jupyter_portable.orchestration.reservations import reserve
        reserve(ws, "local/dear-near", "tomorrow", 1)


def test_the_calendar_promises_what_a_booking_records_in_the_same_words(market_env, tmp_path: Path) -> None:
    """Issue 30, item 5: an offer that is not reservable was shown as capacity-checked ("the market
    holds one machine") and booked as best effort ("no capacity is held")."""
    from jupyter_portable.core.calendar import GUARANTEE_TEXT
    from jupyter_portable.orchestration.reservations import booking_view, calendar, reserve

    ws = _workspace(tmp_path, 0)
    now = datetime(2027, 3, 1, 9, 20, tzinfo=timezone.utc)
    offers = calendar(ws, 2, now=now)["offers"]
    for key in ("local/cheap-far", "local/dear-near"):
        booking = reserve(ws, key, "2027-03-02T09:00Z", 1, "before", now=now)
        promised = offers[key]
        assert booking.guarantee == promised["guarantee"], key
        assert booking_view(booking, now)["guarantee_text"] == promised["guarantee_text"]
    assert offers["local/cheap-far"]["guarantee_text"] == GUARANTEE_TEXT["best-effort"]
    assert "no capacity is held" in offers["local/cheap-far"]["guarantee_text"]
    assert offers["local/dear-near"]["guarantee"] == "capacity-checked"


def test_a_wrong_driver_is_refused_and_recorded_as_an_environment_fault(tmp_path: Path, monkeypatch) -> None:
    from jupyter_portable.orchestration.routes import acquire_for

    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG.replace('id = "dear-near"\n', 'id = "dear-near"\nactual_driver = "580.105.08"\n'))
    monkeypatch.setenv("JUPYTER_PORTABLE_CATALOG", str(catalog))
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "local")
    ws = _workspace(tmp_path, 2)  # dear-near ranks first
    from jupyter_portable.orchestration.settings import update_settings
    update_settings(ws, driver="550.54.15")
    events: list[dict] = []
    market = LocalMarket(catalog, tmp_path / "market")
    try:
        result = acquire_for(ws, hours=0.25, on_event=events.append, boot_timeout_s=30)
        assert result["allocation"]["offer_id"] == "cheap-far", "the next route is used"
        [attempt] = result["attempts"]
        assert attempt["environment_fault"] is True and "580.105.08" in attempt["reason"]
        history = ws.manifest().allocations
        refused = [a for a in history if a["state"] == "refused"]
        assert len(refused) == 1 and refused[0]["offer"] == "dear-near"
        assert refused[0]["stop_reason"].startswith("environment fault: admission")
        assert [a["state"] for a in history if a["offer"] == "cheap-far"] == ["active"]
        assert any(e["state"] == "REFUSED" for e in events)
        # The refused machine was released; the admitted one runs.
        states = {a["offer_id"]: a["state"] for a in market.list_allocations()}
        assert states["dear-near"] == "terminated"
        assert json.dumps(result)
    finally:
        for a in market.list_allocations():
            market.terminate(market.allocation(a["allocation_id"]))


def test_every_route_blocked_is_a_clear_error(market_env, tmp_path: Path) -> None:
    from jupyter_portable.orchestration.routes import acquire_for
    from jupyter_portable.orchestration.settings import update_settings

    ws = _workspace(tmp_path, 0)
    update_settings(ws, gpus=["B200"])
    with pytest.raises(NoCapacity, match="every offer is blocked"):
        acquire_for(ws)


def test_spend_warns_then_seals_and_releases_at_the_budget(market_env, tmp_path: Path) -> None:
    from jupyter_portable.core.times import parse_iso
    from jupyter_portable.orchestration.budget import budget_report, enforce_budget
    from jupyter_portable.orchestration.routes import acquire_for
    from jupyter_portable.orchestration.settings import update_settings

    ws = _workspace(tmp_path, 0)
    update_settings(ws, budget_total=5.0)
    market = LocalMarket(market_env["JUPYTER_PORTABLE_CATALOG"], market_env["JUPYTER_PORTABLE_MARKET_DIR"])
    result = acquire_for(ws, hours=1, boot_timeout_s=30)
    alloc_id = result["allocation"]["allocation_id"]
    # cheap-far at $1.00/h with $5 to spend: about 5 h left, nothing to say.
    assert budget_report(ws)["state"] == "ok"
    # With $0.50 the money lasts under an hour at this price: a warning, nothing released.
    update_settings(ws, budget_total=0.5)
    report = enforce_budget(ws)
    assert report["state"] == "warn" and "nearly spent" in report["message"] and "released" not in report
    # Work written on the copy since the last snapshot must survive the seal.
    (ws.root / "results.txt").write_text("epoch 7: loss 0.12")
    # An hour later on the market's own books (its clock passed in, the worker's heartbeat taken as
    # fresh): $1 spent against a cap of $0.0001.
    update_settings(ws, budget_total=0.0001)
    [rec] = [a for a in market.list_allocations() if a["allocation_id"] == alloc_id]
    later = parse_iso(rec["started"]) + timedelta(hours=1)
    an_hour_on = LocalMarket(market_env["JUPYTER_PORTABLE_CATALOG"], market_env["JUPYTER_PORTABLE_MARKET_DIR"],
                             clock=later.timestamp, heartbeat_timeout_s=2 * 3600)
    done = enforce_budget(ws, providers={"local": an_hour_on}, now=later)
    assert done["state"] == "exhausted" and done["released"] == [alloc_id]
    assert "results.txt" in ws.manifest().by_path(), "sealed before release: nothing lost"
    assert any(v["message"] == "sealed: budget exhausted" for v in ws.log())
    record = [a for a in ws.manifest().allocations if a["allocation_id"] == alloc_id][-1]
    assert record["state"] == "released" and record["stop_reason"].startswith("budget exhausted")
    assert record["spend"] == pytest.approx(1.0, abs=0.01)  # the market's hour at $1/h
    assert market.status(market.allocation(alloc_id)).state == "terminated"
    assert budget_report(ws)["active"] == []


def test_the_catalog_comes_from_the_command_line(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTER_PORTABLE_CATALOG", raising=False)
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
    catalog = tmp_path / "mine.toml"
    catalog.write_text(CATALOG)
    offers = cli.json("offers", "--catalog", str(catalog))["offers"]
    assert sorted(o["id"] for o in offers) == ["cheap-far", "dear-near", "sold-out"]
    bad = tmp_path / "bad.toml"
    bad.write_text(CATALOG.replace("price_per_hour = 1.00", "price_per_hour = -1"))
    proc = cli("offers", "--catalog", str(bad), "--json", check=False)
    assert proc.returncode == 1 and "price_per_hour" in json.loads(proc.stdout)["errors"]["local"]
    assert proc.stderr.startswith("error: no provider answered: local: ")
    proc = cli("offers", "--catalog", str(tmp_path / "missing.toml"), check=False)
    assert proc.returncode == 2 and "no such file" in proc.stderr
