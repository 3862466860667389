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

The search is sent as Vast's official client (``vastai`` 1.9.x) sends it: its default filters
(verified, not external, rentable, not rented), then what the requirements pin: ``gpu_name`` (each
wanted model expanded to the exact names Vast lists, :data:`GPU_NAMES`), ``num_gpus``, memory,
price, ``driver_version`` as the client's zero-padded number (:func:`numeric_driver`),
``cuda_max_good``, and ``compute_cap`` from the CUDA floor (a CUDA release builds for GPUs of
:data:`MIN_COMPUTE_CAP` and up, whatever CUDA the host's driver reports). SSH is direct, so only
hosts with a direct port are asked for (``direct_port_count >= 1``). It has no cursor, so results
are paged by the sort key: the next page asks for ``dph_total`` from the last price on, leaving out
the asks already seen at that price, until a page comes back short or ``max_offers`` are listed.

The launch's ``env`` is a JSON object (``{"KEY": "value"}``), as Vast's guide says and its official
client sends (the document's Docker-flag string is what that client turns into the object).

Spend is the bill: ``GET /api/v0/charges/`` (per instance: GPU, disk, and bandwidth each way, which
Vast bills per GB; time before the instance ran is not charged). Until the charges list the
instance, the provider's rate (``dph_total`` x time since ``start_date``) stands in.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import httpx

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
from jupyter_portable.compute.config import VAST_API, VAST_IMAGE, PortableVast
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
    spend_since,
)
from jupyter_portable.core.errors import (
    AuthError,
    ComputeError,
    LaunchFailed,
    NoCapacity,
    QuotaExceeded,
)
from jupyter_portable.core.offers import Offer, Requirements
from jupyter_portable.core.times import parse_iso_or_none, to_iso, utcnow

API = VAST_API
KEY_ENV = "VAST_API_KEY"
URL_ENV = "VAST_API_URL"  # a proxy, or a twin in tests; the constructor's base_url wins
DEFAULT_IMAGE = VAST_IMAGE

NO_ASK = re.compile(r"no_such_ask|no such ask|(?:is )?(?:no longer|not) available", re.I)
AUTH = re.compile(r"invalid user key|auth_error|unauthori[sz]ed|invalid api key", re.I)
QUOTA = re.compile(r"insufficient (?:credit|balance|funds)|low_credit|quota", re.I)

# gpu_name as Vast's search reports it (and matches it: exactly). A wanted model is matched
# against these as a case-insensitive substring, as routing matches offers, so "H100" asks
# for all three H100 variants; a model none of them contains is sent as written.
GPU_NAMES = (
    "A10", "A100 PCIE", "A100 SXM4", "A100X", "A40", "A800 PCIE", "B200", "GH200 SXM", "H100 NVL", "H100 PCIE",
    "H100 SXM", "H200", "H200 NVL", "L4", "L40", "L40S", "Q RTX 8000", "RTX 3080", "RTX 3090", "RTX 3090 Ti",
    "RTX 4000Ada", "RTX 4070 Ti", "RTX 4080", "RTX 4080S", "RTX 4090", "RTX 5000Ada", "RTX 5090", "RTX 6000Ada",
    "RTX A4000", "RTX A5000", "RTX A6000", "RTX PRO 6000 WS", "Tesla T4", "Tesla V100",
)
CUDA = re.compile(r"\A\s*v?(\d+)(?:\.(\d+))?(?:\.\d+)*\s*\Z")
DRIVER = re.compile(r"\A\s*(\d{1,3})(?:\.(\d{1,3}))?(?:\.(\d{1,3}))?\s*\Z")
# The least compute capability (x 100, as Vast's compute_cap) each CUDA major release builds for:
# CUDA 11 dropped Kepler below 3.5, CUDA 12 Kepler, CUDA 13 Maxwell, Pascal and Volta (NVIDIA's notes).
MIN_COMPUTE_CAP = {11: 350, 12: 500, 13: 750}
# a container that stays "created" with one of these in status_msg never starts: its runtime refused it
RUNTIME_ERROR = re.compile(r"\berror\b|failed|unsatisfied|oci runtime|exec format|no such (?:image|file)"
                           r"|unable to|cannot|denied", re.I)

# actual_status values from Vast's docs. "exited": the container ended. "unknown" is "no recent
# heartbeat from the host" and "offline" is computed from it: they say nothing of the instance, and
# are "unknown" here (a loss only on core.reachability's rule); the docs' note that they never reach
# running is about starting, where acquiring gives up on them.
PENDING = {"loading", "created", "scheduling", "rebooting"}
STOPPED = {"stopped", "frozen"}
DEAD = {"exited"}
SILENT = {"unknown", "offline"}


def gpu_names(wanted: tuple[str, ...] | list[str]) -> list[str]:
    """The exact ``gpu_name`` values to search for ``wanted`` models (see :data:`GPU_NAMES`)."""
    out: list[str] = []
    for model in wanted:
        text = " ".join(model.replace("_", " ").split())
        if not text:
            continue
        found = [name for name in GPU_NAMES if text.lower() in name.lower()] or [text]
        out += [name for name in found if name not in out]
    return out


def numeric_driver(version: str) -> dict[str, int] | None:
    """The ``driver_version`` filter for ``version`` as Vast's client sends it: each part zero-padded
    to three digits, one number ("550.54.15" -> ``{"eq": 550054015}``); a version without its last
    parts is the range of them ("550.54" -> 550054000..550054999). None when it is not a version."""
    m = DRIVER.match(version)
    if not m:
        return None
    parts = [int(p) for p in m.groups() if p is not None]
    low = int("".join(f"{p:03d}" for p in parts + [0] * (3 - len(parts))))
    if len(parts) == 3:
        return {"eq": low}
    return {"gte": low, "lte": low + 10 ** (3 * (3 - len(parts))) - 1}


def min_compute_cap(cuda: str | None) -> int | None:
    """The least ``compute_cap`` a CUDA ``MAJOR.MINOR`` floor can use (:data:`MIN_COMPUTE_CAP`), or None."""
    m = CUDA.match(cuda or "")
    if not m:
        return None
    major = int(m[1])
    known = [k for k in MIN_COMPUTE_CAP if k <= major]
    return MIN_COMPUTE_CAP[max(known)] if known else None


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
    ``limit`` is how many offers one search page asks for, ``max_offers`` how many are
    listed in all (cheapest first). The API base is ``base_url``, else ``$VAST_API_URL``, else
    the real one."""

    name = "vastai"

    def __init__(self, api_key: str | None = None, *, default_image: str = DEFAULT_IMAGE, disk_gb: int = 50,
                 limit: int = 64, max_offers: int = 512, base_url: str | None = None, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, transport: httpx.BaseTransport | None = None,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.now = now  # the wall clock spend so far is counted to
        self.default_image = default_image
        self.disk_gb = disk_gb
        self.limit = max(1, limit)
        self.max_offers = max(1, max_offers)
        self._api = ApiClient(provider=self.name, base_url=base_url or PortableVast().api_url or API,
                              key=key_from(api_key, KEY_ENV), key_env=KEY_ENV,
                              key_hint="create one at https://cloud.vast.ai/manage-keys/", classify=_classify,
                              timeout=timeout, retries=retries, backoff=backoff, sleep=sleep, clock=clock,
                              transport=transport)

    # -- check 1: listed ------------------------------------------------------------------

    def search_query(self, requirements: Requirements | None = None) -> dict[str, Any]:
        """The first page's bundles query for ``requirements``: the client's default filters, hosts
        with a direct port, the GPU models, count, driver and CUDA asked for, cheapest first."""
        req = requirements or Requirements()
        query: dict[str, Any] = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                                 "rented": {"eq": False}, "direct_port_count": {"gte": 1},
                                 "num_gpus": {"gte": max(1, req.gpu_count)}, "order": [["dph_total", "asc"]],
                                 "limit": self.limit, "allocated_storage": self.disk_gb}
        names = gpu_names(req.gpus)
        if names:
            query["gpu_name"] = {"in": names}
        if req.min_gpu_memory_gb:
            query["gpu_ram"] = {"gte": round(req.min_gpu_memory_gb * 1000)}
        driver = numeric_driver(req.driver) if req.driver else None
        if driver:
            query["driver_version"] = driver
        cuda = CUDA.match(req.min_cuda or "")
        if cuda:
            # cuda_max_good is a float (12.4); MAJOR.MINOR is compared as one
            query["cuda_max_good"] = {"gte": float(f"{int(cuda[1])}.{int(cuda[2] or 0)}")}
            capability = min_compute_cap(req.min_cuda)
            if capability:
                query["compute_cap"] = {"gte": capability}
        if req.max_price_per_hour is not None:
            query["dph_total"] = {"lte": req.max_price_per_hour}
        return query

    def offers(self, requirements: Requirements | None = None) -> list[Offer]:
        """Rentable asks matching ``requirements``, one offer per ask (one machine), page by page."""
        first = self.search_query(requirements)
        query = first
        out: list[Offer] = []
        price_of: dict[int, float] = {}
        while True:
            _, body = self._api.request("POST", "/api/v0/bundles/", operation="offers", json_body=query)
            with self._api.reading("POST /api/v0/bundles/"):
                rows = need(body, "offers", list)
                fresh = 0
                for row in rows:
                    ask = need(row, "id", int, where="offers[]")
                    if ask in price_of:
                        continue  # a page may repeat an ask the last one ended on
                    price_of[ask] = float(need(row, "dph_total", NUMBER, where=f"offers[{ask}]"))
                    fresh += 1
                    offer = self._offer(row)
                    if offer is not None:
                        out.append(offer)
            if len(rows) < self.limit or not fresh or len(price_of) >= self.max_offers:
                return out[:self.max_offers]
            # no cursor: the next page starts at the last price, without the asks seen at it
            last = max(price_of[need(row, "id", int)] for row in rows)
            query = {**first, "dph_total": {**first.get("dph_total", {}), "gte": last},
                     "id": {"notin": sorted(a for a, p in price_of.items() if p == last)}}

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
                   "compute_cap": opt(row, "compute_cap", NUMBER, where=where),
                   "direct_port_count": opt(row, "direct_port_count", NUMBER, where=where),
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
        env = {**(env or {}), ALLOCATION_ENV: allocation_id}
        image = image or self.default_image
        with self._for_offer(offer.id):
            check_env_names(env, self.name)
            # the label is how the instance is found again (machines, a launch whose answer was lost)
            body: dict[str, Any] = {"image": image, "disk": self.disk_gb,
                                    "label": machine_name(allocation_id, env.get(WORKSPACE_ENV)),
                                    "runtype": "ssh_direct", "cancel_unavail": True}
            if env:
                body["env"] = {k: str(v) for k, v in env.items()}  # an object: see the module docstring
            ask = self._ask(offer)
            path = f"/api/v0/asks/{ask}/"
            try:
                _, reply = self._api.request("PUT", path, operation="launch", json_body=body,
                                             secrets=env.values())
            except ComputeError as exc:
                found = self._found_after_lost_answer(exc, allocation_id)
                if found is None:
                    raise
                reply = {"success": True, "new_contract": int(found.ref)}
            with self._api.reading(f"PUT {path}"):
                if need(reply, "success", bool) is not True:
                    raise LaunchFailed(f"vastai did not rent ask {ask}: {opt(reply, 'msg', str) or 'no reason given'}",
                                       provider=self.name)
                instance = str(need(reply, "new_contract", int))
            allocation = Allocation(allocation_id=allocation_id, provider=self.name, offer_id=offer.id, ref=instance,
                                    started=to_iso(self.now(), "seconds"), details={"ask_id": ask, "image": image,
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
        exited, or stopped when it was meant to run, is lost; unknown/offline (the host sent no recent
        heartbeat) is unknown. ``spend``: Vast's
        ``dph_total`` ($/h, storage included) from its ``start_date``."""
        path = f"/api/v0/instances/{quote(allocation.ref, safe='')}/"
        status, body = self._api.request("GET", path, operation="status", allow=(404,))
        if status == 404:
            return AllocationStatus("lost", reason="vastai no longer knows this instance")
        with self._api.reading(f"GET {path}"):
            inst = need(body, "instances", (dict, type(None)))
            if inst is None:
                return AllocationStatus("lost", reason="vastai no longer lists this instance")
            st = self._state(inst)
            _, st.spend = self._spend(inst)
            st.spend_source = "provider-rate" if st.spend is not None else None
            return st

    def spend(self, allocation: Allocation) -> tuple[float | None, str | None]:
        """The bill: the instance's row of ``GET /api/v0/charges/`` (``source`` ``instance-<id>``; the
        ``day`` window from the day before its launch to now), its ``amount`` ("bill"). Until the
        charges list it, or when they cannot be read, :meth:`status`'s rate."""
        started = parse_iso_or_none(allocation.started)
        now = self.now().timestamp()
        since = (started.replace(tzinfo=started.tzinfo or timezone.utc).timestamp() if started else now) - 86400
        filters = {"day": {"gte": int(since), "lte": int(now) + 1}, "type": {"in": ["instance"]}}
        params: dict[str, Any] = {"select_filters": json.dumps(filters, separators=(",", ":")), "limit": 500}
        wanted = f"instance-{allocation.ref}"
        try:
            for _ in range(100):  # a bound on pages, should the provider loop
                _, body = self._api.request("GET", "/api/v0/charges/", operation="spend", params=params)
                with self._api.reading("GET /api/v0/charges/"):
                    for row in need(body, "results", list):
                        if opt(row, "source", str, where="results[]") == wanted:
                            return float(need(row, "amount", NUMBER, where=wanted)), "bill"
                    token = opt(body, "next_token", str)
                if not token:
                    break
                params["after_token"] = token
        except ComputeError as exc:
            self._api.log.info("vastai: the charges of instance %s could not be read (%s); using its rate",
                               allocation.ref, exc)
        try:
            return super().spend(allocation)
        except ComputeError:
            return None, None

    def _spend(self, inst: dict[str, Any]) -> tuple[float | None, float | None]:
        start = opt(inst, "start_date", NUMBER)
        began = datetime.fromtimestamp(float(start), timezone.utc) if start else None
        return spend_since(opt(inst, "dph_total", NUMBER), began, self.now())

    def _state(self, inst: dict[str, Any]) -> AllocationStatus:
        """The state ``inst`` is in (see :meth:`status`)."""
        actual = opt(inst, "actual_status", str)
        intended = opt(inst, "intended_status", str)
        message = opt(inst, "status_msg", str)
        if actual == "created" and message and RUNTIME_ERROR.search(message):
            return AllocationStatus("lost", reason=f"the container was created but could not start: {message}")
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
        if actual in SILENT:
            return AllocationStatus("unknown", ssh=_ssh_endpoint(inst) if actual == "unknown" else None,
                                    reason=f"actual_status is {actual!r}: no recent heartbeat from the host"
                                    + (f" ({message})" if message else ""))
        if actual in DEAD:
            return AllocationStatus("lost", reason=f"actual_status is {actual!r}: it will not reach running"
                                    + (f" ({message})" if message else ""))
        raise ShapeError(f"unknown actual_status {actual!r}")

    def list_machines(self) -> list[MachineInfo]:
        """``GET /api/v1/instances`` (paged by ``next_token``): the instances labelled
        :func:`~.base.machine_name`, with Vast's ``dph_total`` x time since ``start_date``."""
        out: list[MachineInfo] = []
        token: str | None = None
        for _ in range(1000):  # a bound on pages, should the provider loop
            params: dict[str, Any] = {"limit": 25, **({"after_token": token} if token else {})}
            _, body = self._api.request("GET", "/api/v1/instances", operation="list", params=params)
            with self._api.reading("GET /api/v1/instances"):
                for inst in need(body, "instances", list):
                    ids = parse_machine_name(opt(inst, "label", str))
                    if ids is None:
                        continue
                    uptime, spend = self._spend(inst)
                    start = opt(inst, "start_date", NUMBER)
                    out.append(MachineInfo(
                        provider=self.name, ref=str(need(inst, "id", int)), allocation_id=ids[0], workspace_id=ids[1],
                        state=self._state(inst).state, name=opt(inst, "label", str) or "",
                        started=datetime.fromtimestamp(float(start), timezone.utc).isoformat() if start else None,
                        uptime_s=uptime, price_per_hour=opt(inst, "dph_total", NUMBER), spend=spend,
                        spend_source="provider-rate" if spend is not None else None,
                        details={"actual_status": opt(inst, "actual_status", str)}))
                token = opt(body, "next_token", str)
            if not token:
                break
        return out

    def terminate(self, allocation: Allocation) -> None:
        """``DELETE /api/v0/instances/{id}/``, tried until Vast confirms (``success`` not false);
        one that is already gone (404) is fine."""
        path = f"/api/v0/instances/{quote(allocation.ref, safe='')}/"

        def refused(body: Any) -> str | None:
            with self._api.reading(f"DELETE {path}"):
                if opt(body, "success", bool) is False:
                    return (f"vastai did not destroy instance {allocation.ref}: "
                            f"{opt(body, 'msg', str) or 'no reason given'}")
            return None

        with self._releasing(allocation, "instance"):
            self._api.request("DELETE", path, operation="terminate", allow=(404,), confirm=refused)

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
