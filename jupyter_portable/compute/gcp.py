"""Google Compute Engine as a provider: GPU VMs, on-demand and spot.

Credentials come from Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
``gcloud auth application-default login``, the metadata server) unless a credentials
object is passed; they never appear in a message or a log line. google-cloud-compute is
imported only when a client is first needed. ``JUPYTER_PORTABLE_GCP_ENDPOINT`` (a URL,
``http://`` allowed) replaces ``https://compute.googleapis.com`` for every client, the
way to reach Compute Engine through a proxy or a twin.

SSH: the user's public key goes in the ``ssh-keys`` metadata for ``ssh_user``
(``JUPYTER_PORTABLE_GCP_SSH_USER``, default ``ubuntu``); the VM is reached on its
external IP, port 22 (the network's firewall must let 22 in; the default network's
``default-allow-ssh`` rule does). A launch given ``host_key`` pins the VM's host key
through cloud-init ``user-data`` and turns off the guest agent's own host-key
generation, which would replace it on first boot: the agent runs after cloud-init's init
stage (after network-online, before sshd), so the ``set_host_keys = false`` that stage's
``write_files`` puts in ``/etc/default/instance_configs.cfg`` is read before it acts (the GCP
twin boots in that order; a ``runcmd`` would come too late).

Where the answers come from:

- listed: ``AcceleratorTypesClient.aggregated_list`` (which accelerators each zone has),
  joined with the machine types of :data:`~.gpu_catalog.GCP` and their table prices.
- permitted: the region's GPU quota from ``RegionsClient.get``, then the project's
  ``GPUS_ALL_REGIONS`` from ``ProjectsClient.get`` (0 on a new project, whatever the
  regional quotas say).
- capacity now: Compute Engine cannot say without launching: None.
- launched: ``InstancesClient.insert``, waiting on its zone operation, because Compute
  Engine reports an exhausted zone only through the operation. The insert carries a
  ``requestId`` made from the allocation id (the same insert sent again is done once), and one
  answered by a 5xx or a timeout is looked up by the VM's name (made from the allocation id)
  before anything else: the VM it made is the allocation.
- released: ``InstancesClient.delete``, tried again on a 5xx, a rate limit or a lost answer
  until Compute Engine accepts it (or says the VM is gone); then an error says the VM may still
  be running and names it.

google-api-core errors are translated at this boundary (see ``_translate``); the codes
are read from the error items of a failed operation or of an HTTP error body::

    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS],
    "does not have enough resources available"          -> NoCapacity
    QUOTA_EXCEEDED / quotaExceeded                       -> QuotaExceeded
    401, 403 (PermissionDenied, Unauthenticated),
    missing or unusable credentials                      -> AuthError
    ServiceUnavailable, DeadlineExceeded, 429, 5xx,
    rate limits, connection errors                       -> ProviderUnavailable
    anything else during a launch                        -> LaunchFailed
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from typing import Any

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.base import (
    Allocation,
    AllocationStatus,
    MachineInfo,
    Provider,
    SshEndpoint,
    delete_until_confirmed,
    spend_since,
)
from jupyter_portable.compute.boundary import Boundary
from jupyter_portable.compute.cloudinit import HostKey, check_host_key, cloud_config, parse_zone_offer_id
from jupyter_portable.compute.config import GCP_IMAGE, PortableGcp
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    ProviderUnavailable,
    QuotaExceeded,
    UsageError,
)
from jupyter_portable.core.offers import Offer, Requirements

# A Deep Learning VM image family (Ubuntu, CUDA, NVIDIA driver); check the current families
# with `gcloud compute images list --project deeplearning-platform-release`.
DLVM_IMAGE = GCP_IMAGE
ALLOCATION_LABEL = "jupyter-portable-allocation"
WORKSPACE_LABEL = "jupyter-portable-workspace"
# Google's guest agent regenerates host keys on a new instance unless told not to.
_GUEST_AGENT_CONFIG = {"path": "/etc/default/instance_configs.cfg", "permissions": "0644",
                       "content": "[InstanceSetup]\nset_host_keys = false\n"}
# The project-wide cap on GPUs across every region; a VM needs room under it as well.
ALL_REGIONS_METRIC = "GPUS_ALL_REGIONS"

_NO_CAPACITY = {"ZONERESOURCEPOOLEXHAUSTED", "ZONERESOURCEPOOLEXHAUSTEDWITHDETAILS"}
_NO_CAPACITY_TEXT = "does not have enough resources available"
_QUOTA = {"QUOTAEXCEEDED"}
_RATE = {"RATELIMITEXCEEDED", "USERRATELIMITEXCEEDED"}
_PENDING = {"PROVISIONING", "STAGING", "PENDING", "REPAIRING"}
_STOPPING = {"STOPPING", "PENDING_STOP", "DEPROVISIONING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"}


class GcpProvider(Provider):
    """GPU VMs on Compute Engine in one project.

    ``project`` defaults to ``GOOGLE_CLOUD_PROJECT`` or the credentials' own project;
    ``zones`` limits the zones offered (default: every zone that lists the accelerator).
    ``credentials`` is a google-auth credentials object (default: ADC). The four clients
    can be injected ready-made (tests build them on a fake transport). ``network`` must let
    port 22 in, as every worker is reached over SSH. Spot VMs are created with the STOP
    termination action so that a preempted VM stays visible as "lost" until terminated.
    """

    name = "gcp"
    accepts_host_key = True  # launch(host_key=...) pins the VM's host key through user-data
    # what a refused SSH login to one of its VMs most likely means (acquire adds it to the reason)
    login_refused_hint = ("Google Cloud: the key travels in the VM's ssh-keys metadata with enable-oslogin=FALSE; "
                          "a project whose organization policy requires OS Login "
                          "(constraints/compute.requireOsLogin) ignores both, so no metadata key logs in. "
                          "Use a project without that policy, or ask its admin for an exception")

    def __init__(self, *, project: str | None = None, zones: Sequence[str] = (), credentials: Any = None,
                 image: str = DLVM_IMAGE, network: str = "global/networks/default", subnetwork: str | None = None,
                 disk_gb: int = 200, ssh_user: str | None = None, spot: bool = True, operation_timeout: float = 120.0,
                 endpoint: str | None = None,
                 instances_client: Any = None, regions_client: Any = None, accelerator_types_client: Any = None,
                 projects_client: Any = None, shapes: Mapping[str, gpu_catalog.MachineShape] | None = None,
                 now: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 sleep: Callable[[float], None] = time.sleep, terminate_attempts: int = 20,
                 operation_poll_s: float = 0.5, request_timeout: float = 60.0) -> None:
        self.now = now  # the wall clock spend so far is counted to
        self.sleep = sleep  # between tries of a delete (passed in so that tests do not wait)
        self.terminate_attempts = max(1, terminate_attempts)
        # what is not given comes from the environment or the default (compute.config)
        given = {"project": project or None, "ssh_user": ssh_user or None, "endpoint": endpoint or None}
        settings = PortableGcp(**{k: v for k, v in given.items() if v is not None})
        self._project = settings.project or None
        self.zones = tuple(zones)
        self._credentials = credentials
        self.image = image
        self.network = network
        self.subnetwork = subnetwork
        self.disk_gb = disk_gb
        self.ssh_user = settings.ssh_user
        self.endpoint = settings.endpoint or None
        self.spot = spot
        self.operation_timeout = operation_timeout
        self.operation_poll_s = operation_poll_s  # the first wait before an operation is asked again
        # how long an insert's or a delete's answer is waited for (the library's default is 600 s);
        # one that does not come is a lost answer: the insert is looked up by name, the delete sent again
        self.request_timeout = request_timeout
        self._clients: dict[str, Any] = {"instances": instances_client, "regions": regions_client,
                                         "accelerator_types": accelerator_types_client,
                                         "projects": projects_client}
        self.shapes = dict(shapes if shapes is not None else gpu_catalog.GCP)

    # -- plumbing ---------------------------------------------------------------------

    def _client(self, kind: str) -> Any:
        if self._clients[kind] is None:
            with gce_boundary("connect"):
                from google.cloud import compute_v1

                cls = {"instances": compute_v1.InstancesClient, "regions": compute_v1.RegionsClient,
                       "accelerator_types": compute_v1.AcceleratorTypesClient,
                       "projects": compute_v1.ProjectsClient}[kind]
                options = {"api_endpoint": self.endpoint} if self.endpoint else None
                client: Any = cls(credentials=self._credentials, client_options=options)
                services = getattr(getattr(client, "_transport", None), "_extended_operations_services", None)
                if options and isinstance(services, dict):
                    # the client follows its operations with a zoneOperations client it makes on
                    # the default endpoint: the configured one must answer those too
                    services["zone_operations"] = compute_v1.ZoneOperationsClient(
                        credentials=self._credentials, client_options=options)
                self._clients[kind] = client
        return self._clients[kind]

    @property
    def project(self) -> str:
        """The project: as configured, else the one Application Default Credentials name."""
        if not self._project:
            with gce_boundary("find the project"):
                import google.auth

                _, self._project = google.auth.default()
            if not self._project:
                raise AuthError("gcp: no Google Cloud project configured", provider=self.name,
                                hint="set GOOGLE_CLOUD_PROJECT or pass project= to GcpProvider")
        return self._project

    # -- check 1: listed --------------------------------------------------------------

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """For each zone listing a table machine type's accelerator (with enough cards per
        instance), an on-demand offer and a spot offer, both at table prices."""
        req = requirements or Requirements()
        by_accelerator: dict[str, list[gpu_catalog.MachineShape]] = {}
        for shape in gpu_catalog.shapes_for(self.shapes, req.gpus, req.gpu_count, req.min_gpu_memory_gb):
            if shape.accelerator:
                by_accelerator.setdefault(shape.accelerator, []).append(shape)
        if not by_accelerator:
            return []
        out: list[Offer] = []
        with gce_boundary("list offers"):
            listing = self._client("accelerator_types").aggregated_list(request={"project": self.project})
            for scope, scoped in listing:
                zone = scope.rpartition("/")[2]
                region = zone.rpartition("-")[0]
                if (self.zones and zone not in self.zones) or (req.regions and region not in req.regions):
                    continue
                for accelerator in scoped.accelerator_types:
                    for shape in by_accelerator.get(accelerator.name, []):
                        most = accelerator.maximum_cards_per_instance
                        if most and shape.gpu_count > most:
                            continue
                        out.extend(self._offers_for(shape, zone, region))
        return sorted(out, key=lambda o: o.id)

    def _offers_for(self, shape: gpu_catalog.MachineShape, zone: str, region: str) -> list[Offer]:
        common: dict[str, Any] = dict(provider=self.name, gpu=shape.gpu, gpu_count=shape.gpu_count,
                      gpu_memory_gb=shape.gpu_memory_gb, region=region)
        extra = {"machine_type": shape.machine, "zone": zone, "accelerator": shape.accelerator,
                 "price_source": gpu_catalog.PRICES_AS_OF}
        out = [Offer(id=f"{shape.machine}@{zone}", price_per_hour=shape.price_per_hour,
                     extra={**extra, "market": "on-demand"}, **common)]
        if self.spot and shape.spot_price_per_hour is not None:
            out.append(Offer(id=f"{shape.machine}@{zone}:spot", price_per_hour=shape.spot_price_per_hour, spot=True,
                             reliability=gpu_catalog.SPOT_RELIABILITY, extra={**extra, "market": "spot"}, **common))
        return out

    # -- check 2: permitted -----------------------------------------------------------

    def check_permission(self, offer: Offer) -> None:
        """The region's GPU quota (limit minus usage) must cover the offer's GPUs, and so must
        the project's GPUS_ALL_REGIONS. Spot VMs use the PREEMPTIBLE_ regional quota where the
        project has one, else the standard one. Quota does not guarantee supply: a zone can
        still be exhausted at launch."""
        machine, zone, spot = parse_zone_offer_id(offer.id, "GCP")
        shape = self._shape(machine)
        region = zone.rpartition("-")[0]
        metric = shape.quota_metric or ""
        with gce_boundary("read quota", offer.id):
            quotas = {q.metric: q for q in self._client("regions").get(project=self.project, region=region).quotas}
        preemptible = quotas.get(f"PREEMPTIBLE_{metric}")
        if spot and preemptible is not None and preemptible.limit > 0:
            metric = f"PREEMPTIBLE_{metric}"
        quota = quotas.get(metric)
        free = quota.limit - quota.usage if quota is not None else 0.0
        if free < shape.gpu_count:
            listed = f"limit {quota.limit:g}, in use {quota.usage:g}" if quota is not None else "not in the project"
            raise QuotaExceeded(f"gcp: {metric} in {region}: {free:g} free ({listed}), {shape.gpu_count} needed",
                                provider=self.name, offer=offer.id,
                                hint=f"request more {metric} quota for {region} (IAM & Admin > Quotas), "
                                     "or pick another region")
        self._check_all_regions(offer, shape.gpu_count)

    def _check_all_regions(self, offer: Offer, needed: int) -> None:
        """GPUS_ALL_REGIONS, a project quota: no region helps when it is used up (or still 0)."""
        with gce_boundary("read project quota", offer.id):
            quotas = {q.metric: q for q in self._client("projects").get(project=self.project).quotas}
        quota = quotas.get(ALL_REGIONS_METRIC)
        if quota is None:
            return  # the project lists no such cap: nothing to check against
        free = quota.limit - quota.usage
        if free < needed:
            raise QuotaExceeded(f"gcp: {ALL_REGIONS_METRIC} (project {self.project}): {free:g} free "
                                f"(limit {quota.limit:g}, in use {quota.usage:g}), {needed} needed",
                                provider=self.name, offer=offer.id, metric=ALL_REGIONS_METRIC,
                                hint=f"request more {ALL_REGIONS_METRIC} quota for the project (IAM & Admin > "
                                     "Quotas; it is 0 on new projects): another region does not help")

    # -- check 3: capacity now --------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """None: Compute Engine tells whether a zone has the GPUs only when a VM is created."""
        return None

    # -- check 4: launched ------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None,
               host_key: HostKey | None = None) -> Allocation:
        """``instances.insert`` and wait (up to ``operation_timeout``) on its operation. The
        key goes in the ``ssh-keys`` metadata for ``ssh_user``; ``env`` as cloud-init
        user data writing ``/etc/jupyter-portable/env`` (mode 0600), ``host_key`` as the
        VM's host key. Labelled with the allocation (and workspace) id."""
        from google.cloud import compute_v1 as c

        if host_key is not None:
            host_key = check_host_key(host_key)
        machine, zone, spot = parse_zone_offer_id(offer.id, "GCP")
        shape = self._shape(machine)
        name = instance_name(allocation_id)
        items = [c.Items(key=ALLOCATION_LABEL, value=allocation_id),
                 # Deep Learning VM images install the NVIDIA driver on first boot when asked.
                 c.Items(key="install-nvidia-driver", value="True")]
        if ssh_public_key:
            items.append(c.Items(key="ssh-keys", value=f"{self.ssh_user}:{ssh_public_key.strip()}"))
            # the key in metadata counts only without OS Login: the VM's own metadata turns it off over a
            # project's enable-oslogin=TRUE (an organization policy that requires OS Login still wins)
            items.append(c.Items(key="enable-oslogin", value="FALSE"))
        user_data = cloud_config(None, env, host_key=host_key,
                                 files=[_GUEST_AGENT_CONFIG] if host_key is not None else [])
        if user_data:
            items.append(c.Items(key="user-data", value=user_data))
        nic = c.NetworkInterface(network=self.network,
                                 access_configs=[c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])
        if self.subnetwork:
            nic.subnetwork = self.subnetwork
        # GPU VMs cannot live-migrate: host maintenance must stop them.
        scheduling = c.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=not spot,
                                  provisioning_model="SPOT" if spot else "STANDARD")
        if spot:
            scheduling.instance_termination_action = "STOP"
        instance = c.Instance(
            name=name, machine_type=f"zones/{zone}/machineTypes/{machine}",
            disks=[c.AttachedDisk(boot=True, auto_delete=True, initialize_params=c.AttachedDiskInitializeParams(
                source_image=image or self.image, disk_size_gb=self.disk_gb))],
            network_interfaces=[nic], metadata=c.Metadata(items=items), scheduling=scheduling,
            labels={ALLOCATION_LABEL: _label_value(allocation_id)})
        workspace = (env or {}).get("JUPYTER_PORTABLE_WORKSPACE_ID")
        if workspace:
            instance.labels[WORKSPACE_LABEL] = _label_value(workspace)
        if shape.attach:
            # N1 machines take their GPUs as attached accelerators; A2, A3 and G2 come with theirs.
            instance.guest_accelerators = [c.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{shape.accelerator}",
                accelerator_count=shape.gpu_count)]
        try:
            with gce_boundary("launch", offer.id, default=LaunchFailed):
                operation = self._client("instances").insert(request=c.InsertInstanceRequest(
                    project=self.project, zone=zone, instance_resource=instance,
                    request_id=request_id(allocation_id)), timeout=self.request_timeout)
                try:
                    operation.result(timeout=self.operation_timeout)
                except (FutureTimeout, TimeoutError):
                    pass  # accepted and still going: status() follows it from here
        except ProviderUnavailable as exc:
            # a 5xx or a lost answer: the insert may have been carried out; its VM is the allocation
            if not self._made(zone, name, exc):
                raise
        details: dict[str, Any] = {"project": self.project, "zone": zone, "machine_type": machine,
                                   "market": "spot" if spot else "on-demand"}
        if host_key is not None:
            details["host_key"] = host_key[1]  # the public half only: the private one is in the user-data alone
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=f"{zone}/{name}",
                          started=datetime.now(timezone.utc).isoformat(), details=details)

    def _made(self, zone: str, name: str, exc: ComputeError) -> bool:
        """Whether the VM ``name`` exists after an insert whose answer was a 5xx or never came."""
        from google.api_core.exceptions import NotFound

        try:
            with gce_boundary("look the launch up"):
                try:
                    self._client("instances").get(project=self.project, zone=zone, instance=name)
                except NotFound:
                    return False
        except ComputeError as again:
            exc.args = (f"{exc}; looking the launch up by its name failed too ({again}): VM {zone}/{name} "
                        "may be running",)
            exc.context.update(may_be_running=True, machine=f"{zone}/{name}")
            raise exc from again
        return True

    def _shape(self, machine: str) -> gpu_catalog.MachineShape:
        try:
            return self.shapes[machine]
        except KeyError:
            raise UsageError(f"gcp: {machine} is not in the machine type table") from None

    # -- afterwards -------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """From ``instances.get``: "reachable" once RUNNING with an external IP; "lost" when
        a spot VM was stopped, which only preemption does (nothing here stops VMs). A spot
        VM that :meth:`terminate` is deleting also reads "lost" until it is gone."""
        from google.api_core.exceptions import NotFound

        zone, name = _parse_ref(allocation.ref)
        with gce_boundary("status", allocation.offer_id):
            try:
                instance = self._client("instances").get(project=self.project, zone=zone, instance=name)
            except NotFound:
                return AllocationStatus("terminated", reason=f"instance {name} no longer exists")
        st = self._state(instance)
        machine = instance.machine_type.rsplit("/", 1)[-1]
        _, st.spend = self._spend(machine, instance.scheduling.provisioning_model == "SPOT",
                                  instance.creation_timestamp or allocation.started)
        st.spend_source = "estimate" if st.spend is not None else None
        return st

    def _state(self, instance: Any) -> AllocationStatus:
        state = instance.status
        note = instance.status_message or None
        if state in _PENDING:
            return AllocationStatus("pending", reason=note)
        if state == "RUNNING":
            ip = next((a.nat_i_p for n in instance.network_interfaces for a in n.access_configs if a.nat_i_p), "")
            if ip:
                return AllocationStatus("reachable", ssh=SshEndpoint(host=ip, port=22, user=self.ssh_user))
            return AllocationStatus("running", reason="no external IP address yet")
        if state in _STOPPING:
            if instance.scheduling.provisioning_model == "SPOT":
                reason = "Compute Engine preempted the spot VM" + (f": {note}" if note else "")
                return AllocationStatus("lost", reason=reason)
            return AllocationStatus("stopped", reason=note)
        return AllocationStatus("lost", reason=f"unexpected instance status {state}")

    def _spend(self, machine_type: str, spot: bool, started: object) -> tuple[float | None, float | None]:
        """``(uptime s, dollars)`` at the machine type's table price (``gpu_catalog.PRICES_AS_OF``:
        an estimate, Compute Engine's API gives no running cost)."""
        shape = self.shapes.get(machine_type)
        price = None if shape is None else (shape.spot_price_per_hour if spot else shape.price_per_hour)
        return spend_since(price, started, self.now())

    def list_machines(self) -> list[MachineInfo]:
        """``instances.aggregatedList`` filtered on our allocation label, every zone of the project;
        spend is the dated table's price x time since ``creationTimestamp`` (an estimate)."""
        out = []
        with gce_boundary("list machines"):
            pages = self._client("instances").aggregated_list(
                request={"project": self.project, "filter": f"labels.{ALLOCATION_LABEL}:*"})
            for _zone, scoped in pages:
                for inst in scoped.instances:
                    labels = dict(inst.labels)
                    aid = labels.get(ALLOCATION_LABEL)
                    if not aid:
                        continue
                    zone = inst.zone.rsplit("/", 1)[-1]
                    machine = inst.machine_type.rsplit("/", 1)[-1]
                    spot = inst.scheduling.provisioning_model == "SPOT"
                    uptime, spend = self._spend(machine, spot, inst.creation_timestamp or None)
                    shape = self.shapes.get(machine)
                    state = ("pending" if inst.status in _PENDING else "running" if inst.status == "RUNNING"
                             else "stopped" if inst.status in _STOPPING else "terminated")
                    out.append(MachineInfo(
                        provider=self.name, ref=f"{zone}/{inst.name}", allocation_id=aid,
                        workspace_id=labels.get(WORKSPACE_LABEL), state=state, name=inst.name,
                        started=inst.creation_timestamp or None, uptime_s=uptime,
                        price_per_hour=None if shape is None else
                        (shape.spot_price_per_hour if spot else shape.price_per_hour),
                        spend=spend, spend_source="estimate" if spend is not None else None,
                        details={"status": inst.status, "price_source": gpu_catalog.PRICES_AS_OF}))
        return out

    def terminate(self, allocation: Allocation) -> None:
        """``instances.delete``, and a wait (up to ``operation_timeout``) on its zone operation:
        accepted is not done, and the VM (its GPUs billed) runs until the operation is. A delete
        that is refused, ends in an error or does not finish in time is tried again (up to
        ``terminate_attempts``, waits growing to 30 s); a VM that is already gone is fine.
        Unconfirmed, the error says the VM may still be running and names it."""
        from google.api_core.exceptions import NotFound
        from google.api_core.future.polling import DEFAULT_POLLING

        zone, name = _parse_ref(allocation.ref)
        polling = DEFAULT_POLLING.with_delay(initial=self.operation_poll_s, maximum=10.0)

        def delete() -> None:
            with gce_boundary("terminate", allocation.offer_id):
                try:
                    operation = self._client("instances").delete(project=self.project, zone=zone, instance=name,
                                                                 timeout=self.request_timeout)
                except NotFound:
                    return
                try:
                    operation.result(timeout=self.operation_timeout, polling=polling)
                except (FutureTimeout, TimeoutError) as exc:
                    raise ProviderUnavailable(
                        f"Compute Engine accepted deleting VM {name} but had not done it after "
                        f"{self.operation_timeout:.0f} s", provider=self.name, offer=allocation.offer_id) from exc

        delete_until_confirmed(delete, attempts=self.terminate_attempts, sleep=self.sleep,
                               machine=f"gcp VM {allocation.ref}", ref=allocation.ref,
                               allocation_id=allocation.allocation_id, verb="deleting",
                               hint=f"delete VM {name} in zone {zone} in the Cloud console, or try again later")


# -- helpers ------------------------------------------------------------------------------

def request_id(allocation_id: str) -> str:
    """The insert's ``requestId`` for an allocation: a UUID of the allocation id, so the same
    insert sent again is done once (Compute Engine keeps request ids for at least 60 minutes)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"jupyter-portable:allocation:{allocation_id}"))


def instance_name(allocation_id: str) -> str:
    """A valid, stable Compute Engine name for an allocation: ``jp-<readable>-<hash>``."""
    readable = re.sub(r"[^a-z0-9-]+", "-", allocation_id.lower()).strip("-")[:48].strip("-")
    digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:8]
    return f"jp-{readable}-{digest}" if readable else f"jp-{digest}"


def _label_value(allocation_id: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", allocation_id.lower())[:63]




def _parse_ref(ref: str) -> tuple[str, str]:
    zone, _, name = ref.partition("/")
    if not zone or not name:
        raise UsageError(f"not a GCP allocation ref: {ref!r} (expected ZONE/NAME)")
    return zone, name


def _norm(code: object) -> str:
    """``ZONE_RESOURCE_POOL_EXHAUSTED`` and ``quotaExceeded`` styles compare equal."""
    return re.sub(r"[^A-Z0-9]", "", str(code).upper())


def _items(exc: Exception) -> list[tuple[str, str]]:
    """(code, message) of each error item: compute ``Errors`` from a failed operation, or
    the ``{"reason", "message"}`` dicts of an HTTP error body."""
    out = []
    for item in getattr(exc, "errors", None) or ():
        if isinstance(item, Mapping):
            out.append((str(item.get("reason") or item.get("code") or ""), str(item.get("message") or "")))
        else:
            out.append((str(getattr(item, "code", "") or ""), str(getattr(item, "message", "") or "")))
    reason = getattr(exc, "reason", None)
    if reason:
        out.append((str(reason), ""))
    return out


def _translate(exc: Exception, *, what: str, offer: str | None, default: type[ComputeError]) -> ComputeError:
    """One google-api-core / google-auth / transport error -> one error of this package."""
    from google.api_core import exceptions as g
    from google.auth import exceptions as ga
    from requests.exceptions import RequestException

    ctx: dict[str, Any] = {"provider": "gcp", "offer": offer}
    items = _items(exc)
    codes = {_norm(code) for code, _ in items if code}
    detail = "; ".join(f"{code}: {message}" if message else code for code, message in items if code or message)
    text = f"gcp {what}: {detail or getattr(exc, 'message', None) or exc}"
    if codes & _NO_CAPACITY or _NO_CAPACITY_TEXT in text:
        return NoCapacity(text, hint="try another zone or route, or try again later", **ctx)
    if codes & _QUOTA:
        return QuotaExceeded(text, **ctx)
    if codes & _RATE or isinstance(exc, (g.ServiceUnavailable, g.DeadlineExceeded, g.TooManyRequests,
                                         g.ServerError, g.RetryError)):
        return ProviderUnavailable(text, hint="try again in a minute", **ctx)
    if isinstance(exc, (ga.TransportError, RequestException)):
        return ProviderUnavailable(f"gcp {what}: could not reach Compute Engine: {type(exc).__name__}",
                                   hint="check the network and try again", **ctx)
    if isinstance(exc, (g.Unauthorized, g.Forbidden)):
        return AuthError(text, hint="check that the credentials' account has the Compute Instance Admin role "
                                    "in the project", **ctx)
    if isinstance(exc, ga.GoogleAuthError):
        return AuthError(f"gcp {what}: no usable Google Cloud credentials ({type(exc).__name__})", **ctx,
                         hint="run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS")
    return default(text, **ctx)


def _library_errors() -> tuple[type[Exception], ...]:
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from requests.exceptions import RequestException

    return GoogleAPIError, GoogleAuthError, RequestException


# every google-api-core, google-auth and transport error raised inside becomes one of ours
gce_boundary = Boundary(_library_errors, _translate)
