"""What an EC2 instance costs: the Pricing API's on-demand price, the spot price history, and the
table's estimate where neither can say.

The Pricing API answers from ``us-east-1`` only. With EC2's endpoint pointed elsewhere (a proxy,
a twin), it is asked only when ``AWS_ENDPOINT_URL_PRICING`` is set too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.aws_errors import ec2_boundary
from jupyter_portable.compute.base import spend_since
from jupyter_portable.core.errors import ComputeError

# EC2's Pricing API answers from these regions only
PRICING_REGION = "us-east-1"
PRICING_ENDPOINT_ENV = "AWS_ENDPOINT_URL_PRICING"


class AwsPrices:
    """Prices and spend of one provider's instances. ``client`` and ``region`` give its EC2 client
    and region (made on first use); ``pricing_client`` injects a Pricing API client; ``profile`` is
    the boto3 profile one is made with; ``shapes`` the table; ``clock`` the time now."""

    def __init__(self, client: Callable[[], Any], *, region: Callable[[], str], profile: str | None,
                 pricing_client: Any, shapes: Mapping[str, gpu_catalog.MachineShape],
                 clock: Callable[[], datetime]) -> None:
        self._client = client
        self._region = region
        self._profile = profile
        self._pricing = pricing_client
        self._prices: dict[tuple[str, str], float | None] = {}  # (type, region) -> Pricing API's $/h
        self.shapes = shapes
        self.clock = clock

    @property
    def client(self) -> Any:
        return self._client()

    @property
    def region(self) -> str:
        return self._region()

    def _pages(self, operation: str, key: str, **params: Any) -> list[Any]:
        return [row for page in self.client.get_paginator(operation).paginate(**params) for row in page.get(key, [])]

    def _pricing_client(self) -> Any:
        """The Pricing API client, or None where it cannot be reached: with EC2's endpoint
        pointed elsewhere (a proxy, a twin), only when ``AWS_ENDPOINT_URL_PRICING`` is set too."""
        if self._pricing is None:
            if os.environ.get("AWS_ENDPOINT_URL_EC2") and not os.environ.get(PRICING_ENDPOINT_ENV):
                return None
            import boto3
            from botocore.config import Config

            self._pricing = boto3.session.Session(profile_name=self._profile).client(
                "pricing", region_name=PRICING_REGION,
                config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}))
        return self._pricing

    def on_demand_price(self, machine: str, region: str) -> float | None:
        """$/h of a Linux, shared-tenancy ``machine`` in ``region`` from the Pricing API
        (``get_products``), asked once per type and region; None when it cannot say."""
        import json

        key = (machine, region)
        if key in self._prices:
            return self._prices[key]
        price = None
        client = self._pricing_client()
        if client is not None:
            filters = [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
                ("instanceType", machine), ("regionCode", region), ("operatingSystem", "Linux"),
                ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
            try:
                with ec2_boundary("read the on-demand price"):
                    answer = client.get_products(ServiceCode="AmazonEC2", Filters=filters, MaxResults=10)
                for item in answer.get("PriceList", []):
                    product = json.loads(item) if isinstance(item, str) else item
                    for term in (product.get("terms", {}).get("OnDemand") or {}).values():
                        for dim in (term.get("priceDimensions") or {}).values():
                            usd = (dim.get("pricePerUnit") or {}).get("USD")
                            if usd is not None and float(usd) > 0:
                                price = float(usd)
            except (ComputeError, ValueError, TypeError, AttributeError):
                price = None  # the table's estimate stands in
        self._prices[key] = price
        return price

    def spot_spend(self, machine: str, zone: str, since: datetime, until: datetime) -> float | None:
        """Dollars one spot ``machine`` in ``zone`` cost from ``since`` to ``until``: each price in
        ``describe_spot_price_history`` for the time it was in force; None when EC2 gives none."""
        with ec2_boundary("read the spot price history"):
            rows = list(self._pages("describe_spot_price_history", "SpotPriceHistory", InstanceTypes=[machine],
                                    AvailabilityZone=zone, ProductDescriptions=["Linux/UNIX"],
                                    StartTime=since, EndTime=until))
        points = sorted((r["Timestamp"], float(r["SpotPrice"])) for r in rows if r.get("Timestamp"))
        if not points:
            return None
        total = 0.0
        for i, (when, price) in enumerate(points):
            begin = max(when, since)
            end = points[i + 1][0] if i + 1 < len(points) else until
            if end > begin:
                total += price * (min(end, until) - begin).total_seconds() / 3600
        return total

    def spend(self, instance: Mapping[str, Any]) -> tuple[float | None, str | None]:
        """Spend so far: spot price history or the Pricing API's on-demand price, x time since
        ``LaunchTime`` (measured); else the table's price (estimated)."""
        launched = instance.get("LaunchTime")
        machine = instance.get("InstanceType", "")
        if not isinstance(launched, datetime):
            return None, None
        now = self.clock()
        if instance.get("InstanceLifecycle") == "spot":
            zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
            try:
                spent = self.spot_spend(machine, zone, launched, now)
            except ComputeError:
                spent = None
            if spent is not None:
                return spent, "provider-rate"
        elif (price := self.on_demand_price(machine, self.region)) is not None:
            return spend_since(price, launched, now)[1], "provider-rate"
        shape = self.shapes.get(machine)
        if shape is None:
            return None, None
        return spend_since(shape.price_per_hour, launched, now)[1], "estimate"


__all__ = ["PRICING_ENDPOINT_ENV", "PRICING_REGION", "AwsPrices"]
