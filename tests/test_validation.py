"""Bad input never poisons state: settings, reservations and manifests that break the rules are
refused with one line naming the field, nothing is stored, and what an older version stored
already is reported and skipped (or repaired), never a crash."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import write_tree

from jupyter_portable import ManifestError, Workspace
from jupyter_portable.core.calendar import Booking, can_book
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.lifecycle import Lifecycle
from jupyter_portable.core.manifest import MAX_FILE_SIZE, Head, Manifest, PackIndex
from jupyter_portable.core.times import now_iso
from jupyter_portable.core.validate import MTIME_NS_MAX, MTIME_NS_MIN, dumps_strict, loads_strict
from jupyter_portable.demo.market import LocalMarket
from jupyter_portable.orchestration.reservations import (
    calendar,
    cancel_reservation,
    read_reservations,
    reservations,
    reserve,
)
from jupyter_portable.orchestration.settings import load_settings, update_settings
from jupyter_portable.store.repo import digest, head_key, manifest_key

NOW = datetime(2026, 11, 3, 10, 0, tzinfo=timezone.utc)
CATALOG = """
version = 1
[store]
region = "near"
egress_per_gb = 0.0

[[offer]]
id = "a100"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "near"
capacity = 2
boot_seconds = 0
launch_failure_rate = 0.0
reliability = 1.0
bandwidth_mbps = 10000
reservable = true
"""


@pytest.fixture
def ws(tmp_path: Path, file_store: str) -> Workspace:
    src = tmp_path / "src"
    write_tree(src, {"ok.txt": "fine\n"})
    w = Workspace.init(src, file_store)
    w.snapshot(progress=None)
    return w


@pytest.fixture
def market(tmp_path: Path) -> LocalMarket:
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    return LocalMarket(catalog, tmp_path / "market")


def _raw_doc(ws: Workspace, name: str) -> bytes | None:
    got = ws.store.backend.read_versioned(f"workspaces/{ws.workspace_id}/{name}.json")
    return None if got is None else got[0]


def _poison(ws: Workspace, name: str, body: bytes) -> None:
    """Write a document as an older version (or a careless hand) left it."""
    key = f"workspaces/{ws.workspace_id}/{name}.json"
    got = ws.store.backend.read_versioned(key)
    ws.store.backend.swap(key, body, None if got is None else got[1])


# -- settings -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "named"), [
    ({"hours": math.nan}, "hours"),
    ({"hours": math.inf}, "hours"),
    ({"hours": 0}, "hours"),
    ({"hours": -3}, "hours"),
    ({"gpu_count": 0.5}, "gpu_count"),
    ({"gpu_count": True}, "gpu_count"),
    ({"gpu_count": 10**6}, "gpu_count"),
    ({"budget_total": -math.inf}, "budget_total"),
    ({"budget_warn_fraction": 0}, "budget_warn_fraction"),
    ({"min_gpu_memory_gb": math.nan}, "min_gpu_memory_gb"),
    ({"max_price_per_hour": 1e400}, "max_price_per_hour"),
    ({"autosnapshot_minutes": math.nan}, "autosnapshot_minutes"),
    ({"driver": "x" * 5000}, "driver"),
    ({"driver": "550\n54"}, "driver"),
    ({"gpus": ["H100"] * 1000}, "gpus"),
    ({"gpus": "H100"}, "gpus"),
    ({"regions": [""]}, "regions"),
])
def test_a_bad_setting_is_refused_naming_the_field_and_nothing_is_stored(ws: Workspace, change: dict[str, Any],
                                                                        named: str) -> None:
    update_settings(ws, hours=4)
    before = _raw_doc(ws, "settings")
    with pytest.raises(UsageError) as info:
        update_settings(ws, **change)
    message = info.value.one_line()
    assert f"setting {named} must be" in message and "\n" not in message
    assert _raw_doc(ws, "settings") == before
    assert load_settings(ws).hours == 4


def test_settings_are_stored_as_strict_json(ws: Workspace) -> None:
    update_settings(ws, hours=2.5, gpu_count=2, gpus=["H100", "A100"], budget_total=25, autosnapshot_minutes=0)
    raw = _raw_doc(ws, "settings")
    assert raw is not None
    doc = loads_strict(raw, "settings")
    assert doc["hours"] == 2.5 and doc["requirements"]["gpu_count"] == 2 and doc["budget"]["total"] == 25
    assert doc["autosnapshot_minutes"] == 0


def test_settings_poisoned_by_an_older_version_are_reported_and_repaired(ws: Workspace) -> None:
    _poison(ws, "settings", b'{"hours": NaN, "requirements": {"gpu_count": 0.5}, "budget": {}}')
    with pytest.raises(UsageError) as info:
        load_settings(ws)
    assert "setting hours must be" in str(info.value) and "jupyter portable settings" in info.value.one_line()
    # changing another field keeps naming the broken one: nothing half-written
    with pytest.raises(UsageError, match="setting hours must be"):
        update_settings(ws, driver="550.54.15")
    settings = update_settings(ws, hours=6, gpu_count=1)
    assert settings.hours == 6 and settings.requirements.gpu_count == 1
    assert load_settings(ws).hours == 6
    loads_strict(_raw_doc(ws, "settings") or b"", "settings")


def test_the_cli_refuses_nan_settings_in_one_line(ws: Workspace, cli: Any) -> None:
    proc = cli("settings", "--hours", "nan", cwd=ws.root, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: setting hours must be") and "Traceback" not in proc.stderr
    assert _raw_doc(ws, "settings") is None
    # nor is "nan" a driver version (issue 28): a pin no machine can ever match
    for driver in ("nan", "NaN", "inf", "latest", "550.54.15-nan"):
        proc = cli("settings", "--driver", driver, cwd=ws.root, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith("error: setting driver must be an exact driver "
                                                                "version such as 550.54.15"), proc.stderr
    assert _raw_doc(ws, "settings") is None
    assert cli.json("settings", "--driver", "550.54.15", cwd=ws.root)["requirements"]["driver"] == "550.54.15"


# -- reservations -------------------------------------------------------------------------------

@pytest.mark.parametrize("start", ["9999-12-31T23:00Z", "0001-01-01T00:00Z", "0001-01-01T00:30+01:00",
                                   "9999-12-31T23:00-05:00", "2027-11-04T10:00Z", "2026-11-03T09:00Z"])
def test_a_reservation_start_outside_the_next_year_is_refused(ws: Workspace, market: LocalMarket,
                                                              start: str) -> None:
    with pytest.raises(UsageError) as info:
        reserve(ws, "local/a100", start, 1, providers={"local": market}, now=NOW)
    assert "start" in str(info.value) or "in the past" in str(info.value) or "ahead" in str(info.value)
    assert "\n" not in info.value.one_line()
    assert _raw_doc(ws, "reservations") is None
    state = market.state_dir / "market.json"  # nothing was bought from the provider either
    assert not state.exists() or json.loads(state.read_text())["reservations"] == {}


def test_the_start_rule_in_core() -> None:
    key = "local/a100"
    assert "more than 365 days ahead" in (can_book(key, NOW + timedelta(days=366), 1, [], {}, now=NOW) or "")
    assert can_book(key, NOW + timedelta(days=364), 1, [], {}, now=NOW) is None
    far = Booking.new("res-far", key, NOW, 1, charge="before", guarantee="best-effort", price=1.0,
                      created=NOW).to_json()
    far.update(start="9999-12-31T23:00:00Z", charge_at="9999-12-31T21:00:00Z")
    with pytest.raises(UsageError, match="out of range"):
        Booking.from_json(far)


def _stored_bookings() -> list[Any]:
    good = Booking.new("res-good", "local/a100", NOW + timedelta(days=1), 2, charge="before",
                       guarantee="best-effort", price=3.0, created=NOW).to_json()
    far = dict(good, reservation_id="res-far", start="9999-12-31T23:00:00Z", charge_at="9999-12-31T21:00:00Z")
    return [good, far, {"reservation_id": "res-junk"}, 5]


def test_an_unreadable_stored_reservation_is_reported_and_skipped(ws: Workspace, market: LocalMarket,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    _poison(ws, "reservations", json.dumps(_stored_bookings()).encode())
    books, problems = read_reservations(ws)
    assert [b.reservation_id for b in books] == ["res-good"]
    assert len(problems) == 3 and all("skipped" in p for p in problems)
    assert "res-far" in problems[0] and "out of range" in problems[0]
    with caplog.at_level("WARNING"):
        assert [b.reservation_id for b in reservations(ws)] == ["res-good"]
    assert "res-far" in caplog.text
    grid = calendar(ws, 2, providers={"local": market}, now=NOW)
    assert any(s["mine"] == ["res-good"] for s in grid["offers"]["local/a100"]["slots"])
    # booking and cancelling go on, and keep the unreadable entries as they were
    booked = reserve(ws, "local/a100", "2026-11-05T10:00Z", 1, providers={"local": market}, now=NOW)
    cancelled = cancel_reservation(ws, "res-good", providers={"local": market}, now=NOW)
    assert cancelled.status == "cancelled"
    stored = loads_strict(_raw_doc(ws, "reservations") or b"", "reservations")
    assert [e.get("reservation_id") if isinstance(e, dict) else e for e in stored] == \
        ["res-good", "res-far", "res-junk", 5, booked.reservation_id]


def test_a_stored_reservation_that_is_not_json_is_dropped_on_the_next_write(ws: Workspace,
                                                                            market: LocalMarket) -> None:
    good = _stored_bookings()[0]
    _poison(ws, "reservations", b"[" + json.dumps(good).encode() + b', {"hours": NaN}]')
    books, problems = read_reservations(ws)
    assert [b.reservation_id for b in books] == ["res-good"] and len(problems) == 1
    reserve(ws, "local/a100", "2026-11-05T10:00Z", 1, providers={"local": market}, now=NOW)
    stored = loads_strict(_raw_doc(ws, "reservations") or b"", "reservations")
    assert [e["reservation_id"] for e in stored][0] == "res-good" and len(stored) == 2


def test_a_reservations_document_that_is_not_a_list_breaks_no_listing(ws: Workspace) -> None:
    _poison(ws, "reservations", b'{"res-1": {}}')
    books, problems = read_reservations(ws)
    assert books == [] and problems and "not a list" in problems[0]


# -- manifests ----------------------------------------------------------------------------------

def _publish_raw(ws: Workspace, mutate: Any, encode: Any = None, schema: int = 1) -> None:
    """Publish a hand-edited version 2 straight into the store, as an attacker could: the edit is
    made to the flat file list, stored as that list (schema 1) or as trees (schema 2)."""
    from test_hostile import _raw_trees

    store, wsid = ws.store, ws.workspace_id
    manifest = store.read_manifest(wsid)
    obj = manifest.to_json()
    for key in ("tree", "file_count", "total_bytes"):
        obj.pop(key, None)
    obj["schema"] = 1
    obj["files"] = [e.to_json() for e in manifest.files]
    head, token = store.read_head(wsid)
    obj["version"] = 2
    obj["parent"] = {"version": 1, "manifest": head.manifest}
    mutate(obj)
    if schema == 2:
        files = obj.pop("files")
        obj.update(schema=2, tree=_raw_trees(store, files), file_count=len(files),
                   total_bytes=sum(e["size"] for e in files if isinstance(e.get("size"), int) and e["size"] > 0))
    body = (encode or (lambda o: json.dumps(o).encode()))(obj)
    mhash = digest(body)
    store.backend.write(manifest_key(wsid, 2, mhash), body)
    store.backend.swap(head_key(wsid), Head(wsid, 2, mhash, head.epoch, now_iso()).to_bytes(), token)


def _set(field: str, value: Any) -> Any:
    def mutate(obj: dict) -> None:
        obj["files"][0][field] = value
    return mutate


def _duplicate_path(obj: dict) -> bytes:
    text = json.dumps(obj)
    assert text.count('"path": "ok.txt"') == 1
    return text.replace('"path": "ok.txt"', '"path": "../outside.txt", "path": "ok.txt"').encode()


@pytest.mark.parametrize(("mutate", "encode", "says", "schema"), [
    (_set("mtime_ns", 10**30), None, "mtime_ns of 'ok.txt'", 1),
    (_set("mtime_ns", -(10**30)), None, "mtime_ns of 'ok.txt'", 1),
    (_set("size", 10**15), None, "size of 'ok.txt' is 1000000000000000 bytes, over the store's limit", 1),
    (lambda o: None, _duplicate_path, "has the key 'path' twice", 1),
    (lambda o: o["allocations"].append({"allocation_id": "a-1", "spend": 1.0}),
     lambda o: json.dumps(o).replace('"spend": 1.0', '"spend": NaN').encode(), "NaN", 1),
    (_set("mtime_ns", 10**30), None, "ok.txt", 2),
    (_set("mtime_ns", -(10**30)), None, "ok.txt", 2),
    (_set("size", 10**15), None, "ok.txt", 2),
    (lambda o: o["allocations"].append({"allocation_id": "a-1", "spend": 1.0}),
     lambda o: json.dumps(o).replace('"spend": 1.0', '"spend": NaN').encode(), "NaN", 2),
], ids=["mtime-huge", "mtime-negative", "size-huge", "duplicate-key", "nan", "tree-mtime-huge",
        "tree-mtime-negative", "tree-size-huge", "tree-nan"])
def test_a_manifest_out_of_range_is_refused_in_one_line_naming_the_file(ws: Workspace, tmp_path: Path, cli: Any,
                                                                        mutate: Any, encode: Any,
                                                                        says: str, schema: int) -> None:
    _publish_raw(ws, mutate, encode, schema)
    dest = tmp_path / "dest"
    with pytest.raises(ManifestError) as info:
        Workspace.restore(ws.config.store, ws.workspace_id, dest, progress=None)
    assert says in str(info.value)
    proc = cli("restore", "--store", ws.config.store, "--workspace", ws.workspace_id, str(dest), check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert not (tmp_path / "outside.txt").exists()
    assert not list(dest.rglob("*")) if dest.exists() else True


def test_mtime_bounds_are_what_the_platform_can_set(tmp_path: Path) -> None:
    import os

    f = tmp_path / "f"
    f.write_bytes(b"")
    for ns in (MTIME_NS_MIN, MTIME_NS_MAX):
        os.utime(f, ns=(ns, ns))  # no OverflowError at either end
    for ns in (MTIME_NS_MIN - 1, MTIME_NS_MAX + 1):
        with pytest.raises(OverflowError):
            os.utime(f, ns=(ns, ns))


def test_heads_and_pack_indexes_refuse_duplicate_keys_and_nan() -> None:
    head = Head("abc-123", 1, "a" * 64, 0, "2026-11-03T10:00:00Z").to_bytes()
    assert Head.from_bytes(head).version == 1
    with pytest.raises(ManifestError, match="'version' twice"):
        Head.from_bytes(head.replace(b'"version": 1', b'"version": 9, "version": 1'))
    index = PackIndex("b" * 64, 10, (("c" * 64, 0, 10),)).to_bytes()
    assert PackIndex.from_bytes(index).size == 10
    with pytest.raises(ManifestError, match="'size' twice"):
        PackIndex.from_bytes(index.replace(b'"size":10', b'"size":99,"size":10'))
    with pytest.raises(ManifestError, match="Infinity"):
        PackIndex.from_bytes(index.replace(b'"size":10', b'"size":Infinity'))
    with pytest.raises(ManifestError, match=f"limit|<= {MAX_FILE_SIZE}"):
        PackIndex.from_bytes(index.replace(b'"size":10', b'"size":%d' % 10**18))


def test_records_are_written_without_nan() -> None:
    m = Manifest("abc-123", 1, "2026-11-03T10:00:00Z", (), allocations=({"allocation_id": "a", "spend": math.nan},))
    with pytest.raises(ManifestError, match="cannot be written as JSON"):
        m.to_bytes()
    lc = Lifecycle.new("abc-123", at="2026-11-03T10:00:00Z")
    assert Lifecycle.from_bytes(lc.to_bytes()) == lc
    with pytest.raises(ManifestError, match="'state' twice"):
        Lifecycle.from_bytes(lc.to_bytes().replace(b'"state": "IDLE"', b'"state": "ACTIVE", "state": "IDLE"'))


# -- the strict JSON reader -------------------------------------------------------------------

@pytest.mark.parametrize(("data", "says"), [
    (b'{"a": 1, "a": 2}', "has the key 'a' twice"),
    (b'[{"x": {"k": 1, "k": 1}}]', "has the key 'k' twice"),
    (b'{"a": NaN}', "holds NaN"),
    (b'[-Infinity]', "holds -Infinity"),
    (b'[1e400]', "too large for a float"),
    (b'[' * 100000 + b']' * 100000, "nested too deeply"),
    (b'[' * 100 + b']' * 100, "nested more than 64 levels"),
    (b'\xff\xfe', "is not valid JSON"),
    (b'{"a": ', "is not valid JSON"),
])
def test_the_strict_reader_refuses_what_other_readers_would_read_differently(data: bytes, says: str) -> None:
    with pytest.raises(ManifestError) as info:
        loads_strict(data, "the record")
    assert str(info.value).startswith("the record ") and says in str(info.value)


def test_the_strict_writer_refuses_nan() -> None:
    assert dumps_strict({"a": 1.5}, "x") == '{"a": 1.5}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ManifestError, match="x cannot be written as JSON"):
            dumps_strict({"a": [bad]}, "x")
