"""Spend accounting: what an allocation has cost and where the budget stands. Pure; the caller
passes ``now`` (nothing here reads a clock)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from jupyter_portable.core.calendar import Booking
from jupyter_portable.core.errors import UsageError

BUDGET_STATES = ("ok", "warn", "exhausted")
# Where a spend figure comes from, best first: the provider's bill (its billing or charges records),
# the provider's own rate x its own start time, or a listed price x time (an estimate).
SPEND_SOURCES = ("bill", "provider-rate", "estimate")
# records written before sources had these names: "provider" was the provider's own rate x time
_OLD_SOURCES = {"provider": "provider-rate"}
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


def spend_source(value: object, default: str = "estimate") -> str:
    """``value`` as one of :data:`SPEND_SOURCES` (an older record's name read as today's), else ``default``."""
    name = _OLD_SOURCES.get(value, value) if isinstance(value, str) else None
    return name if name in SPEND_SOURCES else default


def settled_spend(billed: tuple[float | None, str | None] | None, seen: tuple[float | None, str | None] | None,
                  price_per_hour: float | None, held_s: float | None) -> tuple[float, str]:
    """What an ended (released, lost, failed or refused) allocation cost, with its source: the
    provider's figure asked at the end (``billed``) when it has one above zero, else the last figure
    seen while it ran (``seen``: a pod that exited reads 0.0), else ``price_per_hour`` x ``held_s``
    seconds as an estimate. Never $0 for a machine held for a while at a price."""
    for figure in (billed, seen):
        if figure is not None and figure[0] is not None and 0 < figure[0] < math.inf:
            return float(figure[0]), spend_source(figure[1])
    if not price_per_hour or not (0 <= price_per_hour < math.inf) or not held_s or not (0 < held_s < math.inf):
        return 0.0, "estimate"
    return float(price_per_hour) * held_s / 3600, "estimate"


def _hours_at(left: float, price_per_hour: float) -> float | None:
    return left / price_per_hour if price_per_hour > 0 else None


def committed_to(booking: Booking, spent_in_it: float, now: datetime) -> float:
    """The dollars of ``booking``'s price that the budget still holds back at ``now`` (not yet in
    any machine's spend), ``spent_in_it`` being what machines launched into it have recorded.

    A slot the provider sold (an AWS Capacity Block) is paid and final: its price counts, less what
    machines launched into it recorded (they are priced at the block's rate, so that part is spent
    already). Any other booking is money promised for a slot to come: its price counts until the slot
    starts; from then on the machine that runs in it records what it costs, as any machine does.
    A cancelled booking holds nothing back, except what a provider kept of one it sold."""
    if booking.guarantee == "provider":
        kept = booking.price - (booking.refund or 0.0) if booking.status == "cancelled" else booking.price
        return max(0.0, kept - max(spent_in_it, 0.0))
    if booking.status == "cancelled":
        return 0.0
    return float(booking.price) if now < booking.start else 0.0


def committed_of(bookings: Iterable[Booking], spent_by_booking: Mapping[str, float], now: datetime) -> float:
    """What every booking holds back at ``now`` (:func:`committed_to`); ``spent_by_booking``: the
    spend machines launched into a booking recorded, by reservation id."""
    return sum(committed_to(b, spent_by_booking.get(b.reservation_id, 0.0), now) for b in bookings)


def budget_left(total: float | None, spent: float, committed: float = 0.0) -> float | None:
    """What is left of the budget: its total less what was spent and what bookings hold back
    (never below zero); None without a budget. The one figure every view shows."""
    if total is None:
        return None
    return max(total - spent - committed, 0.0)


def budget_state(spent: float, budget: Budget, price_per_hour: float,
                 now_hours_left_fn: Callable[[float, float], float | None] | None = None,
                 committed: float = 0.0) -> dict[str, Any]:
    """Where the budget stands: ``{"spent", "committed", "total", "left", "state", "hours_left", "message"}``.

    ``left`` is :func:`budget_left`: the total less ``spent`` and ``committed`` (what bookings hold
    back, :func:`committed_of`). ``state`` is "warn" from ``budget.warn_fraction`` of the total used,
    or when under an hour is left at ``price_per_hour``; "exhausted" when nothing is left. On
    "exhausted" the caller must SEAL the workspace (publish the final manifest, read it back) and
    then release the allocation: never kill it, or the work since the last snapshot is lost.
    ``now_hours_left_fn(left, price_per_hour)`` replaces the plain ``left / price`` where a
    provider bills otherwise (per-minute minimums, tiers); None means "unbounded".
    """
    if not (0 <= spent < math.inf) or not (0 <= price_per_hour < math.inf) or not (0 <= committed < math.inf):
        raise UsageError("spent, committed and price_per_hour must be non-negative numbers")
    used = f"{money(spent)} spent" + (f", {money(committed)} committed to bookings" if committed > 0 else "")
    out: dict[str, Any] = {"spent": round(spent, 4), "committed": round(committed, 4), "total": budget.total,
                           "left": None, "state": "ok", "hours_left": None, "message": f"{used}; no budget set"}
    left = budget_left(budget.total, spent, committed)
    if budget.total is None or left is None:
        return out
    hours_left = (now_hours_left_fn or _hours_at)(left, price_per_hour)
    out["left"] = round(left, 4)
    out["hours_left"] = None if hours_left is None else round(hours_left, 4)
    share = (spent + committed) / budget.total if budget.total > 0 else 1.0
    at = f"{money(left)} left of the {money(budget.total)} budget: {used}"
    until = f"; about {hours_left:.1f} h at ${price_per_hour:.2f}/h" if hours_left is not None else ""
    if spent + committed >= budget.total:
        out["state"] = "exhausted"
        out["message"] = f"budget exhausted: {at}; sealing the workspace and releasing the GPU"
    elif share >= budget.warn_fraction or (hours_left is not None and hours_left < LOW_HOURS):
        out["state"] = "warn"
        out["message"] = f"budget nearly spent: {at}{until}"
    else:
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


def spend_line(total: float, current: float | None, estimated: float = 0.0) -> str:
    """One spend figure: "$0.04 so far: $0.03 on this machine, $0.01 before" (``current``:
    the machine serving the workspace now, None when there is none); ``estimated``, the part of
    ``total`` that is an estimate rather than a bill or a provider's rate, is said when not zero."""
    if current is None:
        line = f"{money(total)} so far, on earlier machines" if total > 0 else "Nothing spent yet"
    else:
        before = max(0.0, total - current)
        line = f"{money(total)} so far: {money(current)} on this machine, {money(before)} before"
    if total > 0 and estimated > 0:
        line += " (all estimated)" if estimated >= total - 1e-9 else f" ({money(estimated)} of it estimated)"
    return line


def admits_price(price_per_hour: float, budget: Budget) -> str | None:
    """The reason ``price_per_hour`` is over the budget's $/h cap, or None when it is within it."""
    cap = budget.max_price_per_hour
    if cap is not None and price_per_hour > cap:
        return f"${price_per_hour:.2f}/h is over the cap of ${cap:.2f}/h"
    return None


__all__ = ["BUDGET_STATES", "SPEND_SOURCES", "Budget", "admits_price", "budget_left", "budget_state", "committed_of",
           "committed_to", "money", "settled_spend",
           "spend_line", "spend_of", "spend_source"]
