"""Property-based: every parser of what comes from the store or a request either accepts a
value that passes all the rules, or refuses it with one of our errors. It never crashes
with another exception, an accepted record can always be written back as strict JSON, and
every path an accepted manifest names lies inside the destination."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_portable.core.calendar import Booking
from jupyter_portable.core.errors import PortableError
from jupyter_portable.core.lifecycle import ACQUIRING, ROUTING, Lifecycle, transition
from jupyter_portable.core.manifest import FileEntry, Head, Manifest, PackIndex
from jupyter_portable.core.records import CheckpointRecord, check_allocation, check_next_action
from jupyter_portable.core.settings import FIELDS, Settings, apply_changes
from jupyter_portable.core.validate import dumps_strict, loads_strict

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
H = "a" * 64
DEST = "/dest"

# -- strategies ---------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.sampled_from([0, 1, -1, 2**63, 10**15, 10**30, 0.5, 1e308])
           | st.floats() | st.text(max_size=12))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=10)
segments = st.sampled_from(["a", "b.txt", ".", "..", "", ".portable", "~", " ", "a\\b", "x\x00", "..."])
hostile_paths = st.lists(segments, min_size=1, max_size=4).map("/".join) | st.sampled_from(
    ["/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", ".portable", "C:\\x"])


def _replace(base: dict[str, Any], keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some of ``keys`` given arbitrary values, removed, or an unknown field added."""
    def build(changes: dict[str, Any], drop: list[str], extra: dict[str, Any]) -> dict[str, Any]:
        out = {**base, **changes, **extra}
        for k in drop:
            out.pop(k, None)
        return out

    return st.builds(build, st.dictionaries(st.sampled_from(keys), json_values, max_size=3),
                     st.lists(st.sampled_from(keys), max_size=1),
                     st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=1)
                     | st.just({}))


def _refused_or_valid(parse: Callable[[Any], Any], value: Any) -> Any:
    """``parse(value)``, or None when it was refused with one of our errors (anything else fails)."""
    try:
        return parse(value)
    except PortableError as exc:
        assert str(exc).strip() and "\n" not in exc.one_line()
        return None


def _object_starts(text: str) -> list[int]:
    """Where an object with at least one key starts in JSON ``text``: not a ``{"`` inside a string."""
    spots, in_string, escaped = [], False, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif text.startswith('{"', i):
            spots.append(i)
    return spots


def _with_duplicates(obj: Any) -> st.SearchStrategy[bytes]:
    """The JSON text of ``obj``, sometimes with one key written twice (the first value differing)."""
    text = json.dumps(obj)

    def dup(i: int) -> bytes:
        spots = _object_starts(text)
        if not spots:
            return text.encode()
        p = spots[i % len(spots)] + 1
        end = json.decoder.scanstring(text, p + 1)[1]  # the key's closing quote, escapes included
        key = text[p:end]
        return (text[:p] + key + ': "other", ' + text[p:]).encode()

    return st.just(text.encode()) | st.integers(0, 50).map(dup)


# -- manifests ----------------------------------------------------------------------------------

def _valid_manifest() -> dict[str, Any]:
    return {"format": "jupyter-portable.manifest", "schema": 1, "workspace_id": "abc-123", "version": 1,
            "parent": None, "created": "2026-11-03T10:00:00Z", "message": "", "epoch": 0,
            "files": [{"path": "a.txt", "type": "file", "size": 3, "mode": 420, "hash": H, "mtime_ns": 1,
                       "pack": {"id": H, "offset": 0, "length": 3}},
                      {"path": "d/big", "type": "file", "size": 5, "mode": 420, "hash": H, "mtime_ns": 1,
                       "parts": [[H, 5]]},
                      {"path": "d/link", "type": "symlink", "target": "big"}],
            "checkpoints": [], "runtime": None, "next_action": None, "allocations": []}


file_keys = ["path", "type", "size", "mode", "hash", "mtime_ns", "pack", "parts", "target"]
hostile_entries = st.one_of(
    _replace(_valid_manifest()["files"][0], file_keys),
    _replace(_valid_manifest()["files"][1], file_keys),
    st.builds(lambda p, t: {"path": p, "type": "symlink", "target": t}, hostile_paths, hostile_paths),
    st.builds(lambda p: {**_valid_manifest()["files"][0], "path": p}, hostile_paths),
    json_values,
)
manifests = st.one_of(
    _replace(_valid_manifest(), list(_valid_manifest())),
    st.builds(lambda files: {**_valid_manifest(), "files": files}, st.lists(hostile_entries, max_size=4)),
    st.builds(lambda c, a, n: {**_valid_manifest(), "checkpoints": c, "allocations": a, "next_action": n},
              st.lists(json_values, max_size=2), st.lists(json_values, max_size=2), json_values),
)


def _inside(dest: str, rel: str) -> bool:
    full = posixpath.normpath(posixpath.join(dest, rel))
    return full.startswith(dest + "/") and not full.startswith(dest + "/.portable")


def _check_paths(m: Manifest) -> None:
    for f in m.files:
        assert _inside(DEST, f.path), f.path
        if f.target is not None:
            assert not f.target.startswith("/")
            assert _inside(DEST, posixpath.join(posixpath.dirname(f.path), f.target)), (f.path, f.target)


@SETTINGS
@given(manifests)
def test_a_manifest_object_is_refused_or_valid_and_stays_inside(obj: dict[str, Any]) -> None:
    m = _refused_or_valid(Manifest.from_json, obj)
    if m is not None:
        _check_paths(m)
        assert Manifest.from_bytes(m.to_bytes()) == m


@SETTINGS
@given(manifests.flatmap(_with_duplicates))
def test_manifest_bytes_are_refused_or_valid(data: bytes) -> None:
    m = _refused_or_valid(Manifest.from_bytes, data)
    if m is not None:
        _check_paths(m)
        assert loads_strict(m.to_bytes(), "manifest") == json.loads(data)


@SETTINGS
@given(hostile_entries)
def test_a_file_entry_is_refused_or_inside(obj: Any) -> None:
    entry = _refused_or_valid(FileEntry.from_json, obj)
    if entry is not None:
        assert _inside(DEST, entry.path)
        assert FileEntry.from_json(entry.to_json()) == entry


@SETTINGS
@given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_are_refused_or_read_as_a_head_index_or_manifest(data: bytes) -> None:
    for parse in (Head.from_bytes, PackIndex.from_bytes, Manifest.from_bytes):
        _refused_or_valid(parse, data)
    value = _refused_or_valid(lambda d: loads_strict(d, "x"), data)
    if value is not None:
        dumps_strict(value, "x")  # what the strict reader accepts, the strict writer can write


@SETTINGS
@given(_replace({"format": "jupyter-portable.head", "schema": 1, "workspace_id": "abc-123", "version": 1,
                 "manifest": H, "epoch": 0, "updated": "2026-11-03T10:00:00Z"},
                ["format", "schema", "workspace_id", "version", "manifest", "epoch", "updated"])
       .flatmap(_with_duplicates))
def test_head_bytes_are_refused_or_valid(data: bytes) -> None:
    head = _refused_or_valid(Head.from_bytes, data)
    if head is not None:
        assert Head.from_bytes(head.to_bytes()) == head


@SETTINGS
@given(_replace({"format": "jupyter-portable.packindex", "schema": 1, "pack": H, "size": 10,
                 "blobs": [[H, 0, 4], [H, 4, 6]]}, ["format", "schema", "pack", "size", "blobs"])
       .flatmap(_with_duplicates))
def test_pack_index_bytes_are_refused_or_valid(data: bytes) -> None:
    index = _refused_or_valid(PackIndex.from_bytes, data)
    if index is not None:
        assert all(off + n <= index.size for _, off, n in index.blobs)
        assert PackIndex.from_bytes(index.to_bytes()) == index


# -- the manifest's records ---------------------------------------------------------------------

@SETTINGS
@given(_replace({"id": 1, "path": "ckpt/model.pt", "status": "verified", "created": "2026-11-03T10:00:00Z",
                 "step": 10, "note": "", "reason": None, "format": "torch", "kind": "file", "hash": H,
                 "size": 10, "files": 1, "version": 2},
                ["id", "path", "status", "created", "step", "note", "reason", "format", "kind", "hash", "size",
                 "files", "version"]))
def test_a_checkpoint_record_is_refused_or_valid(obj: dict[str, Any]) -> None:
    rec = _refused_or_valid(CheckpointRecord.from_json, obj)
    if rec is not None:
        assert _inside(DEST, rec.path)
        assert CheckpointRecord.from_json(rec.to_json()) == rec


@SETTINGS
@given(_replace({"allocation_id": "a-1", "provider": "local", "spend": 1.5, "price_per_hour": 2, "epoch": 1,
                 "failures": []}, ["allocation_id", "provider", "spend", "price_per_hour", "epoch", "failures"]),
       _replace({"notebook": "nb.ipynb", "execution_count": 3, "state": "running"},
                ["notebook", "execution_count", "state", "text"]))
def test_allocation_and_next_action_records_are_refused_or_valid(alloc: dict[str, Any],
                                                                 action: dict[str, Any]) -> None:
    for check, obj in ((check_allocation, alloc), (check_next_action, action)):
        if _refused_or_valid(check, obj) is not None:
            dumps_strict(obj, "record")


def _lifecycle_json() -> dict[str, Any]:
    lc = Lifecycle.new("abc-123", at="2026-11-03T10:00:00Z", version=1)
    lc = transition(lc, ROUTING, at="2026-11-03T10:00:01Z")
    lc = transition(lc, ACQUIRING, at="2026-11-03T10:00:02Z", route="r-0123456789", allocation_id="a-1", epoch=1)
    return lc.to_json()


lifecycle_keys = list(_lifecycle_json())


@SETTINGS
@given(_replace(_lifecycle_json(), lifecycle_keys)
       | st.builds(lambda ev: {**_lifecycle_json(), "events": [_lifecycle_json()["events"][0], ev]},
                   _replace(_lifecycle_json()["events"][1], list(_lifecycle_json()["events"][1]))))
def test_a_lifecycle_record_is_refused_or_valid(obj: dict[str, Any]) -> None:
    lc = _refused_or_valid(Lifecycle.from_json, obj)
    if lc is not None:
        assert Lifecycle.from_bytes(lc.to_bytes()) == lc
    _refused_or_valid(Lifecycle.from_bytes, json.dumps(obj).encode())


# -- settings and bookings ----------------------------------------------------------------------

setting_values = json_values | st.sampled_from(["", "550.54.15", "12.4", "H100", ["H100"], ["us-east-1"], 0, 8,
                                                float("nan"), float("inf"), 0.5, 10**400 // 10**399])
changes = st.dictionaries(st.sampled_from([f.name for f in FIELDS]) | st.text(max_size=6), setting_values,
                          max_size=4)
settings_docs = st.one_of(
    json_values,
    _replace(Settings().to_json(), ["requirements", "budget", "hours", "autosnapshot_minutes"]),
    st.builds(lambda r, b: {**Settings().to_json(), "requirements": r, "budget": b},
              _replace(Settings().to_json()["requirements"], list(Settings().to_json()["requirements"])),
              _replace(Settings().to_json()["budget"], list(Settings().to_json()["budget"]))),
)


@SETTINGS
@given(settings_docs)
def test_a_settings_document_is_refused_or_valid(obj: Any) -> None:
    s = _refused_or_valid(Settings.from_json, obj)
    if s is not None:
        doc = json.loads(dumps_strict(s.to_json(), "settings"))
        assert Settings.from_json(doc) == s
        assert s.hours > 0 and s.requirements.gpu_count >= 0 and isinstance(s.requirements.gpu_count, int)


@SETTINGS
@given(settings_docs, changes)
def test_a_settings_change_is_refused_or_valid(current: Any, change: dict[str, Any]) -> None:
    s = _refused_or_valid(lambda c: apply_changes(current, c), change)
    if s is not None:
        assert Settings.from_json(json.loads(dumps_strict(s.to_json(), "settings"))) == s


def _booking_json() -> dict[str, Any]:
    return {"schema": 1, "reservation_id": "res-1", "offer_key": "local/a100", "start": "2026-11-04T09:00:00Z",
            "hours": 2, "charge": "before", "guarantee": "best-effort", "price": 3.0, "status": "booked",
            "created": "2026-11-03T10:00:00Z", "charge_at": "2026-11-04T07:00:00Z", "refund": None}


times = st.sampled_from(["9999-12-31T23:00:00Z", "0001-01-01T00:00:00Z", "0001-01-01T00:30:00+01:00",
                         "9999-12-31T23:00:00-05:00", "2026-11-04T09:00:00", "nope", "2026-11-04T09:00:00Z"])


@SETTINGS
@given(_replace(_booking_json(), list(_booking_json()))
       | st.builds(lambda s, c: {**_booking_json(), "start": s, "charge_at": c}, times, times))
def test_a_stored_booking_is_refused_or_valid(obj: dict[str, Any]) -> None:
    b = _refused_or_valid(Booking.from_json, obj)
    if b is not None:
        assert b.end > b.start  # no overflow left for a listing, the calendar or cancel to hit
        assert Booking.from_json(json.loads(dumps_strict(b.to_json(), "booking"))) == b


# -- tree encoding ------------------------------------------------------------------------------

tree_scalars = (st.integers(min_value=-(2**70), max_value=2**70) | st.booleans() | st.none()
                | st.text(max_size=6) | st.sampled_from([H, "é", "\udcff", "\x00", '"\\', 1.5, float("nan")]))
packed_files = st.fixed_dictionaries({
    "name": st.text(max_size=8) | st.sampled_from(["a\udc80b", "ü", "\x7f", '"', "\\", "\u2028"]),
    "type": st.sampled_from(["file", "file", "dir", "symlink"]),
    "size": tree_scalars, "mode": tree_scalars, "hash": tree_scalars, "mtime_ns": tree_scalars,
    "pack": st.fixed_dictionaries({"id": tree_scalars, "offset": tree_scalars, "length": tree_scalars})
    | tree_scalars})
dir_entries = st.fixed_dictionaries({"name": tree_scalars, "type": st.sampled_from(["dir", "file"]),
                                     "tree": tree_scalars})
names = st.text(max_size=8) | st.sampled_from(["a\udc80b", "ü", "\x7f", '"', "\\", "\u2028", "x\ud800"])
ints = st.integers(min_value=-(2**70), max_value=2**70)
sound_files = st.fixed_dictionaries({  # the encoder's own path: every value of the right type
    "name": names, "type": st.just("file"), "size": ints, "mode": ints, "hash": names, "mtime_ns": ints,
    "pack": st.fixed_dictionaries({"id": names, "offset": ints, "length": ints})})
sound_dirs = st.fixed_dictionaries({"name": names, "type": st.just("dir"), "tree": names})
tree_entries = sound_files | sound_dirs | packed_files | dir_entries | st.dictionaries(st.sampled_from(
    ["name", "type", "size", "hash", "parts", "target", "tree", "pack", "mode", "mtime_ns"]), tree_scalars, max_size=8)


@SETTINGS
@given(st.lists(tree_entries, max_size=4))
def test_a_tree_is_encoded_exactly_as_json_dumps_would(entries: list[dict[str, Any]]) -> None:
    """The tree encoder writes the common entries itself; every byte must be json.dumps's
    (a tree's hash is its name: one byte more and an unchanged folder is stored again)."""
    from jupyter_portable.core.tree_object import TREE_FORMAT, TREE_SCHEMA, encode_tree

    doc = {"format": TREE_FORMAT, "schema": TREE_SCHEMA, "entries": entries}
    try:
        want = json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except ValueError:
        want = None
    try:
        got = encode_tree(entries)
    except PortableError:
        got = None
    assert got == want


@SETTINGS
@given(sound_files)
def test_a_packed_entry_written_around_its_pack_ref_is_the_whole_entry(entry: dict[str, Any]) -> None:
    """A first snapshot's helper writes a packed file's entry before its pack is formed, and
    the walk puts the pack ref in between: the same bytes as json.dumps of the whole entry."""
    from jupyter_portable.core.tree_object import pack_ref_text, packed_text

    ref = entry["pack"]
    head, tail = packed_text(entry["name"], entry["hash"], entry["mode"], entry["mtime_ns"], entry["size"])
    got = head + pack_ref_text(ref["id"], ref["offset"], ref["length"]) + tail
    assert got == json.dumps(entry, separators=(",", ":"), sort_keys=True)
