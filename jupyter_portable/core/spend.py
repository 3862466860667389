"""Spend accounting: what an allocation has cost and where the budget stands. Pure; the caller
passes ``now`` (nothing here reads a clock)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from jupyter_portable.core.errors import UsageError

BUDGET_STATES = ("ok", "warn", "exhausted")
LOW_HOURS = 1.0  # under this many hours left at the current price, warn whatever the fraction


@dataclass(frozen=True)
class Budget:
    """A $/h ceiling for any one offer, a total for the workspace, and when to warn."""

    max_price_per_hour: float | None = None
    total: float | None = None
    warn_fraction: float = 0.8

    def __post_init__(self) -> None:
        for name in ("max_price_per_hour", "total"):
            value = getattr(self, name)
            if value is not None and not (0 <= value < math.inf):
                raise UsageError(f"budget {name} must be a non-negative number, not {value!r}")
        if not (0 < self.warn_fraction <= 1):
            raise UsageError(f"budget warn_fraction must be within (0, 1], not {self.warn_fraction!r}")

    def to_json(self) -> dict[str, Any]:
        return {"max_price_per_hour": self.max_price_per_hour, "total": self.total,
                "warn_fraction": self.warn_fraction}


def spend_of(price_per_hour: float, started: datetime, stopped: datetime | None, now: datetime,
             provider_figure: float | None = None) -> float:
    """Dollars an allocation has cost: the provider's own figure when it gives one, else
    ``price_per_hour`` x hours from ``started`` to ``stopped`` (or ``now`` while it runs)."""
    if provider_figure is not None:
        # The provider's invoice counts minimums, rounding and disk we cannot see.
        if not (0 <= provider_figure < math.inf):
            raise UsageError(f"bad provider spend figure {provider_figure!r}")
        return float(provider_figure)
    if not (0 <= price_per_hour < math.inf):
        raise UsageError(f"bad price {price_per_hour!r}")
    end = stopped if stopped is not None else now
    if any(t.tzinfo is None or t.utcoffset() is None for t in (started, end)):
        # A naive time is read in some unknown zone: hours would be off by the offset.
        raise UsageError("started, stopped and now must be timezone-aware")
    seconds = (end - started).total_seconds()
    # A clock that moved backwards must not produce a refund.
    return price_per_hour * max(seconds, 0.0) / 3600


def _hours_at(left: float, price_per_hour: float) -> float | None:
    return left / price_per_hour if price_per_hour > 0 else None


def budget_state(spent: float, budget: Budget, price_per_hour: float,
                 now_hours_left_fn: Callable[[float, float], float | None] | None = None) -> dict[str, Any]:
    """Where the budget stands: ``{"spent", "total", "left", "state", "hours_left", "message"}``.

    ``state`` is "warn" from ``budget.warn_fraction`` of the total, or when under an hour is
    left at ``price_per_hour``; "exhausted" at or over the total. On "exhausted" the caller
    must SEAL the workspace (publish the final manifest, read it back) and then release the
    allocation: never kill it, or the work since the last snapshot is lost.
    ``now_hours_left_fn(left, price_per_hour)`` replaces the plain ``left / price`` where a
    provider bills otherwise (per-minute minimums, tiers); None means "unbounded".
    """
    if not (0 <= spent < math.inf) or not (0 <= price_per_hour < math.inf):
        raise UsageError("spent and price_per_hour must be non-negative numbers")
    out: dict[str, Any] = {"spent": round(spent, 4), "total": budget.total, "left": None, "state": "ok",
                           "hours_left": None, "message": f"spent ${spent:,.2f}; no budget set"}
    if budget.total is None:
        return out
    left = max(budget.total - spent, 0.0)
    hours_left = (now_hours_left_fn or _hours_at)(left, price_per_hour)
    out["left"] = round(left, 4)
    out["hours_left"] = None if hours_left is None else round(hours_left, 4)
    share = spent / budget.total if budget.total > 0 else 1.0
    at = f"spent ${spent:,.2f} of ${budget.total:,.2f} ({share:.0%})"
    if spent >= budget.total:
        out["state"] = "exhausted"
        out["message"] = f"budget exhausted: {at}; sealing the workspace and releasing the GPU"
    elif share >= budget.warn_fraction or (hours_left is not None and hours_left < LOW_HOURS):
        out["state"] = "warn"
        until = f"; about {hours_left:.1f} h left at ${price_per_hour:.2f}/h" if hours_left is not None else ""
        out["message"] = f"budget nearly spent: {at}{until}"
    else:
        until = f"; about {hours_left:.1f} h left at ${price_per_hour:.2f}/h" if hours_left is not None else ""
        out["message"] = f"{at}{until}"
    return out


def money(dollars: float) -> str:
    """Dollars as the sidebar shows a 4-decimal figure of the API: cents rounded half up,
    "<$0.01" under a cent (labextension/src/format.ts ``money``)."""
    x = round(dollars, 4)
    if x != 0 and abs(x) < 0.01:
        return "-<$0.01" if x < 0 else "<$0.01"
    cents = Decimal(abs(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    return f"{'-' if x < 0 and cents else ''}${cents}"


def spend_line(total: float, current: float | None) -> str:
    """One spend figure: "$0.04 so far: $0.03 on this machine, $0.01 before" (``current``:
    the machine serving the workspace now, None when there is none)."""
    if current is None:
        return f"{money(total)} so far, on earlier machines" if total > 0 else "Nothing spent yet"
    before = max(0.0, total - current)
    return f"{money(total)} so far: {money(current)} on this machine, {money(before)} before"


def admits_price(price_per_hour: float, budget: Budget) -> str | None:
    """The reason ``price_per_hour`` is over the budget's $/h cap, or None when it is within it."""
    cap = budget.max_price_per_hour
    if cap is not None and price_per_hour > cap:
        return f"${price_per_hour:.2f}/h is over the cap of ${cap:.2f}/h"
    return None


__all__ = ["BUDGET_STATES", "Budget", "admits_price", "budget_state", "money", "spend_line", "spend_of"]
