"""Issue 30, items 5 and 7, in a real JupyterLab on the local market: the sidebar, the toolbar and a
cell's error say a state in the server's words; after a release a cell asks "Rent ...?" again, as
for the first machine; the Stop line ("RELEASED at version N") goes once the workspace moves on;
the routes table's Total is in sight at 250 px and 720 px; a finished Continue is one summary line
with its log folded; an action's outcome shows right under its button. Screenshots at both widths
in test-output/ui/. The tests run in order on one server and one page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import start_lab
from portable_lab import Lab
from test_first_machine import QUESTION, STATUS, cancelled_words, open_notebook, run_first_cell
from test_glance import badge, sidebar_at

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

# the toast that asks, not one sliding out
ASKING = ".Toastify__toast:not([class*='slide-exit'])"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with start_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    context, page = open_notebook(browser, lab, "words.ipynb")
    yield page
    context.close()


def start_from_the_question(page: Any) -> Any:
    """Run the first cell, press Start in the question; the cell, once it ran on the machine."""
    cell = run_first_cell(page)
    toast = page.locator(ASKING).filter(has_text=QUESTION)
    expect(toast).to_be_visible(timeout=30_000)
    toast.get_by_role("button", name="Start").click()
    expect(cell.locator(".jp-OutputArea")).to_contain_text(re.compile(r"ran on al-\w+"), timeout=240_000)
    return cell


def test_the_total_column_is_in_sight_at_720px_and_250px(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    table = sidebar.locator("table.jp-Portable-routeTable")
    expect(table).to_be_visible(timeout=60_000)
    table.scroll_into_view_if_needed()
    side = sidebar.bounding_box()
    wrap = sidebar.locator("section.jp-Portable-routes .jp-Portable-tableWrap").bounding_box()
    assert side and wrap
    # the table may be wider than the sidebar (it scrolls sideways): Total stays in sight
    totals = [sidebar.locator("th[data-column='total']")] + [
        row.locator("td[data-column='total']") for row in sidebar.locator("tr.jp-Portable-route").all()]
    assert len(totals) >= 3
    for total in totals:
        box = total.bounding_box()
        assert box and box["width"] > 20, box
        assert wrap["x"] <= box["x"] and box["x"] + box["width"] <= wrap["x"] + wrap["width"] + 1, (box, wrap)
    expect(totals[1]).to_have_text(re.compile(r"\$\d"))
    lab.screenshot(page, "50-routes-total-in-sight-720px")
    # at 250 px the routes are cards, each with its total
    sidebar = sidebar_at(page, 250)
    cards = sidebar.locator(".jp-Portable-routeCard")
    expect(cards.first).to_be_visible()
    for card in cards.all()[:3]:
        total = card.locator(".jp-Portable-cardTotal")
        expect(total).to_contain_text("$")
        box, side = total.bounding_box(), sidebar.bounding_box()
        assert box and side and box["x"] + box["width"] <= side["x"] + side["width"] + 1, (box, side)
    cards.first.scroll_into_view_if_needed()
    lab.screenshot(page, "51-routes-total-in-sight-250px")


def test_a_finished_continue_is_a_summary_with_its_log_folded(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    expect(page.locator(STATUS)).to_have_text("No machine yet")
    start_from_the_question(page)
    expect(badge(page)).to_have_text("ACTIVE", timeout=60_000)
    log = sidebar.locator("details.jp-Portable-log")
    expect(log).to_be_visible(timeout=30_000)
    expect(log.locator("summary")).to_have_text(re.compile(r"^Ready( after [^:]+)?: 5 steps done$"))
    steps = log.locator("ol.jp-Portable-steps")
    expect(steps).to_be_hidden()  # folded
    log.scroll_into_view_if_needed()
    lab.screenshot(page, "52-continue-finished-folded-720px")
    log.locator("summary").click()
    expect(steps).to_be_visible()
    for step in ("acquire", "probe", "materialize", "verify", "reconnect"):
        expect(steps.locator(f'[data-step="{step}"]')).to_have_class(re.compile("jp-mod-done"))
    log.locator("summary").click()
    expect(steps).to_be_hidden()
    sidebar_at(page, 250)
    log.scroll_into_view_if_needed()
    lab.screenshot(page, "53-continue-finished-folded-250px")


def test_stop_says_released_in_the_servers_words_under_the_stop_button(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    state = lab.state()
    words = state["states"]
    stop = sidebar.get_by_role("button", name="Stop", exact=True)
    stop.scroll_into_view_if_needed()
    stop.click()
    page.get_by_role("dialog").filter(has_text="Stop the machine?").get_by_role("button", name="Stop").click()
    expect(badge(page)).to_have_text("RELEASED", timeout=120_000)
    version = lab.state()["lifecycle"]["version"]
    line = sidebar.locator(".jp-Portable-status").filter(has_text=f"RELEASED at version {version}")
    expect(line).to_contain_text(words["RELEASED"]["meaning"], timeout=30_000)
    # the outcome shows where the user looked: right under the row the Stop button was in
    row = sidebar.locator("section.jp-Portable-continue .jp-Portable-row").first.bounding_box()
    box = line.bounding_box()
    assert row and box and 0 <= box["y"] - (row["y"] + row["height"]) < 40, (row, box)
    # the badge and the toolbar say the state in the server's words
    expect(badge(page)).to_have_attribute("title", re.compile(re.escape(words["RELEASED"]["meaning"])))
    # (the toolbar may have moved it into its overflow menu at this width: found, not necessarily seen)
    expect(page.locator(".jp-Portable-kernelStatus").first).to_have_text(words["RELEASED"]["label"], timeout=30_000)
    lab.screenshot(page, "54-released-in-the-servers-words-720px")
    sidebar_at(page, 250)
    line.scroll_into_view_if_needed()
    lab.screenshot(page, "55-released-in-the-servers-words-250px")


def test_after_a_release_a_cell_asks_again_as_for_the_first_machine(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    expect(page.locator(f'{STATUS}[data-kernel="portable-placeholder"]')).to_have_count(1, timeout=120_000)
    expect(page.locator(".Toastify__toast").filter(has_text=QUESTION)).to_have_count(0, timeout=30_000)
    cell = run_first_cell(page)
    toast = page.locator(ASKING).filter(has_text=QUESTION)
    expect(toast).to_be_visible(timeout=30_000)
    expect(toast).to_contain_text("its last one was RELEASED")
    # the cell waits for the answer: no error, nothing rented
    expect(cell.locator(".jp-InputPrompt")).to_contain_text("[*]")
    assert lab.state()["lifecycle"]["state"] == "RELEASED"
    expect(toast).to_be_in_viewport(ratio=1)  # slid in whole, for the picture
    lab.screenshot(page, "56-released-the-question-again-720px")
    # the kernel was started naming the stopped machine's own route; the cell names the one offered
    said = cancelled_words(toast, "RELEASED")
    toast.get_by_role("button", name="Cancel").click()
    out = cell.locator(".jp-OutputArea")
    expect(out).to_contain_text(said, timeout=30_000)
    assert lab.state()["lifecycle"]["state"] == "RELEASED"
    # asked again, Start: the cell runs on a new machine, and the Stop line of the old one is gone
    expect(page.locator(".Toastify__toast").filter(has_text=QUESTION)).to_have_count(0, timeout=30_000)
    start_from_the_question(page)
    expect(badge(page)).to_have_text("ACTIVE", timeout=60_000)
    expect(sidebar.locator(".jp-Portable-status").filter(has_text="RELEASED at version")).to_have_count(0)
    sidebar_at(page, 250)
    lab.screenshot(page, "57-released-then-started-again-250px")


def test_a_refusal_shows_under_the_button_that_was_pressed(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page, 720)
    expect(badge(page)).to_have_text("ACTIVE")
    stop = sidebar.get_by_role("button", name="Stop", exact=True)
    stop.scroll_into_view_if_needed()
    stop.click()
    dialog = page.get_by_role("dialog").filter(has_text="Stop the machine?")
    expect(dialog).to_be_visible()
    # while the question is open, a terminal stops the machine: the Stop pressed is refused
    lab.portable("stop")
    dialog.get_by_role("button", name="Stop").click()
    refusal = sidebar.locator(".jp-Portable-status-error").filter(has_text="nothing to stop: the workspace is RELEASED")
    expect(refusal).to_be_visible(timeout=60_000)
    row = sidebar.locator("section.jp-Portable-continue .jp-Portable-row").first.bounding_box()
    box = refusal.bounding_box()
    assert row and box and 0 <= box["y"] - (row["y"] + row["height"]) < 40, (row, box)
    lab.screenshot(page, "58-a-refusal-under-the-button-720px")
    sidebar_at(page, 250)
    refusal.scroll_into_view_if_needed()
    box, side = refusal.bounding_box(), sidebar.bounding_box()
    assert box and side and box["x"] >= side["x"] and box["x"] + box["width"] <= side["x"] + side["width"] + 1
    lab.screenshot(page, "59-a-refusal-under-the-button-250px")
