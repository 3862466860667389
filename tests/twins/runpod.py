"""A RunPod twin: REST v2 (``/v2/catalog/gpus``, ``/v2/account/ssh-keys``, ``/v2/pods``) and the
GraphQL calls ``jupyter_portable.compute.runpod`` makes (``gpuTypes``, ``podRentInterruptable``).

Pods go PROVISIONING -> STARTING -> RUNNING over the boot delay; ``ssh.direct`` and the public
22/tcp mapping in ``runtime.ports`` appear only once the pod's sshd listens. The launch's keys
are the ``PUBLIC_KEY`` env (what RunPod images install for root) and, with ``startSsh``, the
account's keys. A sold-out GPU answers createPod with RunPod's 400 "no longer any instances
available"; a killed pod reports ERROR (EXITED for an interruptible one, as when outbid).

    with RunPodTwin(tmp_path, offers=[TwinOffer(stock=1)], boot_delay_s=0.2) as twin:
        provider = RunPodProvider(**twin.provider_kwargs())   # or os.environ.update(twin.env())
"""

from __future__ import annotations

import json
import re
from typing import Any

from twins.server import Refused, Rental, Reply, Twin, TwinOffer, ceil_seconds, public_keys

NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")


def _problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> Reply:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return Reply(status, body)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


class RunPodTwin(Twin):
    """RunPod on loopback. ``account_keys``: SSH keys saved in the account (installed with startSsh)."""

    provider = "runpod"
    key_env = "RUNPOD_API_KEY"
    url_env = "RUNPOD_API_URL"
    error_schema = {"type": "object", "required": ["title", "status", "detail"],
                    "properties": {"title": {"type": "string"}, "status": {"type": "integer"},
                                   "detail": {"type": "string"}}}
    launch_ops = frozenset({"createPod", "graphql.podRentInterruptable"})

    def __init__(self, *args: Any, account_keys: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.account_keys = list(account_keys or [])

    def env(self) -> dict[str, str]:
        return {**super().env(), "RUNPOD_GRAPHQL_URL": f"{self.url}/graphql"}

    def provider_kwargs(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "base_url": self.url, "graphql_url": f"{self.url}/graphql"}

    # -- routing: REST by the document, GraphQL by its query -------------------------------

    def route(self, method: str, path: str, content: bytes) -> tuple[str, dict[str, str]] | None:
        if method == "POST" and path.rstrip("/") == "/graphql":
            try:
                query = str(json.loads(content).get("query", ""))
            except (ValueError, AttributeError):
                query = ""
            if "podRentInterruptable" in query:
                return "graphql.podRentInterruptable", {}
            if "gpuTypes" in query:
                return "graphql.gpuTypes", {}
            return None
        return super().route(method, path, content)

    # -- errors ----------------------------------------------------------------------------

    def unauthorized(self, op_id: str | None) -> Reply:
        return Reply(401, {"title": "Unauthorized", "status": 401,
                           "detail": "The bearer token is missing, malformed, expired, or invalid."},
                     undocumented=op_id is None or op_id.startswith("graphql."))

    def invalid(self, op_id: str, errors: list[str]) -> Reply:
        if op_id == "createPod":
            return _problem(422, "Unprocessable Entity", "The request body failed validation.", errors)
        return _problem(400, "Bad Request", "; ".join(errors))

    def rate_limited(self, op_id: str | None, wait_s: float) -> Reply:
        wait = ceil_seconds(wait_s)
        return Reply(429, {"title": "Too Many Requests", "status": 429,
                           "detail": "Rate limit exceeded for window minute."},
                     headers={"Retry-After": str(wait), "RateLimit": f'"minute";r=0;t={wait}'},
                     undocumented=op_id is None or op_id.startswith("graphql."))

    def rate_headers(self) -> dict[str, str]:
        if not self.rate:
            return {}
        return {"RateLimit-Policy": f'"minute";q={max(1, round(self.rate * 60))};w=60'}

    # -- the catalog -----------------------------------------------------------------------

    def _level(self, offer: TwinOffer, count: int) -> str:
        if offer.stock <= 0 or count > offer.count:
            return "NONE"
        return "HIGH" if offer.stock >= 3 else "LOW"

    def _gpu_type(self, offer: TwinOffer, count: int) -> dict[str, Any]:
        level = self._level(offer, count)
        return {"id": offer.gpu, "name": offer.model, "pool": None, "manufacturer": "NVIDIA",
                "memory": round(offer.memory_mb / 1024), "secure": True, "community": True,
                "price": {"secure": offer.price / offer.count, "community": offer.price / offer.count},
                "maxCount": {"secure": offer.count, "community": offer.count}, "availability": level,
                "dataCenters": [{"id": offer.region, "name": offer.region, "availability": level}],
                "cudaVersions": [{"version": offer.cuda, "available": True}]}

    def _offer(self, gpu_id: str, data_centers: list[str] | None = None) -> TwinOffer | None:
        found = [o for o in self.offers if o.gpu == gpu_id and (not data_centers or o.region in data_centers)]
        return next((o for o in found if o.stock > 0), found[0] if found else None)

    # -- pods ------------------------------------------------------------------------------

    def _status(self, rental: Rental) -> str:
        phase = self.phase(rental)
        if phase == "killed":
            return "EXITED" if rental.extra.get("spot") else "ERROR"
        if phase == "failed":
            return "ERROR"
        if phase == "booting":
            return "PROVISIONING" if self.clock() - rental.created < self.boot_delay_s / 2 else "STARTING"
        return "RUNNING"

    def _pod(self, rental: Rental) -> dict[str, Any]:
        status = self._status(rental)
        up = status == "RUNNING" and self.phase(rental) == "up" and rental.machine is not None
        direct = None
        runtime = None
        if up and rental.machine is not None:
            host, port = rental.machine.host, rental.machine.port
            direct = {"host": host, "port": port, "username": "root", "command": f"ssh root@{host} -p {port}"}
            runtime = {"uptime": 1, "gpus": [{"util": 0, "memoryUtil": 0}], "cpu": {"util": 0}, "memory": {"util": 0},
                       "ports": [{"private": 22, "public": port, "type": "tcp", "ip": host}]}
        offer = rental.offer
        return {"id": rental.ref, "name": rental.name, "status": status,
                "actions": ["stop", "terminate"] if status != "ERROR" else ["start", "terminate"],
                "image": rental.extra.get("image", ""), "args": "", "disk": rental.extra.get("disk", 20),
                "mounts": {}, "ports": rental.extra.get("ports", []), "env": rental.extra.get("env", {}),
                "registry": None, "gpu": {"id": offer.gpu, "count": offer.count},
                "cloud": rental.extra.get("cloud", "SECURE"), "dataCenterId": offer.region,
                "cudaVersion": offer.cuda if up else None, "ssh": {"proxy": None, "direct": direct},
                "template": None, "cost": offer.price, "locked": False, "runtime": runtime,
                "createdAt": rental.created_iso, "startedAt": rental.created_iso if status == "RUNNING" else None,
                "globalNetworking": {"enabled": False}}

    def _rental(self, ref: str) -> Rental:
        rental = self.rentals.get(ref)
        if rental is None or rental.deleted:
            raise Refused(_problem(404, "Not Found", f"pod {ref} not found"))
        return rental

    # -- the operations --------------------------------------------------------------------

    def handle(self, op_id: str, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        with self.lock:
            return getattr(self, "op_" + op_id.replace(".", "_"))(params, query, body)

    def op_listGpuTypes(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        count = int(query.get("count", 1))
        floor = query.get("minCudaVersion")
        gpus = [self._gpu_type(o, count) for o in self.offers
                if not floor or _version(o.cuda) >= _version(str(floor))]
        return Reply(200, {"gpus": gpus})

    def op_getGpuType(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        offer = self._offer(params["id"])
        if offer is None:
            raise Refused(_problem(404, "Not Found", f"GPU type {params['id']} not found"))
        return Reply(200, self._gpu_type(offer, int(query.get("count", 1))))

    def op_getSshKeys(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        return Reply(200, {"keys": list(self.account_keys)})

    def op_createPod(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        gpu = body.get("gpu") or {}
        offer = self._offer(str(gpu.get("id", "")), body.get("dataCenterIds"))
        count = int(gpu.get("count", 1))
        floor = gpu.get("minCudaVersion")
        if (offer is None or offer.stock <= 0 or count > offer.count
                or (floor and _version(offer.cuda) < _version(floor))):
            raise Refused(_problem(400, "Bad Request", NO_CAPACITY))
        env = dict(body.get("env") or {})
        keys = public_keys(env.get("PUBLIC_KEY"))
        if body.get("startSsh"):
            keys += self.account_keys
        rental = self.rent(offer, self.new_ref(), name=body["name"], keys=keys, image=body.get("image", ""),
                           disk=body.get("disk", 20), env=env, ports=body.get("ports", []),
                           cloud=body.get("cloud", "SECURE"))
        return Reply(201, self._pod(rental))

    def op_getPod(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        return Reply(200, self._pod(self._rental(params["id"])))

    def op_listPods(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        return Reply(200, {"pods": [self._pod(r) for r in self.rentals.values() if not r.deleted]})

    def op_deletePod(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        rental = self._rental(params["id"])
        if not self.delete(rental):
            raise Refused(Reply(500, {"title": "Internal Server Error", "status": 500,
                                      "detail": "something went wrong deleting the pod; try again"}))
        return Reply(204)

    def op_graphql_gpuTypes(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        types = []
        for offer in self.offers:
            level = self._level(offer, 1)
            types.append({"id": offer.gpu, "displayName": offer.model, "memoryInGb": round(offer.memory_mb / 1024),
                          "secureCloud": True, "communityCloud": True,
                          "lowestPrice": {"minimumBidPrice": round(offer.price / offer.count / 2, 4),
                                          "uninterruptablePrice": offer.price / offer.count,
                                          "stockStatus": None if level == "NONE" else level}})
        return Reply(200, {"data": {"gpuTypes": types}})

    def op_graphql_podRentInterruptable(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        spec = ((body.get("variables") or {}).get("input")) or {}
        offer = self._offer(str(spec.get("gpuTypeId", "")),
                            [spec["dataCenterId"]] if spec.get("dataCenterId") else None)
        if offer is None or offer.stock <= 0:
            return Reply(200, {"errors": [{"message": NO_CAPACITY}], "data": None})
        env = {e.get("key"): e.get("value") for e in spec.get("env") or [] if isinstance(e, dict)}
        keys = public_keys(env.get("PUBLIC_KEY")) + (self.account_keys if spec.get("startSsh") else [])
        rental = self.rent(offer, self.new_ref(), name=str(spec.get("name", "")), keys=keys,
                           image=spec.get("imageName", ""), disk=spec.get("containerDiskInGb", 20), env=env,
                           ports=[p for p in str(spec.get("ports", "")).split(",") if p], spot=True,
                           cloud=spec.get("cloudType", "SECURE"))
        return Reply(200, {"data": {"podRentInterruptable": {"id": rental.ref, "desiredStatus": "RUNNING",
                                                             "costPerHr": offer.price / 2}}})
