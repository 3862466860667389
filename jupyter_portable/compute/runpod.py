"""RunPod: on-demand pods over the REST API v2, interruptible (spot) and community pods over GraphQL.

REST v2 (``https://api.runpod.io/v2``, per the servers entry of RunPod's OpenAPI 2.0.0
document) lists GPU types with their stock, creates, reads and deletes pods. It has no
interruptible field, so spot pods are rented with GraphQL's ``podRentInterruptable``
(``bidPerGpu``) and then read and deleted over REST like any other pod. Nor has it
``supportPublicIp``: a community host has a public IP only when the launch asks for one, so
community on-demand pods are rented with GraphQL's ``podFindAndDeployOnDemand`` (the mutation
RunPod's own client, runpod-python's ``create_pod``, sends, with ``supportPublicIp``); secure
cloud hosts have public IPs, and their pods are created over REST.

"Reachable" here means the pod publishes a direct SSH endpoint (``ssh.direct``, or a
public port for 22 in ``runtime.ports``): RUNNING alone is not enough, and the proxy
endpoint carries a shell only (no scp, rsync or port forwarding).

Interruptible pods are opt-in (``include_spot``, else ``$RUNPOD_SPOT=1``). The bid per GPU is a
setting (``spot_bid``, else ``$RUNPOD_SPOT_BID``): a fraction of the type's on-demand price, default
:data:`DEFAULT_SPOT_BID` (0.6). Not the minimum bid: RunPod stops the lowest bidders first, so a
pod at the minimum is the first to go; at 0.6 it saves 40% and stands above the minimum (about half
the on-demand price) without paying on-demand. A type whose minimum is above the bid is not
offered. The offer's ``reliability`` (routing's risk input) follows the bid: :func:`bid_reliability`.

Spend is the bill: ``GET /v2/billing/pods?podId=`` (hourly buckets of GPU, CPU and disk) summed.
Where the bill cannot be read, the pod's own ``cost`` ($/h) x time since its ``createdAt`` is the
provider's rate; a pod's ``cost`` reads 0.0 once it EXITED (the document says so), so then the rate
says nothing and the caller keeps the last figure it saw.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import httpx

from jupyter_portable.compute import gpu_catalog
from jupyter_portable.compute.base import (
    ALLOCATION_ENV,
    WORKSPACE_ENV,
    Allocation,
    AllocationStatus,
    MachineInfo,
    SshEndpoint,
    machine_name,
    parse_machine_name,
)
from jupyter_portable.compute.config import (
    RUNPOD_API,
    RUNPOD_IMAGE,
    RUNPOD_SPOT_BID,
    PortableRunPod,
    spot_bid_fraction,
)
from jupyter_portable.compute.http import (
    NUMBER,
    ApiClient,
    ErrorInfo,
    HttpProvider,
    ShapeError,
    key_from,
    make_offer,
    matches,
    need,
    opt,
    slug,
    spend_since,
)
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    ProviderUnavailable,
    QuotaExceeded,
)
from jupyter_portable.core.offers import Offer, Requirements, version_tuple
from jupyter_portable.core.times import parse_iso_or_none, to_iso, utcnow

API = RUNPOD_API
KEY_ENV = "RUNPOD_API_KEY"
# where the APIs are (a proxy, or a twin in tests); the constructor's base_url/graphql_url win
URL_ENV = "RUNPOD_API_URL"
GRAPHQL_ENV = "RUNPOD_GRAPHQL_URL"
DEFAULT_IMAGE = RUNPOD_IMAGE
SPOT_ENV = "RUNPOD_SPOT"  # "1": list interruptible offers too
SPOT_BID_ENV = "RUNPOD_SPOT_BID"  # the bid, a fraction of the on-demand price
DEFAULT_SPOT_BID = RUNPOD_SPOT_BID
# Rough priors, as for the clouds' spot (gpu_catalog.SPOT_RELIABILITY): RunPod publishes no
# interruption rate. A pod bidding the minimum is stopped by any higher bid (as likely lost as
# kept over a planned run); one bidding the on-demand price is as safe as spot gets.
MIN_BID_RELIABILITY = 0.5

# RunPod has no machine-readable code for these; only the human-readable text tells.
NO_CAPACITY = re.compile(r"no longer any instances available|no instances? (?:are |is )?(?:currently )?available"
                         r"|not enough capacity|insufficient capacity|out of (?:stock|capacity)", re.I)
QUOTA = re.compile(r"quota|spend(?:ing)? limit|insufficient (?:balance|funds|credit)|maximum number of", re.I)
AUTH = re.compile(r"unauthori[sz]ed|invalid api key|api key (?:is )?(?:invalid|expired)|forbidden", re.I)
CUDA = re.compile(r"\A\s*v?(\d+)(?:\.(\d+))?(?:\.\d+)*\s*\Z")

POD_STATES = {"PROVISIONING": "pending", "STARTING": "pending", "RUNNING": "running", "EXITED": "stopped",
              "ERROR": "lost", "TERMINATED": "terminated"}

SPOT_QUERY = """query SpotPrices {
  gpuTypes { id displayName memoryInGb secureCloud communityCloud
    lowestPrice(input: {gpuCount: %d, secureCloud: %s}) { minimumBidPrice uninterruptablePrice stockStatus } }
}"""
RENT_SPOT = """mutation RentSpot($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id desiredStatus costPerHr }
}"""
DEPLOY_ON_DEMAND = """mutation DeployOnDemand($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id desiredStatus costPerHr }
}"""


def cuda_version(text: object) -> str | None:
    """A CUDA version as RunPod takes it, ``MAJOR.MINOR`` ("12" -> "12.0", "12.4.1" -> "12.4"), or
    None when ``text`` is not a version: the create call refuses anything else with a 422."""
    m = CUDA.match(text) if isinstance(text, str) else None
    return f"{int(m[1])}.{int(m[2] or 0)}" if m else None


def _classify(info: ErrorInfo) -> ComputeError | None:
    """RunPod's RFC 9457 bodies (``{title, status, detail, errors?}``) by status and text."""
    body = info.body if isinstance(info.body, dict) else {}
    detail = body.get("detail") if isinstance(body.get("detail"), str) else info.text
    raw_errors = body.get("errors")
    errors: list[Any] = raw_errors if isinstance(raw_errors, list) else []
    texts = [detail, body.get("title"), *[e for e in errors if isinstance(e, str)]]
    where = f"runpod refused {info.where} (HTTP {info.status})"
    if info.status == 403 and info.operation == "launch":
        # RunPod's create answers 403 for a pool this account may not rent from (its retry
        # table: "skip this candidate"); the key itself worked for the checks before it.
        return QuotaExceeded(f"runpod: not permitted: this pool is not open to your account ({where}: {detail})",
                             provider="runpod", status=403, not_permitted=True,
                             hint="this route is skipped; the next one is tried. Ask RunPod support to open the "
                                  "pool to the account, or pick another GPU type, cloud or data center")
    if info.status in (401, 403, 429) or info.status >= 500:
        return None  # the default mapping: AuthError naming the variable, or ProviderUnavailable
    if matches(NO_CAPACITY, *texts):
        return NoCapacity(f"{where}: {detail}", provider="runpod", status=info.status)
    if info.status == 402:
        return QuotaExceeded(f"{where}: {detail or 'insufficient balance'}", provider="runpod", status=402,
                             hint="add funds to the RunPod account; no pod can start until then")
    if matches(QUOTA, *texts):
        return QuotaExceeded(f"{where}: {detail}", provider="runpod", status=info.status)
    if info.operation == "capacity" and info.status == 404:
        return NoCapacity(f"{where}: the GPU type is no longer listed", provider="runpod", status=404)
    if info.operation == "launch" and info.status in (400, 409, 422):
        extra = f" ({'; '.join(e for e in errors if isinstance(e, str))})" if errors else ""
        return LaunchFailed(f"{where}: {detail}{extra}", provider="runpod", status=info.status)
    return None


def bid_reliability(bid: float, minimum: float, on_demand: float) -> float:
    """How likely a spot pod bidding ``bid`` per GPU keeps running: :data:`MIN_BID_RELIABILITY` at
    the ``minimum`` bid, rising in line with the bid to ``SPOT_RELIABILITY`` at the ``on_demand`` price."""
    top = gpu_catalog.SPOT_RELIABILITY
    if on_demand <= minimum:
        return top
    share = min(1.0, max(0.0, (bid - minimum) / (on_demand - minimum)))
    return round(MIN_BID_RELIABILITY + (top - MIN_BID_RELIABILITY) * share, 4)


def _capacity(level: str | None) -> int | None:
    """RunPod gives a level, not a count: NONE is 0, any other level "at least one"."""
    if level is None:
        return None
    return 0 if level.upper() == "NONE" else 1


class RunPodProvider(HttpProvider):
    """RunPod pods. ``api_key`` defaults to ``$RUNPOD_API_KEY``; ``cloud`` is SECURE or
    COMMUNITY; ``include_spot`` (default ``$RUNPOD_SPOT``) adds interruptible offers priced at the
    bid, ``spot_bid`` (default ``$RUNPOD_SPOT_BID``, else 0.6) x the on-demand price. The REST base
    is ``base_url``, else ``$RUNPOD_API_URL``, else the real one; GraphQL is ``graphql_url``,
    else ``$RUNPOD_GRAPHQL_URL``, else ``/graphql`` on the REST base."""

    name = "runpod"

    def image_warning(self, image: str | None) -> str | None:
        """What may go wrong with ``image`` before a pod is rented from it: SSH into a pod works only in
        an image that follows RunPod's convention (its start script runs sshd and installs PUBLIC_KEY
        for root, as RunPod's own ``runpod/`` images do); a custom image that does not boots, never
        answers on 22/tcp, and is billed until the boot wait gives up. None for RunPod's images."""
        name = image or self.default_image
        if name.startswith("runpod/"):
            return None
        return (f"{name} is not one of RunPod's images: a pod of it is reachable only if the image starts "
                "sshd on 22/tcp and installs $PUBLIC_KEY for root (RunPod's convention); otherwise it boots, "
                "never answers SSH and is billed until the boot wait gives up")

    def __init__(self, api_key: str | None = None, *, cloud: str | None = None, include_spot: bool | None = None,
                 spot_bid: float | None = None, default_image: str = DEFAULT_IMAGE, disk_gb: int = 50,
                 base_url: str | None = None, graphql_url: str | None = None, timeout: float = 30.0, retries: int = 4,
                 backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 transport: httpx.BaseTransport | None = None, now: Callable[[], datetime] = utcnow) -> None:
        self.now = now  # the wall clock spend so far is counted to
        if spot_bid is not None:
            spot_bid = spot_bid_fraction(spot_bid, "spot_bid")
        # what is not given comes from the environment or the default (compute.config)
        given = {"spot": include_spot, "spot_bid": spot_bid, "api_url": base_url, "graphql_url": graphql_url,
                 "cloud": cloud}
        settings = PortableRunPod(**{k: v for k, v in given.items() if v is not None})
        self.cloud = settings.cloud
        self.include_spot = settings.spot
        self.spot_bid = settings.spot_bid
        self.default_image = default_image
        self.disk_gb = disk_gb
        base_url = settings.api_url or API
        self.graphql_url = settings.graphql_url or base_url.rstrip("/") + "/graphql"
        self._api = ApiClient(provider=self.name, base_url=base_url, key=key_from(api_key, KEY_ENV), key_env=KEY_ENV,
                              key_hint="create one at https://www.runpod.io/console/user/settings",
                              classify=_classify, timeout=timeout, retries=retries, backoff=backoff, sleep=sleep,
                              clock=clock, transport=transport)

    # -- check 1: listed ------------------------------------------------------------------

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """One offer per GPU type and data center from ``GET /v2/catalog/gpus`` with pod stock;
        with ``include_spot``, one interruptible offer per GPU type from GraphQL."""
        req = requirements or Requirements()
        count = max(1, req.gpu_count)
        params: dict[str, Any] = {"include": "AVAILABILITY", "product": "POD", "count": count, "cloud": self.cloud}
        min_cuda = cuda_version(req.min_cuda)
        if min_cuda:
            params["minCudaVersion"] = min_cuda
        _, body = self._api.request("GET", "/v2/catalog/gpus", operation="offers", params=params)
        with self._api.reading("GET /v2/catalog/gpus"):
            out = [o for gpu in need(body, "gpus", list) for o in self._gpu_offers(gpu, count, min_cuda)]
        if self.include_spot:
            out.extend(self._spot_offers(count))
        return out

    def _gpu_offers(self, gpu: Any, count: int, min_cuda: str | None) -> list[Offer]:
        gpu_id = need(gpu, "id", str, where="gpus[]")
        if not need(gpu, self.cloud.lower(), bool, where=gpu_id):
            return []  # not sold in this cloud
        price = need(need(gpu, "price", dict, where=gpu_id), self.cloud.lower(), NUMBER, where=f"{gpu_id}.price")
        cudas = [need(c, "version", str, where="cudaVersions[]") for c in opt(gpu, "cudaVersions", list) or []
                 if isinstance(c, dict) and c.get("available") is True]
        name = need(gpu, "name", str, where=gpu_id)
        memory = float(need(gpu, "memory", int, where=gpu_id))
        data_centers = opt(gpu, "dataCenters", list) or []
        places = [(need(dc, "id", str, where="dataCenters[]"), need(dc, "availability", str, where="dataCenters[]"))
                  for dc in data_centers] or [(None, opt(gpu, "availability", str))]
        out = []
        # what a GraphQL launch may allow (allowedCudaVersions), oldest first
        versions = sorted({v for c in cudas if (v := cuda_version(c))}, key=version_tuple)
        for dc, level in places:
            offer = make_offer(self.name, id=f"{self.cloud.lower()}/{slug(gpu_id)}/x{count}@{dc or 'any'}", gpu=name,
                               gpu_count=count, gpu_memory_gb=memory, price_per_hour=round(float(price) * count, 4),
                               region=dc or "any", cuda=max(cudas, key=version_tuple) if cudas else None,
                               capacity=_capacity(level),
                               extra={"gpu_type_id": gpu_id, "cloud": self.cloud, "data_center_id": dc,
                                      "availability": level, "min_cuda": min_cuda, "cuda_versions": versions})
            if offer is not None:
                out.append(offer)
        return out

    def _spot_offers(self, count: int) -> list[Offer]:
        query = SPOT_QUERY % (count, "true" if self.cloud == "SECURE" else "false")
        data = self._graphql(query, None, operation="offers")
        out = []
        with self._api.reading("GraphQL gpuTypes"):
            for gpu in need(data, "gpuTypes", list):
                gpu_id = need(gpu, "id", str, where="gpuTypes[]")
                in_cloud = opt(gpu, "secureCloud" if self.cloud == "SECURE" else "communityCloud", bool)
                lowest = opt(gpu, "lowestPrice", dict) or {}
                minimum = opt(lowest, "minimumBidPrice", NUMBER, where=f"{gpu_id}.lowestPrice")
                on_demand = opt(lowest, "uninterruptablePrice", NUMBER, where=f"{gpu_id}.lowestPrice")
                if not in_cloud or not minimum or not on_demand:
                    continue  # no interruptible market for this type
                bid = round(self.spot_bid * float(on_demand), 4)
                if bid < minimum:
                    self._api.log.info("runpod: no spot offer for %s: the bid %.4f/GPU (%g x on-demand) is under "
                                       "the minimum %.4f", gpu_id, bid, self.spot_bid, minimum)
                    continue
                stock = opt(lowest, "stockStatus", str)
                offer = make_offer(self.name, id=f"spot-{self.cloud.lower()}/{slug(gpu_id)}/x{count}",
                                   gpu=need(gpu, "displayName", str, where=gpu_id), gpu_count=count,
                                   gpu_memory_gb=float(need(gpu, "memoryInGb", NUMBER, where=gpu_id)),
                                   price_per_hour=round(bid * count, 4), region="any", spot=True,
                                   capacity=_capacity(stock),
                                   reliability=bid_reliability(bid, float(minimum), float(on_demand)),
                                   extra={"gpu_type_id": gpu_id, "cloud": self.cloud, "bid_per_gpu": bid,
                                          "minimum_bid_per_gpu": float(minimum),
                                          "on_demand_per_gpu": float(on_demand), "bid_fraction": self.spot_bid,
                                          "data_center_id": None, "availability": stock})
                if offer is not None:
                    out.append(offer)
        return out

    # -- check 2: permitted ---------------------------------------------------------------

    def check_permission(self, offer: Offer) -> None:
        """The key works (``GET /v2/account/ssh-keys``). RunPod publishes no quota to read;
        its spend limit and balance show up as QuotaExceeded at launch."""
        with self._for_offer(offer.id):
            _, body = self._api.request("GET", "/v2/account/ssh-keys", operation="permission")
            with self._api.reading("GET /v2/account/ssh-keys"):
                need(body, "keys", list)

    # -- check 3: capacity now ------------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """Pod stock for the offer's GPU type (in its data center): NONE raises NoCapacity,
        any other level returns 1 ("at least one"; RunPod gives no count)."""
        gpu_id = self._gpu_type(offer)
        path = f"/v2/catalog/gpus/{quote(gpu_id, safe='')}"
        params = {"include": "AVAILABILITY", "product": "POD", "count": max(1, offer.gpu_count), "cloud": self.cloud}
        with self._for_offer(offer.id):
            _, body = self._api.request("GET", path, operation="capacity", params=params)
            dc = offer.extra.get("data_center_id")
            with self._api.reading(f"GET {path}"):
                if dc:
                    levels = {need(d, "id", str, where="dataCenters[]"): need(d, "availability", str, where=dc)
                              for d in opt(body, "dataCenters", list) or []}
                    level = levels.get(dc, "NONE")
                else:
                    level = opt(body, "availability", str) or "NONE"
            if level.upper() == "NONE":
                raise NoCapacity(f"runpod has no {offer.gpu} x{offer.gpu_count} free"
                                 f"{' in ' + dc if dc else ''} now (availability NONE)",
                                 provider=self.name, offer=offer.id)
            return 1

    # -- check 4: launched ----------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Create the pod (``POST /v2/pods``; GraphQL ``podRentInterruptable`` for a spot offer and
        ``podFindAndDeployOnDemand`` for a community one, both asking for a host with a public IP)
        with SSH on 22/tcp. ``ssh_public_key`` goes in as ``PUBLIC_KEY``, which RunPod
        images install for root. The pod is named :func:`~.base.machine_name` and its env carries
        both ids; a launch whose answer was lost is looked up by that name, never sent twice."""
        env = dict(env or {})
        env[ALLOCATION_ENV] = allocation_id
        if ssh_public_key:
            env["PUBLIC_KEY"] = ssh_public_key
        image = image or self.default_image
        name = machine_name(allocation_id, env.get(WORKSPACE_ENV))
        with self._for_offer(offer.id):
            try:
                if offer.spot:
                    pod_id, details = self._launch_spot(offer, name, image, env)
                elif self.cloud == "COMMUNITY":
                    pod_id, details = self._launch_community(offer, name, image, env)
                else:
                    pod_id, details = self._launch_on_demand(offer, name, image, env)
            except ComputeError as exc:
                found = self._found_after_lost_answer(exc, allocation_id)
                if found is None:
                    raise
                pod_id, details = found.ref, {"status": found.details.get("status"),
                                              "cost_per_hour": found.price_per_hour, "found_by_name": True}
        return Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=pod_id,
                          started=to_iso(self.now(), "seconds"),
                          details={**details, "image": image, "spot": offer.spot})

    def _launch_on_demand(self, offer: Offer, name: str, image: str, env: dict[str, str]) -> tuple[str, dict]:
        gpu: dict[str, Any] = {"id": self._gpu_type(offer), "count": max(1, offer.gpu_count)}
        # offers listed before the version was normalised may still carry "12"
        min_cuda = cuda_version(offer.extra.get("min_cuda"))
        if min_cuda:
            gpu["minCudaVersion"] = min_cuda
        body: dict[str, Any] = {"name": name, "image": image, "gpu": gpu, "cloud": self.cloud, "disk": self.disk_gb,
                                "env": env, "ports": ["22/tcp"], "startSsh": True}
        if offer.extra.get("data_center_id"):
            body["dataCenterIds"] = [offer.extra["data_center_id"]]
        _, pod = self._api.request("POST", "/v2/pods", operation="launch", json_body=body, ok=(200, 201),
                                   secrets=env.values())
        with self._api.reading("POST /v2/pods"):
            return need(pod, "id", str), {"status": need(pod, "status", str),
                                          "data_center": opt(pod, "dataCenterId", str),
                                          "cost_per_hour": opt(pod, "cost", NUMBER)}

    def _launch_spot(self, offer: Offer, name: str, image: str, env: dict[str, str]) -> tuple[str, dict]:
        bid = offer.extra.get("bid_per_gpu")
        if not isinstance(bid, (int, float)) or bid <= 0:
            bid = offer.price_per_hour / max(1, offer.gpu_count)
        spec: dict[str, Any] = {"name": name, "imageName": image, "gpuTypeId": self._gpu_type(offer),
                                "gpuCount": max(1, offer.gpu_count), "bidPerGpu": round(float(bid), 4),
                                "cloudType": self.cloud, "containerDiskInGb": self.disk_gb, "volumeInGb": 0,
                                "ports": "22/tcp", "startSsh": True,
                                # a host with a public IP, so that 22/tcp is reachable directly (not
                                # only through RunPod's proxy, which forwards no port): issue 42
                                "supportPublicIp": True,
                                "env": [{"key": k, "value": v} for k, v in env.items()]}
        if offer.extra.get("data_center_id"):
            spec["dataCenterId"] = offer.extra["data_center_id"]
        data = self._graphql(RENT_SPOT, {"input": spec}, operation="launch", secrets=env.values())
        with self._api.reading("GraphQL podRentInterruptable"):
            pod = data.get("podRentInterruptable") if isinstance(data, dict) else None
            if pod is None:
                raise LaunchFailed("runpod accepted podRentInterruptable but returned no pod", provider=self.name)
            return need(pod, "id", str), {"status": opt(pod, "desiredStatus", str),
                                          "cost_per_hour": opt(pod, "costPerHr", NUMBER),
                                          "bid_per_gpu": spec["bidPerGpu"]}

    def _launch_community(self, offer: Offer, name: str, image: str, env: dict[str, str]) -> tuple[str, dict]:
        """GraphQL ``podFindAndDeployOnDemand``: REST v2 cannot ask a community host for a public IP,
        and without one 22/tcp is reached through RunPod's proxy alone (a shell, no port forwarding)."""
        spec: dict[str, Any] = {"name": name, "imageName": image, "gpuTypeId": self._gpu_type(offer),
                                "gpuCount": max(1, offer.gpu_count), "cloudType": "COMMUNITY",
                                "containerDiskInGb": self.disk_gb, "volumeInGb": 0, "ports": "22/tcp",
                                "startSsh": True, "supportPublicIp": True,
                                "dataCenterId": offer.extra.get("data_center_id"),
                                "env": [{"key": k, "value": v} for k, v in env.items()]}
        min_cuda = cuda_version(offer.extra.get("min_cuda"))
        if min_cuda:
            # GraphQL takes the versions allowed, not a floor: the type's listed ones from the floor up
            listed = offer.extra.get("cuda_versions")
            allowed = [v for v in listed if version_tuple(v) >= version_tuple(min_cuda)] \
                if isinstance(listed, list) else []
            if not allowed:
                raise LaunchFailed(f"offer {offer.id} lists no CUDA version from {min_cuda} up; list offers again",
                                   provider=self.name, offer=offer.id)
            spec["allowedCudaVersions"] = allowed
        data = self._graphql(DEPLOY_ON_DEMAND, {"input": spec}, operation="launch", secrets=env.values())
        with self._api.reading("GraphQL podFindAndDeployOnDemand"):
            pod = data.get("podFindAndDeployOnDemand") if isinstance(data, dict) else None
            if pod is None:
                raise LaunchFailed("runpod accepted podFindAndDeployOnDemand but returned no pod", provider=self.name)
            return need(pod, "id", str), {"status": opt(pod, "desiredStatus", str),
                                          "cost_per_hour": opt(pod, "costPerHr", NUMBER)}

    # -- lifecycle ------------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``GET /v2/pods/{id}``: PROVISIONING/STARTING are pending, RUNNING is running until a
        direct SSH endpoint exists (then reachable), EXITED is stopped (lost for a spot pod:
        it was outbid), ERROR is lost, TERMINATED (or 404) is terminated/lost. ``spend``: the
        pod's own ``cost`` ($/h) from its ``createdAt``, both RunPod's figures (none once EXITED;
        :meth:`spend` reads the bill)."""
        path = f"/v2/pods/{quote(allocation.ref, safe='')}"
        status, pod = self._api.request("GET", path, operation="status", allow=(404,))
        if status == 404:
            return AllocationStatus("lost", reason="runpod no longer knows this pod (deleted outside "
                                    "jupyter-portable, or reclaimed)")
        with self._api.reading(f"GET {path}"):
            raw = need(pod, "status", str)
            if raw not in POD_STATES:
                raise ShapeError(f"unknown pod status {raw!r}")
            state = POD_STATES[raw]
            ssh = _ssh_endpoint(pod) if state == "running" else None
            spend = self._rate_spend(pod, raw)
        measured: dict[str, Any] = {"spend": spend, "spend_source": "provider-rate" if spend is not None else None}
        if state == "running":
            if ssh is not None:
                return AllocationStatus("reachable", ssh=ssh, **measured)
            return AllocationStatus("running", reason="RUNNING, but no direct SSH endpoint yet", **measured)
        if raw == "EXITED" and allocation.details.get("spot"):
            return AllocationStatus("lost", reason="the interruptible pod was stopped (outbid or reclaimed)",
                                    **measured)
        reasons = {"ERROR": "the pod is in ERROR", "EXITED": "the pod's container exited (stopped)"}
        return AllocationStatus(state, reason=reasons.get(raw), **measured)

    def list_machines(self) -> list[MachineInfo]:
        """``GET /v2/pods``: the pods named :func:`~.base.machine_name` (or whose env carries our
        allocation id), with RunPod's own ``cost`` x time since ``createdAt`` as spend."""
        _, body = self._api.request("GET", "/v2/pods", operation="list")
        out = []
        now = self.now()
        with self._api.reading("GET /v2/pods"):
            for pod in need(body, "pods", list):
                env = opt(pod, "env", dict) or {}
                ids = parse_machine_name(opt(pod, "name", str))
                aid = ids[0] if ids else env.get(ALLOCATION_ENV)
                if not isinstance(aid, str) or not aid:
                    continue  # not ours
                wsid = (ids[1] if ids else None) or env.get(WORKSPACE_ENV)
                raw = need(pod, "status", str)
                created = opt(pod, "createdAt", str)
                price = opt(pod, "cost", NUMBER)
                uptime, _ = spend_since(price, created, now)
                spend = self._rate_spend(pod, raw)
                out.append(MachineInfo(provider=self.name, ref=need(pod, "id", str), allocation_id=aid,
                                       workspace_id=wsid if isinstance(wsid, str) else None,
                                       state=POD_STATES.get(raw, "pending"), name=opt(pod, "name", str) or "",
                                       started=created, uptime_s=uptime, price_per_hour=price, spend=spend,
                                       spend_source="provider-rate" if spend is not None else None,
                                       details={"status": raw}))
        return [m for m in out if m.state != "terminated"]

    def _rate_spend(self, pod: dict[str, Any], raw: str) -> float | None:
        """The pod's ``cost`` ($/h) x time since its ``createdAt``; None once it is not running (its
        cost reads 0.0 then, which says nothing of what it cost)."""
        price = opt(pod, "cost", NUMBER)
        if raw in ("EXITED", "TERMINATED") and not price:
            return None
        return spend_since(price, opt(pod, "createdAt", str), self.now())[1]

    def spend(self, allocation: Allocation) -> tuple[float | None, str | None]:
        """The bill: ``GET /v2/billing/pods`` for this pod, hourly buckets from the hour before its
        launch, ``totalAmount`` summed ("bill"). A bill with no record yet, or one that cannot be
        read, gives way to :meth:`status`'s rate (see the module docstring)."""
        params: dict[str, Any] = {"podId": allocation.ref, "bucketSize": "hour"}
        started = parse_iso_or_none(allocation.started)
        if started is not None:
            if started.tzinfo is None:
                started = started.replace(tzinfo=timezone.utc)
            hour = started.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
            params["startTime"] = hour.strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            _, body = self._api.request("GET", "/v2/billing/pods", operation="spend", params=params)
            with self._api.reading("GET /v2/billing/pods"):
                records = [r for r in need(body, "records", list)
                           if need(r, "podId", str, where="records[]") == allocation.ref]
                total = sum(float(need(r, "totalAmount", NUMBER, where="records[]")) for r in records)
        except ComputeError as exc:
            self._api.log.info("runpod: the bill of pod %s could not be read (%s); using its rate", allocation.ref,
                               exc)
            records, total = [], 0.0
        if records:
            return total, "bill"
        try:
            return super().spend(allocation)
        except ComputeError:
            return None, None

    def terminate(self, allocation: Allocation) -> None:
        """``DELETE /v2/pods/{id}``, tried until RunPod confirms; a pod that is already gone (404)
        is fine."""
        path = f"/v2/pods/{quote(allocation.ref, safe='')}"
        with self._releasing(allocation, "pod"):
            self._api.request("DELETE", path, operation="terminate", ok=(200, 204), allow=(404,))

    # -- helpers --------------------------------------------------------------------------

    def _gpu_type(self, offer: Offer) -> str:
        gpu_id = offer.extra.get("gpu_type_id")
        if not isinstance(gpu_id, str) or not gpu_id:
            raise LaunchFailed(f"offer {offer.id} carries no RunPod GPU type id; list offers again",
                               provider=self.name, offer=offer.id)
        return gpu_id

    def _graphql(self, query: str, variables: dict[str, Any] | None, *, operation: str,
                 secrets: Any = ()) -> Any:
        """POST to ``/graphql``; GraphQL reports errors with HTTP 200 and an ``errors`` list."""
        secrets = tuple(secrets)
        payload: dict[str, Any] = {"query": query}
        if variables is not None:
            payload["variables"] = variables
        # an absolute URL: httpx sends it as is, past the REST base
        _, body = self._api.request("POST", self.graphql_url, operation=operation, json_body=payload,
                                    secrets=secrets)
        with self._api.reading("POST /graphql"):
            errors = opt(body, "errors", list)
            if errors:
                messages = [m for e in errors if isinstance(e, dict) and isinstance(m := e.get("message"), str)]
                raise _graphql_error(self._api, operation, "; ".join(messages) or "unspecified error", secrets)
            return need(body, "data", dict)


def _graphql_error(api: ApiClient, operation: str, message: str, secrets: tuple[str, ...]) -> ComputeError:
    text = f"runpod GraphQL refused the {operation}: {api.scrub(message, secrets)}"
    if matches(NO_CAPACITY, message):
        return NoCapacity(text, provider="runpod")
    if matches(QUOTA, message):
        return QuotaExceeded(text, provider="runpod")
    if matches(AUTH, message):
        return AuthError(text, provider="runpod", hint=f"check {KEY_ENV}: the key is wrong, expired, or lacks "
                         "this permission")
    if operation == "launch":
        return LaunchFailed(text, provider="runpod")
    return ProviderUnavailable(text, provider="runpod")


def _ssh_endpoint(pod: dict[str, Any]) -> SshEndpoint | None:
    """``ssh.direct`` if set, else a public mapping of port 22 in ``runtime.ports``."""
    ssh = opt(pod, "ssh", dict, where="pod")
    direct = opt(ssh, "direct", dict, where="ssh") if ssh else None
    if direct:
        return SshEndpoint(need(direct, "host", str, where="ssh.direct"), need(direct, "port", int, where="ssh.direct"),
                           opt(direct, "username", str) or "root")
    runtime = opt(pod, "runtime", dict, where="pod")
    for port in (opt(runtime, "ports", list) or []) if runtime else []:
        if not isinstance(port, dict) or port.get("private") != 22:
            continue
        public, ip = opt(port, "public", int, where="runtime.ports[]"), opt(port, "ip", str, where="runtime.ports[]")
        if public and ip and port.get("type", "tcp") == "tcp":
            return SshEndpoint(ip, public, "root")
    return None
