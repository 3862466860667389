"""AWS Capacity Blocks: a reservation EC2 sells for whole days, paid up front, and the price of the
instances launched into one.

- quoted: ``describe_capacity_block_offerings`` (its ``UpfrontFee``, for the whole days EC2 sells);
- bought: ``purchase_capacity_block`` buys exactly the quoted offering; EC2 offers no cancellation;
- priced: an instance launched into a block costs the block's fee over its hours, not on-demand.
  DescribeInstances does not say that rate, so the launch tags the instance with it
  (:data:`BLOCK_RATE_TAG`) and records it in the allocation (``block_price_per_hour``); whatever
  prices the instance later (``status``, ``machines``, the budget) reads one or the other.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from jupyter_portable.compute.aws_errors import ec2_boundary
from jupyter_portable.compute.base import Reservation
from jupyter_portable.compute.cloudinit import parse_zone_offer_id
from jupyter_portable.core.errors import LaunchFailed, NoCapacity, NotSupported, UsageError
from jupyter_portable.core.offers import Offer
from jupyter_portable.core.times import parse_iso

# on an instance launched into a Capacity Block: the block's price per hour (its upfront fee over
# its hours), which DescribeInstances does not say; `machines` prices the instance at it
BLOCK_RATE_TAG = "jupyter-portable:block-price-per-hour"
_MAX_BLOCK_DAYS = 182


def quote_block(client: Any, offer: Offer, *, start: str, hours: float) -> Reservation:
    """What a Capacity Block for one instance of ``offer``'s type would cost, bought now: the
    earliest offering that starts within a day of ``start`` (blocks start at a fixed hour),
    preferring ``offer``'s zone, for ``hours`` rounded up to a duration EC2 sells (whole days up
    to 14, then whole weeks up to 182 days). ``price`` is the offering's ``UpfrontFee``, what
    EC2 charges at purchase; ``hours`` the block's. Nothing is bought (``reservation_id`` "")."""
    machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
    if spot:
        raise NotSupported("Capacity Blocks reserve on-demand capacity, not spot", provider="aws",
                           offer=offer.id, hint="reserve the on-demand offer of the same type")
    begin = parse_iso(start, "start")
    duration = block_hours(hours)
    with ec2_boundary("find a Capacity Block", offer.id):
        found = _pages(client, "describe_capacity_block_offerings", "CapacityBlockOfferings",
                       InstanceType=machine, InstanceCount=1, CapacityDurationHours=duration,
                       StartDateRange=begin, EndDateRange=begin + timedelta(hours=duration + 24))
    if not found:
        raise NoCapacity(f"aws: no Capacity Block of {machine} for {duration} h from {begin.isoformat()}",
                         provider="aws", offer=offer.id,
                         hint="try another start time, a shorter block, or another route")
    best = min(found, key=lambda o: (o["AvailabilityZone"] != zone, o["StartDate"], float(o["UpfrontFee"])))
    block = int(best.get("CapacityBlockDurationHours") or duration)
    return Reservation(
        reservation_id="", provider="aws", offer_id=f"{machine}@{best['AvailabilityZone']}",
        start=best["StartDate"].isoformat(), hours=float(block), guarantee="provider",
        price=float(best["UpfrontFee"]),
        details={"offering_id": best["CapacityBlockOfferingId"], "availability_zone": best["AvailabilityZone"],
                 "instance_type": machine, "currency": best.get("CurrencyCode", "USD"),
                 "end": best["EndDate"].isoformat(), "requested_start": start, "requested_hours": hours,
                 "days": block / 24, "price_source": "describe_capacity_block_offerings UpfrontFee"})


def buy_block(client: Any, offer: Offer, quote: Reservation) -> Reservation:
    """Buy the Capacity Block ``quote`` (from :func:`quote_block`) names, for one instance of
    ``offer``'s type. Charged at purchase (the offering's upfront fee, for whole days); EC2 offers
    no cancellation."""
    with ec2_boundary("buy a Capacity Block", offer.id, default=LaunchFailed):
        bought = client.purchase_capacity_block(CapacityBlockOfferingId=quote.details["offering_id"],
                                                InstancePlatform="Linux/UNIX")["CapacityReservation"]
    machine = quote.details["instance_type"]
    booked_zone = quote.details["availability_zone"]
    return Reservation(
        reservation_id=bought["CapacityReservationId"], provider="aws", offer_id=f"{machine}@{booked_zone}",
        start=bought["StartDate"].isoformat() if bought.get("StartDate") else quote.start,
        hours=quote.hours, guarantee="provider", price=quote.price,
        details={**quote.details, "capacity_reservation_id": bought["CapacityReservationId"],
                 "state": bought.get("State"),
                 "end": bought["EndDate"].isoformat() if bought.get("EndDate") else quote.details["end"]})


def block_tags(offer: Offer) -> list[dict[str, str]]:
    """The tag a launch into a Capacity Block carries: the block's price per hour."""
    if offer.extra.get("capacity_reservation_id") and offer.extra.get("block_price_per_hour") is not None:
        return [{"Key": BLOCK_RATE_TAG, "Value": repr(float(offer.extra["block_price_per_hour"]))}]
    return []


def block_details(offer: Offer) -> dict[str, Any]:
    """What an allocation launched into ``offer``'s Capacity Block records: the reservation and its
    price per hour (paid with the block: its hours cost the block's fee over its length)."""
    if not offer.extra.get("capacity_reservation_id"):
        return {}
    details: dict[str, Any] = {"capacity_reservation_id": offer.extra["capacity_reservation_id"]}
    if offer.extra.get("block_price_per_hour") is not None:
        details["block_price_per_hour"] = float(offer.extra["block_price_per_hour"])
    return details


def block_rate(tag: str | None) -> float | None:
    """The block price a BLOCK_RATE_TAG holds; None when absent or not a sane price."""
    try:
        rate = float(tag) if tag is not None else None
    except ValueError:
        return None
    return rate if rate is not None and 0 <= rate < 1e6 else None


def block_hours(hours: float) -> int:
    """The shortest Capacity Block duration EC2 sells that covers ``hours``."""
    if not (hours > 0):
        raise UsageError(f"a reservation needs a positive number of hours, not {hours!r}")
    days = math.ceil(hours / 24)
    if days > 14:
        days = math.ceil(days / 7) * 7
    if days > _MAX_BLOCK_DAYS:
        raise NotSupported(f"Capacity Blocks last at most {_MAX_BLOCK_DAYS} days", provider="aws")
    return days * 24


def _pages(client: Any, operation: str, key: str, **params: Any) -> list[Any]:
    return [row for page in client.get_paginator(operation).paginate(**params) for row in page.get(key, [])]


__all__ = ["BLOCK_RATE_TAG", "block_details", "block_hours", "block_rate", "block_tags", "buy_block", "quote_block"]
