"""AWS EC2 as a provider: on-demand and spot GPU instances, and Capacity Blocks.

Credentials come from the usual boto3 chain (environment, ``AWS_PROFILE``, ``~/.aws``,
instance role); they are never put in a message or a log line. boto3 is imported only
when a client is first needed, so importing this module stays cheap. The endpoint is
boto3's own: ``AWS_ENDPOINT_URL_EC2`` (or ``AWS_ENDPOINT_URL``) points every call at a
proxy or a twin (tests use a moto server); unset, it is EC2's regional endpoint.

What a launch with the user's SSH key creates in the account, once, and then reuses:

- the key pair ``jupyter-portable-<hash of the key>`` (``ImportKeyPair``), tagged
  ``jupyter-portable:purpose=ssh``; the launch names it as ``KeyName``;
- in the VPC it launches into, the security group ``jupyter-portable-ssh``, tagged the
  same way, opening 22/tcp to the caller's address only: ``JUPYTER_PORTABLE_SSH_CIDR``
  when set, else the address https://checkip.amazonaws.com sees (as ``/32``), asked at each
  launch. A new address is added to the group, never replacing one (another machine may use it).
  The ingress follows the user: when a heartbeat fails, :meth:`AwsProvider.admit_caller` asks
  checkip again and adds a new address to the group before the machine could be declared lost
  (a laptop that moved to another network is not a lost machine).

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
- reserved: ``describe_capacity_block_offerings`` quotes a Capacity Block (its ``UpfrontFee``, for
  the whole days EC2 sells), ``purchase_capacity_block`` buys exactly the quoted offering; an
  instance launched into it is priced at the block's fee over its hours, not on-demand.

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

import hashlib
import ipaddress
import math
import os
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from jupyter_portable.compute import gpu_catalog
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
from jupyter_portable.compute.settings import AWS_IMAGE, PortableAws
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
DLAMI_IMAGE = AWS_IMAGE
ALLOCATION_TAG = "jupyter-portable:allocation"  # = base.ALLOCATION_TAG
WORKSPACE_TAG = "jupyter-portable:workspace"  # = base.WORKSPACE_TAG
# EC2's Pricing API answers from these regions only
PRICING_REGION = "us-east-1"
PRICING_ENDPOINT_ENV = "AWS_ENDPOINT_URL_PRICING"
PURPOSE_TAG = "jupyter-portable:purpose"
# on an instance launched into a Capacity Block: the block's price per hour (its upfront fee over
# its hours), which DescribeInstances does not say; `machines` prices the instance at it
BLOCK_RATE_TAG = "jupyter-portable:block-price-per-hour"
SSH_GROUP_NAME = "jupyter-portable-ssh"
# on each instance: the address (CIDR) its SSH comes from; the group keeps a rule only for those of
# running instances and the user's address now, so rules are replaced, never accumulated
SSH_FROM_TAG = "jupyter-portable:ssh-from"
_RULE_DESCRIPTION = "jupyter-portable user"  # the rules this provider wrote (the user's own are left alone)
KEY_PAIR_PREFIX = "jupyter-portable-"
CHECKIP_URL = "https://checkip.amazonaws.com"

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


def checkip(url: str = CHECKIP_URL, timeout: float = 10.0) -> str:
    """This machine's public IP address as AWS sees it (one line of text)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - a fixed https URL
        return str(resp.read(64).decode("ascii", "replace").strip())


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
        self._pricing = pricing_client
        self._prices: dict[tuple[str, str], float | None] = {}  # (type, region) -> Pricing API's $/h
        # EC2's eventual consistency is judged against this clock; tests pass a fixed one.
        self.clock = clock
        self._profile = profile
        self._client = client
        self.image = image
        self.key_name = key_name
        self.security_group_ids = tuple(security_group_ids)
        self.subnets = dict(subnets or {})
        # what is not given comes from the environment or the default (compute.settings)
        given = {"ssh_user": ssh_user or None, "ssh_cidr": ssh_cidr or None}
        settings = PortableAws(**{k: v for k, v in given.items() if v is not None})
        self.ssh_user = settings.ssh_user
        self.spot = spot
        self.shapes = dict(shapes if shapes is not None else gpu_catalog.AWS)
        # the user's setting: SSH comes from there, whatever checkip says
        self._ssh_cidr = settings.ssh_cidr or None
        self._caller_address = caller_address
        # what exists already, learnt once per provider: key pair name by key
        self._key_pairs: dict[str, str] = {}

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

        params = self._run_params(offer, allocation_id="dry-run", image=None, user_data_key=None, env=None,
                                  host_key=None, key_name=self.key_name, groups=self.security_group_ids)
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
            with self._boundary("prepare SSH access", offer.id, default=LaunchFailed):
                key_name = key_name or self._ensure_key_pair(ssh_public_key)
                if not groups:
                    ssh_from = self._ssh_source()
                    groups = (self._ensure_ssh_group(zone, ssh_from),)
        params = self._run_params(offer, allocation_id=allocation_id, image=image, user_data_key=user_data_key,
                                  env=env, host_key=host_key, key_name=key_name, groups=groups)
        if ssh_from:
            params["TagSpecifications"][0]["Tags"].append({"Key": SSH_FROM_TAG, "Value": ssh_from})
        # idempotent: the same launch sent again (its answer lost) starts no second instance
        params["ClientToken"] = allocation_id
        try:
            with self._boundary("launch", offer.id, default=LaunchFailed):
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
        if offer.extra.get("capacity_reservation_id"):
            # paid with the block: its hours cost the block's upfront fee over its length, not on-demand
            details["capacity_reservation_id"] = offer.extra["capacity_reservation_id"]
            if offer.extra.get("block_price_per_hour") is not None:
                details["block_price_per_hour"] = float(offer.extra["block_price_per_hour"])
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id,
                          ref=instance["InstanceId"], started=started.isoformat(), details=details)

    def _launched(self, allocation_id: str, exc: ComputeError) -> Mapping[str, Any] | None:
        """The instance tagged with ``allocation_id`` after a launch whose answer was a 5xx or never
        came, else None; when the lookup fails too, ``exc`` says the instance may be running."""
        try:
            with self._boundary("look the launch up"):
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
        if offer.extra.get("capacity_reservation_id") and offer.extra.get("block_price_per_hour") is not None:
            tags.append({"Key": BLOCK_RATE_TAG, "Value": repr(float(offer.extra["block_price_per_hour"]))})
        params: dict[str, Any] = {
            "ImageId": image or self.image, "InstanceType": machine, "MinCount": 1, "MaxCount": 1,
            "Placement": {"AvailabilityZone": zone},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
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

    # -- SSH access: the key pair and the security group, made once --------------------

    def _ensure_key_pair(self, public_key: str) -> str:
        """The name of the key pair holding ``public_key``, importing it the first time."""
        from botocore.exceptions import ClientError

        parts = public_key.split()
        if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-")):
            raise UsageError("aws: ssh_public_key is not an OpenSSH public key line (`ssh-ed25519 AAAA...`)")
        material = f"{parts[0]} {parts[1]}"  # the comment is not part of the key
        if material in self._key_pairs:
            return self._key_pairs[material]
        name = KEY_PAIR_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:12]
        try:
            self.client.describe_key_pairs(KeyNames=[name])
        except ClientError as exc:
            if _code(exc) != "InvalidKeyPair.NotFound":
                raise
            try:
                self.client.import_key_pair(
                    KeyName=name, PublicKeyMaterial=material.encode(),
                    TagSpecifications=[{"ResourceType": "key-pair", "Tags": [{"Key": PURPOSE_TAG, "Value": "ssh"}]}])
            except ClientError as dup:
                if _code(dup) != "InvalidKeyPair.Duplicate":  # another launch imported it meanwhile
                    raise
        self._key_pairs[material] = name
        return name

    def _ssh_source(self) -> str:
        """The CIDR SSH comes from: JUPYTER_PORTABLE_SSH_CIDR, else the caller's address /32, asked now
        (the user may have moved since the last launch)."""
        source = self._ssh_cidr
        if source is None:
            try:
                source = self._caller_address().strip()
            except OSError as exc:
                raise ProviderUnavailable(
                    f"aws: could not learn this machine's public address from {CHECKIP_URL} ({type(exc).__name__})",
                    provider=self.name, hint="set JUPYTER_PORTABLE_SSH_CIDR to the address SSH comes from, "
                                             "e.g. 203.0.113.7/32") from exc
        try:
            return str(ipaddress.ip_network(source, strict=False))
        except ValueError:
            raise UsageError(f"aws: not an IP address or CIDR block for SSH: {source[:60]!r}",
                             hint="set JUPYTER_PORTABLE_SSH_CIDR like 203.0.113.7/32") from None

    def admit_caller(self, allocation: Allocation) -> bool:
        """Let SSH in to ``allocation`` from this computer's address as checkip sees it now: the
        instance's ``jupyter-portable:ssh-from`` becomes that address, and this provider's group
        (``jupyter-portable-ssh``) gets a rule for it when none covers it yet, and loses its rules for
        addresses no running instance comes from any more. True when a rule was added. Nothing
        changes where JUPYTER_PORTABLE_SSH_CIDR fixes the source or the groups are the user's own
        (``security_group_ids``)."""
        groups = [str(g) for g in allocation.details.get("security_group_ids") or []]
        if self._ssh_cidr is not None or self.security_group_ids or not groups:
            return False
        cidr = self._ssh_source()
        added = False
        with self._boundary("let SSH in from this computer's new address", allocation.offer_id):
            self.client.create_tags(Resources=[allocation.ref], Tags=[{"Key": SSH_FROM_TAG, "Value": cidr}])
            for group in self.client.describe_security_groups(GroupIds=groups)["SecurityGroups"]:
                if group.get("GroupName") == SSH_GROUP_NAME:
                    added = self._replace_ssh_rules(group, cidr) or added
        return added

    def _replace_ssh_rules(self, group: Mapping[str, Any], cidr: str) -> bool:
        """Make ``group``'s own rules (those this provider wrote) open tcp/22 to ``cidr`` and to the
        address each of its running instances comes from, and to nothing else: a rule for an address
        no one uses any more is revoked, so rules never pile up to the group's quota. True when the
        rule for ``cidr`` was added."""
        from botocore.exceptions import ClientError

        group_id = str(group["GroupId"])
        running = self.client.describe_instances(Filters=[
            {"Name": "instance.group-id", "Values": [group_id]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        keep = {cidr} | {str(tag["Value"]) for page in running.get("Reservations") or []
                         for inst in page.get("Instances") or [] for tag in inst.get("Tags") or []
                         if tag.get("Key") == SSH_FROM_TAG}
        for old in sorted(_own_ssh_rules(group) - keep):
            try:
                self.client.revoke_security_group_ingress(GroupId=group_id, IpPermissions=[_ssh_permission(old)])
            except ClientError as exc:
                if _code(exc) != "InvalidPermission.NotFound":  # another launch revoked it meanwhile
                    raise
        if _opens_ssh_to(group, cidr):
            return False
        try:
            self.client.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[_ssh_permission(cidr)])
        except ClientError as exc:
            if _code(exc) != "InvalidPermission.Duplicate":
                raise
            return False
        return True

    def _vpc_for(self, zone: str) -> str:
        if zone in self.subnets:
            subnets = self.client.describe_subnets(SubnetIds=[self.subnets[zone]])["Subnets"]
            return str(subnets[0]["VpcId"])
        vpcs = self.client.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise UsageError(f"aws: region {self.region} has no default VPC to launch into",
                             hint="pass subnets={zone: subnet id} or security_group_ids= to AwsProvider")
        return str(vpcs[0]["VpcId"])

    def _ensure_ssh_group(self, zone: str, cidr: str) -> str:
        """The id of this provider's security group in the zone's VPC, made the first time, with
        22/tcp open to ``cidr`` (:meth:`_ssh_source`) and to the addresses of its running instances
        only (:meth:`_replace_ssh_rules`)."""
        from botocore.exceptions import ClientError

        vpc = self._vpc_for(zone)
        filters = [{"Name": "group-name", "Values": [SSH_GROUP_NAME]}, {"Name": "vpc-id", "Values": [vpc]}]
        found = self.client.describe_security_groups(Filters=filters)["SecurityGroups"]
        if found:
            group = found[0]
        else:
            try:
                self.client.create_security_group(
                    GroupName=SSH_GROUP_NAME, VpcId=vpc,
                    Description="jupyter-portable: SSH to its workers from the user's address",
                    TagSpecifications=[{"ResourceType": "security-group",
                                        "Tags": [{"Key": PURPOSE_TAG, "Value": "ssh"}]}])
            except ClientError as exc:
                if _code(exc) != "InvalidGroup.Duplicate":  # another launch made it meanwhile
                    raise
            group = self.client.describe_security_groups(Filters=filters)["SecurityGroups"][0]
        group_id = str(group["GroupId"])
        self._replace_ssh_rules(group, cidr)  # at each launch: the machines that ended since leave no rule
        return group_id

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
        st = self._state(instance)
        block_rate = allocation.details.get("block_price_per_hour")
        launched = instance.get("LaunchTime")
        if isinstance(block_rate, (int, float)) and isinstance(launched, datetime):
            # in a Capacity Block: the block's price (its upfront fee over its hours), the rate EC2 charged
            st.spend, st.spend_source = spend_since(float(block_rate), launched, self.clock())[1], "provider-rate"
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

    # -- what it costs ----------------------------------------------------------------

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
                with self._boundary("read the on-demand price"):
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
        with self._boundary("read the spot price history"):
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

    def _spend(self, instance: Mapping[str, Any]) -> tuple[float | None, str | None]:
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

    def list_machines(self) -> list[MachineInfo]:
        """``describe_instances`` filtered on our allocation tag (terminated ones left out)."""
        out = []
        with self._boundary("list machines"):
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
                    block_rate = _block_rate(tags.get(BLOCK_RATE_TAG))
                    if block_rate is not None and isinstance(launched, datetime):
                        # in a Capacity Block: the block's price, as status() counts it, not on-demand
                        price = block_rate
                        spend: float | None = spend_since(block_rate, launched, self.clock())[1]
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
            with self._boundary("terminate", allocation.offer_id):
                try:
                    self.client.terminate_instances(InstanceIds=[allocation.ref])
                except ClientError as exc:
                    if _code(exc) != "InvalidInstanceID.NotFound":
                        raise

        delete_until_confirmed(delete, attempts=self.terminate_attempts, sleep=self.sleep,
                               machine=f"aws instance {allocation.ref}", ref=allocation.ref,
                               allocation_id=allocation.allocation_id, verb="terminating",
                               hint=f"terminate instance {allocation.ref} in the EC2 console, or try again later")

    # -- reservations: Capacity Blocks ------------------------------------------------

    def quote_reservation(self, offer: Offer, *, start: str, hours: float) -> Reservation:
        """What a Capacity Block for one instance of ``offer``'s type would cost, bought now: the
        earliest offering that starts within a day of ``start`` (blocks start at a fixed hour),
        preferring ``offer``'s zone, for ``hours`` rounded up to a duration EC2 sells (whole days up
        to 14, then whole weeks up to 182 days). ``price`` is the offering's ``UpfrontFee``, what
        EC2 charges at purchase; ``hours`` the block's. Nothing is bought (``reservation_id`` "")."""
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
        block = int(best.get("CapacityBlockDurationHours") or duration)
        return Reservation(
            reservation_id="", provider=self.name, offer_id=f"{machine}@{best['AvailabilityZone']}",
            start=best["StartDate"].isoformat(), hours=float(block), guarantee="provider",
            price=float(best["UpfrontFee"]),
            details={"offering_id": best["CapacityBlockOfferingId"], "availability_zone": best["AvailabilityZone"],
                     "instance_type": machine, "currency": best.get("CurrencyCode", "USD"),
                     "end": best["EndDate"].isoformat(), "requested_start": start, "requested_hours": hours,
                     "days": block / 24, "price_source": "describe_capacity_block_offerings UpfrontFee"})

    def reserve(self, offer: Offer, *, start: str, hours: float, quote: Reservation | None = None) -> Reservation:
        """Buy a Capacity Block for one instance of ``offer``'s type: the offering ``quote`` (from
        :meth:`quote_reservation`) names, else the one it would name now. Charged at purchase
        (the offering's upfront fee, for whole days); EC2 offers no cancellation."""
        quote = quote if quote is not None else self.quote_reservation(offer, start=start, hours=hours)
        with self._boundary("buy a Capacity Block", offer.id, default=LaunchFailed):
            bought = self.client.purchase_capacity_block(CapacityBlockOfferingId=quote.details["offering_id"],
                                                         InstancePlatform="Linux/UNIX")["CapacityReservation"]
        machine = quote.details["instance_type"]
        booked_zone = quote.details["availability_zone"]
        return Reservation(
            reservation_id=bought["CapacityReservationId"], provider=self.name, offer_id=f"{machine}@{booked_zone}",
            start=bought["StartDate"].isoformat() if bought.get("StartDate") else quote.start,
            hours=quote.hours, guarantee="provider", price=quote.price,
            details={**quote.details, "capacity_reservation_id": bought["CapacityReservationId"],
                     "state": bought.get("State"),
                     "end": bought["EndDate"].isoformat() if bought.get("EndDate") else quote.details["end"]})

    def cancel_reservation(self, reservation: Reservation) -> None:
        """Capacity Blocks are paid up front and EC2 offers no cancellation."""
        raise NotSupported("Capacity Blocks cannot be cancelled", provider=self.name, offer=reservation.offer_id,
                           hint="the block ends by itself at its end date")


# -- helpers ------------------------------------------------------------------------------



def _block_rate(tag: str | None) -> float | None:
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




def _opens_ssh_to(group: Mapping[str, Any], cidr: str) -> bool:
    """Whether one of ``group``'s ingress rules lets tcp/22 in from all of ``cidr``."""
    want = ipaddress.ip_network(cidr, strict=False)
    for rule in group.get("IpPermissions") or []:
        if rule.get("IpProtocol") in ("tcp", "-1") and rule.get("FromPort", 0) <= 22 <= rule.get("ToPort", 65535):
            ranges = [r.get("CidrIp") for r in rule.get("IpRanges") or []] + [
                r.get("CidrIpv6") for r in rule.get("Ipv6Ranges") or []]
            for text in ranges:
                try:
                    have = ipaddress.ip_network(str(text), strict=False)
                except ValueError:
                    continue
                if have.version == want.version and want.subnet_of(have):  # type: ignore[arg-type]
                    return True
    return False


def _own_ssh_rules(group: Mapping[str, Any]) -> set[str]:
    """The CIDRs of ``group``'s tcp/22 rules that this provider wrote (by their description)."""
    out = set()
    for rule in group.get("IpPermissions") or []:
        if rule.get("IpProtocol") == "tcp" and rule.get("FromPort") == 22 and rule.get("ToPort") == 22:
            out |= {str(r.get("CidrIp") or r.get("CidrIpv6")) for r in
                    [*(rule.get("IpRanges") or []), *(rule.get("Ipv6Ranges") or [])]
                    if r.get("Description") == _RULE_DESCRIPTION}
    return out


def _ssh_permission(cidr: str) -> dict[str, Any]:
    """The ingress rule for tcp/22 from ``cidr``."""
    ranges = ({"Ipv6Ranges": [{"CidrIpv6": cidr, "Description": _RULE_DESCRIPTION}]} if ":" in cidr
              else {"IpRanges": [{"CidrIp": cidr, "Description": _RULE_DESCRIPTION}]})
    return {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges}


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
