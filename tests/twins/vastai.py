"""A Vast.ai twin: the marketplace search (``POST /api/v0/bundles/``, Vast's filter format), renting
an ask (``PUT /api/v0/asks/{id}/``), attaching an SSH key, reading and destroying instances, the
current user, and the charges (``GET /api/v0/charges/``).

Every unit of an offer's stock is one ask (one host machine); renting it takes it off the
market, destroying the instance puts it back. An ask that is gone answers 410 ``no_such_ask``
(the launch sends ``cancel_unavail``). The launch's ``env`` is an object, as Vast's guide and its
official client send it (a Docker-flag string is refused, 400). ``driver_version`` filters compare
the client's zero-padded number (``driver_vers``), ``compute_cap`` is the GPU's capability x 100.

Instances report ``actual_status`` loading, then created, then running; ``public_ipaddr`` and the
Docker-style ``ports["22/tcp"]`` appear only once sshd listens, and a host-side restart
(:meth:`~twins.server.Twin.restart`) maps another port. On a host whose container runtime cannot
start the container (``broken_hosts``, by model) it stays ``created`` with the runtime's error in
``status_msg`` and never runs. A killed instance goes ``exited`` with the reason in ``status_msg``
(the container ended: evidence of a loss). A host that stops sending heartbeats for a while
(:meth:`VastTwin.host_silent`) makes its instance ``unknown`` meanwhile, as Vast's docs describe it,
with the machine's SSH partitioned too; then ``running`` again, nothing lost (issue 42).

Charges are per instance: GPU time from when it first ran (nothing before), disk for the same
time, and bandwidth per GB each way (:meth:`VastTwin.transfer`), rounded to 3 decimals.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from twins.server import Refused, Rental, Reply, Twin, TwinOffer

OPS = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "gt": lambda a, b: a is not None and a > b,
       "gte": lambda a, b: a is not None and a >= b, "lt": lambda a, b: a is not None and a < b,
       "lte": lambda a, b: a is not None and a <= b, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}
# the query's keys that are not filters
NOT_FILTERS = {"order", "limit", "allocated_storage", "type"}
# compute capability x 100 by model (NVIDIA's table); others 890
COMPUTE_CAP = {"Tesla V100": 700, "Tesla T4": 750, "RTX 3090": 860, "A100 SXM4": 800, "A100 PCIE": 800,
               "H100 SXM": 900, "H100 PCIE": 900, "H200": 900, "RTX 5090": 1200, "B200": 1000}
STORAGE_PER_GB_MONTH = 0.15
UP_PER_GB, DOWN_PER_GB = 0.003, 0.002
HOURS_PER_MONTH = 30 * 24


def _error(status: int, error: str, msg: str, **extra: Any) -> Reply:
    return Reply(status, {"success": False, "error": error, "msg": msg, **extra})


class VastTwin(Twin):
    """Vast.ai on loopback."""

    provider = "vastai"
    key_env = "VAST_API_KEY"
    url_env = "VAST_API_URL"
    error_schema = {"type": "object", "properties": {"success": {"type": "boolean"}, "error": {"type": "string"},
                                                     "msg": {"type": "string"}, "detail": {"type": "string"}}}
    launch_ops = frozenset({"createInstance"})
    machine_key_ops = frozenset({"manageInstance"})  # an instance's own CONTAINER_API_KEY acts on it alone

    def __init__(self, *args: Any, direct_ports: dict[str, int] | None = None,
                 broken_hosts: dict[str, str] | None = None, **kwargs: Any) -> None:
        self.direct_ports = dict(direct_ports or {})  # model -> its hosts' direct port count (default 40)
        self.broken_hosts = dict(broken_hosts or {})  # model -> its container runtime's error
        self.asks: dict[int, TwinOffer] = {}  # free asks (not rented)
        self._next_ask = 30_000_000
        self._next_instance = 7_000_000
        super().__init__(*args, **kwargs)
        for offer in self.offers:
            self.on_stock(offer)

    def provider_kwargs(self) -> dict[str, Any]:
        return {"api_key": self.api_key, "base_url": self.url}

    # -- errors ----------------------------------------------------------------------------

    def unauthorized(self, op_id: str | None) -> Reply:
        if op_id == "searchOffers":  # the document: a bad key on search is a 404
            return Reply(404, {"error": "auth_error", "msg": "Invalid user key"})
        return Reply(401, {"success": False, "error": "auth_error", "msg": "Invalid user key"},
                     undocumented=op_id is None or op_id == "destroyInstance")

    def invalid(self, op_id: str, errors: list[str]) -> Reply:
        return _error(400, "invalid_args", "; ".join(errors))

    def rate_limited(self, op_id: str | None, wait_s: float) -> Reply:
        # Vast documents only the body; no header says when to come back
        return Reply(429, {"detail": f"API requests too frequent endpoint threshold={self.rate}"},
                     undocumented=True)

    # -- the market ------------------------------------------------------------------------

    def on_stock(self, offer: TwinOffer) -> None:
        """Free asks follow the offer's stock (a rented ask is off the market already)."""
        mine = [ask for ask, o in self.asks.items() if o is offer]
        while len(mine) > max(0, offer.stock):
            del self.asks[mine.pop()]
        while len(mine) < offer.stock:
            self._next_ask += 1
            self.asks[self._next_ask] = offer
            mine.append(self._next_ask)

    def _row(self, ask: int, offer: TwinOffer) -> dict[str, Any]:
        cuda = float(".".join(offer.cuda.split(".")[:2]))
        major, *rest = (offer.driver.split(".") + ["0", "0"])[:3]
        return {"id": ask, "ask_contract_id": ask, "bundle_id": ask, "machine_id": ask % 100_000,
                "host_id": 55555, "gpu_name": offer.model, "num_gpus": offer.count, "gpu_ram": offer.memory_mb,
                "gpu_total_ram": offer.memory_mb * offer.count, "gpu_arch": "nvidia",
                "compute_cap": COMPUTE_CAP.get(offer.model, 890),
                "cuda_max_good": cuda, "driver_version": offer.driver,
                "driver_vers": int(major) * 1_000_000 + int(rest[0]) * 1000 + int(rest[1]),
                "dph_base": offer.price, "dph_total": offer.price, "min_bid": round(offer.price / 2, 4),
                "storage_cost": STORAGE_PER_GB_MONTH, "inet_up": 800.0, "inet_down": 900.0, "inet_up_cost": UP_PER_GB,
                "inet_down_cost": DOWN_PER_GB, "reliability": 0.995, "reliability2": 0.99, "geolocation": offer.region,
                "verification": "verified", "verified": True, "rentable": True, "rented": False,
                "direct_port_count": self.direct_ports.get(offer.model, 40), "disk_space": 512.0,
                "public_ipaddr": "127.0.0.1", "is_bid": False, "external": False}

    @staticmethod
    def _passes(row: dict[str, Any], query: dict[str, Any]) -> bool:
        for name, condition in query.items():
            if name in NOT_FILTERS or not isinstance(condition, dict):
                continue
            # the driver is filtered as a number (550.54.15 -> 550054015), the way the client sends it
            value = row.get("driver_vers") if name == "driver_version" else row.get(name)
            for op, wanted in condition.items():
                if op in OPS and not OPS[op](value, wanted):
                    return False
        return True

    # -- instances -------------------------------------------------------------------------

    def _instance(self, rental: Rental) -> dict[str, Any] | None:
        if rental.deleted:
            return None
        phase = self.phase(rental)
        offer = rental.offer
        inst: dict[str, Any] = {
            "id": int(rental.ref), "intended_status": "running", "label": rental.name,
            "image_uuid": rental.extra.get("image", ""), "image_runtype": rental.extra.get("runtype", "ssh"),
            "machine_id": rental.extra["ask"] % 100_000, "bundle_id": rental.extra["ask"],
            "start_date": rental.created_at.timestamp(),
            "gpu_name": offer.model, "num_gpus": offer.count, "gpu_ram": offer.memory_mb,
            "gpu_totalram": offer.memory_mb * offer.count, "geolocation": offer.region, "dph_total": offer.price,
            "is_bid": False, "direct_port_count": 40}
        if phase == "killed" and rental.extra.get("stopped"):
            inst.update(actual_status="stopped", intended_status="stopped", cur_state="stopped", status_msg=None)
        elif phase == "killed":
            inst.update(actual_status="exited", cur_state="stopped", status_msg=rental.killed)
        elif rental.extra.get("silent"):
            # Vast's docs: "unknown" is no recent heartbeat from the host; the instance keeps its ports
            inst.update(actual_status="unknown", cur_state="running", status_msg=None)
            if rental.machine is not None:
                inst.update(public_ipaddr=rental.machine.host,
                            ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(rental.machine.port)}]})
        elif phase == "failed":
            # the container exists but its runtime refused to start it: it stays "created"
            inst.update(actual_status="created", cur_state="running",
                        status_msg=f"Error response from daemon: failed to create task for container: "
                                   f"{rental.start_error}")
        elif phase == "booting":
            halfway = self.clock() - rental.created >= self.boot_delay_s / 2
            inst.update(actual_status="created" if halfway else "loading", cur_state="running",
                        status_msg=None if halfway else "Pulling image")
        else:
            inst.update(actual_status="running", cur_state="running", status_msg="Container started")
            if phase == "up" and rental.machine is not None:
                inst.update(public_ipaddr=rental.machine.host,
                            ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(rental.machine.port)}]})
        return inst

    @contextlib.contextmanager
    def host_silent(self, ref: str) -> Iterator[None]:
        """While inside, the instance's host sends no heartbeat: the API says ``unknown`` and the
        machine's SSH is partitioned for real (tests/sshd.py ``partitioned``); afterwards it runs on."""
        from sshd import partitioned

        rental = self.rentals[ref]
        assert rental.machine is not None, "the instance has no machine yet"
        with self.lock:
            rental.extra["silent"] = True
        try:
            with partitioned(rental.machine.sshd):
                yield
        finally:
            with self.lock:
                rental.extra.pop("silent", None)

    def _rental(self, ref: str) -> Rental | None:
        rental = self.rentals.get(ref)
        return None if rental is None or rental.deleted else rental

    # -- the operations --------------------------------------------------------------------

    def handle(self, op_id: str, params: dict[str, str], query: dict[str, Any], body: Any) -> Reply:
        with self.lock:
            if op_id == "showCharges":
                return self.op_showCharges(params, body, query)
            return getattr(self, "op_" + op_id)(params, body)

    def op_searchOffers(self, params: dict[str, str], body: Any) -> Reply:
        rows = [self._row(ask, offer) for ask, offer in sorted(self.asks.items())]
        rows = [r for r in rows if self._passes(r, body)]
        for field, direction in reversed(body.get("order") or []):
            rows.sort(key=lambda r, f=field: (r.get(f) is None, r.get(f)), reverse=direction == "desc")
        return Reply(200, {"offers": rows[:int(body.get("limit") or 64)]})

    def op_createInstance(self, params: dict[str, str], body: Any) -> Reply:
        ask = int(params["id"]) if params["id"].isdigit() else -1
        offer = self.asks.get(ask)
        if offer is None:
            msg = f"error 410/3907: no_such_ask Instance type {ask} is no longer available."
            if body.get("cancel_unavail"):
                raise Refused(_error(410, "no_such_ask", msg, ask_id=ask))
            raise Refused(_error(404, "invalid_args", f"error 404/3603: no_such_ask Instance type by id {ask} "
                                 "is not available.", ask_id=ask))
        del self.asks[ask]
        self._next_instance += 1
        self.rent(offer, str(self._next_instance), name=body.get("label", ""), ask=ask, image=body["image"],
                  runtype=body.get("runtype", "ssh"), env=dict(body.get("env") or {}),
                  disk=float(body.get("disk") or 10), fail_with=self.broken_hosts.get(offer.model))
        return Reply(200, {"success": True, "new_contract": self._next_instance})

    def op_attachSshKey(self, params: dict[str, str], body: Any) -> Reply:
        rental = self._rental(params["id"])
        if rental is None:
            raise Refused(_error(404, "not_found", "Instance not found"))
        self.authorize(rental, [body.get("ssh_key", "")])
        return Reply(200, {"success": True, "msg": "SSH key attached successfully"})

    def op_showInstance(self, params: dict[str, str], body: Any) -> Reply:
        rental = self.rentals.get(params["id"])
        return Reply(200, {"instances": self._instance(rental) if rental else None})

    def op_showInstances(self, params: dict[str, str], body: Any) -> Reply:
        found = [i for i in (self._instance(r) for r in self.listed()) if i is not None]
        return Reply(200, {"success": True, "instances_found": len(found), "total_instances": len(found),
                           "next_token": None, "instances": found})

    def machine_env(self, rental: Rental) -> dict[str, str]:
        """What the instance's processes have: its id and its own key (Vast's CONTAINER_API_KEY)."""
        return {"CONTAINER_ID": rental.ref, "CONTAINER_API_KEY": self.machine_key(rental.ref)}

    def op_manageInstance(self, params: dict[str, str], body: Any) -> Reply:
        rental = self._rental(params["id"])
        if rental is None:
            raise Refused(_error(404, "not_found", "Instance not found"))
        if body.get("state") == "stopped" and not rental.extra.get("stopped"):
            rental.extra["stopped"] = True
            rental.killed, rental.killed_at = "stopped", self.wall()
            rental.offer.stock += 1  # a stopped instance holds no GPU
            # the container stops once the answer is on its way (the caller may run in it)
            threading.Timer(0.2, self._stop_machine, args=(rental,)).start()
        elif body.get("state") == "running" and rental.extra.get("stopped"):
            raise Refused(_error(400, "invalid_state", "the twin does not start stopped instances"))
        if "label" in body:
            rental.name = body["label"]
        return Reply(200, {"success": True})

    def _stop_machine(self, rental: Rental) -> None:
        self._wait_started(rental)
        if rental.machine is not None:
            rental.machine.kill()

    def op_destroyInstance(self, params: dict[str, str], body: Any) -> Reply:
        rental = self._rental(params["id"])
        if rental is None:
            raise Refused(_error(404, "not_found", "Instance not found"))
        if not self.delete(rental):
            raise Refused(Reply(500, {"success": False, "error": "server_error",
                                      "msg": "Internal error destroying the instance; try again"}, undocumented=True))
        return Reply(200, {"success": True, "msg": f"destroying instance {rental.ref}."})

    def transfer(self, ref: str, *, up_gb: float = 0.0, down_gb: float = 0.0) -> None:
        """Bytes the instance moved (out of it, into it), which Vast bills per GB."""
        with self.lock:
            extra = self.rentals[str(ref)].extra
            extra["up_gb"] = extra.get("up_gb", 0.0) + up_gb
            extra["down_gb"] = extra.get("down_gb", 0.0) + down_gb

    def charges(self, rental: Rental, until: datetime | None = None) -> dict[str, Any] | None:
        """The instance's charges as Vast bills them (None: it never ran, nothing is charged)."""
        if rental.running_at is None:
            return None
        now = until or self.wall()
        start = rental.running_at
        gpu_end = min(t for t in (rental.killed_at, rental.deleted_at, now) if t is not None)
        end = rental.deleted_at or now
        gpu_h = max(0.0, (gpu_end - start).total_seconds()) / 3600
        disk_h = max(0.0, (end - start).total_seconds()) / 3600
        disk_gb = float(rental.extra.get("disk", 10))
        up, down = float(rental.extra.get("up_gb", 0.0)), float(rental.extra.get("down_gb", 0.0))
        t0, t1 = int(start.timestamp()), int(end.timestamp())
        items = [("gpu", gpu_h * rental.offer.price, f"{gpu_h:.3f} hours at ${rental.offer.price:.3f}/hour"),
                 ("disk", disk_h * disk_gb * STORAGE_PER_GB_MONTH / HOURS_PER_MONTH,
                  f"{disk_gb:g} GB for {disk_h:.3f} h"),
                 ("bwu", up * UP_PER_GB, f"{up:.3f} GB up"), ("bwd", down * DOWN_PER_GB, f"{down:.3f} GB down")]
        row: dict[str, Any] = {
            "start": t0, "end": t1, "type": "instance", "source": f"instance-{rental.ref}",
            "description": f"Instance {rental.ref} Charges", "amount": round(sum(a for _, a, _ in items), 3),
            "items": [{"start": t0, "end": t1, "type": kind, "source": None, "description": text,
                       "amount": round(amount, 3), "metadata": {}, "items": []} for kind, amount, text in items]}
        if rental.name:
            row["metadata"] = {"label": rental.name}
        return row

    def op_showCharges(self, params: dict[str, str], body: Any, query: dict[str, Any]) -> Reply:
        try:
            filters = json.loads(str(query.get("select_filters", "")))
        except ValueError:
            filters = None
        day = filters.get("day") if isinstance(filters, dict) else None
        if not isinstance(day, dict) or not all(isinstance(day.get(k), (int, float)) for k in ("gte", "lte")):
            raise Refused(Reply(400, {"success": False,
                                      "msg": "Must provide both 'day' gte and lte filters for instance charges"}))
        kinds = ((filters.get("type") or {}).get("in")) or ["instance", "volume", "serverless"]
        rows = []
        if "instance" in kinds:
            for rental in self.rentals.values():
                row = self.charges(rental)
                if row is not None and row["start"] <= day["lte"] and row["end"] >= day["gte"]:
                    rows.append(row)
        rows.sort(key=lambda r: r["end"], reverse=bool(query.get("latest_first", True)))
        limit = int(query.get("limit") or 100)
        offset = int(query["after_token"]) if str(query.get("after_token", "")).isdigit() else 0
        page = rows[offset:offset + limit]
        token = str(offset + limit) if offset + limit < len(rows) else None
        return Reply(200, {"success": True, "count": len(page), "total": len(rows), "next_token": token,
                           "results": page})

    def op_showUser(self, params: dict[str, str], body: Any) -> Reply:
        return Reply(200, {"id": 424242, "key_id": 17, "email": "researcher@example.org", "balance": 100.0,
                           "ssh_key": "", "sid": "s-1"})
