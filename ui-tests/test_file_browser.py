"""The file browser follows the machine (issue 16, item 4), in a real JupyterLab: a file the kernel
writes on the worker shows in JupyterLab's file browser within 5 s, without a snapshot."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from portable_lab import Lab

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
    return value


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    lab.put_notebook("follow.ipynb", [""])
    lab.api("POST", "portable/api/continue", {})
    wait_for("the machine", lambda: lab.state()["lifecycle"]["state"] == "ACTIVE", 180)
    context, page = lab.open_page(browser, "/tree/follow.ipynb", height=1000)
    yield page
    context.close()


def test_a_file_the_kernel_writes_shows_in_the_file_browser_within_5_s(page: Any, lab: Lab) -> None:
    expect(page.locator(".jp-StatusBar-Widget", has_text="Python (portable) | Idle").first).to_be_visible(
        timeout=120_000)
    name = f"made-on-the-gpu-{uuid.uuid4().hex[:8]}.txt"
    listing = page.locator(".jp-DirListing-item", has_text=name)
    expect(listing).to_have_count(0)
    editor = page.locator(".jp-NotebookPanel:visible .jp-Cell").first.locator(".jp-InputArea-editor")
    editor.click()
    page.keyboard.type(f"import os; open({name!r}, 'w').write('from the kernel'); print(os.getcwd())")
    page.keyboard.press("Shift+Enter")
    out = page.locator(".jp-NotebookPanel:visible .jp-Cell").first.locator(".jp-OutputArea")
    expect(out).to_contain_text("allocations", timeout=60_000)  # it ran in the worker's copy, not here
    # no snapshot was asked for: the server's pull and the browser's refresh bring it
    expect(listing).to_have_count(1, timeout=5_000)
    lab.screenshot(page, "19-kernel-file-in-the-file-browser")
