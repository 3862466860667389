"""An AWS twin: a moto EC2 server on loopback whose instances are real machines.

moto answers EC2's API (key pairs, security groups, VPCs, ``run_instances``, ``describe_instances``)
as EC2 does, in this process; the twin hooks the region's moto backend so that each instance
``run_instances`` creates stays ``pending`` for the boot delay, then becomes a real machine
(:func:`twins.machines.start_machine`) whose sshd listens on the instance's public IP, a fresh
127.x.y.z, port 22: the provider's own answer (``PublicIpAddress``, 22) is used as it is. The
machine authorizes the key pair's public key (``KeyName``) and the user data's
``ssh_authorized_keys``, and installs the user data's ``ssh_keys`` host key, as cloud-init would.
Terminating or stopping the instance kills the machine; :meth:`AwsTwin.kill` ends it the way a spot
interruption does (``terminated``, state reason ``Server.SpotInstanceTermination``).

    with AwsTwin(tmp_path, boot_delay_s=0.2) as twin:
        os.environ.update(twin.env())        # AWS_ENDPOINT_URL_EC2, credentials, region, SSH CIDR
        provider = AwsProvider(**twin.provider_kwargs())
"""

from __future__ import annotations

import base64
import contextlib
import logging
import random
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jupyter_portable.compute import gpu_catalog
from twins.machines import TwinMachine, start_machine

ACCOUNT = "123456789012"  # moto's default account: where keys "testing" land
SPOT_INTERRUPTION = "Server.SpotInstanceTermination"


@dataclass
class AwsOffer:
    """What an instance type's machine presents, and how many can start (``stock``; None: any)."""

    gpu: str
    memory_mb: int
    count: int = 1
    driver: str = "550.54.15"
    cuda: str = "12.4"
    stock: int | None = None

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
                 boot_delay_s: float = 0.5, region: str = "us-east-1", ssh_cidr: str = "198.51.100.7/32") -> None:
        self.root = Path(root)
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
                "AWS_EC2_METADATA_DISABLED": "true", "JUPYTER_PORTABLE_SSH_CIDR": self.ssh_cidr,
                # the twin's machines let root in, where the DLAMI has "ubuntu"
                "JUPYTER_PORTABLE_AWS_SSH_USER": "root"}

    def provider_kwargs(self) -> dict[str, Any]:
        """Nothing: the environment says it all."""
        return {}

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

    def _offer(self, instance_type: str) -> AwsOffer:
        if instance_type in self.offers:
            return self.offers[instance_type]
        if instance_type in gpu_catalog.AWS:
            return catalog_offer(instance_type)
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
        with self.lock:
            if booting.ended:
                return
            booting.machine = start_on_public_address(self.root, booting.instance_id, offer, keys, host_key)
            booting.address = booting.machine.host
            for nic in instance.nics.values():
                nic.public_ip = booting.machine.host
            instance._state.name, instance._state.code = "running", 16


def start_on_public_address(root: Path, machine_id: str, offer: AwsOffer, keys: list[str],
                            host_key: tuple[str, str] | None) -> TwinMachine:
    """A machine with its own "public IP" on loopback (a random 127.x.y.z) and sshd on port 22."""
    for _attempt in range(20):
        address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        try:
            return start_machine(root, machine_id, gpus=offer.gpus, driver=offer.driver, cuda=offer.cuda,
                                 public_keys=keys, host=address, port=22, host_key=host_key)
        except OSError:  # that address's port 22 is taken (another twin's machine): pick another
            shutil.rmtree(root / machine_id, ignore_errors=True)
    raise RuntimeError("no free loopback address for the machine's sshd")
