"""One conformance suite for every store backend, the way fsspec's own suite runs on each
filesystem: a local folder, S3 on moto and on SeaweedFS, GCS on fake-gcs-server, Azure Blob
on Azurite (each a real server on loopback), and the Hugging Face Hub's twin (its HTTP API
on loopback, answering huggingface_hub's own requests). A backend joins by adding its kind to
``stores.KINDS``. Each test names the Backend contract it checks (its docstrings)."""

from __future__ import annotations

import io
import os
import tarfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import read_tree, write_tree
from stores import (  # noqa: F401 - fixtures
    KINDS,
    azure_env,
    azurite_endpoint,
    fake_gcs_endpoint,
    gcs_env,
    hf_env,
    hub_twin,
    seaweedfs_endpoint,
    seaweedfs_env,
    store_factory,
)

from jupyter_portable import Workspace
from jupyter_portable.core.errors import ConflictError, ObjectMissing, StoreError
from jupyter_portable.engine.verify import fsck
from jupyter_portable.store import open_backend
from jupyter_portable.store.backend import Backend
from jupyter_portable.store.repo import Store, digest


@pytest.fixture(params=KINDS)
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """A maker of fresh, empty store URLs on one backend."""
    return store_factory(request.param, request, tmp_path)


@pytest.fixture
def backend(new_store: Callable[[], str]) -> Backend:
    return open_backend(new_store())


def test_read_after_write_sees_the_bytes_at_once(backend: Backend) -> None:
    for i in range(5):
        body = f"object {i}".encode() * (i + 1)
        backend.write(f"objects/0{i}/k{i}", body)
        assert backend.read(f"objects/0{i}/k{i}") == body
        assert backend.exists(f"objects/0{i}/k{i}") and backend.size(f"objects/0{i}/k{i}") == len(body)
    backend.write("objects/00/k0", b"object 0")  # rewriting identical bytes is harmless
    backend.write("objects/00/empty", b"")
    assert backend.read("objects/00/empty") == b"" and backend.size("objects/00/empty") == 0


def test_a_missing_key_is_reported_missing_never_empty(backend: Backend) -> None:
    for call in (lambda: backend.read("objects/aa/nope"), lambda: backend.read_range("objects/aa/nope", 0, 3),
                 lambda: backend.size("objects/aa/nope")):
        with pytest.raises(ObjectMissing, match="missing"):
            call()
    assert backend.exists("objects/aa/nope") is False
    assert backend.read_versioned("objects/aa/nope") is None
    backend.delete("objects/aa/nope")  # deleting what is not there is no error


def test_a_missing_key_is_missing_whatever_status_codes_the_store_name_holds(new_store: Callable[[], str]) -> None:
    """A backend tells errors apart by their kind or status, never by words in a message that
    also holds the bucket and the key: a store named with "416" (a range past the end) or "401"
    (access denied) still reports a missing object as missing."""
    backend = open_backend(new_store() + "/run-416-401-403-412")
    for call in (lambda: backend.read("objects/aa/x416"), lambda: backend.read_range("objects/aa/x416", 0, 3),
                 lambda: backend.size("objects/aa/x416")):
        with pytest.raises(ObjectMissing, match="missing"):
            call()


def test_a_missing_bucket_is_a_store_error_never_a_missing_object(new_store: Callable[[], str]) -> None:
    """A bucket (or container) that is not there is the store's fault, said as such: read as a
    missing object it would look like an empty workspace."""
    scheme, rest = new_store().split("://", 1)
    if scheme not in ("s3", "gs", "az"):
        pytest.skip("only a bucket store has a bucket to lose")
    backend = open_backend(f"{scheme}://missing-{uuid.uuid4().hex[:12]}/{rest.split('/', 1)[1]}")
    for call in (lambda: backend.read("objects/aa/x"), lambda: backend.size("objects/aa/x"),
                 lambda: backend.exists("objects/aa/x"), lambda: backend.list("objects")):
        with pytest.raises(StoreError) as err:
            call()
        assert not isinstance(err.value, ObjectMissing), err.value


def test_write_new_is_create_only_and_a_retry_of_the_same_bytes_counts_as_written(backend: Backend) -> None:
    backend.write_new("workspaces/w/manifests/m.json", b"first")
    backend.write_new("workspaces/w/manifests/m.json", b"first")  # a retried request whose first try landed
    with pytest.raises(ConflictError):
        backend.write_new("workspaces/w/manifests/m.json", b"second")
    assert backend.read("workspaces/w/manifests/m.json") == b"first"


def test_swap_replaces_only_the_version_read(backend: Backend) -> None:
    backend.swap("workspaces/w/HEAD", b"v0", None)
    with pytest.raises(ConflictError):
        backend.swap("workspaces/w/HEAD", b"other", None)  # exists already
    data, token = backend.read_versioned("workspaces/w/HEAD") or (b"", "")
    assert data == b"v0"
    backend.swap("workspaces/w/HEAD", b"v1", token)
    with pytest.raises(ConflictError):
        backend.swap("workspaces/w/HEAD", b"v2", token)  # stale token
    assert backend.read("workspaces/w/HEAD") == b"v1"
    backend.swap("workspaces/w/HEAD", b"v1", token)  # a retry of the swap that landed: no conflict
    data2, token2 = backend.read_versioned("workspaces/w/HEAD") or (b"", "")
    assert data2 == b"v1" and token2 != token


def _race(calls: list[Callable[[], None]]) -> list[BaseException | None]:
    barrier = threading.Barrier(len(calls))
    results: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            calls[i]()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_racing_swaps_from_one_head_one_wins_the_losers_get_conflicts(new_store: Callable[[], str]) -> None:
    url = new_store()
    first = open_backend(url)
    first.swap("workspaces/w/HEAD", b"v0", None)
    _data, token = first.read_versioned("workspaces/w/HEAD") or (b"", "")
    racers = [open_backend(url) for _ in range(5)]
    results = _race([lambda b=b, i=i: b.swap("workspaces/w/HEAD", f"racer {i}".encode(), token)
                     for i, b in enumerate(racers)])
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1, results
    assert all(isinstance(r, ConflictError) for i, r in enumerate(results) if i != winners[0]), results
    assert first.read("workspaces/w/HEAD") == f"racer {winners[0]}".encode()


def test_racing_create_only_writes_one_wins(new_store: Callable[[], str]) -> None:
    url = new_store()
    racers = [open_backend(url) for _ in range(5)]
    results = _race([lambda b=b, i=i: b.write_new("workspaces/w/manifests/0000000001-x.json", f"{i}".encode())
                     for i, b in enumerate(racers)])
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1 and sum(isinstance(r, ConflictError) for r in results) == 4, results
    assert racers[0].read("workspaces/w/manifests/0000000001-x.json") == f"{winners[0]}".encode()


def test_listing_is_by_folder_prefix_sorted_and_complete(backend: Backend) -> None:
    keys = ["objects/ab/2", "objects/ab/1", "objects/cd/3", "objectsX/ab/4", "index/ab/5.json",
            "workspaces/ws-a/HEAD", "workspaces/ws-a/manifests/0000000001-a.json", "workspaces/ws-b/HEAD"]
    for k in keys:
        backend.write(k, k.encode())
    assert backend.list("objects") == ["objects/ab/1", "objects/ab/2", "objects/cd/3"]
    assert backend.list("objects/ab") == ["objects/ab/1", "objects/ab/2"]
    assert backend.list("workspaces") == ["workspaces/ws-a/HEAD", "workspaces/ws-a/manifests/0000000001-a.json",
                                          "workspaces/ws-b/HEAD"]
    assert backend.list("wheels") == []
    many = [f"index/ef/{i:04d}.json" for i in range(40)]
    for k in many:
        backend.write(k, b"{}")
    assert backend.list("index/ef") == many


def test_range_reads_return_exactly_the_bytes_asked(backend: Backend) -> None:
    body = bytes(range(256)) * 40
    backend.write("objects/ab/r", body)
    assert backend.read_range("objects/ab/r", 0, 1) == body[:1]
    assert backend.read_range("objects/ab/r", 1000, 5000) == body[1000:5000]
    assert backend.read_range("objects/ab/r", len(body) - 3, len(body)) == body[-3:]
    assert backend.read_range("objects/ab/r", len(body) - 3, len(body) + 100) == body[-3:]
    assert backend.read_range("objects/ab/r", 7, 7) == b""
    assert backend.read_range("objects/ab/r", len(body) + 10, len(body) + 20) == b""  # wholly past the end


def test_a_large_object_round_trips_whole_in_ranges_and_into_a_file(backend: Backend, tmp_path: Path) -> None:
    body = os.urandom(40 * 1024 * 1024 + 123)  # past every backend's single-request upload size
    h = digest(body)
    backend.write(f"objects/{h[:2]}/{h}", body)
    assert backend.size(f"objects/{h[:2]}/{h}") == len(body)
    cut = 16 * 1024 * 1024
    assert backend.read_range(f"objects/{h[:2]}/{h}", cut - 5, cut + 5) == body[cut - 5:cut + 5]
    out = tmp_path / "copy"
    with open(out, "wb") as fh:
        fh.write(b"head")
        assert backend.copy_to(f"objects/{h[:2]}/{h}", fh.fileno(), 4) == len(body)
    assert digest(out.read_bytes()[4:]) == h


def test_the_conditional_write_probe_passes_and_leaves_no_key(backend: Backend) -> None:
    probe = getattr(backend, "check_conditional_writes", None)
    if probe is None:
        assert backend.url.startswith("file://")  # a folder's conditions are the kernel's link and flock
        return
    probe()
    assert backend.list("probe") == []


def test_a_worker_wheel_set_is_stored_once_and_read_back_by_the_bootstrap(new_store: Callable[[], str]) -> None:
    from jupyter_portable.worker import bootstrap, interpreter, trust, wheelset

    store = Store.open(new_store())
    store.ensure_config()
    target = interpreter.local_target()
    reqs = wheelset.requirements(store.url)
    wheels = [(f"uv-0.0.{i}-py3-none-any.whl", os.urandom(3000 + i)) for i in range(2)]
    stored = [wheelset.put_wheel(store, data, name) for name, data in wheels]
    assert wheelset.put_wheel(store, wheels[0][1], wheels[0][0]) == stored[0]  # once: the same object
    key = wheelset.set_key(reqs, target.tag)
    doc = {"format": wheelset.FORMAT, "schema": wheelset.SCHEMA, "requirements": reqs, "env": target.tag,
           "wheels": [w.to_json() for w in stored], "changes": []}
    import json

    data = json.dumps(doc).encode()
    store.backend.write_new(key, data)
    trust.record(store.url, key, data)  # as the computer that stored it does: warm from here, no index asked
    got = wheelset.wheel_set(store, target, no_index=True)
    assert got.warm and list(got.wheels) == stored
    with tarfile.open(fileobj=io.BytesIO(bootstrap._tar(store, got.wheels))) as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers()} == dict(wheels)  # type: ignore[union-attr]


def test_round_trip_snapshot_change_restore_both_verify_tamper_fsck(new_store: Callable[[], str],
                                                                    tmp_path: Path) -> None:
    url = new_store()
    src = tmp_path / "src"
    write_tree(src, {"notes.txt": "hello\n", "src/a.py": "a = 1\n", "data/model.bin": os.urandom(3 * 1024 * 1024)})
    ws = Workspace.init(src, url)
    assert ws.snapshot(progress=None).version == 1
    v1 = read_tree(src)
    write_tree(src, {"src/a.py": "a = 2\n", "src/b.py": "b = 1\n"})
    (src / "notes.txt").unlink()
    assert ws.snapshot(progress=None).version == 2
    v2 = read_tree(src)
    for version, tree in ((1, v1), (2, v2)):
        dest = tmp_path / f"restore-v{version}"
        Workspace.restore(url, ws.workspace_id, dest, version=version, progress=None)
        assert read_tree(dest) == tree
        assert Workspace.find(dest).verify().ok
    store = Store.open(url)
    assert fsck(store, read_data=True).ok
    victim = max(store.backend.list("objects"), key=store.backend.size)
    data = bytearray(store.backend.read(victim))
    data[len(data) // 2] ^= 0x01
    store.backend.write(victim, bytes(data))
    report = fsck(Store.open(url), read_data=True)
    assert not report.ok and any(victim.rsplit("/", 1)[-1][:16] in e for e in report.errors), report.errors


class _ConditionDroppingProxy:
    """An S3 server that lacks conditional writes: moto behind a proxy that drops
    If-Match / If-None-Match, as an old S3-compatible server ignores them."""

    def __init__(self, upstream: str) -> None:
        import http.client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlparse

        up = urlparse(upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("if-match", "if-none-match", "host")}
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_init_refuses_an_s3_server_without_conditional_writes_naming_the_feature(
        aws_env: dict[str, str], moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conftest import make_bucket

    from jupyter_portable.core.errors import UnsupportedStore

    bucket = make_bucket()
    proxy = _ConditionDroppingProxy(moto_endpoint)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        src = tmp_path / "src"
        write_tree(src, {"a.txt": "a"})
        with pytest.raises(UnsupportedStore) as info:
            Workspace.init(src, f"s3://{bucket}/p")
        assert "If-None-Match" in str(info.value) and "conditional writes" in str(info.value)
        assert not (src / ".portable" / "workspace.json").exists()
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
        left = open_backend(f"s3://{bucket}/p")
        assert left.list("workspaces") == [] and left.list("probe") == [], "init stored no workspace"
        # The same store behind a server that honours the conditions is accepted.
        assert Workspace.init(src, f"s3://{bucket}/p").workspace_id
    finally:
        proxy.server.shutdown()


# file:// and moto are crashed in test_crash.py, the Hub's twin in test_store_hf.py.
CRASH_KINDS = ["seaweedfs", "gcs", "azure"]


def _copy_store(src: Backend, dst_url: str) -> None:
    """Every key of the store ``src`` written, same bytes, into the empty store at ``dst_url``."""
    from concurrent.futures import ThreadPoolExecutor

    dst = open_backend(dst_url)
    keys = ["config.json"] + [k for top in ("objects", "index", "workspaces") for k in src.list(top)]
    with ThreadPoolExecutor(8) as pool:  # round trips, not bytes, are what an emulator step costs
        list(pool.map(lambda k: dst.write(k, src.read(k)), keys))


@pytest.mark.parametrize("new_store", CRASH_KINDS, indirect=True)
def test_sigkill_at_every_step_of_a_snapshot_leaves_the_last_version_restorable(
        new_store: Callable[[], str], tmp_path: Path) -> None:
    """A snapshot SIGKILLed at each store step leaves fsck clean, the head at v1 or v2, v1 whole."""
    import json
    import shutil
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from test_crash import _check_after_crash, _snapshot_killed_at

    from jupyter_portable.engine.snapshot import SMALL_MAX

    # Large files of one part each: a snapshot's largest objects (16 MiB parts, ~8 MiB packs)
    # stay under every backend's multi-request path (S3 is always one PutObject, GCS goes
    # resumable above 32 MiB, Azure stages blocks above 64 MiB), so bigger files would only
    # slow each step down.
    base_url, base_ws = new_store(), tmp_path / "base-ws"
    write_tree(base_ws, {f"src/m{i}.py": f"print({i})\n" for i in range(12)}
               | {"data/big.bin": os.urandom(2 * SMALL_MAX)})
    ws = Workspace.init(base_ws, base_url)
    assert ws.snapshot(progress=None).version == 1
    v1_tree = read_tree(base_ws)
    write_tree(base_ws, {f"src/new{i}.py": f"x = {i}\n" for i in range(10)}
               | {"data/more.bin": os.urandom(2 * SMALL_MAX)})  # a new large file
    (base_ws / "src" / "m0.py").unlink()
    with open(base_ws / "data" / "big.bin", "r+b") as fh:  # its part changes: a new part object
        fh.write(b"changed!")
    base = open_backend(base_url)

    def attempt(step: int) -> int | None:
        """The head's version after a snapshot killed at ``step``; None if it completed."""
        url, root, out = new_store(), tmp_path / f"ws{step}", tmp_path / f"r{step}"
        _copy_store(base, url)  # the store as v1 left it
        shutil.copytree(base_ws, root, symlinks=True)
        cfg_path = root / ".portable" / "workspace.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "store": url}))
        proc = _snapshot_killed_at(root, step)  # the store's variables travel in os.environ
        if proc.returncode == 0:
            return None
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        version = _check_after_crash(url, ws.workspace_id, out, v1_tree)
        shutil.rmtree(root)
        shutil.rmtree(out)
        return version

    # Two steps at a time: each is mostly a child's start-up and round trips to the emulator.
    results: list[int | None] = []
    with ThreadPoolExecutor(2) as pool:
        while None not in results:
            assert len(results) < 100, "the snapshot never completed"
            results += pool.map(attempt, range(len(results) + 1, len(results) + 3))
    kills = [v for v in results if v is not None]
    assert len(kills) >= 8 and 2 in kills, results  # some kills fall after the head moved


def test_a_blob_is_written_once_and_an_existing_one_is_no_error(backend: Backend) -> None:
    """write_blob / write_blobs: readable when they return; the same object again is harmless."""
    body = b"a shared blob"
    key = f"objects/{digest(body)[:2]}/{digest(body)}"
    backend.write_blob(key, body)
    backend.write_blob(key, body)
    assert backend.read(key) == body
    more = [(f"objects/{digest(b)[:2]}/{digest(b)}", b) for b in (b"one", b"two", b"")]
    backend.write_blobs(more)
    backend.write_blobs(more)
    assert [backend.read(k) for k, _b in more] == [b for _k, b in more]


# the flag each server needs to send nothing off this machine (issue 39, item 4); moto is in-process
_QUIET_FLAGS = {"seaweedfs": ["-master.telemetry=false"], "azurite": ["--disableTelemetry"], "fake-gcs": []}


@pytest.mark.parametrize("kind", sorted(_QUIET_FLAGS))
def test_every_store_server_listens_on_loopback_and_reports_nothing_outside(kind: str,
                                                                            request: pytest.FixtureRequest) -> None:
    """The server behind each store kind: every socket it listens on is on 127.0.0.1, and its
    telemetry (SeaweedFS' anonymous statistics, Azurite's collection) is off on its command line."""
    from urllib.parse import urlparse

    import psutil

    fixture = {"seaweedfs": "seaweedfs_endpoint", "azurite": "azurite_endpoint", "fake-gcs": "fake_gcs_endpoint"}[kind]
    port = urlparse(request.getfixturevalue(fixture)).port
    owners = [c.pid for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert len(set(owners)) == 1, f"no single process listens on the {kind} port {port}: {owners}"
    proc = psutil.Process(owners[0])
    listening = {c.laddr.ip for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    assert listening and listening <= {"127.0.0.1"}, f"{kind} listens on {listening}"
    for flag in _QUIET_FLAGS[kind]:
        assert flag in proc.cmdline(), f"{kind} runs without {flag}: {proc.cmdline()}"


def test_a_large_checkpoint_goes_up_in_parallel_parts_each_read_back_as_it_lands(new_store: Callable[[], str],
                                                                                 tmp_path: Path) -> None:
    """A checkpoint of several parts (issue 44): the parts go up several at a time and each is
    read back as soon as it is written, on every backend; "verified" with the bytes in the store."""
    from jupyter_portable.core import hooks
    from jupyter_portable.engine.snapshot import PART_SIZE
    from jupyter_portable.engine.trees import iter_under

    ws = Workspace.init(tmp_path / "ws", new_store())
    data = os.urandom(2 * PART_SIZE + 1234)
    (ws.root / "model.bin").write_bytes(data)
    read_back: list[str] = []
    hooks.install(before_readback=lambda _store, keys: read_back.extend(keys))
    try:
        handle = ws.checkpoint_async(ws.root / "model.bin", step=5, quiet_s=0)
        record = handle.wait(300)
    finally:
        hooks._readbacks.pop()
    assert record is not None and record.verified, record
    manifest = ws.store.read_manifest(ws.workspace_id, record.version or 0)
    (entry,) = list(iter_under(ws.store, manifest.tree or "", "model.bin"))
    assert len(entry.parts) == 3 and sorted(read_back) == sorted(f"objects/{h[:2]}/{h}" for h, _n in entry.parts)
    assert ws.store.read_file_range(entry, 0, entry.size) == data
