"""A RunPod twin: REST v2 (``/v2/catalog/gpus``, ``/v2/account/ssh-keys``, ``/v2/pods``) and the
GraphQL calls ``jupyter_portable.compute.runpod`` makes (``gpuTypes``, ``podRentInterruptable``,
``podFindAndDeployOnDemand``).

Pods go PROVISIONING -> STARTING -> RUNNING over the boot delay; ``ssh.direct`` and the public
22/tcp mapping in ``runtime.ports`` appear only once the pod's sshd listens. The launch's keys
are the ``PUBLIC_KEY`` env (what RunPod images install for root), which replaces the account's
keys (the document says so); without it, ``startSsh`` installs the account's keys. A sold-out GPU
answers createPod with RunPod's 400 "no longer any instances available"; a killed pod reports
ERROR (EXITED for an interruptible one, as when outbid), and an EXITED pod's ``cost`` reads 0.0.

Interruptible pods: ``gpuTypes`` lists each type's ``minimumBidPrice`` (half its on-demand price
here) and ``uninterruptablePrice`` (its on-demand price), per GPU; ``podRentInterruptable`` refuses
a ``bidPerGpu`` under the minimum, and a spot pod costs its bid (``costPerHr``, the pod's ``cost``
and the bill). :meth:`RunPodTwin.outbid` raises the market: every running spot pod whose bid is
under the new price is stopped (EXITED), as RunPod stops the lowest bidders first.

Public IPs: a pod launched over GraphQL lands on a host with a public IP only when it asks
(``supportPublicIp``); without one it has no direct SSH (RunPod's proxy alone). REST v2 has no such
field: a secure-cloud pod it creates has a public IP, a community one has none.
``podFindAndDeployOnDemand``'s ``$input`` is checked against the shape RunPod's client
(runpod-python's ``create_pod``) gives it (``tests/contract/schemas/runpod.json``): an unknown or
mistyped field, or a missing required one, is refused as GraphQL refuses a variable (HTTP 200,
``errors``) and recorded in :attr:`violations`.

The bill (``GET /v2/billing/pods``) has one record per pod per hour: GPU at the pod's price from
its creation until it exited or was deleted, and its container disk at $0.10/GB-month while it
exists (:data:`DISK_PER_GB_MONTH`).

    with RunPodTwin(tmp_path, offers=[TwinOffer(stock=1)], boot_delay_s=0.2) as twin:
        provider = RunPodProvider(**twin.provider_kwargs())   # or os.environ.update(twin.env())
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from twins.server import Refused, Rental, Reply, Twin, TwinOffer, ceil_seconds, public_keys

NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")
DISK_PER_GB_MONTH = 0.10  # RunPod's pricing page: container disk
HOURS_PER_MONTH = 30 * 24


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
    launch_ops = frozenset({"createPod", "graphql.podRentInterruptable", "graphql.podFindAndDeployOnDemand"})
    machine_key_ops = frozenset({"podAction"})  # a pod's own RUNPOD_API_KEY acts on that pod alone

    def __init__(self, *args: Any, account_keys: list[str] | None = None, sshless_images: Iterable[str] = (),
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.account_keys = list(account_keys or [])
        # custom images without RunPod's sshd convention: their pods run, 22/tcp is mapped, nothing listens
        self.sshless_images = frozenset(sshless_images)

    def on_started(self, rental: Rental) -> None:
        machine = rental.machine
        if machine is not None and rental.extra.get("image") in self.sshless_images:
            machine.sshd.proc.terminate()  # the container runs; nothing in it starts sshd
            machine.sshd.proc.wait(5)

    def phase(self, rental: Rental) -> str:
        phase = super().phase(rental)
        if phase == "starting" and rental.machine is not None and rental.extra.get("image") in self.sshless_images:
            return "up"  # RUNNING, 22/tcp mapped, and nothing listening behind it
        return phase

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
            if "podFindAndDeployOnDemand" in query:
                return "graphql.podFindAndDeployOnDemand", {}
            if "gpuTypes" in query:
                return "graphql.gpuTypes", {}
            return None
        return super().route(method, path, content)

    def machine_env(self, rental: Rental) -> dict[str, str]:
        """What every pod's processes have: its id and a key scoped to it (RunPod's pod-scoped key)."""
        return {"RUNPOD_POD_ID": rental.ref, "RUNPOD_API_KEY": self.machine_key(rental.ref)}

    # -- errors ----------------------------------------------------------------------------

    def forbidden(self, op_id: str | None) -> Reply:
        return _problem(403, "Forbidden", "This API key is not allowed to act on this pod.")

    def unauthorized(self, op_id: str | None) -> Reply:
        return Reply(401, {"title": "Unauthorized", "status": 401,
                           "detail": "The bearer token is missing, malformed, expired, or invalid."},
                     undocumented=op_id is None or op_id.startswith("graphql."))

    def invalid(self, op_id: str, errors: list[str]) -> Reply:
        if op_id.startswith("graphql."):  # GraphQL refuses a variable its type does not admit, before running
            return Reply(200, {"errors": [{"message": f'Variable "$input" got invalid value: {e}'} for e in errors],
                               "data": None})
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
            return "EXITED" if rental.extra.get("spot") or rental.extra.get("stopped") else "ERROR"
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
        if up and rental.machine is not None and rental.extra.get("public_ip", True):
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
                "template": None, "cost": 0.0 if status in ("EXITED", "TERMINATED") else self.price(rental),
                "locked": False, "runtime": runtime,
                "createdAt": rental.created_iso, "startedAt": rental.created_iso if status == "RUNNING" else None,
                "globalNetworking": {"enabled": False}}

    def price(self, rental: Rental) -> float:
        """What the pod costs per hour: its bid for every GPU if interruptible, else its offer's price."""
        bid = rental.extra.get("bid_per_gpu")
        return float(bid) * int(rental.extra.get("gpu_count", 1)) if bid is not None else rental.offer.price

    @staticmethod
    def minimum_bid(offer: TwinOffer) -> float:
        """The lowest bid per GPU an interruptible pod of ``offer``'s type is rented for."""
        return round(offer.price / offer.count / 2, 4)

    def outbid(self, per_gpu: float) -> list[str]:
        """Another renter bids ``per_gpu``: the running spot pods bidding less are stopped; their ids."""
        with self.lock:
            losers = [r.ref for r in self.rentals.values() if r.extra.get("spot") and not r.deleted
                      and not r.killed and float(r.extra.get("bid_per_gpu") or 0) < per_gpu]
        for ref in losers:
            self.kill(ref, "outbid")
        return losers

    def _keys(self, env: dict[str, Any], start_ssh: Any) -> list[str]:
        """The pod's login keys: ``PUBLIC_KEY`` replaces the account's keys; without it, ``startSsh``
        installs those."""
        if env.get("PUBLIC_KEY"):
            return public_keys(str(env["PUBLIC_KEY"]))
        return list(self.account_keys) if start_ssh else []

    def bill(self, rental: Rental, until: datetime | None = None, bucket: str = "hour") -> list[dict[str, Any]]:
        """The pod's billing records, one per ``bucket`` (hour, else day) it existed in."""
        now = until or self.wall()
        end = rental.deleted_at or now
        stops = rental.extra.get("spot") or rental.extra.get("stopped")  # a stopped pod bills its disk alone
        gpu_end = min(t for t in (rental.killed_at if stops else None, end) if t is not None)
        disk_gb = float(rental.extra.get("disk") or 20)
        records = []
        hour = rental.created_at.replace(minute=0, second=0, microsecond=0)
        if bucket != "hour":
            hour = hour.replace(hour=0)
        while hour < end:
            nxt = hour + timedelta(hours=1 if bucket == "hour" else 24)

            def within(a: datetime, b: datetime, hour: datetime = hour, nxt: datetime = nxt) -> float:
                return max(0.0, (min(b, nxt) - max(a, hour)).total_seconds()) / 3600

            gpu = self.price(rental) * within(rental.created_at, gpu_end)
            disk = disk_gb * DISK_PER_GB_MONTH / HOURS_PER_MONTH * within(rental.created_at, end)
            records.append({"startTime": _iso(hour), "endTime": _iso(nxt), "podId": rental.ref,
                            "totalAmount": gpu + disk, "gpuAmount": gpu, "cpuAmount": 0.0, "diskAmount": disk})
            hour = nxt
        return records

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
        keys = self._keys(env, body.get("startSsh"))
        cloud = body.get("cloud", "SECURE")
        rental = self.rent(offer, self.new_ref(), name=body["name"], keys=keys, image=body.get("image", ""),
                           disk=body.get("disk", 20), env=env, ports=body.get("ports", []), cloud=cloud,
                           # v2 cannot ask for a public IP: a community host without one gives no direct SSH
                           public_ip=cloud != "COMMUNITY")
        return Reply(201, self._pod(rental))

    def op_getPod(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        return Reply(200, self._pod(self._rental(params["id"])))

    def op_listPods(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        return Reply(200, {"pods": [self._pod(r) for r in self.listed()]})

    def op_deletePod(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        rental = self._rental(params["id"])
        if not self.delete(rental):
            raise Refused(Reply(500, {"title": "Internal Server Error", "status": 500,
                                      "detail": "something went wrong deleting the pod; try again"}))
        return Reply(204)

    def op_podAction(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        rental = self._rental(params["id"])
        action = body["action"]
        if action not in self._pod(rental)["actions"]:
            raise Refused(_problem(409, "Conflict", f"cannot {action} a pod that is {self._status(rental)}"))
        if action == "terminate":
            self.delete(rental)
            return Reply(204)
        if action != "stop":
            raise Refused(_problem(409, "Conflict", f"the twin does not {action} pods"))
        rental.extra["stopped"] = True
        rental.killed, rental.killed_at = "stopped", self.wall()
        rental.offer.stock += 1  # a stopped pod gives its GPU back
        reply = Reply(200, self._pod(rental))
        # the container stops once the answer is on its way (the caller may run on the pod itself)
        threading.Timer(0.2, self._stop_machine, args=(rental,)).start()
        return reply

    def _stop_machine(self, rental: Rental) -> None:
        self._wait_started(rental)
        if rental.machine is not None:
            rental.machine.kill()

    def op_listPodBilling(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        if "lastN" in query and ("startTime" in query or "endTime" in query):
            raise Refused(_problem(400, "Bad Request", "lastN is mutually exclusive with startTime/endTime"))
        start = _parse(query.get("startTime")) or self.wall() - timedelta(days=30)
        end = _parse(query.get("endTime")) or self.wall()
        bucket = str(query.get("bucketSize", "day"))
        # the window snaps to whole buckets, as the document says
        start = start.replace(minute=0, second=0, microsecond=0) if bucket == "hour" else start.replace(
            hour=0, minute=0, second=0, microsecond=0)
        records = [r for rental in self.rentals.values() if query.get("podId") in (None, rental.ref)
                   for r in self.bill(rental, bucket=bucket) if start <= (_parse(r["startTime"]) or start) < end]
        totals = {k: sum(r[k] for r in records) for k in ("totalAmount", "gpuAmount", "cpuAmount", "diskAmount")}
        return Reply(200, {"records": records, "metadata": {
            "query": {"startTime": _iso(start), "endTime": _iso(end), "bucketSize": bucket,
                      "podId": query.get("podId")},
            "recordCount": len(records), "uniquePodCount": len({r["podId"] for r in records}), "totals": totals}})

    def op_graphql_gpuTypes(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        types = []
        for offer in self.offers:
            level = self._level(offer, 1)
            types.append({"id": offer.gpu, "displayName": offer.model, "memoryInGb": round(offer.memory_mb / 1024),
                          "secureCloud": True, "communityCloud": True,
                          "lowestPrice": {"minimumBidPrice": self.minimum_bid(offer),
                                          "uninterruptablePrice": offer.price / offer.count,
                                          "stockStatus": None if level == "NONE" else level}})
        return Reply(200, {"data": {"gpuTypes": types}})

    def op_graphql_podRentInterruptable(self, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        spec = ((body.get("variables") or {}).get("input")) or {}
        offer = self._offer(str(spec.get("gpuTypeId", "")),
                            [spec["dataCenterId"]] if spec.get("dataCenterId") else None)
        if offer is None or offer.stock <= 0:
            return Reply(200, {"errors": [{"message": NO_CAPACITY}], "data": None})
        bid = spec.get("bidPerGpu")
        if not isinstance(bid, (int, float)) or bid < self.minimum_bid(offer):
            return Reply(200, {"errors": [{"message": f"Your bid price is below the minimum bid price of "
                                                      f"{self.minimum_bid(offer)}."}], "data": None})
        env = {e.get("key"): e.get("value") for e in spec.get("env") or [] if isinstance(e, dict)}
        keys = self._keys(env, spec.get("startSsh"))
        rental = self.rent(offer, self.new_ref(), name=str(spec.get("name", "")), keys=keys,
                           image=spec.get("imageName", ""), disk=spec.get("containerDiskInGb", 20), env=env,
                           ports=[p for p in str(spec.get("ports", "")).split(",") if p], spot=True,
                           cloud=spec.get("cloudType", "SECURE"), bid_per_gpu=float(bid),
                           gpu_count=int(spec.get("gpuCount") or 1),
                           # GraphQL's launches place a pod on a host with a public IP only when asked
                           # (supportPublicIp); without one its SSH is RunPod's proxy alone, no direct TCP
                           public_ip=spec.get("supportPublicIp") is True)
        return Reply(200, {"data": {"podRentInterruptable": {"id": rental.ref, "desiredStatus": "RUNNING",
                                                             "costPerHr": self.price(rental)}}})

    def op_graphql_podFindAndDeployOnDemand(self, params: dict[str, str], query: dict[str, Any],
                                            body: Any) -> Reply:
        spec = body["variables"]["input"]  # its shape was checked against the client's (schemas.py)
        count = int(spec.get("gpuCount") or 1)
        offer = self._offer(spec["gpuTypeId"], [spec["dataCenterId"]] if spec.get("dataCenterId") else None)
        allowed = spec.get("allowedCudaVersions")
        if (offer is None or offer.stock <= 0 or count > offer.count
                or (allowed and not any(_version(offer.cuda)[:2] == _version(v)[:2] for v in allowed))):
            return Reply(200, {"errors": [{"message": NO_CAPACITY}], "data": None})
        env = {e["key"]: e["value"] for e in spec.get("env") or []}
        rental = self.rent(offer, self.new_ref(), name=spec["name"], keys=self._keys(env, spec.get("startSsh")),
                           image=spec["imageName"], disk=spec.get("containerDiskInGb", 20), env=env,
                           ports=[p for p in str(spec.get("ports", "")).split(",") if p], cloud=spec["cloudType"],
                           gpu_count=count, public_ip=spec.get("supportPublicIp") is True)
        return Reply(200, {"data": {"podFindAndDeployOnDemand": {"id": rental.ref, "desiredStatus": "RUNNING",
                                                                 "costPerHr": self.price(rental)}}})


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
