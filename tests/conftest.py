"""Shared fixtures: a real moto S3 server on loopback, store URLs for both backends,
and a runner for the real ``jupyter portable`` command."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from server_cleanup import jp_server_cleanup  # noqa: F401 - replaces pytest-jupyter's fixture of this name

# Every HTTP server that runs in a test process answers with TCP_NODELAY: http.server writes an
# answer's head and body apart, and with Nagle's algorithm the body waits for the client's delayed
# ACK of the head, 40 ms per request on Linux loopback (a twin's request took 45 ms instead of 0.5).
# The twins, the Hub's twin and the fault proxy set it on their own handlers too, for the benches
# that run them outside pytest; this covers the small servers written inside test files
http.server.BaseHTTPRequestHandler.disable_nagle_algorithm = True

# The test files that take longest, longest first (a clean-clone `make test`, its --durations): they
# start first. `make test` hands whole files to its two workers (--dist loadfile), in collection
# order (--no-loadscope-reorder; xdist's own order is most tests first, which put a 2-test file of
# 90 s near the end), and a long file handed out last keeps one worker busy while the other idles.
# Then the end-to-end files of a few tests each (a real server, kernel or machine per test), which
# xdist's order put last too. A file not named here runs after these, most tests first; a stale
# entry only moves a file earlier.
LONGEST_FIRST = ("test_cloud_e2e.py", "test_store_conformance.py", "test_provider_slurm.py", "test_venv_archive.py",
                 "test_env_any_python.py", "test_store_hf.py", "test_crash.py", "test_s3_faults.py",
                 "test_leaks.py", "test_runtime.py", "test_hostile_trees.py", "test_aws_ingress.py",
                 "test_wheel_trust.py",
                 "test_unreachable.py", "test_guardian_e2e.py", "test_checkpoint_background.py", "test_trainers.py",
                 "test_continue_e2e.py", "test_iopub_catchup.py", "test_continue_ssh.py",
                 "test_partition_websocket.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    per_file: dict[Path, int] = {}
    for item in items:
        per_file[item.path] = per_file.get(item.path, 0) + 1
    # a stable sort: each file's tests stay together and in their own order
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -per_file[item.path], str(item.path)))


BIN = Path(sys.executable).parent
# the digests of wheel sets this computer stored (worker/trust.py): one file per test process, in a
# folder of its own, never the user's; CLI subprocesses inherit it
os.environ.setdefault("JUPYTER_PORTABLE_TRUST_FILE",
                      str(Path(tempfile.mkdtemp(prefix="jp-trust-")) / "trusted-wheels.json"))


@pytest.fixture(autouse=True)
def no_loaded_config() -> Iterator[None]:
    """A test's server hands its configuration (c.Portable and the sections of core.envconfig) to
    the whole process, and a config file wins over a variable: the next test starts without it."""
    from jupyter_portable.core.envconfig import use_config

    yield
    use_config(None)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1, as s3fs's own test suite runs it."""
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    # S3 checks a PutObject's If-Match / If-None-Match and writes atomically; moto checks, then
    # writes, on whichever thread: two racing conditional writes of one key could both land there
    # (tests/test_race.py saw two writers win one version). One PutObject at a time makes the twin
    # as strict as S3 (its bodies are read before, so only the in-memory check and write wait).
    atomic = threading.RLock()
    put_object = S3Response.put_object

    def put_object_atomically(self: S3Response) -> object:
        with atomic:
            return put_object(self)

    S3Response.put_object = put_object_atomically  # type: ignore[method-assign]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Only the usual AWS environment variables point the code at the moto server."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


def make_bucket() -> str:
    import boto3

    name = f"bkt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store: a local folder, or a prefix in a fresh bucket on moto."""
    if request.param == "file":
        return f"file://{tmp_path}/store"
    request.getfixturevalue("aws_env")
    return f"s3://{make_bucket()}/team/ws"


@pytest.fixture
def file_store(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"


class Cli:
    """Runs ``jupyter portable ...`` as a user would, in a subprocess."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"

    def __call__(self, *args: str, cwd: Path | str = ".", check: bool = True,
                 extra_env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, **(extra_env or {}))
        env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
        proc = subprocess.run([str(BIN / "jupyter"), "portable", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"jupyter portable {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stderr}\n{proc.stdout}")
        return proc

    def json(self, *args: str, cwd: Path | str = ".", **kw: Any) -> dict[str, Any]:
        proc = self(*args, "--json", cwd=cwd, **kw)
        return json.loads(proc.stdout)


@pytest.fixture
def cli() -> Cli:
    return Cli()


def kill_worker_group(agent_json: Path) -> None:
    """SIGKILL the process group of the worker agent that wrote ``agent_json``, if it still runs.

    An agent.json outlives its agent, and on a busy machine its pid is soon another process's
    (pid_max is 32768 here), often a group leader of another test (an sshd session, another
    test's worker), which a blind ``killpg`` would kill. So the process must be a
    jupyter_portable process leading its group, started before the file was written."""
    try:
        pid = int(json.loads(agent_json.read_text())["pid"])
        written = agent_json.stat().st_mtime
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
        if b"jupyter_portable" not in cmdline or os.getpgid(pid) != pid or started > written + 1.0:
            return
        os.killpg(pid, 9)
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration):
        pass


def write_tree(root: Path, files: dict[str, bytes | str]) -> None:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)


def read_tree(root: Path) -> dict[str, Any]:
    """Every file (bytes, mode) and symlink under root, minus .portable."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) == root and d == ".portable")]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            if full.is_symlink():
                out[rel] = ("link", os.readlink(full))
            else:
                out[rel] = (full.read_bytes(), full.stat().st_mode & 0o7777)
    return out


@pytest.fixture
def tree_helpers() -> tuple[Callable[..., None], Callable[..., dict[str, Any]]]:
    return write_tree, read_tree


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    """The Jupyter server of the end-to-end tests (pytest-jupyter): this extension on, and every
    request authenticated, so an endpoint without auth fails its test."""
    return {"ServerApp": {"jpserver_extensions": {"jupyter_portable": True},
                          "allow_unauthenticated_access": False}}


@pytest.fixture
def wheelhouse(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's wheels for this interpreter, downloaded by ``make setup`` (scripts/setup.sh) so
    that bootstrapping a bare machine in a test asks no package index."""
    folder = Path(__file__).resolve().parents[1] / ".wheelhouse"
    if not any(folder.glob("uv-*.whl")):
        pytest.fail(f"{folder} holds no wheels: run `make setup` (it downloads them once)")
    monkeypatch.setenv("JUPYTER_PORTABLE_WHEEL_FIND_LINKS", str(folder))
    monkeypatch.setenv("JUPYTER_PORTABLE_NO_INDEX", "1")
    return folder
