"""AWS EC2 as a provider: on-demand and spot GPU instances, and Capacity Blocks.

Credentials come from the usual boto3 chain (environment, ``AWS_PROFILE``, ``~/.aws``,
instance role); they are never put in a message or a log line. boto3 is imported only
when a client is first needed, so importing this module stays cheap.

Where the API's answers come from:

- listed: ``describe_instance_type_offerings`` (by availability zone) for the GPU types
  in :data:`~.gpu_catalog.AWS`, joined with ``describe_instance_types`` (the GPUs) and
  ``describe_spot_price_history`` (spot prices). On-demand prices come from the table.
- permitted: ``run_instances`` with ``DryRun=True``.
- capacity now: EC2 cannot say without launching; :meth:`AwsProvider.check_capacity`
  answers None.
- launched: ``run_instances``; then ``describe_instances`` until it runs with a public IP.

botocore errors are translated at this boundary (see ``_translate``)::

    InsufficientInstanceCapacity, InsufficientHostCapacity,
    InsufficientCapacity, SpotMaxPriceTooLow, Unsupported (in that AZ)  -> NoCapacity
    VcpuLimitExceeded, InstanceLimitExceeded, MaxSpotInstanceCountExceeded -> QuotaExceeded
    AuthFailure, UnauthorizedOperation, expired or bad credentials      -> AuthError
    throttling, 5xx, endpoint and connection errors,
    an answer that is not EC2's XML (ResponseParserError)               -> ProviderUnavailable
    anything else during a launch or purchase                          -> LaunchFailed
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.base import Allocation, AllocationStatus, Provider, Reservation, SshEndpoint
from jupyter_portable.compute.cloudinit import cloud_config, parse_zone_offer_id
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    NotSupported,
    ProviderUnavailable,
    QuotaExceeded,
    UsageError,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import parse_iso, parse_iso_or_none

# EC2 resolves ``resolve:ssm:`` image ids at launch, so the default follows AWS's own
# "latest Deep Learning Base AMI" parameter instead of an AMI id that ages per region.
DLAMI_IMAGE = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
ALLOCATION_TAG = "jupyter-portable:allocation"

_NO_CAPACITY = {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientCapacity",
                "SpotMaxPriceTooLow"}
_QUOTA = {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"}
_AUTH = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken",
         "RequestExpired", "OptInRequired"}
_UNAVAILABLE = {"RequestLimitExceeded", "Throttling", "ServiceUnavailable", "Unavailable", "InternalError",
                "InternalFailure"}
# A freshly launched instance can be missing from describe_instances for a while (EC2 is
# eventually consistent); within this window "not found" means "not visible yet".
_VISIBILITY_WINDOW = timedelta(minutes=5)
_MAX_BLOCK_DAYS = 182


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class AwsProvider(Provider):
    """GPU instances on EC2 in one region.

    ``region`` and ``profile`` select the boto3 session (default: the usual chain);
    ``client`` injects a ready EC2 client (tests use one under ``botocore.stub.Stubber``).
    ``image`` is the default image id (the DLAMI parameter above); ``key_name`` an EC2 key
    pair to add; ``security_group_ids`` must let port 22 in, as every worker is reached over
    SSH; ``subnets`` maps an availability zone to the subnet to launch in there.
    """

    name = "aws"

    def __init__(self, *, region: str | None = None, profile: str | None = None, client: Any = None,
                 image: str = DLAMI_IMAGE, key_name: str | None = None, security_group_ids: Sequence[str] = (),
                 subnets: Mapping[str, str] | None = None, ssh_user: str = "ubuntu", spot: bool = True,
                 shapes: Mapping[str, gpu_catalog.MachineShape] | None = None,
                 clock: Callable[[], datetime] = _utcnow) -> None:
        self._region = region
        # EC2's eventual consistency is judged against this clock; tests pass a fixed one.
        self.clock = clock
        self._profile = profile
        self._client = client
        self.image = image
        self.key_name = key_name
        self.security_group_ids = tuple(security_group_ids)
        self.subnets = dict(subnets or {})
        self.ssh_user = ssh_user
        self.spot = spot
        self.shapes = dict(shapes if shapes is not None else gpu_catalog.AWS)

    # -- plumbing ---------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The EC2 client, made on first use from the boto3 credential chain."""
        if self._client is None:
            with self._boundary("connect"):
                import boto3

                session = boto3.session.Session(profile_name=self._profile, region_name=self._region)
                self._client = session.client("ec2")
        return self._client

    @property
    def region(self) -> str:
        return str(self.client.meta.region_name)

    @contextmanager
    def _boundary(self, what: str, offer: str | None = None,
                  default: type[ComputeError] = ProviderUnavailable) -> Iterator[None]:
        """Translate every botocore error raised inside into this package's tree."""
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        try:
            yield
        # ResponseParserError is not a BotoCoreError: a proxy's HTML page would otherwise
        # escape as a foreign error and take every provider's listing down with it
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise _translate(exc, what=what, offer=offer, default=default) from exc

    def _pages(self, operation: str, key: str, **params: Any) -> Iterator[Any]:
        for page in self.client.get_paginator(operation).paginate(**params):
            yield from page.get(key, [])

    # -- check 1: listed --------------------------------------------------------------

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One on-demand offer (table price) and, where EC2 has a spot price, one spot
        offer for each GPU type in each availability zone of the region that offers it."""
        req = requirements or Requirements()
        shapes = gpu_catalog.shapes_for(self.shapes, req.gpus, req.gpu_count, req.min_gpu_memory_gb)
        if not shapes:
            return []
        with self._boundary("list offers"):
            region = self.region
            if req.regions and region not in req.regions:
                return []
            zones: dict[str, list[str]] = {}
            for row in self._pages("describe_instance_type_offerings", "InstanceTypeOfferings",
                                   LocationType="availability-zone",
                                   Filters=[{"Name": "instance-type", "Values": [s.machine for s in shapes]}]):
                zones.setdefault(row["InstanceType"], []).append(row["Location"])
            if not zones:
                return []
            # Only types offered here are described: describe_instance_types refuses the
            # whole call if one named type does not exist in the region.
            gpus = {row["InstanceType"]: row.get("GpuInfo") or {}
                    for row in self._pages("describe_instance_types", "InstanceTypes", InstanceTypes=sorted(zones))}
            spot: dict[tuple[str, str], tuple[datetime, float]] = {}
            if self.spot:
                for row in self._pages("describe_spot_price_history", "SpotPriceHistory",
                                       InstanceTypes=sorted(zones), ProductDescriptions=["Linux/UNIX"],
                                       StartTime=self.clock()):
                    key = (row["InstanceType"], row["AvailabilityZone"])
                    if key not in spot or row["Timestamp"] > spot[key][0]:
                        spot[key] = (row["Timestamp"], float(row["SpotPrice"]))
        out: list[Offer] = []
        for machine in sorted(zones):
            shape = self.shapes[machine]
            gpu_info = gpus.get(machine) or {}
            devices = gpu_info.get("Gpus") or []
            if machine in gpus and not devices:
                continue  # EC2 says it has no GPU: the table is wrong, trust the API
            gpu = devices[0]["Name"] if devices else shape.gpu
            count = sum(int(d.get("Count", 0)) for d in devices) if devices else shape.gpu_count
            mib = devices[0].get("MemoryInfo", {}).get("SizeInMiB") if devices else None
            memory = round(mib / 1024, 1) if mib else shape.gpu_memory_gb
            for zone in sorted(set(zones[machine])):
                common: dict[str, Any] = dict(provider=self.name, gpu=gpu, gpu_count=count, gpu_memory_gb=memory,
                                              region=region)
                out.append(Offer(id=f"{machine}@{zone}", price_per_hour=shape.price_per_hour,
                                 reservable=shape.reservable,
                                 extra={"instance_type": machine, "availability_zone": zone, "market": "on-demand",
                                        "price_source": gpu_catalog.PRICES_AS_OF}, **common))
                if (machine, zone) in spot:
                    out.append(Offer(id=f"{machine}@{zone}:spot", price_per_hour=spot[machine, zone][1], spot=True,
                                     reliability=gpu_catalog.SPOT_RELIABILITY,
                                     extra={"instance_type": machine, "availability_zone": zone, "market": "spot",
                                            "price_source": "describe_spot_price_history"}, **common))
        return out

    # -- check 2: permitted -----------------------------------------------------------

    def check_permission(self, offer: Offer) -> None:
        """A dry run of the very launch: EC2 answers DryRunOperation when it would be
        allowed. It checks the credentials and IAM; quota may only show at launch."""
        from botocore.exceptions import ClientError

        params = self._run_params(offer, allocation_id="dry-run", image=None, ssh_public_key=None, env=None)
        with self._boundary("dry-run launch", offer.id, default=LaunchFailed):
            try:
                self.client.run_instances(DryRun=True, **params)
            except ClientError as exc:
                if _code(exc) == "DryRunOperation":
                    return
                raise

    # -- check 3: capacity now --------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """None: EC2 has no "how many could start now" call; only a launch tells (an
        offering means the type is sold in that zone, not that one is free)."""
        return None

    # -- check 4: launched ------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """``run_instances`` for one instance, tagged with the allocation id. A public key
        and ``env`` go in as cloud-init user data (the key for the image's default user,
        ``env`` as ``/etc/jupyter-portable/env``, mode 0600). An offer whose ``extra`` names
        a ``capacity_reservation_id`` launches into that Capacity Block."""
        params = self._run_params(offer, allocation_id=allocation_id, image=image, ssh_public_key=ssh_public_key,
                                  env=env)
        with self._boundary("launch", offer.id, default=LaunchFailed):
            resp = self.client.run_instances(**params)
        instance = resp["Instances"][0]
        machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
        started = instance.get("LaunchTime") or self.clock()
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id,
                          ref=instance["InstanceId"], started=started.isoformat(),
                          details={"instance_type": machine, "availability_zone": zone, "region": self.region,
                                   "market": "spot" if spot else "on-demand"})

    def _run_params(self, offer: Offer, *, allocation_id: str, image: str | None, ssh_public_key: str | None,
                    env: dict[str, str] | None) -> dict[str, Any]:
        machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
        params: dict[str, Any] = {
            "ImageId": image or self.image, "InstanceType": machine, "MinCount": 1, "MaxCount": 1,
            "Placement": {"AvailabilityZone": zone},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                {"Key": ALLOCATION_TAG, "Value": allocation_id},
                {"Key": "Name", "Value": f"jupyter-portable {allocation_id}"}]}],
        }
        if self.key_name:
            params["KeyName"] = self.key_name
        if self.security_group_ids:
            params["SecurityGroupIds"] = list(self.security_group_ids)
        if zone in self.subnets:
            params["SubnetId"] = self.subnets[zone]
        user_data = cloud_config(ssh_public_key, env)
        if user_data:
            params["UserData"] = user_data  # botocore base64-encodes it
        reservation = offer.extra.get("capacity_reservation_id")
        if reservation:
            params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
            params["CapacityReservationSpecification"] = {
                "CapacityReservationTarget": {"CapacityReservationId": reservation}}
        elif spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        return params

    # -- afterwards -------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """From ``describe_instances``: "reachable" once it runs with a public IP (SSH as
        ``ssh_user``); "lost" when EC2 itself stopped or ended it (a ``Server.*`` state
        reason, such as a spot interruption)."""
        from botocore.exceptions import ClientError

        with self._boundary("status", allocation.offer_id):
            try:
                resp = self.client.describe_instances(InstanceIds=[allocation.ref])
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound":
                    raise
                if _recent(allocation.started, self.clock()):
                    return AllocationStatus("pending", reason="launched, not visible in EC2 yet")
                return AllocationStatus("terminated", reason=f"instance {allocation.ref} no longer exists")
        instances = [i for r in resp.get("Reservations", []) for i in r.get("Instances", [])]
        if not instances:
            return AllocationStatus("terminated", reason=f"instance {allocation.ref} no longer exists")
        instance = instances[0]
        state = instance["State"]["Name"]
        why = instance.get("StateReason") or {}
        reason = why.get("Message") or instance.get("StateTransitionReason") or None
        if state == "pending":
            return AllocationStatus("pending", reason=reason)
        if state == "running":
            ip = instance.get("PublicIpAddress")
            if ip:
                return AllocationStatus("reachable", ssh=SshEndpoint(host=ip, port=22, user=self.ssh_user))
            return AllocationStatus("running", reason="no public IP address yet")
        if str(why.get("Code", "")).startswith("Server."):
            # EC2 took it back (spot interruption, host failure, capacity): not our doing.
            return AllocationStatus("lost", reason=reason or why.get("Code"))
        if state in ("stopping", "stopped"):
            return AllocationStatus("stopped", reason=reason)
        return AllocationStatus("terminated", reason=reason)

    def terminate(self, allocation: Allocation) -> None:
        """``terminate_instances``; an instance that is already gone is fine."""
        from botocore.exceptions import ClientError

        with self._boundary("terminate", allocation.offer_id):
            try:
                self.client.terminate_instances(InstanceIds=[allocation.ref])
            except ClientError as exc:
                if _code(exc) != "InvalidInstanceID.NotFound":
                    raise

    # -- reservations: Capacity Blocks ------------------------------------------------

    def reserve(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """Buy a Capacity Block for one instance of ``offer``'s type: the earliest
        offering that starts within a day of ``start`` (blocks start at a fixed hour),
        preferring ``offer``'s zone. ``hours`` is rounded up to a duration EC2 sells
        (whole days up to 14, then whole weeks up to 182 days). Charged at purchase."""
        machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
        if spot:
            raise NotSupported("Capacity Blocks reserve on-demand capacity, not spot", provider=self.name,
                               offer=offer.id, hint="reserve the on-demand offer of the same type")
        begin = parse_iso(start, "start")
        duration = block_hours(hours)
        with self._boundary("find a Capacity Block", offer.id):
            found = list(self._pages("describe_capacity_block_offerings", "CapacityBlockOfferings",
                                     InstanceType=machine, InstanceCount=1, CapacityDurationHours=duration,
                                     StartDateRange=begin, EndDateRange=begin + timedelta(hours=duration + 24)))
        if not found:
            raise NoCapacity(f"aws: no Capacity Block of {machine} for {duration} h from {begin.isoformat()}",
                             provider=self.name, offer=offer.id,
                             hint="try another start time, a shorter block, or another route")
        best = min(found, key=lambda o: (o["AvailabilityZone"] != zone, o["StartDate"], float(o["UpfrontFee"])))
        with self._boundary("buy a Capacity Block", offer.id, default=LaunchFailed):
            bought = self.client.purchase_capacity_block(CapacityBlockOfferingId=best["CapacityBlockOfferingId"],
                                                         InstancePlatform="Linux/UNIX")["CapacityReservation"]
        booked_zone = best["AvailabilityZone"]
        return Reservation(
            reservation_id=bought["CapacityReservationId"], provider=self.name, offer_id=f"{machine}@{booked_zone}",
            start=(bought.get("StartDate") or best["StartDate"]).isoformat(),
            hours=float(best.get("CapacityBlockDurationHours", duration)), guarantee="provider",
            price=float(best["UpfrontFee"]),
            details={"capacity_reservation_id": bought["CapacityReservationId"], "availability_zone": booked_zone,
                     "instance_type": machine, "currency": best.get("CurrencyCode", "USD"),
                     "offering_id": best["CapacityBlockOfferingId"], "state": bought.get("State"),
                     "end": (bought.get("EndDate") or best["EndDate"]).isoformat(), "requested_start": start})

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Capacity Blocks are paid up front and EC2 offers no cancellation."""
        raise NotSupported("Capacity Blocks cannot be cancelled", provider=self.name, offer=reservation.offer_id,
                           hint="the block ends by itself at its end date")


# -- helpers ------------------------------------------------------------------------------



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




def _recent(started: str, now: datetime) -> bool:
    when = parse_iso_or_none(started)
    return when is not None and now - when < _VISIBILITY_WINDOW


def _code(exc: Any) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


def _quota_hint(offer: str | None) -> str:
    machine = (offer or "").partition("@")[0]
    spot = (offer or "").endswith(":spot")
    family = "P" if machine.startswith("p") else "G and VT"
    codes = {("P", False): "L-417A185B", ("G and VT", False): "L-DB2E81BA", ("P", True): "L-7212CCBC",
             ("G and VT", True): "L-3819A6DF"}
    market = "Spot" if spot else "On-Demand"
    return (f"ask AWS for more vCPU quota: Service Quotas, EC2, '{market} {family} instances' "
            f"({codes[family, spot]})")


def _translate(exc: Exception, *, what: str, offer: str | None, default: type[ComputeError]) -> ComputeError:
    """One botocore error -> one error of this package (see the module docstring)."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
        PartialCredentialsError,
    )
    from botocore.parsers import ResponseParserError

    ctx: dict[str, Any] = {"provider": "aws", "offer": offer}
    if isinstance(exc, ResponseParserError):
        # its text quotes the raw answer (an HTML page, a proxy's login form): never shown
        return ProviderUnavailable(f"aws {what}: EC2's answer could not be read (not its API's XML; "
                                   "a proxy, captive portal or outage answered instead)", **ctx,
                                   hint="check the network path to EC2 (proxy, AWS_ENDPOINT_URL) and try again")
    if isinstance(exc, ClientError):
        code = _code(exc)
        message = str(exc.response.get("Error", {}).get("Message", "")) or code
        text = f"aws {what}: {code}: {message}"
        if code in _NO_CAPACITY or (code == "Unsupported" and "Availability Zone" in message):
            return NoCapacity(text, **ctx)
        if code in _QUOTA:
            return QuotaExceeded(text, hint=_quota_hint(offer), **ctx)
        if code in _AUTH:
            return AuthError(text, hint="check the AWS credentials (AWS_PROFILE or ~/.aws) and that the IAM "
                                        "policy allows ec2:RunInstances, ec2:Describe* and ec2:CreateTags", **ctx)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in _UNAVAILABLE or status >= 500:
            return ProviderUnavailable(text, hint="try again in a minute", **ctx)
        return default(text, **ctx)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return AuthError(f"aws {what}: no usable AWS credentials", **ctx,
                         hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run `aws configure`")
    if isinstance(exc, NoRegionError):
        return ProviderUnavailable(f"aws {what}: no AWS region configured", **ctx,
                                   hint="set AWS_DEFAULT_REGION or pass region= to AwsProvider")
    if isinstance(exc, (EndpointConnectionError, ConnectionError)):
        return ProviderUnavailable(f"aws {what}: could not reach EC2: {type(exc).__name__}", **ctx,
                                   hint="check the network and try again")
    if isinstance(exc, ParamValidationError):
        # Its text repeats parameter values, and user data can carry env secrets.
        return default(f"aws {what}: invalid request parameters (botocore ParamValidationError)", **ctx)
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return ProviderUnavailable(f"aws {what}: {type(exc).__name__}: {first}", **ctx)
