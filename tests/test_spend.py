"""Spend accounting: what an allocation cost, and where the budget stands (numbers worked by hand)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jupyter_portable.core.calendar import Booking, cancel
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.spend import (
    Budget,
    admits_price,
    budget_left,
    budget_state,
    committed_of,
    committed_to,
    spend_of,
)

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=timezone.utc)


def test_spend_is_price_times_hours_until_stopped_or_now() -> None:
    # stopped after 2 h 30 min at $2.40/h: 2.5 * 2.40 = 6.00
    assert spend_of(2.40, T0, T0 + timedelta(hours=2, minutes=30), now=T0 + timedelta(hours=9)) == pytest.approx(6.00)
    # still running at 11:15: 1.25 h * 2.40 = 3.00
    assert spend_of(2.40, T0, None, now=T0 + timedelta(minutes=75)) == pytest.approx(3.00)
    # the same instant in another zone counts the same
    cet = timezone(timedelta(hours=1))
    assert spend_of(2.40, T0, (T0 + timedelta(hours=1)).astimezone(cet), now=T0) == pytest.approx(2.40)


def test_the_providers_own_figure_wins() -> None:
    assert spend_of(2.40, T0, None, now=T0 + timedelta(hours=1), provider_figure=3.17) == 3.17
    assert spend_of(2.40, T0, None, now=T0 + timedelta(hours=1), provider_figure=0.0) == 0.0


def test_a_clock_that_went_backwards_costs_nothing_and_naive_times_are_refused() -> None:
    assert spend_of(2.40, T0, T0 - timedelta(minutes=5), now=T0) == 0
    with pytest.raises(UsageError, match="timezone-aware"):
        spend_of(2.40, datetime(2026, 11, 3, 10), None, now=T0)
    with pytest.raises(UsageError):
        spend_of(-1, T0, None, now=T0)
    with pytest.raises(UsageError):
        spend_of(1, T0, None, now=T0, provider_figure=-2)


def test_budget_ok_warn_and_exhausted() -> None:
    budget = Budget(total=100.0)
    # $50 of $100 at $2/h: 50 left, 25 h left
    state = budget_state(50.0, budget, 2.0)
    assert state == {"spent": 50.0, "committed": 0.0, "total": 100.0, "left": 50.0, "state": "ok",
                     "hours_left": 25.0, "message": "$50.00 left of the $100.00 budget: $50.00 spent; "
                                                    "about 25.0 h at $2.00/h"}
    # $80 of $100 is the 0.8 warn fraction: 20 left, 10 h
    state = budget_state(80.0, budget, 2.0)
    assert (state["state"], state["left"], state["hours_left"]) == ("warn", 20.0, 10.0)
    # $79 spent (79%) but at $30/h the $21 left last 0.7 h: under an hour warns too
    state = budget_state(79.0, budget, 30.0)
    assert (state["state"], state["hours_left"]) == ("warn", pytest.approx(0.7))
    # at and over the total: exhausted, nothing left, and the message says seal, not kill
    for spent in (100.0, 120.0):
        state = budget_state(spent, budget, 2.0)
        assert (state["state"], state["left"], state["hours_left"]) == ("exhausted", 0.0, 0.0)
        assert "sealing the workspace" in state["message"]


def test_budget_without_a_total_or_with_a_free_gpu() -> None:
    state = budget_state(12.5, Budget(), 2.0)
    assert (state["state"], state["left"], state["hours_left"], state["total"]) == ("ok", None, None, None)
    # a $0/h GPU never runs the budget out: hours_left is unbounded (None)
    state = budget_state(10.0, Budget(total=100.0), 0.0)
    assert (state["state"], state["hours_left"]) == ("ok", None)


def test_warn_fraction_and_a_custom_hours_left() -> None:
    # warn from 50%: $60 of $100 warns
    assert budget_state(60.0, Budget(total=100.0, warn_fraction=0.5), 1.0)["state"] == "warn"
    # a provider with a 30-minute minimum per start: (100 - 50) / 2 - 0.5 = 24.5 h
    state = budget_state(50.0, Budget(total=100.0), 2.0, lambda left, price: left / price - 0.5)
    assert state["hours_left"] == 24.5


def test_bad_budgets_are_refused() -> None:
    for kwargs in ({"warn_fraction": 0}, {"warn_fraction": 1.5}, {"total": -1}, {"max_price_per_hour": -0.5}):
        with pytest.raises(UsageError):
            Budget(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        budget_state(-1.0, Budget(total=10), 1.0)


def test_admits_price_names_the_cap() -> None:
    budget = Budget(max_price_per_hour=2.0)
    assert admits_price(2.5, budget) == "$2.50/h is over the cap of $2.00/h"
    assert admits_price(2.0, budget) is None
    assert admits_price(99.0, Budget()) is None


def _booking(rid: str, price: float, start: datetime, hours: float = 24, guarantee: str = "best-effort") -> Booking:
    return Booking.new(rid, "aws/p5.48xlarge@us-east-1a", start, hours, charge="now", guarantee=guarantee,
                       price=price, created=T0)


def test_a_capacity_block_counts_once_whether_its_machine_ran_or_not() -> None:
    # issue 30 item 2: a $10 budget, a $7.16 Capacity Block bought, $0.07 spent elsewhere
    block = _booking("cr-1", 7.16, T0 + timedelta(days=1), guarantee="provider")
    before = T0 + timedelta(hours=1)
    assert committed_to(block, 0.0, before) == pytest.approx(7.16)
    state = budget_state(0.07, Budget(total=10.0), 0.0, committed=committed_of([block], {}, before))
    assert state["left"] == pytest.approx(2.77)
    assert state["message"] == "$2.77 left of the $10.00 budget: $0.07 spent, $7.16 committed to bookings"
    # a machine launched into the block records $3.00 at the block's rate: spent grows by 3.00, the
    # commitment shrinks by 3.00, and what is left stays $2.77 (money counted once)
    during = T0 + timedelta(days=1, hours=10)
    committed = committed_of([block], {"cr-1": 3.00}, during)
    assert committed == pytest.approx(4.16)
    assert budget_left(10.0, 0.07 + 3.00, committed) == pytest.approx(2.77)
    # the block is paid and final: after its slot the unused part is still money gone
    after = T0 + timedelta(days=3)
    assert committed_of([block], {"cr-1": 3.00}, after) == pytest.approx(4.16)
    # a machine that ran past the block's price never makes the commitment negative
    assert committed_to(block, 9.0, after) == 0.0


def test_a_booking_not_sold_by_a_provider_holds_money_back_until_its_slot_starts() -> None:
    slot = _booking("res-1", 5.0, T0 + timedelta(hours=3), hours=2)
    assert committed_to(slot, 0.0, T0) == 5.0
    # from its start the machine that runs in it records its own spend: the booking holds nothing more
    assert committed_to(slot, 0.0, T0 + timedelta(hours=3)) == 0.0
    assert committed_to(slot, 0.0, T0 + timedelta(hours=9)) == 0.0
    # cancelled: nothing is held back, refunded or not
    gone = cancel(slot, T0 + timedelta(hours=1))
    assert isinstance(gone, Booking)
    assert committed_to(gone, 0.0, T0 + timedelta(hours=1)) == 0.0


def test_bookings_use_up_the_budget_and_the_state_says_so() -> None:
    budget = Budget(total=10.0)
    # $1 spent, $9 booked ahead: nothing left, exhausted (the running machine is sealed)
    state = budget_state(1.0, budget, 2.0, committed=9.0)
    assert (state["state"], state["left"], state["hours_left"]) == ("exhausted", 0.0, 0.0)
    assert "$1.00 spent, $9.00 committed to bookings" in state["message"]
    # $1 spent and $6 booked: 70% used is under the 0.8 warning, $3 left is 1.5 h at $2/h
    state = budget_state(1.0, budget, 2.0, committed=6.0)
    assert (state["state"], state["left"], state["hours_left"]) == ("ok", 3.0, 1.5)
    # no budget: nothing is "left", whatever was booked
    assert budget_left(None, 1.0, 6.0) is None
