"""``docs/store-format.md`` is true and sufficient.

* Every ```json example in the document passes the package's own validators (routed by
  its ``format`` field), and each main record appears at least once.
* The worked example is one consistent store: the head names the manifest by the hash of
  its bytes, the pack indexes hold the blobs the manifest points at, the stated file
  contents hash to the stated hashes.
* A workspace written by the package is read back, byte for byte, by a reader that uses
  only the documented layout with ``json``, ``blake3`` and plain file reads; the Python
  and shell readers printed in the document do the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import blake3
import pytest

from jupyter_portable.core.manifest import FileEntry, Head, Manifest, PackIndex
from jupyter_portable.core.tree_object import parse_tree
from jupyter_portable.store.repo import Store
from jupyter_portable.workdir.workcopy import CopyConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "store-format.md"

MANIFEST = "jupyter-portable.manifest"
HEAD = "jupyter-portable.head"
PACKINDEX = "jupyter-portable.packindex"
TREE = "jupyter-portable.tree"
WORKSPACE = "jupyter-portable.workspace"
STORE = "jupyter-portable.store"

HEX64 = r"[0-9a-f]{64}"
WSID = r"[a-z0-9][a-z0-9-]{2,63}"


def b3(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def fenced_blocks(lang: str) -> list[str]:
    """The bodies of every fenced block whose info string is ``lang`` (indented ones too)."""
    out: list[str] = []
    current: list[str] | None = None
    indent = ""
    info = ""
    for line in doc_text().splitlines():
        stripped = line.lstrip()
        if current is None:
            if stripped.startswith("```"):
                info = stripped[3:].strip()
                indent = line[: len(line) - len(stripped)]
                current = []
        elif stripped.startswith("```") and stripped.strip() == "```":
            if info == lang:
                out.append(textwrap.dedent("\n".join(current)))
            current = None
        else:
            current.append(line[len(indent):] if line.startswith(indent) else line)
    assert current is None, "docs/store-format.md has an unclosed code fence"
    return out


# -- 1. every JSON example is valid -------------------------------------------------------


def classify(raw: str) -> str:
    """Validate one ```json example with the package's own code; return what it is."""
    obj = json.loads(raw)
    assert isinstance(obj, dict), f"a JSON example is not an object: {raw[:80]}"
    data = raw.encode()
    fmt = obj.get("format")
    if fmt == MANIFEST:
        Manifest.from_bytes(data)
        return "manifest"
    if fmt == HEAD:
        Head.from_bytes(data)
        return "head"
    if fmt == PACKINDEX:
        PackIndex.from_bytes(data)
        return "packindex"
    if fmt == TREE:
        parse_tree(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode(), "", FileEntry.from_json)
        return "tree"
    if fmt == WORKSPACE:
        CopyConfig.from_bytes(data, Path(".portable/workspace.json"))
        return "workspace"
    if fmt == STORE:
        Store.check_config(data)
        return "store"
    if fmt is not None:
        pytest.fail(f"JSON example has unknown format {fmt!r}: {raw[:80]}")
    # Fragments and local-only files have no "format".
    if "path" in obj:
        FileEntry.from_json(obj)
        return "entry"
    if set(obj) == {"version", "files"}:  # .portable/pending.json
        assert isinstance(obj["version"], int) and obj["version"] >= 1
        assert obj["files"], "an empty pending.json example shows nothing"
        for entry in obj["files"]:
            FileEntry.from_json(entry)
        return "pending"
    pytest.fail(f"JSON example without a format that no validator knows: {raw[:80]}")


def test_every_json_example_is_valid() -> None:
    blocks = fenced_blocks("json")
    kinds = [classify(raw) for raw in blocks]
    for needed in ("store", "manifest", "head", "packindex", "workspace", "entry", "tree"):
        assert needed in kinds, f"docs/store-format.md has no {needed} example"
    # Both kinds of regular file and a symlink are shown as fragments.
    entries = [FileEntry.from_json(json.loads(r)) for r, k in zip(blocks, kinds, strict=True) if k == "entry"]
    assert any(e.pack is not None for e in entries)
    assert any(e.parts for e in entries)
    assert any(e.is_link for e in entries)
    # A fresh head (version 0) and a head with a manifest are both shown.
    heads = [Head.from_bytes(r.encode()) for r, k in zip(blocks, kinds, strict=True) if k == "head"]
    assert {h.version == 0 for h in heads} == {True, False}


def test_validators_refuse_what_the_document_forbids() -> None:
    """A few rules of section 5, checked against the package (the doc says 'MUST refuse')."""
    from jupyter_portable.core.errors import ManifestError

    manifest = next(json.loads(r) for r in fenced_blocks("json") if MANIFEST in r)
    bad_paths = ["", "/etc/passwd", "a/../b", "./a", "a//b", "a/", ".portable/x", "a\\b", "a\x00b"]
    for path in bad_paths:
        m = json.loads(json.dumps(manifest))
        m["files"][0]["path"] = path
        with pytest.raises(ManifestError):
            Manifest.from_json(m)
    for target in ["/etc", "..", "../x", ".", "a/../../x", ".portable/workspace.json"]:
        m = json.loads(json.dumps(manifest))
        m["files"][3]["target"] = target
        with pytest.raises(ManifestError):
            Manifest.from_json(m)
    for mutate in (
        lambda m: m.update(schema=2),                                   # unknown schema
        lambda m: m.update(format="jupyter-portable.manifest2"),        # unknown format
        lambda m: m.update(surprise=1),                                 # unknown field
        lambda m: m["files"].append(dict(m["files"][0])),               # duplicate path
        lambda m: m["files"].append({"path": "model.ckpt/x", "type": "symlink",
                                     "target": "../src"}),               # under another entry
        lambda m: m["files"][0].update(size=105),                       # pack length != size
        lambda m: m["files"][4].update(size=20971521),                  # parts don't add up
        lambda m: m["files"][0].update(mode=0o10000),                   # mode out of range
        lambda m: m["files"][0].update(size=True),                      # bool is no integer
        lambda m: m["parent"].update(version=2),                        # parent not older
        lambda m: m["files"][0].update(type="fifo"),                    # unknown type
        lambda m: m["files"][0]["pack"].update(id="A" * 64),            # not lowercase hex
    ):
        m = json.loads(json.dumps(manifest))
        mutate(m)
        with pytest.raises(ManifestError):
            Manifest.from_json(m)


# -- 2. the worked example is one consistent store ---------------------------------------


def _examples() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for raw in fenced_blocks("json"):
        out.setdefault(classify(raw), []).append(json.loads(raw))
    return out


def test_worked_example_is_consistent() -> None:
    text = doc_text()
    ex = _examples()
    [manifest] = [m for m in ex["manifest"] if m["schema"] == 1]
    ws = manifest["workspace_id"]
    stored = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    mhash = b3(stored)
    [head] = [h for h in ex["head"] if h["version"]]
    assert head["manifest"] == mhash, "the head example does not name the manifest example"
    assert head["version"] == manifest["version"] and head["workspace_id"] == ws
    assert head["epoch"] >= manifest["epoch"]
    key = f"workspaces/{ws}/manifests/{manifest['version']:010d}-{mhash}.json"
    assert key in text, "the manifest example's key is not in the layout listing"
    assert f"{len(stored)} bytes" in text
    assert mhash in text.split("#### A whole manifest", 1)[1].split("```json", 1)[0]
    parent = manifest["parent"]
    assert f"workspaces/{ws}/manifests/{parent['version']:010d}-{parent['manifest']}.json" in text

    # Every pack reference is where the pack index says, and indexes are contiguous.
    indexes = {i["pack"]: i for i in ex["packindex"]}
    by_path = {e["path"]: e for e in manifest["files"]}
    for e in manifest["files"]:
        if "pack" in e:
            ref = e["pack"]
            assert ref["id"] in indexes, f"no pack index example for {e['path']}"
            assert [e["hash"], ref["offset"], ref["length"]] in indexes[ref["id"]]["blobs"]
            assert f"objects/{ref['id'][:2]}/{ref['id']}" in text
        for h, _n in e.get("parts", []):
            assert f"objects/{h[:2]}/{h}" in text
    for pack, index in indexes.items():
        off = 0
        for _h, o, n in index["blobs"]:
            assert o == off
            off += n
        assert off == index["size"]
        assert f"index/{pack[:2]}/{pack}.json" in text
    # Fragments and local files repeat the manifest's entries exactly.
    for e in ex["entry"]:
        assert by_path[e["path"]] == e
    for pending in ex.get("pending", []):
        for e in pending["files"]:
            assert by_path[e["path"]] == e
    for cfg in ex["workspace"]:
        assert cfg["workspace_id"] == ws and cfg["version"] == head["version"]
        assert cfg["epoch"] == head["epoch"]

    # The contents the document states really hash to the stated hashes.
    nb1 = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n'
    nb2 = (b'{"cells": [{"cell_type": "code", "source": "1+1"}], "metadata": {}, '
           b'"nbformat": 4, "nbformat_minor": 5}\n')
    csv = b"x,y\n1,2\n3,4\n"
    util = b"def square(x):\n    return x * x\n"
    for content in (nb1, nb2, csv, util):
        assert content.decode().replace("\n", "\\n") in text
    assert by_path["data/train.csv"]["hash"] == b3(csv)
    assert by_path["src/util.py"]["hash"] == b3(util)
    assert by_path["analysis.ipynb"]["hash"] == b3(nb2)
    assert by_path["data/.keep"]["hash"] == b3(b"")
    old_pack = indexes[by_path["data/train.csv"]["pack"]["id"]]
    assert old_pack["pack"] == b3(nb1 + csv + util), "a pack is the plain concatenation"
    assert old_pack["blobs"][0] == [b3(nb1), 0, len(nb1)]
    assert indexes[by_path["analysis.ipynb"]["pack"]["id"]]["pack"] == b3(nb2)
    model = by_path["model.ckpt"]
    zeros = bytes(model["size"])
    assert model["hash"] == b3(zeros)
    off = 0
    for h, n in model["parts"]:
        assert h == b3(zeros[off:off + n])
        off += n
    assert model["parts"][0][1] == 16 * 1024 * 1024

    # Section 4.7: the format-2 manifest names the root tree by the hash of its stored bytes,
    # the root names data/'s tree the same way, and their entries are the worked example's.
    [m2] = [m for m in ex["manifest"] if m["schema"] == 2]
    assert m2["workspace_id"] == ws and m2["parent"] == {"version": 2, "manifest": mhash}
    trees = {}
    for t in ex["tree"]:
        body = json.dumps(t, sort_keys=True, separators=(",", ":")).encode()
        assert f"{len(body)} bytes with BLAKE3 `{b3(body)}`" in text.replace("\n", " ")
        trees[b3(body)] = t
    root = trees[m2["tree"]]
    [data] = [e for e in root["entries"] if e["name"] == "data"]
    sub = trees[data["tree"]]
    flat = [{**{k: v for k, v in e.items() if k != "name"}, "path": "data/" + e["name"]} for e in sub["entries"]]
    flat += [{**{k: v for k, v in e.items() if k != "name"}, "path": e["name"]}
             for e in root["entries"] if e["type"] != "dir"]
    for e in flat:
        assert by_path[e["path"]] == e
    assert m2["file_count"] == len(flat) and m2["total_bytes"] == sum(e.get("size", 0) for e in flat)


def test_documented_constants_match_the_code() -> None:
    from jupyter_portable.engine.snapshot import PACK_TARGET, PART_SIZE, SMALL_MAX

    text = doc_text()
    assert SMALL_MAX == 512 * 1024 and "512 KiB (524288 bytes)" in text
    assert PART_SIZE == 16 * 1024 * 1024 and "16 MiB (16777216 bytes)" in text
    assert PACK_TARGET == 8 * 1024 * 1024 and "8 MiB (8388608 bytes)" in text


# -- 3. a real workspace, read back with nothing but the document -------------------------


def _write(root: Path, rel: str, data: bytes, mode: int | None = None) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A workspace with two versions, made by the package; only its creation uses it."""
    from jupyter_portable import Workspace

    base = tmp_path_factory.mktemp("storefmt")
    store_dir = base / "store"
    root = base / "ws"
    w = Workspace.init(root, store="file://" + str(store_dir))
    small_max, part = 512 * 1024, 16 * 1024 * 1024
    rnd = os.urandom
    _write(root, "notebook.ipynb", b'{"cells": [], "nbformat": 4}\n')
    _write(root, "data/train.csv", b"x,y\n1,2\n")
    _write(root, "data/deep/nested/x.txt", b"deep\n")
    _write(root, "empty.txt", b"")
    _write(root, "bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    _write(root, "readonly.txt", b"do not touch\n", 0o444)
    _write(root, "dup_a.txt", b"same bytes\n")
    _write(root, "dup_b.txt", b"same bytes\n")
    _write(root, "caf\u00e9 na\u00efve \u00fc.txt", b"non-ASCII name\n")
    _write(root, "just_small.bin", rnd(small_max - 1))
    _write(root, "boundary.bin", rnd(small_max))
    _write(root, "big.bin", rnd(part + 12345))
    for i in range(20):  # more than one pack's worth of small files
        _write(root, f"shards/s{i:02d}.bin", rnd(500 * 1024))
    os.symlink("data/train.csv", root / "link_to_csv")
    os.symlink("../../notebook.ipynb", root / "data/deep/up")
    os.utime(root / "data/train.csv", ns=(1_600_000_000_123_456_789,) * 2)
    r1 = w.snapshot("one", progress=None)
    assert r1.version == 1
    _write(root, "notebook.ipynb", b'{"cells": [{"source": "1+1"}], "nbformat": 4}\n')
    os.unlink(root / "dup_b.txt")
    _write(root, "new.txt", b"added in version 2\n")
    r2 = w.snapshot("two", progress=None)
    assert r2.version == 2
    return {"store": store_dir, "root": root, "ws": w.workspace_id}


def _tree(root: Path) -> dict[str, tuple[str, Any, int | None]]:
    """``path -> ("file", bytes, mode) | ("link", target, None)``, without ``.portable``."""
    out: dict[str, tuple[str, Any, int | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if rel_dir == ".":
            rel_dir = ""
            dirnames[:] = [d for d in dirnames if d != ".portable"]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                out[rel] = ("link", os.readlink(full), None)
            else:
                with open(full, "rb") as fh:
                    out[rel] = ("file", fh.read(), os.lstat(full).st_mode & 0o7777)
    return out


class DocReader:
    """Reads a ``file://`` store with the documented layout only: json, blake3, open()."""

    def __init__(self, store: Path) -> None:
        self.store = store

    def read(self, key: str) -> bytes:
        with open(os.path.join(self.store, *key.split("/")), "rb") as fh:
            return fh.read()

    def obj(self, h: str) -> bytes:
        data = self.read(f"objects/{h[:2]}/{h}")
        assert b3(data) == h, f"object {h} does not hash to its name"
        return data

    def head(self, ws: str) -> dict[str, Any]:
        head = json.loads(self.read(f"workspaces/{ws}/HEAD"))
        assert set(head) == {"format", "schema", "workspace_id", "version", "manifest", "epoch", "updated"}
        assert (head["format"], head["schema"]) == (HEAD, 1)
        assert head["workspace_id"] == ws
        return head

    def manifest(self, ws: str, version: int, mhash: str) -> dict[str, Any]:
        raw = self.read(f"workspaces/{ws}/manifests/{version:010d}-{mhash}.json")
        assert b3(raw) == mhash, "manifest does not hash to its name"
        man = json.loads(raw)
        assert man["format"] == MANIFEST and man["schema"] in (1, 2)
        records = {"format", "schema", "workspace_id", "version", "parent", "created", "message", "epoch",
                   "checkpoints", "runtime", "next_action", "allocations"}
        assert set(man) == records | ({"files"} if man["schema"] == 1 else {"tree", "file_count", "total_bytes"})
        assert man["workspace_id"] == ws and man["version"] == version
        return man

    def files(self, man: dict[str, Any]) -> list[dict[str, Any]]:
        """Section 4.7: a manifest's entries (schema 1's list, or every tree walked) with their paths."""
        if man["schema"] == 1:
            return list(man["files"])
        out: list[dict[str, Any]] = []

        def walk(h: str, prefix: str) -> None:
            tree = json.loads(self.obj(h))
            assert set(tree) == {"format", "schema", "entries"} and (tree["format"], tree["schema"]) == (TREE, 2)
            keys = [e["name"] + "/" if e["type"] == "dir" else e["name"] for e in tree["entries"]]
            assert keys == sorted(keys) and len(set(keys)) == len(keys), "tree entries in git's order, once each"
            for e in tree["entries"]:
                if e["type"] == "dir":
                    assert set(e) == {"name", "type", "tree"}
                    walk(e["tree"], prefix + e["name"] + "/")
                else:
                    out.append({**{k: v for k, v in e.items() if k != "name"}, "path": prefix + e["name"]})

        walk(man["tree"], "")
        assert len(out) == man["file_count"] and sum(e.get("size", 0) for e in out) == man["total_bytes"]
        return out

    def content(self, e: dict[str, Any]) -> bytes:
        if "pack" in e:
            assert set(e) == {"path", "type", "size", "mode", "hash", "mtime_ns", "pack"}
            ref = e["pack"]
            data = self.read(f"objects/{ref['id'][:2]}/{ref['id']}")[ref["offset"]:ref["offset"] + ref["length"]]
        else:
            assert set(e) == {"path", "type", "size", "mode", "hash", "mtime_ns", "parts"}
            chunks = []
            for h, n in e["parts"]:
                part = self.obj(h)
                assert len(part) == n
                chunks.append(part)
            data = b"".join(chunks)
        assert len(data) == e["size"] and b3(data) == e["hash"], f"{e['path']}: hash mismatch"
        return data


def test_workspace_reads_back_with_only_the_document(real_store: dict[str, Any], tmp_path: Path) -> None:
    store, root, ws = real_store["store"], real_store["root"], real_store["ws"]
    reader = DocReader(store)

    # Section 2: every file in the store is a documented key, a temp file or a lock.
    patterns = [
        r"config\.json",
        rf"objects/(?P<a>[0-9a-f]{{2}})/(?P<h>{HEX64})",
        rf"index/(?P<a>[0-9a-f]{{2}})/(?P<h>{HEX64})\.json",
        rf"workspaces/{WSID}/HEAD",
        rf"workspaces/{WSID}/manifests/[0-9]{{10}}-{HEX64}\.json",
    ]
    keys: list[str] = []
    for dirpath, _dirs, files in os.walk(store):
        for name in files:
            key = os.path.relpath(os.path.join(dirpath, name), store).replace(os.sep, "/")
            if name.startswith(".tmp-"):
                continue
            if name.endswith(".lock"):
                assert key == f"workspaces/{ws}/HEAD.lock"
                continue
            m = next((re.fullmatch(p, key) for p in patterns if re.fullmatch(p, key)), None)
            assert m is not None, f"undocumented key in the store: {key}"
            if m.groupdict().get("h"):
                assert m["h"][:2] == m["a"]
            keys.append(key)

    # Section 4.1 / 4.6.
    assert json.loads(reader.read("config.json")) == {"format": STORE, "schema": 1}
    cfg = json.loads((root / ".portable" / "workspace.json").read_bytes())
    assert set(cfg) == {"format", "schema", "workspace_id", "store", "version", "epoch"}
    assert (cfg["format"], cfg["schema"], cfg["workspace_id"]) == (WORKSPACE, 1, ws)
    assert cfg["store"] == "file://" + str(store)

    # Section 3: every object is named by the hash of its bytes.
    objects = {k.rsplit("/", 1)[1] for k in keys if k.startswith("objects/")}
    for h in objects:
        reader.obj(h)

    # Section 4.3: pack indexes describe their packs.
    indexes: dict[str, dict[str, Any]] = {}
    for k in keys:
        if k.startswith("index/"):
            p = k.rsplit("/", 1)[1][:-len(".json")]
            index = json.loads(reader.read(k))
            assert set(index) == {"format", "schema", "pack", "size", "blobs"}
            assert (index["format"], index["schema"], index["pack"]) == (PACKINDEX, 1, p)
            body = reader.obj(p)
            assert len(body) == index["size"]
            assert b"".join(body[o:o + n] for _h, o, n in index["blobs"]) == body
            for h, o, n in index["blobs"]:
                assert b3(body[o:o + n]) == h
            indexes[p] = index
    assert len(indexes) >= 2, "the fixture should have made more than one pack"

    # Sections 6.2 and 8: head -> manifest -> parent chain.
    head = reader.head(ws)
    assert head["version"] == cfg["version"] == 2 and head["epoch"] == cfg["epoch"]
    chain = []
    version, mhash = head["version"], head["manifest"]
    while True:
        man = reader.manifest(ws, version, mhash)
        chain.append(man)
        if man["parent"] is None:
            break
        assert man["parent"]["version"] == version - 1
        version, mhash = man["parent"]["version"], man["parent"]["manifest"]
    assert [m["version"] for m in chain] == [2, 1]
    assert [m["message"] for m in chain] == ["two", "one"]
    manifest_keys = {k for k in keys if "/manifests/" in k}
    assert len(manifest_keys) == 2  # no orphans here

    # Every entry's bytes, mode, mtime and symlink target equal the workspace's.
    latest = chain[0]
    assert latest["schema"] == 2
    expected = _tree(root)
    latest_files = reader.files(latest)
    files = {e["path"]: e for e in latest_files}
    assert sorted(files) == sorted(expected)
    assert [e["path"] for e in latest_files] == sorted(files)
    dest = tmp_path / "restored"
    for path, e in files.items():
        kind, value, mode = expected[path]
        if e["type"] == "symlink":
            assert set(e) == {"path", "type", "target"}
            assert kind == "link" and e["target"] == value
            continue
        assert e["type"] == "file" and kind == "file"
        data = reader.content(e)
        assert data == value, f"{path}: reconstructed bytes differ"
        assert e["mode"] == mode
        assert e["mtime_ns"] == os.lstat(root / path).st_mtime_ns
        if "pack" in e:
            assert 0 < e["size"] < 512 * 1024
            assert [e["hash"], e["pack"]["offset"], e["pack"]["length"]] in indexes[e["pack"]["id"]]["blobs"]
        else:
            assert e["size"] == 0 or e["size"] >= 512 * 1024
            assert all(n == 16 * 1024 * 1024 for _h, n in e["parts"][:-1])
        out = dest / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    assert files["data/train.csv"]["mtime_ns"] == 1_600_000_000_123_456_789
    assert len(files["big.bin"]["parts"]) == 2
    assert files["empty.txt"]["parts"] == [] and files["empty.txt"]["hash"] == b3(b"")
    # Equal content is stored once: both copies point at the same bytes of the same pack.
    v1 = {e["path"]: e for e in reader.files(chain[1])}
    assert v1["dup_a.txt"]["pack"] == v1["dup_b.txt"]["pack"]
    # The older version is reachable and readable too, with the file removed since.
    old = {e["path"]: e for e in reader.files(chain[1])}
    assert "dup_b.txt" in old and "new.txt" not in old
    assert reader.content(old["dup_b.txt"]) == b"same bytes\n"
    assert reader.content(old["notebook.ipynb"]) == b'{"cells": [], "nbformat": 4}\n'


def _doc_python_reader() -> dict[str, Any]:
    [code] = fenced_blocks("python")
    namespace: dict[str, Any] = {"__name__": "store_format_doc_reader"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own document
    return namespace


def test_python_reader_in_the_document_restores_a_real_workspace(
        real_store: dict[str, Any], tmp_path: Path) -> None:
    ns = _doc_python_reader()
    dest = tmp_path / "restored"
    man = ns["read_workspace"](str(real_store["store"]), real_store["ws"], str(dest))
    assert man["version"] == 2
    got, want = _tree(dest), _tree(real_store["root"])
    assert got.keys() == want.keys()
    for path, (kind, value, mode) in want.items():
        assert got[path][:2] == (kind, value), path
        if kind == "file":
            assert got[path][2] == mode & 0o777, path


def _hostile_store(base: Path, files: list[dict[str, Any]]) -> tuple[str, str]:
    """A store written by hand from the document: config, one manifest, its head."""
    ws = "ws-hostile"
    store = base / "store"
    (store / "workspaces" / ws / "manifests").mkdir(parents=True)
    (store / "config.json").write_text(json.dumps({"format": STORE, "schema": 1}))
    manifest = {"format": MANIFEST, "schema": 1, "workspace_id": ws, "version": 1, "parent": None,
                "created": "2025-01-01T00:00:00.000Z", "message": "", "epoch": 0, "files": files,
                "checkpoints": [], "runtime": None, "next_action": None, "allocations": []}
    body = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    mhash = b3(body)
    (store / "workspaces" / ws / "manifests" / f"{1:010d}-{mhash}.json").write_bytes(body)
    head = {"format": HEAD, "schema": 1, "workspace_id": ws, "version": 1, "manifest": mhash,
            "epoch": 0, "updated": "2025-01-01T00:00:00.000Z"}
    (store / "workspaces" / ws / "HEAD").write_text(json.dumps(head))
    Store.open("file://" + str(store)).read_manifest(ws)  # the package agrees it is well-formed
    return str(store), ws


@pytest.mark.parametrize("files", [
    # Each target is lexically inside, but `a` goes through `p/L` (-> ../q) and out.
    [{"path": "a", "type": "symlink", "target": "p/L/../../escaped"},
     {"path": "p/L", "type": "symlink", "target": "../q"},
     {"path": "q/keep", "type": "file", "size": 0, "mode": 0o644,
      "hash": b3(b""), "mtime_ns": 0, "parts": []}],
], ids=["symlink-chain"])
def test_python_reader_in_the_document_refuses_an_escaping_symlink_chain(
        files: list[dict[str, Any]], tmp_path: Path) -> None:
    store, ws = _hostile_store(tmp_path, files)
    ns = _doc_python_reader()
    dest = tmp_path / "out" / "inner"
    with pytest.raises(ValueError, match="leads outside"):
        ns["read_workspace"](store, ws, str(dest))
    assert not os.path.lexists(dest / "a")
    assert not (tmp_path / "out" / "escaped").exists()


@pytest.mark.parametrize("bad", ["../x", "/abs", ".portable/workspace.json", "a//b"])
def test_python_reader_in_the_document_refuses_bad_paths(bad: str, tmp_path: Path) -> None:
    ws = "ws-hostile"
    store = tmp_path / "store"
    (store / "workspaces" / ws / "manifests").mkdir(parents=True)
    (store / "config.json").write_text(json.dumps({"format": STORE, "schema": 1}))
    manifest = {"format": MANIFEST, "schema": 1, "workspace_id": ws, "version": 1, "parent": None,
                "created": "", "message": "", "epoch": 0, "checkpoints": [], "runtime": None,
                "next_action": None, "allocations": [],
                "files": [{"path": bad, "type": "file", "size": 0, "mode": 0o644,
                           "hash": b3(b""), "mtime_ns": 0, "parts": []}]}
    body = json.dumps(manifest).encode()
    (store / "workspaces" / ws / "manifests" / f"{1:010d}-{b3(body)}.json").write_bytes(body)
    (store / "workspaces" / ws / "HEAD").write_text(json.dumps(
        {"format": HEAD, "schema": 1, "workspace_id": ws, "version": 1, "manifest": b3(body),
         "epoch": 0, "updated": ""}))
    ns = _doc_python_reader()
    with pytest.raises(ValueError, match="unsafe path"):
        ns["read_workspace"](str(store), ws, str(tmp_path / "dest"))
    assert not (tmp_path / "x").exists()


def _run_shell_recipe(store: Path, ws: str, dest: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run section 8.2's script on ``store`` (a stand-in ``b3sum`` if the real one is absent)."""
    if not (shutil.which("bash") and shutil.which("jq") and shutil.which("dd")):
        pytest.skip("bash, jq and dd are needed to run the document's shell recipe")
    [script] = [s for s in fenced_blocks("bash") if "STORE=" in s]
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    if not shutil.which("b3sum"):  # stand in for the reference tool: same output
        shim = bindir / "b3sum"
        shim.write_text(textwrap.dedent(f"""\
            #!{sys.executable}
            import sys, blake3
            args = [a for a in sys.argv[1:] if a != "--no-names"]
            for name in args or ["-"]:
                data = sys.stdin.buffer.read() if name == "-" else open(name, "rb").read()
                h = blake3.blake3(data).hexdigest()
                print(h if "--no-names" in sys.argv else f"{{h}}  {{name}}")
            """))
        shim.chmod(0o755)
    script = re.sub(r"^STORE=.*$", f"STORE={store}; WS={ws}; DEST={dest}", script, count=1, flags=re.M)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)


def test_shell_recipe_in_the_document_restores_a_real_workspace(
        real_store: dict[str, Any], tmp_path: Path) -> None:
    dest = tmp_path / "restored"
    run = _run_shell_recipe(real_store["store"], real_store["ws"], dest, tmp_path)
    assert run.returncode == 0, run.stderr
    got, want = _tree(dest), _tree(real_store["root"])
    assert got.keys() == want.keys()
    for path, (kind, value, mode) in want.items():
        assert got[path][:2] == (kind, value), path
        if kind == "file":
            assert got[path][2] == mode, path
            assert stat.S_ISREG(os.lstat(dest / path).st_mode)


def _corrupt_copy(real_store: dict[str, Any], base: Path, path: str) -> Path:
    """A copy of the store in which one byte of the object holding ``path`` is flipped."""
    store = base / "store"
    shutil.copytree(real_store["store"], store)
    reader = DocReader(store)
    head = reader.head(real_store["ws"])
    man = reader.manifest(real_store["ws"], head["version"], head["manifest"])
    [e] = [e for e in reader.files(man) if e["path"] == path]
    h, at = (e["pack"]["id"], e["pack"]["offset"]) if "pack" in e else (e["parts"][-1][0], 7)
    obj = store / "objects" / h[:2] / h
    data = bytearray(obj.read_bytes())
    data[at] ^= 0x01
    obj.chmod(0o644)
    obj.write_bytes(bytes(data))
    return store


@pytest.mark.parametrize("path", ["data/train.csv", "big.bin"])
def test_readers_in_the_document_refuse_flipped_bytes(
        path: str, real_store: dict[str, Any], tmp_path: Path) -> None:
    store = _corrupt_copy(real_store, tmp_path, path)
    ns = _doc_python_reader()
    dest = tmp_path / "py"
    with pytest.raises(ValueError, match="hash mismatch|is corrupt"):
        ns["read_workspace"](str(store), real_store["ws"], str(dest))
    assert not (dest / path).exists(), "a file that failed its hash check was put in place"
    if shutil.which("bash") and shutil.which("jq") and shutil.which("dd"):
        dest = tmp_path / "sh"
        run = _run_shell_recipe(store, real_store["ws"], dest, tmp_path)
        assert run.returncode != 0 and "error:" in run.stderr
        assert not (dest / path).exists()


def _edge_workspace(base: Path, *, odd_names: bool) -> tuple[Path, Path, str]:
    """A workspace written by the package whose files could trip a reader: names like its
    temp files, (optionally) a name that is not UTF-8 and mtimes far from now."""
    from jupyter_portable import Workspace

    root, store = base / "edge-src", base / "edge-store"
    files = {".restore-tmp": b"top-level temp name\n", "a": b"a\n", "a.restore-tmp": b"beside a\n",
             "d/.restore-x": b"temp prefix\n", "d/x": b"x\n", "d/x.restore-tmp": b"x tmp\n"}
    for rel, data in files.items():
        _write(root, rel, data)
    if odd_names:
        os.makedirs(os.fsencode(root / "latin"), exist_ok=True)
        with open(os.fsencode(root / "latin") + b"/caf\xe9.txt", "wb") as fh:
            fh.write(b"latin-1 name\n")
        os.utime(root / "a", ns=(2**62, 2**62))  # year 2116
        os.utime(root / "d" / "x", ns=(-(2**31) * 10**9, -(2**31) * 10**9))  # 1901, the oldest ext4 keeps
    ws = Workspace.init(root, "file://" + str(store))
    ws.snapshot("edge", progress=None)
    return root, store, ws.workspace_id


def _bytes_tree(root: Path) -> dict[bytes, tuple[bytes, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        dirnames[:] = [d for d in dirnames if d != b".portable"]
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as fh:
                out[os.path.relpath(full, os.fsencode(root))] = (fh.read(), os.lstat(full).st_mtime_ns)
    return out


def test_python_reader_in_the_document_handles_temp_names_odd_names_and_far_mtimes(tmp_path: Path) -> None:
    root, store, ws = _edge_workspace(tmp_path, odd_names=True)
    assert b"latin/caf\xe9.txt" in _bytes_tree(root)
    dest = tmp_path / "py"
    ns = _doc_python_reader()
    ns["read_workspace"](str(store), ws, str(dest))
    assert _bytes_tree(dest) == _bytes_tree(root), "names, bytes and mtimes come back exactly"
    from jupyter_portable import Workspace

    back = tmp_path / "pkg"
    Workspace.restore("file://" + str(store), ws, back, progress=None)
    assert _bytes_tree(back) == _bytes_tree(root)


def test_shell_recipe_in_the_document_never_overwrites_a_file_named_like_its_temp(tmp_path: Path) -> None:
    root, store, ws = _edge_workspace(tmp_path, odd_names=False)
    dest = tmp_path / "sh"
    run = _run_shell_recipe(store, ws, dest, tmp_path)
    assert run.returncode == 0, run.stderr
    assert {k: v[0] for k, v in _bytes_tree(dest).items()} == {k: v[0] for k, v in _bytes_tree(root).items()}
