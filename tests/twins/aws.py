"""An AWS twin: a moto EC2 server on loopback whose instances are real machines.

moto answers EC2's API (key pairs, security groups, VPCs, ``run_instances``, ``describe_instances``)
as EC2 does, in this process; the twin hooks the region's moto backend so that each instance
``run_instances`` creates stays ``pending`` for the boot delay, then becomes a real machine
(:func:`twins.machines.start_machine`) whose sshd listens on the instance's public IP, a fresh
127.x.y.z, port 22: the provider's own answer (``PublicIpAddress``, 22) is used as it is. The
machine authorizes the key pair's public key (``KeyName``) and the user data's
``ssh_authorized_keys``, and installs the user data's ``ssh_keys`` host key, as cloud-init would.

The security group is enforced: the instance's port 22 is a :class:`twins.gate.Gate` in front of its
sshd that lets a connection through only while one of the instance's groups has an ingress rule for
tcp/22 covering the user's address (:attr:`AwsTwin.caller_address`: the network address of
``ssh_cidr`` to begin with; what :meth:`AwsTwin.checkip` answers, as checkip.amazonaws.com does).
:meth:`AwsTwin.move_user` gives the user another address and ends the connections open from the old
one. ``run_instances`` with a ``ClientToken`` is done once (the same token again answers the same
reservation, EC2's idempotency); with ``gateway_errors``, that many launches are carried out and then
answered 503 (``Unavailable``; with ``gateway_status=500``, ``InternalError``); with ``lose_answers``,
that many launches are carried out and their
answer held back for ``LOST_ANSWER_S`` (a client reading with a shorter timeout gives up); with
``fail_first_delete``, each instance's first
``terminate_instances`` answers 503 and terminates nothing. :attr:`AwsTwin.actions` lists each call
(``Action``, the HTTP status answered).

Capacity Blocks, which moto does not serve, are served here as EC2 does, in the shapes of botocore's
service model: ``capacity_blocks`` maps an instance type to its fee per instance per day; an
offering exists for each duration EC2 sells (whole days from 1 to 14, then whole weeks up to 182
days; any other is refused), starts at 11:30 UTC on each day from the start of the range (the end
of the range bounds it) in the region's first zone, and its ``UpfrontFee`` is the fee x days x
instances. ``purchase_capacity_block`` buys one (:attr:`AwsTwin.purchases`).

Terminating or stopping the instance kills the machine; :meth:`AwsTwin.kill` ends it the way a spot
interruption does (``terminated``, state reason ``Server.SpotInstanceTermination``). Machines log in
as ``ubuntu`` with passwordless sudo, as the Deep Learning AMI does; a machine's Python is its
image's (``images``: ``ImageId`` -> interpreter path), else its offer's, else (an instance type the
offers leave out, from the catalog) the twin's ``python``.

    with AwsTwin(tmp_path, boot_delay_s=0.2) as twin:
        os.environ.update(twin.env())        # AWS_ENDPOINT_URL_EC2, credentials, region, SSH CIDR
        provider = AwsProvider(**twin.provider_kwargs())
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import ipaddress
import logging
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml

from jupyter_portable.compute import gpu_catalog
from twins.gate import Gate
from twins.machines import BARE_PYTHON, CLOUD_USER, TwinMachine, start_machine

POWER_PATH = "/twin-machine/shutdown/"  # where a twin machine's `shutdown` reports (machines.start_machine)
ACCOUNT = "123456789012"  # moto's default account: where keys "testing" land
SPOT_INTERRUPTION = "Server.SpotInstanceTermination"
LOST_ANSWER_S = 3.0  # how long a lost answer is held back
# what RunInstances takes as ImageId: an image id, or an SSM parameter EC2 resolves at launch
AMI_ID = re.compile(r"\A(?:ami-(?:[0-9a-f]{8}|[0-9a-f]{17})|resolve:ssm:\S+)\Z")


@dataclass
class AwsOffer:
    """What an instance type's machine presents, and how many can start (``stock``; None: any);
    ``python``: the bare interpreter its machines have (a path)."""

    gpu: str
    memory_mb: int
    count: int = 1
    driver: str = "550.54.15"
    cuda: str = "12.4"
    stock: int | None = None
    python: str = BARE_PYTHON

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [{"name": self.gpu, "memory_mb": self.memory_mb} for _ in range(self.count)]


def catalog_offer(instance_type: str) -> AwsOffer:
    """The machine :data:`gpu_catalog.AWS` says ``instance_type`` is."""
    shape = gpu_catalog.AWS[instance_type]
    return AwsOffer(gpu=f"NVIDIA {shape.gpu}", memory_mb=int(shape.gpu_memory_gb * 1024), count=shape.gpu_count)


@dataclass
class Booting:
    instance_id: str
    instance_type: str
    ready_at: float
    machine: TwinMachine | None = None
    address: str | None = None
    gate: Gate | None = None  # port 22 of the public address, as the security groups let it through
    ended: bool = False
    errors: list[str] = field(default_factory=list)


def cloud_config(user_data: Any) -> dict[str, Any]:
    """The cloud-config an instance's user data holds (moto keeps it base64-encoded), or {}."""
    if not user_data:
        return {}
    raw = str(user_data)
    with contextlib.suppress(ValueError):
        raw = base64.b64decode(raw, validate=True).decode()
    if not raw.startswith("#cloud-config"):
        return {}
    config = yaml.safe_load(raw)
    return config if isinstance(config, dict) else {}


class AwsTwin:
    """EC2 on loopback for one region, with real machines behind its instances."""

    def __init__(self, root: Path, *, offers: Mapping[str, AwsOffer | dict[str, Any]] | None = None,
                 boot_delay_s: float = 0.5, region: str = "us-east-1", ssh_cidr: str = "198.51.100.7/32",
                 images: Mapping[str, str] | None = None, python: str = BARE_PYTHON, gateway_errors: int = 0,
                 fail_first_delete: bool = False, capacity_blocks: Mapping[str, float] | None = None,
                 lose_answers: int = 0, gateway_status: int = 503) -> None:
        self.root = Path(root)
        self.lose_answers = lose_answers
        self.capacity_blocks = dict(capacity_blocks or {})  # instance type -> $ per instance per day
        self.offerings: dict[str, dict[str, Any]] = {}  # CapacityBlockOfferingId -> the offering described
        self.purchases: list[dict[str, Any]] = []  # the capacity reservations bought
        self.gateway_errors = gateway_errors
        self.gateway_status = gateway_status  # what that front end answers: 503 Unavailable, or 500 InternalError
        self.fail_first_delete = fail_first_delete
        self.terminates: dict[str, int] = {}  # instance id -> terminate_instances calls naming it
        self.shutdowns: list[tuple[str, str]] = []  # (instance id, its shutdown behaviour) of each machine's shutdown
        self.client_tokens: dict[str, Any] = {}  # ClientToken -> the reservation its launch made
        self.actions: list[tuple[str, int]] = []  # (Action, HTTP status) of every call
        # where the user's connections come from, as the provider's side sees it (behind any NAT)
        self.caller_address = str(ipaddress.ip_network(ssh_cidr, strict=False).network_address)
        self.images = dict(images or {})  # ImageId -> the bare interpreter its machines have
        self.python = python  # what a catalog instance type's machines have (an offer may say otherwise)
        self.offers = {k: (v if isinstance(v, AwsOffer) else AwsOffer(**v)) for k, v in (offers or {}).items()}
        self.boot_delay_s = boot_delay_s
        self.region = region
        self.ssh_cidr = ssh_cidr
        self.lock = threading.RLock()
        self.booting: dict[str, Booting] = {}
        self.errors: list[str] = []
        self._server: Any = None
        self._url = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._backend: Any = None

    # -- what tests use ----------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """boto3's own variables (and the provider's) pointing at this twin."""
        return {"AWS_ENDPOINT_URL_EC2": self._url, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true", "JUPYTER_PORTABLE_SSH_CIDR": self.ssh_cidr}

    def provider_kwargs(self) -> dict[str, Any]:
        """Nothing: the environment says it all."""
        return {}

    def checkip(self) -> str:
        """The user's public address, as https://checkip.amazonaws.com answers it (one line)."""
        return self.caller_address + "\n"

    def move_user(self, address: str) -> None:
        """The user's computer is now seen at ``address`` (another network): the connections it had
        open from the old one end, and new ones pass only where a rule covers ``address``."""
        self.caller_address = str(ipaddress.ip_address(address))
        with self.lock:
            gates = [b.gate for b in self.booting.values() if b.gate is not None]
        for gate in gates:
            gate.cut()

    def block_offerings(self, instance_type: str, count: int, hours: int, start: datetime,
                        end: datetime | None) -> list[dict[str, Any]]:
        """The Capacity Block offerings EC2 answers for that search (see the module docstring)."""
        days = hours // 24
        if hours % 24 or not (1 <= days <= 14 or (days % 7 == 0 and days <= 182)):
            raise _Refused("InvalidParameterValue", f"The requested capacity duration {hours} hours is not "
                                                    "supported. Specify a duration of 1 to 14 days, or 7-day "
                                                    "multiples up to 182 days, in hours.")
        fee = self.capacity_blocks.get(instance_type)
        if fee is None:
            return []
        day = start.astimezone(timezone.utc).replace(hour=11, minute=30, second=0, microsecond=0)
        if day < start:
            day += timedelta(days=1)
        out = []
        while len(out) < 3 and (end is None or day + timedelta(hours=hours) <= end):
            oid = "cb-" + hashlib.sha256(f"{instance_type}{count}{hours}{day.isoformat()}".encode()).hexdigest()[:17]
            offering = {"CapacityBlockOfferingId": oid, "InstanceType": instance_type,
                        "AvailabilityZone": f"{self.region}a", "InstanceCount": count, "StartDate": day,
                        "EndDate": day + timedelta(hours=hours), "CapacityBlockDurationHours": hours,
                        "UpfrontFee": f"{fee * days * count:.2f}", "CurrencyCode": "USD", "Tenancy": "default"}
            with self.lock:
                self.offerings[oid] = offering
            out.append(offering)
            day += timedelta(days=1)
        return out

    def purchase_block(self, offering_id: str) -> dict[str, Any]:
        with self.lock:
            offering = self.offerings.get(offering_id)
            if offering is None:
                raise _Refused("InvalidCapacityBlockOfferingId.NotFound",
                               f"The capacity block offering ID '{offering_id}' does not exist.")
            reservation = {"CapacityReservationId": "cr-" + hashlib.sha256(offering_id.encode()).hexdigest()[:17],
                           "OwnerId": ACCOUNT, "InstanceType": offering["InstanceType"],
                           "InstancePlatform": "Linux/UNIX", "AvailabilityZone": offering["AvailabilityZone"],
                           "Tenancy": "default", "TotalInstanceCount": offering["InstanceCount"],
                           "AvailableInstanceCount": offering["InstanceCount"], "State": "scheduled",
                           "StartDate": offering["StartDate"], "EndDate": offering["EndDate"],
                           "EndDateType": "limited", "InstanceMatchCriteria": "targeted",
                           "CreateDate": datetime.now(timezone.utc), "ReservationType": "capacity-block"}
            self.purchases.append({**reservation, "UpfrontFee": offering["UpfrontFee"]})
        return reservation

    def admits(self, ref: str) -> bool:
        """Whether one of instance ``ref``'s security groups lets tcp/22 in from the user's address."""
        source = ipaddress.ip_address(self.caller_address)
        for group in self.instance(ref).security_groups:
            for rule in group.ingress_rules:
                protocol = str(rule.ip_protocol or "")
                if protocol not in ("tcp", "6", "-1"):
                    continue
                if protocol != "-1" and not (int(rule.from_port) <= 22 <= int(rule.to_port)):
                    continue
                cidr = rule.ip_range.get("CidrIp") or rule.ip_range.get("CidrIpv6")
                if cidr and source in ipaddress.ip_network(cidr, strict=False):
                    return True
        return False

    @property
    def backend(self) -> Any:
        """moto's EC2 backend for the region (its key pairs, groups and instances)."""
        assert self._backend is not None, "the twin is not started: use it in a with block"
        return self._backend

    @property
    def machines(self) -> dict[str, TwinMachine]:
        with self.lock:
            return {ref: b.machine for ref, b in self.booting.items() if b.machine is not None}

    def instance(self, ref: str) -> Any:
        return self.backend.get_instance(ref)

    def running(self) -> list[str]:
        """Instance ids EC2 does not list as terminated."""
        with self.lock:
            refs = list(self.booting)
        return [ref for ref in refs if self.instance(ref)._state.name not in ("terminated", "shutting-down")]

    def kill(self, ref: str, reason: str = "Spot Instance termination: EC2 reclaimed the capacity") -> None:
        """EC2 takes the instance back: the machine dies, and EC2 reports it terminated by the
        service with ``reason`` (as a spot interruption reads)."""
        with self.lock:
            booting = self.booting[ref]
            booting.ended = True
        self._end(booting)
        instance = self.instance(ref)
        from moto.ec2.models.instances import StateReason

        instance._state.name, instance._state.code = "terminated", 48
        instance._reason = reason
        instance.state_reason = StateReason(f"{SPOT_INTERRUPTION}: {reason}", SPOT_INTERRUPTION)
        for nic in instance.nics.values():
            nic.public_ip = None

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> AwsTwin:
        from moto.ec2.models import ec2_backends
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.root.mkdir(parents=True, exist_ok=True)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self._url = f"http://{host}:{port}"
        self._server._server.app = _Gateway(self._server._server.app, self)  # werkzeug serves server.app
        # moto's backends live in this process and outlast a server: start from an empty region
        self._backend = ec2_backends[ACCOUNT][self.region]
        self._backend.reset()
        self._hook(self._backend)
        self._thread = threading.Thread(target=self._boot_loop, name="aws-twin-boot", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self.lock:
            bootings = list(self.booting.values())
        for booting in bootings:
            booting.ended = True
            if booting.gate is not None:
                booting.gate.close()
            if booting.machine is not None:
                booting.machine.remove()
        if self._server is not None:
            self._server.stop()
        if self._backend is not None:
            self._backend.reset()  # also drops the hooks, which live on the backend object

    # -- the hooks into moto -----------------------------------------------------------------------

    def _hook(self, backend: Any) -> None:
        run, terminate, stop = backend.run_instances, backend.terminate_instances, backend.stop_instances
        twin = self

        def run_instances(image_id: str, count: int, user_data: Any, security_group_names: Any, **kw: Any) -> Any:
            if not AMI_ID.match(str(image_id)):  # EC2 takes an image id or an SSM parameter, nothing else
                from moto.ec2.exceptions import EC2ClientError

                raise EC2ClientError("InvalidAMIID.Malformed", f'Invalid id: "{image_id}" (expecting "ami-...")')
            token = kw.get("client_token")
            token = None if token in (None, "", "ABCDE") else token  # ABCDE: moto's stand-in for none
            with twin.lock:
                if token is not None and token in twin.client_tokens:
                    return twin.client_tokens[token]  # EC2 does a launch once per ClientToken
            instance_type = kw.get("instance_type", "m1.small")
            offer = twin._offer(instance_type)
            if offer.stock is not None:
                with twin.lock:
                    taken = sum(1 for b in twin.booting.values() if b.instance_type == instance_type and not b.ended)
                if taken + count > offer.stock:
                    from moto.ec2.exceptions import EC2ClientError

                    raise EC2ClientError(
                        "InsufficientInstanceCapacity",
                        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone "
                        "you requested. Our system will be working on provisioning additional capacity.")
            reservation = run(image_id, count, user_data, security_group_names, **kw)
            for instance in reservation.instances:
                # EC2 answers pending, with no public address until the machine is up
                instance._state.name, instance._state.code = "pending", 0
                for nic in instance.nics.values():
                    nic.public_ip = None
                with twin.lock:
                    twin.booting[instance.id] = Booting(instance.id, instance_type,
                                                        time.monotonic() + twin.boot_delay_s)
            if token is not None:
                with twin.lock:
                    twin.client_tokens[token] = reservation
            return reservation

        # ended first: a boot due at this moment must not mark the instance running after EC2 has
        # marked it terminated (the boot loop checks `ended` under the lock before it does)
        def terminate_instances(instance_ids: list[str]) -> Any:
            twin._ended(instance_ids)
            return terminate(instance_ids)

        def stop_instances(instance_ids: list[str]) -> Any:
            twin._ended(instance_ids)
            return stop(instance_ids)

        backend.run_instances = run_instances
        backend.terminate_instances = terminate_instances
        backend.stop_instances = stop_instances

    def machine_shutdown(self, instance_id: str) -> None:
        """The instance's machine ran ``shutdown``: EC2 terminates it when it was launched with
        InstanceInitiatedShutdownBehavior=terminate, else stops it (its disk stays, and bills). Done once
        the answer is on its way: the caller runs on the machine that goes down."""
        instance = self.instance(instance_id)
        behaviour = instance.instance_initiated_shutdown_behavior
        with self.lock:
            self.shutdowns.append((instance_id, behaviour))

        def power_off() -> None:
            if behaviour == "terminate":
                self.backend.terminate_instances([instance_id])
            else:
                self.backend.stop_instances([instance_id])

        threading.Timer(0.2, power_off).start()

    def _offer(self, instance_type: str) -> AwsOffer:
        if instance_type in self.offers:
            return self.offers[instance_type]
        if instance_type in gpu_catalog.AWS:
            return replace(catalog_offer(instance_type), python=self.python)
        return AwsOffer(gpu="NVIDIA T4", memory_mb=15360, count=0)  # a type without GPUs

    def _ended(self, instance_ids: list[str]) -> None:
        for ref in instance_ids:
            with self.lock:
                booting = self.booting.get(ref)
                if booting is None:
                    continue
                booting.ended = True
            self._end(booting)

    def _end(self, booting: Booting) -> None:
        # the boot loop may be starting this machine right now: the lock orders the two
        with self.lock:
            if booting.gate is not None:
                booting.gate.close()
            if booting.machine is not None:
                booting.machine.kill()

    # -- booting -----------------------------------------------------------------------------------

    def _boot_loop(self) -> None:
        while not self._stop.wait(0.05):
            with self.lock:
                due = [b for b in self.booting.values()
                       if b.machine is None and not b.ended and not b.errors and b.ready_at <= time.monotonic()]
            for booting in due:
                try:
                    self._boot(booting)
                except Exception as exc:  # noqa: BLE001 - recorded; the instance stays pending, the test sees why
                    booting.errors.append(f"{type(exc).__name__}: {exc}")
                    self.errors.append(f"{booting.instance_id}: {exc}")

    def _boot(self, booting: Booting) -> None:
        instance = self.instance(booting.instance_id)
        config = cloud_config(instance.user_data)
        keys = list(config.get("ssh_authorized_keys") or [])
        if instance.key_name:
            keys.append(self.backend.key_pairs[instance.key_name].public_key)
        ssh_keys = config.get("ssh_keys") or {}
        host_key = ((ssh_keys["ed25519_private"], ssh_keys["ed25519_public"])
                    if "ed25519_private" in ssh_keys and "ed25519_public" in ssh_keys else None)
        offer = self._offer(booting.instance_type)
        python = self.images.get(str(instance.image_id), offer.python)
        with self.lock:
            if booting.ended:
                return
            booting.machine, booting.gate = start_behind_security_group(
                self.root, booting.instance_id, offer, keys, host_key, python=python,
                admits=lambda: self.admits(booting.instance_id),
                shutdown_url=f"{self._url}{POWER_PATH}{booting.instance_id}")
            booting.address = booting.machine.host
            for nic in instance.nics.values():
                nic.public_ip = booting.machine.host
            instance._state.name, instance._state.code = "running", 16


def start_on_public_address(root: Path, machine_id: str, offer: AwsOffer, keys: list[str],
                            host_key: tuple[str, str] | None, *, python: str | None = None,
                            shutdown_url: str | None = None) -> TwinMachine:
    """A machine with its own "public IP" on loopback (a random 127.x.y.z) and sshd on port 22, for
    ``ubuntu`` with sudo (the clouds' images), with ``python`` (default: the offer's)."""
    for _attempt in range(20):
        address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        with contextlib.suppress(OSError):  # that address's port 22 is taken (another twin's machine): pick another
            return start_machine(root, machine_id, gpus=offer.gpus, driver=offer.driver, cuda=offer.cuda,
                                 public_keys=keys, host=address, port=22, host_key=host_key, user=CLOUD_USER,
                                 python=python or offer.python, shutdown_url=shutdown_url)
    raise RuntimeError("no free loopback address for the machine's sshd")


def start_behind_security_group(root: Path, machine_id: str, offer: AwsOffer, keys: list[str],
                                host_key: tuple[str, str] | None, *, python: str | None,
                                admits: Any, shutdown_url: str | None = None) -> tuple[TwinMachine, Gate]:
    """A machine with its own "public IP" on loopback (a random 127.x.y.z) whose port 22 is a
    :class:`Gate` (``admits``: the security groups' say) in front of its sshd on another port."""
    for _attempt in range(20):
        address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        machine = start_machine(root, machine_id, gpus=offer.gpus, driver=offer.driver, cuda=offer.cuda,
                                public_keys=keys, host=address, host_key=host_key, user=CLOUD_USER,
                                python=python or offer.python, shutdown_url=shutdown_url)
        try:
            return machine, Gate(address, 22, (address, machine.port), admits)
        except OSError:  # that address's port 22 is taken (another twin's machine): pick another
            machine.remove()
    raise RuntimeError("no free loopback address for the machine's port 22")


_UNAVAILABLE = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>Unavailable</Code>'
                b"<Message>The server is overloaded and cannot handle the request at this time.</Message>"
                b"</Error></Errors><RequestID>twin-gateway</RequestID></Response>")
_INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>InternalError</Code>'
             b"<Message>An internal error has occurred.</Message>"
             b"</Error></Errors><RequestID>twin-gateway</RequestID></Response>")


class _Gateway:
    """EC2's front end, around moto's WSGI app: records each call, and answers 503 where the twin
    is told to (a launch after it was carried out; an instance's first terminate before)."""

    def __init__(self, app: Any, twin: AwsTwin) -> None:
        self.app = app
        self.twin = twin

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        import io

        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        twin = self.twin
        path = str(environ.get("PATH_INFO") or "")
        if path.startswith(POWER_PATH):  # not EC2's API: a machine's own shutdown, told to its host
            twin.machine_shutdown(path[len(POWER_PATH):])
            start_response("204 No Content", [("Content-Length", "0")])
            return [b""]
        form = parse_qs(body.decode("utf-8", "replace"))
        action = (form.get("Action") or [""])[0]
        if action in ("DescribeCapacityBlockOfferings", "PurchaseCapacityBlock"):
            return self._blocks(action, {k: v[0] for k, v in form.items()}, start_response)
        if action == "TerminateInstances":
            refs = [v[0] for k, v in form.items() if k.startswith("InstanceId.")]
            with twin.lock:
                first = False
                for ref in refs:
                    twin.terminates[ref] = twin.terminates.get(ref, 0) + 1
                    first = first or twin.terminates[ref] == 1
            if first and twin.fail_first_delete:
                return self._unavailable(action, start_response)
        statuses: list[int] = []

        def recording(status: str, headers: Any, exc_info: Any = None) -> Any:
            statuses.append(int(status.split()[0]))
            return start_response(status, headers, exc_info) if not gateway else None

        gateway = lost = False
        if action == "RunInstances" and "DryRun" not in form:
            with twin.lock:
                gateway = twin.gateway_errors > 0
                if gateway:
                    twin.gateway_errors -= 1
                lost = not gateway and twin.lose_answers > 0
                if lost:
                    twin.lose_answers -= 1
        answer = self.app(environ, recording)
        if lost:  # carried out; the answer comes after the caller stopped waiting for it
            with twin.lock:
                twin.actions.append((action, -1))
            time.sleep(LOST_ANSWER_S)
            return answer
        if gateway:
            b"".join(answer)  # carried out; the caller sees the front end's error instead
            return self._unavailable(action, start_response)
        with twin.lock:
            twin.actions.append((action, statuses[0] if statuses else 0))
        return answer

    def _blocks(self, action: str, form: dict[str, str], start_response: Any) -> list[bytes]:
        twin = self.twin
        try:
            if action == "DescribeCapacityBlockOfferings":
                end = form.get("EndDateRange")
                found = twin.block_offerings(form["InstanceType"], int(form.get("InstanceCount", "1")),
                                             int(form["CapacityDurationHours"]), _when(form["StartDateRange"]),
                                             _when(end) if end else None)
                answer = {"CapacityBlockOfferings": found}
            else:
                answer = {"CapacityReservation": twin.purchase_block(form["CapacityBlockOfferingId"])}
        except _Refused as exc:
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{exc.code}</Code>'
                    f"<Message>{exc.message}</Message></Error></Errors><RequestID>twin</RequestID></Response>").encode()
            with twin.lock:
                twin.actions.append((action, 400))
            start_response("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
            return [body]
        data = _ec2_xml(action, answer)
        with twin.lock:
            twin.actions.append((action, 200))
        start_response("200 OK", [("Content-Type", "text/xml"), ("Content-Length", str(len(data)))])
        return [data]

    def _unavailable(self, action: str, start_response: Any) -> list[bytes]:
        status = self.twin.gateway_status
        with self.twin.lock:
            self.twin.actions.append((action, status))
        body, line = (_INTERNAL, "500 Internal Server Error") if status == 500 else (_UNAVAILABLE,
                                                                                     "503 Service Unavailable")
        start_response(line, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
        return [body]


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def _ec2_xml(action: str, answer: dict[str, Any]) -> bytes:
    """``answer`` as EC2's XML for ``action``, element names from botocore's service model."""
    from xml.sax.saxutils import escape

    import botocore.session

    shape = botocore.session.get_session().get_service_model("ec2").operation_model(action).output_shape

    def xml(shape: Any, value: Any) -> str:
        if shape.type_name == "structure":
            return "".join(f"<{m.serialization.get('name', n)}>{xml(m, value[n])}</{m.serialization.get('name', n)}>"
                           for n, m in shape.members.items() if n in value)
        if shape.type_name == "list":
            return "".join(f"<item>{xml(shape.member, v)}</item>" for v in value)
        if shape.type_name == "timestamp":
            return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        if shape.type_name == "boolean":
            return "true" if value else "false"
        return escape(str(value))

    body = xml(shape, answer)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="http://ec2.amazonaws.com/doc/'
            f'2016-11-15/"><requestId>twin</requestId>{body}</{action}Response>').encode()
