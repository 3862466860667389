"""SSH into EC2 instances: the key pair and the security group a launch with the user's key makes
once in the account and then reuses, and the rules that follow the user's address.

- the key pair ``jupyter-portable-<hash of the key>`` (``ImportKeyPair``), tagged
  ``jupyter-portable:purpose=ssh``; the launch names it as ``KeyName``;
- in the VPC it launches into, the security group ``jupyter-portable-ssh``, tagged the
  same way, opening 22/tcp to the caller's address only: ``JUPYTER_PORTABLE_SSH_CIDR``
  when set, else the address https://checkip.amazonaws.com sees (as ``/32``), asked at each
  launch. Each instance records the address its SSH comes from (``jupyter-portable:ssh-from``);
  the group's own rules are replaced, never accumulated: the user's address now and those of
  the instances still running, every other rule this provider wrote revoked (the user's own
  rules are left alone).
- The ingress follows the user: when a heartbeat fails, :meth:`AwsSshAccess.admit` asks
  checkip again and lets the new address in before the machine could be declared lost (a
  laptop that moved to another network is not a lost machine).
"""

from __future__ import annotations

import hashlib
import ipaddress
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jupyter_portable.compute.aws_errors import ec2_boundary, error_code
from jupyter_portable.compute.base import Allocation
from jupyter_portable.core.errors import ProviderUnavailable, UsageError

PURPOSE_TAG = "jupyter-portable:purpose"
SSH_GROUP_NAME = "jupyter-portable-ssh"
# on each instance: the address (CIDR) its SSH comes from; the group keeps a rule only for those of
# running instances and the user's address now, so rules are replaced, never accumulated
SSH_FROM_TAG = "jupyter-portable:ssh-from"
_RULE_DESCRIPTION = "jupyter-portable user"  # the rules this provider wrote (the user's own are left alone)
KEY_PAIR_PREFIX = "jupyter-portable-"
CHECKIP_URL = "https://checkip.amazonaws.com"


def checkip(url: str = CHECKIP_URL, timeout: float = 10.0) -> str:
    """This machine's public IP address as AWS sees it (one line of text)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - a fixed https URL
        return str(resp.read(64).decode("ascii", "replace").strip())


class AwsSshAccess:
    """The key pair and the security group that let the user's SSH in to one region's instances.

    ``client`` and ``region`` give the provider's EC2 client and region (made on first use);
    ``ssh_cidr`` fixes where SSH comes from, else ``caller_address`` says; ``subnets`` maps a zone to
    the subnet launched in there; ``security_group_ids``, when given, are the user's own groups
    (nothing here changes them)."""

    name = "aws"

    def __init__(self, client: Callable[[], Any], *, region: Callable[[], str], ssh_cidr: str | None,
                 caller_address: Callable[[], str], subnets: Mapping[str, str],
                 security_group_ids: Sequence[str]) -> None:
        self._client = client
        self._region = region
        self._ssh_cidr = ssh_cidr
        self._caller_address = caller_address
        self.subnets = subnets
        self.security_group_ids = tuple(security_group_ids)
        # what exists already, learnt once: key pair name by key
        self._key_pairs: dict[str, str] = {}

    @property
    def client(self) -> Any:
        return self._client()

    @property
    def region(self) -> str:
        return self._region()

    def key_pair(self, public_key: str) -> str:
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
            if error_code(exc) != "InvalidKeyPair.NotFound":
                raise
            try:
                self.client.import_key_pair(
                    KeyName=name, PublicKeyMaterial=material.encode(),
                    TagSpecifications=[{"ResourceType": "key-pair", "Tags": [{"Key": PURPOSE_TAG, "Value": "ssh"}]}])
            except ClientError as dup:
                if error_code(dup) != "InvalidKeyPair.Duplicate":  # another launch imported it meanwhile
                    raise
        self._key_pairs[material] = name
        return name

    def source(self) -> str:
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

    def admit(self, allocation: Allocation) -> bool:
        """Let SSH in to ``allocation`` from this computer's address as checkip sees it now: the
        instance's ``jupyter-portable:ssh-from`` becomes that address, and this provider's group
        (``jupyter-portable-ssh``) gets a rule for it when none covers it yet, and loses its rules for
        addresses no running instance comes from any more. True when a rule was added. Nothing
        changes where JUPYTER_PORTABLE_SSH_CIDR fixes the source or the groups are the user's own
        (``security_group_ids``)."""
        groups = [str(g) for g in allocation.details.get("security_group_ids") or []]
        if self._ssh_cidr is not None or self.security_group_ids or not groups:
            return False
        cidr = self.source()
        added = False
        with ec2_boundary("let SSH in from this computer's new address", allocation.offer_id):
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
                if error_code(exc) != "InvalidPermission.NotFound":  # another launch revoked it meanwhile
                    raise
        if _opens_ssh_to(group, cidr):
            return False
        try:
            self.client.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[_ssh_permission(cidr)])
        except ClientError as exc:
            if error_code(exc) != "InvalidPermission.Duplicate":
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

    def group(self, zone: str, cidr: str) -> str:
        """The id of this provider's security group in the zone's VPC, made the first time, with
        22/tcp open to ``cidr`` (:meth:`source`) and to the addresses of its running instances
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
                if error_code(exc) != "InvalidGroup.Duplicate":  # another launch made it meanwhile
                    raise
            group = self.client.describe_security_groups(Filters=filters)["SecurityGroups"][0]
        group_id = str(group["GroupId"])
        self._replace_ssh_rules(group, cidr)  # at each launch: the machines that ended since leave no rule
        return group_id


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


__all__ = ["CHECKIP_URL", "KEY_PAIR_PREFIX", "PURPOSE_TAG", "SSH_FROM_TAG", "SSH_GROUP_NAME", "AwsSshAccess",
           "checkip"]
