"""A Google Cloud twin: Compute Engine's REST API on loopback, for the calls the provider makes,
with real machines behind its VMs.

The real ``google-cloud-compute`` clients talk to it over their own REST transport
(``JUPYTER_PORTABLE_GCP_ENDPOINT`` is the client's ``api_endpoint``) with real credentials: a
service-account file (``GOOGLE_APPLICATION_CREDENTIALS``, a fresh RSA key) whose ``token_uri`` is
this twin. Every call must carry a bearer token: the client's self-signed JWT, checked against
that key, or a token this twin issued for a signed JWT (google-auth's two ways). Every
request body is parsed by the library's own message types (``compute_v1.Instance.from_json``,
unknown fields refused) and every answer is built from them, so what passes here is what the
client library and the API agree on.

Calls served: ``acceleratorTypes.aggregatedList``, ``regions.get``, ``projects.get``,
``instances.insert/get/delete``, ``zoneOperations.get``. An insert that carries a ``requestId``
is done once: the same id again answers the first operation (Compute Engine's idempotency). With
``gateway_errors``, that many inserts are carried out and then answered 503 (or ``gateway_status``); with
``lose_answers``, that many inserts are carried out and no answer is sent (the connection is
held open until the twin stops: only a client that reads with a timeout gives up); with
``fail_first_delete``, each VM's first delete answers 503 and deletes nothing. A delete that
is taken answers a RUNNING operation; the VM is STOPPING (still listed) for ``delete_delay_s``,
then gone, and only then is its operation DONE. A VM is PROVISIONING, then STAGING, then
RUNNING once its machine (:func:`twins.machines.start_machine`) listens on the VM's external IP
(``natIP``, a fresh 127.x.y.z) port 22, with the ``ssh-keys`` metadata's keys and the
``user-data`` cloud-config's ``ssh_authorized_keys`` and ``ssh_keys`` host key.

A boot runs in the order a Google image's does. cloud-init's init stage first (before
network-online): its ``write_files``, then its ``ssh`` module, which installs the ``ssh_keys`` host
key. Then Google's guest agent (after network-online, before sshd): on a VM's first boot it reads
``/etc/default/instance_configs.cfg`` (as cloud-init left it) and, unless ``[InstanceSetup]
set_host_keys`` is false, generates new host keys over whatever is there and publishes their public
halves as guest attributes (``hostkeys/<type>``: :attr:`Vm.guest_attributes`). sshd starts last,
with the keys left on disk. So a pinned host key survives only where the user data told the agent
so, in a file written before it ran. Deleting the VM
kills the machine; :meth:`GcpTwin.kill` preempts it (TERMINATED, with the reason as
``statusMessage``). Machines log in as ``ubuntu`` with passwordless sudo (the Ubuntu images'
user): an ``ssh-keys`` line for another user gives no login here. A machine's Python is its boot
disk image's (``images``: ``sourceImage`` -> interpreter path), else its offer's.

    with GcpTwin(tmp_path, boot_delay_s=0.2) as twin:
        os.environ.update(twin.env())
        provider = GcpProvider(**twin.provider_kwargs())
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from jupyter_portable.compute import gpu_catalog
from twins.aws import AwsOffer, cloud_config, start_on_public_address
from twins.machines import BARE_PYTHON, CLOUD_USER, TwinMachine

POWER_PATH = "/twin-machine/shutdown/"  # where a VM's `shutdown` reports (machines.start_machine)

PROJECT = "twin-project"
AGENT_CONFIG = "/etc/default/instance_configs.cfg"  # the guest agent's user configuration
_NAME = re.compile(r"\A[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# a boot disk's sourceImage: an image or an image family, as a full URL or a partial one
_IMAGE = re.compile(r"(?:https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta)/)?(?:projects/[^/]+/)?"
                    r"global/images/(?:family/)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
log = logging.getLogger(__name__)
LOST_ANSWER_S = 600.0  # how long a lost answer is held back (or until the twin stops), then dropped


@dataclass
class GcpOffer:
    """An accelerator sold in one zone (``machine_type``'s, from :data:`gpu_catalog.GCP`: the zone then
    has every machine type of that accelerator), the driver its machines present, ``stock``
    (VMs at once; None: any) and ``python``, the bare interpreter its machines have (a path)."""

    machine_type: str = "g2-standard-4"
    zone: str = "us-central1-a"
    driver: str = "550.54.15"
    cuda: str = "12.4"
    stock: int | None = None
    python: str = BARE_PYTHON

    @property
    def shape(self) -> gpu_catalog.MachineShape:
        return gpu_catalog.GCP[self.machine_type]

    def machine(self, machine_type: str) -> AwsOffer:
        shape = gpu_catalog.GCP[machine_type]
        return AwsOffer(gpu=f"NVIDIA {shape.gpu}", memory_mb=int(shape.gpu_memory_gb * 1024), count=shape.gpu_count,
                        driver=self.driver, cuda=self.cuda, python=self.python)


@dataclass
class Vm:
    zone: str
    name: str
    resource: Any  # compute_v1.Instance as inserted
    offer: GcpOffer
    machine_type: str
    ready_at: float
    id: int
    status: str = "PROVISIONING"
    status_message: str = ""
    machine: TwinMachine | None = None
    ended: bool = False
    deleted: bool = False
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    errors: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # what cloud-init's write_files wrote (path -> text)
    guest_attributes: dict[str, str] = field(default_factory=dict)  # what the guest agent published
    gone_at: float = 0.0  # being deleted (STOPPING): when it is gone (time.monotonic())
    delete_operations: list[Any] = field(default_factory=list)  # the deletes' operations, RUNNING until then

    @property
    def ref(self) -> str:
        return f"{self.zone}/{self.name}"


class HttpError(Exception):
    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class GcpTwin:
    """Compute Engine for one project on loopback."""

    def __init__(self, root: Path, *, offers: Iterable[GcpOffer | dict[str, Any]] | None = None,
                 boot_delay_s: float = 0.5, project: str = PROJECT, images: dict[str, str] | None = None,
                 gateway_errors: int = 0, fail_first_delete: bool = False, delete_delay_s: float = 0.3,
                 lose_answers: int = 0, gateway_status: int = 503, os_login: str = "") -> None:
        self.root = Path(root)
        # OS Login: "" off; "project" (the project's metadata says enable-oslogin=TRUE, which a VM's own
        # enable-oslogin=FALSE overrides); "required" (an organization policy: metadata keys never log in)
        self.os_login = os_login
        self.lose_answers = lose_answers
        self.delete_delay_s = delete_delay_s
        self.gateway_errors = gateway_errors
        self.gateway_status = gateway_status  # what the front end answers then: 503, or the API's own 500
        self.fail_first_delete = fail_first_delete
        self.request_ids: dict[str, Any] = {}  # requestId -> the insert's operation
        self.deletes: dict[str, int] = {}  # VM ref -> deletes asked
        self.images = dict(images or {})  # a boot disk's sourceImage -> the bare interpreter its machines have
        self.offers = [o if isinstance(o, GcpOffer) else GcpOffer(**o) for o in (offers or [GcpOffer()])]
        self.boot_delay_s = boot_delay_s
        self.project = project
        self.token = f"twin-gcp-{secrets.token_hex(8)}"
        self.lock = threading.RLock()
        self.vms: dict[str, Vm] = {}
        self.operations: dict[str, Any] = {}
        self.requests: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.shutdowns: list[str] = []  # the VMs (ZONE/NAME) whose machine ran its own shutdown
        self._server: ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._public_pem = ""
        self._email = ""
        self._local = threading.local()  # the query of the request being served

    # -- what tests use ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the twin is not started: use it in a with block"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def env(self) -> dict[str, str]:
        """The client library's own variables, and the provider's, pointing at this twin."""
        return {"JUPYTER_PORTABLE_GCP_ENDPOINT": self.url, "GOOGLE_CLOUD_PROJECT": self.project,
                "GOOGLE_APPLICATION_CREDENTIALS": str(self.root / "service-account.json")}

    def provider_kwargs(self) -> dict[str, Any]:
        """Nothing: the environment says it all (one zone per offer, to keep listings small)."""
        return {}

    @property
    def machines(self) -> dict[str, TwinMachine]:
        with self.lock:
            return {ref: vm.machine for ref, vm in self.vms.items() if vm.machine is not None}

    def running(self) -> list[str]:
        """Refs (ZONE/NAME) of the VMs that exist and are not TERMINATED."""
        with self.lock:
            return [ref for ref, vm in self.vms.items() if vm.status != "TERMINATED" and not vm.deleted]

    def machine_shutdown(self, ref: str) -> dict[str, Any]:
        """The VM's machine ran ``shutdown``: Compute Engine stops the VM (TERMINATED, no reason: not a
        preemption), its boot disk kept (and billed). Done once the answer is on its way: the caller
        runs on the machine that goes down."""
        with self.lock:
            vm = self.vms[ref]
            self.shutdowns.append(ref)

        def power_off() -> None:
            with self.lock:
                vm.ended = True
                if vm.machine is not None:
                    vm.machine.kill()
                vm.status, vm.status_message = "TERMINATED", ""

        threading.Timer(0.2, power_off).start()
        return {}

    def kill(self, ref: str, reason: str = "Instance was preempted.") -> None:
        """Compute Engine preempts the VM: the machine dies, the VM reads TERMINATED with ``reason``."""
        with self.lock:
            vm = self.vms[ref]
            vm.ended = True
            if vm.machine is not None:
                vm.machine.kill()
            vm.status, vm.status_message = "TERMINATED", reason

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> GcpTwin:
        self.root.mkdir(parents=True, exist_ok=True)
        twin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # the head and body are two writes: no 40 ms wait for an ACK

            def _any(self) -> None:
                twin._serve(self)

            do_GET = do_POST = do_DELETE = _any  # noqa: N815 - http.server's names

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._write_credentials()
        for target, name in ((self._server.serve_forever, "gcp-twin"), (self._boot_loop, "gcp-twin-boot")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(10)
        with self.lock:
            vms = list(self.vms.values())
        for vm in vms:
            vm.ended = True
            if vm.machine is not None:
                vm.machine.remove()

    def _write_credentials(self) -> None:
        """A service-account file as the console makes one, its token_uri this twin."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        self._public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        self._email = f"portable@{self.project}.iam.gserviceaccount.com"
        path = self.root / "service-account.json"
        path.write_text(json.dumps({
            "type": "service_account", "project_id": self.project, "private_key_id": secrets.token_hex(20),
            "private_key": pem, "client_email": self._email,
            "client_id": "100000000000000000001", "token_uri": f"{self.url}/token",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth"}))
        path.chmod(0o600)

    # -- HTTP ----------------------------------------------------------------------------------------

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        url = urlsplit(request.path)
        path = url.path
        method = request.command
        self._local.query = dict(parse_qsl(url.query))
        with self.lock:
            self.requests.append((method, path))
        try:
            if path == "/token" and method == "POST":
                status, answer = 200, self._token(body)
            elif path.startswith(POWER_PATH) and method == "POST":  # not the API: a VM's own shutdown
                status, answer = 200, self.machine_shutdown(path[len(POWER_PATH):])
            else:
                if not self._authorized(request.headers.get("Authorization") or ""):
                    raise HttpError(401, "Request is missing required authentication credential.", "required")
                status, answer = 200, self._route(method, path, body)
        except HttpError as exc:
            status, answer = exc.status, {"error": {"code": exc.status, "message": exc.message, "errors": [
                {"message": exc.message, "domain": "global", "reason": exc.reason}]}}
        except Exception as exc:  # noqa: BLE001 - the twin's own bug: a 500 the test sees, and recorded
            log.exception("gcp twin")
            self.errors.append(f"{method} {path}: {type(exc).__name__}: {exc}")
            status, answer = 500, {"error": {"code": 500, "message": "twin error", "errors": []}}
        data = json.dumps(answer).encode()
        lost = False
        if method == "POST" and path.endswith("/instances") and status == 200:
            with self.lock:
                lost = self.lose_answers > 0
                self.lose_answers -= lost
        if lost:  # carried out; no answer comes while the caller could still be waiting for it
            self._stop.wait(LOST_ANSWER_S)
            request.close_connection = True
            return
        request.send_response(status)
        request.send_header("Content-Type", "application/json; charset=UTF-8")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _authorized(self, header: str) -> bool:
        from google.auth import exceptions, jwt

        kind, _, token = header.partition(" ")
        if kind != "Bearer" or not token:
            return False
        if token == self.token:
            return True
        try:
            claims = jwt.decode(token, certs=self._public_pem, verify=True)
        except (exceptions.GoogleAuthError, ValueError):
            return False
        return bool(claims.get("iss") == self._email)

    def _token(self, body: bytes) -> dict[str, Any]:
        from urllib.parse import parse_qs

        from google.auth import exceptions, jwt

        form = parse_qs(body.decode())
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"] or not form.get("assertion"):
            raise HttpError(400, "Invalid grant", "invalid_grant")
        try:
            jwt.decode(form["assertion"][0], certs=self._public_pem, verify=True)
        except (exceptions.GoogleAuthError, ValueError):
            raise HttpError(400, "Invalid JWT Signature.", "invalid_grant") from None
        return {"access_token": self.token, "expires_in": 3600, "token_type": "Bearer"}

    def _route(self, method: str, path: str, body: bytes) -> Any:
        prefix = f"/compute/v1/projects/{self.project}"
        if not path.startswith(prefix):
            raise HttpError(404, f"The resource '{path}' was not found", "notFound")
        rest = path[len(prefix):]
        routes: list[tuple[str, str, Any]] = [
            ("GET", r"", self._project),
            ("GET", r"/aggregated/acceleratorTypes", self._accelerators),
            ("GET", r"/aggregated/instances", self._aggregated_instances),
            ("GET", r"/regions/(?P<region>[a-z0-9-]+)", self._region),
            ("POST", r"/zones/(?P<zone>[a-z0-9-]+)/instances", self._insert),
            ("GET", r"/zones/(?P<zone>[a-z0-9-]+)/instances/(?P<name>[a-z0-9-]+)", self._get),
            ("DELETE", r"/zones/(?P<zone>[a-z0-9-]+)/instances/(?P<name>[a-z0-9-]+)", self._delete),
            ("GET", r"/zones/(?P<zone>[a-z0-9-]+)/operations/(?P<name>[a-z0-9-]+)", self._operation),
        ]
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, rest)
            if match and verb == method:
                return handler(body=body, **match.groupdict())
        raise HttpError(404, f"The resource '{path}' was not found", "notFound")

    @staticmethod
    def _json(message: Any) -> Any:
        return json.loads(type(message).to_json(message, use_integers_for_enums=False))

    # -- the API -------------------------------------------------------------------------------

    def _usage(self) -> int:
        return sum(gpu_catalog.GCP[vm.machine_type].gpu_count for vm in self.vms.values()
                   if vm.status != "TERMINATED" and not vm.deleted)

    def _project(self, body: bytes) -> Any:
        from google.cloud import compute_v1 as c

        return self._json(c.Project(name=self.project, quotas=[
            c.Quota(metric="GPUS_ALL_REGIONS", limit=16.0, usage=float(self._usage()))]))

    def _region(self, region: str, body: bytes) -> Any:
        from google.cloud import compute_v1 as c

        metrics = sorted({o.shape.quota_metric for o in self.offers if o.zone.startswith(region + "-")
                          and o.shape.quota_metric})
        if not metrics and not any(o.zone.startswith(region + "-") for o in self.offers):
            raise HttpError(404, f"The resource 'projects/{self.project}/regions/{region}' was not found", "notFound")
        return self._json(c.Region(name=region, status="UP", quotas=[
            c.Quota(metric=m, limit=16.0, usage=float(self._usage())) for m in metrics]))

    def _accelerators(self, body: bytes) -> Any:
        from google.cloud import compute_v1 as c

        by_zone: dict[str, list[Any]] = {}
        for offer in self.offers:
            shape = offer.shape
            by_zone.setdefault(offer.zone, []).append(c.AcceleratorType(
                name=shape.accelerator, zone=offer.zone, maximum_cards_per_instance=8,
                description=f"NVIDIA {shape.gpu}", kind="compute#acceleratorType"))
        listing = c.AcceleratorTypeAggregatedList(items={
            f"zones/{zone}": c.AcceleratorTypesScopedList(accelerator_types=types)
            for zone, types in by_zone.items()})
        return self._json(listing)

    def _offer(self, zone: str, machine_type: str) -> GcpOffer:
        shape = gpu_catalog.GCP.get(machine_type)
        for offer in self.offers:
            if shape is not None and offer.zone == zone and offer.shape.accelerator == shape.accelerator:
                return offer
        raise HttpError(400, f"Invalid value for field 'resource.machineType': 'zones/{zone}/machineTypes/"
                             f"{machine_type}'. Machine type with name '{machine_type}' does not exist in zone "
                             f"'{zone}'.", "invalid")

    def _insert(self, zone: str, body: bytes) -> Any:
        from google.cloud import compute_v1 as c

        try:
            vm = c.Instance.from_json(body.decode())  # the library's type: an unknown field is refused
        except Exception as exc:  # noqa: BLE001 - any parse failure is the API's 400
            raise HttpError(400, f"Invalid JSON payload received. {exc}", "invalid") from None
        if not _NAME.match(vm.name or ""):
            raise HttpError(400, f"Invalid value for field 'resource.name': '{vm.name}'.", "invalid")
        match = re.fullmatch(r"(?:.*/)?zones/([a-z0-9-]+)/machineTypes/([a-z0-9-]+)", vm.machine_type or "")
        if not match or match.group(1) != zone:
            raise HttpError(400, f"Invalid value for field 'resource.machineType': '{vm.machine_type}'.", "invalid")
        offer = self._offer(zone, match.group(2))
        if not any(d.boot for d in vm.disks) or not vm.network_interfaces:
            raise HttpError(400, "An instance needs a boot disk and a network interface.", "invalid")
        for i, disk in enumerate(vm.disks):
            image = disk.initialize_params.source_image if disk.initialize_params else ""
            if image and not _IMAGE.fullmatch(image):  # an image or a family, in a project or this one: nothing else
                raise HttpError(400, f"Invalid value for field 'resource.disks[{i}].initializeParams.sourceImage': "
                                     f"'{image}'. The URL is malformed.", "invalid")
        request_id = (getattr(self._local, "query", None) or {}).get("requestId")
        with self.lock:
            if request_id and request_id in self.request_ids:
                return self.request_ids[request_id]  # done once already: its operation again
            ref = f"{zone}/{vm.name}"
            if ref in self.vms and not self.vms[ref].deleted:
                raise HttpError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{vm.name}' "
                                     "already exists", "alreadyExists")
            self._seq += 1
            taken = sum(1 for v in self.vms.values() if v.offer is offer and v.status != "TERMINATED" and not v.deleted)
            if offer.stock is not None and taken >= offer.stock:
                return self._new_operation(zone, "insert", vm.name, error=(
                    "ZONE_RESOURCE_POOL_EXHAUSTED",
                    f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources available "
                    "to fulfill the request. Try a different zone, or try again later."))
            self.vms[ref] = Vm(zone=zone, name=vm.name, resource=vm, offer=offer, machine_type=match.group(2),
                               id=1000 + self._seq,
                               ready_at=time.monotonic() + self.boot_delay_s)
            operation = self._new_operation(zone, "insert", vm.name)
            if request_id:
                self.request_ids[request_id] = operation
            if self.gateway_errors > 0:
                self.gateway_errors -= 1  # done, but the caller sees the front end's error
                if self.gateway_status == 500:
                    raise HttpError(500, "Internal error. Please try again or contact Google Support.", "backendError")
                raise HttpError(503, "The service is currently unavailable.", "backendError")
            return operation

    def _new_operation(self, zone: str, kind: str, target: str, error: tuple[str, str] | None = None,
                       running: bool = False) -> Any:
        from google.cloud import compute_v1 as c

        self._seq += 1
        name = f"operation-{self._seq}-{secrets.token_hex(4)}"
        base = f"{self.url}/compute/v1/projects/{self.project}/zones/{zone}"
        op = c.Operation(name=name, id=self._seq, status="RUNNING" if running else "DONE", operation_type=kind,
                         progress=0 if running else 100,
                         zone=f"{base}", target_link=f"{base}/instances/{target}",
                         self_link=f"{base}/operations/{name}", kind="compute#operation")
        if error is not None:
            op.http_error_status_code = 503
            op.http_error_message = "SERVICE UNAVAILABLE"
            op.error = c.Error(errors=[c.Errors(code=error[0], message=error[1])])
        self.operations[f"{zone}/{name}"] = op
        return self._json(op)

    def _operation(self, zone: str, name: str, body: bytes) -> Any:
        with self.lock:
            op = self.operations.get(f"{zone}/{name}")
        if op is None:
            raise HttpError(404, f"The resource 'operations/{name}' was not found", "notFound")
        return self._json(op)

    def _vm(self, zone: str, name: str) -> Vm:
        vm = self.vms.get(f"{zone}/{name}")
        if vm is None or vm.deleted:
            raise HttpError(404, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not "
                                 "found", "notFound")
        return vm

    def _aggregated_instances(self, body: bytes) -> Any:
        """Every VM not deleted, by zone (the provider filters by label itself as well)."""
        with self.lock:
            keys = [k for k, vm in self.vms.items() if not vm.deleted]
        items: dict[str, Any] = {}
        for key in keys:
            zone, name = key.split("/", 1)
            items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(self._get(zone, name, b""))
        return {"kind": "compute#instanceAggregatedList", "id": f"projects/{self.project}/aggregated/instances",
                "items": items}

    def _get(self, zone: str, name: str, body: bytes) -> Any:
        from google.cloud import compute_v1 as c

        with self.lock:
            vm = self._vm(zone, name)
            answer = c.Instance(vm.resource)
            answer.id = vm.id
            answer.status = vm.status
            answer.creation_timestamp = vm.created_at
            answer.zone = f"{self.url}/compute/v1/projects/{self.project}/zones/{zone}"
            if vm.status_message:
                answer.status_message = vm.status_message
            for nic in answer.network_interfaces:
                nic.network_i_p = "10.128.0.2"
                for access in nic.access_configs:
                    if vm.status == "RUNNING" and vm.machine is not None:
                        access.nat_i_p = vm.machine.host
            return self._json(answer)

    def _delete(self, zone: str, name: str, body: bytes) -> Any:
        with self.lock:
            vm = self._vm(zone, name)
            self.deletes[vm.ref] = self.deletes.get(vm.ref, 0) + 1
            if self.fail_first_delete and self.deletes[vm.ref] == 1:
                raise HttpError(503, "The service is currently unavailable.", "backendError")
            vm.ended = True
            if vm.machine is not None:
                vm.machine.kill()
            if vm.status != "STOPPING":
                vm.status = "STOPPING"
                vm.gone_at = time.monotonic() + self.delete_delay_s
            # accepted, not done: the operation runs (and the VM is listed, STOPPING) until the
            # deletion is; then the VM is gone from the API (the twin keeps its machine to inspect)
            answer = self._new_operation(zone, "delete", name, running=True)
            vm.delete_operations.append(self.operations[f"{zone}/{answer['name']}"])
            return answer

    # -- booting -----------------------------------------------------------------------------------

    def _boot_loop(self) -> None:
        while not self._stop.wait(0.05):
            now = time.monotonic()
            with self.lock:
                for vm in self.vms.values():
                    if vm.status == "STOPPING" and not vm.deleted and now >= vm.gone_at:
                        vm.deleted, vm.status = True, "TERMINATED"
                        for op in vm.delete_operations:
                            op.status, op.progress = "DONE", 100
                due = [vm for vm in self.vms.values()
                       if vm.machine is None and not vm.ended and not vm.deleted and not vm.errors]
                for vm in due:
                    if vm.status == "PROVISIONING" and now >= vm.ready_at - self.boot_delay_s / 2:
                        vm.status = "STAGING"
            for vm in due:
                if now < vm.ready_at:
                    continue
                try:
                    self._boot(vm)
                except Exception as exc:  # noqa: BLE001 - recorded; the VM stays STAGING, the test sees why
                    vm.errors.append(f"{type(exc).__name__}: {exc}")
                    self.errors.append(f"{vm.ref}: {exc}")

    def _boot(self, vm: Vm) -> None:
        metadata = {item.key: item.value for item in vm.resource.metadata.items}
        config = cloud_config(metadata.get("user-data"))
        keys = list(config.get("ssh_authorized_keys") or [])
        os_login = self.os_login == "required" or (self.os_login == "project"
                                                   and str(metadata.get("enable-oslogin", "")).upper() != "FALSE")
        for line in (metadata.get("ssh-keys") or "").splitlines() if not os_login else []:
            user, _, key = line.partition(":")
            if user.strip() == CLOUD_USER and key.strip():
                keys.append(key.strip())
        # cloud-init's init stage: write_files, then the ssh module's host key
        for entry in config.get("write_files") or []:
            if isinstance(entry, dict) and entry.get("path"):
                vm.files[str(entry["path"])] = str(entry.get("content") or "")
        ssh_keys = config.get("ssh_keys") or {}
        host_key = ((ssh_keys["ed25519_private"], ssh_keys["ed25519_public"])
                    if "ed25519_private" in ssh_keys and "ed25519_public" in ssh_keys else None)
        # then the guest agent, on the VM's first boot: new host keys unless its config says not to
        if _agent_sets_host_keys(vm.files.get(AGENT_CONFIG, "")):
            from jupyter_portable.compute.keys import host_key_pair

            host_key = host_key_pair()
            kind, blob = host_key[1].split()[:2]
            vm.guest_attributes[f"hostkeys/{kind}"] = blob
        images = [d.initialize_params.source_image for d in vm.resource.disks if d.boot]
        offer = vm.offer.machine(vm.machine_type)
        python = self.images.get(images[0] if images else "", offer.python)
        with self.lock:
            if vm.ended:
                return
            vm.machine = start_on_public_address(self.root, vm.name, offer, keys, host_key, python=python,
                                                 shutdown_url=f"{self.url}{POWER_PATH}{vm.zone}/{vm.name}")
            vm.status = "RUNNING"


def _agent_sets_host_keys(config_text: str) -> bool:
    """Whether the guest agent generates host keys on first boot under ``config_text`` (the INI file
    it reads; missing or unreadable: its default, true)."""
    import configparser

    parser = configparser.ConfigParser()
    try:
        parser.read_string(config_text)
        return parser.getboolean("InstanceSetup", "set_host_keys", fallback=True)
    except (configparser.Error, ValueError):
        return True
