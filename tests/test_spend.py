"""Spend accounting: what an allocation cost, and where the budget stands (numbers worked by hand)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.spend import Budget, admits_price, budget_state, spend_of

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
    assert state == {"spent": 50.0, "total": 100.0, "left": 50.0, "state": "ok", "hours_left": 25.0,
                     "message": "spent $50.00 of $100.00 (50%); about 25.0 h left at $2.00/h"}
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
