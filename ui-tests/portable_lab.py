"""Shared by the browser tests: a real JupyterLab with the extension, started by the tests, driven by
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
import shutil
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("PORTABLE_CHROMIUM", "/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "test-output" / "ui"
# the documentation's screenshots: a shot whose name is already there (``sidebar-NAME.png``, or
# ``NAME.png`` for the ``glance-`` ones) is refreshed by every browser run, so the pictures in the
# docs show what the tests just saw
DOCS_IMAGES = ROOT / "docs" / "images"

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

    def portable_json(self, *args: str) -> Any:
        """The CLI's one JSON object for ``args`` (``--json`` added)."""
        return json.loads(self.portable(*args, "--json"))

    def put_notebook(self, name: str, cells: list[str] | list[tuple[str, dict[str, Any]]]) -> None:
        """Write ``name``: a notebook on the portable kernel with these code cells (each a source,
        or a source and its metadata)."""
        pairs = [(c, {}) if isinstance(c, str) else c for c in cells]
        nb = {"cells": [{"cell_type": "code", "source": src, "metadata": meta, "outputs": [], "execution_count": None}
                        for src, meta in pairs],
              "metadata": {"kernelspec": {"name": "portable", "display_name": "Python (portable)",
                                          "language": "python"}},
              "nbformat": 4, "nbformat_minor": 5}
        self.api("PUT", f"api/contents/{name}", {"type": "notebook", "format": "json", "content": nb})

    def open_page(self, browser: Any, path: str, height: int = 1100) -> tuple[Any, Any]:
        """A fresh browser context and page on ``lab/<path>`` (the workspace reset), once
        JupyterLab's splash is gone."""
        context = browser.new_context(viewport={"width": 1500, "height": height})
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{self.url}lab{path}?reset&token={self.token}")
        from playwright.sync_api import expect

        expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
        return context, page

    def screenshot(self, page: Any, name: str) -> Path:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"{name}.png"
        page.screenshot(path=str(path))
        self.shots.append(path)
        for doc in (DOCS_IMAGES / f"{name}.png", DOCS_IMAGES / f"sidebar-{name}.png"):
            if doc.is_file():
                shutil.copyfile(path, doc)
        return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def palette_fill(page: Any, text: str) -> Any:
    """JupyterLab's command palette, opened with its shortcut and filled with ``text``.

    The palette closes when the page's focus moves, and JupyterLab may still be restoring
    its layout (activating a widget) right after the page loads: the palette then closes
    between opening and typing. It is opened again, up to three times."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect

    palette = page.locator(".jp-ModalCommandPalette input")
    for _ in range(3):
        if palette.is_visible():
            page.keyboard.press("Escape")
        page.keyboard.press("Control+Shift+C")
        try:
            expect(palette).to_be_visible(timeout=5_000)
            palette.fill(text, timeout=5_000)
            expect(palette).to_be_focused(timeout=1_000)
            expect(palette).to_have_value(text, timeout=1_000)
            return palette
        except (AssertionError, PlaywrightError):
            continue
    page.keyboard.press("Control+Shift+C")
    expect(palette).to_be_visible()
    palette.fill(text)
    return palette
