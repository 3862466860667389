"""Fixtures of the browser tests (see README.md and portable_lab.py)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from portable_lab import CATALOG, CHROMIUM, OUTPUT, PRICE_CAP, ROOT, Lab, free_port

# The files that take longest, longest first (their idle windows and Continues are real waits): `make
# test` runs this folder on two workers, a file each at a time (--dist loadfile, each file's tests in
# order on its one server and page), in this order (--no-loadscope-reorder), so that a long file is
# not the last one handed out while the other worker idles. The others follow in their own order.
LONGEST_FIRST = ("test_kernel_indicators.py", "test_one_budget_and_idle.py", "test_no_conflict_with_yourself.py")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))  # stable: files stay whole
    reasons = []
    if not Path(CHROMIUM).exists():
        reasons.append(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        reasons.append("Playwright is not installed (pip install playwright pytest-playwright)")
    if reasons:
        here = Path(__file__).parent
        for item in items:
            if Path(str(item.fspath)).is_relative_to(here):  # only ours, when run beside tests/
                item.add_marker(pytest.mark.skip(reason="; ".join(reasons)))


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    # As root the sandbox must be off; there is no GPU.
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": ["--no-sandbox", "--disable-gpu"]}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with start_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


def start_lab_asking_nothing(tmp: Path) -> contextlib.AbstractContextManager[Lab]:
    """:func:`start_lab` whose first cell starts the machine without asking (the question itself is
    tested in test_first_machine), with JupyterLab's app exposed for the tests that read it."""
    return start_lab(tmp, {"jupyter-portable/notebook": {"confirmFirstMachine": False}},
                     lab_args=("--LabApp.expose_app_in_browser=True",))


@contextlib.contextmanager
def start_lab(tmp: Path, lab_settings: dict[str, dict[str, Any]] | None = None, *, catalog: str = CATALOG,
              lab_args: tuple[str, ...] = ()) -> Iterator[Lab]:
    """JupyterLab on a fresh IDLE workspace of its own in ``tmp``; ``lab_settings``: user settings by
    plugin file ("jupyter-portable/notebook": {...}) written before it starts; ``catalog``: the local
    market's offers (the tests' own three by default); ``lab_args``: more JupyterLab options."""
    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.settings import update_settings

    catalog_file = tmp / "catalog.toml"
    catalog_file.write_text(catalog)
    # the lab extension as built in this tree (`jlpm build`), not the copy pip installed in the
    # environment when it last ran: JupyterLab takes the first jupyter-portable on its path
    built = ROOT / "jupyter_portable" / "labextension"
    extension = tmp / "share" / "jupyter" / "labextensions" / "jupyter-portable"
    extension.mkdir(parents=True)
    for part in built.iterdir():
        (extension / part.name).symlink_to(part)
    shutil.copyfile(ROOT / "labextension" / "install.json", extension / "install.json")
    market, store, root = tmp / "market", tmp / "store", tmp / "workspace"
    env = {
        **os.environ,
        "JUPYTER_PORTABLE_CATALOG": str(catalog_file),
        "JUPYTER_PORTABLE_MARKET_DIR": str(market),
        "JUPYTER_PORTABLE_SSH_STATE": str(tmp / "ssh-state"),
        # the wheel sets this computer stored: a file of this server's own, never the user's
        "JUPYTER_PORTABLE_TRUST_FILE": str(tmp / "trusted-wheels.json"),
        "JUPYTER_PORTABLE_PROVIDERS": "local",
        "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
        # a Jupyter of its own: no user settings, workspaces or config leak in
        "JUPYTER_CONFIG_DIR": str(tmp / "jupyter-config"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces"),
        "JUPYTER_PATH": os.pathsep.join(p for p in (str(tmp / "share" / "jupyter"), os.environ.get("JUPYTER_PATH"))
                                        if p),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # no "get Jupyter news?" toast over the screenshots
    news = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    for name, values in (lab_settings or {}).items():
        path = tmp / "lab-settings" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    # the default of a new user: opening a notebook rents nothing, its first cell asks
    env.pop("JUPYTER_PORTABLE_FIRST_MACHINE", None)
    root.mkdir()
    (root / "train.py").write_text("print('training')\n")
    ws = Workspace.init(root, f"file://{store}")
    ws.snapshot("first", progress=None)
    update_settings(ws, max_price_per_hour=PRICE_CAP)

    port, token = free_port(), secrets.token_hex(16)
    log = tmp / "jupyterlab.log"
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--ServerApp.allow_unauthenticated_access=False", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", *lab_args]
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
        from jupyter_portable.demo.market import lose_allocation

        for alloc in (market / "allocations").glob("al-*") if (market / "allocations").is_dir() else ():
            try:
                lose_allocation(market, alloc.name)
            except Exception:  # noqa: BLE001 - best effort at teardown; it is logged below
                print(f"could not stop worker {alloc.name}", file=sys.stderr)
        # the last server's log; with `-n 2` two servers may stop at once: each copy is whole
        OUTPUT.mkdir(parents=True, exist_ok=True)
        partial = OUTPUT / f".jupyterlab.log.{os.getpid()}"
        shutil.copy(log, partial)
        os.replace(partial, OUTPUT / "jupyterlab.log")
