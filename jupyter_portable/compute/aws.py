"""AWS EC2 as a provider: on-demand and spot GPU instances, and Capacity Blocks.

Credentials come from the usual boto3 chain (environment, ``AWS_PROFILE``, ``~/.aws``,
instance role); they are never put in a message or a log line. boto3 is imported only
when a client is first needed, so importing this module stays cheap. The endpoint is
boto3's own: ``AWS_ENDPOINT_URL_EC2`` (or ``AWS_ENDPOINT_URL``) points every call at a
proxy or a twin (tests use a moto server); unset, it is EC2's regional endpoint.

A launch with the user's SSH key imports it as a key pair and opens 22/tcp to the user's address
in a security group of this provider's (:mod:`.aws_network`, which also keeps those rules current).

The machine's SSH host key is pinned: a launch given ``host_key`` sends it as cloud-init
user data (``ssh_keys``) and records its public half in the allocation. SSH goes to the
instance's public IP, port 22, as ``ssh_user`` (``JUPYTER_PORTABLE_AWS_SSH_USER``, default
``ubuntu``, the Deep Learning AMI's user).

Where the API's answers come from:

- listed: ``describe_instance_type_offerings`` (by availability zone) for the GPU types
  in :data:`~.gpu_catalog.AWS`, joined with ``describe_instance_types`` (the GPUs) and
  ``describe_spot_price_history`` (spot prices). On-demand prices come from the table.
- permitted: ``run_instances`` with ``DryRun=True``.
- capacity now: EC2 cannot say without launching; :meth:`AwsProvider.check_capacity`
  answers None.
- launched: ``run_instances`` with the allocation id as its ``ClientToken`` (the same launch sent
  again starts nothing twice); one answered by a 5xx, a timeout or a dropped connection is looked
  up by its allocation tag before anything else: the instance it made is the allocation. Then
  ``describe_instances`` until it runs with a public IP.
- released: ``terminate_instances``, tried again on a 5xx, a throttle or a lost answer until EC2
  accepts it (or says the instance is gone); then an error says it may still be running and names it.
- reserved: Capacity Blocks, quoted, bought and priced in :mod:`.aws_blocks`.
- priced: :mod:`.aws_pricing` (the Pricing API, the spot price history, the table).

botocore errors are translated where they enter, by :mod:`.aws_errors`'s boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.aws_blocks import (
    BLOCK_RATE_TAG,
    block_details,
    block_hours,
    block_rate,
    block_tags,
    buy_block,
    quote_block,
)
from jupyter_portable.compute.aws_errors import ec2_boundary, error_code
from jupyter_portable.compute.aws_network import SSH_FROM_TAG, AwsSshAccess, checkip
from jupyter_portable.compute.aws_pricing import AwsPrices
from jupyter_portable.compute.base import (
    Allocation,
    AllocationStatus,
    MachineInfo,
    Provider,
    Reservation,
    SshEndpoint,
    delete_until_confirmed,
    spend_since,
)
from jupyter_portable.compute.cloudinit import HostKey, check_host_key, cloud_config, parse_zone_offer_id
from jupyter_portable.compute.config import AWS_IMAGE, PortableAws
from jupyter_portable.core.errors import (
    ComputeError,
    LaunchFailed,
    NotSupported,
    ProviderUnavailable,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import parse_iso_or_none

# EC2 resolves ``resolve:ssm:`` image ids at launch, so the default follows AWS's own
# "latest Deep Learning Base AMI" parameter instead of an AMI id that ages per region.
DLAMI_IMAGE = AWS_IMAGE
ALLOCATION_TAG = "jupyter-portable:allocation"  # = base.ALLOCATION_TAG
WORKSPACE_TAG = "jupyter-portable:workspace"  # = base.WORKSPACE_TAG
# A freshly launched instance can be missing from describe_instances for a while (EC2 is
# eventually consistent); within this window "not found" means "not visible yet".
_VISIBILITY_WINDOW = timedelta(minutes=5)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class AwsProvider(Provider):
    """GPU instances on EC2 in one region.

    ``region`` and ``profile`` select the boto3 session (default: the usual chain);
    ``client`` injects a ready EC2 client (tests use one under ``botocore.stub.Stubber``).
    ``image`` is the default image id (the DLAMI parameter above); ``key_name`` an EC2 key
    pair to use instead of importing the user's key (which then goes in as user data);
    ``security_group_ids`` replace the group this provider makes (they must let port 22 in);
    ``subnets`` maps an availability zone to the subnet to launch in there. ``ssh_cidr``
    (default ``JUPYTER_PORTABLE_SSH_CIDR``) is where SSH comes from; without it
    ``caller_address`` (default: ask checkip.amazonaws.com) says.
    """

    name = "aws"
    accepts_host_key = True  # launch(host_key=...) pins the machine's host key through user data

    def __init__(self, *, region: str | None = None, profile: str | None = None, client: Any = None,
                 image: str = DLAMI_IMAGE, key_name: str | None = None, security_group_ids: Sequence[str] = (),
                 subnets: Mapping[str, str] | None = None, ssh_user: str | None = None, spot: bool = True,
                 shapes: Mapping[str, gpu_catalog.MachineShape] | None = None,
                 clock: Callable[[], datetime] = _utcnow, ssh_cidr: str | None = None,
                 caller_address: Callable[[], str] = checkip, pricing_client: Any = None,
                 sleep: Callable[[float], None] = time.sleep, terminate_attempts: int = 20) -> None:
        self._region = region
        self.sleep = sleep  # between tries of a terminate (passed in so that tests do not wait)
        self.terminate_attempts = max(1, terminate_attempts)
        # EC2's eventual consistency is judged against this clock; tests pass a fixed one.
        self.clock = clock
        self._profile = profile
        self._client = client
        self.image = image
        self.key_name = key_name
        self.security_group_ids = tuple(security_group_ids)
        self.subnets = dict(subnets or {})
        # what is not given comes from the environment or the default (compute.config)
        given = {"ssh_user": ssh_user or None, "ssh_cidr": ssh_cidr or None}
        settings = PortableAws(**{k: v for k, v in given.items() if v is not None})
        self.ssh_user = settings.ssh_user
        self.spot = spot
        self.shapes = dict(shapes if shapes is not None else gpu_catalog.AWS)
        # the user's setting: SSH comes from there, whatever checkip says
        self._ssh_cidr = settings.ssh_cidr or None
        self.network = AwsSshAccess(lambda: self.client, region=lambda: self.region, ssh_cidr=self._ssh_cidr,
                                    caller_address=caller_address, subnets=self.subnets,
                                    security_group_ids=self.security_group_ids)
        self.prices = AwsPrices(lambda: self.client, region=lambda: self.region, profile=profile,
                                pricing_client=pricing_client, shapes=self.shapes, clock=clock)

    # -- plumbing ---------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The EC2 client, made on first use from the boto3 credential chain."""
        if self._client is None:
            with ec2_boundary("connect"):
                import boto3

                session = boto3.session.Session(profile_name=self._profile, region_name=self._region)
                self._client = session.client("ec2")
        return self._client

    @property
    def region(self) -> str:
        return str(self.client.meta.region_name)

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
        with ec2_boundary("list offers"):
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

        params = self._run_params(offer, allocation_id="dry-run", image=None, user_data_key=None, env=None,
                                  host_key=None, key_name=self.key_name, groups=self.security_group_ids)
        with ec2_boundary("dry-run launch", offer.id, default=LaunchFailed):
            try:
                self.client.run_instances(DryRun=True, **params)
            except ClientError as exc:
                if error_code(exc) == "DryRunOperation":
                    return
                raise

    # -- check 3: capacity now --------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """None: EC2 has no "how many could start now" call; only a launch tells (an
        offering means the type is sold in that zone, not that one is free)."""
        return None

    # -- check 4: launched ------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None,
               host_key: HostKey | None = None) -> Allocation:
        """``run_instances`` for one instance, tagged with the allocation id (and the
        workspace id, ``JUPYTER_PORTABLE_WORKSPACE_ID`` in ``env``). A public key is imported
        as a key pair and port 22 opened to the caller (see the module docstring); ``env``
        goes in as cloud-init user data (``/etc/jupyter-portable/env``, mode 0600), and so
        does ``host_key``, the machine's host key. An offer whose ``extra`` names a
        ``capacity_reservation_id`` launches into that Capacity Block."""
        machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
        if host_key is not None:
            host_key = check_host_key(host_key)
        key_name, groups = self.key_name, self.security_group_ids
        # with the user's own key pair named, our key can only travel in the user data
        user_data_key = ssh_public_key if self.key_name else None
        ssh_from = None
        if ssh_public_key:
            with ec2_boundary("prepare SSH access", offer.id, default=LaunchFailed):
                key_name = key_name or self.network.key_pair(ssh_public_key)
                if not groups:
                    ssh_from = self.network.source()
                    groups = (self.network.group(zone, ssh_from),)
        params = self._run_params(offer, allocation_id=allocation_id, image=image, user_data_key=user_data_key,
                                  env=env, host_key=host_key, key_name=key_name, groups=groups)
        if ssh_from:
            params["TagSpecifications"][0]["Tags"].append({"Key": SSH_FROM_TAG, "Value": ssh_from})
        # idempotent: the same launch sent again (its answer lost) starts no second instance
        params["ClientToken"] = allocation_id
        try:
            with ec2_boundary("launch", offer.id, default=LaunchFailed):
                instance = self.client.run_instances(**params)["Instances"][0]
        except ProviderUnavailable as exc:
            # a 5xx, a timeout or a dropped connection: EC2 may have launched it; that instance is the allocation
            found = self._launched(allocation_id, exc)
            if found is None:
                raise
            instance = found
        started = instance.get("LaunchTime") or self.clock()
        details: dict[str, Any] = {"instance_type": machine, "availability_zone": zone, "region": self.region,
                                   "market": "spot" if spot else "on-demand"}
        if key_name:
            details["key_name"] = key_name
        if groups:
            details["security_group_ids"] = list(groups)
        if host_key is not None:
            details["host_key"] = host_key[1]  # the public half only: the private one is in the user data alone
        details.update(block_details(offer))  # paid with the block: its fee over its hours, not on-demand
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id,
                          ref=instance["InstanceId"], started=started.isoformat(), details=details)

    def _launched(self, allocation_id: str, exc: ComputeError) -> Mapping[str, Any] | None:
        """The instance tagged with ``allocation_id`` after a launch whose answer was a 5xx or never
        came, else None; when the lookup fails too, ``exc`` says the instance may be running."""
        try:
            with ec2_boundary("look the launch up"):
                for reservation in self._pages("describe_instances", "Reservations", Filters=[
                        {"Name": f"tag:{ALLOCATION_TAG}", "Values": [allocation_id]},
                        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]):
                    for instance in reservation.get("Instances", []):
                        return dict(instance)
        except ComputeError as again:
            exc.args = (f"{exc}; looking the launch up by its tag failed too ({again}): an instance tagged "
                        f"{ALLOCATION_TAG}={allocation_id} may be running",)
            exc.context.update(may_be_running=True, allocation_id=allocation_id)
            raise exc from again
        return None

    def _run_params(self, offer: Offer, *, allocation_id: str, image: str | None, user_data_key: str | None,
                    env: dict[str, str] | None, host_key: HostKey | None, key_name: str | None,
                    groups: Sequence[str]) -> dict[str, Any]:
        machine, zone, spot = parse_zone_offer_id(offer.id, "AWS")
        workspace = (env or {}).get("JUPYTER_PORTABLE_WORKSPACE_ID")
        tags = [{"Key": ALLOCATION_TAG, "Value": allocation_id},
                {"Key": "Name", "Value": f"jupyter-portable {allocation_id}"}]
        if workspace:
            tags.append({"Key": WORKSPACE_TAG, "Value": workspace})
        tags += block_tags(offer)
        params: dict[str, Any] = {
            "ImageId": image or self.image, "InstanceType": machine, "MinCount": 1, "MaxCount": 1,
            "Placement": {"AvailabilityZone": zone},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
            # a shutdown from the machine ends its billing: the guardian's means (core/guardian)
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if key_name:
            params["KeyName"] = key_name
        if groups:
            params["SecurityGroupIds"] = list(groups)
        if zone in self.subnets:
            params["SubnetId"] = self.subnets[zone]
        user_data = cloud_config(user_data_key, env, host_key=host_key)
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

    def admit_caller(self, allocation: Allocation) -> bool:
        """Let SSH in to ``allocation`` from this computer's address now (:meth:`.AwsSshAccess.admit`);
        True when a rule was added."""
        return self.network.admit(allocation)

    # -- afterwards -------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """From ``describe_instances``: "reachable" once it runs with a public IP (SSH as
        ``ssh_user``); "lost" when EC2 itself stopped or ended it (a ``Server.*`` state
        reason, such as a spot interruption)."""
        from botocore.exceptions import ClientError

        with ec2_boundary("status", allocation.offer_id):
            try:
                resp = self.client.describe_instances(InstanceIds=[allocation.ref])
            except ClientError as exc:
                if error_code(exc) != "InvalidInstanceID.NotFound":
                    raise
                if _recent(allocation.started, self.clock()):
                    return AllocationStatus("pending", reason="launched, not visible in EC2 yet")
                return AllocationStatus("terminated", reason=f"instance {allocation.ref} no longer exists")
        instances = [i for r in resp.get("Reservations", []) for i in r.get("Instances", [])]
        if not instances:
            return AllocationStatus("terminated", reason=f"instance {allocation.ref} no longer exists")
        instance = instances[0]
        st = self._state(instance)
        # in a Capacity Block: the block's price (its upfront fee over its hours), the rate EC2 charged, from
        # the allocation's record or, for an allocation rebuilt without it, the instance's own tag
        paid = allocation.details.get("block_price_per_hour")
        if not isinstance(paid, (int, float)):
            paid = block_rate({t.get("Key"): t.get("Value") for t in instance.get("Tags") or []}.get(BLOCK_RATE_TAG))
        launched = instance.get("LaunchTime")
        if paid is not None and isinstance(launched, datetime):
            st.spend, st.spend_source = spend_since(float(paid), launched, self.clock())[1], "provider-rate"
        else:
            st.spend, st.spend_source = self._spend(instance)
        return st

    def _state(self, instance: Mapping[str, Any]) -> AllocationStatus:
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

    # -- what it costs (aws_pricing) -------------------------------------------------

    def on_demand_price(self, machine: str, region: str) -> float | None:
        """$/h of a Linux ``machine`` in ``region`` from the Pricing API: :meth:`.AwsPrices.on_demand_price`."""
        return self.prices.on_demand_price(machine, region)

    def _spend(self, instance: Mapping[str, Any]) -> tuple[float | None, str | None]:
        return self.prices.spend(instance)

    def list_machines(self) -> list[MachineInfo]:
        """``describe_instances`` filtered on our allocation tag (terminated ones left out)."""
        out = []
        with ec2_boundary("list machines"):
            for reservation in self._pages("describe_instances", "Reservations",
                                           Filters=[{"Name": "tag-key", "Values": [ALLOCATION_TAG]},
                                                    {"Name": "instance-state-name",
                                                     "Values": ["pending", "running", "stopping", "stopped"]}]):
                for inst in reservation.get("Instances", []):
                    tags = {t.get("Key"): t.get("Value") for t in inst.get("Tags") or []}
                    launched = inst.get("LaunchTime")
                    uptime = spend_since(0.0, launched, self.clock())[0] if isinstance(launched, datetime) else None
                    shape = self.shapes.get(inst.get("InstanceType", ""))
                    price = shape.price_per_hour if shape else None
                    tag_rate = block_rate(tags.get(BLOCK_RATE_TAG))
                    if tag_rate is not None and isinstance(launched, datetime):
                        # in a Capacity Block: the block's price, as status() counts it, not on-demand
                        price = tag_rate
                        spend: float | None = spend_since(tag_rate, launched, self.clock())[1]
                        source: str | None = "provider-rate"
                    else:
                        spend, source = self._spend(inst)
                    out.append(MachineInfo(
                        provider=self.name, ref=inst["InstanceId"], allocation_id=tags.get(ALLOCATION_TAG),
                        workspace_id=tags.get(WORKSPACE_TAG), state=self._state(inst).state,
                        name=tags.get("Name") or "",
                        started=launched.isoformat() if isinstance(launched, datetime) else None,
                        uptime_s=uptime, price_per_hour=price, spend=spend,
                        spend_source=source, details={"instance_type": inst.get("InstanceType"),
                                                      "state": inst["State"]["Name"]}))
        return out

    def terminate(self, allocation: Allocation) -> None:
        """``terminate_instances``, tried again (up to ``terminate_attempts``, waits growing to 30 s)
        until EC2 accepts it; an instance that is already gone is fine. Unconfirmed, the error says
        the instance may still be running and names it."""
        from botocore.exceptions import ClientError

        def delete() -> None:
            with ec2_boundary("terminate", allocation.offer_id):
                try:
                    self.client.terminate_instances(InstanceIds=[allocation.ref])
                except ClientError as exc:
                    if error_code(exc) != "InvalidInstanceID.NotFound":
                        raise

        delete_until_confirmed(delete, attempts=self.terminate_attempts, sleep=self.sleep,
                               machine=f"aws instance {allocation.ref}", ref=allocation.ref,
                               allocation_id=allocation.allocation_id, verb="terminating",
                               hint=f"terminate instance {allocation.ref} in the EC2 console, or try again later")

    # -- reservations: Capacity Blocks ------------------------------------------------

    def quote_reservation(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """What a Capacity Block for one instance of ``offer``'s type would cost, bought now
        (:func:`.aws_blocks.quote_block`). Nothing is bought (``reservation_id`` "")."""
        return quote_block(self.client, offer, start=start, hours=hours)

    def reserve(self, offer: Offer, *, start: str, hours: float, quote: Reservation | None = None) -> Reservation:
        """Buy a Capacity Block: the offering ``quote`` names, else the one :meth:`quote_reservation`
        would name now (:func:`.aws_blocks.buy_block`). Charged at purchase; no cancellation."""
        return buy_block(self.client, offer, quote if quote is not None else
                         self.quote_reservation(offer, start=start, hours=hours))

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Capacity Blocks are paid up front and EC2 offers no cancellation."""
        raise NotSupported("Capacity Blocks cannot be cancelled", provider=self.name, offer=reservation.offer_id,
                           hint="the block ends by itself at its end date")


# -- helpers ------------------------------------------------------------------------------



def _recent(started: str, now: datetime) -> bool:
    when = parse_iso_or_none(started)
    return when is not None and now - when < _VISIBILITY_WINDOW


__all__ = ["ALLOCATION_TAG", "BLOCK_RATE_TAG", "DLAMI_IMAGE", "SSH_FROM_TAG", "WORKSPACE_TAG", "AwsProvider",
           "block_hours", "checkip"]
