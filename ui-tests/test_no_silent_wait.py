"""Issue 43, items 1, 4 and 7, in a real JupyterLab on the local market, one server and one page,
the tests in order: the first cell's question left unanswered while the sidebar's Continue rents
the machine; the money left ticking while it runs, the same in the sidebar, `spend` and `state`;
after Stop, with every route over the $/h cap, JupyterLab's status bar says there is no machine
and a cell ends within seconds with the reason, never a silent [*]; with the cap raised, its
question names the route open now, and the stop button's output names it too."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import start_lab
from portable_lab import CATALOG, Lab
from test_first_machine import WATCH_TOASTS
from test_glance import badge, sidebar_at
from test_kernel_indicators import status_bar

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

SIDEBAR = "#jupyter-portable-sidebar"
# one offer under the tests' $5.00/h cap, dear enough that its spend moves a cent every 7.5 s
ONE_OFFER = CATALOG.split("[[offer]]")[0] + """
[[offer]]
id = "a10"
gpu = "NVIDIA A10"
gpu_count = 1
gpu_memory_gb = 24
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 4.80
region = "local-a"
capacity = 2
boot_seconds = 0
launch_failure_rate = 0
reliability = 0.99
bandwidth_mbps = 10000
"""
CELLS = ["import os\nprint('ran on', os.environ.get('JUPYTER_PORTABLE_ALLOCATION', 'no machine'))",
         "print('after the stop')"]
QUESTION = re.compile(r"Rent NVIDIA A10 on local \(local-a\) at \$4\.80/h\?")
STATUS = ".jp-NotebookPanel:visible .jp-Portable-kernelStatus"
ASK_IMPLEMENTATION = """async () => {
  const panel = [...window.jupyterapp.shell.widgets('main')].find(w => w.sessionContext);
  const kernel = panel && panel.sessionContext.session && panel.sessionContext.session.kernel;
  if (!kernel) return '';
  const reply = await Promise.race([kernel.requestKernelInfo(), new Promise(r => setTimeout(r, 3000))]);
  return (reply && reply.content && reply.content.implementation) || '';
}"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with start_lab(tmp_path_factory.mktemp("lab"), catalog=ONE_OFFER,
                   lab_args=("--LabApp.expose_app_in_browser=True",)) as server:
        yield server


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    lab.put_notebook("wait.ipynb", CELLS)
    context, page = lab.open_page(browser, "/tree/wait.ipynb")
    page.evaluate(WATCH_TOASTS)
    expect(page.locator(f'{STATUS}[data-kernel="portable-placeholder"]')).to_have_count(1, timeout=120_000)
    yield page
    context.close()


def cell(page: Any, index: int) -> Any:
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)


def run(page: Any, index: int) -> Any:
    """Click the cell and press Ctrl+Enter (it stays the active cell); the cell."""
    cell(page, index).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    return cell(page, index)


def question(page: Any) -> Any:
    return page.locator(".Toastify__toast:not([class*='slide-exit'])").filter(has_text=QUESTION)


def wait_for_placeholder(page: Any) -> None:
    """Until the notebook's kernel answers as the placeholder (the machine's kernel was replaced)."""
    deadline = time.monotonic() + 90
    while page.evaluate(ASK_IMPLEMENTATION) != "portable-placeholder":
        assert time.monotonic() < deadline, "the notebook's kernel never became the placeholder"
        time.sleep(0.5)


def money_left(text: str) -> float:
    found = re.search(r"\$(\d+\.\d\d) left", text)
    assert found, text
    return float(found.group(1))


def test_a_question_left_open_while_the_sidebar_continues_goes_away(page: Any, lab: Lab) -> None:
    first = run(page, 0)
    expect(question(page)).to_be_visible(timeout=30_000)
    # not answered: the user presses Continue in the sidebar instead (its REST call)
    lab.api("POST", "portable/api/continue", {})
    expect(first.locator(".jp-OutputArea")).to_contain_text(re.compile(r"ran on al-\w+"), timeout=240_000)
    expect(badge(page)).to_have_text("ACTIVE", timeout=60_000)
    # the question no longer stands: it is gone, not left to start a second machine
    expect(question(page)).to_have_count(0, timeout=30_000)


def refusal_left(page: Any) -> float:
    """The left a route's refusal quotes in the sidebar ("over the $29.95 left of the budget")."""
    found = re.search(r"over the \$(\d+\.\d\d) left of the budget", page.locator(SIDEBAR).inner_text())
    assert found, page.locator(SIDEBAR).inner_text()
    return float(found.group(1))


def test_the_money_left_ticks_while_the_machine_runs_and_every_view_says_it(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    spend = page.locator(f'{SIDEBAR} [aria-label="spend"]')
    # $30: the A10's planned 8 h ($38.40) are over what is left, and its refusal quotes the figure
    lab.portable("settings", "--budget", "30")
    expect(spend).to_contain_text("budget $30.00", timeout=20_000)
    expect(sidebar).to_contain_text("left of the budget", timeout=20_000)
    # nothing else happens: the figure moves by itself, a cent every 7.5 s at $4.80/h, in the
    # spend line and in the route's refusal alike
    before, quoted = spend.inner_text(), refusal_left(page)
    expect(spend).not_to_have_text(before, timeout=30_000)
    deadline = time.monotonic() + 30
    while refusal_left(page) == quoted:
        assert time.monotonic() < deadline, "the route's refusal still quotes what was left before"
        time.sleep(0.5)
    assert abs(refusal_left(page) - money_left(spend.inner_text())) <= 0.011
    lab.screenshot(page, "60-budget-ticking-720px")
    # one figure: `spend` and `state`, asked between two looks at the sidebar, fall between them
    seen = money_left(spend.inner_text())
    said = lab.portable_json("spend")["left"]
    stated = lab.portable_json("state")["budget"]["left"]
    assert "budget: $" in lab.portable("state")
    time.sleep(2.5)  # the server's next check (every 2 s) tells the sidebar the newest cent
    later = money_left(spend.inner_text())
    for figure in (said, stated):
        assert later - 0.02 <= figure <= seen + 0.02, (seen, said, stated, later)


def test_after_stop_with_every_route_over_the_cap_the_status_bar_and_a_cell_say_so(page: Any, lab: Lab) -> None:
    lab.portable("settings", "--max-price", "1")  # the A10's $4.80/h is over it
    lab.api("POST", "portable/api/stop", {})
    expect(badge(page)).to_have_text("RELEASED", timeout=180_000)
    # JupyterLab's status bar: no machine, not "Idle" (item 7)
    expect(status_bar(page)).to_have_text("Python (portable) | No machine (RELEASED)", timeout=60_000)
    wait_for_placeholder(page)
    t0 = time.monotonic()
    out = run(page, 1).locator(".jp-OutputArea")
    # within seconds, with the reason and what to do (item 1)
    expect(out).to_contain_text("No machine was started: no route is open", timeout=20_000)
    took = time.monotonic() - t0
    expect(out).to_contain_text("over the cap of $1.00/h")
    expect(out).to_contain_text("raise the budget or the $/h cap")
    expect(cell(page, 1).locator(".jp-InputPrompt")).not_to_contain_text("[*]")
    expect(status_bar(page)).to_have_text("Python (portable) | No machine (RELEASED)")
    assert took < 20, took
    lab.screenshot(page, "61-no-route-ends-the-cell-720px")


def test_with_the_cap_raised_the_question_and_an_interrupt_name_the_route_open_now(page: Any, lab: Lab) -> None:
    lab.portable("settings", "--max-price", "5", "--budget", "50")  # the A10's 8 h fit again
    expect(page.locator(f"{SIDEBAR}")).to_contain_text("Budget cap $50.00", timeout=20_000)
    held = run(page, 1)
    expect(question(page)).to_be_visible(timeout=30_000)
    expect(held.locator(".jp-InputPrompt")).to_contain_text("[*]")
    expect(status_bar(page)).to_have_text("Python (portable) | No machine (RELEASED)")
    # the stop button (Kernel > Interrupt)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
    out = held.locator(".jp-OutputArea")
    expect(out).to_contain_text("Nothing was rented", timeout=30_000)
    expect(out).to_contain_text("Continue would take: 1x NVIDIA A10 on local/a10 (local-a) at $4.80/h")
    assert "no route is open now" not in out.inner_text()
    question(page).get_by_role("button", name="Cancel").click()
    expect(question(page)).to_have_count(0, timeout=30_000)
    lab.screenshot(page, "62-interrupt-names-the-open-route-720px")
