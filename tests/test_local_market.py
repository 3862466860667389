"""The local market: a catalog of offers, and real worker processes that present its GPUs."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.gpus import query_gpus
from jupyter_portable.core.errors import LaunchFailed, NoCapacity, NotSupported, QuotaExceeded, UsageError
from jupyter_portable.demo.catalog import CATALOG_ENV, default_catalog_path, load_catalog
from jupyter_portable.demo.fake_nvidia_smi import write_fake_nvidia_smi
from jupyter_portable.demo.market import SEED_ENV, LocalMarket, lose_allocation

BASE: dict[str, Any] = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "gpu_memory_gb": 80, "driver": "580.95.05",
                        "cuda": "13.0", "price_per_hour": 2.49, "region": "local-a", "capacity": 2,
                        "boot_seconds": 0, "launch_failure_rate": 0.0, "reliability": 0.99, "bandwidth_mbps": 800}
STORE = {"region": "local-a", "egress_per_gb": 0.09}


def offer(offer_id: str, **fields: Any) -> dict[str, Any]:
    """A catalog ``[[offer]]`` table: an H100 unless told otherwise."""
    return {"id": offer_id, **BASE, **fields}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of plain text is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def write_catalog(path: Path, offers: list[dict[str, Any]], store: dict[str, Any] | None = STORE,
                  head: str = "") -> Path:
    lines = [head]
    if store is not None:
        lines += ["[store]", *(f"{k} = {_toml(v)}" for k, v in store.items()), ""]
    for o in offers:
        lines += ["[[offer]]", *(f"{k} = {_toml(v)}" for k, v in o.items()), ""]
    path.write_text("\n".join(lines))
    return path


MarketFactory = Callable[..., LocalMarket]


@contextlib.contextmanager
def market_factory(tmp_path: Path) -> Iterator[MarketFactory]:
    """Markets over a catalog of the given offers; every worker they started is stopped at the end."""
    markets: list[LocalMarket] = []

    def make(offers: list[dict[str, Any]], **kwargs: Any) -> LocalMarket:
        n = len(markets)
        catalog = write_catalog(tmp_path / f"catalog-{n}.toml", offers)
        kwargs.setdefault("stop_grace_s", 5)
        market = LocalMarket(catalog, kwargs.pop("state_dir", tmp_path / f"market-{n}"), **kwargs)
        markets.append(market)
        return market

    try:
        yield make
    finally:
        for market in markets:
            for rec in market.list_allocations():
                market.terminate(market.allocation(rec["allocation_id"]))


@pytest.fixture
def make_market(tmp_path: Path) -> Iterator[MarketFactory]:
    with market_factory(tmp_path) as make:
        yield make


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def launch_one(market: LocalMarket, offer_id: str, allocation_id: str, **kwargs: Any) -> Allocation:
    listed = next(o for o in market.offers() if o.id == offer_id)
    return market.launch(listed, allocation_id=allocation_id, **kwargs)


# --- the catalog ---------------------------------------------------------------------------

def test_the_demo_catalog_loads_and_shows_each_fault() -> None:
    cat = load_catalog(default_catalog_path())
    assert 6 <= len(cat.offers) <= 8
    assert {o.provider for o in cat.offers} == {"local"}
    assert {"local-a", "local-b", "far-1"} <= {o.region for o in cat.offers}
    assert any(o.capacity == 0 for o in cat.offers)
    assert any(o.launch_failure_rate == 0.3 for o in cat.offers)
    assert any(cat.offer(i) and cat.offer(i).driver != d for i, d in cat.actual_drivers.items())  # type: ignore[union-attr]
    assert all(o.boot_seconds <= 3 for o in cat.offers)
    assert (cat.store_region, cat.store_egress_per_gb) == ("local-a", 0.09)


def test_the_catalog_path_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write_catalog(tmp_path / "mine.toml", [offer("only")])
    monkeypatch.setenv(CATALOG_ENV, str(path))
    assert default_catalog_path() == path
    assert [o.key for o in load_catalog(default_catalog_path()).offers] == ["local/only"]


@pytest.mark.parametrize(("change", "expected"), [
    ({"price_per_hour": None}, "offer 'x': missing field(s) price_per_hour"),
    ({"capacity": "two"}, "offer 'x': field 'capacity' must be an integer >= 0, got 'two'"),
    ({"capacity": True}, "offer 'x': field 'capacity' must be an integer >= 0, got True"),
    ({"gpu_count": 1.5}, "offer 'x': field 'gpu_count' must be an integer >= 0, got 1.5"),
    ({"launch_failure_rat": 1}, "offer 'x': unknown field(s) launch_failure_rat"),
    ({"price_per_hour": -1}, "offer 'x': field 'price_per_hour' must be a number >= 0, got -1"),
    ({"launch_failure_rate": 1.5}, "offer 'x': field 'launch_failure_rate' must be a number >= 0 and <= 1, got 1.5"),
    ({"bandwidth_mbps": 0}, "offer 'x': field 'bandwidth_mbps' must be a number > 0, got 0"),
    ({"reservable": 1}, "offer 'x': field 'reservable' must be true or false, got 1"),
    ({"images": ["ok", ""]}, "offer 'x': field 'images' must be a list of non-empty strings"),
    ({"driver": ""}, "offer 'x': field 'driver' must be a non-empty string, got ''"),
    ({"id": "has space"}, "offer 'has space': offer local/has space: bad id"),
])
def test_a_bad_offer_is_refused_naming_file_offer_and_field(tmp_path: Path, change: dict[str, Any],
                                                             expected: str) -> None:
    fields = {k: v for k, v in {**offer("x"), **change}.items() if v is not None}
    path = write_catalog(tmp_path / "bad.toml", [offer("fine"), fields])
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert str(info.value).startswith(f"catalog {path}: ")
    assert expected in str(info.value)
    assert "docs/catalog.md" in info.value.one_line()


@pytest.mark.parametrize(("offers", "store", "head", "expected"), [
    ([offer("a"), offer("a")], STORE, "", "offer 'a': field 'id' repeats an earlier offer's id"),
    ([offer("a")], None, "", "missing [store] table"),
    ([offer("a")], {"region": "r"}, "", "[store]: missing field(s) egress_per_gb"),
    ([offer("a")], {**STORE, "zone": "z"}, "", "[store]: unknown field(s) zone"),
    ([offer("a")], {**STORE, "egress_per_gb": -0.1}, "", "[store]: field 'egress_per_gb' must be a number >= 0"),
    ([offer("a")], STORE, "offers = 1\n", "unknown top-level key(s) offers"),
    ([offer("a")], STORE, "version = 2\n", "version 2 is not supported"),
    ([], STORE, "", "needs at least one [[offer]] table"),
])
def test_a_bad_catalog_is_refused(tmp_path: Path, offers: list[dict[str, Any]], store: dict[str, Any] | None,
                                  head: str, expected: str) -> None:
    path = write_catalog(tmp_path / "bad.toml", offers, store, head)
    with pytest.raises(UsageError) as info:
        load_catalog(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_a_catalog_that_is_not_toml_or_is_missing_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[offer]\nid = 1\n")
    with pytest.raises(UsageError, match=f"catalog {bad} is not valid TOML"):
        load_catalog(bad)
    with pytest.raises(UsageError, match="does not exist"):
        load_catalog(tmp_path / "nowhere.toml")


# --- offers and capacity ---------------------------------------------------------------------

def test_offers_are_the_catalog_less_what_runs_in_every_process(make_market: MarketFactory, tmp_path: Path) -> None:
    market = make_market([offer("h100", capacity=2), offer("l4", gpu="NVIDIA L4", capacity=1)])
    assert {o.key: o.capacity for o in market.offers()} == {"local/h100": 2, "local/l4": 1}
    alloc = launch_one(market, "h100", "a1")
    assert {o.key: o.capacity for o in market.offers()} == {"local/h100": 1, "local/l4": 1}
    # another process opening the same market dir sees the same market
    other = LocalMarket(market.catalog_path, market.state_dir)
    assert {o.id: o.capacity for o in other.offers()}["h100"] == 1
    assert [r["allocation_id"] for r in other.list_allocations()] == ["a1"]
    other.terminate(other.allocation("a1"))
    assert {o.key: o.capacity for o in market.offers()} == {"local/h100": 2, "local/l4": 1}
    assert market.status(alloc).state == "terminated"


def test_no_capacity_when_sold_out_or_all_in_use(make_market: MarketFactory) -> None:
    market = make_market([offer("sold-out", capacity=0), offer("one", capacity=1)])
    sold_out, one = market.offers()
    with pytest.raises(NoCapacity, match="local/sold-out: sold out"):
        market.check_capacity(sold_out)
    with pytest.raises(NoCapacity, match="sold out"):
        market.launch(sold_out, allocation_id="a0")
    assert market.check_capacity(one) == 1
    market.launch(one, allocation_id="a1")
    with pytest.raises(NoCapacity, match="all 1 machine"):
        market.check_capacity(one)
    with pytest.raises(NoCapacity):
        market.launch(one, allocation_id="a2")
    assert [r["allocation_id"] for r in market.list_allocations()] == ["a1"]


def test_quota_is_a_separate_check_from_capacity(make_market: MarketFactory) -> None:
    market = make_market([offer("q", capacity=3, quota=1)])
    (q,) = market.offers()
    market.check_permission(q)
    market.launch(q, allocation_id="a1")
    with pytest.raises(QuotaExceeded, match="quota of 1 machine"):
        market.check_permission(q)
    assert market.check_capacity(q) == 2
    with pytest.raises(QuotaExceeded):
        market.launch(q, allocation_id="a2")


def test_an_offer_the_catalog_does_not_list_cannot_be_launched(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")])
    (listed,) = market.offers()
    with pytest.raises(NoCapacity, match="not listed"):
        market.launch(replace(listed, id="gone"), allocation_id="a1")
    with pytest.raises(UsageError, match="bad allocation id"):
        market.launch(listed, allocation_id="../escape")


# --- workers -----------------------------------------------------------------------------------

def test_launch_starts_a_real_worker_whose_heartbeat_updates(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")])
    alloc = launch_one(market, "h100", "a1")
    folder = Path(alloc.details["dir"])
    assert folder == market.state_dir / "allocations" / "a1"
    assert alloc.details["local"] is True and alloc.ssh is None
    assert Path(alloc.details["work"]).is_dir() and (Path(alloc.details["bin"]) / "nvidia-smi").is_file()
    assert wait_for(lambda: (folder / "heartbeat").exists())
    agent = json.loads((folder / "agent.json").read_text())
    assert agent["pid"] == alloc.details["pid"] == int(alloc.ref) and agent["allocation_id"] == "a1"
    first = float((folder / "heartbeat").read_text())
    assert wait_for(lambda: float((folder / "heartbeat").read_text()) > first, timeout=30)
    # the worker's own PATH finds the allocation's nvidia-smi first
    environ = Path(f"/proc/{alloc.details['pid']}/environ").read_bytes().split(b"\0")
    path = next(e for e in environ if e.startswith(b"PATH=")).decode()[5:]
    assert path.split(os.pathsep)[0] == alloc.details["bin"]


class HeldClock:
    """The market's clock, held still by the test and moved on only when it says so; it starts
    at the epoch time the workers write their heartbeats in."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_status_is_pending_while_booting_then_reachable(make_market: MarketFactory) -> None:
    clock = HeldClock()
    market = make_market([offer("slow", boot_seconds=1.0)], clock=clock)
    start = clock.now
    alloc = launch_one(market, "slow", "a1")
    assert market.status(alloc).state == "pending"
    clock.now += 0.9
    assert market.status(alloc).state == "pending"  # however long the launch took on this machine
    clock.now += 0.1
    assert wait_for(lambda: market.status(alloc).state == "reachable", timeout=30)
    assert clock.now - start >= 1.0
    assert market.status(alloc).spend is not None


def test_terminate_stops_the_worker_cleanly_and_twice_is_fine(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")])
    alloc = launch_one(market, "h100", "a1")
    folder = Path(alloc.details["dir"])
    assert wait_for(lambda: (folder / "heartbeat").exists())
    market.terminate(alloc)
    assert not alive(alloc.details["pid"])
    assert (folder / "stopped").exists()  # it took SIGTERM and exited on its own
    st = market.status(alloc)
    assert (st.state, st.reason) == ("terminated", "terminated on request")
    market.terminate(alloc)
    assert market.status(alloc).state == "terminated"


def test_the_market_takes_a_machine_back_and_status_says_why(make_market: MarketFactory) -> None:
    market = make_market([offer("h100", capacity=2)])
    first = launch_one(market, "h100", "a1")
    second = launch_one(market, "h100", "a2")
    assert wait_for(lambda: market.status(first).state == "reachable")
    market.lose("a1")
    assert not alive(first.details["pid"])
    assert not (Path(first.details["dir"]) / "stopped").exists()  # killed, not stopped
    st = market.status(first)
    assert (st.state, st.reason) == ("lost", "preempted by the market")
    # the CLI's way in: only the market dir
    record = lose_allocation(market.state_dir, "a2", reason="spot instance reclaimed")
    assert record["state"] == "lost"
    assert market.status(second).reason == "spot instance reclaimed"
    assert [o.capacity for o in market.offers()] == [2]
    market.terminate(first)  # releasing a lost machine keeps the reason it was lost for
    assert market.status(first).reason == "preempted by the market"
    with pytest.raises(UsageError, match="no allocation 'nope'"):
        lose_allocation(market.state_dir, "nope")


def test_a_worker_that_dies_is_lost(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")])
    alloc = launch_one(market, "h100", "a1")
    os.kill(alloc.details["pid"], signal.SIGKILL)
    assert wait_for(lambda: market.status(alloc).state == "lost")
    assert market.status(alloc).reason == "the worker process exited"
    assert [o.capacity for o in market.offers()] == [2]


def test_a_worker_whose_heartbeat_stops_is_lost(make_market: MarketFactory) -> None:
    market = make_market([offer("h100")], heartbeat_timeout_s=1.5)
    alloc = launch_one(market, "h100", "a1")
    assert wait_for(lambda: market.status(alloc).state == "reachable")
    os.kill(alloc.details["pid"], signal.SIGSTOP)  # alive, and silent
    assert wait_for(lambda: market.status(alloc).state == "lost", timeout=30)
    assert market.status(alloc).reason.startswith("no heartbeat for")  # type: ignore[union-attr]
    assert wait_for(lambda: not alive(alloc.details["pid"]))  # and the market released it


def test_launch_failure_rate_one_always_fails(make_market: MarketFactory) -> None:
    market = make_market([offer("flaky", launch_failure_rate=1.0)])
    (flaky,) = market.offers()
    for n in range(3):
        with pytest.raises(LaunchFailed, match="failed to start"):
            market.launch(flaky, allocation_id=f"a{n}")
    assert market.list_allocations() == []
    assert not (market.state_dir / "allocations").exists()
    assert [o.capacity for o in market.offers()] == [2]


def test_seeded_launch_failures_repeat(make_market: MarketFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SEED_ENV, "7")
    outcomes = []
    for _ in range(2):
        market = make_market([offer("coin", launch_failure_rate=0.5, capacity=10)])
        (coin,) = market.offers()
        run = []
        for n in range(6):
            try:
                market.launch(coin, allocation_id=f"a{n}")
                run.append(True)
            except LaunchFailed:
                run.append(False)
        outcomes.append(run)
    assert outcomes[0] == outcomes[1]
    assert True in outcomes[0] and False in outcomes[0]


def test_the_machine_presents_the_offer_gpu_and_its_actual_driver(make_market: MarketFactory) -> None:
    market = make_market([offer("h100x2", gpu_count=2, actual_driver="580.105.08"), offer("plain")])
    alloc = launch_one(market, "h100x2", "a1")
    gpus, cuda, note = query_gpus(nvidia_smi=str(Path(alloc.details["bin"]) / "nvidia-smi"))
    assert note is None and cuda == "13.0"
    assert [(g.index, g.name, g.driver, g.memory_mb) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "580.105.08", 81920), (1, "NVIDIA H100 80GB HBM3", "580.105.08", 81920)]
    plain = launch_one(market, "plain", "a2")
    other, _, _ = query_gpus(nvidia_smi=str(Path(plain.details["bin"]) / "nvidia-smi"))
    assert other[0].driver == "580.95.05"  # no actual_driver: the listing is true
    assert len({g.uuid for g in gpus + other}) == 3


# --- the fake nvidia-smi's formats ------------------------------------------------------------

def _smi(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=30)


def test_fake_nvidia_smi_answers_in_nvidia_formats(tmp_path: Path) -> None:
    exe = write_fake_nvidia_smi(tmp_path / "bin", gpu="NVIDIA L4", count=2, memory_mb=23034, driver="550.54.15",
                                cuda="12.4", uuid_seed="m1")
    table = _smi(exe).stdout
    assert "Driver Version: 550.54.15" in table and "CUDA Version: 12.4" in table
    assert "0MiB /  23034MiB" in table
    listing = _smi(exe, "-L").stdout.splitlines()
    assert len(listing) == 2 and listing[1].startswith("GPU 1: NVIDIA L4 (UUID: GPU-")
    csv = _smi(exe, "--query-gpu=memory.total,uuid,name,index", "--format=csv").stdout.splitlines()
    assert csv[0] == "memory.total [MiB], uuid, name, index"
    assert csv[1].startswith("23034 MiB, GPU-") and csv[1].endswith(", NVIDIA L4, 0")
    one = _smi(exe, "-i", "1", "--query-gpu=index,driver_version", "--format=csv,noheader,nounits")
    assert one.stdout == "1, 550.54.15\n"
    bad = _smi(exe, "--query-gpu=bogus", "--format=csv")
    assert (bad.returncode, bad.stdout.strip()) == (2, 'Field "bogus" is not a valid field to query.')
    assert "CUDA Version                              : 12.4" in _smi(exe, "-q").stdout
    # same seed, same GPUs; another seed, other GPUs
    again = write_fake_nvidia_smi(tmp_path / "again", gpu="NVIDIA L4", count=2, memory_mb=23034,
                                  driver="550.54.15", cuda="12.4", uuid_seed="m1")
    assert _smi(again, "-L").stdout.splitlines() == listing
    elsewhere = write_fake_nvidia_smi(tmp_path / "else", gpu="NVIDIA L4", count=2, memory_mb=23034,
                                      driver="550.54.15", cuda="12.4", uuid_seed="m2")
    assert _smi(elsewhere, "-L").stdout.splitlines() != listing


def test_fake_nvidia_smi_without_gpus_says_no_devices(tmp_path: Path) -> None:
    exe = write_fake_nvidia_smi(tmp_path / "bin", gpu="NVIDIA L4", count=0, memory_mb=23034, driver="550.54.15",
                                cuda="12.4", uuid_seed="m1")
    proc = _smi(exe, "-L")
    assert (proc.returncode, proc.stdout) == (6, "No devices were found\n")
    assert query_gpus(nvidia_smi=str(exe)) == ([], None, "no GPU: no devices were found")


# --- reservations ----------------------------------------------------------------------------

def test_reservations_are_capacity_checked(make_market: MarketFactory) -> None:
    market = make_market([offer("full", capacity=0, reservable=True), offer("free", reservable=True),
                          offer("never")])
    full, free, never = market.offers()
    with pytest.raises(NoCapacity, match="no capacity for a slot"):
        market.reserve(full, start="2030-01-01T09:00:00Z", hours=4)
    res = market.reserve(free, start="2030-01-01T09:00:00Z", hours=4)
    assert (res.guarantee, res.offer_id, res.price, res.hours) == ("capacity-checked", "free", 9.96, 4.0)
    with pytest.raises(NotSupported, match="not sold as a reservation"):
        market.reserve(never, start="2030-01-01T09:00:00Z", hours=4)
    with pytest.raises(UsageError, match="hours"):
        market.reserve(free, start="2030-01-01T09:00:00Z", hours=0)
    with pytest.raises(UsageError, match="ISO 8601"):
        market.reserve(free, start="tomorrow", hours=1)
    market.cancel_reservation(res)
    market.cancel_reservation(res)
