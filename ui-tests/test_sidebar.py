"""The sidebar in a real JupyterLab, as a researcher uses it: the main flow on the portable
kernel, losing the GPU and continuing on another machine, a route over the cap, a
reservation booked and cancelled, and a setting applied to the workspace. The tests run in
order on one server and one page."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from portable_lab import OUTPUT, PRICE_CAP, Lab, palette_fill

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

SIDEBAR = "#jupyter-portable-sidebar"
CELLS = [
    "import os\nprint('on', os.environ['JUPYTER_PORTABLE_ALLOCATION'])",
    "import torch\ntorch.manual_seed(0)\ntorch.save({'w': torch.randn(8, 8)}, 'ckpt.pt')\n"
    "open('results.txt', 'w').write('loss 0.125\\n')\nprint('saved')",
    "%workspace checkpoint ckpt.pt --step 7 --note 'first run' --settle 0.2 --wait",
    "import os, torch\nprint('on', os.environ['JUPYTER_PORTABLE_ALLOCATION'])\n"
    "print(open('results.txt').read().strip())\nprint('keys', sorted(torch.load('ckpt.pt')))",
]


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    lab.put_notebook("nb.ipynb", CELLS)
    context, page = lab.open_page(browser, "")
    yield page
    context.close()


def open_sidebar(page: Any) -> Any:
    """Show the sidebar through its tab, as a user does (a click on an open tab closes it)."""
    sidebar = page.locator(SIDEBAR)
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-portable-sidebar"]')
    expect(tab).to_be_visible()
    for _ in range(3):
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        try:
            expect(sidebar).to_be_visible(timeout=3_000)
            widen_sidebar(page)
            return sidebar
        except AssertionError:
            continue  # the layout was still being restored
    expect(sidebar).to_be_visible()
    widen_sidebar(page)
    return sidebar


def widen_sidebar(page: Any, width: int = 600) -> None:
    """Drag the left panel's edge so the route table fits in the screenshots."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:visible").first
    box = handle.bounding_box()
    if box and box["x"] < width:
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] / 2, y)
        page.mouse.down()
        page.mouse.move(width, y, steps=5)
        page.mouse.up()


def badge(page: Any) -> Any:
    return page.locator(f"{SIDEBAR} .jp-Portable-allocation .jp-Portable-badge")


def run_cell(page: Any, index: int, expected: str, timeout: float = 120_000) -> str:
    """Run the notebook's cell ``index`` as a user does (click it, Shift+Enter) and wait
    for ``expected`` in its output."""
    cell = page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea")
    try:
        expect(output).to_contain_text(expected, timeout=timeout)
    except AssertionError:
        page.screenshot(path=str(OUTPUT / f"failed-cell-{index}.png"))
        raise
    return str(output.inner_text())


def test_main_flow_checkpoint_shows_as_verified(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)
    name = lab.state()["workspace"]["name"]
    expect(sidebar.locator(".jp-Portable-workspaceName")).to_have_text(name)
    expect(sidebar.locator(".jp-Portable-store")).to_contain_text("file://")
    expect(badge(page)).to_have_text("IDLE")
    lab.screenshot(page, "01-sidebar-idle")

    # The first machine, on the best route, which is preselected.
    best = sidebar.locator("tr.jp-Portable-route.jp-mod-best")
    expect(best.get_by_role("radio")).to_be_checked()
    sidebar.get_by_role("button", name=re.compile("^Continue on ")).click()
    expect(badge(page)).to_have_text("ACTIVE", timeout=180_000)

    # The notebook's portable kernel runs on it.
    page.goto(f"{lab.url}lab/tree/nb.ipynb?token={lab.token}")
    expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
    sidebar = open_sidebar(page)
    expect(page.locator(".jp-StatusBar-Widget", has_text="Python (portable) | Idle").first).to_be_visible(
        timeout=180_000)
    out = run_cell(page, 0, "on al-")
    alloc = lab.state()["allocation"]
    assert alloc and alloc["provider"] == "local"
    assert alloc["allocation_id"] in out
    expect(sidebar.locator(".jp-Portable-allocation")).to_contain_text(alloc["gpu"])
    expect(sidebar.locator(".jp-Portable-allocation")).to_contain_text(alloc["allocation_id"])

    run_cell(page, 1, "saved")
    run_cell(page, 2, "verified")
    verified = sidebar.get_by_role("list", name="verified checkpoints")
    expect(verified).to_contain_text("ckpt.pt")
    expect(verified).to_contain_text("step 7")
    lab.screenshot(page, "02-active-checkpoint-verified")


def test_lost_gpu_then_continue_runs_the_next_cell(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)
    before = lab.state()["allocation"]["allocation_id"]
    lab.portable("market", "lose", before)

    banner = sidebar.get_by_role("alert").filter(has_text="GPU lost")
    expect(banner).to_be_visible(timeout=60_000)
    expect(banner).to_contain_text(re.compile("preempted|market", re.I))
    expect(badge(page)).to_have_text("LOST")
    lab.screenshot(page, "03-gpu-lost")

    # The routes are priced again; choose the A100 rather than the preselected best.
    a100 = sidebar.locator("tr.jp-Portable-route", has_text="A100")
    expect(a100).to_be_visible(timeout=60_000)
    a100.get_by_role("radio").check()
    expect(a100.get_by_role("radio")).to_be_checked()
    continue_button = sidebar.get_by_role("button", name=re.compile("^Continue on .*A100"))
    expect(continue_button).to_be_enabled()
    lab.screenshot(page, "04-route-chosen")
    continue_button.click()

    steps = sidebar.locator("ol.jp-Portable-steps")  # once finished, it folds under a summary
    expect(steps).to_be_visible()
    lab.screenshot(page, "05-continue-in-progress")
    expect(badge(page)).to_have_text("ACTIVE", timeout=180_000)
    expect(sidebar.get_by_text("Ready: the new machine read the workspace back")).to_be_visible()
    for step in ("acquire", "probe", "materialize", "verify", "reconnect"):
        expect(steps.locator(f'[data-step="{step}"]')).to_have_class(re.compile("jp-mod-done"))
    lab.screenshot(page, "06-ready")

    state = lab.state()
    after = state["allocation"]["allocation_id"]
    assert after != before and state["allocation"]["offer"] == "a100"
    # JupyterLab reads the kernel's move as a restart and may say so in a dialog; the user
    # dismisses it, and the same notebook goes on.
    restarted = page.get_by_role("dialog").filter(has_text="Kernel Restarting")
    if restarted.count():
        lab.screenshot(page, "07a-kernel-restarting-dialog")
        restarted.get_by_role("button", name="Ok").click()
    # the status bar follows the kernel onto the new machine without a cell being run (the server's
    # kernel websocket tells a reconnecting notebook the kernel's state; issue 30, item 6)
    expect(page.locator("#jp-main-statusbar .jp-StatusBar-TextItem", has_text="Python (portable) |").first
           ).to_have_text("Python (portable) | Idle", timeout=60_000)
    out = run_cell(page, 3, "keys")
    assert f"on {after}" in out and "loss 0.125" in out and "keys ['w']" in out
    lab.screenshot(page, "07-next-cell-on-the-new-machine")


def test_a_route_over_the_cap_says_why(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)
    sidebar.get_by_role("button", name="price the routes again").click()
    row = sidebar.locator("tr.jp-Portable-route", has_text="H100")
    expect(row).to_have_class(re.compile("jp-mod-blocked"))
    expect(row.get_by_role("radio")).to_be_disabled()
    why = sidebar.locator("tr.jp-Portable-blockedRow").filter(has_text="over a cap")
    expect(why).to_contain_text(f"$24.00/h is over the cap of ${PRICE_CAP:.2f}/h")
    row.scroll_into_view_if_needed()
    lab.screenshot(page, "08-blocked-route")


def test_book_and_cancel_a_reservation(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)
    section = sidebar.locator(".jp-Portable-reservations")
    section.get_by_label("offer type").select_option("local/a100")
    free = section.locator("td.jp-Portable-slot.jp-mod-free").first
    free.scroll_into_view_if_needed()
    start = free.get_attribute("data-start")
    free.click()
    section.get_by_label("charge 2 h before start").check()
    section.get_by_role("button", name="Book", exact=True).click()
    booking = section.locator(".jp-Portable-bookingItem").first
    expect(booking).to_contain_text("local/a100")
    expect(booking).to_contain_text("booked")
    expect(booking).to_contain_text("Capacity-checked")
    lab.screenshot(page, "09-reservation-booked")
    listed = lab.api("GET", "portable/api/reservations?days=7")["reservations"]
    assert [(b["offer_key"], b["start"], b["charge"]) for b in listed] == [("local/a100", start, "before")]

    booking.get_by_role("button", name=re.compile("^Cancel reservation")).click()
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel reservation").click()  # it asks first
    expect(booking).to_contain_text("cancelled")
    lab.screenshot(page, "10-reservation-cancelled")
    assert [b["status"] for b in lab.api("GET", "portable/api/reservations?days=7")["reservations"]] == ["cancelled"]


def test_settings_are_in_the_registry(page: Any, lab: Lab) -> None:
    schema = lab.api("GET", "lab/api/settings/jupyter-portable:plugin")
    props = schema["schema"]["properties"]
    assert {"storeUrl", "budgetCap", "pinnedDriver", "autoSnapshotMinutes"} <= set(props)
    # what the user saved is readable, and holds only settings the schema defines
    assert isinstance(schema["settings"], dict) and set(schema["settings"]) <= set(props), schema["settings"]
    assert all(props[k].get("description") or props[k].get("title") for k in props)


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    """Poll ``check()`` until it returns something truthy; fail saying ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
    return value


def test_a_pinned_driver_applies_to_the_workspace_and_blocks_its_routes(page: Any, lab: Lab) -> None:
    driver = "999.99.99"  # no offer of the catalog lists it
    sidebar = open_sidebar(page)
    sidebar.get_by_role("button", name="Settings…").click()
    # The form's field: its title is a heading, its input follows it.
    heading = page.get_by_role("heading", name="Pinned GPU driver", exact=True)
    field = page.locator(".form-group.small-field", has=heading).get_by_role("textbox")
    expect(field).to_be_visible()
    field.fill(driver)

    # The Settings Editor saves; the sidebar sends it to the workspace and prices the routes again.
    wait_for("the driver in the workspace's settings",
             lambda: lab.api("GET", "portable/api/settings")["requirements"]["driver"] == driver)
    expect(sidebar.locator(".jp-Portable-settings")).to_contain_text(f"driver {driver}")
    rows = sidebar.locator("tr.jp-Portable-route")
    expect(rows.first).to_be_visible()
    expect(sidebar.locator("tr.jp-Portable-route:not(.jp-mod-blocked)")).to_have_count(0)
    why = sidebar.locator('tr.jp-Portable-blockedRow li[data-reason="driver"]')
    expect(why).to_have_count(rows.count())
    expect(why.first).to_contain_text(f"lists driver 550.54.15, {driver} is pinned")
    sidebar.locator("table.jp-Portable-routeTable").scroll_into_view_if_needed()
    lab.screenshot(page, "10b-pinned-driver-blocks-routes")

    # Cleared in the editor, cleared in the workspace: the routes are open again.
    field.fill("")
    wait_for("the driver cleared", lambda: lab.api("GET", "portable/api/settings")["requirements"]["driver"] is None)
    expect(sidebar.locator(".jp-Portable-settings")).to_contain_text("driver any")
    expect(sidebar.locator('tr.jp-Portable-blockedRow li[data-reason="driver"]')).to_have_count(0)
    page.get_by_role("tab", name=re.compile("Settings")).get_by_title(re.compile("Close")).click()


def test_a_slot_can_be_booked_by_keyboard_alone(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)
    section = sidebar.locator(".jp-Portable-reservations")
    grid = section.get_by_role("grid")
    grid.locator('td[tabindex="0"]').focus()
    # End of today's row, then down a day: tomorrow 23:00 (local), ahead and free.
    for key in ("End", "ArrowDown", "Enter", "Shift+ArrowLeft", "Shift+ArrowLeft"):
        page.keyboard.press(key)
    chosen = grid.locator('td[aria-selected="true"]')
    expect(chosen).to_have_count(3)
    expect(section.get_by_role("status").filter(has_text=", 3 h")).to_be_visible()
    book = section.get_by_role("button", name="Book", exact=True)
    expect(book).to_be_enabled()  # once the server's dry run of the selection says it can be booked
    expect(section.locator(".jp-Portable-booking")).to_contain_text("Charged")
    book.focus()
    page.keyboard.press("Enter")
    booked = section.locator(".jp-Portable-bookingItem", has_text="3 h").first
    expect(booked).to_contain_text("booked")
    lab.screenshot(page, "10a-booked-by-keyboard")
    booked.get_by_role("button", name=re.compile("^Cancel reservation")).focus()
    page.keyboard.press("Enter")
    expect(page.locator(".jp-Dialog")).to_contain_text("Cancel this reservation?")
    page.keyboard.press("Enter")  # the dialog's default button confirms
    expect(booked).to_contain_text("cancelled")


def test_the_sidebar_follows_the_dark_theme(page: Any, lab: Lab) -> None:
    sidebar = open_sidebar(page)

    def background() -> list[int]:
        rgb = sidebar.evaluate("n => getComputedStyle(n).backgroundColor")
        return [int(x) for x in re.findall(r"\d+", rgb)[:3]]

    assert sum(background()) > 600  # light
    palette_fill(page, "Use Theme: JupyterLab Dark")
    page.keyboard.press("Enter")
    expect(page.locator("body")).to_have_attribute("data-jp-theme-name", "JupyterLab Dark")
    page.wait_for_timeout(500)  # the theme's stylesheet settles
    assert sum(background()) < 200  # dark, from JupyterLab's variables alone
    sidebar.locator("table.jp-Portable-routeTable").scroll_into_view_if_needed()
    lab.screenshot(page, "11-dark-theme")
