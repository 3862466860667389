"""`make demo`'s JupyterLab (scripts/demo.py): no "official Jupyter news?" question over the demo
(issue 43, item 9). A real JupyterLab started with the demo's command line says, in its settings
API, that the news feed is Never and update checks are off, while the user's settings stay theirs."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _demo() -> Any:
    spec = importlib.util.spec_from_file_location("portable_demo_script", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_demo_lab_never_asks_about_jupyter_news(tmp_path: Path) -> None:
    demo = _demo()
    settings = tmp_path / "lab-settings"
    port, token = _free_port(), secrets.token_hex(16)
    # the demo's own folders are not touched here: a root and a user of the test's own
    (tmp_path / "root").mkdir()
    argv = demo.lab_argv(Path(sys.executable).parent / "jupyter", str(port), settings, tmp_path / "root")
    argv += [f"--IdentityProvider.token={token}", "--no-browser"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = (tmp_path / "lab.log").open("wb")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    answer = json.loads(resp.read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "lab.log").read_text()[-3000:]
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    # JupyterLab's announcements plugin asks only while fetchNews is "none" (Ask), its default
    # (overrides are the defaults of the plugin's schema as the server sends it)
    defaults = {k: v.get("default") for k, v in answer["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false", defaults
    assert defaults["checkForUpdates"] is False, defaults
    assert answer["raw"] in ("", "{}"), "the user's own settings were written"
    assert "--LabApp.news_url=None" in argv
