"""Issue 43 item 2, in a real JupyterLab: the notebook JupyterLab has open and saves is the
user's side, never a conflict with itself. Lose the machine and Continue four times, running
a cell and saving (Ctrl+S) on each machine: no ``continue.ipynb.conflict-lab-...`` copy on
either side, the notebook on disk keeps its outputs, no "File Changed" dialog ever opens, and
the sidebar lists no conflict. One server and one page."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from portable_lab import Lab

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

NAME = "continue.ipynb"
CELLS = ["import os\nprint('on', os.environ['JUPYTER_PORTABLE_ALLOCATION'])",
         "%workspace snapshot -m 'from the notebook'"]
MACHINES = 5  # the first machine and four Continues (the newcomer path of issue 43)
# Every dialog that ever opens is remembered, however briefly it stays.
WATCH_DIALOGS = """() => {
  window.__portableDialogs = [];
  new MutationObserver(() => {
    for (const d of document.querySelectorAll('.jp-Dialog')) {
      const text = d.textContent || '';
      if (!window.__portableDialogs.includes(text)) window.__portableDialogs.push(text);
    }
  }).observe(document.body, {childList: true, subtree: true});
}"""


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    lab.put_notebook(NAME, CELLS)
    lab.api("POST", "portable/api/continue", {})
    wait_for("the first machine", lambda: lab.state()["lifecycle"]["state"] == "ACTIVE", 180)
    context, page = lab.open_page(browser, f"/tree/{NAME}")
    page.evaluate(WATCH_DIALOGS)
    expect(page.locator(".jp-StatusBar-Widget", has_text="Python (portable) | Idle").first).to_be_visible(
        timeout=120_000)
    yield page
    context.close()


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
    return value


def outputs_on_disk(lab: Lab) -> str:
    try:
        nb = json.loads((lab.root / NAME).read_text())
    except (OSError, ValueError):
        return ""
    return json.dumps([c.get("outputs", []) for c in nb["cells"]])  # stream, display and result outputs alike


def conflict_copies(lab: Lab, allocation_id: str) -> list[str]:
    here = [p.name for p in lab.root.glob("*.conflict-*")]
    worker = lab.market / "allocations" / allocation_id / "work"
    there = [p.name for p in worker.glob("*.conflict-*")] if worker.is_dir() else []
    return here + there


def run_and_save(page: Any, lab: Lab, index: int, text: str) -> None:
    """Run cell ``index`` as a user does, then Ctrl+S: its output ``text`` is on disk."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-OutputArea")).to_contain_text(text, timeout=120_000)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    wait_for(f"{text!r} on disk", lambda: text in outputs_on_disk(lab), 30)


def test_continues_with_saves_in_between_leave_no_conflict_copy(page: Any, lab: Lab) -> None:
    started = time.monotonic()
    seen = []
    for i in range(MACHINES):
        state = lab.state()
        allocation = state["lifecycle"]["allocation_id"]
        seen.append(allocation)
        run_and_save(page, lab, 0, f"on {allocation}")
        # the worker publishes a version with the notebook as saved so far; the next save is newer
        run_and_save(page, lab, 1, "version")
        run_and_save(page, lab, 0, f"on {allocation}")
        # a few of the follow loop's ticks (every 2 s) see the save: nothing is pulled over it
        time.sleep(5)
        assert f"on {allocation}" in outputs_on_disk(lab), f"machine {i + 1}: the notebook on disk lost its outputs"
        assert conflict_copies(lab, allocation) == [], f"machine {i + 1}"
        assert lab.state()["conflicts"] == [], f"machine {i + 1}: {lab.state()['conflicts']}"
        if i == MACHINES - 1:
            break
        lab.portable("market", "lose", allocation)
        wait_for("LOST", lambda: lab.state()["lifecycle"]["state"] == "LOST", 60)
        # saved while no machine serves the workspace: it stays here for the next one
        page.keyboard.press("Control+s")
        lab.api("POST", "portable/api/continue", {})
        wait_for("ACTIVE on a new machine", lambda was=allocation: (s := lab.state()["lifecycle"])["state"] == "ACTIVE"
                 and s["allocation_id"] != was, 180)
    assert len(set(seen)) == MACHINES
    dialogs = page.evaluate("() => window.__portableDialogs")
    assert not [d for d in dialogs if "File Changed" in d or "has changed on disk" in d], dialogs
    lab.screenshot(page, "43-no-conflict-after-continues")
    print(f"{MACHINES} machines, {MACHINES - 1} Continues with saves: {time.monotonic() - started:.1f} s")
