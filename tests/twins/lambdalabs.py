"""A Lambda Cloud twin: instance types with per-region capacity, SSH keys (list and add), launch,
instances, terminate.

Lambda gives an instance an IP and nothing else: SSH is port 22 there. So each twin machine
gets its own loopback address (``127.x.y.z``) and a forwarder on port 22 of it to the machine's
sshd; ``ip`` appears once both listen. The launch's key is the registered key it names (exactly
one), plus any ``ssh_authorized_keys`` in its cloud-init ``user_data``, as cloud-init would add.
Instances go booting -> active; a killed one is ``preempted``, a terminated one ``terminated``.
Machines log in as ``ubuntu`` with passwordless sudo, as Lambda Stack does; the launch names no
image, so a machine's Python is its offer's.
Binding port 22 needs root and no server on ``0.0.0.0:22``: :func:`unavailable` says why not.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml

from twins.machines import CLOUD_USER
from twins.server import Refused, Rental, Reply, Twin, TwinOffer

_addresses = itertools.count(2)


def _error(status: int, code: str, message: str, suggestion: str | None = None) -> Reply:
    error = {"code": code, "message": message}
    if suggestion:
        error["suggestion"] = suggestion
    return Reply(status, {"error": error})


def unavailable() -> str | None:
    """Why machines cannot listen on port 22 of a loopback address here, or None."""
    if os.geteuid() != 0:
        return "the Lambda twin serves SSH on port 22 of loopback addresses, which needs root"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.254.254.254", 22))
        except OSError as exc:
            return f"port 22 on loopback addresses is taken ({exc}; a server on 0.0.0.0:22?)"
    return None


class Forwarder:
    """TCP on ``(ip, 22)`` passed to ``target``: the machine's address as Lambda gives it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        base = os.getpid() % 200 + 20  # a range per test process, so parallel runs do not collide
        for _ in range(500):
            n = next(_addresses)
            ip = f"127.{base}.{n // 250 % 250}.{n % 250 + 1}"
            try:
                self.sock.bind((ip, 22))
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        else:
            raise RuntimeError("no loopback address with port 22 free")
        self.ip = ip
        self.sock.listen(16)
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"fwd-{ip}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


class LambdaTwin(Twin):
    """Lambda Cloud on loopback. ``ssh_keys``: keys registered already, {name: public key}."""

    provider = "lambda"
    key_env = "LAMBDA_API_KEY"
    url_env = "LAMBDA_API_URL"
    error_schema = {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "suggestion": {"type": "string"}}}}}
    launch_ops = frozenset({"launchInstance"})
    login_user = CLOUD_USER  # Lambda Stack's: ubuntu, with sudo

    def __init__(self, *args: Any, ssh_keys: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ssh_keys: dict[str, str] = dict(ssh_keys or {})
        self._key_ids: dict[str, str] = {}
        self.forwarders: dict[str, Forwarder] = {}

    def provider_kwargs(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "base_url": self.url, "ssh_key_names": []}

    # -- errors ----------------------------------------------------------------------------

    def unauthorized(self, op_id: str | None) -> Reply:
        return _error(401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                      "Check your API key or create a new one, then try again.")

    def invalid(self, op_id: str, errors: list[str]) -> Reply:
        return _error(400, "global/invalid-parameters", "; ".join(errors))

    def rate_limited(self, op_id: str | None, wait_s: float) -> Reply:
        # the document states the limit (1 request/s) but lists no 429 and no header
        return _error(429, "global/too-many-requests", "Too many requests.", "Wait and try again.")

    # -- the machines ----------------------------------------------------------------------

    def on_started(self, rental: Rental) -> None:
        assert rental.machine is not None
        forwarder = Forwarder((rental.machine.host, rental.machine.port))
        with self.lock:
            if rental.deleted or rental.killed:
                forwarder.close()
            else:
                self.forwarders[rental.ref] = forwarder

    def on_kill(self, rental: Rental) -> None:
        self.on_remove(rental)

    def on_remove(self, rental: Rental) -> None:
        with self.lock:
            forwarder = self.forwarders.pop(rental.ref, None)
        if forwarder is not None:
            forwarder.close()

    # -- shapes ----------------------------------------------------------------------------

    @staticmethod
    def type_name(offer: TwinOffer) -> str:
        return f"gpu_{offer.count}x_{offer.model.lower().replace(' ', '_')}"

    def _type(self, offer: TwinOffer) -> dict[str, Any]:
        gb = round(offer.memory_mb / 1024)
        return {"name": self.type_name(offer), "description": f"{offer.count}x {offer.model} ({gb} GB PCIe)",
                "gpu_description": f"{offer.model} ({gb} GB PCIe)", "price_cents_per_hour": round(offer.price * 100),
                "specs": {"vcpus": 8 * offer.count, "memory_gib": 64 * offer.count, "storage_gib": 512,
                          "gpus": offer.count}}

    def _instance(self, rental: Rental) -> dict[str, Any]:
        phase = self.phase(rental)
        status = {"deleted": "terminated", "killed": "preempted", "failed": "unhealthy",
                  "booting": "booting"}.get(phase, "active")
        inst: dict[str, Any] = {"id": rental.ref, "name": rental.name, "status": status,
                                "ssh_key_names": rental.extra["key_names"], "file_system_names": [],
                                "region": {"name": rental.offer.region, "description": rental.offer.region},
                                "instance_type": self._type(rental.offer),
                                "tags": list(rental.extra.get("tags") or []),
                                "actions": {a: {"available": status == "active"}
                                            for a in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")}}
        forwarder = self.forwarders.get(rental.ref)
        if status == "active" and phase == "up" and forwarder is not None:
            inst.update(ip=forwarder.ip, private_ip=forwarder.ip, hostname=forwarder.ip.replace(".", "-"))
        return inst

    # -- the operations --------------------------------------------------------------------

    def handle(self, op_id: str, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        with self.lock:
            return getattr(self, "op_" + op_id)(params, body)

    def op_listInstanceTypes(self, params: dict[str, str], body: Any) -> Reply:
        data: dict[str, Any] = {}
        for offer in self.offers:
            entry = data.setdefault(self.type_name(offer), {"instance_type": self._type(offer),
                                                            "regions_with_capacity_available": []})
            if offer.stock > 0:
                entry["regions_with_capacity_available"].append({"name": offer.region, "description": offer.region})
        return Reply(200, {"data": data})

    def _key_id(self, name: str) -> str:
        return self._key_ids.setdefault(name, os.urandom(16).hex())

    def op_listSSHKeys(self, params: dict[str, str], body: Any) -> Reply:
        return Reply(200, {"data": [{"id": self._key_id(n), "name": n, "public_key": k}
                                    for n, k in self.ssh_keys.items()]})

    def op_addSSHKey(self, params: dict[str, str], body: Any) -> Reply:
        name = body["name"]
        if name in self.ssh_keys:
            raise Refused(_error(400, "global/invalid-parameters", f"An SSH key named {name!r} already exists."))
        private = None
        public = body.get("public_key")
        if not public:  # the document: omit it and Lambda generates the pair
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "key"
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                               stdin=subprocess.DEVNULL)
                public, private = path.with_suffix(".pub").read_text().strip(), path.read_text()
        self.ssh_keys[name] = public.strip()
        data = {"id": self._key_id(name), "name": name, "public_key": public.strip()}
        if private is not None:
            data["private_key"] = private
        return Reply(200, {"data": data})

    def op_launchInstance(self, params: dict[str, str], body: Any) -> Reply:
        names = body.get("ssh_key_names") or []
        unknown = [n for n in names if n not in self.ssh_keys]
        if unknown:
            raise Refused(_error(404, "global/object-does-not-exist", "Specified SSH key does not exist.",
                                 "Check the SSH key name, then try again."))
        offer = next((o for o in self.offers if self.type_name(o) == body["instance_type_name"]
                      and o.region == body["region_name"] and o.stock > 0), None)
        if offer is None:
            raise Refused(_error(400, "instance-operations/launch/insufficient-capacity",
                                 "Not enough capacity to fulfill launch request.",
                                 "Choose an instance type with more availability, or try again later."))
        keys = [self.ssh_keys[n] for n in names] + _cloud_init_keys(body.get("user_data"))
        rental = self.rent(offer, os.urandom(16).hex(), name=body.get("name", ""), keys=keys, key_names=names,
                             tags=list(body.get("tags") or []))
        return Reply(200, {"data": {"instance_ids": [rental.ref]}})

    def op_listInstances(self, params: dict[str, str], body: Any) -> Reply:
        return Reply(200, {"data": [self._instance(r) for r in self.listed()]})

    def op_getInstance(self, params: dict[str, str], body: Any) -> Reply:
        rental = self.rentals.get(params["id"])
        if rental is None:
            raise Refused(_error(404, "global/object-does-not-exist", "Specified instance does not exist."))
        return Reply(200, {"data": self._instance(rental)})

    def op_terminateInstance(self, params: dict[str, str], body: Any) -> Reply:
        rentals = [self.rentals.get(ref) for ref in body["instance_ids"]]
        if any(r is None or r.deleted for r in rentals):
            raise Refused(_error(404, "global/object-does-not-exist", "Specified instance does not exist."))
        done = []
        for rental in rentals:
            assert rental is not None
            if not self.delete(rental):
                raise Refused(Reply(503, {"error": {"code": "provider/internal-unavailable",
                                                    "message": "Provider unavailable",
                                                    "suggestion": "Try again shortly"}}, undocumented=True))
            done.append({**self._instance(rental), "status": "terminating"})
        return Reply(200, {"data": {"terminated_instances": done}})


def _cloud_init_keys(user_data: str | None) -> list[str]:
    """``ssh_authorized_keys`` of a ``#cloud-config`` user_data, as cloud-init installs them."""
    if not user_data or not user_data.startswith("#cloud-config"):
        return []
    try:
        config = yaml.safe_load(user_data)
    except yaml.YAMLError:
        return []
    keys = config.get("ssh_authorized_keys") if isinstance(config, dict) else None
    return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
