"""The sidebar read at a glance at JupyterLab's default width (250 px): route cards with their
name, total and time to Ready; Continue from the command palette; Stop and a booking's
Cancel asked first; a loss on the local market raising that offer's risk with the reason; the
Machines section listing both machines of a Continue; a booking over the budget refused with
the cap's words. The tests run in order on one server and one page; each key state leaves a
screenshot in test-output/ui/ (the documentation's images are refreshed from them)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from portable_lab import Lab, palette_fill

expect: Any = None
try:
    from playwright.sync_api import expect
except ImportError:  # the collection hook skips every test, saying why
    pass

SIDEBAR = "#jupyter-portable-sidebar"
WIDTH = 250


@pytest.fixture(scope="module")
def page(browser: Any, lab: Lab) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{lab.url}lab?reset&token={lab.token}")
    expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
    yield page
    context.close()


def sidebar_at(page: Any, width: int = WIDTH) -> Any:
    """The sidebar, shown through its tab and dragged to ``width`` px."""
    sidebar = page.locator(SIDEBAR)
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-portable-sidebar"]')
    for _ in range(3):
        if "lm-mod-current" not in (tab.get_attribute("class") or ""):
            tab.click()
        try:
            expect(sidebar).to_be_visible(timeout=3_000)
            break
        except AssertionError:
            continue  # the layout was still being restored
    expect(sidebar).to_be_visible()
    box = sidebar.bounding_box()
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:visible").first.bounding_box()
    if box and handle and abs(box["width"] - width) > 2:
        y = handle["y"] + handle["height"] / 2
        page.mouse.move(handle["x"] + handle["width"] / 2, y)
        page.mouse.down()
        page.mouse.move(box["x"] + width + handle["width"] / 2, y, steps=5)
        page.mouse.up()
    box = sidebar.bounding_box()
    assert box and abs(box["width"] - width) <= 4, box
    return sidebar


def badge(page: Any) -> Any:
    return page.locator(f"{SIDEBAR} .jp-Portable-allocation .jp-Portable-badge")


def route_of(lab: Lab, offer: str) -> dict[str, Any]:
    return next(r for r in lab.api("GET", "portable/api/routes?hours=8")["routes"] if r["offer"] == offer)


def test_every_route_card_shows_its_name_total_and_time_to_ready(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page)
    cards = sidebar.locator("li.jp-Portable-routeCard")
    expect(cards).to_have_count(3, timeout=60_000)
    expect(sidebar.locator("table.jp-Portable-routeTable")).to_have_count(0)
    for route in lab.api("GET", "portable/api/routes?hours=8")["routes"]:
        card = sidebar.locator(f'li.jp-Portable-routeCard[data-route="{route["id"]}"]')
        expect(card.locator(".jp-Portable-cardName")).to_contain_text(route["gpu"])
        expect(card.locator(".jp-Portable-cardName")).to_contain_text("Local market")
        total = card.locator(".jp-Portable-cardTotal")
        expect(total).to_have_text(re.compile(r"^(\$\d+\.\d\d|<\$0\.01)$"))
        expect(card.locator(".jp-Portable-cardReady")).to_have_text(re.compile(r"^ready in ~\d+ (s|min|h)$"))
        expect(card.locator(".jp-Portable-cardChecks")).to_contain_text("not launched")
        for part in ("name", "total", "ready"):
            box = card.locator(f".jp-Portable-card{part.capitalize()}").bounding_box()
            assert box and box["x"] + box["width"] <= WIDTH + 60, f"the {part} fits the 250 px sidebar"
    blocked = sidebar.locator("li.jp-Portable-routeCard.jp-mod-blocked", has_text="H100")
    expect(blocked).to_contain_text("$24.00/h is over the cap of $5.00/h")
    lab.screenshot(page, "glance-01-route-cards-250px")


def test_the_command_palette_runs_continue(page: Any, lab: Lab) -> None:
    sidebar_at(page)
    expect(badge(page)).to_have_text("IDLE")
    palette_fill(page, "Portable: Continue")
    expect(page.locator(".jp-ModalCommandPalette .lm-CommandPalette-item",
                        has_text="Continue on the Chosen Route")).to_be_visible()
    page.keyboard.press("Enter")
    expect(badge(page)).to_have_text("ACTIVE", timeout=180_000)
    lab.screenshot(page, "glance-02-continue-from-the-palette")


def test_stop_asks_first(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page)
    sidebar.get_by_role("button", name="Stop", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Stop the machine?")
    expect(dialog).to_contain_text("billing ends")
    lab.screenshot(page, "glance-03-stop-asks-first")
    dialog.get_by_role("button", name="Keep").click()
    expect(dialog).to_have_count(0)
    page.wait_for_timeout(500)
    expect(badge(page)).to_have_text("ACTIVE")
    assert lab.state()["lifecycle"]["state"] == "ACTIVE", "nothing was stopped"


def test_after_a_loss_that_offers_route_shows_the_preemption_and_a_higher_risk(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page)
    alloc = lab.state()["allocation"]
    offer = alloc["offer"]
    before = route_of(lab, offer)
    assert before["history"] == []
    lab.portable("market", "lose", alloc["allocation_id"])
    expect(badge(page)).to_have_text("LOST", timeout=60_000)
    after = route_of(lab, offer)
    assert after["p_fail"] > before["p_fail"] and after["cost"]["risk"] >= before["cost"]["risk"]
    card = sidebar.locator(f'li.jp-Portable-routeCard[data-route="{after["id"]}"]')
    risk = card.locator(".jp-Portable-cardRisk")
    expect(risk).to_contain_text(re.compile(r"preempted (just now|\d+ (s|min) ago)"), timeout=60_000)
    shown = int(re.search(r"(\d+)% chance", risk.inner_text()).group(1))  # type: ignore[union-attr]
    assert shown == round(after["p_fail"] * 100) and shown > round(before["p_fail"] * 100)
    # the banner, Continue and the routes stay readable at the top
    expect(sidebar.get_by_role("alert").filter(has_text="GPU lost")).to_be_visible()
    lab.screenshot(page, "glance-04-loss-raises-the-risk")


def test_the_machines_section_lists_both_machines_of_a_continue(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page)
    lost = lab.state()["machines"][0]
    sidebar.get_by_role("button", name=re.compile("^Continue on ")).click()
    expect(badge(page)).to_have_text("ACTIVE", timeout=180_000)
    state = lab.state()
    now = state["allocation"]
    machines = sidebar.get_by_role("list", name="machines, newest first")
    items = machines.locator("li.jp-Portable-machineItem")
    expect(items).to_have_count(2, timeout=30_000)
    first, second = items.nth(0), items.nth(1)
    expect(first).to_have_attribute("data-allocation", now["allocation_id"])
    expect(first).to_contain_text("this machine")
    expect(first.locator(".jp-Portable-machineCost")).to_have_text(re.compile(r"^(\$\d+\.\d\d|<\$0\.01)$"))
    expect(second).to_have_attribute("data-allocation", lost["allocation_id"])
    expect(second).to_contain_text("lost")
    expect(second.locator(".jp-Portable-machineReason")).to_have_text(lost["reason"])
    expect(second.locator(".jp-Portable-machineCost")).to_have_text(re.compile(r"^(\$\d+\.\d\d|<\$0\.01)$"))
    spend = sidebar.get_by_label("spend")
    expect(spend).to_contain_text(re.compile(r"so far: (\$\d+\.\d\d|<\$0\.01) on this machine, .* before"))
    machines.scroll_into_view_if_needed()
    lab.screenshot(page, "glance-05-machines-history")


def test_a_booking_over_the_budget_is_refused_and_a_cancel_asks_first(page: Any, lab: Lab) -> None:
    sidebar = sidebar_at(page)
    lab.api("PUT", "portable/api/settings", {"budget_total": 1})
    try:
        section = sidebar.locator(".jp-Portable-reservations")
        section.get_by_label("offer type").select_option("local/a100")
        free = section.locator("td.jp-Portable-slot.jp-mod-free").first
        free.scroll_into_view_if_needed()
        free.click()
        # the server's dry run says so before Book is pressed, in the booking's own words
        refused = section.locator(".jp-Portable-booking .jp-Portable-hint")
        over = re.compile(r"\$1\.50 total for 1 h is over the \$[01]\.\d\d left of the budget")
        expect(refused).to_contain_text(over)
        expect(section.get_by_role("button", name="Book", exact=True)).to_be_disabled()
        lab.screenshot(page, "glance-06-booking-over-the-budget")
        assert lab.api("GET", "portable/api/reservations?days=7")["reservations"] == []
    finally:
        lab.api("PUT", "portable/api/settings", {"budget_total": ""})
    section.get_by_role("button", name="Book", exact=True).click()
    booking = section.locator(".jp-Portable-bookingItem").first
    expect(booking).to_contain_text("booked")
    expect(booking).to_contain_text("A100")
    expect(booking).to_contain_text("Continue starts on the booked machine")
    cancel = booking.get_by_role("button", name=re.compile("^Cancel reservation"))
    cancel.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Cancel this reservation?")
    dialog.get_by_role("button", name="Keep").click()
    expect(booking).to_contain_text("booked")
    cancel.click()
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel reservation").click()
    expect(booking).to_contain_text("cancelled")
    lab.screenshot(page, "glance-07-booking-cancelled")
