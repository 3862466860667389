"""The first machine (issue 16), in a real JupyterLab on an IDLE workspace: opening a notebook
rents nothing; its first cell brings a notification naming the route and its $/h, and waits;
Cancel rents nothing and the cell says so; Start rents that route and the cell runs on the
machine. With the question switched off in the settings, the first cell starts at once.
One server and one page per setting, the tests in order."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import start_lab
from portable_lab import Lab

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

# only the worker's kernel has JUPYTER_PORTABLE_ALLOCATION: the output says where the cell ran
WHERE = "import os\nprint('ran on', os.environ.get('JUPYTER_PORTABLE_ALLOCATION', 'no machine'))"
STATUS = ".jp-NotebookPanel:visible .jp-Portable-kernelStatus"
QUESTION = re.compile(r"Rent NVIDIA \S+ on local \(local-a\) at \$\d+\.\d\d/h\?")
# every toast that ever shows is remembered, however briefly it stays
WATCH_TOASTS = """() => {
  window.__portableToasts = [];
  new MutationObserver(() => {
    for (const t of document.querySelectorAll('.Toastify__toast')) {
      const text = t.textContent || '';
      if (!window.__portableToasts.includes(text)) window.__portableToasts.push(text);
    }
  }).observe(document.body, {childList: true, subtree: true});
}"""


def machines(lab: Lab) -> list[dict[str, Any]]:
    """What the local market has rented out, as `jupyter portable market list` says."""
    out = json.loads(lab.portable("market", "list", "--json"))
    return [m for m in out["allocations"] if m["state"] not in ("terminated", "lost")]


def open_notebook(browser: Any, lab: Lab, name: str) -> tuple[Any, Any]:
    lab.put_notebook(name, [WHERE])
    context, page = lab.open_page(browser, f"/tree/{name}")
    page.evaluate(WATCH_TOASTS)
    # the notebook's kernel is the local placeholder, and it knows the notebook asks
    expect(page.locator(f'{STATUS}[data-kernel="portable-placeholder"]')).to_have_count(1, timeout=120_000)
    return context, page


def run_first_cell(page: Any) -> Any:
    """Click the cell and press Ctrl+Enter (it stays the active cell); its output area."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").first
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    return cell


def cancelled_words(toast: Any, state: str) -> str:
    """What the cell says after Cancel on ``toast``'s question: nothing was rented, naming the machine
    that question offered (issue 43, item 5: never the route the kernel was started with)."""
    text = toast.inner_text()
    asked = re.search(r"Rent (.+?) on \w+ \(([^)]+)\) at (\$\d+\.\d\d/h)\?.*\(route (\S+)\)\.",
                      text, re.S)
    assert asked, text
    gpu, region, price, route = asked.groups()
    gpu = gpu if re.match(r"\d+x ", gpu) else f"1x {gpu}"
    return (f"Nothing was rented: the question to rent {gpu} on {route} ({region}) at {price} was cancelled, "
            f"and the workspace stays {state}")


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    context, page = open_notebook(browser, lab, "first.ipynb")
    yield page
    context.close()


def test_opening_a_notebook_rents_nothing_and_cancel_leaves_the_workspace_idle(page: Any, lab: Lab) -> None:
    expect(page.locator(STATUS)).to_have_text("No machine yet")
    assert lab.state()["lifecycle"]["state"] == "IDLE"
    assert machines(lab) == [], "opening the notebook rented a machine"

    cell = run_first_cell(page)
    toast = page.locator(".Toastify__toast").filter(has_text=QUESTION)
    expect(toast).to_be_visible(timeout=30_000)
    expect(toast).to_contain_text(re.compile(r"route local/\w+"))
    # the cell waits for the answer, and nothing is rented while it does
    expect(cell.locator(".jp-InputPrompt")).to_contain_text("[*]")
    assert machines(lab) == []
    lab.screenshot(page, "first-01-the-question")

    said = cancelled_words(toast, "IDLE")
    toast.get_by_role("button", name="Cancel").click()
    out = cell.locator(".jp-OutputArea")
    expect(out).to_contain_text(said, timeout=30_000)
    expect(out).to_contain_text("run a cell again and press Start, or press Continue in the portable sidebar")
    expect(cell.locator(".jp-InputPrompt")).not_to_contain_text("[*]")
    assert lab.state()["lifecycle"]["state"] == "IDLE"
    assert machines(lab) == []
    lab.screenshot(page, "first-02-cancelled")


def test_start_rents_the_named_route_and_the_cell_runs_on_the_machine(page: Any, lab: Lab) -> None:
    # the cancelled question's toast may still be sliding out: wait until it is gone, and never
    # count a toast on its way out as the new question
    expect(page.locator(".Toastify__toast").filter(has_text=QUESTION)).to_have_count(0, timeout=30_000)
    cell = run_first_cell(page)
    toast = page.locator(".Toastify__toast:not([class*='slide-exit'])").filter(has_text=QUESTION)
    expect(toast).to_be_visible(timeout=30_000)
    named = re.search(r"route (local/\w+)", toast.inner_text())
    assert named, toast.inner_text()
    toast.get_by_role("button", name="Start").click()

    out = cell.locator(".jp-OutputArea")
    expect(out).to_contain_text(re.compile(r"ran on al-\w+"), timeout=240_000)
    state = lab.state()
    assert state["lifecycle"]["state"] == "ACTIVE"
    machine = state["allocation"]["allocation_id"]
    expect(out).to_contain_text(f"ran on {machine}")
    assert "Nothing was rented" not in out.inner_text()
    rented = machines(lab)
    assert [m["allocation_id"] for m in rented] == [machine]
    assert f"local/{rented[0]['offer_id']}" == named.group(1), (rented, named.group(1))
    lab.screenshot(page, "first-03-started")


@pytest.fixture(scope="module")
def lab_without_question(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    settings = {"jupyter-portable/notebook": {"confirmFirstMachine": False}}
    with start_lab(tmp_path_factory.mktemp("lab-no-question"), settings) as server:
        yield server


def test_with_the_question_switched_off_the_first_cell_starts_at_once(browser: Any,
                                                                     lab_without_question: Lab) -> None:
    lab = lab_without_question
    context, page = open_notebook(browser, lab, "at-once.ipynb")
    try:
        assert machines(lab) == [], "opening the notebook rented a machine"
        cell = run_first_cell(page)
        out = cell.locator(".jp-OutputArea")
        expect(out).to_contain_text(re.compile(r"ran on al-\w+"), timeout=240_000)
        machine = lab.state()["allocation"]["allocation_id"]
        expect(out).to_contain_text(f"ran on {machine}")
        toasts = page.evaluate("() => window.__portableToasts")
        assert not [t for t in toasts if QUESTION.search(t)], toasts
        lab.screenshot(page, "first-04-without-the-question")
    finally:
        context.close()

