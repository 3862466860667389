"""Browser tests: a real JupyterLab with the extension, started by the tests, driven by
Playwright in Debian's Chromium (never a downloaded browser).

The server runs in a fresh workspace on the local market (real worker processes on this
machine); every request is authenticated with a token. Screenshots of each key state go
to ``test-output/ui/``.

Needs: ``apt-get install -y chromium`` and ``pip install playwright pytest-playwright``
(``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1``: nothing is downloaded). The tests skip, saying
which, when either is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("PORTABLE_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output" / "ui"

# Two offers the budget allows and one over the $/h cap: the blocked route.
CATALOG = """
version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "l4"
gpu = "NVIDIA L4"
gpu_count = 1
gpu_memory_gb = 24
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 0.40
region = "local-a"
capacity = 2
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
reservable = true

[[offer]]
id = "a100"
gpu = "NVIDIA A100-SXM4-80GB"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 1.50
region = "local-a"
capacity = 3
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
reservable = true

[[offer]]
id = "h100x8"
gpu = "NVIDIA H100-SXM5-80GB"
gpu_count = 8
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 24.00
region = "local-a"
capacity = 1
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
reservable = true
"""
PRICE_CAP = 5.0


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    reasons = []
    if not Path(CHROMIUM).exists():
        reasons.append(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        reasons.append("Playwright is not installed (pip install playwright pytest-playwright)")
    if reasons:
        for item in items:
            item.add_marker(pytest.mark.skip(reason="; ".join(reasons)))


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    # As root the sandbox must be off; there is no GPU.
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": ["--no-sandbox", "--disable-gpu"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


@dataclass
class Lab:
    """A running JupyterLab server on one workspace."""

    url: str
    token: str
    root: Path
    market: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log: Path
    shots: list[Path] = field(default_factory=list)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read().decode()
        return json.loads(text) if text else None

    def state(self) -> dict[str, Any]:
        return self.api("GET", "portable/api/state")  # type: ignore[no-any-return]

    def portable(self, *args: str) -> str:
        """Run the CLI against this server's workspace and market."""
        out = subprocess.run([sys.executable, "-m", "jupyter_portable", *args], cwd=self.root, env=self.env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def screenshot(self, page: Any, name: str) -> Path:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"{name}.png"
        page.screenshot(path=str(path))
        self.shots.append(path)
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    from jupyter_portable import Workspace
    from jupyter_portable.market import update_settings

    tmp = tmp_path_factory.mktemp("lab")
    catalog = tmp / "catalog.toml"
    catalog.write_text(CATALOG)
    market, store, root = tmp / "market", tmp / "store", tmp / "workspace"
    env = {
        **os.environ,
        "JUPYTER_PORTABLE_CATALOG": str(catalog),
        "JUPYTER_PORTABLE_MARKET_DIR": str(market),
        "JUPYTER_PORTABLE_SSH_STATE": str(tmp / "ssh-state"),
        "JUPYTER_PORTABLE_PROVIDERS": "local",
        "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
        # a Jupyter of its own: no user settings, workspaces or config leak in
        "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # no "get Jupyter news?" toast over the screenshots
    news = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    root.mkdir()
    (root / "train.py").write_text("print('training')\n")
    ws = Workspace.init(root, f"file://{store}")
    ws.snapshot("first", progress=None)
    update_settings(ws, max_price_per_hour=PRICE_CAP)

    port, token = _free_port(), secrets.token_hex(16)
    log = tmp / "jupyterlab.log"
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--ServerApp.allow_unauthenticated_access=False", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Lab(url=f"http://127.0.0.1:{port}/", token=token, root=root, market=market, env=env, proc=proc,
                 log=log)
    deadline = time.monotonic() + 90
    while True:
        try:
            server.api("GET", "api/status")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start:\n{log.read_text()[-4000:]}") from None
            time.sleep(0.5)
    try:
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # the market's workers are processes of their own: take every machine back
        from jupyter_portable.compute.local import lose_allocation

        for alloc in (market / "allocations").glob("al-*") if (market / "allocations").is_dir() else ():
            try:
                lose_allocation(market, alloc.name)
            except Exception:  # noqa: BLE001 - best effort at teardown; it is logged below
                print(f"could not stop worker {alloc.name}", file=sys.stderr)
        OUTPUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, OUTPUT / "jupyterlab.log")
