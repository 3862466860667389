"""The GCP provider against the real google-cloud-compute clients on a fake transport.

Each client is built the library's own way, ``InstancesClient(transport=...)``, with a
transport subclass whose RPCs answer real ``compute_v1`` messages (or raise what the REST
transport raises for an HTTP error body). Everything above the transport is the library's
own code: request building, pagers, and the extended operation that polls the zone
operation and raises on its error. No network.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from google.api_core import exceptions as gexc
from google.api_core import gapic_v1
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1 as c
from google.cloud.compute_v1.services.accelerator_types.transports.base import AcceleratorTypesTransport
from google.cloud.compute_v1.services.instances.transports.base import InstancesTransport
from google.cloud.compute_v1.services.projects.transports.base import ProjectsTransport
from google.cloud.compute_v1.services.regions.transports.base import RegionsTransport
from google.cloud.compute_v1.services.zone_operations.transports.base import ZoneOperationsTransport

from jupyter_portable.compute.base import Allocation
from jupyter_portable.compute.gcp import ALLOCATION_LABEL, GcpProvider, instance_name
from jupyter_portable.core.errors import AuthError, LaunchFailed, NoCapacity, ProviderUnavailable, QuotaExceeded
from jupyter_portable.core.offers import Offer, Requirements

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests worker@test"


class Rpc:
    """One RPC of a fake transport: answers queued replies in order and records requests."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.requests: list[Any] = []
        self.default: Any = None  # answered when no reply is queued (None: such a call is unexpected)

    def __call__(self, request: Any, **_: Any) -> Any:
        self.requests.append(request)
        if not self.replies and self.default is not None:
            return self.default
        assert self.replies, f"unexpected call: {type(request).__name__}"
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def fake_transport(base: type, *rpcs: str, **properties: Any) -> Any:
    """A subclass of the library's abstract transport ``base`` serving ``rpcs``."""

    class Fake(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(credentials=AnonymousCredentials())
            self.rpcs = {name: Rpc() for name in rpcs}
            # The client looks each RPC up here, as it does for the real transports.
            self._wrapped_methods = {rpc: gapic_v1.method.wrap_method(rpc) for rpc in self.rpcs.values()}

        @property
        def kind(self) -> str:
            return "fake"

        def close(self) -> None:
            pass

    for name in rpcs:
        setattr(Fake, name, property(lambda self, name=name: self.rpcs[name]))
    for name, value in properties.items():
        setattr(Fake, name, property(lambda self, value=value: value))
    return Fake()


def http_error(status: int, message: str, reason: str) -> gexc.GoogleAPICallError:
    """What the REST transport raises for an HTTP error body from Compute Engine."""
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps({"error": {"code": status, "message": message, "errors": [
        {"message": message, "domain": "global", "reason": reason}]}}).encode()
    response.request = requests.Request(
        "POST", "https://compute.googleapis.com/compute/v1/projects/p/zones/us-central1-a/instances").prepare()
    return gexc.from_http_response(response)


@dataclass
class Gce:
    provider: GcpProvider
    instances: Any
    operations: Any
    regions: Any
    accelerators: Any
    projects: Any

    def rpc(self, transport: Any, name: str) -> Rpc:
        return transport.rpcs[name]


@pytest.fixture
def gce() -> Iterator[Gce]:
    operations = fake_transport(ZoneOperationsTransport, "get")
    instances = fake_transport(InstancesTransport, "insert", "get", "delete",
                               _zone_operations_client=c.ZoneOperationsClient(transport=operations))
    regions = fake_transport(RegionsTransport, "get")
    accelerators = fake_transport(AcceleratorTypesTransport, "aggregated_list")
    projects = fake_transport(ProjectsTransport, "get")
    # a project whose GPUS_ALL_REGIONS has room, unless a test queues another answer
    projects.rpcs["get"].default = project(("GPUS_ALL_REGIONS", 16, 0))
    provider = GcpProvider(project="demo-project", instances_client=c.InstancesClient(transport=instances),
                           regions_client=c.RegionsClient(transport=regions),
                           accelerator_types_client=c.AcceleratorTypesClient(transport=accelerators),
                           projects_client=c.ProjectsClient(transport=projects))
    yield Gce(provider, instances, operations, regions, accelerators, projects)
    for transport in (instances, operations, regions, accelerators, projects):
        for name, rpc in transport.rpcs.items():
            assert not rpc.replies, f"{name}: replies left unused"


def offer(offer_id: str = "a2-highgpu-1g@us-central1-a") -> Offer:
    return Offer(provider="gcp", id=offer_id, gpu="A100", gpu_count=1, gpu_memory_gb=40, price_per_hour=3.67,
                 region="us-central1", spot=offer_id.endswith(":spot"))


def allocation(ref: str = "us-central1-a/jp-alloc-1-0000") -> Allocation:
    return Allocation(allocation_id="alloc-1", provider="gcp", offer_id="a2-highgpu-1g@us-central1-a", ref=ref,
                      started="2026-11-20T10:00:00+00:00")


# -- listed ---------------------------------------------------------------------------

def accelerators(*types: tuple[str, int]) -> c.AcceleratorTypesScopedList:
    return c.AcceleratorTypesScopedList(accelerator_types=[
        c.AcceleratorType(name=name, maximum_cards_per_instance=most) for name, most in types])


def test_offers_join_zone_accelerators_with_the_machine_table(gce: Gce) -> None:
    gce.accelerators.rpcs["aggregated_list"].replies.append(c.AcceleratorTypeAggregatedList(items={
        "zones/us-central1-a": accelerators(("nvidia-l4", 8), ("nvidia-tesla-a100", 4), ("nvidia-tesla-p100", 4)),
        "zones/europe-west4-b": accelerators(("nvidia-h100-80gb", 8)),
        "zones/us-east1-c": c.AcceleratorTypesScopedList(warning=c.Warning(code="NO_RESULTS_ON_PAGE")),
    }))

    offers = {o.id: o for o in gce.provider.offers()}

    request = gce.accelerators.rpcs["aggregated_list"].requests[0]
    assert request.project == "demo-project"
    assert "a2-highgpu-1g@us-central1-a" in offers and "a2-highgpu-1g@us-central1-a:spot" in offers
    assert "a2-highgpu-8g@us-central1-a" not in offers  # 8 cards, the zone allows 4 per instance
    assert {o.split("@")[0] for o in offers} == {"g2-standard-4", "g2-standard-8", "g2-standard-24",
                                                 "a2-highgpu-1g", "a3-highgpu-8g"}
    h100 = offers["a3-highgpu-8g@europe-west4-b"]
    assert (h100.gpu, h100.gpu_count, h100.gpu_memory_gb, h100.region) == ("H100", 8, 80, "europe-west4")
    assert h100.capacity is None and h100.extra["zone"] == "europe-west4-b"
    spot = offers["g2-standard-4@us-central1-a:spot"]
    assert spot.spot and spot.price_per_hour < offers["g2-standard-4@us-central1-a"].price_per_hour


def test_offers_narrow_by_requirements(gce: Gce) -> None:
    gce.accelerators.rpcs["aggregated_list"].replies.append(c.AcceleratorTypeAggregatedList(items={
        "zones/us-central1-a": accelerators(("nvidia-l4", 8), ("nvidia-tesla-a100", 16)),
        "zones/europe-west4-b": accelerators(("nvidia-tesla-a100", 16)),
    }))
    offers = gce.provider.offers(Requirements(gpus=("A100",), gpu_count=8, regions=("europe-west4",)))
    assert [o.id for o in offers] == ["a2-highgpu-8g@europe-west4-b", "a2-highgpu-8g@europe-west4-b:spot"]


# -- permitted ------------------------------------------------------------------------

def region(*quotas: tuple[str, float, float]) -> c.Region:
    return c.Region(name="us-central1", quotas=[c.Quota(metric=m, limit=limit, usage=usage)
                                                for m, limit, usage in quotas])


def test_quota_that_covers_the_gpus_is_permitted(gce: Gce) -> None:
    gce.regions.rpcs["get"].replies.append(region(("CPUS", 24, 4), ("NVIDIA_A100_GPUS", 8, 2),
                                                  ("PREEMPTIBLE_NVIDIA_A100_GPUS", 0, 0)))
    assert gce.provider.check_permission(offer()) is None
    request = gce.regions.rpcs["get"].requests[0]
    assert (request.project, request.region) == ("demo-project", "us-central1")


def test_quota_short_of_the_gpus_is_quota_exceeded(gce: Gce) -> None:
    gce.regions.rpcs["get"].replies.append(region(("NVIDIA_A100_GPUS", 8, 4)))
    with pytest.raises(QuotaExceeded) as err:
        gce.provider.check_permission(offer("a2-highgpu-8g@us-central1-a"))
    assert "NVIDIA_A100_GPUS" in str(err.value) and "4 free" in str(err.value)
    assert "us-central1" in (err.value.hint or "")


def test_spot_uses_preemptible_quota_where_there_is_some(gce: Gce) -> None:
    gce.regions.rpcs["get"].replies.append(region(("NVIDIA_L4_GPUS", 0, 0), ("PREEMPTIBLE_NVIDIA_L4_GPUS", 4, 0)))
    gce.regions.rpcs["get"].replies.append(region(("NVIDIA_L4_GPUS", 0, 0), ("PREEMPTIBLE_NVIDIA_L4_GPUS", 4, 0)))
    assert gce.provider.check_permission(offer("g2-standard-4@us-central1-a:spot")) is None
    with pytest.raises(QuotaExceeded):
        gce.provider.check_permission(offer("g2-standard-4@us-central1-a"))


def project(*quotas: tuple[str, float, float]) -> c.Project:
    return c.Project(name="demo-project", quotas=[c.Quota(metric=m, limit=limit, usage=usage)
                                                  for m, limit, usage in quotas])


def test_a_new_projects_zero_gpus_all_regions_is_quota_exceeded_despite_regional_quota(gce: Gce) -> None:
    gce.regions.rpcs["get"].replies.append(region(("NVIDIA_A100_GPUS", 8, 0)))
    gce.projects.rpcs["get"].replies.append(project(("CPUS_ALL_REGIONS", 32, 0), ("GPUS_ALL_REGIONS", 0, 0)))
    with pytest.raises(QuotaExceeded) as err:
        gce.provider.check_permission(offer())
    assert "GPUS_ALL_REGIONS" in str(err.value) and "0 free" in str(err.value)
    assert "GPUS_ALL_REGIONS" in (err.value.hint or "") and err.value.offer == offer().id
    assert gce.projects.rpcs["get"].requests[0].project == "demo-project"


def test_gpus_all_regions_in_use_elsewhere_is_quota_exceeded_for_spot_too(gce: Gce) -> None:
    gce.regions.rpcs["get"].replies.append(region(("NVIDIA_L4_GPUS", 8, 0), ("PREEMPTIBLE_NVIDIA_L4_GPUS", 8, 0)))
    gce.projects.rpcs["get"].replies.append(project(("GPUS_ALL_REGIONS", 4, 4)))
    with pytest.raises(QuotaExceeded, match="GPUS_ALL_REGIONS"):
        gce.provider.check_permission(offer("g2-standard-4@us-central1-a:spot"))


def test_gpus_all_regions_with_room_or_not_listed_is_permitted(gce: Gce) -> None:
    for answer in (project(("GPUS_ALL_REGIONS", 8, 7)), project(("CPUS_ALL_REGIONS", 32, 0))):
        gce.regions.rpcs["get"].replies.append(region(("NVIDIA_A100_GPUS", 8, 0)))
        gce.projects.rpcs["get"].replies.append(answer)
        assert gce.provider.check_permission(offer()) is None


def test_capacity_cannot_be_known_without_launching(gce: Gce) -> None:
    assert gce.provider.check_capacity(offer()) is None


# -- launched -------------------------------------------------------------------------

def running_operation() -> c.Operation:
    return c.Operation(name="operation-1732000000000-abc", status="RUNNING", operation_type="insert",
                       zone="us-central1-a")


def failed_operation(status: int, status_text: str, code: str, message: str) -> c.Operation:
    return c.Operation(name="operation-1732000000000-abc", status="DONE", operation_type="insert",
                       http_error_status_code=status, http_error_message=status_text,
                       error=c.Error(errors=[c.Errors(code=code, message=message)]))


def test_launch_inserts_the_vm_and_waits_on_its_operation(gce: Gce) -> None:
    gce.instances.rpcs["insert"].replies.append(running_operation())
    gce.operations.rpcs["get"].replies.append(c.Operation(name="operation-1732000000000-abc", status="DONE"))

    alloc = gce.provider.launch(offer("a2-highgpu-1g@us-central1-a:spot"), allocation_id="Alloc_7",
                                ssh_public_key=KEY, env={"HF_TOKEN": "hf_secret"})

    request = gce.instances.rpcs["insert"].requests[0]
    vm = request.instance_resource
    assert (request.project, request.zone) == ("demo-project", "us-central1-a")
    assert vm.name == instance_name("Alloc_7") and alloc.ref == f"us-central1-a/{vm.name}"
    assert vm.machine_type == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    assert not vm.guest_accelerators  # A2 machine types come with their GPUs
    assert vm.scheduling.provisioning_model == "SPOT" and vm.scheduling.on_host_maintenance == "TERMINATE"
    assert vm.labels[ALLOCATION_LABEL] == "alloc_7"
    metadata = {item.key: item.value for item in vm.metadata.items}
    assert metadata["ssh-keys"] == f"ubuntu:{KEY}" and metadata[ALLOCATION_LABEL] == "Alloc_7"
    [env_file] = json.loads(metadata["user-data"].removeprefix("#cloud-config\n"))["write_files"]
    assert env_file["content"] == "export HF_TOKEN=hf_secret\n" and env_file["permissions"] == "0600"
    assert vm.network_interfaces[0].access_configs[0].type_ == "ONE_TO_ONE_NAT"
    assert gce.operations.rpcs["get"].requests[0].operation == "operation-1732000000000-abc"
    assert alloc.details["market"] == "spot" and "hf_secret" not in json.dumps(alloc.to_json())


def test_an_n1_machine_gets_its_gpu_attached(gce: Gce) -> None:
    gce.instances.rpcs["insert"].replies.append(c.Operation(name="operation-2", status="DONE"))
    gce.provider.launch(offer("n1-standard-8@us-central1-a"), allocation_id="alloc-2")
    vm = gce.instances.rpcs["insert"].requests[0].instance_resource
    [gpu] = vm.guest_accelerators
    assert (gpu.accelerator_type, gpu.accelerator_count) == ("zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4", 1)
    assert vm.scheduling.provisioning_model == "STANDARD"


def test_an_exhausted_zone_in_the_operation_is_no_capacity(gce: Gce) -> None:
    gce.instances.rpcs["insert"].replies.append(running_operation())
    gce.operations.rpcs["get"].replies.append(failed_operation(
        503, "SERVICE UNAVAILABLE", "ZONE_RESOURCE_POOL_EXHAUSTED",
        "The zone 'projects/demo-project/zones/us-central1-a' does not have enough resources available to fulfill "
        "the request.  Try a different zone, or try again later."))
    with pytest.raises(NoCapacity) as err:
        gce.provider.launch(offer(), allocation_id="alloc-3")
    # The library surfaces the operation's error as ServiceUnavailable; the code decides.
    assert isinstance(err.value.__cause__, gexc.ServiceUnavailable)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(err.value) and err.value.offer == "a2-highgpu-1g@us-central1-a"


def test_an_exhausted_zone_with_details_is_no_capacity(gce: Gce) -> None:
    gce.instances.rpcs["insert"].replies.append(failed_operation(
        503, "SERVICE UNAVAILABLE", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "The zone 'projects/demo-project/zones/us-central1-a' does not have enough resources available to fulfill "
        "the request. '(resource type:compute)'."))
    with pytest.raises(NoCapacity):
        gce.provider.launch(offer(), allocation_id="alloc-3")


@pytest.mark.parametrize("error", [
    lambda: failed_operation(403, "FORBIDDEN", "QUOTA_EXCEEDED",
                             "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region us-central1."),
    lambda: http_error(403, "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region us-central1.",
                       "quotaExceeded"),
], ids=["in-the-operation", "on-the-request"])
def test_quota_exceeded_at_launch_is_quota_exceeded(gce: Gce, error: Callable[[], Any]) -> None:
    gce.instances.rpcs["insert"].replies.append(error())
    with pytest.raises(QuotaExceeded) as err:
        gce.provider.launch(offer(), allocation_id="alloc-4")
    assert "NVIDIA_A100_GPUS" in str(err.value)


@pytest.mark.parametrize(("error", "raised"), [
    (lambda: http_error(403, "Required 'compute.instances.create' permission for "
                             "'projects/demo-project/zones/us-central1-a/instances/jp-alloc-5'", "forbidden"),
     AuthError),
    (lambda: http_error(401, "Request had invalid authentication credentials.", "authError"), AuthError),
    (lambda: gexc.ServiceUnavailable("The service is currently unavailable."), ProviderUnavailable),
    (lambda: gexc.DeadlineExceeded("Deadline exceeded."), ProviderUnavailable),
    (lambda: http_error(400, "Invalid value for field 'resource.machineType'.", "invalid"), LaunchFailed),
])
def test_other_launch_errors_map_to_the_tree(gce: Gce, error: Callable[[], Any], raised: type) -> None:
    gce.instances.rpcs["insert"].replies.append(error())
    unsure = raised is ProviderUnavailable  # the insert may have been carried out: looked up by name first
    if unsure:
        gce.instances.rpcs["get"].replies.append(gexc.NotFound("The resource was not found"))
    with pytest.raises(raised) as err:
        gce.provider.launch(offer(), allocation_id="alloc-5")
    assert err.value.provider == "gcp" and err.value.__cause__ is not None
    assert len(gce.instances.rpcs["get"].requests) == (1 if unsure else 0)
    assert gce.instances.rpcs["insert"].requests[0].request_id  # the insert is idempotent by its request id


# -- afterwards -----------------------------------------------------------------------

def vm(status: str, *, ip: str = "", spot: bool = False, note: str = "") -> c.Instance:
    return c.Instance(name="jp-alloc-1-0000", status=status, status_message=note,
                      scheduling=c.Scheduling(provisioning_model="SPOT" if spot else "STANDARD"),
                      network_interfaces=[c.NetworkInterface(network_i_p="10.128.0.5", access_configs=[
                          c.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT", nat_i_p=ip)])])


def test_status_follows_provisioning_running_reachable(gce: Gce) -> None:
    gce.instances.rpcs["get"].replies.extend([vm("PROVISIONING"), vm("STAGING"), vm("RUNNING"),
                                              vm("RUNNING", ip="34.123.45.67")])
    states = [gce.provider.status(allocation()) for _ in range(4)]
    assert [s.state for s in states] == ["pending", "pending", "running", "reachable"]
    assert states[-1].ssh is not None and states[-1].ssh.to_json() == {"host": "34.123.45.67", "port": 22,
                                                                       "user": "ubuntu"}
    request = gce.instances.rpcs["get"].requests[0]
    assert (request.project, request.zone, request.instance) == ("demo-project", "us-central1-a", "jp-alloc-1-0000")


def test_a_preempted_spot_vm_is_lost(gce: Gce) -> None:
    gce.instances.rpcs["get"].replies.extend([vm("STOPPING", spot=True, note="Instance was preempted."),
                                              vm("TERMINATED", spot=True)])
    first, second = gce.provider.status(allocation()), gce.provider.status(allocation())
    assert first.state == second.state == "lost"
    assert "preempted" in (first.reason or "")


def test_a_stopped_on_demand_vm_is_stopped_and_a_deleted_one_terminated(gce: Gce) -> None:
    gce.instances.rpcs["get"].replies.extend([
        vm("TERMINATED"), http_error(404, "The resource 'projects/demo-project/zones/us-central1-a/instances/"
                                          "jp-alloc-1-0000' was not found", "notFound")])
    assert gce.provider.status(allocation()).state == "stopped"
    assert gce.provider.status(allocation()).state == "terminated"


def _delete_op(status: str, *, error: tuple[int, str] | None = None) -> c.Operation:
    op = c.Operation(name="operation-3", status=status, operation_type="delete", zone="us-central1-a")
    if error is not None:
        op.http_error_status_code, op.http_error_message = error
        op.error = c.Error(errors=[c.Errors(code="INTERNAL_ERROR", message=error[1])])
    return op


def test_terminate_waits_for_the_delete_and_terminate_again(gce: Gce) -> None:
    gce.provider.operation_poll_s = 0.01
    gce.instances.rpcs["delete"].replies.extend([
        _delete_op("RUNNING"),
        http_error(404, "The resource 'projects/demo-project/zones/us-central1-a/instances/jp-alloc-1-0000' was "
                        "not found", "notFound")])
    # accepted is not done: the VM runs (and is billed) until its operation is
    gce.operations.rpcs["get"].replies.extend([_delete_op("RUNNING"), _delete_op("DONE")])
    gce.provider.terminate(allocation())
    assert len(gce.operations.rpcs["get"].requests) == 2
    assert gce.operations.rpcs["get"].requests[0].operation == "operation-3"
    gce.provider.terminate(allocation())  # already gone: not an error
    assert gce.instances.rpcs["delete"].requests[0].instance == "jp-alloc-1-0000"


def test_a_delete_whose_operation_fails_is_tried_again(gce: Gce) -> None:
    gce.provider.operation_poll_s = 0.01
    slept: list[float] = []
    gce.provider.sleep = slept.append
    gce.instances.rpcs["delete"].replies.extend([_delete_op("RUNNING"), _delete_op("RUNNING")])
    gce.operations.rpcs["get"].replies.extend([_delete_op("DONE", error=(503, "SERVICE UNAVAILABLE")),
                                               _delete_op("DONE")])
    gce.provider.terminate(allocation())
    assert len(gce.instances.rpcs["delete"].requests) == 2 and slept == [0.5]


def test_a_delete_that_never_finishes_says_the_vm_may_still_run(gce: Gce) -> None:
    gce.provider.operation_poll_s, gce.provider.operation_timeout = 0.01, 0.05
    gce.provider.sleep = lambda _s: None
    gce.provider.terminate_attempts = 2
    gce.instances.rpcs["delete"].replies.extend([_delete_op("RUNNING"), _delete_op("RUNNING")])
    gce.operations.rpcs["get"].default = _delete_op("RUNNING")  # however long it is waited for
    with pytest.raises(ProviderUnavailable) as err:
        gce.provider.terminate(allocation())
    assert "may still be running" in str(err.value) and "had not done it" in str(err.value)
    assert err.value.context["may_be_running"] is True and "jp-alloc-1-0000" in (err.value.hint or "")


# -- the boundary ---------------------------------------------------------------------

def test_instance_names_are_valid_and_distinct() -> None:
    names = {instance_name(a) for a in ("Alloc_7", "alloc-7", "alloc.7", "x" * 200, "---")}
    assert len(names) == 5
    for name in names:
        assert len(name) <= 63 and name[0].isalpha() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


def test_missing_credentials_are_an_auth_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # never probe the metadata server
    with pytest.raises(AuthError) as err:
        GcpProvider(project="demo-project").terminate(allocation())
    assert "application-default" in (err.value.hint or "")
