"""The machines the provider twins rent (``tests/twins/machines.py``) are like rented machines:
a bare Python of the image's version, the image's login user (``ubuntu`` with sudo on the
clouds), a home of their own, and no package index within reach while loopback services are.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sshd import keygen
from twins.machines import BARE_PYTHON, CLOUD_USER, PYTHONS, TwinMachine, require_python, start_machine, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559}


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return keygen(tmp_path / "launch_ed25519")


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[TwinMachine]]:
    started: list[TwinMachine] = []
    yield started
    for machine in started:
        machine.remove()


def start(machines: list[TwinMachine], tmp_path: Path, key: Path, name: str, user: str = "root",
          python: str = BARE_PYTHON) -> TwinMachine:
    machine = start_machine(tmp_path / "twin", name, gpus=[H100], driver="550.90.07", cuda="12.4",
                            public_keys=[key.with_suffix(".pub").read_text()], user=user, python=python)
    machines.append(machine)
    return machine


def ssh(machine: TwinMachine, key: Path, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = machine.sshd.ssh_argv(command)
    argv[argv.index("-i") + 1] = str(key)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def version_of(python: str) -> str:
    return subprocess.run([python, "-I", "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


BARE = ("python3 -c 'import os, sys, platform; print(platform.python_version()); "
        "print(os.path.realpath(sys.executable))'; "
        "for m in jupyter_portable blake3 jupyter_client; do python3 -c \"import $m\" 2>/dev/null && echo has $m; "
        "done; "
        "python3 -m pip --version >/dev/null && echo pip; "
        "python3 -m venv --without-pip \"$HOME/v\" && \"$HOME/v/bin/python\" -c 'print(\"venv\")'")


@pytest.mark.parametrize("user", ["root", CLOUD_USER])
@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_a_machine_s_python3_is_the_bare_interpreter_it_was_started_with(version: str, user: str, tmp_path: Path,
                                                                          key: Path,
                                                                          machines: list[TwinMachine]) -> None:
    python = require_python(version)
    machine = start(machines, tmp_path, key, "m1", user=user, python=python)
    out = ssh(machine, key, BARE)
    assert out.returncode == 0, out.stderr
    seen, executable, *rest = out.stdout.splitlines()
    assert seen == version_of(python) and seen.startswith(version)
    assert seen != platform.python_version()  # not the tests' interpreter
    assert rest == ["pip", "venv"]  # nothing of ours, but pip and venv as the images have them
    assert executable == machine.python
    if python.startswith("/root/"):  # other users cannot pass /root: a copy of pyenv's, where they may go
        assert not executable.startswith("/root/")
    else:
        assert executable == str(Path(python).resolve())


def test_the_tests_own_environment_does_not_reach_a_machine_s_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Jupyter server under test runs with a PYTHONPATH of its own: the copy made from there works."""
    from twins import machines as twin_machines

    python = Path(require_python("3.13")).resolve()
    monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.__file__))  # the tests' 3.11 standard library
    exe = twin_machines._copy_python(python)  # a fresh copy: machine_python keeps the first one
    try:
        assert version_of(exe).startswith("3.13.")
    finally:
        shutil.rmtree(Path(exe).parent.parent, ignore_errors=True)


def test_a_cloud_machine_logs_in_as_ubuntu_with_sudo_and_a_home_of_its_own(tmp_path: Path, key: Path,
                                                                           machines: list[TwinMachine]) -> None:
    one = start(machines, tmp_path, key, "i-1", user=CLOUD_USER)
    two = start(machines, tmp_path, key, "i-2", user=CLOUD_USER)
    for machine in (one, two):
        out = ssh(machine, key, 'id -un; echo "$HOME"; pwd; echo mine > "$HOME/file"; ls -A "$HOME"; '
                                "touch /root/x 2>/dev/null || echo not root")
        assert out.returncode == 0, out.stderr
        user, home, cwd, *listing, last = out.stdout.splitlines()
        assert (user, home, cwd) == (CLOUD_USER, str(machine.home), str(machine.home))
        assert listing == ["file"] and last == "not root"  # the other machine's file is not here
    assert one.home != two.home
    assert (tmp_path / "twin" / "i-1").resolve() == one.home.parent  # the twin's root links to the disk
    # root logs in nowhere: the image's user does
    as_root = subprocess.run([*one.sshd.ssh_argv("true")[:-2], f"root@{one.host}", "true"], capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert as_root.returncode != 0
    if not shutil.which("sudo"):
        pytest.skip("sudo is not installed (scripts/setup.sh installs it): the machine's sudo was not tried")
    out = ssh(one, key, 'sudo -n id -un && sudo -n sh -c \'echo "$TWIN_MACHINE"\'')
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["root", "i-1"]


class _Store(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"store"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def loopback_service() -> Iterator[int]:
    """A server on 127.0.0.1, as the moto store is: the worker on a machine must still reach it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("user", ["root", CLOUD_USER])
def test_no_package_index_is_reached_from_a_machine_and_pip_says_so_in_seconds(
        user: str, tmp_path: Path, key: Path, machines: list[TwinMachine], loopback_service: int) -> None:
    machine = start(machines, tmp_path, key, "m1", user=user)
    def fetch(host: str) -> str:
        url = f"http://{host}:{loopback_service}/"
        return f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}', timeout=10).read().decode())\""

    out = ssh(machine, key, f"{fetch('127.0.0.1')}; {fetch('localhost')}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["store", "store"]  # the store on loopback, through no proxy

    # the machine's own index, and the real one named on the command line (reached by the proxy)
    for index, refused in (("", "Could not fetch URL http://127.0.0.1:"),
                           (" --index-url https://pypi.org/simple", "Caused by ProxyError")):
        # refused at once, not waited for: a pip that hung on an index would run into the ssh timeout
        out = ssh(machine, key, 'python3 -m pip download six -vv --retries 0 --timeout 5 --no-cache-dir '
                                f'-d "$HOME/w"{index}', timeout=120)
        said = out.stdout + out.stderr
        assert out.returncode != 0 and "No matching distribution found for six" in out.stderr, said[-2000:]
        assert refused in said and "Connection refused" in said, said[-2000:]


def test_uv_finds_no_index_on_a_machine_either(tmp_path: Path, key: Path, machines: list[TwinMachine]) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("no uv here to run on the machine")
    machine = start(machines, tmp_path, key, "m1")  # root: it may run the tests' uv where it lies
    out = ssh(machine, key, f'UV_CACHE_DIR="$HOME/uv" {uv} pip install --python python3 --target "$HOME/t" six',
              timeout=120)  # it retries three times, with backoff; a hang runs into the timeout
    assert out.returncode != 0 and "/simple/six/" in out.stderr and "Connection refused" in out.stderr, out.stderr
