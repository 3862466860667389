"""A checkpoint in flight in the sidebar (issue 44 item 1), on a workspace of its own: a training
process on this computer registers a checkpoint (``jupyter_portable.checkpoint``, which returns once
it is on local disk); while its upload is held mid-way at the store, the Checkpoints section shows
"step 1200: uploading N%, R/s" with a bar, told by the server's check with no reload; once the
upload goes on, the same row says "step 1200: verified, latest (version V)". The words are the
server's (core/state_words.py), the ones `jupyter portable status` prints."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import start_lab
from portable_lab import Lab

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

SIDEBAR = "#jupyter-portable-sidebar"

# The trainer's side: the store's objects of its checkpoint go up one after a pause, then wait for
# the test's release file (a minute at most), as a slow link would hold them; then it waits for
# "verified" as a training script's last line would.
TRAINER = """
import os, pathlib, sys, threading, time
from jupyter_portable.core import hooks
release, lock, seen = pathlib.Path(sys.argv[1]), threading.Lock(), [0]
def hold(label):
    if not label.startswith("renamed ") or "/objects/" not in label:
        return
    with lock:
        seen[0] += 1
        first = seen[0] == 1
    if first:
        time.sleep(0.5)
        return
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
hooks.install(step=hold)
import jupyter_portable
pathlib.Path("ckpt").mkdir(exist_ok=True)
pathlib.Path("ckpt/step-1200.bin").write_bytes(os.urandom(48 * 2**20))
handle = jupyter_portable.checkpoint("ckpt/step-1200.bin", step=1200)
print("returned:", handle.state, flush=True)
record = handle.wait(120)
print("ended:", handle.describe(), flush=True)
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with start_lab(tmp_path_factory.mktemp("lab-ckpt")) as server:
        yield server


def open_sidebar(page: Any) -> Any:
    sidebar = page.locator(SIDEBAR)
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-portable-sidebar"]')
    expect(tab).to_be_visible()
    for _ in range(3):
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        try:
            expect(sidebar).to_be_visible(timeout=3_000)
            return sidebar
        except AssertionError:
            continue  # the layout was still being restored
    expect(sidebar).to_be_visible()
    return sidebar


def test_a_checkpoint_in_flight_shows_its_upload_then_that_it_is_verified_and_latest(
        browser: Any, lab: Lab, tmp_path: Path) -> None:
    context, page = lab.open_page(browser, "")
    try:
        sidebar = open_sidebar(page)
        expect(sidebar.locator(".jp-Portable-allocation .jp-Portable-badge")).to_have_text("IDLE")
        release = tmp_path / "release"
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(release)], cwd=lab.root, env=lab.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            moving = sidebar.locator("li.jp-Portable-ckFlight.jp-mod-moving")
            expect(moving).to_have_count(1, timeout=30_000)
            line = moving.locator(".jp-Portable-ckLine")
            expect(line).to_have_text(re.compile(r"^step 1200: uploading [1-9]\d?%, [\d.]+ (B|KB|MB|GB)/s$"))
            pct = int(re.search(r"uploading (\d+)%", line.inner_text()).group(1))  # type: ignore[union-attr]
            bar = moving.locator("progress.jp-Portable-ckBar")
            assert bar.get_attribute("value") == str(pct), "the bar is the line's percent"
            # what the server says is what the sidebar shows
            (row,) = [r for r in lab.state()["checkpoints_in_flight"] if r["step"] == 1200]
            assert row["machine"] is None and row["percent"] == pct and row["latest"] is False
            moving.scroll_into_view_if_needed()
            lab.screenshot(page, "sidebar-checkpoint-in-flight")

            release.touch()
            done = sidebar.locator("li.jp-Portable-ckFlight.jp-mod-verified")
            expect(done.locator(".jp-Portable-ckLine")).to_have_text(
                re.compile(r"^step 1200: verified, latest \(version \d+\)$"), timeout=30_000)
            expect(moving).to_have_count(0)
            version = int(re.search(r"version (\d+)", done.inner_text()).group(1))  # type: ignore[union-attr]
            state = lab.state()
            assert state["snapshot"]["version"] == version
            latest = [c for c in state["checkpoints"] if c["verified"]][-1]
            assert (latest["path"], latest["step"], latest["version"]) == ("ckpt/step-1200.bin", 1200, version)
            # the verified list below shows it too, from the store's record
            expect(sidebar.locator('ul[aria-label="verified checkpoints"]')).to_contain_text("step 1200")
            done.scroll_into_view_if_needed()
            lab.screenshot(page, "sidebar-checkpoint-verified")
            out, _ = trainer.communicate(timeout=60)
            assert trainer.returncode == 0, out
            assert "returned: queued" in out or "returned: uploading" in out, out
            assert f"ended: step 1200: verified (version {version})" in out, out
        finally:
            release.touch()
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
    finally:
        context.close()
