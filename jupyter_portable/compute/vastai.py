"""Vast.ai: a marketplace of hosts; every offer is one machine's "ask".

Offers come from ``POST /api/v0/bundles/`` (Vast's filter format: ``{"field": {"op":
value}}``); renting accepts an ask with ``PUT /api/v0/asks/{id}/``, which answers with the
new instance's id in ``new_contract``; ``GET``/``DELETE /api/v0/instances/{id}/`` read and
destroy it. Paths end in a slash as Vast's own CLI sends them (the OpenAPI document
lists them without).

Each host prices its own bandwidth: ``inet_down_cost`` ($/GB into the machine) becomes
:attr:`Offer.egress_per_gb`, ``inet_up_cost`` ($/GB out, where snapshots go) is kept in
``extra``. ``gpu_ram`` is MB per GPU; it becomes GB by dividing by 1000, as Vast's CLI
converts, so a "24 GB" requirement admits a 24564 MB card.
"""

from __future__ import annotations

import re
import shlex
from typing import Any
from urllib.parse import quote

import httpx

from jupyter_portable.compute.base import Allocation, AllocationStatus, SshEndpoint
from jupyter_portable.compute.http import (
    NUMBER,
    ApiClient,
    ErrorInfo,
    HttpProvider,
    ShapeError,
    check_env_names,
    key_from,
    make_offer,
    matches,
    need,
    opt,
)
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    ProviderUnavailable,
    QuotaExceeded,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import now_iso

API = "https://console.vast.ai"
KEY_ENV = "VAST_API_KEY"
DEFAULT_IMAGE = "vastai/base-image:@vastai-automatic-tag"

NO_ASK = re.compile(r"no_such_ask|no such ask|(?:is )?(?:no longer|not) available", re.I)
AUTH = re.compile(r"invalid user key|auth_error|unauthori[sz]ed|invalid api key", re.I)
QUOTA = re.compile(r"insufficient (?:credit|balance|funds)|low_credit|quota", re.I)

# actual_status values from Vast's docs; the doc warns the last three never reach running.
PENDING = {"loading", "created", "scheduling", "rebooting"}
STOPPED = {"stopped", "frozen"}
DEAD = {"exited", "unknown", "offline"}


def _classify(info: ErrorInfo) -> ComputeError | None:
    """Vast's ``{success, error, msg}`` bodies: matched on ``error`` and ``msg``, since
    an unknown key comes back as a 404 from the search endpoint."""
    body = info.body if isinstance(info.body, dict) else {}
    code, msg, detail = body.get("error"), body.get("msg"), body.get("detail")
    text = next((t for t in (msg, detail, code) if isinstance(t, str) and t), info.text)
    where = f"vastai refused {info.where} (HTTP {info.status})"
    if info.status == 429 or info.status >= 500:
        return None  # the default mapping: ProviderUnavailable
    if info.status == 401 or matches(AUTH, code, msg):
        return AuthError(f"{where}: {text}", provider="vastai", status=info.status,
                         hint=f"check {KEY_ENV}: the key is wrong, expired, or deleted")
    if info.operation in ("launch", "capacity") and (info.status == 410 or matches(NO_ASK, code, msg)):
        return NoCapacity(f"{where}: {text}", provider="vastai", status=info.status, ask_id=body.get("ask_id"))
    if matches(QUOTA, code, msg):
        return QuotaExceeded(f"{where}: {text}", provider="vastai", status=info.status,
                             hint="add credit to the Vast.ai account")
    if info.operation == "launch" and 400 <= info.status < 500 and info.status not in (403, 429):
        return LaunchFailed(f"{where}: {text}", provider="vastai", status=info.status)
    return None


class VastProvider(HttpProvider):
    """Vast.ai instances (Docker containers with direct SSH). ``api_key`` defaults to
    ``$VAST_API_KEY``; ``disk_gb`` is the storage allocated (and priced) per offer;
    ``limit`` caps how many offers one search returns, cheapest first."""

    name = "vastai"

    def __init__(self, api_key: str | None = None, *, default_image: str = DEFAULT_IMAGE, disk_gb: int = 50,
                 limit: int = 64, base_url: str = API, timeout: float = 30.0, retries: int = 2,
                 backoff: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        self.default_image = default_image
        self.disk_gb = disk_gb
        self.limit = limit
        self._api = ApiClient(provider=self.name, base_url=base_url, key=key_from(api_key, KEY_ENV), key_env=KEY_ENV,
                              key_hint="create one at https://cloud.vast.ai/manage-keys/", classify=_classify,
                              timeout=timeout, retries=retries, backoff=backoff, transport=transport)

    # -- check 1: listed ------------------------------------------------------------------

    def search_query(self, requirements: Requirements | None = None) -> dict[str, Any]:
        """The bundles query for ``requirements``: verified, rentable, cheapest first."""
        req = requirements or Requirements()
        query: dict[str, Any] = {"verified": {"eq": True}, "rentable": {"eq": True}, "rented": {"eq": False},
                                 "num_gpus": {"gte": max(1, req.gpu_count)}, "order": [["dph_total", "asc"]],
                                 "limit": self.limit, "allocated_storage": self.disk_gb}
        if req.min_gpu_memory_gb:
            query["gpu_ram"] = {"gte": round(req.min_gpu_memory_gb * 1000)}
        if req.min_cuda:
            try:
                query["cuda_max_good"] = {"gte": float(req.min_cuda)}
            except ValueError:
                pass  # not a plain number: left to unmet(), which compares versions properly
        if req.max_price_per_hour is not None:
            query["dph_total"] = {"lte": req.max_price_per_hour}
        return query

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """Rentable asks matching ``requirements``, one offer per ask (one machine)."""
        _, body = self._api.request("POST", "/api/v0/bundles/", operation="offers",
                                    json_body=self.search_query(requirements))
        with self._api.reading("POST /api/v0/bundles/"):
            out = []
            for row in need(body, "offers", list):
                offer = self._offer(row)
                if offer is not None:
                    out.append(offer)
            return out

    def _offer(self, row: Any) -> Offer | None:
        ask = need(row, "id", int, where="offers[]")
        where = f"offers[{ask}]"
        reliability = opt(row, "reliability2", NUMBER, where=where)
        if reliability is None:
            reliability = opt(row, "reliability", NUMBER, where=where)
        cuda = opt(row, "cuda_max_good", NUMBER, where=where)
        down = opt(row, "inet_down", NUMBER, where=where)
        return make_offer(
            self.name, id=str(ask), gpu=need(row, "gpu_name", str, where=where),
            gpu_count=need(row, "num_gpus", int, where=where),
            gpu_memory_gb=round(float(need(row, "gpu_ram", NUMBER, where=where)) / 1000, 2),
            price_per_hour=float(need(row, "dph_total", NUMBER, where=where)),
            region=opt(row, "geolocation", str, where=where) or "unknown",
            driver=opt(row, "driver_version", str, where=where), cuda=None if cuda is None else f"{cuda:.1f}",
            capacity=0 if opt(row, "rentable", bool, where=where) is False else 1,
            reliability=1.0 if reliability is None else min(1.0, max(0.0, float(reliability))),
            # inet_down is Mb/s as Vast's console shows it (the doc says MB/s): the lower reading
            bandwidth_mbps=float(down) if down and down > 0 else 1000.0,
            egress_per_gb=float(opt(row, "inet_down_cost", NUMBER, where=where) or 0.0),
            extra={"ask_id": ask, "machine_id": opt(row, "machine_id", int, where=where),
                   "upload_per_gb": opt(row, "inet_up_cost", NUMBER, where=where),
                   "storage_per_gb_month": opt(row, "storage_cost", NUMBER, where=where), "disk_gb": self.disk_gb})

    # -- check 2: permitted ---------------------------------------------------------------

    def check_permission(self, offer: Offer) -> None:
        """The key works (``GET /api/v0/users/current/``). Vast has no quota; a rental the
        account's credit cannot cover is refused at launch (QuotaExceeded)."""
        with self._for_offer(offer.id):
            _, body = self._api.request("GET", "/api/v0/users/current/", operation="permission")
            with self._api.reading("GET /api/v0/users/current/"):
                need(body, "id", int)

    # -- check 3: capacity now ------------------------------------------------------------

    def check_capacity(self, offer: Offer) -> int | None:
        """Whether the ask is still rentable (searched by id): 1, or NoCapacity."""
        query = {"id": {"eq": self._ask(offer)}, "verified": {"eq": True}, "rentable": {"eq": True},
                 "rented": {"eq": False}, "limit": 1}
        with self._for_offer(offer.id):
            _, body = self._api.request("POST", "/api/v0/bundles/", operation="capacity", json_body=query)
            with self._api.reading("POST /api/v0/bundles/"):
                found = need(body, "offers", list)
            if not found:
                raise NoCapacity(f"vastai ask {offer.id} ({offer.gpu} x{offer.gpu_count}) is no longer rentable",
                                 provider=self.name, offer=offer.id)
            return 1

    # -- check 4: launched ----------------------------------------------------------------

    def launch(self, offer: Offer, *, allocation_id: str, image: str | None = None,
               ssh_public_key: str | None = None, env: dict[str, str] | None = None) -> Allocation:
        """Accept the ask (``PUT /api/v0/asks/{id}/``, runtype ``ssh_direct``), then attach
        ``ssh_public_key`` to the new instance; if that fails, the instance is destroyed."""
        env = dict(env or {})
        image = image or self.default_image
        with self._for_offer(offer.id):
            check_env_names(env, self.name)
            body: dict[str, Any] = {"image": image, "disk": self.disk_gb, "label": allocation_id,
                                    "runtype": "ssh_direct", "cancel_unavail": True}
            if env:
                # the document types env as a Docker flag string
                body["env"] = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
            ask = self._ask(offer)
            path = f"/api/v0/asks/{ask}/"
            _, reply = self._api.request("PUT", path, operation="launch", json_body=body, secrets=env.values())
            with self._api.reading(f"PUT {path}"):
                if need(reply, "success", bool) is not True:
                    raise LaunchFailed(f"vastai did not rent ask {ask}: {opt(reply, 'msg', str) or 'no reason given'}",
                                       provider=self.name)
                instance = str(need(reply, "new_contract", int))
            allocation = Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=instance,
                                    started=now_iso("seconds"), details={"ask_id": ask, "image": image,
                                                                "price_per_hour": offer.price_per_hour})
            if ssh_public_key:
                self._attach_key(allocation, ssh_public_key)
        return allocation

    def _attach_key(self, allocation: Allocation, key: str) -> None:
        path = f"/api/v0/instances/{quote(allocation.ref, safe='')}/ssh/"
        try:
            self._api.request("POST", path, operation="launch", json_body={"ssh_key": key})
        except ComputeError as exc:
            cleanup = "it was destroyed"
            try:
                self.terminate(allocation)
            except ComputeError as again:
                cleanup = f"destroying it failed too ({again}); destroy instance {allocation.ref} by hand"
            raise LaunchFailed(f"vastai rented instance {allocation.ref} but the SSH key could not be attached "
                               f"({exc}); {cleanup}", provider=self.name) from exc

    # -- lifecycle ------------------------------------------------------------------------

    def status(self, allocation: Allocation) -> AllocationStatus:
        """``GET /api/v0/instances/{id}/``: running with a published SSH port is reachable;
        exited/unknown/offline, or stopped when it was meant to run, is lost."""
        path = f"/api/v0/instances/{quote(allocation.ref, safe='')}/"
        status, body = self._api.request("GET", path, operation="status", allow=(404,))
        if status == 404:
            return AllocationStatus("lost", reason="vastai no longer knows this instance")
        with self._api.reading(f"GET {path}"):
            inst = need(body, "instances", (dict, type(None)))
            if inst is None:
                return AllocationStatus("lost", reason="vastai no longer lists this instance")
            actual = opt(inst, "actual_status", str)
            intended = opt(inst, "intended_status", str)
            message = opt(inst, "status_msg", str)
            if actual is None or actual in PENDING:
                if intended == "stopped":
                    return AllocationStatus("stopped", reason=message)
                return AllocationStatus("pending", reason=message)
            if actual == "running":
                ssh = _ssh_endpoint(inst)
                if ssh is None:
                    return AllocationStatus("running", reason="running, but no SSH port published yet")
                return AllocationStatus("reachable", ssh=ssh)
            if actual in STOPPED:
                if intended == "stopped":
                    return AllocationStatus("stopped", reason=message)
                return AllocationStatus("lost", reason=f"the host {actual} it while it was meant to run "
                                        "(outbid, or the host took it back)")
            if actual in DEAD:
                return AllocationStatus("lost", reason=f"actual_status is {actual!r}: it will not reach running"
                                        + (f" ({message})" if message else ""))
            raise ShapeError(f"unknown actual_status {actual!r}")

    def terminate(self, allocation: Allocation) -> None:
        """``DELETE /api/v0/instances/{id}/``; one that is already gone (404) is fine."""
        path = f"/api/v0/instances/{quote(allocation.ref, safe='')}/"
        status, body = self._api.request("DELETE", path, operation="terminate", allow=(404,))
        if status == 404:
            return
        with self._api.reading(f"DELETE {path}"):
            if opt(body, "success", bool) is False:
                raise ProviderUnavailable(f"vastai did not destroy instance {allocation.ref}: "
                                          f"{opt(body, 'msg', str) or 'no reason given'}", provider=self.name,
                                          hint="try again, or destroy it in the Vast.ai console")

    def _ask(self, offer: Offer) -> int:
        ask = offer.extra.get("ask_id")
        if isinstance(ask, int) and not isinstance(ask, bool):
            return ask
        if offer.id.isdigit():
            return int(offer.id)
        raise LaunchFailed(f"offer {offer.id} is not a Vast.ai ask id; list offers again", provider=self.name,
                           offer=offer.id)


def _ssh_endpoint(inst: dict[str, Any]) -> SshEndpoint | None:
    """The direct mapping of 22/tcp (``ports``, Docker style, as Vast sends it in practice),
    else the ``ssh_host``/``ssh_port`` pair the document names."""
    ports = inst.get("ports")
    ip = opt(inst, "public_ipaddr", str, where="instance")
    if isinstance(ports, dict) and ip and ip.strip():
        bindings = ports.get("22/tcp")
        if isinstance(bindings, list) and bindings and isinstance(bindings[0], dict):
            host_port = bindings[0].get("HostPort")
            if isinstance(host_port, (str, int)) and str(host_port).isdigit():
                return SshEndpoint(ip.strip(), int(host_port), "root")
    host, port = opt(inst, "ssh_host", str, where="instance"), opt(inst, "ssh_port", int, where="instance")
    if host and port:
        return SshEndpoint(host, port, "root")
    return None
